"""Router faults: killed mid-stream, refusing connections, restarting, silent, talking garbage.

Every client must get a clean AMQP Close it can read (QDR's ``amqp:connection:forced``), the
proxy's counts must return to zero, and the proxy itself must keep serving: no restart is
needed when the router comes back.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    UpstreamConnectFailed,
)
from amqp_policy_proxy.daemon.config import DaemonConfig
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import (
    Close,
    Open,
    RawClient,
    RawUpstream,
    SaslOutcome,
    attach_receiver,
    attach_sender,
    begin,
    data_message,
    frame,
    sasl_plain_init,
    transfer,
)

pytestmark = pytest.mark.integration

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "test",
    "groups": {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*"}},
}]])], PolicySettings())

FORCED_LOST = ("amqp:connection:forced", "upstream connection lost")
FORCED_NONE = ("amqp:connection:forced", "no upstream available")


def wait_until(pred: Any, timeout: float = 10.0) -> bool:
    """Poll ``pred()`` every 20 ms until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def counts(proxy: ProxyThread) -> tuple[int, int, int]:
    """(transports counted at accept, admitted connections, live relay objects)."""
    d = proxy.daemon
    return proxy.call(lambda: (d.ledger.global_current(), d.ledger.active(), len(d.connections)))


def closes(items: list[Any]) -> list[tuple[str | None, str | None]]:
    """(condition, description) of every Close among ``items``."""
    return [(i.condition, i.description) for i in items if i.name == "Close"]


def answer_close(c: RawClient) -> list[Any]:
    """Read up to the proxy's Close, answer it as a client should, read until closed."""
    got = c.read_until(lambda i: i.name == "Close")
    c.try_send(frame(0, Close()))
    return got + c.read_until_closed(timeout=3)


def streaming_client(port: int, user: str = "alice") -> RawClient:
    """A client with a sender and a receiver on ``echo``, one message already round-tripped."""
    c = RawClient(port)
    c.open(user=user)
    c.send(begin(0), attach_receiver(0, 1, "echo"), attach_sender(0, 0, "echo", settled=True))
    c.send(frame(0, _flow(handle=1, credit=1000)))
    c.send(transfer(0, 0, 0, data_message(b"m0"), settled=True))
    got = c.read_until(lambda i: i.name == "Transfer")
    assert any(i.name == "Transfer" for i in got), [i.name for i in got]
    return c


def _flow(handle: int, credit: int) -> Any:
    from tests.support.rawpeer import Flow

    return Flow(next_incoming_id=0, incoming_window=100000, next_outgoing_id=0,
                outgoing_window=100000, handle=handle, delivery_count=0, link_credit=credit)


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    # echoes pre-settled: a proton BlockingSender waits for settlement inside send()
    with RawUpstream(echo=True, echo_settle_at_receiver=False) as up:
        yield up


def proton_connect(port: int, **kw: Any) -> BlockingConnection:
    """A proton client (SASL PLAIN as bob) to the proxy, vhost ``test``."""
    return BlockingConnection(f"127.0.0.1:{port}", timeout=5, virtual_host="test", user="bob",
                              password="pw", allowed_mechs="PLAIN", allow_insecure_mechs=True,
                              reconnect=False, **kw)


# ---------------------------------------------------------------------------------- killed


def test_router_killed_mid_stream_gives_every_client_a_clean_close(upstream):
    with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY) as proxy:
        clients = [streaming_client(proxy.port) for _ in range(5)]
        proton_client = proton_connect(proxy.port)
        receiver = proton_client.create_receiver("echo")
        sender = proton_client.create_sender("echo")
        sender.send(Message(body="before"))
        assert receiver.receive(timeout=5).body == "before"
        assert counts(proxy) == (6, 6, 6)
        # mid-stream: data in flight in both directions when the router dies
        for n, c in enumerate(clients):
            c.send(*[transfer(0, 0, k, data_message(b"x" * 1000), settled=True)
                     for k in range(1, 50)])
            if n == 2:
                upstream.kill()
        for c in clients:
            got = c.read_until_closed(timeout=5)
            assert c.closed
            assert closes(got) == [FORCED_LOST], [i.name for i in got]
            c.close()
        with pytest.raises(ConnectionException) as info:
            receiver.receive(timeout=5)
        assert "amqp:connection:forced" in str(info.value)
        assert "upstream connection lost" in str(info.value)
        with contextlib.suppress(ConnectionException):
            proton_client.close()
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))
        closed = proxy.events_of(ConnectionClosed)
        assert len(closed) == 6
        assert {e.close_reason for e in closed} == {"broker_close"}
        assert proxy.daemon.internal_errors == 0


def test_router_talking_garbage_mid_stream(upstream):
    with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY) as proxy:
        c = streaming_client(proxy.port)
        upstream.call(lambda: [u.write(b"\x00\x00\x00\x04garbage") for u in upstream.conns])
        got = c.read_until_closed()
        assert closes(got) == [("amqp:connection:forced", "upstream protocol error")]
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))
        assert upstream.wait_for(lambda u: u.active == 0)


def test_silent_router_is_cut_off_by_the_handshake_timeout():
    with RawUpstream(silent=True) as upstream, ProxyThread(
            [("127.0.0.1", upstream.port)], policy=POLICY, handshake_seconds=1.0) as proxy:
        with RawClient(proxy.port) as c:
            start = time.monotonic()
            c.send(C.SASL_HEADER)
            c.read_until_closed(timeout=5)
            assert c.closed and time.monotonic() - start < 3.5
        assert upstream.wait_for(lambda u: u.active == 0)
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))


# ---------------------------------------------------------------------------------- refusing


def test_refusing_router_the_next_upstream_is_tried(upstream):
    dead = free_port()
    with ProxyThread([("127.0.0.1", dead), ("127.0.0.1", upstream.port)],
                     policy=POLICY) as proxy:
        for _ in range(3):
            c = streaming_client(proxy.port)
            c.close()
        # the refusing router is remembered (issue 15 point 6): the next clients go to the
        # live one first instead of each trying the dead one again (the probes at start
        # found it down already: no client tries it at all)
        failed = proxy.events_of(UpstreamConnectFailed)
        assert [e.upstream for e in failed] in ([], [f"127.0.0.1:{dead}"])
        assert upstream.connections_made == 3
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))


def test_black_holed_router_times_out_and_the_next_upstream_is_tried(upstream):
    # A listener whose accept queue is full never answers a SYN: the connect can only end
    # at connect_timeout_seconds, then the next upstream is tried for the same client (or,
    # once the probes at start found it down, the client goes to the next one at once).
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(hole.getsockname())
        fillers.append(s)
    time.sleep(0.2)
    try:
        config = DaemonConfig(connect_timeout_seconds=0.5)
        with ProxyThread([hole.getsockname(), ("127.0.0.1", upstream.port)], policy=POLICY,
                         config=config) as proxy:
            started = time.monotonic()
            c = streaming_client(proxy.port)
            took = time.monotonic() - started
            c.close()
            failed = proxy.events_of(UpstreamConnectFailed)
            assert [e.upstream for e in failed] in ([], ["{}:{}".format(*hole.getsockname())])
            assert took < 5, took
            assert upstream.connections_made == 1
            # the next client does not wait out the connect timeout again: the black hole is
            # backed off and tried last
            started = time.monotonic()
            c = streaming_client(proxy.port)
            assert time.monotonic() - started < 0.4
            c.close()
            assert len(proxy.events_of(UpstreamConnectFailed)) <= 1
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))
            assert proxy.daemon.internal_errors == 0
    finally:
        for s in fillers:
            s.close()
        hole.close()


class TestNoUpstreamLeft:
    @pytest.fixture
    def proxy(self) -> Iterator[ProxyThread]:
        with ProxyThread([("127.0.0.1", free_port()), ("127.0.0.1", free_port())],
                         policy=POLICY) as px:
            yield px
            assert wait_until(lambda: counts(px) == (0, 0, 0))
            assert px.daemon.internal_errors == 0

    def test_client_without_sasl_gets_connection_forced(self, proxy):
        with RawClient(proxy.port) as c:
            c.send(C.AMQP_HEADER, frame(0, Open(container_id="x", hostname="test")))
            got = answer_close(c)
            assert c.closed
        assert got[0].perf == C.AMQP_HEADER
        assert [i.name for i in got[1:]] == ["Open", "Close"]
        assert closes(got) == [FORCED_NONE]
        # the probes at start found both down: the client was answered without a connect
        assert len(proxy.events_of(UpstreamConnectFailed)) in (0, 2)

    def test_sasl_client_gets_sys_temp_and_is_never_authenticated(self, proxy):
        # Issue 15 point 1: nobody can check the password, so nobody is admitted: the outcome
        # is sys-temp (code 4), never ok, and no Open follows.
        with RawClient(proxy.port) as c:
            assert c.sasl_plain("alice", "a wrong password") == C.SaslCode.SYS_TEMP
            c.read_until_closed(timeout=3)
            assert c.closed
        assert not [i for i in c.items if i.name in ("Open", "Close")]
        assert [str(e.reason) for e in proxy.events_of(ConnectionDenied)] == [
            "upstream_unavailable"]
        assert not proxy.events_of(ConnectionApproved)

    def test_sasl_init_pipelined_before_the_connect_failed_is_answered_sys_temp(self, proxy):
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, sasl_plain_init("alice", "pw"))
            got = c.read_until_closed(timeout=5)
        outcomes = [int(i.perf.code) for i in got if isinstance(i.perf, SaslOutcome)]
        assert outcomes == [C.SaslCode.SYS_TEMP]
        assert not [i for i in got if i.name in ("Open", "Close")]

    def test_proton_client_reads_the_condition(self, proxy):
        with pytest.raises(ConnectionException) as info:
            conn = proton_connect(proxy.port)
            conn.create_sender("q")
        # proton reports every failed SASL outcome as an authentication failure; what matters
        # is that no policy decision was taken on an identity nobody authenticated
        assert "connection disallowed by local policy" not in str(info.value)
        assert "Authentication failed" in str(info.value)

    def test_proton_client_without_sasl_reads_connection_forced(self, proxy):
        with pytest.raises(ConnectionException) as info:
            conn = BlockingConnection(f"127.0.0.1:{proxy.port}", timeout=5,
                                      virtual_host="test", sasl_enabled=False, reconnect=False)
            conn.create_sender("q")
        assert "amqp:connection:forced" in str(info.value)
        assert "no upstream available" in str(info.value)


def test_dead_upstream_end_to_end_error_metrics_and_event_log(tmp_path, caplog):
    """A real proton client, a dead upstream: its error, the metrics, the event log, the log."""
    import json
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    events_dir = tmp_path / "events"
    dead = free_port()
    with caplog.at_level("INFO", logger="amqp_policy_proxy"), ProxyThread(
            [("127.0.0.1", dead)], policy=POLICY, metrics=True,
            event_log_dir=str(events_dir)) as proxy:
        with pytest.raises(ConnectionException) as info:
            BlockingConnection(f"127.0.0.1:{proxy.port}", timeout=5, virtual_host="test",
                               user="bob", password="wrong", allowed_mechs="PLAIN",
                               allow_insecure_mechs=True, reconnect=False)
        assert "Authentication failed" in str(info.value)
        with RawClient(proxy.port) as c:
            assert c.sasl_plain("alice", "wrong") == C.SaslCode.SYS_TEMP
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))
        proxy.call(proxy.daemon.publish_now)
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    denied = {dict(k[1])["reason"]: v for k, v in samples.items()
              if k[0] == "amqp_proxy_connections_denied_total" and v}
    assert denied == {"upstream_unavailable": 2.0}
    assert not [k for k, v in samples.items()
                if k[0] == "amqp_proxy_connections_approved_total" and v]
    records = [json.loads(line) for f in sorted(events_dir.rglob("*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    kinds = [r["event"] for r in records]
    assert "connection_opened" not in kinds
    unavailable = [r for r in records if r["event"] == "connection_denied"]
    assert [r["reason"] for r in unavailable] == ["upstream_unavailable"] * 2
    assert all(r.get("user") is None for r in unavailable)
    lines = [r.getMessage() for r in caplog.records if "no upstream available" in r.getMessage()]
    assert len(lines) == 2 and all("127.0.0.1" in line for line in lines)
    assert not [r for r in caplog.records if "DENY AMQP Open" in r.getMessage()]


# ---------------------------------------------------------------------------------- restart


def test_router_restart_new_connections_succeed_without_restarting_the_proxy():
    first = RawUpstream(echo=True, echo_settle_at_receiver=False).start()
    port = first.port
    with ProxyThread([("127.0.0.1", port)], policy=POLICY) as proxy:
        try:
            old = streaming_client(proxy.port)
            first.kill()
            assert closes(old.read_until_closed()) == [FORCED_LOST]
            old.close()
            # while it is down: a clean refusal
            with RawClient(proxy.port) as c:
                c.send(C.AMQP_HEADER, frame(0, Open(container_id="x", hostname="test")))
                assert closes(answer_close(c)) == [FORCED_NONE]
        finally:
            first.kill()
        with RawUpstream(echo=True, echo_settle_at_receiver=False, port=port) as second:
            # the probes find it back (a client arriving meanwhile asks for a probe at once)
            assert wait_until(lambda: proxy.call(lambda: proxy.daemon.readiness()[0]))
            for _ in range(3):
                c = streaming_client(proxy.port)
                c.close()
            conn = proton_connect(proxy.port)
            rcv = conn.create_receiver("echo")
            conn.create_sender("echo").send(Message(body="after restart"))
            assert rcv.receive(timeout=5).body == "after restart"
            conn.close()
            assert second.connections_made == 4
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))
        assert proxy.daemon.internal_errors == 0


# ---------------------------------------------------------------------------------- real broker


def test_real_broker_stopped_mid_stream_and_restarted_with_proton_clients():
    """The same with the in-tree proton broker and proton clients (no SASL: anonymous)."""
    from amqp_policy_proxy.demo.broker import Broker

    def client(port: int) -> BlockingConnection:
        return BlockingConnection(f"127.0.0.1:{port}", timeout=5, virtual_host="test",
                                  sasl_enabled=False, reconnect=False)

    first = Broker(stop_grace=0.2).start()
    port = first.port
    try:
        with ProxyThread([("127.0.0.1", port)], policy=POLICY) as proxy:
            conns = [client(proxy.port) for _ in range(3)]
            receivers = [c.create_receiver(f"q{n}") for n, c in enumerate(conns)]
            for n, c in enumerate(conns):
                c.create_sender(f"q{n}").send(Message(body=f"m{n}"))
            for n, r in enumerate(receivers):
                assert r.receive(timeout=5).body == f"m{n}"
                r.accept()
            assert counts(proxy) == (3, 3, 3)
            first.stop()
            for r in receivers:
                with pytest.raises(ConnectionException):
                    r.receive(timeout=5)
            for c in conns:
                with contextlib.suppress(ConnectionException):
                    c.close()
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))
            second = Broker(port=port).start()
            try:
                c = client(proxy.port)
                rcv = c.create_receiver("again")
                c.create_sender("again").send(Message(body="back"))
                assert rcv.receive(timeout=5).body == "back"
                rcv.accept()
                c.close()
            finally:
                second.stop()
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))
            assert proxy.daemon.internal_errors == 0
    finally:
        first.stop()
