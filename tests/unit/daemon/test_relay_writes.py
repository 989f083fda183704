"""daemon/relay.py: what the core emits for one input goes out as one write per side.

The AMQP header and the Open a client sends in one read reached the router as two writes
(an Emit between them ended the first), so the router read twice. Real sockets, with the
system calls counted by a transport that records each write call.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from amqp_policy_proxy.core.commands import CLIENT, ROUTER, CloseTransport, Emit, SendData
from amqp_policy_proxy.daemon.relay import ClientProtocol, RouterProtocol


class _Host:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)


class _Counting:
    """Wraps a transport; counts write and writelines calls (each one system call)."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self.inner, self.calls = inner, 0

    def write(self, data: Any) -> None:
        self.calls += 1
        self.inner.write(data)

    def writelines(self, chunks: Any) -> None:
        self.calls += 1
        self.inner.writelines(chunks)

    def close(self) -> None:
        self.inner.close()


async def _pair() -> tuple[asyncio.Transport, socket.socket]:
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
        asyncio.Protocol, ours)
    theirs.setblocking(False)
    return transport, theirs


async def _read(sock: socket.socket, n: int) -> bytes:
    loop, out = asyncio.get_running_loop(), b""
    while len(out) < n:
        out += await loop.sock_recv(sock, n - len(out))
    return out


async def test_one_write_per_side_and_events_after_the_writes() -> None:
    host = _Host()
    client = ClientProtocol(host=host, listener="127.0.0.1:5672", conn_id="c1")  # type: ignore[arg-type]
    c_transport, c_peer = await _pair()
    r_transport, r_peer = await _pair()
    client.transport = _Counting(c_transport)  # type: ignore[assignment]
    client.router = RouterProtocol(client)
    client.router.transport = _Counting(r_transport)  # type: ignore[assignment]
    try:
        client._execute([SendData(ROUTER, b"AMQP\x00\x01\x00\x00"), Emit("decided"),  # type: ignore[arg-type]
                         SendData(CLIENT, b"c1"), SendData(ROUTER, b"OPEN"),
                         Emit("opened")])  # type: ignore[arg-type]
        assert client.router.transport.calls == 1  # type: ignore[union-attr]
        assert client.transport.calls == 1  # type: ignore[union-attr]
        assert host.events == ["decided", "opened"]
        assert await _read(r_peer, 12) == b"AMQP\x00\x01\x00\x00OPEN"
        assert await _read(c_peer, 2) == b"c1"
    finally:
        c_transport.close()
        r_transport.close()
        c_peer.close()
        r_peer.close()


async def test_a_close_flushes_what_came_before_it_first() -> None:
    host = _Host()
    client = ClientProtocol(host=host, listener="127.0.0.1:5672", conn_id="c1")  # type: ignore[arg-type]
    c_transport, c_peer = await _pair()
    client.transport = c_transport
    try:
        client._execute([SendData(CLIENT, b"CLOSE-FRAME"), CloseTransport(CLIENT),
                         SendData(CLIENT, b"after")])
        # the frame before the close is on the wire; nothing written after the close
        assert await _read(c_peer, 11) == b"CLOSE-FRAME"
        await asyncio.sleep(0.05)
        assert await asyncio.get_running_loop().sock_recv(c_peer, 100) == b""
    finally:
        c_transport.close()
        c_peer.close()
