"""Shell-side. After a reload, every open connection checked against the new policy
(``[policy] reevaluate_open``; the decisions are the core's:
:meth:`~..core.connection.ProxyConnection.reevaluate`).

The work is bounded: connections are re-checked for at most :data:`SLICE` seconds at a time,
the event loop runs in between, so a reload with 10,000 open connections and 100,000 links
never holds the loop for more than a few milliseconds at a time. A connection that arrived under the
old policy and is not admitted yet keeps the policy it was accepted under (its Open is decided
under it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds of re-checking between two turns of the event loop.
SLICE = 0.002


@dataclass(slots=True)
class Pass:
    """What one re-evaluation pass did (for the log line and the tests)."""

    connections: int = 0
    """Connections re-checked."""
    seconds: float = 0.0
    """Wall seconds from the first batch to the last."""
    longest_slice: float = 0.0
    """The longest time the event loop was held at once (seconds)."""
    to_close: list[Any] = field(default_factory=list)
    """With ``close_later``: the connections (``ClientProtocol``) the policy no longer
    admits, marked and left open for the caller's paced close."""


async def reevaluate_open(connections: Mapping[str, Any], policy: Any, mode: str, *,
                          slice_seconds: float = SLICE, close_later: bool = False) -> Pass:
    """Re-check every open connection of ``connections`` (the daemon's, conn id ->
    ``ClientProtocol``) against ``policy`` in ``mode`` (``enforce``, ``shadow``; ``off`` does
    nothing), for at most about ``slice_seconds`` at a time with the loop running in between.
    A connection that is gone by its turn is skipped. With ``close_later`` a connection to
    close is only marked and listed in :attr:`Pass.to_close` (``[policy]
    reevaluate_close_rate``: the caller paces the closes). Never raises (a bug in one
    connection is contained by its relay).
    """
    done = Pass()
    if mode == "off":
        return done
    start = t0 = time.perf_counter()
    for conn_id in list(connections):
        proto = connections.get(conn_id)
        if proto is None:
            continue
        conn = proto.conn
        if conn is None or conn.finished:
            continue
        proto.run(lambda now, c=conn: c.reevaluate(policy, now, mode,
                                                   close_now=not close_later))
        done.connections += 1
        if conn.revocation_due:
            done.to_close.append(proto)
        held = time.perf_counter() - t0
        if held >= slice_seconds:
            done.longest_slice = max(done.longest_slice, held)
            await asyncio.sleep(0)
            t0 = time.perf_counter()
    done.longest_slice = max(done.longest_slice, time.perf_counter() - t0)
    done.seconds = time.perf_counter() - start
    return done
