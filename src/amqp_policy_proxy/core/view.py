"""Sans-IO. What the shell may read of a connection: its figures and a read-only view.

The daemon never reaches into the core's components: it reads :class:`ConnectionView` (for
metrics, logs, the admin interface) and feeds the connection through its public inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import ProxyConnection
    from .state import ClientState, RouterState


class Figures:
    """Counters of one connection (for the event log's ``connection_closed`` and metrics)."""

    __slots__ = ("bytes_in", "bytes_out", "transfers_in", "transfers_out", "active_sessions",
                 "active_senders", "active_receivers", "peak_sessions", "peak_senders",
                 "peak_receivers")

    def __init__(self) -> None:
        """All zero."""
        self.bytes_in = 0
        """Bytes received from the client (client to router), frames included."""
        self.bytes_out = 0
        """Bytes received from the router (router to client)."""
        self.transfers_in = 0
        """Transfer frames received from the client."""
        self.transfers_out = 0
        """Transfer frames received from the router."""
        self.active_sessions = 0
        self.active_senders = 0
        """Client sender links attached now."""
        self.active_receivers = 0
        self.peak_sessions = 0
        self.peak_senders = 0
        self.peak_receivers = 0


class ConnectionView:
    """A read-only view of one connection, for the shell."""

    __slots__ = ("_conn",)

    def __init__(self, conn: ProxyConnection) -> None:
        """View ``conn``."""
        self._conn = conn

    @property
    def conn_id(self) -> str:
        """The connection's id."""
        return self._conn.conn_id

    @property
    def client_state(self) -> ClientState:
        """The client leg's state."""
        return self._conn.sides.client

    @property
    def router_state(self) -> RouterState:
        """The router leg's state."""
        return self._conn.sides.router

    @property
    def decided(self) -> bool:
        """The client's Open was decided (admitted or refused), or will never be."""
        conn = self._conn
        return conn.opened_at is not None or conn.handshake_deadline is None

    @property
    def admitted(self) -> bool:
        """The Open was approved (frames are relayed)."""
        return self._conn.opened_at is not None

    @property
    def opened_at(self) -> float | None:
        """Loop-clock seconds of the approval, or None."""
        return self._conn.opened_at

    @property
    def user(self) -> str | None:
        """The authenticated user (None before the Open decision)."""
        return self._conn.user

    @property
    def vhost(self) -> str | None:
        """The resolved vhost's name, or None."""
        return self._conn.vhost_name

    @property
    def group(self) -> str | None:
        """The user group's name, or None."""
        group = self._conn.group
        return None if group is None else group.name

    @property
    def remote_host(self) -> str:
        """The client's address."""
        return self._conn.remote_host

    @property
    def listener(self) -> str:
        """The listener the client connected to (``HOST:PORT``)."""
        return self._conn.listener

    @property
    def figures(self) -> Figures:
        """The connection's counters (live: read, never change)."""
        return self._conn.figures

    @property
    def held_bytes(self) -> int:
        """Bytes the connection holds in its buffers (partial frames, pipelined frames,
        bytes waiting for the upstream connection)."""
        conn = self._conn
        return (len(conn.client.buf) + len(conn.router.buf) + len(conn.client.held)
                + sum(map(len, conn.router.held)) + conn.wire.router_backlog)

    @property
    def router_backlog(self) -> int:
        """Bytes queued for the router while its connection is being made."""
        return self._conn.wire.router_backlog

    @property
    def close_reason(self) -> str | None:
        """Why the connection ended (or is ending), once known."""
        return self._conn.close_reason

    @property
    def finished(self) -> bool:
        """The connection is over and its counts are released."""
        return self._conn.finished
