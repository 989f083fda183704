"""Sans-IO. Automatic quarantine: who collected ``denials`` denials within ``withinSeconds``
(the vhost key ``quarantine``, docs/policy.md "Quarantine").

The daemon feeds every denial event it counts (:class:`DenialCounter.record`) with the time;
the counter says when a key (a vhost and a user, or a vhost and a client address) reached its
threshold, and then starts that key over, so one burst triggers one ban. The counter keeps at
most ``max_keys`` keys (the least recently denied go first: a flood of one-off addresses
cannot grow it without bound) and each key at most ``denials`` times. No I/O, no clock: ``now``
is always an argument.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable

__all__ = ["MAX_KEYS", "DenialCounter"]

#: Keys remembered at most (about 200 bytes each with a threshold of 10).
MAX_KEYS = 65536


class DenialCounter:
    """Sliding-window denial counts per key.

    Args:
        max_keys: keys remembered at most (the least recently denied are forgotten first).

    Raises:
        ValueError: ``max_keys`` below 1.
    """

    __slots__ = ("max_keys", "_keys")

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.max_keys = max_keys
        self._keys: OrderedDict[Hashable, tuple[deque[float], float]] = OrderedDict()

    def __len__(self) -> int:
        """Keys remembered."""
        return len(self._keys)

    def record(self, key: Hashable, denials: int, within: float, now: float) -> bool:
        """Count one denial of ``key`` at ``now``.

        Args:
            key: who was denied (e.g. ``(vhost, "user", name)``).
            denials: the threshold N (at least 1).
            within: the window S, seconds.
            now: the caller's clock, seconds (never decreasing).

        Returns:
            True when this denial is the N-th within S seconds: the key is then started over
            (its next denials count from zero).

        Raises:
            ValueError: ``denials`` below 1 or ``within`` negative.
        """
        if denials < 1 or within < 0:
            raise ValueError("denials must be at least 1 and within not negative")
        entry = self._keys.get(key)
        if entry is None or entry[0].maxlen != denials:
            times: deque[float] = deque(maxlen=denials)
        else:
            times = entry[0]
        times.append(now)
        if len(times) == denials and now - times[0] <= within:
            self._keys.pop(key, None)
            return True
        self._keys[key] = (times, within)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        return False

    def count(self, key: Hashable, now: float) -> int:
        """Denials of ``key`` within its window at ``now``."""
        entry = self._keys.get(key)
        if entry is None:
            return 0
        times, within = entry
        return sum(1 for t in times if now - t <= within)

    def forget(self, key: Hashable) -> None:
        """Start ``key`` over (nothing when unknown)."""
        self._keys.pop(key, None)

    def prune(self, now: float) -> int:
        """Forget the keys whose last denial is older than their window.

        Returns:
            How many were forgotten.
        """
        stale = [k for k, (times, within) in self._keys.items() if now - times[-1] > within]
        for key in stale:
            del self._keys[key]
        return len(stale)
