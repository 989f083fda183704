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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..limits.rates import RateLimits, UserRate, connection_rates
from ..policy.reasons import ConnectionDenyReason
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
        """The user's message and byte buckets (this process's: see docs/fleet.md)."""
        return self.local.acquire(vhost=vhost, group=group, user=user,
                                  message_rate=message_rate, byte_rate=byte_rate, now=now)

    def release(self, bucket: Any, now: float) -> None:
        """One connection of the bucket's user is gone."""
        self.local.release(bucket, now)
