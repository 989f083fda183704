"""Layer 5 (I/O: Redis). The fleet ledger: exact connection limits across every proxy of a
fleet, counted in Redis (docs/fleet.md, docs/decisions/0006-fleet-ledger.md).

The core asks :meth:`FleetLedger.try_admit` synchronously. While the store is in use the
answer is :data:`~amqp_policy_proxy.core.admission.LEDGER_PENDING`: the admission is queued,
one Lua call (:data:`~.scripts.ADMIT`) decides it in the store, and the answer is handed to the
daemon's ``on_answer`` callback, which feeds it to the connection
(``ProxyConnection.ledger_answered``). While the store is unreachable or slower than
``timeout_ms`` the ledger answers at once from this process's own counts as ``failure_mode``
says.

Everything this process sends to the store goes through one task, in order, in batches (one
pipeline per batch, one round trip): admissions, releases, and the periodic rewrite of this
process's own counts. Because the batches run one after the other, and a rewrite is never
batched with an admission whose answer is unknown, a rewrite always matches what the store
has applied from this process; releases are never retried as deltas (a replayed delta could
uncount twice): a failed batch puts the ledger in its fallback, and leaving the fallback
rewrites every count (the retry is idempotent).

The process's own counts are an in-process
:class:`~amqp_policy_proxy.limits.connections.ConnectionLedger` (the daemon's): it holds the
sockets, so its counts are the truth the store is rewritten from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..core.admission import LEDGER_PENDING, LedgerPending
from ..limits.connections import ConnectionLedger, connection_limits
from ..limits.rates import connection_rates
from ..policy.reasons import ConnectionDenyReason
from . import scripts

if TYPE_CHECKING:
    from ..policy.model import GroupSettings, VhostPolicy

logger = logging.getLogger(__name__)

FailureMode = Literal["local-share", "closed", "open"]
FAILURE_MODES: tuple[str, ...] = ("local-share", "closed", "open")
"""What admission does while the store is unreachable or slow (``[ledger] failure_mode``)."""
STORE = "redis"
"""The mode while the store decides."""
IN_PROCESS = "in-process"
"""The mode label of a proxy without ``[ledger]`` (its own counts only, by design)."""
MODES: tuple[str, ...] = (STORE, *FAILURE_MODES, IN_PROCESS)
"""Every value of the ``amqp_proxy_ledger_mode{mode}`` label."""

_SCOPE_REASON = {
    scripts.SCOPE_VHOST: ConnectionDenyReason.VHOST_LIMIT,
    scripts.SCOPE_USER: ConnectionDenyReason.USER_LIMIT,
    scripts.SCOPE_HOST: ConnectionDenyReason.HOST_LIMIT,
    scripts.SCOPE_VHOST_RATE: ConnectionDenyReason.VHOST_RATE,
    scripts.SCOPE_USER_RATE: ConnectionDenyReason.USER_RATE,
    scripts.SCOPE_HOST_RATE: ConnectionDenyReason.HOST_RATE,
}
#: Seconds a batch may take before the connection to the store is given up (the admissions
#: in it were answered from the fallback after ``timeout_ms`` already).
BATCH_DEADLINE = 2.0
#: Scopes whose other proxies' counts are remembered for the ``local-share`` fallback (about
#: 150 bytes each; the least recently answered go first).
MAX_OTHERS = 65536


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    """``[ledger]``: where the shared counts are and what to do without them.

    Attributes:
        url: ``redis://HOST:PORT/DB``, ``rediss://`` (TLS) or ``unix:///path/redis.sock``.
        proxy_id: this process's name in the store (unique in the fleet).
        lease_seconds: a proxy that has not renewed its lease for this long stops counting;
            renewed every third of it.
        timeout_ms: how long the store may stay silent, in milliseconds, before it counts as
            unreachable: an Open waits for the store's answer up to this long (as it waits
            for the router), and one not answered within it is decided by
            ``failure_mode``, which stays in force until the store is back. Long enough
            that no client can cause it (one late answer is waited for, not a failure).
        failure_mode: ``local-share`` (each limit divided by the proxies last seen alive,
            rounded up, against this process's counts), ``closed`` (deny new connections) or
            ``open`` (this process's counts against the full limits).
    """

    url: str
    proxy_id: str
    lease_seconds: float = 10.0
    timeout_ms: float = 1000.0
    failure_mode: FailureMode = "local-share"


class LedgerObserver:
    """Where the ledger reports its figures (the daemon wires these to the metrics)."""

    __slots__ = ()

    def ledger_latency(self, seconds: float) -> None:
        """One admission answered by the store, ``seconds`` after it was asked."""

    def ledger_error(self, reason: str) -> None:
        """A store failure: ``timeout``, ``unreachable``, ``restarted`` or ``error``."""


@dataclass(slots=True)
class _Admit:
    conn_id: str
    vhost: str
    group: str
    user: str
    host: str
    limits: tuple[int, int, int]
    asked: float
    enforce: bool = True
    rates: tuple[int, int, int, int] = (0, 0, 0, 0)
    """``connection_rates``: vhost, per-user and per-host rates per second, and the burst."""
    """False in shadow mode: counted even over a limit, the failed scope still answered."""
    timer: asyncio.TimerHandle | None = None
    answered: bool = False
    cancelled: bool = False


@dataclass(slots=True)
class _Release:
    vhost: str
    user: str
    host: str


@dataclass(slots=True)
class _Take:
    """Shaping tokens asked of the store: ``args`` as :data:`~.scripts.TAKE`'s ARGV."""

    keys: tuple[str, str]
    args: tuple[float, ...]
    done: Callable[[tuple[int, int] | None], None]
    """Called with the tokens taken, or None when the store did not answer."""


@dataclass(slots=True)
class _Batch:
    admits: list[_Admit] = field(default_factory=list)
    releases: list[_Release] = field(default_factory=list)
    takes: list[_Take] = field(default_factory=list)
    rewrite: bool = False


class StoreRestarted(Exception):
    """The store lost this proxy's scripts (it restarted or failed over): rewrite."""


class FleetLedger:
    """The admission ledger of one proxy process in a fleet (see the module docstring).

    Args:
        local: this process's own counts (the daemon's in-process ledger).
        settings: ``[ledger]``.
        on_answer: ``on_answer(conn_id, reason)`` delivers a pending answer (None: admitted)
            on the event loop; the daemon feeds it to the connection.
        observer: receives latencies and errors.
        client: a redis-py asyncio client (tests); default: made from ``settings.url``.
    """

    def __init__(
        self,
        local: ConnectionLedger,
        settings: LedgerSettings,
        *,
        on_answer: Callable[[str, ConnectionDenyReason | None], None],
        observer: LedgerObserver | None = None,
        client: Any = None,
    ) -> None:
        self.local = local
        self.settings = settings
        self.on_answer = on_answer
        self.observer = observer or LedgerObserver()
        self.mode: str = settings.failure_mode
        """``redis`` while the store decides, else the failure mode in force."""
        self.proxies_alive = 1
        """Live proxies when last seen in the store (the ``local-share`` divisor)."""
        self.run_id: str | None = None
        """The store's ``run_id`` when last reconciled (a change means a restart)."""
        self._client = client
        self._shas: dict[str, str] = {}
        self._queue: deque[_Admit | _Release | _Take] = deque()
        self._pending: dict[str, _Admit] = {}
        self._touched: set[str] = set()
        """Vhosts where this process may have fields in the store."""
        self._registered: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._rewrite_due = False
        self._hold_until = 0.0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rate_charges: dict[str, tuple[int, float]] = {}
        """Connection-rate tokens taken while the store was unreachable, by bucket key:
        ``(tokens, rate per second)``, charged to the store when it is back, before it decides
        again (at most :data:`MAX_OTHERS` buckets)."""
        self.others: dict[tuple[str, str, str], int] = {}
        """What the other live proxies held in a scope (``(vhost, "vhost" | "user" |
        "host", name)``) when the store last answered an admission in it; the
        ``local-share`` fallback adds it to this process's own counts. Only non-zero
        counts are kept, at most :data:`MAX_OTHERS`."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> bool:
        """Connect, clear what a previous run under this proxy id left, register this
        process's (empty) counts and start the pump and the lease renewals.

        Never fails on the store: unreachable, the ledger starts in its failure mode and
        keeps trying.

        Returns:
            True when the store was reached.
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self._client is None:
            self._client = connect(self.settings.url)
        ok = await self._reconcile(first=True)
        if not ok:
            logger.warning("ledger %s unreachable at start: admitting by failure mode %s",
                           _shown(self.settings.url), self.settings.failure_mode)
        self._task = self._loop.create_task(self._pump())
        self._refresh_task = self._loop.create_task(self._refresh_loop())
        return ok

    async def stop(self) -> None:
        """Remove this process's fields and lease from the store (a drained proxy leaves
        nothing behind) and close the client. Never raises."""
        self._stopping = True
        for task in (self._task, self._refresh_task):
            if task is not None:
                task.cancel()
        for task in (self._task, self._refresh_task):
            if task is not None:
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled, or the pump's last error
                    pass
        for op in list(self._pending.values()):
            self._answer_fallback(op)
        client = self._client
        if client is None:
            return
        try:
            if self.mode == STORE or self._touched:
                await asyncio.wait_for(self._leave(), BATCH_DEADLINE)
        except Exception as exc:  # noqa: BLE001 - the leases expire anyway
            logger.warning("ledger: could not remove this proxy's counts at exit (%s); they "
                           "stop counting within %.0f s", exc, self.settings.lease_seconds)
        try:
            await client.aclose()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ AdmissionLedger

    def try_admit(
        self, conn_id: str, *, vhost: VhostPolicy, group: GroupSettings, user: str,
        remote_host: str, enforce: bool = True,
    ) -> ConnectionDenyReason | None | LedgerPending:
        """Admit against the fleet's counts (see the module docstring).

        With ``enforce`` False (shadow mode) the connection is counted even over a limit and
        the failed limit is still answered (the would-be denial).

        Returns:
            :data:`LEDGER_PENDING` while the store decides (the answer comes through
            ``on_answer`` within ``timeout_ms``); otherwise the failure mode's answer now.

        Raises:
            ValueError: ``conn_id`` is already admitted or pending (a caller bug).
        """
        if conn_id in self._pending or self.local.is_admitted(conn_id):
            raise ValueError(f"connection {conn_id!r} is already admitted")
        if self.mode != STORE or self._loop is None:
            return self._fallback(conn_id, vhost, group, user, remote_host, enforce)
        loop = self._loop
        op = _Admit(conn_id, vhost.hostname, group.name, user, remote_host,
                    connection_limits(vhost, group), time.perf_counter(), enforce,
                    connection_rates(vhost, group))
        op.timer = loop.call_later(self.settings.timeout_ms / 1000.0, self._timed_out, op)
        self._pending[conn_id] = op
        self._queue.append(op)
        assert self._wake is not None
        self._wake.set()
        return LEDGER_PENDING

    def release(self, conn_id: str) -> bool:
        """Uncount a connection: locally now, in the store off the hot path (in order with
        everything else this process sends). A pending one is uncounted when its answer
        comes, and its answer is not delivered.

        Returns:
            True when the connection was counted or pending.
        """
        op = self._pending.get(conn_id)
        if op is not None:
            op.cancelled = True
            return True
        record = self.local.record_of(conn_id)
        if record is None:
            return False
        self.local.release(conn_id)
        if self.mode == STORE and self._wake is not None:
            vhost, _group, user, host = record
            self._queue.append(_Release(vhost, user, host))
            self._wake.set()
        return True

    # ------------------------------------------------------------------ the fallback

    def _fallback(self, conn_id: str, vhost: VhostPolicy, group: GroupSettings, user: str,
                  remote_host: str, enforce: bool = True) -> ConnectionDenyReason | None:
        """The failure mode's decision now, from this process's own counts (``enforce``
        False: counted anyway, the would-be denial answered)."""
        return self._fallback_op(_Admit(conn_id, vhost.hostname, group.name, user, remote_host,
                                        connection_limits(vhost, group), 0.0, enforce))

    def _settle(self, op: _Admit) -> bool:
        """Mark ``op`` answered (its timer cancelled, no longer pending); False when it was
        answered already (the first answer, store or fallback, is the one that counts)."""
        if op.answered:
            return False
        op.answered = True
        if op.timer is not None:
            op.timer.cancel()
        self._pending.pop(op.conn_id, None)
        return True

    def _answer_fallback(self, op: _Admit) -> None:
        """Answer a queued or in-flight admission from the failure mode (once)."""
        if not self._settle(op) or op.cancelled:
            return
        reason = self._fallback_op(op)
        self.on_answer(op.conn_id, reason)

    def _fallback_op(self, op: _Admit) -> ConnectionDenyReason | None:
        """The failure mode's decision on a queued admission (see :meth:`_fallback`)."""
        reason: ConnectionDenyReason | None = None
        local = self.local
        if self.mode == "closed":
            reason = ConnectionDenyReason.LEDGER_UNAVAILABLE
        else:
            sharing = self.mode == "local-share"
            share = max(1, self.proxies_alive) if sharing else 1
            others = self.others
            for (kind, name, held, why), limit in zip((
                    ("vhost", "", local.vhost_active(op.vhost), ConnectionDenyReason.VHOST_LIMIT),
                    ("user", op.user, local.user_active(op.vhost, op.user),
                     ConnectionDenyReason.USER_LIMIT),
                    ("host", op.host, local.host_active(op.vhost, op.host),
                     ConnectionDenyReason.HOST_LIMIT)), op.limits, strict=True):
                # local-share: this process's share of the limit, and never above the limit
                # together with what the other proxies held when the store last answered
                if held >= -(-limit // share) or (
                        sharing and held + others.get((op.vhost, kind, name), 0) >= limit):
                    reason = why
                    break
        if reason is not None and op.enforce:
            return reason
        local.record(op.conn_id, vhost=op.vhost, group=op.group, user=op.user,
                     remote_host=op.host)
        self._touched.add(op.vhost)
        return reason

    def _enter_fallback(self, reason: str, detail: object) -> None:
        """The store failed: every admission not answered yet is answered by the failure
        mode, and the ledger stays in it until a rewrite of every count succeeds."""
        self.observer.ledger_error(reason)
        if self.mode != STORE:
            return
        self.mode = self.settings.failure_mode
        logger.warning("ledger %s %s (%s): admitting by failure mode %s until it is back",
                       _shown(self.settings.url), _ERROR_WORDS.get(reason, reason), detail,
                       self.mode)
        self._rewrite_due = True
        while self._queue:
            op = self._queue.popleft()
            if isinstance(op, _Admit):
                self._answer_fallback(op)
            elif isinstance(op, _Take):
                op.done(None)
        for op in list(self._pending.values()):
            self._answer_fallback(op)

    def _timed_out(self, op: _Admit) -> None:
        op.timer = None
        if not op.answered:
            self._enter_fallback("timeout", f"no answer within {self.settings.timeout_ms:g} ms")
            self._answer_fallback(op)

    # ------------------------------------------------------------------ the pump

    async def _pump(self) -> None:
        """Send what is queued, in order, one batch at a time; in the fallback, try to
        reconcile every second (or every third of a lease, when shorter)."""
        assert self._wake is not None
        probe = min(1.0, self.settings.lease_seconds / 3)
        while True:
            if self.mode != STORE:
                try:
                    await asyncio.wait_for(self._wake.wait(), probe)
                except TimeoutError:
                    pass
                self._wake.clear()
                if self.mode != STORE:
                    await self._reconcile()
                continue
            await self._wake.wait()
            self._wake.clear()
            while self.mode == STORE and (self._queue or self._rewrite_due):
                await self._one_batch()

    async def _refresh_loop(self) -> None:
        """Renew the lease and rewrite this process's counts every third of a lease."""
        assert self._wake is not None
        while True:
            await asyncio.sleep(self.settings.lease_seconds / 3)
            self._rewrite_due = True
            self._wake.set()

    def _build(self) -> _Batch:
        """Take what is queued. A due rewrite goes out with the queued releases only (never
        with an admission whose answer is unknown), after them, from the counts as they are
        now."""
        batch = _Batch()
        queue = self._queue
        if self._rewrite_due:
            self._rewrite_due = False
            batch.rewrite = True
            keep: deque[_Admit | _Release | _Take] = deque()
            while queue:
                op = queue.popleft()
                if isinstance(op, _Release):
                    batch.releases.append(op)
                elif isinstance(op, _Take):
                    batch.takes.append(op)
                else:
                    keep.append(op)
            self._queue = keep
            return batch
        while queue:
            op = queue.popleft()
            if isinstance(op, _Release):
                batch.releases.append(op)
            elif isinstance(op, _Take):
                batch.takes.append(op)
            elif not op.answered:
                batch.admits.append(op)
        return batch

    async def _one_batch(self) -> None:
        batch = self._build()
        client = self._client
        pipe = client.pipeline(transaction=False)
        sent: list[_Admit | _Release | _Take | None] = []
        for op in batch.admits:
            self._ensure_registered(pipe, op.vhost, sent)
            vhost_l, user_l, host_l = op.limits
            keys = (scripts.leases_key(op.vhost),
                    scripts.owned_key(op.vhost, self.settings.proxy_id),
                    *scripts.scope_keys(op.vhost, op.user, op.host),
                    *scripts.rate_keys(op.vhost, op.user, op.host))
            pipe.evalsha(self._shas["admit"], len(keys), *keys, self.settings.proxy_id,
                         self._lease_ms(), vhost_l, user_l, host_l, 1 if op.enforce else 0,
                         *op.rates)
            sent.append(op)
        for rel in batch.releases:
            pipe.evalsha(self._shas["release"], 3,
                         *scripts.scope_keys(rel.vhost, rel.user, rel.host),
                         self.settings.proxy_id)
            sent.append(rel)
        for take in batch.takes:
            pipe.evalsha(self._shas["take"], 2, *take.keys, *take.args)
            sent.append(take)
        if batch.rewrite:
            sent.extend(self._queue_rewrite(pipe, self._lease_ms()))
        if not sent:
            return
        try:
            results = await asyncio.wait_for(pipe.execute(raise_on_error=False),
                                             BATCH_DEADLINE)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, TimeoutError, OSError...
            await self._disconnect()
            for take in batch.takes:
                take.done(None)
            self._enter_fallback(_error_reason(exc), _describe(exc))
            return
        now = time.perf_counter()
        failed: BaseException | None = None
        for one, result in zip(sent, results, strict=True):
            if isinstance(result, BaseException):
                failed = failed or result
                if isinstance(one, _Take):
                    one.done(None)
                continue
            if isinstance(one, _Take):
                one.done((int(result[0]), int(result[1])))
            elif isinstance(one, _Admit):
                if isinstance(result, list):
                    self._note_others(one, result[1:])
                    result = result[0]
                self._store_answered(one, int(result), now)
        if batch.rewrite and results:
            alive = results[-1]
            if isinstance(alive, int):
                self.proxies_alive = max(1, alive)
        if failed is not None:
            reason = "restarted" if _is_noscript(failed) else "error"
            self._enter_fallback(reason, _describe(failed))

    def _store_answered(self, op: _Admit, scope: int, now: float) -> None:
        """The store counted (0) or denied an admission; late answers only fix the store."""
        if not self._settle(op):
            # decided by the fallback meanwhile; what the store counted is rewritten when
            # the ledger leaves the fallback
            return
        self.observer.ledger_latency(now - op.asked)
        if scope > 0:
            if not op.cancelled:
                self.on_answer(op.conn_id, _SCOPE_REASON[scope])
            return
        self.local.record(op.conn_id, vhost=op.vhost, group=op.group, user=op.user,
                          remote_host=op.host)
        self._touched.add(op.vhost)
        if op.cancelled:  # the client left while the store decided: uncount it again
            self.release(op.conn_id)
            return
        # scope < 0: counted in shadow mode over the limit of scope -scope
        self.on_answer(op.conn_id, _SCOPE_REASON[-scope] if scope else None)

    def _note_others(self, op: _Admit, counts: list[Any]) -> None:
        """Remember what the other live proxies hold in ``op``'s three scopes (the store's
        answer after the scope number), for the ``local-share`` fallback."""
        others = self.others
        for kind, name, n in zip(("vhost", "user", "host"), ("", op.user, op.host), counts,
                                 strict=False):
            key = (op.vhost, kind, name)
            others.pop(key, None)
            if int(n) > 0:
                others[key] = int(n)
        while len(others) > MAX_OTHERS:
            del others[next(iter(others))]

    def take_tokens(self, keys: tuple[str, str], args: tuple[float, ...],
                    done: Callable[[tuple[int, int] | None], None]) -> bool:
        """Ask the store for shaping tokens (:data:`~.scripts.TAKE`), in order with everything
        else this process sends; ``done`` gets the tokens taken, or None if the store did not
        answer.

        Returns:
            False (nothing asked) while the store is not deciding.
        """
        if self.mode != STORE or self._wake is None:
            return False
        self._queue.append(_Take(keys, args, done))
        self._wake.set()
        return True

    def charge_rates(self, vhost: str, user: str, host: str,
                     rates: tuple[int, int, int, int]) -> None:
        """A connection admitted by the fallback took a token from each limited rate
        bucket locally (``rates`` as :func:`~..limits.rates.connection_rates`): remember it,
        to charge the store's buckets when the store is back."""
        charges = self.rate_charges
        for key, rate in zip(scripts.rate_keys(vhost, user, host), rates[:3], strict=True):
            if rate:
                n, _ = charges.pop(key, (0, rate))
                charges[key] = (n + 1, float(rate))
        while len(charges) > MAX_OTHERS:
            del charges[next(iter(charges))]

    def _queue_charges(self, pipe: Any) -> list[str]:
        """Queue a charge of every connection-rate bucket the fallback took tokens from."""
        keys = list(self.rate_charges)
        for key in keys:
            n, rate = self.rate_charges[key]
            pipe.evalsha(self._shas["charge"], 1, key, n, rate)
        return keys

    def _ensure_registered(self, pipe: Any, vhost: str, sent: list[Any]) -> None:
        """Name ``vhost`` in this proxy's vhost set once (so a later run can clear it)."""
        if vhost not in self._registered:
            self._registered.add(vhost)
            pipe.sadd(scripts.vhosts_key(self.settings.proxy_id), vhost)
            sent.append(None)

    def _queue_rewrite(self, pipe: Any, lease_ms: int,
                       vhosts: set[str] | None = None) -> list[None]:
        """Queue the rewrite of every vhost this process may have fields in, then the alive
        set (its answer, the live proxies, is the batch's last result)."""
        me = self.settings.proxy_id
        counts = self.local.scope_counts()
        sent: list[None] = []
        targets = set(self._touched) | set(counts) | (vhosts or set())
        for vhost in sorted(targets):
            keys = [scripts.leases_key(vhost), scripts.owned_key(vhost, me)]
            args: list[Any] = [me, lease_ms]
            if vhost in counts:
                n, users, hosts = counts[vhost]
                tag = scripts.vhost_tag(vhost)
                keys.append(f"{tag}:vhost")
                args.append(n)
                for user, k in users.items():
                    keys.append(f"{tag}:user:{user}")
                    args.append(k)
                for host, k in hosts.items():
                    keys.append(f"{tag}:host:{host}")
                    args.append(k)
            pipe.evalsha(self._shas["rewrite"], len(keys), *keys, *args)
            sent.append(None)
            if vhost not in self._registered and vhost in counts:
                self._registered.add(vhost)
                pipe.sadd(scripts.vhosts_key(me), vhost)
                sent.append(None)
        self._touched = set(counts)
        pipe.evalsha(self._shas["alive"], 1, scripts.ALIVE_KEY, me, lease_ms)
        sent.append(None)
        return sent

    def _lease_ms(self) -> int:
        return max(1, int(self.settings.lease_seconds * 1000))

    # ------------------------------------------------------------------ reconcile

    async def _reconcile(self, *, first: bool = False) -> bool:
        """Load the scripts and rewrite every count from this process's own (also what a
        previous run under this proxy id left). On success the store decides again, unless
        it restarted: then every other proxy gets a third of a lease to rewrite its counts
        first, and the fallback holds until then.

        Returns:
            True when the store was reached and everything rewritten.
        """
        client = self._client
        loop = asyncio.get_running_loop()
        try:
            info = await asyncio.wait_for(client.info("server"), BATCH_DEADLINE)
            run_id = str(info.get("run_id", ""))
            self._shas = {
                name: await client.script_load(text)
                for name, text in (("admit", scripts.ADMIT), ("release", scripts.RELEASE),
                                   ("rewrite", scripts.REWRITE), ("alive", scripts.ALIVE),
                                   ("charge", scripts.CHARGE), ("take", scripts.TAKE))}
            me = self.settings.proxy_id
            stored = {v.decode() if isinstance(v, bytes) else str(v)
                      for v in await client.smembers(scripts.vhosts_key(me))}
            self._registered.clear()
            pipe = client.pipeline(transaction=False)
            charges = self._queue_charges(pipe)
            self._queue_rewrite(pipe, self._lease_ms(), stored)
            results = await asyncio.wait_for(pipe.execute(), BATCH_DEADLINE)
            for key in charges:  # charged: forget them (new ones may have come meanwhile)
                self.rate_charges.pop(key, None)
            gone = stored - self._registered
            if gone:
                await client.srem(scripts.vhosts_key(me), *gone)
        except Exception as exc:  # noqa: BLE001
            await self._disconnect()
            self.observer.ledger_error(_error_reason(exc))
            return False
        self.proxies_alive = max(1, int(results[-1]))
        restarted = self.run_id is not None and run_id != self.run_id
        self.run_id = run_id
        if restarted and not first:
            self._hold_until = loop.time() + self.settings.lease_seconds / 3
            logger.warning("ledger %s restarted or failed over: counts rewritten; the store "
                           "decides again in %.1f s, once every proxy has rewritten its own",
                           _shown(self.settings.url), self.settings.lease_seconds / 3)
        if loop.time() < self._hold_until:
            return False
        if self.mode != STORE:
            if not first:
                logger.warning("ledger %s is back: counts reconciled, %d proxies alive",
                               _shown(self.settings.url), self.proxies_alive)
            self.mode = STORE
            self._rewrite_due = False
        return True

    async def _leave(self) -> None:
        """Remove this proxy's fields, leases and vhost set (drained: nothing is counted)."""
        client = self._client
        if not self._shas:
            return
        me = self.settings.proxy_id
        stored = {v.decode() if isinstance(v, bytes) else str(v)
                  for v in await client.smembers(scripts.vhosts_key(me))}
        pipe = client.pipeline(transaction=False)
        for vhost in sorted(stored | self._touched | set(self.local.scope_counts())):
            pipe.evalsha(self._shas["rewrite"], 2, scripts.leases_key(vhost),
                         scripts.owned_key(vhost, me), me, 0)
        pipe.evalsha(self._shas["alive"], 1, scripts.ALIVE_KEY, me, 0)
        pipe.delete(scripts.vhosts_key(me))
        await pipe.execute()

    async def _disconnect(self) -> None:
        """Drop the client's connections (a half-read reply must not be read by the next
        command); the next command reconnects."""
        try:
            await self._client.connection_pool.disconnect()
        except Exception:  # noqa: BLE001
            pass


_ERROR_WORDS = {"timeout": "is too slow", "unreachable": "is unreachable",
                "restarted": "lost its scripts (restarted?)", "error": "failed"}


def _is_noscript(exc: BaseException) -> bool:
    return "NOSCRIPT" in str(exc)


def _error_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    name = type(exc).__name__
    if "Timeout" in name:
        return "timeout"
    if _is_noscript(exc):
        return "restarted"
    if isinstance(exc, OSError) or "Connection" in name:
        return "unreachable"
    return "error"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _shown(url: str) -> str:
    """The URL without a password (for logs)."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url


def connect(url: str) -> Any:
    """A redis-py asyncio client for ``url`` (``redis://``, ``rediss://``, ``unix://``), with
    hiredis parsing when installed. No automatic retry: a command is never sent twice (a
    replayed admission would count twice); a failure puts the ledger in its fallback instead.
    """
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(url, socket_timeout=BATCH_DEADLINE,
                             socket_connect_timeout=BATCH_DEADLINE, health_check_interval=0,
                             retry=Retry(NoBackoff(), 0), retry_on_error=[])
