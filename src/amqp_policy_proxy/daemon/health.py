"""Health and readiness: what ``/healthz``, ``/readyz``, ``status`` and a load balancer see.

:func:`readiness` decides whether clients should be sent here; :class:`Probes` is what the
metrics server's probe endpoints read. The event loop publishes readiness once a second
(:meth:`Probes.publish`, from the snapshot loop); the HTTP endpoints run in the metrics
server's thread and only read the last published answer, so a stalled loop shows as
unhealthy instead of as a stale "ready".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from .settings import UpstreamConfig
from .upstreams import UpstreamHealth

__all__ = ["LOOP_STALL_SECONDS", "Probes", "readiness"]

#: ``/healthz`` answers 503 when the event loop has not run its 1 s tick for this long.
LOOP_STALL_SECONDS = 5.0

Answer = tuple[bool, str]
"""``(ok, why)``: the probe's verdict and its one-line reason."""


class Serving(Protocol):
    """A listening server (asyncio's, or the PROXY-protocol listener)."""

    def is_serving(self) -> bool:
        """Whether it accepts connections."""
        ...


def readiness(*, draining: bool, policy_loaded: bool, servers: Sequence[Serving],
              upstreams: Sequence[UpstreamConfig], health: UpstreamHealth[UpstreamConfig],
              now: float, ledger_mode: str) -> Answer:
    """Whether a load balancer should send clients here, and why (``/readyz``).

    Ready while listening (not draining), with a policy loaded, at least one upstream known
    up by its last probe or connect and not in connect back-off (``health`` at loop time
    ``now``), and the ledger in a mode that admits (``closed`` does not).
    """
    if draining:
        return False, "draining"
    if not policy_loaded:
        return False, "no policy loaded"
    if not servers or not all(server.is_serving() for server in servers):
        return False, "not listening"
    if upstreams and not any(health.known(u) is True and health.is_up(u, now)
                             for u in upstreams):
        if all(health.known(u) is None for u in upstreams):
            return False, "no upstream probed yet"
        return False, "no upstream reachable (every one failed its last probe or connect)"
    if ledger_mode == "closed":
        return False, "ledger unreachable and failure_mode = closed"
    return True, f"ready: ledger {ledger_mode}"


class Probes:
    """The answers of ``/healthz`` and ``/readyz``, published by the event loop.

    Args:
        compute: the readiness verdict (:func:`readiness` of the daemon), called on the loop.
    """

    def __init__(self, compute: Callable[[], Answer]) -> None:
        """Not ready until the first :meth:`publish`."""
        self._compute = compute
        self._heartbeat = time.monotonic()
        self._ready: Answer = (False, "starting: no policy loaded yet")

    def publish(self) -> None:
        """On the loop: note that it runs (the heartbeat) and publish readiness now."""
        self._heartbeat = time.monotonic()
        self._ready = self._compute()

    def set_ready(self, answer: Answer) -> None:
        """Publish ``answer`` at once (``(False, "draining")`` when the drain starts)."""
        self._ready = answer

    def health(self) -> Answer:
        """``/healthz``: the event loop ran its 1 s tick in the last
        :data:`LOOP_STALL_SECONDS`."""
        stalled = time.monotonic() - self._heartbeat
        if stalled > LOOP_STALL_SECONDS:
            return False, f"event loop stalled for {stalled:.1f} s"
        return True, "ok"

    def ready(self) -> Answer:
        """``/readyz``: the readiness the loop last published, while the loop is alive."""
        alive, why = self.health()
        return self._ready if alive else (False, why)
