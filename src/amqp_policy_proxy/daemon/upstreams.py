"""Upstream health: which routers to try first, remembered between connections.

Every client connection tries the configured upstreams in order. Without memory, each client
of a dead first upstream would wait out its whole connect timeout (``connect_seconds``) before
trying the next one. :class:`UpstreamHealth` remembers a failed upstream for a back-off period
that doubles with each consecutive failure (1 s, 2 s, 4 s ... capped at 30 s) and is forgotten
at the first success: while an upstream is backed off, new connections try the others first,
and it is still tried last (so a recovered router is found even when every upstream is backed
off). The loop-clock time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

#: First back-off after a failure, seconds.
BACKOFF_INITIAL = 1.0
#: Longest back-off, seconds.
BACKOFF_MAX = 30.0

U = TypeVar("U")


class UpstreamHealth(Generic[U]):
    """Consecutive failures and back-off deadlines per upstream (any hashable key)."""

    __slots__ = ("_failures", "_until", "_known")

    def __init__(self) -> None:
        """No upstream has failed yet."""
        self._failures: dict[U, int] = {}
        self._until: dict[U, float] = {}
        self._known: dict[U, bool] = {}

    def order(self, upstreams: Sequence[U], now: float) -> list[U]:
        """The upstreams to try, in order: healthy ones first (configured order), then the
        backed-off ones, soonest to recover first."""
        healthy = [u for u in upstreams if self._until.get(u, 0.0) <= now]
        if len(healthy) == len(upstreams):
            return list(upstreams)
        resting = sorted((u for u in upstreams if self._until.get(u, 0.0) > now),
                         key=lambda u: self._until[u])
        return healthy + resting

    def failed(self, upstream: U, now: float) -> float:
        """Record a failed connect; return the back-off in seconds now in force."""
        n = self._failures.get(upstream, 0) + 1
        self._failures[upstream] = n
        # the exponent is capped: past ~1,000 failures in a row 2**n no longer fits a float
        backoff = min(BACKOFF_MAX, BACKOFF_INITIAL * 2 ** min(n - 1, 32))
        self._until[upstream] = now + backoff
        self._known[upstream] = False
        return backoff

    def succeeded(self, upstream: U) -> None:
        """Record a successful connect or probe: the upstream is healthy again."""
        self._failures.pop(upstream, None)
        self._until.pop(upstream, None)
        self._known[upstream] = True

    def known(self, upstream: U) -> bool | None:
        """True when the last connect or probe of ``upstream`` succeeded, False when it
        failed, None before any (``status``: up, down, unknown)."""
        return self._known.get(upstream)

    def all_down(self, upstreams: Sequence[U], now: float) -> bool:
        """Every upstream's last connect or probe failed and its back-off runs: a new client
        is answered at once (nobody can authenticate it)."""
        return bool(upstreams) and all(
            self._known.get(u) is False and self._until.get(u, 0.0) > now for u in upstreams)

    def is_up(self, upstream: U, now: float) -> bool:
        """False while ``upstream`` is in its back-off period."""
        return self._until.get(upstream, 0.0) <= now

    def failures(self, upstream: U) -> int:
        """Consecutive failed connects of ``upstream`` (0 once it connects)."""
        return self._failures.get(upstream, 0)
