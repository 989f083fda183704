"""Layer 5. The rate limits of a fleet: connection rates decided in the store with the counts,
the process's own buckets in the fallback (docs/fleet.md "Which limit has which scope").

While the fleet ledger's store decides (mode ``redis``), the admission script
(:data:`~.scripts.ADMIT`) checks ``maxConnectionRate``, ``maxConnectionRatePerUser`` and
``maxConnectionRatePerHost`` in buckets every proxy shares, in the same atomic call as the
counts, so the rate the core checks after the ledger's answer has been decided already. While
the store is unreachable the process's own buckets
(:class:`~amqp_policy_proxy.limits.rates.RateLimits`) decide as the failure mode says:
``local-share`` and ``closed`` divide each rate by the proxies last seen alive, ``open``
checks the full rate; the tokens taken then are charged to the store's buckets before it
decides again.

Credit shaping (``maxMessageRatePerUser``, ``maxByteRatePerUser``) draws on a user's buckets
in the store too (:class:`FleetUserRate`): each proxy takes a small allotment of whole
tokens at a time and grants link-credit from it only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..limits.rates import EPSILON, RateLimits, UserRate, connection_rates
from ..policy.reasons import ConnectionDenyReason
from . import scripts
from .ledger import STORE, FleetLedger

if TYPE_CHECKING:
    from ..policy.model import GroupSettings, VhostPolicy


class FleetRates:
    """The connection-rate and shaping buckets a connection of a fleet proxy uses (the core's
    ``AdmissionRates`` and ``ShapingBuckets``).

    Args:
        local: the process's own buckets (the daemon's :class:`RateLimits`).
        ledger: the fleet ledger whose store decides the connection rates.
    """

    __slots__ = ("local", "ledger")

    def __init__(self, local: RateLimits, ledger: FleetLedger) -> None:
        self.local = local
        self.ledger = ledger
        local.bucket_factory = self._bucket

    def _bucket(self, owner: RateLimits, vhost: str, group: str, user: str) -> UserRate:
        """A user's shaping buckets that draw their tokens from the store."""
        return FleetUserRate(owner, self.ledger, vhost, group, user)

    def try_admit(
        self, *, vhost: VhostPolicy, group: GroupSettings, user: str, remote_host: str,
        now: float,
    ) -> ConnectionDenyReason | None:
        """Connection rates after the ledger's answer: None when the store decided them with
        the counts (its mode is ``redis``); else this process's buckets, each rate divided by
        the live proxies (``local-share``, ``closed``) or whole (``open``), the tokens taken
        remembered for the store.

        Returns:
            None when admitted, else the first rate without a token.
        """
        ledger = self.ledger
        if ledger.mode == STORE:
            return None
        share = 1 if ledger.mode == "open" else max(1, ledger.proxies_alive)
        reason = self.local.try_admit(vhost=vhost, group=group, user=user,
                                      remote_host=remote_host, now=now, share=share)
        if reason is None:
            rates = connection_rates(vhost, group)
            if any(rates[:3]):
                ledger.charge_rates(vhost.hostname, user, remote_host, rates)
        return reason

    def acquire(self, *, vhost: str, group: str, user: str, message_rate: int | None,
                byte_rate: int | None, now: float) -> UserRate:
        """The user's message and byte buckets (:class:`FleetUserRate`: drawn from the
        store's, shared by the fleet), shared with the user's other connections here."""
        return self.local.acquire(vhost=vhost, group=group, user=user,
                                  message_rate=message_rate, byte_rate=byte_rate, now=now)

    def release(self, bucket: Any, now: float) -> None:
        """One connection of the bucket's user is gone."""
        self.local.release(bucket, now)


#: Seconds of a user's rate a proxy takes from the store's buckets at a time (its allotment);
#: at most a bucket's burst.
ALLOTMENT_SECONDS = 0.05
#: Seconds before a link waiting for tokens is looked at again while tokens are asked of the
#: store (a round trip: well under a millisecond on a LAN).
ASK_WAIT = 0.005


class FleetUserRate(UserRate):
    """A user's message and byte buckets drawn from the store, shared by every proxy.

    While the store decides, the proxy grants link-credit only from an *allotment*: whole
    tokens taken from the user's buckets in the store (:data:`~.scripts.TAKE`, about
    :data:`ALLOTMENT_SECONDS` of the rate at a time), so the fleet together never grants more
    than the rate plus one burst; what a connection used beyond its allotment (a message
    larger than the bytes left) is charged to the store with the next request. While the store
    is unreachable the process's own buckets decide (:class:`UserRate`) at a share of each
    rate (the proxies last seen alive; the whole rate in ``open``), and what they let through
    is charged to the store once it is back.

    Args:
        owner: the process's :class:`RateLimits` (the totals).
        ledger: the fleet ledger that talks to the store.
        vhost, group, user: whose buckets.
    """

    __slots__ = ("ledger", "keys", "full", "share", "m_allot", "b_allot", "m_debt", "b_debt",
                 "asking", "empty_until", "last_now")

    def __init__(self, owner: RateLimits, ledger: FleetLedger, vhost: str, group: str,
                 user: str = "") -> None:
        self.ledger = ledger
        self.keys = scripts.shaping_keys(vhost, user)
        self.full = (0, 0)
        """The group's message and byte rates (the store's buckets have these)."""
        self.share = 1
        self.m_allot = self.b_allot = 0.0
        """Tokens taken from the store and not used yet."""
        self.m_debt = self.b_debt = 0.0
        """Used beyond the allotment (or in the fallback): charged with the next request."""
        self.asking = False
        self.empty_until = -math.inf
        """The store had no token: not asked again before (loop clock)."""
        self.last_now = 0.0
        UserRate.__init__(self, owner, vhost, group, user)

    def set_rates(self, message_rate: float | None, byte_rate: float | None) -> None:
        """The group's rates (the store's buckets and, divided, the fallback's)."""
        self.full = (int(message_rate or 0), int(byte_rate or 0))
        self.share = 1
        UserRate.set_rates(self, message_rate, byte_rate)

    def _storing(self, now: float) -> bool:
        """Whether the store decides now; the fallback's share of the rates applied."""
        self.last_now = now
        ledger = self.ledger
        if ledger.mode == STORE:
            share = 1
        else:
            share = 1 if ledger.mode == "open" else max(1, ledger.proxies_alive)
        if share != self.share:
            self.share = share
            m, b = self.full
            UserRate.set_rates(self, m / share if m else None, b / share if b else None)
        return share == 1 and ledger.mode == STORE

    def _ask(self, now: float) -> None:
        """Top the allotment up to :data:`ALLOTMENT_SECONDS` of each rate (at most a burst),
        charging the debt, unless a request is under way or the store was empty."""
        if self.asking or now < self.empty_until:
            return
        m_rate, b_rate = self.full
        want_m = min(self.message_burst, max(1.0, math.ceil(m_rate * ALLOTMENT_SECONDS)))
        want_b = min(self.byte_burst, max(1.0, math.ceil(b_rate * ALLOTMENT_SECONDS)))
        need_m = max(0, math.ceil(want_m - self.m_allot)) if m_rate else 0
        need_b = max(0, math.ceil(want_b - self.b_allot)) if b_rate else 0
        if not need_m and not need_b and not self.m_debt and not self.b_debt:
            return
        if need_m < want_m / 2 and need_b < want_b / 2 and not self.m_debt and not self.b_debt:
            return  # more than half the allotment left
        debts = (self.m_debt, self.b_debt)
        args = (m_rate, self.message_burst, debts[0], need_m,
                b_rate, self.byte_burst, debts[1], need_b)

        def done(taken: tuple[int, int] | None) -> None:
            self.asking = False
            if taken is None:  # not charged: charge it with the next request
                self.m_debt += debts[0]
                self.b_debt += debts[1]
                return
            self.m_allot += taken[0]
            self.b_allot += taken[1]
            if (m_rate and taken[0] < need_m and self.m_allot < 1) or (
                    b_rate and taken[1] < need_b and self.b_allot <= 0):
                self.empty_until = self.last_now + min(
                    1.0, max(1 / m_rate if m_rate else 0.0, ASK_WAIT))

        if self.ledger.take_tokens(self.keys, args, done):
            self.asking = True
            self.m_debt = self.b_debt = 0.0

    def credit(self, held: int, now: float) -> int:
        """Credits a link holding ``held`` may be granted now: from the allotment (asking
        for more as it runs low), or the fallback's own buckets."""
        if not self._storing(now):
            return UserRate.credit(self, held, now)
        self._ask(now)
        n = math.inf
        if self.full[0]:
            n = math.floor(self.m_allot + EPSILON) - held
        if self.full[1]:
            if self.b_allot <= 0:
                return 0
            n = min(n, math.ceil(self.b_allot / self._mean()) - held)
        return int(n) if n != math.inf else 1 << 30

    def wait(self, need: int, now: float) -> float:
        """Seconds before a waiting link is looked at again: a store round trip (or until
        the store's buckets have a token again), or the fallback's own wait."""
        if not self._storing(now):
            return UserRate.wait(self, need, now)
        self._ask(now)
        if not self.asking and now < self.empty_until:
            return max(ASK_WAIT, self.empty_until - now)
        return ASK_WAIT

    def used(self, messages: int, nbytes: int, now: float) -> None:
        """Charge what the client sent: the allotment (beyond it, a debt for the store), and
        the fallback's own buckets (which so know the recent rate when they take over)."""
        UserRate.used(self, messages, nbytes, now)
        if not self._storing(now):
            self.m_debt += messages if self.full[0] else 0
            self.b_debt += nbytes if self.full[1] else 0
            return
        if self.full[0] and messages:
            self.m_allot -= messages
            if self.m_allot < 0:
                self.m_debt -= self.m_allot
                self.m_allot = 0.0
        if self.full[1] and nbytes:
            self.b_allot -= nbytes
            if self.b_allot < 0:
                self.b_debt -= self.b_allot
                self.b_allot = 0.0
        self._ask(now)
