"""Sans-IO. Rate limits as token buckets: connection rates (global, per vhost, per user, per
host) and the per-user message and byte buckets that credit shaping draws on.

An extension over QDR, which limits how many connections a user holds but not how fast they
come or how much they send (docs/policy.md "Rate limits", docs/qdr-compatibility.md). The
daemon owns one :class:`RateLimits` for the process, shared by every connection like the
connection ledger (:mod:`.connections`); the core reaches it only through the narrow Protocols
``AdmissionRates`` (core/admission.py) and ``ShapingBuckets`` (core/shaping.py).

Every bucket is kept as one float, its *theoretical arrival time* (GCRA, the "virtual
scheduling" form of a token bucket): the instant at which it would be full again. With rate
``r`` per second and capacity ``burst``, the tokens at ``now`` are
``burst - max(0, tat - now) * r``; taking ``n`` tokens moves ``tat`` to
``max(tat, now) + n / r``. A bucket whose ``tat`` has passed is full, so it carries no state:
idle buckets are dropped, which bounds the memory a storm of distinct hosts or users can take
(:class:`BucketTable`). Times are the caller's loop-clock seconds (``now`` is always an
argument); rates are per second, bursts in connections, messages or bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqp_policy_proxy.policy.reasons import ConnectionDenyReason

if TYPE_CHECKING:
    from amqp_policy_proxy.policy.model import GroupSettings, VhostPolicy

VHOST_RATE = ConnectionDenyReason.VHOST_RATE
USER_RATE = ConnectionDenyReason.USER_RATE
HOST_RATE = ConnectionDenyReason.HOST_RATE

#: Default cap on the per-user and per-host connection buckets kept at once (about 200 bytes
#: each): beyond it the least recently used bucket is dropped even if it is not full yet.
MAX_BUCKETS = 65536
#: Idle buckets examined (and dropped if full) per new entry: amortised O(1) expiry.
SWEEP_STEP = 2
#: Burst of the message and byte buckets that shaping draws on, in seconds' worth of the rate.
SHAPING_BURST_SECONDS = 0.1
#: Weight of the newest message in the running mean of payload bytes per message.
MEAN_WEIGHT = 0.125
#: Tokens lost to floating-point rounding are forgiven up to this much (a token refilled in
#: n steps of 1/rate seconds must count as whole).
EPSILON = 1e-9


def tokens_at(tat: float, rate: float, burst: float, now: float) -> float:
    """Tokens a bucket holds at ``now``: ``burst`` when full, negative when in debt."""
    return burst if tat <= now else burst - (tat - now) * rate


def conforms(tat: float, rate: float, burst: float, now: float) -> bool:
    """Whether the bucket holds at least one whole token at ``now``."""
    return tat - now <= (burst - 1) / rate + EPSILON


def charged(tat: float, rate: float, now: float, n: float = 1.0) -> float:
    """The ``tat`` after taking ``n`` tokens at ``now`` (debt allowed)."""
    return (tat if tat > now else now) + n / rate


def connection_rates(vhost: VhostPolicy, group: GroupSettings) -> tuple[int, int, int, int]:
    """The connection rates an Open is checked against, per second (0: none): ``(the
    vhost's maxConnectionRate, the group's maxConnectionRatePerUser, its
    maxConnectionRatePerHost, the vhost's connectionRateBurst)``; the group's rates are
    already resolved against the vhost's, a burst of 0 means each rate's own."""
    return (vhost.max_connection_rate or 0, group.max_connection_rate_per_user or 0,
            group.max_connection_rate_per_host or 0, vhost.connection_rate_burst or 0)


class BucketTable:
    """Connection-rate buckets by key, bounded in memory.

    Entries are kept in the order they were last charged; each new entry drops up to
    :data:`SWEEP_STEP` of the oldest ones that are full again (a full bucket is the same as no
    bucket), and the oldest entry goes when more than ``max_buckets`` are kept, full or not (a
    host that comes back after that starts with a full bucket: documented). So a storm of
    distinct hosts holds at most ``min(max_buckets, hosts seen within a refill time)``
    entries.
    """

    __slots__ = ("_tat", "max_buckets", "expired", "evicted")

    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        """An empty table keeping at most ``max_buckets`` (>= 1) buckets."""
        self._tat: dict[Any, float] = {}
        self.max_buckets = max(1, max_buckets)
        self.expired = 0
        """Buckets dropped because they were full again."""
        self.evicted = 0
        """Buckets dropped, not yet full, because the table was at ``max_buckets``."""

    def __len__(self) -> int:
        """Buckets kept now."""
        return len(self._tat)

    def conforms(self, key: Any, rate: float, burst: float, now: float) -> bool:
        """Whether ``key``'s bucket holds a token at ``now`` (nothing is changed)."""
        tat = self._tat.get(key)
        return tat is None or conforms(tat, rate, burst, now)

    def take(self, key: Any, rate: float, now: float) -> None:
        """Take one token from ``key``'s bucket (created full if absent) and expire old ones."""
        table = self._tat
        tat = table.pop(key, None)
        table[key] = charged(now if tat is None else tat, rate, now)
        if tat is None:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        table = self._tat
        for _ in range(SWEEP_STEP):
            key = next(iter(table))
            if table[key] > now:
                break
            del table[key]
            self.expired += 1
        while len(table) > self.max_buckets:
            del table[next(iter(table))]
            self.evicted += 1


class RateLimits:
    """The process's rate limits: connection buckets and the shaping buckets of users.

    Args:
        max_connection_rate: ``[policy] max_connection_rate``, transports per second checked
            at TCP accept (0 = unlimited); settable later.
        max_buckets: cap of each :class:`BucketTable` (users, hosts, idle shaping buckets).
    """

    __slots__ = ("max_connection_rate", "max_buckets", "_global_tat", "_vhosts", "users",
                 "hosts", "_shaping", "_idle", "_totals", "global_denied", "bucket_factory")

    def __init__(self, max_connection_rate: int = 0, *, max_buckets: int = MAX_BUCKETS) -> None:
        """No connection seen yet: every bucket full."""
        self.max_connection_rate = max_connection_rate
        self.max_buckets = max(1, max_buckets)
        self._global_tat = -math.inf
        self._vhosts = BucketTable(max_buckets)
        self.users = BucketTable(max_buckets)
        """Per-user connection buckets, keyed ``(vhost, user)``."""
        self.hosts = BucketTable(max_buckets)
        """Per-host connection buckets, keyed ``(vhost, remote host)``."""
        self._shaping: dict[tuple[str, str], UserRate] = {}
        """Shaping buckets by ``(vhost, user)``: in use, or idle and refilling."""
        self._idle: dict[tuple[str, str], UserRate] = {}
        """The idle ones (no connection uses them), oldest release first."""
        self._totals: dict[tuple[str, str], list[float]] = {}
        self.global_denied = 0
        self.bucket_factory: Callable[[RateLimits, str, str, str], UserRate] = UserRate
        """Makes a user's shaping buckets ``(owner, vhost, group, user)``: :class:`UserRate`,
        or with a fleet ledger buckets that draw their tokens from the store."""

    # ------------------------------------------------------------------ connections

    def try_accept(self, now: float) -> bool:
        """Take a token for a new transport from the global bucket (burst: one second's
        worth); False when there is none (the caller refuses the transport, ``global_rate``)."""
        rate = self.max_connection_rate
        if not rate:
            return True
        if not conforms(self._global_tat, rate, rate, now):
            self.global_denied += 1
            return False
        self._global_tat = charged(self._global_tat, rate, now)
        return True

    def try_admit(
        self,
        *,
        vhost: VhostPolicy,
        group: GroupSettings,
        user: str,
        remote_host: str,
        now: float,
        share: int = 1,
    ) -> ConnectionDenyReason | None:
        """Admit a connection against the vhost's, the user's and the host's rate.

        In the order of the count limits: ``vhost_rate`` (``maxConnectionRate``),
        ``user_rate`` (the group's ``maxConnectionRatePerUser``, already resolved against the
        vhost's), ``host_rate`` (likewise per host). All or nothing: a token is taken from
        each limited bucket only when every one has one, so a denied attempt costs no token
        (it costs the router nothing either). The user's and host's buckets are kept per
        vhost whatever the group, each attempt judged with its own group's rate (as the
        counts). The burst is the vhost's ``connectionRateBurst``, else each rate. ``share``
        divides every rate and burst (the fleet ledger's ``local-share`` fallback: this
        process's part of a fleet-wide rate).

        Returns:
            None when admitted (tokens taken), else the first rate that has no token.
        """
        per_vhost, per_user, per_host, burst = connection_rates(vhost, group)
        if not (per_vhost or per_user or per_host):
            return None  # the common case: no rate at all
        vname = vhost.hostname
        checks = []
        rate: float  # the vhost's or group's rate, or this proxy's share of it
        cap: float
        for table, key, rate, reason in (
            (self._vhosts, vname, per_vhost, VHOST_RATE),
            (self.users, (vname, user), per_user, USER_RATE),
            (self.hosts, (vname, remote_host), per_host, HOST_RATE),
        ):
            if rate:
                cap = burst or rate
                if share > 1:
                    rate, cap = rate / share, max(1.0, cap / share)
                if not table.conforms(key, rate, cap, now):
                    return reason
                checks.append((table, key, rate))
        for table, key, rate in checks:
            table.take(key, rate, now)
        return None

    # ------------------------------------------------------------------ shaping

    def acquire(self, *, vhost: str, group: str, user: str, message_rate: int | None,
                byte_rate: int | None, now: float) -> UserRate:
        """The message and byte buckets of ``user`` in ``vhost``, shared by the user's
        connections on this proxy; the rates given (the group's) replace the bucket's.
        :meth:`release` once per acquire."""
        key = (vhost, user)
        bucket = self._shaping.get(key)
        if bucket is None:
            bucket = self._shaping[key] = self.bucket_factory(self, vhost, group, user)
        self._idle.pop(key, None)
        bucket.group = group
        bucket.set_rates(message_rate, byte_rate)
        bucket.refs += 1
        self._sweep_idle(now)
        return bucket

    def release(self, bucket: UserRate, now: float) -> None:
        """One connection of the bucket's user is gone. A bucket no connection uses is kept
        until it is full again (reconnecting does not refill it), then dropped; at most
        ``max_buckets`` such buckets are kept."""
        bucket.refs -= 1
        if bucket.refs <= 0:
            bucket.refs = 0
            key = (bucket.vhost, bucket.user)
            self._idle.pop(key, None)
            self._idle[key] = bucket
            self._sweep_idle(now)

    def _sweep_idle(self, now: float) -> None:
        idle = self._idle
        for _ in range(SWEEP_STEP):
            if not idle:
                return
            key = next(iter(idle))
            if idle[key].full_at() > now and len(idle) <= self.max_buckets:
                return
            del idle[key]
            del self._shaping[key]

    def shaping_buckets(self) -> int:
        """Shaping buckets kept now (in use or refilling)."""
        return len(self._shaping)

    def totals(self, now: float) -> dict[tuple[str, str], tuple[float, int, int]]:
        """Per ``(vhost, group)`` since start: seconds users were throttled (summed over
        users, the current waits included), messages and payload bytes sent on shaped links
        (the metrics' ``amqp_proxy_throttled_seconds_total``, ``..._shaped_messages_total``,
        ``..._shaped_bytes_total``)."""
        out = {k: (v[0], int(v[1]), int(v[2])) for k, v in self._totals.items()}
        for bucket in self._shaping.values():
            if bucket.waiting and bucket.waiting_since is not None:
                key = (bucket.vhost, bucket.group)
                seconds, messages, nbytes = out.get(key, (0.0, 0, 0))
                out[key] = (seconds + max(0.0, now - bucket.waiting_since), messages, nbytes)
        return out

    def _stats(self, vhost: str, group: str) -> list[float]:
        key = (vhost, group)
        stats = self._totals.get(key)
        if stats is None:
            stats = self._totals[key] = [0.0, 0, 0]
        return stats


class UserRate:
    """One user's message and byte buckets, from which credit shaping grants link-credit.

    Messages and bytes are charged when the client sends them (:meth:`used`); both buckets may
    go into debt (a message larger than the bytes left is let through, and the next grants
    wait until the debt is paid). The core grants a link at most what the buckets hold minus
    the credit that link still has (:meth:`credit`), so one link never exceeds the rate; the
    user's other links can each add the credit they hold to a burst, and the debt that follows
    keeps the long-run rate.
    """

    __slots__ = ("owner", "vhost", "group", "user", "message_rate", "byte_rate",
                 "message_burst", "byte_burst", "message_tat", "byte_tat", "mean_bytes",
                 "refs", "waiting", "waiting_since")

    def __init__(self, owner: RateLimits, vhost: str, group: str, user: str = "") -> None:
        """Full buckets; rates set by :meth:`set_rates`."""
        self.owner = owner
        self.vhost = vhost
        self.group = group
        self.user = user
        self.message_rate = 0.0
        self.byte_rate = 0.0
        self.message_burst = 1.0
        self.byte_burst = 1.0
        self.message_tat = -math.inf
        self.byte_tat = -math.inf
        self.mean_bytes: float | None = None
        """Running mean of payload bytes per message (None until the first message)."""
        self.refs = 0
        self.waiting = 0
        """Links of this user waiting for tokens with no credit left (throttled)."""
        self.waiting_since: float | None = None

    def set_rates(self, message_rate: float | None, byte_rate: float | None) -> None:
        """Messages and bytes per second (None or 0: that bucket is unlimited); each burst is
        :data:`SHAPING_BURST_SECONDS` worth, at least one message (or byte)."""
        self.message_rate = float(message_rate or 0)
        self.byte_rate = float(byte_rate or 0)
        self.message_burst = max(1.0, math.floor(self.message_rate * SHAPING_BURST_SECONDS))
        self.byte_burst = max(1.0, self.byte_rate * SHAPING_BURST_SECONDS)

    def full_at(self) -> float:
        """When both buckets are full again (loop-clock seconds)."""
        return max(self.message_tat, self.byte_tat)

    def cap(self) -> int:
        """The most credit one link may hold: one burst (in messages of the mean size); a
        link gets more once it used half of it."""
        cap = math.inf
        if self.message_rate:
            cap = self.message_burst
        if self.byte_rate:
            cap = min(cap, self.byte_burst / self._mean())
        return max(1, int(cap)) if cap != math.inf else 1 << 30

    def chunk(self) -> int:
        """Fewest credits worth a Flow to a link that still has some: about 10 ms of the
        rate, so a fast user gets at most about 100 top-ups a second per link."""
        chunk = math.inf
        if self.message_rate:
            chunk = self.message_rate / 100
        if self.byte_rate:
            chunk = min(chunk, self.byte_rate / 100 / self._mean())
        return max(1, int(chunk)) if chunk != math.inf else 1

    def _mean(self) -> float:
        mean = self.mean_bytes
        return self.byte_burst if mean is None else max(1.0, mean)

    def credit(self, held: int, now: float) -> int:
        """Credits a link holding ``held`` may be granted now (may be <= 0)."""
        n = math.inf
        if self.message_rate:
            n = math.floor(tokens_at(self.message_tat, self.message_rate, self.message_burst,
                                     now) + EPSILON) - held
        if self.byte_rate:
            left = tokens_at(self.byte_tat, self.byte_rate, self.byte_burst, now)
            if left <= 0:
                return 0
            n = min(n, math.ceil(left / self._mean()) - held)
        return int(n) if n != math.inf else 1 << 30

    def wait(self, need: int, now: float) -> float:
        """Seconds until :meth:`credit` reaches ``need`` for a link holding no credit
        (0: now; capped at one second, the caller asks again)."""
        wait = 0.0
        if self.message_rate:
            short = need - tokens_at(self.message_tat, self.message_rate, self.message_burst, now)
            wait = max(wait, short / self.message_rate)
        if self.byte_rate:
            want = min(self.byte_burst, (need - 1) * self._mean()) + 1e-9
            short = want - tokens_at(self.byte_tat, self.byte_rate, self.byte_burst, now)
            wait = max(wait, short / self.byte_rate)
        return min(1.0, max(0.0, wait))

    def used(self, messages: int, nbytes: int, now: float) -> None:
        """Charge what the client sent: ``messages`` started (0 or 1) and ``nbytes`` of
        payload (either bucket may go into debt)."""
        if self.message_rate and messages:
            self.message_tat = charged(self.message_tat, self.message_rate, now, messages)
        if self.byte_rate and nbytes:
            self.byte_tat = charged(self.byte_tat, self.byte_rate, now, nbytes)
        stats = self.owner._stats(self.vhost, self.group)
        stats[1] += messages
        stats[2] += nbytes

    def sized(self, nbytes: int) -> None:
        """A whole message of ``nbytes`` payload was sent: the running mean that turns the
        byte bucket into credits follows it."""
        mean = self.mean_bytes
        self.mean_bytes = float(nbytes) if mean is None else mean + MEAN_WEIGHT * (nbytes - mean)

    def throttled(self, on: bool, now: float) -> None:
        """A link of this user starts (``on``) or stops waiting for tokens with no credit;
        the user is throttled while any link waits."""
        if on:
            self.waiting += 1
            if self.waiting == 1:
                self.waiting_since = now
            return
        self.waiting -= 1
        if self.waiting <= 0:
            self.waiting = 0
            since = self.waiting_since
            self.waiting_since = None
            if since is not None:
                self.owner._stats(self.vhost, self.group)[0] += max(0.0, now - since)
