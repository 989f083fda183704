"""Daemon layer. Listeners with ``proxy_protocol``: accept, check the peer, read the load
balancer's PROXY header off the socket, then hand the socket to the relay.

A load balancer that sends the PROXY protocol (HAProxy ``send-proxy``/``send-proxy-v2``, AWS
NLB, ...) writes one header before the client's first byte; its address is the client's. The
header comes before TLS, and asyncio's ``create_server(ssl=...)`` starts the TLS handshake on
the first byte, while a plain asyncio transport reads as much as the socket holds, so bytes
after the header could not be given back to TLS. Hence these listeners accept their sockets
themselves and read the header with ``MSG_PEEK``, taking off the socket only the bytes
:func:`~amqp_policy_proxy.ingress.proxy_protocol.parse_header` says belong to it; then
``loop.connect_accepted_socket`` (with the listener's TLS context, if any) builds the usual
transport and :class:`~amqp_policy_proxy.daemon.relay.ClientProtocol`, which takes the client's
address from the header. Listeners without ``proxy_protocol`` keep ``create_server`` and pay
nothing for this.

Rules, per listener (docs/deploy.md, "Behind a load balancer"):

* a peer outside ``proxy_protocol_from`` is closed at accept, before reading anything;
* a peer inside it must send a complete, valid header (v1 at most 107 bytes, v2 at most
  ``V2_MAX_LENGTH``) within ``[timeouts] handshake_seconds`` of the accept; a header that is
  missing (the stream begins with anything else), malformed, oversize, cut by EOF or late
  closes the socket with nothing written;
* each refusal is a ``ConnectionDenied`` event with reason ``proxy_protocol`` (the metric
  ``amqp_proxy_connections_denied_total{reason="proxy_protocol"}`` and the event log), and an
  INFO log line saying why;
* a v2 ``LOCAL`` header (the balancer's own connection, e.g. a health check), a v1 ``UNKNOWN``
  header and a v2 ``PROXY`` header of a family other than TCP over IPv4/IPv6 are accepted as
  the spec says, with the real endpoints: the client's address is then the balancer's, and the
  connection goes on like any other from that address (policy decides on it).

At most :data:`MAX_PENDING` sockets per listener wait for their header; beyond that the
listener stops accepting (the kernel's backlog holds the rest) until one is done.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.events import ConnectionDenied, ProxyEvent
from ..ingress.peer import ClientAddress
from ..ingress.proxy_protocol import MAX_LENGTH, HeaderError, NeedMore, ProxyHeader, parse_header
from ..policy.reasons import ConnectionDenyReason
from .settings import ListenerConfig

logger = logging.getLogger(__name__)

#: Sockets of one listener waiting for their PROXY header, at most (then accepting pauses).
MAX_PENDING = 1024
#: Connections accepted per readiness event of a listening socket.
ACCEPT_BATCH = 128
#: Seconds accepting pauses after the process ran out of file descriptors or memory.
ACCEPT_RETRY_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Proxied:
    """What a PROXY header said about one connection."""

    client: ClientAddress
    """The client's address: the header's source, or the balancer's own address (v2 LOCAL,
    v1 UNKNOWN, families other than TCP)."""
    balancer: str
    """The load balancer's address (the socket's peer), normalised."""


class ProxyListenerHost(Protocol):
    """What a PROXY protocol listener needs from the daemon."""

    loop: asyncio.AbstractEventLoop

    def next_conn_id(self) -> str:
        """A new process-unique connection id."""

    def peer_address(self, raw: str) -> ClientAddress:
        """The normalised, parsed form of an IP address (remembered)."""

    def emit(self, event: ProxyEvent) -> None:
        """Fan an event out (metrics, event log). Never raises."""


class ProxyProtocolServer:
    """One listener with ``proxy_protocol``; looks like the ``asyncio.Server`` it replaces
    (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(self, host: ProxyListenerHost, listener: ListenerConfig, name: str, *,
                 protocol_factory: Callable[[str, Proxied], asyncio.Protocol],
                 ssl_context: ssl.SSLContext | None, handshake_seconds: float,
                 backlog: int, reuse_port: bool = False) -> None:
        """Configure the listener; nothing is bound before :meth:`start`.

        Args:
            host: the daemon.
            listener: its configuration (address, ``proxy_protocol_from``).
            name: ``HOST:PORT`` as logs and events name the listener.
            protocol_factory: ``(conn_id, proxied) -> protocol`` for a socket whose header
                was read.
            ssl_context: the listener's TLS context (TLS starts after the header), or None.
            handshake_seconds: budget for the header from the accept, and for the TLS
                handshake after it.
            backlog: the ``listen`` backlog.
            reuse_port: bind with ``SO_REUSEPORT`` (a worker of ``--workers N``: its
                siblings listen on the same port and the kernel spreads the accepts).
        """
        self.host = host
        self.reuse_port = reuse_port
        self.loop = host.loop
        self.name = name
        self.address = listener.address
        self.networks = listener.proxy_protocol_from
        self.protocol_factory = protocol_factory
        self.ssl_context = ssl_context
        self.handshake_seconds = handshake_seconds
        self.backlog = backlog
        self._sockets: list[socket.socket] = []
        self._pending: set[_HeaderRead] = set()
        self._accepting = False
        self._closed = False

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets (one per address the host name resolves to)."""
        return tuple(self._sockets)

    async def start(self, start_serving: bool = True) -> None:
        """Bind and listen on every address of the listener's host, then accept (unless
        ``start_serving`` is False: then :meth:`start_serving` starts accepting).

        Raises:
            OSError: an address cannot be bound (nothing stays bound).
        """
        infos = await self.loop.getaddrinfo(self.address.host or None, self.address.port,
                                            type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        try:
            for family, kind, proto, _name, sockaddr in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self.reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(sockaddr)
                sock.listen(self.backlog)
                sock.setblocking(False)
        except OSError:
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()
            raise
        if start_serving:
            self._resume_accepting()

    async def start_serving(self) -> None:
        """Start accepting (after :meth:`start` with ``start_serving=False``), as
        ``asyncio.Server.start_serving``."""
        self._resume_accepting()

    def close(self) -> None:
        """Stop accepting and close the sockets still waiting for their header."""
        self._closed = True
        self._pause_accepting()
        for sock in self._sockets:
            sock.close()
        for pending in list(self._pending):
            pending.abandon()

    async def wait_closed(self) -> None:
        """Return once closed (closing is immediate; here for ``asyncio.Server`` callers)."""
        await asyncio.sleep(0)

    def is_serving(self) -> bool:
        """Whether the listener accepts connections now."""
        return self._accepting

    # --- accepting ------------------------------------------------------------------------

    def _resume_accepting(self) -> None:
        if self._accepting or self._closed:
            return
        self._accepting = True
        for sock in self._sockets:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _pause_accepting(self) -> None:
        if not self._accepting:
            return
        self._accepting = False
        for sock in self._sockets:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            if len(self._pending) >= MAX_PENDING:
                self._pause_accepting()  # resumed when a header read ends
                return
            try:
                sock, addr = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.error("listener %s cannot accept: %s; accepting again in %.0f s",
                                 self.name, exc, ACCEPT_RETRY_SECONDS)
                    self._pause_accepting()
                    self.loop.call_later(ACCEPT_RETRY_SECONDS, self._resume_accepting)
                else:
                    logger.warning("listener %s: accept failed: %s", self.name, exc)
                return
            self._accepted(sock, addr)

    def _accepted(self, sock: socket.socket, addr: Any) -> None:
        sock.setblocking(False)
        host = self.host
        conn_id = host.next_conn_id()
        peer = host.peer_address(addr[0] if isinstance(addr, tuple) else "")
        if peer.ip is None or not any(peer.ip in net for net in self.networks):
            sock.close()
            self.refuse(conn_id, peer, "the peer is not in proxy_protocol_from")
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = _HeaderRead(self, sock, conn_id, peer)
        self._pending.add(pending)
        pending.start()

    def refuse(self, conn_id: str, peer: ClientAddress, why: str) -> None:
        """Count and log one refused connection (its socket is already closed)."""
        logger.info("[%s] PROXY protocol: refused %s on %s: %s", conn_id, peer, self.name, why)
        self.host.emit(ConnectionDenied(
            conn_id=conn_id, at=self.loop.time(), remote_host=str(peer), listener=self.name,
            reason=ConnectionDenyReason.PROXY_PROTOCOL, description=why))

    def header_done(self, pending: _HeaderRead) -> None:
        """A header read ended (either way): accept again if the cap had paused it."""
        self._pending.discard(pending)
        if not self._accepting and not self._closed and len(self._pending) < MAX_PENDING:
            self._resume_accepting()

    def hand_over(self, sock: socket.socket, conn_id: str, proxied: Proxied) -> None:
        """Give a socket whose header was read to the relay (TLS first, if configured)."""
        self.loop.create_task(self._connect(sock, conn_id, proxied))

    async def _connect(self, sock: socket.socket, conn_id: str, proxied: Proxied) -> None:
        ctx = self.ssl_context
        try:
            await self.loop.connect_accepted_socket(
                lambda: self.protocol_factory(conn_id, proxied), sock, ssl=ctx,
                ssl_handshake_timeout=self.handshake_seconds if ctx is not None else None)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            # the transport owns the socket and has closed it
            logger.debug("[%s] TLS handshake with %s (through %s) failed: %s", conn_id,
                         proxied.client, proxied.balancer, exc)


class _HeaderRead:
    """One accepted socket whose PROXY header is being read (peek, parse, take)."""

    __slots__ = ("server", "sock", "conn_id", "peer", "buffer", "timer", "reading", "done")

    def __init__(self, server: ProxyProtocolServer, sock: socket.socket, conn_id: str,
                 peer: ClientAddress) -> None:
        self.server = server
        self.sock = sock
        self.conn_id = conn_id
        self.peer = peer
        self.buffer = b""
        """The header bytes taken off the socket so far."""
        self.timer: asyncio.TimerHandle | None = None
        self.reading = False
        self.done = False

    def start(self) -> None:
        """Read what is there already (a balancer writes the header on connect), else wait."""
        self.on_readable()
        if not self.done:
            loop = self.server.loop
            self.timer = loop.call_later(self.server.handshake_seconds, self.on_timeout)
            loop.add_reader(self.sock.fileno(), self.on_readable)
            self.reading = True

    def on_readable(self) -> None:
        """Peek, parse, and take off the socket only the bytes of the header."""
        sock = self.sock
        while not self.done:
            try:
                peeked = sock.recv(MAX_LENGTH - len(self.buffer), socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.fail(f"reading the PROXY header failed: {exc}")
                return
            if not peeked:
                self.fail("closed before a complete PROXY header" if self.buffer
                          else "closed without sending a PROXY header")
                return
            result = parse_header(self.buffer + peeked)
            if isinstance(result, HeaderError):
                self.fail(result.reason)
                return
            take = len(peeked) if isinstance(result, NeedMore) else result.length - len(
                self.buffer)
            try:
                taken = sock.recv(take)
            except OSError as exc:
                self.fail(f"reading the PROXY header failed: {exc}")
                return
            if len(taken) != take:  # the kernel gave less than it had shown: cannot happen
                self.fail(f"read {len(taken)} of {take} peeked header bytes")
                return
            self.buffer += taken
            if isinstance(result, ProxyHeader):
                self.succeed(result)

    def on_timeout(self) -> None:
        """The handshake timeout passed without a complete header."""
        self.timer = None
        self.fail(f"no complete PROXY header within {self.server.handshake_seconds:g} s")

    def _finish(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.reading:
            self.reading = False
            self.server.loop.remove_reader(self.sock.fileno())
        self.server.header_done(self)

    def fail(self, why: str) -> None:
        """Close the socket with nothing written, and count the refusal."""
        self._finish()
        self.sock.close()
        self.server.refuse(self.conn_id, self.peer, why)

    def succeed(self, header: ProxyHeader) -> None:
        """The header is read: hand the socket over with the client's address."""
        self._finish()
        server = self.server
        client = (self.peer if header.source is None
                  else server.host.peer_address(str(header.source[0])))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("[%s] PROXY v%d %s %s from %s: client %s", self.conn_id,
                         header.version, header.command, header.family, self.peer, client)
        server.hand_over(self.sock, self.conn_id, Proxied(client, self.peer.text))

    def abandon(self) -> None:
        """The listener closes: drop this socket without counting it."""
        if not self.done:
            self._finish()
            self.sock.close()
