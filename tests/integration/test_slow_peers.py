"""Slow, silent and half-open peers: the proxy must time them out and never buffer without bound.

- A client that sends nothing, or drips one byte at a time, is closed at the handshake
  timeout counted from accept (activity does not extend it).
- The idle-time-out each side announces reaches the other unchanged, heartbeats are relayed
  both ways, and a client that goes silent (half-open) is closed through the router's idle
  timeout with every count released.
- A client that stops reading makes the proxy stop reading from the router (and vice versa):
  the proxy's write buffers stay near the high-water mark while the peer keeps pushing.
- While the upstream connection is pending, the client is not read at all.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.events import ConnectionClosed, ConnectionDenied
from amqp_policy_proxy.daemon.relay import HIGH_WATER
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import (
    FrameParser,
    Open,
    RawClient,
    RawUpstream,
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


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    with RawUpstream() as up:
        yield up


# ---------------------------------------------------------------------------------- handshake


class TestHandshakeTimeout:
    def test_client_that_sends_nothing_is_closed_at_the_timeout(self, upstream):
        with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY,
                         handshake_seconds=1.0) as proxy, RawClient(proxy.port) as c:
            start = time.monotonic()
            got = c.read_until_closed(timeout=5)
            elapsed = time.monotonic() - start
            assert c.closed and got == [] and c.raw == b""
            assert 0.9 <= elapsed < 3.0, elapsed
            assert [str(e.reason) for e in proxy.events_of(ConnectionDenied)] == [
                "handshake_timeout"]
            assert upstream.connections_made == 0
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))

    def test_client_dripping_one_byte_at_a_time_is_closed_at_the_timeout(self, upstream):
        # a slowloris: every byte arrives well within any per-read timeout, but the whole
        # handshake never completes; the deadline counts from accept, not from the last byte
        script = C.SASL_HEADER + sasl_plain_init("alice") + C.AMQP_HEADER
        with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY,
                         handshake_seconds=1.5) as proxy, RawClient(proxy.port) as c:
            start = time.monotonic()
            sent = 0
            while not c.closed and sent < len(script) and time.monotonic() - start < 5:
                if not c.try_send(script[sent : sent + 1]):
                    break
                sent += 1
                c.read_for(0.2)
            c.read_until_closed(timeout=5)
            elapsed = time.monotonic() - start
            assert c.closed
            assert 1.4 <= elapsed < 3.5, elapsed
            assert sent < len(script)
            assert [str(e.reason) for e in proxy.events_of(ConnectionDenied)] == [
                "handshake_timeout"]
            # the upstream leg opened for the SASL relay is closed too
            assert upstream.wait_for(lambda u: u.active == 0, 5)
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))

    def test_sasl_done_but_open_dripped_is_closed_at_the_timeout(self, upstream):
        with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY,
                         handshake_seconds=1.5) as proxy, RawClient(proxy.port) as c:
            start = time.monotonic()
            assert c.sasl_plain("alice") == 0
            c.send(C.AMQP_HEADER)
            open_ = frame(0, Open(container_id="slow", hostname="test"))
            for byte in open_[:-1]:
                if not c.try_send(bytes([byte])):
                    break
                c.read_for(0.1)
                if c.closed:
                    break
            c.read_until_closed(timeout=5)
            assert c.closed
            assert time.monotonic() - start < 3.5
            assert not any(i.name == "Open" for i in c.items)
            assert upstream.items(Open) == []
            assert wait_until(lambda: counts(proxy) == (0, 0, 0))


# ---------------------------------------------------------------------------------- idle time-out


def test_idle_timeout_as_negotiated_is_honoured_and_half_open_clients_are_released():
    with RawUpstream(idle_time_out=1000) as upstream, ProxyThread(
            [("127.0.0.1", upstream.port)], policy=POLICY) as proxy, RawClient(proxy.port) as c:
        got = c.open(user="alice", idle_time_out=800)
        # each side's idle-time-out reaches the other unchanged
        router_open = [i for i in got if i.name == "Open"][0]
        assert int(router_open.perf.idle_time_out) == 1000
        assert int(upstream.items(Open)[0].perf.idle_time_out) == 800
        # 3 s of heartbeats from the client every 0.3 s: the router (1 s timeout) stays happy
        start = time.monotonic()
        while time.monotonic() - start < 3:
            c.send(b"\x00\x00\x00\x08\x02\x00\x00\x00")
            c.read_for(0.3)
        assert not c.closed
        assert upstream.idle_expired == 0
        heartbeats = [i for i in c.items if i.name == "heartbeat"]
        assert len(heartbeats) >= 4  # router heartbeats at half our 800 ms, relayed promptly
        assert len([i for i in upstream.items() if i.name == "heartbeat"]) >= 6
        assert counts(proxy) == (1, 1, 1)
        # the client goes silent (a half-open peer): the router's idle timeout closes it
        silent_from = time.monotonic()
        got = c.read_until_closed(timeout=5)
        assert c.closed
        assert time.monotonic() - silent_from < 4.0
        closes = [(i.condition, i.description) for i in got if i.name == "Close"]
        assert closes == [("amqp:resource-limit-exceeded", "local-idle-timeout expired")]
        assert upstream.idle_expired == 1
        assert wait_until(lambda: counts(proxy) == (0, 0, 0))
        closed = proxy.events_of(ConnectionClosed)
        assert len(closed) == 1 and closed[0].close_reason == "broker_close"


# ---------------------------------------------------------------------------------- backpressure


def write_buffers(proxy: ProxyThread) -> list[tuple[int, int]]:
    """(client transport, router transport) write-buffer sizes of every live connection."""

    def sizes() -> list[tuple[int, int]]:
        out = []
        for proto in proxy.daemon.connections.values():
            client = proto.transport.get_write_buffer_size() if proto.transport else 0
            router = proto.router
            up = (router.transport.get_write_buffer_size()
                  if router is not None and router.transport is not None else 0)
            out.append((client, up))
        return out

    return proxy.call(sizes)


FLOOD = 96 * 1024 * 1024
# what may sit between the two peers while one stalls: kernel socket buffers on loopback
# (autotuned, a few MB each way), the proxy's transport buffer (HIGH_WATER) and one read
IN_FLIGHT_BOUND = 32 * 1024 * 1024


@pytest.mark.slow
def test_client_that_stops_reading_makes_the_proxy_stop_reading_the_router():
    with RawUpstream(flood_bytes=FLOOD, send_frame_size=65536) as upstream, ProxyThread(
            [("127.0.0.1", upstream.port)], policy=POLICY) as proxy, RawClient(
            proxy.port, rcvbuf=64 * 1024) as c:
        c.open(user="alice")
        c.send(begin(0), attach_receiver(0, 0, "flood"))
        # ... and the client stops reading. The router pushes as fast as it is let.
        time.sleep(2.0)
        stalled_at = upstream.flood_sent
        time.sleep(1.0)
        assert upstream.flood_sent == stalled_at, "the proxy kept reading from the router"
        assert stalled_at < IN_FLIGHT_BOUND, stalled_at
        assert upstream.pauses >= 1
        (client_buf, _), = write_buffers(proxy)
        assert client_buf <= HIGH_WATER + 512 * 1024, client_buf
        # the client reads again: every transfer arrives, in order, none lost
        parser = FrameParser()
        transfers = 0
        c.sock.settimeout(10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
                upstream.flood_sent < FLOOD or transfers < upstream.flood_frames):
            data = c.sock.recv(1 << 20)
            if not data:
                break
            for item in parser.feed(data):
                if item.name == "Transfer":
                    assert int(item.perf.delivery_id) == transfers
                    assert len(item.payload) == 65536 - 64
                    transfers += 1
        assert upstream.flood_sent >= FLOOD
        assert transfers == upstream.flood_frames


@pytest.mark.slow
def test_router_that_stops_reading_makes_the_proxy_stop_reading_the_client(upstream):
    with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY) as proxy, RawClient(
            proxy.port) as c:
        c.open(user="alice")
        c.send(begin(0), attach_sender(0, 0, "sink", settled=True))
        c.read_until(lambda i: i.name == "Flow")
        upstream.pause_reading()
        payload = data_message(b"P" * 60000)
        c.sock.settimeout(0.5)
        pushed = 0
        start = time.monotonic()
        try:
            while time.monotonic() - start < 5:
                c.sock.sendall(transfer(0, 0, pushed, payload, settled=True))
                pushed += 1
        except TimeoutError:
            pass  # the client's socket is full: the proxy stopped reading it
        pushed_bytes = pushed * len(payload)
        assert pushed_bytes < IN_FLIGHT_BOUND, pushed_bytes
        (_, router_buf), = write_buffers(proxy)
        assert router_buf <= HIGH_WATER + 512 * 1024, router_buf
        upstream.resume_reading()
        assert upstream.wait_for(lambda u: len(u.messages) >= pushed - 1, 20)


def test_client_is_not_read_while_the_upstream_connect_is_pending():
    # A black-holed upstream: a listener whose accept queue is full never answers a SYN.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(hole.getsockname())
        except BlockingIOError:
            pass
        fillers.append(s)
    time.sleep(0.2)
    try:
        with ProxyThread([hole.getsockname()], policy=POLICY) as proxy, RawClient(
                proxy.port) as c:
            # no SASL: the Open waits for the router (nobody is admitted without one), and
            # what the client pipelines behind it is held, then transfers stream in
            c.send(C.AMQP_HEADER, frame(0, Open(container_id="x", hostname="test")), begin(0),
                   attach_sender(0, 0, "q", settled=True))
            payload = data_message(b"x" * 60000)
            c.sock.settimeout(0.5)
            pushed = 0
            start = time.monotonic()
            try:
                while time.monotonic() - start < 2:
                    c.sock.sendall(transfer(0, 0, pushed, payload, settled=True))
                    pushed += 1
            except TimeoutError:
                pass

            def pending() -> list[int]:
                return [p.conn.view.held_bytes
                        for p in proxy.daemon.connections.values() if p.conn is not None]

            queued = proxy.call(pending)
            assert queued and max(queued) < 1024 * 1024, queued
            assert pushed * len(payload) < IN_FLIGHT_BOUND
    finally:
        for s in fillers:
            s.close()
        hole.close()


DENYING = compile_policy([(None, [["vhost", {
    "hostname": "test",
    "groups": {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "allowed"}},
}]])], PolicySettings())


@pytest.mark.slow
def test_a_client_that_provokes_denials_without_reading_them_stops_being_read(upstream):
    # issue 28, denial floods: an Attach to a denied target and its Detach, over and over,
    # never reading the proxy's answers (an Attach and a Detach with amqp:unauthorized-access
    # each). The proxy's own replies count toward the client's high-water mark like relayed
    # bytes, so the client stops being read and the denials stop with it.
    from amqp_policy_proxy.core.events import LinkDenied
    from tests.support.rawpeer import Detach

    with ProxyThread([("127.0.0.1", upstream.port)], policy=DENYING) as proxy, RawClient(
            proxy.port, rcvbuf=16 * 1024) as c:
        c.open(user="alice")
        c.send(begin(0))
        c.read_until(lambda i: i.name == "Begin")  # the denials go out on the router's channel
        pair = attach_sender(0, 0, "secret") + frame(0, Detach(handle=0, closed=True))
        burst = pair * 64
        c.sock.settimeout(0.2)
        buffered: list[int] = []
        start = time.monotonic()
        blocked = False
        pending = memoryview(burst)
        while time.monotonic() - start < 8:
            try:
                pending = pending[c.sock.send(pending):] or memoryview(burst)
            except TimeoutError:
                blocked = True  # the client's socket is full: the proxy stopped reading it
                buffered.append(write_buffers(proxy)[0][0])
        assert blocked, "the proxy read every frame of a client that never reads"
        # what the proxy answered and nobody read stays near the high-water mark (without
        # the back-pressure: 11 MB and 100,000 denials in 10 s, growing)
        assert max(buffered) <= HIGH_WATER + 512 * 1024, max(buffered)
        before = len(proxy.events_of(LinkDenied))
        assert before < 100_000, before
        # the client reads again: the proxy resumes reading it and answers what it sent
        c.sock.settimeout(0.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(proxy.events_of(LinkDenied)) == before:
            try:
                c.sock.recv(1 << 20)
            except TimeoutError:
                pass
        assert len(proxy.events_of(LinkDenied)) > before
