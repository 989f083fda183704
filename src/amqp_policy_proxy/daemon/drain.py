"""Stopping: SIGTERM drains (every client gets a Close and the grace period to answer it), a
second signal exits at once.

:class:`StopRequest` is what the signal handlers set (they only schedule, gunicorn's rule);
:func:`drain_connections` is the drain itself; :func:`log_stop` the one line that ends a run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["StopRequest", "drain_connections", "log_stop"]

logger = logging.getLogger(__name__)


class StopRequest:
    """A requested stop: its reason, and whether the drain may be waited for.

    Attributes:
        reason: why (``SIGTERM``, ``SIGINT``, ``requested``...): the first request's.
        force: exit without waiting for the drain (a second request, or ``force``).
    """

    def __init__(self) -> None:
        """No stop requested; :meth:`start` on the loop before :meth:`request`."""
        self.reason = "requested"
        self.force = False
        self._stop: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None

    def start(self) -> None:
        """Create the events on the running loop."""
        self._stop = asyncio.Event()
        self._drained = asyncio.Event()

    def request(self, force: bool = False, reason: str = "requested") -> None:
        """Ask for a drain and exit; a second request (or ``force``) ends the wait for the
        drain at once. Before :meth:`start`: nothing."""
        if self._stop is None:
            return
        if not self._stop.is_set():
            self.reason = reason
        if self._stop.is_set() or force:
            self.force = True
            self.drained()
        self._stop.set()

    async def wait(self) -> None:
        """Until a stop is requested."""
        assert self._stop is not None, "StopRequest.start() first"
        await self._stop.wait()

    def drained(self) -> None:
        """The last client is gone (or the wait is given up)."""
        if self._drained is not None:
            self._drained.set()

    async def wait_drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`drained`; False on the timeout."""
        assert self._drained is not None, "StopRequest.start() first"
        try:
            await asyncio.wait_for(self._drained.wait(), timeout=timeout)
        except TimeoutError:
            return False
        return True


async def drain_connections(connections: Mapping[str, Any], servers: Iterable[Any],
                            stop: StopRequest, grace_seconds: float) -> tuple[int, int]:
    """Stop accepting, send every client the core's shutdown Close, wait for them to go.

    Each client has the core's linger time to answer its Close; ``grace_seconds`` bounds the
    whole drain, and a forced stop does not wait at all. Whoever is left is aborted.

    Args:
        connections: the open client transports (they remove themselves as they close, and
            the last one calls :meth:`StopRequest.drained`).
        servers: the listeners' servers (closed first).

    Returns:
        ``(open when the drain began, cut after the grace period)``.
    """
    open_at_stop = len(connections)
    for server in servers:
        server.close()
    for proto in list(connections.values()):
        conn = proto.conn
        if conn is not None and not proto.closed:
            proto.run(conn.begin_shutdown)
    if connections and not stop.force and not await stop.wait_drained(grace_seconds):
        logger.warning("%d connections still open after the grace period", len(connections))
    cut = len(connections)
    for proto in list(connections.values()):
        proto.abort()
    await asyncio.sleep(0)
    return open_at_stop, cut


def log_stop(reason: str, open_at_stop: int, cut: int, seconds: float) -> None:
    """The stop line: the reason, how many connections closed within the grace period
    (drained) and how many were cut, and the seconds the shutdown took (also as ``extra``
    fields, ``event`` ``"stop"``, for the JSON log format)."""
    drained = open_at_stop - cut
    logger.info("stopped (%s): %d connection%s drained, %d cut after the grace period, "
                "in %.1f s", reason, drained, "" if drained == 1 else "s", cut, seconds,
                extra={"event": "stop", "reason": reason, "drained": drained, "cut": cut,
                       "seconds": round(seconds, 3)})
