"""I/O shell for one proxied connection: a client/broker ``asyncio.Protocol`` pair.

Each ``data_received`` makes exactly one ``ProxyConnection.receive_data`` call, executes the
returned commands in order without awaiting, then re-arms the connection's single timer
(aioquic ``transmit()`` style). Backpressure: when one transport's write buffer is full, the
other transport stops reading (uvicorn ``FlowControl``). A bug in the core is contained to this
connection: it is logged with its traceback and both transports are closed.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.commands import CloseTransport, ConnectBroker, Emit, SendData, Side
from ..core.connection import ProxyConnection
from ..core.events import ConnectionDenied, ConnectionDenyReason, UpstreamConnectFailed
from ..core.state import Phase
from ..ingress.peer import normalise_peer
from .tls import peer_subject

if TYPE_CHECKING:
    from .app import Daemon

logger = logging.getLogger(__name__)

#: Write-buffer high-water mark per transport (bytes); above it the opposite side pauses.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
#: While the upstream connection is being made, the client is read until this many bytes
#: wait for the router, then not until the connect ends (a well-behaved client sends a few
#: hundred bytes and waits: it is never paused, which saves two epoll changes).
CONNECT_BACKLOG = 64 * 1024

#: Peer address as the socket reported it -> ``normalise_peer`` of it. Clients reconnect from
#: few addresses, so the ``ipaddress`` parse runs once per address, not once per connection.
_PEER_HOSTS: dict[str, str] = {}
_PEER_HOSTS_MAX = 4096


def _peer_host(raw: str) -> str:
    """``normalise_peer(raw)``, remembered (a bounded dict, started over when full)."""
    host = _PEER_HOSTS.get(raw)
    if host is None:
        host = normalise_peer(raw)
        if len(_PEER_HOSTS) >= _PEER_HOSTS_MAX:
            _PEER_HOSTS.clear()
        _PEER_HOSTS[raw] = host
    return host


class ClientProtocol(asyncio.Protocol):
    """The client leg. Owns the :class:`ProxyConnection` and drives the broker leg."""

    __slots__ = (
        "daemon", "listener", "transport", "broker", "conn", "timer", "counted",
        "closed", "conn_id", "_connect_task", "client_eof", "broker_eof", "_paused",
        "_connect_timed_out", "_held", "_budget_paused",
    )

    def __init__(self, daemon: Daemon, listener: str) -> None:
        """Create the protocol for one accepted transport on ``listener`` (``HOST:PORT``)."""
        self.daemon = daemon
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.broker: BrokerProtocol | None = None
        self.conn: ProxyConnection | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.closed = False
        self.conn_id = ""
        self._connect_task: asyncio.Task[None] | None = None
        self.client_eof = False
        self.broker_eof = False
        self._paused = False
        self._connect_timed_out = False
        self._held = 0  # bytes last reported to the pre-authentication budget
        self._budget_paused = False

    # --- asyncio callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Global maxConnections at accept, before any byte (QDR stage 0)."""
        self.transport = transport  # type: ignore[assignment]
        daemon = self.daemon
        self.conn_id = daemon.next_conn_id()
        peer = transport.get_extra_info("peername")
        host = _peer_host(peer[0]) if peer else ""
        now = daemon.loop.time()
        if daemon.draining or not daemon.ledger.try_accept():
            # the socket is closed without a byte written and no upstream connection made
            transport.close()
            self.closed = True
            daemon.emit(ConnectionDenied(
                conn_id=self.conn_id, at=now, remote_host=host, listener=self.listener,
                reason=ConnectionDenyReason.GLOBAL_LIMIT,
            ))
            return
        if not daemon.preauth.accept():
            # the connections not yet admitted hold the whole pre-authentication budget
            daemon.ledger.release_accept()
            transport.close()
            self.closed = True
            daemon.emit(ConnectionDenied(
                conn_id=self.conn_id, at=now, remote_host=host, listener=self.listener,
                reason=ConnectionDenyReason.PREAUTH_MEMORY,
            ))
            return
        self.counted = True
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self.conn = ProxyConnection(
            self.conn_id, remote_host=host, listener=self.listener,
            policy=daemon.policy, ledger=daemon.ledger, now=now,
            handshake_timeout=daemon.config.handshake_seconds,
            tls_subject=peer_subject(transport), wall_offset=daemon.wall_offset,
        )
        daemon.connections[self.conn_id] = self
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        """Feed client bytes to the core (timing the call that makes the Open decision)."""
        conn = self.conn
        if conn is None:
            return
        if conn.opened_at is None and conn.phase is not Phase.DENIED:
            started = time.perf_counter()
            self._feed(conn, Side.CLIENT, data)
            decided = conn.opened_at is not None or conn.phase is Phase.DENIED
            if decided:
                self.daemon.observe_open_decision(time.perf_counter() - started)
            held = 0 if decided or self.closed else conn.held_bytes
            if held != self._held:
                self._held = held
                self.daemon.preauth.update(self, held, self.daemon.waiting_connections())
        else:
            self._feed(conn, Side.CLIENT, data)
        if (self.broker is None and self._connect_task is not None and not self._paused
                and conn.broker_backlog > CONNECT_BACKLOG and self.transport is not None):
            # the upstream is not there yet and the client keeps sending: stop reading it
            # until the connect ends, so its bytes cannot pile up at line rate
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        """Client half-closed.

        proton half-closes right after sending its Close: then the half-close is passed on to
        the broker and the client transport stays open for writing, so the router's answering
        Close still reaches the client. A client that half-closes without a Close (gone, or
        half-open) is closed at once.
        """
        self.client_eof = True
        broker = self.broker
        conn = self.conn
        if (broker is None or broker.transport is None or self.broker_eof or conn is None
                or not conn.close_received_from(Side.CLIENT)):
            return None  # nothing to wait for: close now
        if broker.transport.can_write_eof():
            broker.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """The client transport is gone: finish the connection exactly once."""
        self.closed = True
        daemon = self.daemon
        if self.counted:
            self.counted = False
            daemon.ledger.release_accept()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self._held:
            self._held = 0
            daemon.preauth.update(self, 0, ())
        conn = self.conn
        if conn is not None:
            self._run(conn.connection_lost, Side.CLIENT)
            daemon.connection_finished(self)
        if self.broker is not None and self.broker.transport is not None:
            self.broker.transport.close()

    def budget_pause(self) -> None:
        """Stop reading this client: the pre-authentication budget is exhausted."""
        if self.transport is not None and not self.closed and not self._budget_paused:
            self._budget_paused = True
            self.transport.pause_reading()

    def budget_resume(self) -> None:
        """The pre-authentication budget has room again: read this client again."""
        if not self._budget_paused:
            return
        self._budget_paused = False
        if (self.transport is not None and not self.closed and not self._paused
                and not self.transport.is_closing()):
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        """The client is not reading: stop reading from the broker."""
        if self.broker is not None and self.broker.transport is not None:
            self.broker.transport.pause_reading()

    def resume_writing(self) -> None:
        """The client drained its buffer: read from the broker again."""
        if self.broker is not None and self.broker.transport is not None:
            self.broker.transport.resume_reading()

    # --- command execution -----------------------------------------------------------------

    def _run(self, step: Callable[..., list[Any]], *args: Any) -> None:
        """Call ``step(*args, now)`` on the core and execute its commands (no closure per call)."""
        conn = self.conn
        assert conn is not None
        try:
            commands = step(*args, self.daemon.loop.time())
            self._execute(commands)
        except Exception:  # a proxy bug: contain it to this connection
            logger.exception("[%s] internal error; closing this connection", self.conn_id)
            self.daemon.internal_errors += 1
            if conn.close_reason is None:
                conn.close_reason = "internal_error"
            self._abort()
            return
        self._arm_timer()

    def _feed(self, conn: ProxyConnection, side: Side, data: bytes) -> None:
        """``_run`` for ``receive_data``, the per-read path (no closure per call)."""
        try:
            self._execute(conn.receive_data(side, data, self.daemon.loop.time()))
        except Exception:  # a proxy bug: contain it to this connection
            logger.exception("[%s] internal error; closing this connection", self.conn_id)
            self.daemon.internal_errors += 1
            if conn.close_reason is None:
                conn.close_reason = "internal_error"
            self._abort()
            return
        self._arm_timer()

    def _write(self, side: Side, chunks: list[bytes]) -> None:
        if side is Side.CLIENT:
            transport = self.transport if not self.closed else None
        else:
            broker = self.broker
            transport = broker.transport if broker is not None else None
        if transport is None:
            return
        if len(chunks) == 1:
            transport.write(chunks[0])
        else:
            transport.writelines(chunks)  # one writev under uvloop

    def _execute(self, commands: list[Any]) -> None:
        # Consecutive SendData for the same side go out in one write call.
        side: Side | None = None
        chunks: list[bytes] = []
        for cmd in commands:
            if type(cmd) is SendData:
                if cmd.side is side:
                    chunks.append(cmd.data)
                    continue
                if chunks:
                    self._write(side, chunks)  # type: ignore[arg-type]
                side, chunks = cmd.side, [cmd.data]
                continue
            if chunks:
                self._write(side, chunks)  # type: ignore[arg-type]
                side, chunks = None, []
            if type(cmd) is Emit:
                self.daemon.emit(cmd.event)
            elif type(cmd) is CloseTransport:
                if cmd.side is Side.CLIENT:
                    if self.transport is not None:
                        self.transport.close()
                else:
                    if self.broker is not None and self.broker.transport is not None:
                        self.broker.transport.close()
                    elif self._connect_task is not None and not self._connect_task.done():
                        self._connect_task.cancel()
            elif type(cmd) is ConnectBroker:
                # Until the upstream is up, whatever the client sends is queued in the core;
                # data_received stops reading the client when that queue passes
                # CONNECT_BACKLOG, and reading resumes once the connect ends.
                self._connect_task = self.daemon.loop.create_task(self._connect_upstream())
        if chunks:
            self._write(side, chunks)  # type: ignore[arg-type]

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        if self.broker is not None and self.broker.transport is not None:
            self.broker.transport.abort()

    def _arm_timer(self) -> None:
        conn = self.conn
        if conn is None or self.closed:
            return
        deadline = conn.get_timer()
        if self.timer is not None:
            if deadline is not None and self.timer.when() == deadline:
                return
            self.timer.cancel()
            self.timer = None
        if deadline is not None:
            self.timer = self.daemon.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        conn = self.conn
        if conn is not None and not self.closed:
            self._run(conn.handle_timer)

    async def _connect_upstream(self) -> None:
        daemon = self.daemon
        loop = daemon.loop
        for upstream in daemon.upstream_health.order(daemon.config.upstreams, loop.time()):
            if self.closed:
                return
            ctx: ssl.SSLContext | None = daemon.upstream_ssl_context(upstream)
            # A plain timer that cancels this task (no wait_for task, no asyncio.timeout
            # context per attempt): the cancellation is ours when _connect_timed_out is set.
            self._connect_timed_out = False
            deadline = loop.call_later(daemon.config.connect_timeout_seconds,
                                       self._connect_timeout)
            try:
                _, proto = await loop.create_connection(
                    lambda: BrokerProtocol(self), upstream.address.host,
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
                proto.transport.close()  # type: ignore[union-attr]
                return
            daemon.upstream_health.succeeded(upstream)
            self.broker = proto  # type: ignore[assignment]
            conn = self.conn
            assert conn is not None
            self._run(conn.broker_connected)
            self._resume_client()
            return
        conn = self.conn
        if conn is not None and not self.closed:
            self._run(conn.broker_connect_failed)
            self._resume_client()

    def _upstream_failed(self, upstream: Any, exc: BaseException) -> None:
        daemon = self.daemon
        backoff = daemon.upstream_health.failed(upstream, daemon.loop.time())
        logger.warning("[%s] upstream %s failed: %s (tried last for the next %.0f s)",
                       self.conn_id, upstream.address, exc, backoff)
        self.daemon.emit(UpstreamConnectFailed(
            conn_id=self.conn_id, at=self.daemon.loop.time(), remote_host="",
            listener=self.listener, upstream=str(upstream.address),
        ))

    def _connect_timeout(self) -> None:
        task = self._connect_task
        if task is not None and not task.done():
            self._connect_timed_out = True
            task.cancel()

    def _resume_client(self) -> None:
        if not self._paused:
            return
        self._paused = False
        if (self.transport is not None and not self.closed and not self._budget_paused
                and not self.transport.is_closing()):
            self.transport.resume_reading()


class BrokerProtocol(asyncio.Protocol):
    """The upstream leg; feeds broker bytes into its client's :class:`ProxyConnection`."""

    __slots__ = ("client", "transport")

    def __init__(self, client: ClientProtocol) -> None:
        """Create the leg for ``client``."""
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Record the transport and apply the write-buffer limits."""
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)

    def data_received(self, data: bytes) -> None:
        """Feed broker bytes to the core."""
        client = self.client
        conn = client.conn
        if conn is None or client.closed:
            return
        client._feed(conn, Side.BROKER, data)

    def eof_received(self) -> bool | None:
        """Broker half-closed: after its Close, pass the half-close on; else it is gone.

        A router that stops without a Close (killed, crashed) is handled as a lost upstream:
        the transport closes and the client gets ``amqp:connection:forced``.
        """
        client = self.client
        client.broker_eof = True
        conn = client.conn
        transport = client.transport
        if (conn is None or not conn.close_received_from(Side.BROKER) or client.client_eof
                or transport is None or client.closed):
            return None
        if transport.can_write_eof():
            transport.write_eof()
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """The broker transport is gone."""
        client = self.client
        conn = client.conn
        if conn is not None and not client.closed:
            client._run(conn.connection_lost, Side.BROKER)

    def pause_writing(self) -> None:
        """The broker is not reading: stop reading from the client."""
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        """The broker drained: read from the client again."""
        if self.client.transport is not None and not self.client.closed:
            self.client.transport.resume_reading()
