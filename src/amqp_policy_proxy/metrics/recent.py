"""Sans-IO. Failed authentications per client host in a sliding window, bounded: the
``amqp_proxy_sasl_failure_hosts`` gauge (the hosts with the most failures in the last minute,
at most :data:`TOP`), so that an alert can name the host a brute force comes from without a
label per client address in the counters."""

from __future__ import annotations

from collections import Counter, deque

#: Seconds a failure counts.
WINDOW = 60.0
#: Hosts exported at most.
TOP = 10
#: Failures remembered at most (older ones are dropped first: a flood bounds memory).
MAX_KEPT = 100_000


class RecentFailures:
    """Failures by host in the last :data:`WINDOW` seconds (loop clock, ``now`` passed in)."""

    __slots__ = ("_events", "_counts")

    def __init__(self) -> None:
        """No failure yet."""
        self._events: deque[tuple[float, str]] = deque()
        self._counts: Counter[str] = Counter()

    def add(self, host: str, at: float) -> None:
        """One failure from ``host`` at ``at``."""
        self._events.append((at, host))
        self._counts[host] += 1
        if len(self._events) > MAX_KEPT:
            self._drop_oldest()

    def top(self, now: float, n: int = TOP) -> tuple[tuple[str, int], ...]:
        """The ``n`` hosts with the most failures within the window ending at ``now``."""
        events = self._events
        while events and events[0][0] < now - WINDOW:
            self._drop_oldest()
        return tuple(self._counts.most_common(n))

    def _drop_oldest(self) -> None:
        _, host = self._events.popleft()
        left = self._counts[host] - 1
        if left:
            self._counts[host] = left
        else:
            del self._counts[host]
