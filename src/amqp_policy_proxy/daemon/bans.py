"""Daemon layer. Bans and automatic quarantine in one running proxy (docs/operations.md,
"Bans"; docs/policy.md, "Quarantine").

:class:`BanService` owns the process's :class:`~..limits.bans.BanList`, which every Open
decision reads (``core.admission``: reason ``banned``), and:

* puts an operator's ban in force at once (``amqp-policy-proxy ban``): the user's name is
  canonicalised as the upstream records it (:meth:`~..policy.naming.Naming.identity`, always
  trimming, so a padded name cannot dodge it), a host is an address or CIDR network in its
  canonical text; the connections it covers are closed at once with Close
  ``amqp:connection:forced`` and the ban's reason (close reason ``banned``): the same Close as
  ``connections close`` and the drain, so that every client library treats it as a closed
  connection and reconnects, and the reconnect is then refused at its Open with QDR's
  denial (``amqp:resource-limit-exceeded``, reason ``banned``);
* lifts it (``unban``), and lets it expire on its own (one loop timer at the next expiry);
* with a ``[ledger]``, shares the list with every proxy and worker through the store
  (:mod:`..fleet.bans`): a change is written at once and the others read the store's version
  every :data:`POLL_SECONDS`, so a ban reaches every process within a second; the list
  outlives a proxy's restart (it is read at start). While the store is unreachable, changes
  apply here and are written when it is back;
* counts the denials the core emits (:meth:`observe`) per vhost with a ``quarantine`` key and
  bans the user (or the client address, for a denial without a user) that reaches the
  threshold, for ``banSeconds`` (:class:`~..limits.quarantine.DenialCounter`);
* records every change in the audit trail (``admin_action``: ``ban``, ``unban``,
  ``ban_expired``, ``quarantine``) and logs it.

Which denials count towards a quarantine: connection denials at the Open and during SASL
(except those that are not the client's doing: :data:`NOT_COUNTED`), session, link and
message denials. Shadow-mode denials (``SHADOW DENY``) do not count. A denial without a vhost
(refused before its Open named one) counts in the default vhost's quarantine.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ..core.events import (
    AdminAction,
    ConnectionDenied,
    LinkDenied,
    MessageDenied,
    SessionDenied,
)
from ..core.state import ClientState
from ..ingress.peer import normalise_peer
from ..limits.bans import HOST, KINDS, OPERATOR, QUARANTINE, USER, Ban, BanList
from ..limits.quarantine import DenialCounter
from ..policy.lookup import lookup_vhost
from ..policy.naming import Naming
from ..policy.reasons import ConnectionDenyReason

logger = logging.getLogger(__name__)

__all__ = ["NOT_COUNTED", "POLL_SECONDS", "BanError", "BanHost", "BanService",
           "parse_duration"]

#: Seconds between two reads of the fleet store's version (a ban reaches every process well
#: within a second).
POLL_SECONDS = 0.2
#: Seconds a write to the store may take before it is left to the retry.
STORE_TIMEOUT = 2.0
#: Longest ban an operator may give, seconds (10 years; no ``--for``: until lifted).
MAX_BAN_SECONDS = 10 * 365 * 86400.0
#: Longest reason accepted (it goes into the clients' Close and the event log).
MAX_REASON_LENGTH = 1024
#: Connection denials that are not the client's doing: never counted towards a quarantine.
NOT_COUNTED = frozenset({
    ConnectionDenyReason.BANNED, ConnectionDenyReason.UPSTREAM_UNAVAILABLE,
    ConnectionDenyReason.LEDGER_UNAVAILABLE, ConnectionDenyReason.GLOBAL_LIMIT,
    ConnectionDenyReason.GLOBAL_RATE, ConnectionDenyReason.PREAUTH_MEMORY,
    ConnectionDenyReason.VHOST_PAUSED,
})
_COUNTED_EVENTS = (ConnectionDenied, SessionDenied, LinkDenied, MessageDenied)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class BanError(Exception):
    """A ban request the operator must fix (the message says what)."""


def parse_duration(text: Any) -> float:
    """Seconds of a ``--for`` duration: a number of seconds, or numbers with units ``s``,
    ``m``, ``h``, ``d``, ``w`` run together (``90s``, ``15m``, ``1h30m``, ``7d``).

    Raises:
        BanError: anything else, zero, or more than :data:`MAX_BAN_SECONDS`.
    """
    if isinstance(text, bool):
        raise BanError("a duration is a number of seconds or e.g. 90s, 15m, 1h30m, 7d")
    if isinstance(text, int | float):
        seconds = float(text)
    elif isinstance(text, str):
        raw = text.strip().lower()
        seconds = 0.0
        number = ""
        try:
            if raw and all(c.isdigit() or c == "." for c in raw):
                seconds = float(raw)
            else:
                for ch in raw:
                    if ch.isdigit() or ch == ".":
                        number += ch
                    elif ch in _UNITS and number:
                        seconds += float(number) * _UNITS[ch]
                        number = ""
                    else:
                        raise ValueError(ch)
                if number or not raw:
                    raise ValueError(raw)
        except ValueError:
            raise BanError(f"'{text}' is not a duration (a number of seconds, or e.g. 90s, "
                           "15m, 1h30m, 7d)") from None
    else:
        raise BanError("a duration is a number of seconds or e.g. 90s, 15m, 1h30m, 7d")
    if not 0 < seconds <= MAX_BAN_SECONDS:
        raise BanError(f"a ban lasts more than 0 s and at most {MAX_BAN_SECONDS:.0f} s "
                       "(10 years); without a duration it lasts until lifted")
    return seconds


class BanHost(Protocol):
    """What the ban service needs from the daemon (:class:`~.app.Daemon`)."""

    @property
    def connections(self) -> Mapping[str, Any]:
        """conn_id -> the relay's ``ClientProtocol``."""

    loop: Any
    policy: Any

    @property
    def wall_offset(self) -> float:
        """POSIX seconds minus loop-clock seconds."""

    def emit(self, event: Any) -> None:
        """Fan an event out (metrics, event log)."""


class BanService:
    """The bans of one proxy process (see the module docstring).

    Args:
        host: the daemon.
        naming: how the upstreams record identities (a user ban is canonicalised with it).
        store: the fleet's list (:class:`~..fleet.bans.BanStore`) with a ``[ledger]``, else
            None (the bans are this process's only and end with it).
    """

    def __init__(self, host: BanHost, naming: Naming, store: Any = None) -> None:
        self.host = host
        self.table = BanList()
        """The list every Open decision reads (give it to each connection)."""
        self.naming = Naming(naming.kind, identity_mode="canonical", realm=naming.realm)
        self.store = store
        self.counter = DenialCounter()
        self._version: int | None = None
        self._pending: dict[tuple[str, str], Ban | None] = {}
        """Changes made while the store was unreachable, by key (None: a lift)."""
        self._store_down = False
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._quarantine_policy: Any = None
        self._quarantine_any = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self, ledger_url: str | None = None) -> None:
        """Read the fleet's list (with a store) and start following it. Never fails on the
        store: unreachable, this process starts with no ban and keeps trying.

        Args:
            ledger_url: ``[ledger] url``: the fleet's ban list lives in that store
                (:class:`~..fleet.bans.BanStore`), so that a restarted proxy refuses what the
                fleet bans from its first Open; None: this process's own list only.
        """
        if ledger_url is not None:
            from ..fleet.bans import BanStore

            self.store = BanStore(ledger_url)
        if self.store is None:
            return
        try:
            async with self._lock:
                await asyncio.wait_for(self._load(), STORE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - unreachable: retried by the poll
            self._went_down(exc)
        else:
            n = len(self.table)
            if n:
                logger.info("bans: %d ban%s in force from the fleet's list", n,
                            "" if n == 1 else "s")
        self._task = self.host.loop.create_task(self._poll())

    async def stop(self) -> None:
        """Stop following the store and close its client."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:  # noqa: BLE001 - cancelled
                pass
            self._task = None
        if self.store is not None:
            await self.store.close()

    # ------------------------------------------------------------------ operator

    def canonical(self, kind: Any, value: Any) -> tuple[str, str]:
        """``(kind, canonical value)`` of a ban request.

        Raises:
            BanError: an unknown kind, a user name the upstream would refuse (empty, a
                control character), or not an address or CIDR network.
        """
        if kind not in KINDS:
            raise BanError("give exactly one of user, host")
        if not isinstance(value, str):
            raise BanError(f"{kind} must be a string")
        if kind == USER:
            name = self.naming.identity(value)
            if name is None:
                raise BanError(f"'{value}' is not a user name the upstream would accept "
                               "(empty, or a control character)")
            return USER, name
        try:
            return HOST, BanList.canonical(HOST, value)
        except ValueError as exc:
            raise BanError(str(exc)) from None

    async def ban(self, kind: Any, value: Any, seconds: float | None, reason: str,
                  by: str) -> dict[str, Any]:
        """Put an operator's ban in force (replacing one of the same key) and close the
        connections it covers.

        Args:
            kind: ``user`` or ``host``.
            value: the user name or the address / CIDR network, as the operator wrote it.
            seconds: how long it lasts; None: until lifted.
            reason: the operator's words.
            by: who asked (the admin client).

        Returns:
            The ban as :meth:`describe` shows it, plus ``closed`` (connection ids),
            ``replaced`` (a ban of this key was in force) and ``stored`` (written to the
            fleet's store; null without one).

        Raises:
            BanError: see :meth:`canonical`.
        """
        kind, value = self.canonical(kind, value)
        now = self.host.loop.time()
        ban = Ban(kind, value, reason, created_at=now,
                  expires_at=None if seconds is None else now + seconds, source=OPERATOR,
                  by=by)
        async with self._lock:
            previous = self.table.get(kind, value)
            closed = self._apply(ban)
            stored = await self._write(ban)
        replaced = previous is not None and previous.active(now)
        return {**self.describe(ban), "closed": closed, "replaced": replaced,
                "stored": stored}

    async def unban(self, kind: Any, value: Any) -> dict[str, Any]:
        """Lift a ban (an operator's or a quarantine's).

        Returns:
            ``{"kind", "value", "lifted": bool, "stored": bool | None}``.

        Raises:
            BanError: see :meth:`canonical`.
        """
        kind, value = self.canonical(kind, value)
        now = self.host.loop.time()
        async with self._lock:
            gone = self.table.remove(kind, value)
            self._arm_expiry()
            stored = await self._write_lift(kind, value)
        return {"kind": kind, "value": value, "stored": stored,
                "lifted": gone is not None and gone.active(now)}

    def bans(self) -> list[dict[str, Any]]:
        """The bans in force, users first (:meth:`describe` each)."""
        return [self.describe(b) for b in self.table.active(self.host.loop.time())]

    def describe(self, ban: Ban) -> dict[str, Any]:
        """A ban as the admin API shows it: ``kind``, ``value``, ``reason``, ``source``
        (``operator`` or ``quarantine``), ``by``, ``created_at``, ``expires_at`` (UTC RFC
        3339, null: until lifted) and ``expires_in_seconds``."""
        from ..eventlog.records import format_ts  # (control.py imports this module)

        offset = self.host.wall_offset
        now = self.host.loop.time()
        return {"kind": ban.kind, "value": ban.value, "reason": ban.reason,
                "source": ban.source, "by": ban.by,
                "created_at": format_ts(ban.created_at + offset),
                "expires_at": (None if ban.expires_at is None
                               else format_ts(ban.expires_at + offset)),
                "expires_in_seconds": None if ban.expires_at is None else round(
                    max(0.0, ban.expires_at - now), 3)}

    def counts(self) -> dict[str, int]:
        """Bans in force per kind (``amqp_proxy_bans_active{kind}``)."""
        return self.table.counts(self.host.loop.time())

    # ------------------------------------------------------------------ quarantine

    def observe(self, event: Any) -> None:
        """Count one event towards the quarantines (called with every event the daemon fans
        out; anything but a counted denial in a vhost with ``quarantine`` costs one check)."""
        if not isinstance(event, _COUNTED_EVENTS):
            return
        policy = self.host.policy
        if policy is not self._quarantine_policy:
            self._quarantine_policy = policy
            self._quarantine_any = policy is not None and any(
                v.quarantine is not None for v in policy.vhosts.values())
        if not self._quarantine_any:
            return
        if isinstance(event, ConnectionDenied) and event.reason in NOT_COUNTED:
            return
        vhost = policy.vhosts.get(event.vhost) if event.vhost is not None else \
            lookup_vhost(policy, None)
        if vhost is None or vhost.quarantine is None:
            return
        q = vhost.quarantine
        if event.user is not None:
            kind, value = USER, event.user
        elif event.remote_host:
            kind, value = HOST, normalise_peer(event.remote_host)
        else:
            return
        now = self.host.loop.time()
        if self.counter.record((vhost.hostname, kind, value), q.denials, q.within_seconds,
                               now):
            # not inside the fan-out: the event may come from a connection's own commands
            self.host.loop.call_soon(self._quarantine, vhost.hostname, kind, value, q)

    def _quarantine(self, vhost: str, kind: str, value: str, q: Any) -> None:
        """Ban ``(kind, value)`` for ``q.ban_seconds``: it reached ``q.denials`` denials
        within ``q.within_seconds`` in ``vhost``."""
        now = self.host.loop.time()
        current = self.table.get(kind, value)
        if current is not None and current.active(now):
            return  # banned already (perhaps for longer)
        if kind == HOST:
            try:
                value = BanList.canonical(HOST, value)
            except ValueError:
                return  # not an IP address (a unix socket peer): nothing to ban
        reason = (f"quarantined: {q.denials} denial{'' if q.denials == 1 else 's'} within "
                  f"{q.within_seconds:g} s in vhost '{vhost}'")
        ban = Ban(kind, value, reason, created_at=now, expires_at=now + q.ban_seconds,
                  source=QUARANTINE, by=f"quarantine of vhost {vhost}")
        closed = self._apply(ban)
        who = f"user '{value}'" if kind == USER else f"host {value}"
        logger.warning("quarantine: %s banned for %g s (%s); %d connection%s closed", who,
                       q.ban_seconds, reason, len(closed), "" if len(closed) == 1 else "s",
                       extra={"event": "quarantine", "vhost": vhost, "kind": kind})
        self._audit("quarantine", ban, closed, peer="quarantine", vhost=vhost)
        if self.store is not None:
            self.host.loop.create_task(self._write_locked(ban))

    async def _write_locked(self, ban: Ban) -> None:
        async with self._lock:
            await self._write(ban)

    # ------------------------------------------------------------------ applying

    def _apply(self, ban: Ban) -> list[str]:
        """Put ``ban`` in force here and close what it covers; the ids closed."""
        self.table.add(ban)
        self._arm_expiry()
        return self._close_covered(ban)

    def _close_covered(self, ban: Ban) -> list[str]:
        """Close the connections ``ban`` covers: admitted ones get Close
        ``amqp:connection:forced`` with the reason; one whose Open waits for the ledger
        (``deciding``, its user known) is closed at once. Others are refused at their Open."""
        only = BanList()
        only.add(ban)
        now = self.host.loop.time()
        description = (ban.reason if ban.source == QUARANTINE
                       else f"banned by an operator: {ban.reason}")
        closed = []
        for proto in list(self.host.connections.values()):
            conn = proto.conn
            if conn is None or proto.closed:
                continue
            view = conn.view
            if view.finished or view.client_state not in (ClientState.OPENED,
                                                          ClientState.DECIDING):
                continue
            if only.match(view.user, view.remote_host, now) is None:
                continue
            proto.run(functools.partial(conn.close_by_operator, reason="banned"), description)
            closed.append(proto.conn_id)
        return sorted(closed)

    def _arm_expiry(self) -> None:
        """One timer at the next expiry."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        when = self.table.next_expiry()
        if when is not None:
            self._expiry = self.host.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        for ban in self.table.expire(self.host.loop.time()):
            who = f"user '{ban.value}'" if ban.kind == USER else f"host {ban.value}"
            logger.info("ban of %s expired (%s)", who, ban.reason,
                        extra={"event": "ban_expired", "kind": ban.kind})
            self._audit("ban_expired", ban, [], peer="expiry")
        self._arm_expiry()

    def _audit(self, action: str, ban: Ban, closed: list[str], *, peer: str,
               vhost: str | None = None) -> None:
        self.host.emit(AdminAction(
            at=self.host.loop.time(), action=action, uid=None, pid=None, peer=peer,
            selector=f"{ban.kind}={ban.value}", targets=tuple(closed), result="ok",
            count=len(closed), description=ban.reason, vhost=vhost))

    # ------------------------------------------------------------------ the fleet's store

    async def _write(self, ban: Ban) -> bool | None:
        """Write ``ban`` to the store (with the lock held); False: left for the retry."""
        if self.store is None:
            return None
        self._pending[ban.key] = ban
        return await self._flush()

    async def _write_lift(self, kind: str, value: str) -> bool | None:
        if self.store is None:
            return None
        self._pending[(kind, value)] = None
        return await self._flush()

    async def _flush(self) -> bool:
        """Write every pending change (with the lock held); True when all were written."""
        try:
            while self._pending:
                key, ban = next(iter(self._pending.items()))
                if ban is None:
                    _, version = await asyncio.wait_for(self.store.delete(*key),
                                                        STORE_TIMEOUT)
                else:
                    ttl = None
                    if ban.expires_at is not None:
                        ttl = int((ban.expires_at - self.host.loop.time()) * 1000)
                    if ttl is None or ttl > 0:
                        version = await asyncio.wait_for(self.store.put({
                            "kind": ban.kind, "value": ban.value, "reason": ban.reason,
                            "source": ban.source, "by": ban.by,
                            "vhost": _vhost_of(ban)}, ttl), STORE_TIMEOUT)
                    else:
                        version = self._version
                if self._pending.get(key, ...) is ban:
                    del self._pending[key]
                if version is not None and self._version is not None and \
                        version == self._version + 1:
                    self._version = version  # our own change: nothing new to read
        except Exception as exc:  # noqa: BLE001 - unreachable or an error: retried
            self._went_down(exc)
            return False
        self._came_back()
        return True

    async def _poll(self) -> None:
        """Follow the store: write what is pending, read the list when its version moved."""
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                async with self._lock:
                    if self._pending and not await self._flush():
                        continue
                    version = await asyncio.wait_for(self.store.version(), STORE_TIMEOUT)
                    if version != self._version:
                        await asyncio.wait_for(self._load(), STORE_TIMEOUT)
                    self._came_back()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried at the next poll
                self._went_down(exc)

    async def _load(self) -> None:
        """Make this process's list the fleet's (with the lock held): new bans are applied
        (their connections closed), lifted and expired ones removed; changes still pending
        here win."""
        stored = await self.store.load()
        now = self.host.loop.time()
        wanted: dict[tuple[str, str], Ban] = {}
        for record in stored.bans:
            ban = _from_record(record, stored.now_ms, now)
            if ban is not None and ban.active(now):
                wanted[ban.key] = ban
        for key, pending in self._pending.items():
            if pending is None:
                wanted.pop(key, None)
            else:
                wanted[key] = pending
        for ban in self.table.active(now):
            if ban.key not in wanted:
                self.table.remove(*ban.key)
                logger.info("ban of %s %s lifted in the fleet", ban.kind, ban.value)
        for key, ban in wanted.items():
            have = self.table.get(*key)
            if have is not None and have.active(now) and have.reason == ban.reason and \
                    have.source == ban.source and _same_expiry(have, ban):
                continue
            closed = self._apply(ban)
            if have is None or not have.active(now):
                logger.info("ban of %s %s from the fleet (%s); %d connection%s closed",
                            ban.kind, ban.value, ban.reason, len(closed),
                            "" if len(closed) == 1 else "s")
        self._arm_expiry()
        self._version = stored.version

    def _went_down(self, exc: BaseException) -> None:
        if not self._store_down:
            self._store_down = True
            logger.warning("bans: the fleet's store is unreachable (%s): bans apply in this "
                           "process and are shared when it is back", exc or type(exc).__name__)

    def _came_back(self) -> None:
        if self._store_down:
            self._store_down = False
            logger.info("bans: the fleet's store is back: the list is shared again")


def _vhost_of(ban: Ban) -> str | None:
    prefix = "quarantine of vhost "
    return ban.by[len(prefix):] if ban.by.startswith(prefix) else None


def _same_expiry(a: Ban, b: Ban) -> bool:
    """Expiries within 50 ms (a clock conversion's rounding) are the same."""
    if a.expires_at is None or b.expires_at is None:
        return a.expires_at is b.expires_at
    return abs(a.expires_at - b.expires_at) < 0.05


def _from_record(record: Mapping[str, Any], store_now_ms: int, now: float) -> Ban | None:
    """A stored ban on this process's clock; None when it is not one."""
    kind, value = record.get("kind"), record.get("value")
    if kind not in KINDS or not isinstance(value, str):
        return None
    if kind == HOST:
        try:
            if BanList.canonical(HOST, value) != value:
                return None
        except ValueError:
            return None

    def local(ms: Any) -> float | None:
        if not isinstance(ms, int | float) or isinstance(ms, bool):
            return None
        return now + (ms - store_now_ms) / 1000.0

    created = local(record.get("created_ms"))
    expires = record.get("expires_ms")
    return Ban(kind, value, str(record.get("reason") or ""),
               created_at=created if created is not None else now,
               expires_at=None if expires is None else local(expires),
               source=QUARANTINE if record.get("source") == QUARANTINE else OPERATOR,
               by=str(record.get("by") or ""))
