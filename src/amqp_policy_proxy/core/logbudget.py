"""Sans-IO. The denial log lines of one connection, rate-limited (denial floods).

A client can provoke a denial per frame (an Attach to a denied target and a Detach, over and
over): 117,000 denials in 40 s made 20 MB of log. Every denial is still counted (metrics) and
recorded (the event log); only the INFO line is budgeted: the first :data:`BURST` lines of a
connection, then at most one summary line per :data:`INTERVAL` seconds saying how many lines
were left out, and a last summary when the connection ends.
"""

from __future__ import annotations

import logging
from typing import Final

BURST: Final = 10
"""Denial lines of one connection logged in full before the budget applies."""
INTERVAL: Final = 10.0
"""Seconds between two summary lines of one connection (loop clock)."""


class LogBudget:
    """The denial-line budget of one connection."""

    __slots__ = ("left", "suppressed", "since")

    def __init__(self) -> None:
        """A full budget: :data:`BURST` lines."""
        self.left = BURST
        self.suppressed = 0
        """Lines left out since the last summary."""
        self.since: float | None = None
        """When the lines counted in ``suppressed`` started being left out (loop clock)."""

    def log(self, logger: logging.Logger, conn_id: str, now: float, msg: str,
            *args: object) -> None:
        """Log one denial line ``msg % args`` at INFO if the budget allows; else count it,
        and log a summary once :data:`INTERVAL` seconds have passed since the last one.

        Args:
            logger: the core module's logger (the line keeps its logger name).
            conn_id: the connection id the summary names.
            now: loop-clock seconds.
        """
        if self.left > 0:
            self.left -= 1
            logger.info(msg, *args)
            return
        if self.since is None:
            self.since = now
        self.suppressed += 1
        if now - self.since >= INTERVAL:
            self.flush(logger, conn_id, now)

    def flush(self, logger: logging.Logger, conn_id: str, now: float) -> None:
        """Log the summary of the lines left out, if any (also when the connection ends)."""
        if not self.suppressed:
            return
        since = self.since if self.since is not None else now
        logger.info("[%s] %d more denial lines of this connection not logged in the last %.0f s "
                    "(every denial is counted and in the event log)", conn_id, self.suppressed,
                    max(0.0, now - since))
        self.suppressed = 0
        self.since = now
