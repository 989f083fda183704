"""End to end: python-qpid-proton clients through a real proxy to the in-tree broker.

Every admission rule approving and denying, with the exact condition and description the
client sees (QDR's), link/session/message rules, and counts released and reused.
"""

from __future__ import annotations

import gc
import re
import socket
import time

import pytest
from proton import ConnectionException, Disposition, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection, LinkDetached, SendException

from amqp_policy_proxy.core.events import ConnectionClosed, ConnectionDenied

pytestmark = pytest.mark.integration

DISALLOWED = ("amqp:resource-limit-exceeded", "connection disallowed by local policy")


def connect(port: int, user: str | None = None, password: str = "secret", *,
            vhost: str = "e2e", host: str = "127.0.0.1", timeout: float = 10) -> BlockingConnection:
    kwargs = {"virtual_host": vhost, "allow_insecure_mechs": True}
    if user is None:
        kwargs["allowed_mechs"] = "ANONYMOUS"
    else:
        kwargs.update(user=user, password=password, allowed_mechs="PLAIN")
    url = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BlockingConnection(url, timeout=timeout, **kwargs)


def denied_condition(port: int, **kwargs) -> tuple[str, str]:
    with pytest.raises(ConnectionException) as info:
        c = connect(port, **kwargs)
        c.close()
    text = str(info.value)
    # the client must have parsed a real Open+Close: the message is exactly its condition
    match = re.fullmatch(r"Connection \S+ closed due to: Condition\('([^']*)', '([^']*)'\)",
                         text)
    assert match, text
    return match.group(1), match.group(2)


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


class TestAdmission:
    def test_approved_messages_flow_byte_identical(self, proxy):
        body = bytes(range(256)) * 3
        c = connect(proxy.port, "alice")
        snd = c.create_sender("orders.eu")
        rcv = c.create_receiver("orders.eu")
        for i in range(5):
            snd.send(Message(body=body + bytes([i])))
        got = []
        for _ in range(5):
            m = rcv.receive(timeout=5)
            got.append(bytes(m.body))
            rcv.accept()
        c.close()
        assert got == [body + bytes([i]) for i in range(5)]

    def test_anonymous_sasl_user(self, proxy):
        # anonymous is in group "guests", which only allows 127.0.0.2
        assert denied_condition(proxy.port) == DISALLOWED
        assert wait_for(lambda: [e.reason for e in proxy.events_of(ConnectionDenied)
                                 if e.user == "anonymous"] == ["remote_host"])

    def test_unknown_user_denied(self, proxy):
        assert denied_condition(proxy.port, user="mallory") == DISALLOWED
        assert wait_for(lambda: any(e.reason == "unknown_user" and e.user == "mallory"
                                    for e in proxy.events_of(ConnectionDenied)))

    def test_wrong_password_fails_at_the_router(self, proxy):
        with pytest.raises(ConnectionException) as info:
            connect(proxy.port, "alice", "wrong")
        assert "unauthorized" in str(info.value).lower() or "auth" in str(info.value).lower()

    def test_no_vhost_denied(self, proxy):
        assert denied_condition(proxy.port, user="alice", vhost="nowhere") == DISALLOWED

    def test_alias_resolves(self, proxy):
        c = connect(proxy.port, "alice", vhost="e2e-alias")
        c.create_sender("orders.alias").send(Message(body="x"))
        c.close()

    def test_remote_hosts_by_source_address(self, proxy, forwarder):
        # guests: 127.0.0.2 only; traders: 127.0.0.1 and ::1
        via2 = forwarder(proxy.port, "127.0.0.2")
        c = connect(via2.port)  # anonymous from 127.0.0.2: allowed
        rcv = c.create_receiver("public.news")
        assert rcv is not None
        c.close()
        assert denied_condition(via2.port, user="alice") == DISALLOWED  # trader from .2
        via6 = forwarder(proxy.v6_port, "::1")
        c = connect(via6.port, "alice")  # trader from ::1: allowed
        c.close()
        assert denied_condition(via6.port) == DISALLOWED  # guest from ::1

    def test_per_user_limit_then_release_and_readmit(self, proxy):
        a1 = connect(proxy.port, "bob")
        a2 = connect(proxy.port, "bob")
        assert denied_condition(proxy.port, user="bob") == DISALLOWED
        a1.close()
        assert wait_for(lambda: proxy.daemon.ledger.user_active("e2e", "bob") == 1)
        a3 = connect(proxy.port, "bob")
        a2.close()
        a3.close()
        reasons = [e.reason for e in proxy.events_of(ConnectionDenied) if e.user == "bob"]
        assert reasons == ["user_limit"]

    def test_group_per_user_override(self, proxy):
        c = connect(proxy.port, "carol")  # newsreaders: maxConnectionsPerUser 1
        assert denied_condition(proxy.port, user="carol") == DISALLOWED
        c.close()

    def test_per_host_limit(self, proxy, forwarder):
        via2 = forwarder(proxy.port, "127.0.0.2")
        c = connect(via2.port)
        assert denied_condition(via2.port) == DISALLOWED  # guests maxConnectionsPerHost 1
        c.close()
        assert wait_for(lambda: proxy.daemon.ledger.host_active("e2e", "127.0.0.2") == 0)
        connect(via2.port).close()

    def test_vhost_limit(self, proxy):
        c = connect(proxy.port, "dave", vhost="small")
        assert denied_condition(proxy.port, user="dave", vhost="small") == DISALLOWED
        c.close()
        assert wait_for(lambda: proxy.daemon.ledger.vhost_active("small") == 0)
        connect(proxy.port, "dave", vhost="small").close()
        assert any(e.reason == "vhost_limit" for e in proxy.events_of(ConnectionDenied))

    def test_counts_back_to_zero(self, proxy):
        conns = [connect(proxy.port, "alice"), connect(proxy.port, "carol")]
        for c in conns:
            c.close()
        assert wait_for(lambda: proxy.daemon.ledger.active() == 0)
        assert wait_for(lambda: len(proxy.daemon.connections) == 0)


def test_global_limit_closes_without_a_byte(broker_address, policy_path):
    from amqp_policy_proxy.policy.model import PolicySettings
    from tests.support.proxy import ProxyThread

    with ProxyThread([broker_address], policy_path=policy_path,
                     settings=PolicySettings(max_connections=1)) as p:
        first = connect(p.port, "alice")
        s = socket.create_connection(("127.0.0.1", p.port), timeout=5)
        assert s.recv(100) == b""  # closed, nothing written
        s.close()
        with pytest.raises(ConnectionException) as info:
            connect(p.port, "alice")
        assert "framing-error" in str(info.value)
        first.close()
        assert wait_for(lambda: p.daemon.ledger.global_current() == 0)
        connect(p.port, "alice").close()
        assert any(e.reason == "global_limit" for e in p.events_of(ConnectionDenied))


class TestLinks:
    def test_source_denied_session_and_connection_still_usable(self, proxy):
        c = connect(proxy.port, "alice")
        with pytest.raises(LinkDetached) as info:
            c.create_receiver("payroll.secret")
        assert "amqp:unauthorized-access" in str(info.value)
        assert "link disallowed by local policy" in str(info.value)
        # same connection still works
        snd = c.create_sender("orders.after")
        snd.send(Message(body="still here"))
        rcv = c.create_receiver("orders.after")
        assert rcv.receive(timeout=5).body == "still here"
        rcv.accept()
        c.close()

    def test_user_substitution(self, proxy):
        c = connect(proxy.port, "alice")
        c.create_receiver("alice.inbox")
        with pytest.raises(LinkDetached):
            c.create_receiver("bob.inbox")
        c.close()

    def test_target_denied(self, proxy):
        c = connect(proxy.port, "alice")
        with pytest.raises(LinkDetached) as info:
            c.create_sender("payroll.secret")
        assert "amqp:unauthorized-access" in str(info.value)
        c.close()

    def test_sender_limit_is_resource_limit_exceeded(self, proxy):
        c = connect(proxy.port, "alice")
        c.create_sender("orders.a")
        c.create_sender("orders.b")
        with pytest.raises(LinkDetached) as info:
            c.create_sender("orders.c")
        assert "amqp:resource-limit-exceeded" in str(info.value)
        c.close()

    def test_pattern_rules(self, proxy):
        c = connect(proxy.port, "carol")
        c.create_receiver("news.eu.sport")
        c.create_receiver("carol.private.x")
        with pytest.raises(LinkDetached):
            c.create_receiver("orders.eu")
        c.create_sender("news.eu")
        with pytest.raises(LinkDetached):
            c.create_sender("news.eu.sport")  # targetPattern news.* is one token
        c.close()

    def test_dynamic_source(self, proxy, forwarder):
        c = connect(proxy.port, "alice")
        with pytest.raises(LinkDetached):
            c.create_receiver(None, dynamic=True)
        c.close()
        via2 = forwarder(proxy.port, "127.0.0.2")
        g = connect(via2.port)
        r = g.create_receiver(None, dynamic=True)
        assert r.link.remote_source.address
        g.close()

    def test_anonymous_sender_and_relay_targets(self, proxy):
        c = connect(proxy.port, "alice")
        relay = c.create_sender(None)
        relay.send(Message(address="orders.relay", body="ok"))
        with pytest.raises(SendException) as info:
            relay.send(Message(address="payroll.secret", body="no"))
        assert info.value.state == Disposition.REJECTED
        relay.send(Message(address="orders.relay", body="ok2"))  # link still up
        rcv = c.create_receiver("orders.relay")
        assert [rcv.receive(timeout=5).body for _ in range(2)] == ["ok", "ok2"]
        c.close()

    def test_anonymous_sender_denied_for_guests(self, proxy, forwarder):
        via2 = forwarder(proxy.port, "127.0.0.2")
        g = connect(via2.port)
        with pytest.raises(LinkDetached):
            g.create_sender(None)
        g.close()


class _OneShot(MessagingHandler):
    """Send one message and record the outcome's condition as the client sees it."""

    def __init__(self, url, user, target, message, vhost="e2e"):
        super().__init__()
        self.url, self.user, self.target, self.message = url, user, target, message
        self.vhost = vhost
        self.outcome = None

    def on_start(self, event):
        conn = event.container.connect(self.url, user=self.user, password="secret",
                                       allowed_mechs="PLAIN", allow_insecure_mechs=True,
                                       virtual_host=self.vhost)
        event.container.create_sender(conn, self.target)

    def on_sendable(self, event):
        if self.message is not None:
            event.sender.send(self.message)
            self.message = None

    def on_rejected(self, event):
        cond = event.delivery.remote.condition
        self.outcome = ("rejected", cond.name, cond.description)
        event.connection.close()

    def on_accepted(self, event):
        self.outcome = ("accepted", None, None)
        event.connection.close()


def outcome(port, user, target, message, vhost="e2e"):
    h = _OneShot(f"127.0.0.1:{port}", user, target, message, vhost)
    c = Container(h)
    c.timeout = 10
    c.run()
    return h.outcome


class TestMessageConditions:
    def test_relay_target_rejection_as_the_client_sees_it(self, proxy):
        assert outcome(proxy.port, "alice", None,
                       Message(address="payroll.x", body="no")) == (
            "rejected", "amqp:unauthorized-access", "policy violation on target")
        assert outcome(proxy.port, "alice", None,
                       Message(address="orders.x", body="ok"))[0] == "accepted"

    def test_user_id_rejection_as_the_client_sees_it(self, proxy):
        assert outcome(proxy.port, "alice", "orders.u",
                       Message(body="x", user_id=b"bob")) == (
            "rejected", "amqp:unauthorized-access", "user_id proxy violation")

    def test_message_size_rejection_as_the_client_sees_it(self, proxy):
        big = Message(body=b"m" * 5000)
        assert outcome(proxy.port, "alice", "orders.big", big) == (
            "rejected", "amqp:link:message-size-exceeded", "Message size exceeded")


class TestMessages:
    def _body_for(self, size: int) -> bytes:
        overhead = len(Message(body=b"").encode())
        return b"m" * (size - overhead - 3)

    def test_message_size_limit(self, proxy):
        c = connect(proxy.port, "alice")
        snd = c.create_sender("orders.sized")
        body = self._body_for(2000)
        assert len(Message(body=body).encode()) == 2000
        snd.send(Message(body=body))  # exactly the limit passes
        with pytest.raises((SendException, ConnectionException, LinkDetached)):
            snd.send(Message(body=body + b"!"))
            c.create_sender("orders.x")  # the connection is gone
        closed = [e for e in proxy.events_of(ConnectionClosed) if e.user == "alice"]
        assert wait_for(lambda: any(e.close_reason == "message_size"
                                    for e in proxy.events_of(ConnectionClosed)))
        assert closed is not None

    def test_user_id_proxy(self, proxy):
        c = connect(proxy.port, "alice")
        snd = c.create_sender("orders.uid")
        snd.send(Message(body="mine", user_id=b"alice"))
        with pytest.raises(SendException):
            snd.send(Message(body="forged", user_id=b"bob"))
        c.close()


class TestMoreLinkRules:
    def test_receiver_without_source_is_denied(self, proxy):
        c = connect(proxy.port, "alice")
        with pytest.raises(LinkDetached) as info:
            c.create_receiver(None)
        assert "Condition('amqp:unauthorized-access', 'link disallowed by local policy')" in str(
            info.value)
        c.close()

    def test_receiver_limit(self, proxy):
        c = connect(proxy.port, "alice")
        for n in range(3):
            c.create_receiver(f"orders.r{n}")
        with pytest.raises(LinkDetached) as info:
            c.create_receiver("orders.r3")
        assert "amqp:resource-limit-exceeded" in str(info.value)
        c.close()


def _raw_session_client(port: int):
    """A raw AMQP client (our encoder): SASL PLAIN as alice, Open on vhost e2e."""
    from amqp_policy_proxy.amqp import constants as C
    from amqp_policy_proxy.amqp.framing import encode_frame
    from amqp_policy_proxy.amqp.performatives import Open, SaslInit, decode_performative
    from tests.support.frames import FrameDecoder

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    decoder = FrameDecoder(1 << 20)

    def read_frames(n):
        frames = []
        while len(frames) < n:
            f = decoder.next_frame()
            if f is not None:
                frames.append((f.header.channel, decode_performative(f.body)[0] if f.body else None))
                continue
            data = sock.recv(65536)
            assert data, "closed"
            decoder.receive_data(data)
        return frames

    sock.sendall(C.SASL_HEADER)
    hdr = b""
    while len(hdr) < 8:
        hdr += sock.recv(8 - len(hdr))
    read_frames(1)  # mechanisms
    init = SaslInit(mechanism="PLAIN", initial_response=b"\0alice\0secret")
    sock.sendall(encode_frame(0, init.encode(), 1))
    read_frames(1)  # outcome
    sock.sendall(C.AMQP_HEADER + encode_frame(0, Open(container_id="raw", hostname="e2e").encode()))
    hdr = b""
    while len(hdr) < 8:
        hdr += sock.recv(8 - len(hdr))
    (_, open_), = read_frames(1)
    return sock, read_frames, open_


def test_begin_above_channel_max_is_denied_politely_through_a_real_proxy(proxy):
    from amqp_policy_proxy.amqp.framing import encode_frame
    from amqp_policy_proxy.amqp.performatives import Begin, End

    sock, read_frames, open_ = _raw_session_client(proxy.port)
    try:
        assert int(open_.channel_max) == 2  # traders: maxSessions 3
        begin = Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100)
        sock.sendall(encode_frame(7, begin.encode()))
        (ch1, b), (ch2, e) = read_frames(2)
        assert isinstance(b, Begin) and int(b.remote_channel) == 7 and ch1 == ch2
        assert isinstance(e, End)
        assert (str(e.error.condition), e.error.description) == (
            "amqp:resource-limit-exceeded", "session disallowed by local policy")
        sock.sendall(encode_frame(7, End().encode()))
        sock.sendall(encode_frame(0, begin.encode()))  # the connection is still usable
        ((_, reply),) = read_frames(1)
        assert isinstance(reply, Begin) and int(reply.remote_channel) == 0
    finally:
        sock.close()
    from amqp_policy_proxy.core.events import SessionDenied

    assert wait_for(lambda: len(proxy.events_of(SessionDenied)) == 1)


def test_finished_connections_leave_nothing_for_the_cycle_collector(proxy):
    """A real client's connection through the daemon (messages both ways, then Close) is
    freed by reference counting once both transports are gone: the shell's legs and the core
    leave no cycle behind (the collector would otherwise walk every finished connection).
    Garbage of the client library itself is not counted."""
    def one() -> None:
        c = connect(proxy.port, "alice")
        snd = c.create_sender("orders.eu")
        rcv = c.create_receiver("orders.eu")
        snd.send(Message(body=b"x"))
        assert rcv.receive(timeout=5).body == b"x"
        rcv.accept()
        c.close()

    one()
    assert wait_for(lambda: not proxy.daemon.connections)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            one()
        assert wait_for(lambda: not proxy.daemon.connections)
        time.sleep(0.2)  # the transports' last callbacks
        gc.collect()
        ours = [type(o).__qualname__ for o in gc.garbage
                if type(o).__module__.startswith("amqp_policy_proxy")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert ours == []
