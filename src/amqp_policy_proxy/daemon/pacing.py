"""Daemon layer. Paced closes: close a list of targets at N per second, with jitter, on the
event loop, so that a mass disconnect does not become a reconnect storm
(``connections close ... --rate N``; re-evaluation closes may use it too).

The schedule is :func:`schedule`: target *i* of *n* is closed at ``(i + jitter * u_i) / rate``
seconds after the start, ``u_i`` uniform in [0, 1): one close in each ``1 / rate`` slot, at a
random moment of it (``jitter`` 1, the default), or at the slot's start (``jitter`` 0). The
whole list takes about ``n / rate`` seconds, and no two clients that reconnect at once after
their Close were closed at the same instant. One loop timer at a time drives it; each firing
closes every target that is due (a rate above the loop's timer resolution closes several per
firing), so a list of 100,000 costs one timer, not 100,000.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

__all__ = ["MAX_RATE", "PacedCloser", "schedule"]

T = TypeVar("T")

#: Highest accepted rate, closes per second (above it, close at once instead).
MAX_RATE = 1_000_000.0


def schedule(n: int, rate: float, jitter: float = 1.0,
             rng: random.Random | None = None) -> list[float]:
    """When to close each of ``n`` targets, seconds after the start (see the module).

    Args:
        n: how many targets.
        rate: closes per second (more than 0).
        jitter: the part of each ``1 / rate`` slot a close may move within, 0 to 1.
        rng: the random source (tests pass a seeded one).

    Returns:
        ``n`` offsets, non-decreasing, the first in ``[0, jitter / rate)``.

    Raises:
        ValueError: ``rate`` not more than 0 or above :data:`MAX_RATE`, or ``jitter``
            outside 0 to 1.
    """
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate must be more than 0 and at most {MAX_RATE:g} per second")
    if not 0.0 <= jitter <= 1.0:
        raise ValueError("jitter must be from 0 to 1")
    draw = (rng or random.Random()).random
    return [(i + jitter * draw()) / rate for i in range(n)]


class PacedCloser(Generic[T]):
    """Closes ``targets`` at ``rate`` per second with jitter (see the module docstring).

    Args:
        loop: the event loop to run on.
        targets: what to close, in order.
        close: ``close(target)`` closes one; it returns False when there was nothing to
            close any more (the target went away meanwhile: counted as skipped). An
            exception is logged and counted as skipped; the others go on.
        rate: closes per second.
        jitter: see :func:`schedule`.
        rng: the random source of the jitter.

    Raises:
        ValueError: as :func:`schedule`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, targets: Sequence[T],
                 close: Callable[[T], bool], rate: float, *, jitter: float = 1.0,
                 rng: random.Random | None = None) -> None:
        self.loop = loop
        self.targets = list(targets)
        self.rate = rate
        self._close = close
        self._offsets = schedule(len(self.targets), rate, jitter, rng)
        self._next = 0
        self._timer: asyncio.TimerHandle | None = None
        self.closed = 0
        """Targets closed so far."""
        self.skipped = 0
        """Targets that were gone (or failed to close)."""
        self.started_at: float | None = None
        """Loop-clock seconds of :meth:`start`."""
        self.finished_at: float | None = None
        """Loop-clock seconds when the last target was handled (or it was cancelled)."""
        self.cancelled = False
        self.done: asyncio.Future[None] = loop.create_future()
        """Resolved once every target was handled, or at :meth:`cancel`."""

    @property
    def total(self) -> int:
        """How many targets there are."""
        return len(self.targets)

    @property
    def remaining(self) -> int:
        """Targets not handled yet."""
        return self.total - self._next

    def start(self) -> PacedCloser[T]:
        """Start closing (the first close is due within ``jitter / rate`` seconds)."""
        if self.started_at is not None:
            return self
        self.started_at = self.loop.time()
        self._arm()
        return self

    def cancel(self) -> None:
        """Stop: the targets not closed yet stay open."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.done.done():
            self.cancelled = True
            self._finish()

    def progress(self) -> dict[str, Any]:
        """``total``, ``closed``, ``skipped``, ``remaining``, ``rate``, ``elapsed_seconds``,
        ``eta_seconds`` (until the last close is due), ``done``, ``cancelled``."""
        now = self.loop.time()
        started = self.started_at if self.started_at is not None else now
        end = self.finished_at if self.finished_at is not None else now
        eta = 0.0
        if self._next < self.total and self.started_at is not None:
            eta = max(0.0, started + self._offsets[-1] - now)
        return {"total": self.total, "closed": self.closed, "skipped": self.skipped,
                "remaining": self.remaining, "rate": self.rate,
                "elapsed_seconds": round(end - started, 3), "eta_seconds": round(eta, 3),
                "done": self.done.done(), "cancelled": self.cancelled}

    def _arm(self) -> None:
        assert self.started_at is not None
        if self._next >= self.total:
            self._finish()
            return
        self._timer = self.loop.call_at(self.started_at + self._offsets[self._next],
                                        self._fire)

    def _fire(self) -> None:
        self._timer = None
        assert self.started_at is not None
        due = self.loop.time() - self.started_at
        offsets, targets = self._offsets, self.targets
        while self._next < self.total and offsets[self._next] <= due:
            target = targets[self._next]
            self._next += 1
            try:
                ok = self._close(target)
            except Exception:  # one target's failure must not stop the others
                logger.exception("paced close of %r failed", target)
                ok = False
            if ok:
                self.closed += 1
            else:
                self.skipped += 1
        self._arm()

    def _finish(self) -> None:
        self.finished_at = self.loop.time()
        if not self.done.done():
            self.done.set_result(None)
