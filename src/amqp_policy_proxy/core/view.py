"""Sans-IO. What the shell may read of a connection: a read-only view.

The daemon never reaches into the core's components: it reads :class:`ConnectionView` (for
metrics, logs, the admin interface) and feeds the connection through its public inputs.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Protocol

from .context import Context
from .records import Figures
from .state import ClientState


def _fact(name: str, doc: str) -> property:
    """A read-only property of the view: the connection's attribute ``name`` as it is now."""
    return property(attrgetter(f"_conn.{name}"), doc=doc)


class _Leg(Protocol):
    """A leg's receive buffer and the frames it holds before the Open decision."""

    buf: bytearray
    held: Any


class ConnectionView:
    """A read-only view of one connection, for the shell."""

    __slots__ = ("_conn", "_client", "_router")

    def __init__(self, conn: Context, client: _Leg, router: _Leg) -> None:
        """View the connection ``conn`` (its shared context) and its two legs."""
        self._conn = conn
        self._client = client
        self._router = router

    conn_id = _fact("conn_id", "The connection's id.")

    @property
    def client_state(self) -> ClientState:
        """The client leg's state."""
        return self._conn.sides.client

    @property
    def decided(self) -> bool:
        """The client's Open was decided (admitted or refused), or will never be."""
        conn = self._conn
        return conn.opened_at is not None or conn.handshake_deadline is None

    @property
    def admitted(self) -> bool:
        """The Open was approved (frames are relayed)."""
        return self._conn.opened_at is not None

    opened_at = _fact("opened_at", "Loop-clock seconds of the approval, or None.")

    user = _fact("user", "The authenticated user (None before the Open decision).")

    @property
    def vhost(self) -> str | None:
        """The resolved vhost's name, or None."""
        return self._conn.vhost_name

    @property
    def group(self) -> str | None:
        """The user group's name, or None."""
        group = self._conn.group
        return None if group is None else group.name

    remote_host = _fact("remote_host", "The client's address.")

    listener = _fact("listener", "The listener the client connected to (``HOST:PORT``).")

    tls_subject = _fact(
        "tls_subject",
        "RFC 4514 subject of the client certificate the proxy verified, else None.",
    )

    accepted_at = _fact("accepted_at", "Loop-clock seconds of the TCP accept.")

    @property
    def enforcement(self) -> str | None:
        """``enforce`` or ``shadow`` for an admitted connection under a group (the group's,
        resolved group -> vhost), else None."""
        group = self._conn.group
        return None if group is None else str(group.enforcement)

    @property
    def figures(self) -> Figures:
        """The connection's counters (live: read, never change)."""
        return self._conn.figures

    @property
    def held_bytes(self) -> int:
        """Bytes the connection holds in its buffers (partial frames, pipelined frames,
        bytes waiting for the upstream connection)."""
        client, router = self._client, self._router
        return (
            len(client.buf)
            + len(router.buf)
            + len(client.held)
            + sum(map(len, router.held))
            + self._conn.wire.router_backlog
        )

    @property
    def router_backlog(self) -> int:
        """Bytes queued for the router while its connection is being made."""
        return self._conn.wire.router_backlog

    close_reason = _fact("close_reason", "Why the connection ended (or is ending), once known.")

    @property
    def token_waiting(self) -> bool:
        """Its token names a ``kid`` the JWKS lacks and it waits for the fetch that asked for
        (the shell calls ``ProxyConnection.keys_changed`` once the fetch is over)."""
        return self._conn.token_wait is not None

    @property
    def token_expires_at(self) -> float | None:
        """Wall-clock seconds of the token's ``exp`` (token connections), else None."""
        token = self._conn.token
        return None if token is None else token.identity.expires_at

    finished = _fact("finished", "The connection is over and its counts are released.")
