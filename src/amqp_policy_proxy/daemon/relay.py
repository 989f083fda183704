"""Daemon layer. The I/O shell of one proxied connection: a client/router ``asyncio.Protocol``
pair around the sans-IO core.

Each ``data_received`` makes exactly one ``ProxyConnection.receive_data`` call, executes the
returned commands in order without awaiting, then re-arms the connection's single timer
(aioquic ``transmit()`` style). Backpressure: when one transport's write buffer is full, the
other transport stops reading (uvicorn ``FlowControl``). A bug in the core is contained to this
connection: it is logged with its traceback and both transports are closed.

The relay depends on the daemon only through :class:`RelayHost`: admission of a transport at
accept, building the core for it, where to connect, and where events and figures go.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from ..core.commands import CLIENT, ROUTER, CloseTransport, ConnectRouter, Emit, SendData, Side
from ..core.connection import ProxyConnection
from ..core.events import ProxyEvent, UpstreamConnectFailed
from ..core.view import ConnectionView
from ..ingress.peer import ClientAddress
from ..policy.reasons import ConnectionDenyReason
from .proxy_listener import Proxied
from .tls import peer_not_after, peer_subject

logger = logging.getLogger(__name__)

#: Write-buffer high-water mark per transport (bytes); above it the opposite side pauses.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
#: While the upstream connection is being made, the client is read until the connection holds
#: this many bytes (for the router, or behind an Open that waits for it), then not until the
#: connect ends (a well-behaved client sends a few hundred bytes and waits: it is never paused,
#: which saves two epoll changes).
CONNECT_BACKLOG = 64 * 1024
#: Why a client is not read (bits; it is read again when none is left): its bytes wait for
#: the upstream connect (``CONNECT_BACKLOG``), the pre-authentication memory budget is spent,
#: the router's write buffer is above ``HIGH_WATER``, or the client's own is (it does not
#: read what the proxy writes to it: relayed bytes and the proxy's own replies alike, so a
#: client that provokes denials without reading them stops being read).
PAUSED_CONNECTING = 1
PAUSED_BUDGET = 2
PAUSED_ROUTER_FULL = 4
PAUSED_CLIENT_FULL = 8


class Upstream(Protocol):
    """One configured router (``daemon.settings.UpstreamConfig``)."""

    @property
    def address(self) -> Any:
        """``HOST:PORT`` (``host`` and ``port`` attributes)."""

    @property
    def tls_server_name(self) -> str | None:
        """The name the router's certificate must carry (default: the host)."""


class RelayHost(Protocol):
    """What one relayed connection needs from the daemon, and nothing more."""

    loop: asyncio.AbstractEventLoop

    @property
    def connect_timeout(self) -> float:
        """Seconds for one upstream connect attempt."""

    def peer_address(self, raw: str) -> ClientAddress:
        """The client address of a socket peer, normalised and parsed (remembered)."""

    def accept(self, proto: ClientProtocol,
               remote_host: ClientAddress) -> ConnectionDenyReason | None:
        """Count a new client transport (global limit, drain, memory budget), or refuse it."""

    def open_connection(self, proto: ClientProtocol, remote_host: ClientAddress,
                        tls_subject: str | None,
                        tls_not_after: float | None = None) -> ProxyConnection:
        """Build the core of an accepted transport (current policy, ledger, settings)."""

    def connection_finished(self, proto: ClientProtocol) -> None:
        """The client transport is gone: uncount it and forget it."""

    def emit(self, event: ProxyEvent) -> None:
        """Fan an event out (metrics, event log). Never raises."""

    def observe_open_decision(self, seconds: float) -> None:
        """Record the time the call that decided a client's Open took."""

    def preauth_held(self, proto: ClientProtocol, held: int) -> None:
        """Report the bytes a connection not yet admitted holds (0: admitted or gone)."""

    def internal_error(self, proto: ClientProtocol) -> None:
        """Count a contained bug."""

    def upstreams(self) -> Sequence[Any]:
        """The upstreams to try for a new connection, in order."""

    def upstream_ssl_context(self, upstream: Any) -> ssl.SSLContext | None:
        """The client-side TLS context for ``upstream`` (None: plain TCP)."""

    def service_login(self, upstream: Any) -> Any:
        """The identity the proxy logs in to ``upstream`` with (token connections of
        ``token_authority = "proxy"``), else None."""

    def upstream_connected(self, upstream: Any) -> None:
        """A connect to ``upstream`` succeeded."""

    def upstream_failed(self, upstream: Any) -> float:
        """A connect to ``upstream`` failed; returns its back-off in seconds."""


class ClientProtocol(asyncio.Protocol):
    """The client leg. Owns the :class:`ProxyConnection` and drives the router leg."""

    __slots__ = (
        "host", "listener", "transport", "router", "conn", "timer", "timer_at", "counted", "closed",
        "conn_id", "_connect_task", "client_eof", "router_eof", "_pauses",
        "_connect_timed_out", "_held", "proxied", "upstream", "last_activity", "view",
    )

    def __init__(self, host: RelayHost, listener: str, conn_id: str,
                 proxied: Proxied | None = None) -> None:
        """Create the protocol for one accepted transport on ``listener`` (``HOST:PORT``);
        ``proxied``: what the load balancer's PROXY header said (``proxy_protocol``
        listeners only), whose client address replaces the socket's peer."""
        self.host = host
        self.listener = listener
        self.conn_id = conn_id
        self.proxied = proxied
        self.transport: asyncio.Transport | None = None
        self.router: RouterProtocol | None = None
        self.conn: ProxyConnection | None = None
        self.view: ConnectionView | None = None
        """What the relay reads of :attr:`conn` (kept: the core makes a view per request)."""
        self.timer: asyncio.Handle | None = None
        self.timer_at = 0.0
        """The deadline :attr:`timer` was armed for (loop clock)."""
        self.counted = False
        self.closed = False
        self._connect_task: asyncio.Task[None] | None = None
        self.client_eof = False
        self.router_eof = False
        self._pauses = 0
        """Why the client is not read: ``PAUSED_*`` bits (it is read again at none)."""
        self._connect_timed_out = False
        self._held = 0  # bytes last reported to the pre-authentication budget
        self.upstream: Any = None
        """The upstream the router leg is connected to (``connections list``)."""
        self.last_activity: float | None = None
        """Loop-clock seconds of the last bytes from either leg (``connections list``)."""

    # --- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Global maxConnections (and the memory budget) at accept, before any byte."""
        transport = self.transport = cast(asyncio.Transport, transport)  # a stream server's
        host = self.host
        if self.proxied is None:
            peer = transport.get_extra_info("peername")
            remote_host = host.peer_address(peer[0] if peer else "")
        else:
            remote_host = self.proxied.client
        if host.accept(self, remote_host) is not None:
            # the socket is closed without a byte written and no upstream connection made
            transport.close()
            self.closed = True
            return
        self.counted = True
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self.conn = host.open_connection(self, remote_host, peer_subject(transport),
                                         peer_not_after(transport))
        self.view = self.conn.view
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        """Feed client bytes to the core (timing the call that makes the Open decision)."""
        conn = self.conn
        if conn is None:
            return
        view = self.view
        assert view is not None
        if not view.decided:
            started = time.perf_counter()
            self._feed(conn, CLIENT, data)
            decided = view.decided
            if decided:
                self.host.observe_open_decision(time.perf_counter() - started)
            held = 0 if decided or self.closed else view.held_bytes
            if held != self._held:
                self._held = held
                self.host.preauth_held(self, held)
        else:
            self._feed(conn, CLIENT, data)
        if (self.router is None and self._connect_task is not None
                and view.held_bytes > CONNECT_BACKLOG):
            # the upstream is not there yet and the client keeps sending: stop reading it
            # until the connect ends, so its bytes cannot pile up at line rate
            self.pause(PAUSED_CONNECTING)

    def ledger_answered(self, reason: ConnectionDenyReason | None) -> None:
        """The fleet ledger answered this connection's pending admission (None: counted)."""
        conn = self.conn
        if conn is None or self.closed:
            return
        self.run(conn.ledger_answered, reason)
        if self._held and self.view is not None and self.view.decided:
            self._held = 0
            self.host.preauth_held(self, 0)

    def eof_received(self) -> bool | None:
        """Client half-closed.

        proton half-closes right after sending its Close: then the half-close is passed on to
        the router and the client transport stays open for writing, so the router's answering
        Close still reaches the client. A client that half-closes without a Close (gone, or
        half-open) is closed at once.
        """
        self.client_eof = True
        router = self.router
        conn = self.conn
        if (router is None or router.transport is None or self.router_eof or conn is None
                or not conn.close_received_from(CLIENT)):
            return None  # nothing to wait for: close now
        if router.transport.can_write_eof():
            router.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """The client transport is gone: finish the connection exactly once."""
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self._held:
            self._held = 0
            self.host.preauth_held(self, 0)
        conn = self.conn
        if conn is not None:
            self.run(conn.connection_lost, CLIENT)
        if self.counted:
            self.counted = False
            self.host.connection_finished(self)
        router = self.router
        if router is not None and router.transport is not None:
            router.transport.close()
        self._let_go()

    def _let_go(self) -> None:
        """Once both transports are gone, cut the legs' references to each other and to their
        transports, so that reference counting frees the connection (its core included) when
        the daemon drops it, instead of the cycle collector."""
        router = self.router
        if not self.closed or (router is not None and not router.lost):
            return
        self.transport = None
        self._connect_task = None
        if router is not None:
            router.transport = None
            self.router = None

    def pause(self, reason: int) -> None:
        """Stop reading the client for ``reason`` (a ``PAUSED_*`` bit); reasons add up."""
        if self.transport is None or self.closed:
            return
        if not self._pauses:
            self.transport.pause_reading()
        self._pauses |= reason

    def resume(self, reason: int) -> None:
        """``reason`` no longer holds: read the client again once no other reason does."""
        if not self._pauses & reason:
            return
        self._pauses &= ~reason
        if (not self._pauses and self.transport is not None and not self.closed
                and not self.transport.is_closing()):
            self.transport.resume_reading()

    def budget_pause(self) -> None:
        """Stop reading this client: the pre-authentication budget is exhausted."""
        self.pause(PAUSED_BUDGET)

    def budget_resume(self) -> None:
        """The pre-authentication budget has room again: read this client again."""
        self.resume(PAUSED_BUDGET)

    def pause_writing(self) -> None:
        """The client is not reading (its write buffer is above ``HIGH_WATER``): stop reading
        from the router, and from the client itself, whose frames would only add replies."""
        if self.router is not None and self.router.transport is not None:
            self.router.transport.pause_reading()
        self.pause(PAUSED_CLIENT_FULL)

    def resume_writing(self) -> None:
        """The client drained its buffer: read from the router and the client again."""
        if self.router is not None and self.router.transport is not None:
            self.router.transport.resume_reading()
        self.resume(PAUSED_CLIENT_FULL)

    # --- running the core -----------------------------------------------------------------

    def run(self, step: Callable[..., list[Any]], *args: Any) -> None:
        """Call ``step(*args, now)`` on the core and execute its commands (a bug in the core
        is contained: logged, counted, both transports aborted)."""
        conn = self.conn
        assert conn is not None
        try:
            self._execute(step(*args, self.host.loop.time()))
        except Exception:  # a proxy bug: contain it to this connection
            self._contain(conn)
            return
        self._arm_timer()

    def _feed(self, conn: ProxyConnection, side: Side, data: bytes) -> None:
        """:meth:`run` for ``receive_data``, the per-read path (no closure per call)."""
        now = self.last_activity = self.host.loop.time()
        try:
            self._execute(conn.receive_data(side, data, now))
        except Exception:  # a proxy bug: contain it to this connection
            self._contain(conn)
            return
        self._arm_timer()

    def _contain(self, conn: ProxyConnection) -> None:
        logger.exception("[%s] internal error; closing this connection", self.conn_id)
        self.host.internal_error(self)
        conn.internal_error(self.host.loop.time())
        self.abort()

    def _write(self, side: Side, chunks: list[Any]) -> None:
        if side is CLIENT:
            transport = self.transport if not self.closed else None
        else:
            router = self.router
            transport = router.transport if router is not None else None
        if transport is None:
            return
        if len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)  # one writev under uvloop

    def _execute(self, commands: list[Any]) -> None:
        """Carry out the core's commands for one input, in order, with one write per side.

        The SendData for the client and for the router are gathered (each side's bytes in
        the core's order) and go out as one write or writev per side, so an Open that follows
        the AMQP header in one client read costs the router one read, not two. An Emit
        (metrics, event log, bans) does not end a write: the events run after the batch's
        writes. A CloseTransport or ConnectRouter first flushes what was gathered, so nothing
        the core sent before a close is lost or reordered on that side.
        """
        to_client: list[Any] = []
        to_router: list[Any] = []
        events: list[Any] = []
        for cmd in commands:
            kind = type(cmd)
            if kind is SendData:
                (to_client if cmd.side is CLIENT else to_router).append(cmd.data)
                continue
            if kind is Emit:
                events.append(cmd.event)
                continue
            self._flush(to_client, to_router)
            if kind is CloseTransport:
                if cmd.side is CLIENT:
                    if self.transport is not None:
                        self.transport.close()
                elif self.router is not None and self.router.transport is not None:
                    self.router.transport.close()
                elif self._connect_task is not None and not self._connect_task.done():
                    self._connect_task.cancel()
            elif kind is ConnectRouter:
                # Until the upstream is up, what the client sends is queued in the core;
                # data_received stops reading the client when that queue passes
                # CONNECT_BACKLOG, and reading resumes once the connect ends.
                self._connect_task = self.host.loop.create_task(self._connect_upstream())
        self._flush(to_client, to_router)
        for event in events:
            self.host.emit(event)

    def _flush(self, to_client: list[Any], to_router: list[Any]) -> None:
        """Write what :meth:`_execute` gathered for each side (one call per side) and empty
        the lists; the transports take the chunks at once, so the lists can be reused."""
        if to_client:
            self._write(CLIENT, to_client)
            to_client.clear()
        if to_router:
            self._write(ROUTER, to_router)
            to_router.clear()

    def abort(self) -> None:
        """Abort both transports at once (no flush): a contained bug, or the end of a drain."""
        if self.transport is not None:
            self.transport.abort()
        if self.router is not None and self.router.transport is not None:
            self.router.transport.abort()

    def _arm_timer(self) -> None:
        conn = self.conn
        if conn is None or self.closed:
            return
        deadline = conn.get_timer()
        if self.timer is not None:
            # the deadline is remembered here: uvloop's call_at for a time already past
            # returns a plain Handle, which has no when()
            if deadline is not None and self.timer_at == deadline:
                return
            self.timer.cancel()
            self.timer = None
        if deadline is not None:
            self.timer_at = deadline
            self.timer = self.host.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        conn = self.conn
        if conn is not None and not self.closed:
            self.run(conn.handle_timer)

    # --- the upstream connection ------------------------------------------------------------

    async def _connect_upstream(self) -> None:
        host = self.host
        loop = host.loop
        for upstream in host.upstreams():
            if self.closed:
                return
            ctx = host.upstream_ssl_context(upstream)
            # A plain timer that cancels this task (no wait_for task, no asyncio.timeout
            # context per attempt): the cancellation is ours when _connect_timed_out is set.
            self._connect_timed_out = False
            deadline = loop.call_later(host.connect_timeout, self._connect_timeout)
            try:
                _, proto = await loop.create_connection(
                    lambda: RouterProtocol(self), upstream.address.host,
                    upstream.address.port, ssl=ctx,
                    server_hostname=(upstream.tls_server_name or upstream.address.host)
                    if ctx else None,
                )
            except asyncio.CancelledError:
                if not self._connect_timed_out or self.closed:
                    raise
                task = self._connect_task
                if task is not None:
                    task.uncancel()
                self._upstream_failed(upstream, TimeoutError("connect timed out"))
                continue
            except (OSError, ssl.SSLError) as exc:
                self._upstream_failed(upstream, exc)
                continue
            finally:
                deadline.cancel()
            if self.closed:
                proto.transport.close()
                return
            host.upstream_connected(upstream)
            self.router = proto
            self.upstream = upstream
            conn = self.conn
            assert conn is not None
            # a client that sent its Open before the upstream was there is decided now
            view = self.view
            assert view is not None
            waiting = not view.decided
            started = time.perf_counter()
            login = host.service_login(upstream)
            if login is None:
                self.run(conn.router_connected)
            else:
                self.run(functools.partial(conn.router_connected, login=login))
            if waiting and view.decided:
                host.observe_open_decision(time.perf_counter() - started)
                if self._held:
                    self._held = 0
                    host.preauth_held(self, 0)
            self.resume(PAUSED_CONNECTING)
            return
        conn = self.conn
        if conn is not None and not self.closed:
            self.run(conn.router_connect_failed)
            self.resume(PAUSED_CONNECTING)

    def _upstream_failed(self, upstream: Any, exc: BaseException) -> None:
        host = self.host
        backoff = host.upstream_failed(upstream)
        logger.warning("[%s] upstream %s failed: %s (tried last for the next %.0f s)",
                       self.conn_id, upstream.address, exc, backoff)
        host.emit(UpstreamConnectFailed(
            conn_id=self.conn_id, at=host.loop.time(), remote_host="",
            listener=self.listener, upstream=str(upstream.address),
        ))

    def _connect_timeout(self) -> None:
        task = self._connect_task
        if task is not None and not task.done():
            self._connect_timed_out = True
            task.cancel()


class RouterProtocol(asyncio.Protocol):
    """The router leg; feeds router bytes into its client's :class:`ProxyConnection`."""

    __slots__ = ("client", "transport", "lost")

    def __init__(self, client: ClientProtocol) -> None:
        """Create the leg for ``client``."""
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.lost = False
        """The router transport is gone (``connection_lost`` was called)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Record the transport and apply the write-buffer limits."""
        transport = self.transport = cast(asyncio.Transport, transport)  # a stream connection's
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)

    def data_received(self, data: bytes) -> None:
        """Feed router bytes to the core."""
        client = self.client
        conn = client.conn
        if conn is None or client.closed:
            return
        client._feed(conn, ROUTER, data)

    def eof_received(self) -> bool | None:
        """Router half-closed: after its Close, pass the half-close on; else it is gone.

        A router that stops without a Close (killed, crashed) is handled as a lost upstream:
        the transport closes and the client gets ``amqp:connection:forced``.
        """
        client = self.client
        client.router_eof = True
        conn = client.conn
        transport = client.transport
        if (conn is None or not conn.close_received_from(ROUTER) or client.client_eof
                or transport is None or client.closed):
            return None
        if transport.can_write_eof():
            transport.write_eof()
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """The router transport is gone."""
        self.lost = True
        client = self.client
        conn = client.conn
        if conn is not None and not client.closed:
            client.run(conn.connection_lost, ROUTER)
        client._let_go()

    def pause_writing(self) -> None:
        """The router is not reading: stop reading from the client."""
        self.client.pause(PAUSED_ROUTER_FULL)

    def resume_writing(self) -> None:
        """The router drained: read from the client again (unless paused for another reason)."""
        self.client.resume(PAUSED_ROUTER_FULL)

