"""The in-tree demo broker, driven directly by python-qpid-proton clients (no proxy)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Message, Timeout, symbol
from proton.reactor import AtMostOnce, Container
from proton.utils import BlockingConnection, LinkDetached, SendException

from amqp_policy_proxy.demo.broker import Broker, PeerOpen
from amqp_policy_proxy.demo.sasl import SaslConfig, make_sasl_config

pytestmark = pytest.mark.integration

# Cyrus keeps one sasldb per process and later configs are merged into it, so these names must
# not collide with the users of tests/integration/conftest.py (a merge would change their
# passwords for every later test).
USERS = {"alice": "secret", "dora": "hunter2"}


@pytest.fixture(scope="module")
def sasl_config(tmp_path_factory: pytest.TempPathFactory) -> SaslConfig:
    return make_sasl_config(tmp_path_factory.mktemp("broker-sasl"), USERS)


@pytest.fixture(scope="module")
def broker(sasl_config: SaslConfig) -> Iterator[Broker]:
    b = Broker(sasl=sasl_config, container_id="test-broker").start()
    yield b
    b.stop()


def connect(broker: Broker, user: str | None = None, password: str = "", **kw: Any):
    """A blocking client; ANONYMOUS unless ``user`` is given (then PLAIN)."""
    if user is None:
        kw.setdefault("allowed_mechs", "ANONYMOUS")
    else:
        kw.update(user=user, password=password, allowed_mechs=kw.get("allowed_mechs", "PLAIN"))
    return BlockingConnection(broker.url, timeout=10, allow_insecure_mechs=True, **kw)


@pytest.fixture
def client(broker: Broker) -> Iterator[BlockingConnection]:
    c = connect(broker)
    yield c
    c.close()


def pump_until(client: BlockingConnection, predicate: Any, timeout: float = 5.0) -> None:
    """Run ``client``'s event loop in short slices until broker-side ``predicate()`` holds.

    ``BlockingConnection.wait`` alone re-checks its condition only when the client has I/O,
    and the broker's state changes on the broker's thread.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        with contextlib.suppress(Timeout):
            client.wait(predicate, timeout=0.02)


def unique(prefix: str) -> str:
    unique.n = getattr(unique, "n", 0) + 1  # type: ignore[attr-defined]
    return f"{prefix}.{unique.n}"  # type: ignore[attr-defined]


# -- raw bytes end to end --------------------------------------------------------------------


class _RawRoundTrip:
    """One proton connection sending pre-encoded messages and collecting the raw bytes back."""

    def __init__(self, url: str, address: str, payloads: list[bytes]) -> None:
        self.url, self.address, self.payloads = url, address, payloads
        self.received: list[bytes] = []
        self.sent = False
        self.conn: Any = None

    def on_reactor_init(self, event: Any) -> None:
        container = event.container
        self.conn = container.connect(self.url, allowed_mechs="ANONYMOUS")
        self.sender = container.create_sender(self.conn, self.address)
        self.receiver = container.create_receiver(self.conn, self.address)
        self.receiver.flow(len(self.payloads))
        self.timer = container.schedule(10, self)  # safety net: give up after 10 s

    def on_timer_task(self, event: Any) -> None:
        if self.conn is not None:
            self.conn.close()

    def on_connection_local_close(self, event: Any) -> None:
        self.timer.cancel()

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if link.is_sender and link.credit and not self.sent:
            self.sent = True
            for i, payload in enumerate(self.payloads):
                link.delivery(str(i))
                link.stream(payload)
                link.advance()

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = dlv.link
        if link.is_sender:
            if dlv.updated:
                dlv.settle()
            return
        if dlv.partial:
            return
        self.received.append(link.recv(dlv.pending) or b"")
        link.advance()
        dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        if len(self.received) == len(self.payloads):
            self.conn.close()

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()


def raw_roundtrip(broker: Broker, address: str, payloads: list[bytes]) -> list[bytes]:
    handler = _RawRoundTrip(broker.url, address, payloads)
    Container(handler).run()
    return handler.received


def noncanonical_data_message(data: bytes) -> bytes:
    """A Data section encoded the long way: descriptor as ulong (0x80), binary as vbin32 (0xb0).

    proton would re-encode it canonically (0x53 0x75, vbin8), so any decode/re-encode on the way
    shows up as changed bytes.
    """
    return b"\x00\x80" + struct.pack(">Q", 0x75) + b"\xb0" + struct.pack(">I", len(data)) + data


class TestMessages:
    def test_raw_bytes_arrive_identical(self, broker: Broker) -> None:
        address = unique("raw")
        data = bytes(range(256))
        odd = noncanonical_data_message(data)
        m = Message()
        m.decode(odd)  # valid AMQP, just not proton's encoding
        assert bytes(m.body) == data
        assert m.encode() != odd
        big = Message(body="x" * 300_000, properties={"k": 1}).encode()  # many frames
        payloads = [odd, Message(body=data).encode(), big]
        assert raw_roundtrip(broker, address, payloads) == payloads
        assert broker.received(address) == 3

    def test_bodies_identical_through_blocking_clients(self, client: BlockingConnection) -> None:
        address = unique("bodies")
        bodies = [b"\x00\xff" * 5000, "unicode \u00e9\u4e2d", {"a": [1, 2.5, None]}, 2**40, b""]
        sender = client.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, subject="s", properties={"n": 1}))
        receiver = client.create_receiver(address)
        got = []
        for _ in bodies:
            got.append(receiver.receive(timeout=5))
            receiver.accept()
        assert [m.body for m in got] == bodies
        assert all(m.subject == "s" and m.properties == {"n": 1} for m in got)

    def test_queue_is_fifo_and_counted(self, broker: Broker, client: BlockingConnection) -> None:
        address = unique("fifo")
        sender = client.create_sender(address)
        for i in range(5):
            sender.send(Message(body=i))
        assert broker.queue_depth(address) == 5
        assert broker.received(address) == 5
        receiver = client.create_receiver(address)
        got = []
        for _ in range(5):
            got.append(receiver.receive(timeout=5).body)
            receiver.accept()
        assert got == list(range(5))
        assert broker.queue_depth(address) == 0
        receiver.close()  # flushes the last disposition
        assert broker.wait_until(lambda: broker.unsettled_count(address) == 0)

    def test_competing_consumers_share_by_credit(self, broker: Broker) -> None:
        address = unique("compete")
        c1, c2, producer = connect(broker), connect(broker), connect(broker)
        try:
            r1 = c1.create_receiver(address, credit=5)
            r2 = c2.create_receiver(address, credit=5)
            pump_until(c1, lambda: broker.consumer_credit(address) >= 5)
            pump_until(c2, lambda: broker.consumer_credit(address) >= 10)
            assert broker.consumer_count(address) == 2
            sender = producer.create_sender(address)
            for i in range(10):
                sender.send(Message(body=i))
            got1, got2 = [], []
            for receiver, got in ((r1, got1), (r2, got2)):
                for _ in range(5):
                    got.append(receiver.receive(timeout=5).body)
                    receiver.accept()
            assert sorted(got1 + got2) == list(range(10))
            assert got1 == sorted(got1) and got2 == sorted(got2)
        finally:
            for c in (c1, c2, producer):
                c.close()

    def test_credit_is_respected(self, broker: Broker, client: BlockingConnection) -> None:
        address = unique("credit")
        receiver = client.create_receiver(address)  # no prefetch: credit only when we say
        receiver.link.flow(2)
        pump_until(client, lambda: broker.consumer_credit(address) == 2)
        sender = client.create_sender(address)
        for i in range(5):
            sender.send(Message(body=i))
        assert broker.wait_until(lambda: broker.unsettled_count(address) == 2)
        assert broker.queue_depth(address) == 3
        assert broker.consumer_credit(address) == 0

    def test_release_and_modified_requeue_at_head(
        self, broker: Broker, client: BlockingConnection
    ) -> None:
        address = unique("release")
        sender = client.create_sender(address)
        for i in range(3):
            sender.send(Message(body=i))
        receiver = client.create_receiver(address)  # one credit per receive()
        assert receiver.receive(timeout=5).body == 0
        receiver.release(delivered=False)  # RELEASED
        # let the disposition reach the broker before receive() grants the next credit
        pump_until(client, lambda: broker.queue_depth(address) == 3)
        assert receiver.receive(timeout=5).body == 0
        receiver.release(delivered=True)  # MODIFIED
        pump_until(client, lambda: broker.queue_depth(address) == 3)
        got = []
        for _ in range(3):
            got.append(receiver.receive(timeout=5).body)
            receiver.accept()
        assert got == [0, 1, 2]
        assert broker.delivered(address) == 5

    def test_rejected_message_is_dropped(self, broker: Broker, client: BlockingConnection) -> None:
        address = unique("reject")
        client.create_sender(address).send(Message(body="bad"))
        receiver = client.create_receiver(address)
        receiver.receive(timeout=5)
        receiver.reject()
        receiver.close()
        assert broker.wait_until(lambda: broker.unsettled_count(address) == 0)
        assert broker.queue_depth(address) == 0

    def test_unsettled_messages_return_when_consumer_goes(self, broker: Broker) -> None:
        address = unique("return")
        c = connect(broker)
        sender = c.create_sender(address)
        sender.send(Message(body="m1"))
        sender.send(Message(body="m2"))
        receiver = c.create_receiver(address, credit=2)
        assert receiver.receive(timeout=5).body == "m1"
        assert broker.wait_until(lambda: broker.unsettled_count(address) == 2)
        c.close()  # without settling
        assert broker.wait_until(lambda: broker.queue_depth(address) == 2)
        assert broker.unsettled_count(address) == 0
        c2 = connect(broker)
        r2 = c2.create_receiver(address)
        assert [r2.receive(timeout=5).body for _ in range(2)] == ["m1", "m2"]
        c2.close()

    def test_session_end_and_detach_return_unsettled(self, broker: Broker) -> None:
        address = unique("session-end")
        c = connect(broker)
        try:
            sender = c.create_sender(address)
            for i in range(2):
                sender.send(Message(body=i))
            receiver = c.create_receiver(address, credit=2)
            receiver.receive(timeout=5)
            assert broker.unsettled_count(address) == 2
            receiver.link.session.close()  # End without settling
            pump_until(c, lambda: broker.queue_depth(address) == 2)
            assert broker.consumer_count(address) == 0
        finally:
            c.close()
        c2 = connect(broker)  # (proton's BlockingConnection reuses its one, now ended, session)
        try:
            other = c2.create_receiver(address, credit=2)
            assert other.receive(timeout=5).body == 0
            other.link.detach()  # detach, not close
            pump_until(c2, lambda: broker.queue_depth(address) == 2)
            assert broker.consumer_count(address) == 0
        finally:
            c2.close()

    def test_drain_with_nothing_queued_uses_up_credit(self, client: BlockingConnection) -> None:
        receiver = client.create_receiver(unique("drain"))
        receiver.link.drain(5)
        pump_until(client, lambda: receiver.link.credit == 0)

    def test_at_most_once_receiver_gets_presettled(
        self, broker: Broker, client: BlockingConnection
    ) -> None:
        address = unique("amo")
        sender = client.create_sender(address)
        for i in range(3):
            sender.send(Message(body=i))
        receiver = client.create_receiver(address, credit=3, options=AtMostOnce())
        assert [receiver.receive(timeout=5).body for _ in range(3)] == [0, 1, 2]
        assert broker.queue_depth(address) == 0
        assert broker.unsettled_count(address) == 0
        attach = [a for a in broker.attaches() if a.source == address][-1]
        assert attach.role == "receiver" and attach.snd_settle_mode == 1  # settled

    def test_presettled_sender(self, broker: Broker, client: BlockingConnection) -> None:
        address = unique("presettled")
        sender = client.create_sender(address, options=AtMostOnce())
        sender.send(Message(body="fire-and-forget"))  # returns at once: nothing to wait for
        pump_until(client, lambda: broker.received(address) == 1)


class TestRouting:
    def test_anonymous_relay_routes_by_to(self, broker: Broker, client: BlockingConnection) -> None:
        caps = client.conn.remote_offered_capabilities
        assert symbol("ANONYMOUS-RELAY") in list(caps)
        a, b = unique("relay-a"), unique("relay-b")
        relay = client.create_sender(None)
        relay.send(Message(address=a, body="to a"))
        relay.send(Message(address=b, body="to b"))
        relay.send(Message(address=a, body="to a again"))
        assert (broker.received(a), broker.received(b)) == (2, 1)
        ra, rb = client.create_receiver(a), client.create_receiver(b)
        assert [ra.receive(timeout=5).body for _ in range(2)] == ["to a", "to a again"]
        assert rb.receive(timeout=5).body == "to b"
        attach = [x for x in broker.attaches() if x.role == "sender" and x.target is None][-1]
        assert attach.address is None

    def test_anonymous_relay_without_to_is_rejected(self, client: BlockingConnection) -> None:
        relay = client.create_sender(None)
        with pytest.raises(SendException) as info:
            relay.send(Message(body="nowhere"))
        assert info.value.state == Delivery.REJECTED

    def test_dynamic_source_gets_a_unique_address(
        self, broker: Broker, client: BlockingConnection
    ) -> None:
        r1 = client.create_receiver(None, dynamic=True)
        r2 = client.create_receiver(None, dynamic=True)
        addr1, addr2 = r1.link.remote_source.address, r2.link.remote_source.address
        assert addr1 and addr2 and addr1 != addr2
        assert addr1.startswith("dynamic/")
        client.create_sender(addr1).send(Message(body="reply"))
        assert r1.receive(timeout=5).body == "reply"
        r1.accept()
        assert [a.dynamic for a in broker.attaches() if a.address == addr1] == [True, False]
        r1.close()
        assert broker.wait_until(lambda: addr1 not in broker.addresses())
        assert addr2 in broker.addresses()

    def test_receiver_without_source_address_is_refused(self, client: BlockingConnection) -> None:
        with pytest.raises(LinkDetached) as info:
            client.create_receiver(None)
        assert "amqp:not-found" in str(info.value)


class TestSasl:
    def test_plain_good_password(self, broker: Broker) -> None:
        c = connect(broker, "alice", "secret")
        c.close()
        assert broker.auth_users[-1] == "alice"
        opened = broker.last_open()
        assert opened is not None and opened.user == "alice"
        assert opened.mechanism == "PLAIN" and opened.authenticated

    def test_plain_bad_password_fails_authentication(self, broker: Broker) -> None:
        before = (broker.auth_failures(), len(broker.opens()))
        with pytest.raises(ConnectionException) as info:
            connect(broker, "alice", "wrong")
        assert "amqp:unauthorized-access" in str(info.value)
        with pytest.raises(ConnectionException):
            connect(broker, "nobody", "secret")
        assert broker.wait_until(lambda: broker.auth_failures() == before[0] + 2)
        assert len(broker.opens()) == before[1]  # no Open got through

    def test_anonymous(self, broker: Broker) -> None:
        c = connect(broker)
        c.close()
        opened = broker.last_open()
        assert opened is not None
        assert (opened.user, opened.mechanism) == ("anonymous", "ANONYMOUS")

    def test_client_without_sasl_is_anonymous_unless_auth_required(self, broker: Broker) -> None:
        c = BlockingConnection(broker.url, timeout=10, sasl_enabled=False)
        c.close()
        opened = broker.last_open()
        assert opened is not None and not opened.authenticated and opened.user == "anonymous"
        strict = Broker(require_auth=True).start()
        try:
            with pytest.raises(ConnectionException):
                BlockingConnection(strict.url, timeout=10, sasl_enabled=False)
        finally:
            strict.stop()

    def test_anonymous_can_be_turned_off(self, sasl_config: SaslConfig) -> None:
        with Broker(sasl=sasl_config, allow_anonymous=False) as b:
            with pytest.raises(ConnectionException):
                connect(b)
            connect(b, "dora", "hunter2").close()
            assert b.auth_users == ["dora"]

    def test_second_config_in_one_process_is_merged(self, tmp_path, broker: Broker) -> None:
        # Cyrus is initialised once per process: the second config's users join the first's.
        other = make_sasl_config(tmp_path / "other", {"erin": "pw3"}, name="other-broker")
        with Broker(sasl=other) as b:
            connect(b, "erin", "pw3").close()
            with pytest.raises(ConnectionException):
                connect(b, "erin", "wrong")
            assert b.auth_users == ["erin"]
        connect(broker, "alice", "secret").close()

    def test_config_by_directory_and_name(self, sasl_config: SaslConfig) -> None:
        with Broker(
            sasl_config_dir=sasl_config.config_dir, sasl_config_name=sasl_config.config_name
        ) as b:
            connect(b, "alice", "secret").close()
            assert b.auth_users == ["alice"]


class TestIntrospection:
    def test_open_and_begin_recorded(self, broker: Broker) -> None:
        c = connect(broker, virtual_host="vhost-1", container_id="client-7")
        try:
            opened = broker.last_open()
            assert isinstance(opened, PeerOpen)
            assert opened.hostname == "vhost-1" and broker.open_hostnames[-1] == "vhost-1"
            assert opened.container_id == "client-7"
            assert opened.remote_address is not None and opened.remote_address[0] == "127.0.0.1"
            assert opened.fields["channel-max"] == "0x7fff"
            assert opened.channel_max == 32767
            c.create_sender(unique("begin"))
            begin = [b for b in broker.begins() if b.conn_id == opened.conn_id][-1]
            assert begin.channel == 0 and begin.handle_max == 0x7FFFFFFF
            assert broker.connection_count() >= 1
        finally:
            c.close()

    def test_broker_open_settings(self) -> None:
        with Broker(max_frame_size=4096, idle_timeout=8, container_id="cid-9") as b:
            c = BlockingConnection(b.url, timeout=10, allowed_mechs="ANONYMOUS")
            try:
                assert c.conn.remote_container == "cid-9"
                assert c.conn.transport.remote_max_frame_size == 4096
                # proton advertises half its idle timeout, so that peers send heartbeats in time
                assert c.conn.transport.remote_idle_timeout == 4
                assert b.connection_count() == 1 and b.socket_count() == 1
            finally:
                c.close()
            assert b.wait_until(lambda: b.connection_count() == 0 and b.socket_count() == 0)


class TestLifecycle:
    def test_stop_closes_clients_and_leaves_no_thread(self) -> None:
        b = Broker(stop_grace=0.2).start()  # this client will not answer the Close
        name = f"demo-broker-{b.port}"
        assert any(t.name == name for t in threading.enumerate())
        c = BlockingConnection(b.url, timeout=10, allowed_mechs="ANONYMOUS")
        receiver = c.create_receiver("q")
        b.stop()
        assert not any(t.name == name for t in threading.enumerate())
        assert not b.running
        with pytest.raises(ConnectionException):
            receiver.receive(timeout=5)
        with contextlib.suppress(ConnectionException):
            c.close()
        with pytest.raises(OSError), socket.create_connection(b.address, timeout=2):
            pass
        b.stop()  # idempotent

    def test_context_manager_and_port(self) -> None:
        with Broker() as b:
            assert b.port > 0 and b.address == ("127.0.0.1", b.port)
            assert b.url == f"amqp://127.0.0.1:{b.port}"
            thread_name = f"demo-broker-{b.port}"
        assert not any(t.name == thread_name for t in threading.enumerate())

    def test_port_in_use_raises(self, broker: Broker) -> None:
        with pytest.raises(OSError):
            Broker(port=broker.port).start()

    def test_unresponsive_peer_does_not_block_stop(self) -> None:
        b = Broker(stop_grace=0.2).start()
        with socket.create_connection(b.address) as raw:  # TCP only, never speaks AMQP
            assert b.wait_until(lambda: b.socket_count() == 1)
            b.stop(timeout=5)
            assert not b.running
            raw.settimeout(2)
            while raw.recv(4096):  # whatever the broker wrote, then EOF: closed by the broker
                pass


# -- topic subscriptions ---------------------------------------------------------------------


def test_wildcard_subscription_gets_a_copy_of_each_matching_message(broker, client):
    one, deep = client.create_receiver("T/+"), client.create_receiver("T/#")
    plain = client.create_receiver("T/P")
    sender = client.create_sender(None)  # anonymous relay: routed by each message's "to"
    for address in ("T/P", "T/K", "T/B/C", "U/P"):
        sender.send(Message(address=address, body=address))
    got_one = [one.receive(timeout=5) for _ in range(2)]
    assert [m.address for m in got_one] == ["T/P", "T/K"]  # the "to" is kept
    got_deep = [deep.receive(timeout=5) for _ in range(3)]
    assert [m.body for m in got_deep] == ["T/P", "T/K", "T/B/C"]
    assert plain.receive(timeout=5).body == "T/P"  # the address's own queue keeps its copy
    for r in (one, deep, plain):
        r.accept()
        with pytest.raises(Timeout):
            r.receive(timeout=0.3)
