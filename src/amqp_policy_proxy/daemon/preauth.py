"""The pre-authentication memory budget: bytes held for connections not yet admitted.

A connection holds bytes before its Open is decided: a partial frame (at most one frame of
64 KiB before the Open, the core's ``PRE_OPEN_FRAME_LIMIT``), what waits for the upstream
connection, frames pipelined behind the Open. Each connection is bounded, but their sum grows
with the number of unauthenticated connections: 2,000 of them holding one 64 KiB partial frame
each took a process from 47 to 178 MiB, and the global connection limit (65,535 by default)
allowed about 4 GiB.

:class:`PreauthBudget` keeps the sum under a process-wide budget. Over the budget, every
connection still before its admission stops being read (it waits: its bytes stay where they
are, in the kernel) and new connections are refused at accept, counted as
``preauth_memory``; once the sum falls to three quarters of the budget (admissions, closes,
the handshake timeout of the connections that hold bytes and send nothing more), reading
resumes. Admitted connections are never paused by it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

logger = logging.getLogger(__name__)

#: Default budget in bytes (the ``preauth_buffer_bytes`` setting).
DEFAULT_BUDGET = 64 * 1024 * 1024


class Pausable(Protocol):
    """A client leg the budget can stop and restart reading."""

    def budget_pause(self) -> None:
        """Stop reading this client (over budget)."""

    def budget_resume(self) -> None:
        """Read this client again."""


class PreauthBudget:
    """Process-wide accounting of the bytes held by connections not yet admitted.

    Used only on the event loop. O(1) per update; O(connections) once per transition into
    or out of the over-budget state.
    """

    __slots__ = ("limit", "held", "over", "refused", "_by_conn", "_paused")

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        """Create an empty budget.

        Args:
            limit: the budget in bytes (> 0).
        """
        self.limit = limit
        self.held = 0
        """Bytes held now by connections not yet admitted."""
        self.over = False
        """True from when ``held`` passed ``limit`` until it fell to three quarters of it."""
        self.refused = 0
        """Connections refused at accept because the budget was exhausted."""
        self._by_conn: dict[object, int] = {}
        self._paused: list[Pausable] = []

    def update(self, conn: object, held: int, waiting: Iterable[Pausable]) -> None:
        """Record that ``conn`` now holds ``held`` bytes (0: admitted or gone).

        Args:
            conn: the connection (any hashable key; its client leg).
            held: bytes it holds now.
            waiting: every connection not yet admitted, called only on the transition into
                the over-budget state (their reading stops).
        """
        old = self._by_conn.pop(conn, 0)
        if held:
            self._by_conn[conn] = held
        self.held += held - old
        if not self.over and self.held > self.limit:
            self.over = True
            logger.warning("pre-authentication buffers hold %d bytes, over the budget of %d: "
                           "connections not yet admitted wait, new ones are refused",
                           self.held, self.limit)
            for proto in waiting:
                proto.budget_pause()
                self._paused.append(proto)
        elif self.over and self.held <= self.limit * 3 // 4:
            self.over = False
            paused, self._paused = self._paused, []
            logger.info("pre-authentication buffers back to %d bytes: reading resumed",
                        self.held)
            for proto in paused:
                proto.budget_resume()

    def accept(self) -> bool:
        """Whether a new connection may be accepted now (counts a refusal when not)."""
        if self.over:
            self.refused += 1
            return False
        return True
