"""Sans-IO. The connection ledger: global socket count and per-vhost/user/host counts.

QDR's stage 0 (``qd_policy_socket_accept``: the global ``maxConnections`` at TCP accept) and
QDR's ``PolicyAppConnectionMgr.can_connect`` (vhost, per-user and per-host counts at Open).

Plain Python, O(1) per operation, used only on the event-loop thread. The metrics thread reads
:meth:`ConnectionLedger.snapshot`, an immutable copy. Memory matters (tens of thousands of idle
connections): one small tuple per connection; per-user and per-host entries are deleted when
they drop to zero (QDR left empty lists behind).

Differences from QDR, on purpose (docs/qdr-compatibility.md): the limits checked are those of
the vhost and group objects passed in (the snapshot the connection is admitted under), so a
reload never swaps the per-user and per-host limits; counts are keyed by vhost *name* and so
carry over across reloads exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amqp_policy_proxy.policy.reasons import ConnectionDenyReason

if TYPE_CHECKING:
    from amqp_policy_proxy.policy.model import GroupSettings, VhostPolicy

VHOST_LIMIT = ConnectionDenyReason.VHOST_LIMIT
USER_LIMIT = ConnectionDenyReason.USER_LIMIT
HOST_LIMIT = ConnectionDenyReason.HOST_LIMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerSnapshot:
    """An immutable copy of the ledger's counts, safe to read from another thread."""

    global_current: int
    """Transports counted at stage 0 (accepted and not yet released)."""
    global_denied: int
    """Transports refused at stage 0 since start."""
    active: tuple[tuple[tuple[str, str], int], ...]
    """``((vhost, group), n)`` for every (vhost, group) with admitted connections, sorted."""


class ConnectionLedger:
    """Counts connections and admits them against QDR's limits."""

    __slots__ = ("max_connections", "_current", "_denied", "_records", "_vhost", "_user",
                 "_host", "_group")

    def __init__(self, max_connections: int) -> None:
        """Create an empty ledger.

        Args:
            max_connections: the global limit (QDR ``policy.maxConnections``); 0 refuses every
                transport. Settable later (``ledger.max_connections = n``) on reload.
        """
        self.max_connections = max_connections
        """Global transport limit; lowering it never closes counted transports."""
        self._current = 0
        self._denied = 0
        # conn_id -> (vhost, group, user, host)
        self._records: dict[str, tuple[str, str, str, str]] = {}
        self._vhost: dict[str, int] = {}
        self._user: dict[tuple[str, str], int] = {}
        self._host: dict[tuple[str, str], int] = {}
        self._group: dict[tuple[str, str], int] = {}

    # -------------------------------------------------------------- stage 0 (TCP accept)

    def try_accept(self) -> bool:
        """Count a new transport if the global limit allows it (QDR ``qd_policy_socket_accept``).

        Returns:
            True when ``current < max_connections`` (the transport is now counted); False
            otherwise (a global denial is counted; the caller closes the socket silently).
        """
        if self._current < self.max_connections:
            self._current += 1
            return True
        self._denied += 1
        return False

    def release_accept(self) -> None:
        """Uncount a transport counted by :meth:`try_accept` (never goes below zero)."""
        if self._current > 0:
            self._current -= 1

    # -------------------------------------------------------------- Open (vhost counts)

    def try_admit(
        self,
        conn_id: str,
        *,
        vhost: VhostPolicy,
        group: GroupSettings,
        user: str,
        remote_host: str,
        enforce: bool = True,
    ) -> ConnectionDenyReason | None:
        """Admit an approved Open against the vhost, per-user and per-host limits.

        Per-user limit: ``group.max_connections_per_user``, else the vhost's; per-host
        likewise. ``n_user`` counts all of the user's connections in the vhost whatever their
        group; ``n_host`` counts the vhost's connections from that IP string. A limit of 0
        denies every connection (as QDR's ``can_connect``).

        Args:
            conn_id: unique connection id; recorded on success.
            vhost: the vhost the connection resolved to (its limits are used).
            group: the user's group (its limits override the vhost's).
            user: the authenticated user name.
            remote_host: the client's normalised IP.
            enforce: False in shadow mode: the connection is counted even over a limit (it
                is admitted; later connections see the true counts) and the reason is still
                returned.

        Returns:
            None when within every limit, else the first failed reason in QDR's order:
            ``"vhost_limit"``, ``"user_limit"``, ``"host_limit"`` (with ``enforce``, nothing
            is then counted).

        Raises:
            ValueError: ``conn_id`` is already admitted (a caller bug, not a denial).
        """
        if conn_id in self._records:
            raise ValueError(f"connection {conn_id!r} is already admitted")
        vname = vhost.hostname
        per_vhost, per_user, per_host = connection_limits(vhost, group)
        user_key = (vname, user)
        host_key = (vname, remote_host)
        reason = None
        if self._vhost.get(vname, 0) >= per_vhost:
            reason = VHOST_LIMIT
        elif self._user.get(user_key, 0) >= per_user:
            reason = USER_LIMIT
        elif self._host.get(host_key, 0) >= per_host:
            reason = HOST_LIMIT
        if reason is not None and enforce:
            return reason
        self._count(conn_id, vname, group.name, user, remote_host)
        return reason

    def record(self, conn_id: str, *, vhost: str, group: str, user: str, remote_host: str) -> None:
        """Count a connection another authority admitted (the fleet ledger's store), without
        checking any limit.

        Raises:
            ValueError: ``conn_id`` is already admitted (a caller bug).
        """
        if conn_id in self._records:
            raise ValueError(f"connection {conn_id!r} is already admitted")
        self._count(conn_id, vhost, group, user, remote_host)

    def _count(self, conn_id: str, vname: str, gname: str, user: str, remote_host: str) -> None:
        user_key = (vname, user)
        host_key = (vname, remote_host)
        self._records[conn_id] = (vname, gname, user, remote_host)
        self._vhost[vname] = self._vhost.get(vname, 0) + 1
        self._user[user_key] = self._user.get(user_key, 0) + 1
        self._host[host_key] = self._host.get(host_key, 0) + 1
        group_key = (vname, gname)
        self._group[group_key] = self._group.get(group_key, 0) + 1

    def release(self, conn_id: str) -> bool:
        """Uncount an admitted connection, exactly once.

        Args:
            conn_id: the id given to :meth:`try_admit`.

        Returns:
            True when the connection was admitted and is now released; False when it was never
            admitted or was already released (nothing changes).
        """
        record = self._records.pop(conn_id, None)
        if record is None:
            return False
        vname, gname, user, host = record
        _decrement(self._vhost, vname)
        _decrement(self._user, (vname, user))
        _decrement(self._host, (vname, host))
        _decrement(self._group, (vname, gname))
        return True

    def record_of(self, conn_id: str) -> tuple[str, str, str, str] | None:
        """``(vhost, group, user, remote_host)`` of an admitted connection, or None."""
        return self._records.get(conn_id)

    def scope_counts(self) -> dict[str, tuple[int, dict[str, int], dict[str, int]]]:
        """This process's counts per vhost: ``vhost -> (n, {user: n}, {host: n})`` (what the
        fleet ledger rewrites into the shared store)."""
        out: dict[str, tuple[int, dict[str, int], dict[str, int]]] = {
            v: (n, {}, {}) for v, n in self._vhost.items()}
        for (v, user), n in self._user.items():
            out[v][1][user] = n
        for (v, host), n in self._host.items():
            out[v][2][host] = n
        return out

    # -------------------------------------------------------------- queries

    def active(self) -> int:
        """Admitted connections, all vhosts."""
        return len(self._records)

    def global_current(self) -> int:
        """Transports counted at stage 0."""
        return self._current

    def global_denied(self) -> int:
        """Transports refused at stage 0 since start."""
        return self._denied

    def vhost_active(self, vhost: str) -> int:
        """Admitted connections to ``vhost``."""
        return self._vhost.get(vhost, 0)

    def user_active(self, vhost: str, user: str) -> int:
        """Admitted connections of ``user`` to ``vhost`` (all groups)."""
        return self._user.get((vhost, user), 0)

    def host_active(self, vhost: str, host: str) -> int:
        """Admitted connections to ``vhost`` from the IP string ``host``."""
        return self._host.get((vhost, host), 0)

    def group_active(self, vhost: str, group: str) -> int:
        """Admitted connections counted under ``group`` of ``vhost``."""
        return self._group.get((vhost, group), 0)

    def is_admitted(self, conn_id: str) -> bool:
        """True while ``conn_id`` is admitted and not released."""
        return conn_id in self._records

    def snapshot(self) -> LedgerSnapshot:
        """An immutable copy of the counts (for the metrics gauge on another thread)."""
        return LedgerSnapshot(
            global_current=self._current,
            global_denied=self._denied,
            active=tuple(sorted(self._group.items())),
        )


def connection_limits(vhost: VhostPolicy, group: GroupSettings) -> tuple[int, int, int]:
    """The limits an Open is counted against: ``(maxConnections of the vhost,
    maxConnectionsPerUser, maxConnectionsPerHost)``, the group's per-user and per-host values
    overriding the vhost's (QDR ``PolicyAppConnectionMgr.can_connect``)."""
    per_user = group.max_connections_per_user
    if per_user is None:
        per_user = vhost.max_connections_per_user
    per_host = group.max_connections_per_host
    if per_host is None:
        per_host = vhost.max_connections_per_host
    return vhost.max_connections, per_user, per_host


def _decrement(counts: dict[Any, int], key: Any) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
