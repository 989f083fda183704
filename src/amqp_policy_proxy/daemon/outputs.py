"""The daemon's outputs besides the relay: the metrics registry and endpoint (with the probes),
the event-log writer, and the fleet ledger's figures in those metrics.

Started by :meth:`~.app.Daemon.start` before the listeners bind: an event-log directory that
cannot be used or a metrics address that cannot be bound stops the start with a
:class:`~.config.ConfigError` naming the key, before any client is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..fleet.ledger import LedgerObserver
from .config import BindError, ConfigError, DaemonConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..eventlog.writer import EventLogWriter
    from ..metrics.collectors import MetricsSnapshot
    from ..metrics.exposition import MetricsServer
    from ..metrics.observer import MetricsObserver

__all__ = ["LedgerFigures", "Outputs", "start_outputs"]

Probe = Callable[[], tuple[bool, str]]
"""A probe endpoint's answer: ``(ok, why)``."""


@dataclass(slots=True)
class Outputs:
    """What :func:`start_outputs` started."""

    registry: CollectorRegistry
    observer: MetricsObserver
    writer: EventLogWriter | None
    """The event-log writer (``[event_log] directory``), else None."""
    metrics_server: MetricsServer | None
    """The scrape endpoint with ``/healthz`` and ``/readyz`` (``[metrics] address``), else
    None."""


def start_outputs(config: DaemonConfig, snapshot: Callable[[], MetricsSnapshot | None],
                  health: Probe, ready: Probe) -> Outputs:
    """Build the metrics registry and observer, start the event-log writer and the metrics
    endpoint as ``config`` asks.

    Args:
        snapshot: the live figures' source (the empty snapshot is served until it has one).
        health: ``/healthz``; ready: ``/readyz`` (:class:`~.health.Probes`).

    Raises:
        ConfigError: the event-log directory cannot be created or written
            (``event_log.directory: ...``).
        BindError: the metrics address cannot be bound (``metrics.address: cannot listen
            on ...``; the writer is stopped again).
    """
    from ..metrics.collectors import LiveCollector, MetricsSnapshot
    from ..metrics.observer import MetricsObserver
    from ..metrics.registry import build_registry

    registry = build_registry()
    observer = MetricsObserver(registry)
    empty = MetricsSnapshot()  # until the first snapshot is published
    registry.register(LiveCollector(lambda: snapshot() or empty))
    writer = None
    if config.event_log_dir:  # first: an unusable directory stops the start here
        from ..eventlog.sinks import FileEventSink
        from ..eventlog.writer import EventLogWriter

        writer = EventLogWriter(
            FileEventSink(config.event_log_dir), max_queue=config.event_log_queue,
            on_drop=observer.event_log_dropped, on_error=observer.event_log_errors,
            retention_days=config.event_log_retention_days,
        )
        try:
            writer.start()
        except OSError as exc:
            raise ConfigError([f"event_log.directory: {exc}"]) from None
    server = None
    if config.metrics_address is not None:
        from ..metrics.exposition import start_metrics_server

        addr = config.metrics_address
        try:
            server = start_metrics_server(registry, addr.host, addr.port,
                                          probes={"/healthz": health, "/readyz": ready})
        except OSError as exc:
            if writer is not None:
                writer.stop()
            raise BindError.of(config.source, "metrics.address", addr, exc) from None
    return Outputs(registry, observer, writer, server)


class LedgerFigures(LedgerObserver):
    """The fleet ledger's figures into the daemon's metrics (once it has an observer).

    Args:
        observer: returns the daemon's current metrics observer, or None.
    """

    __slots__ = ("observer",)

    def __init__(self, observer: Callable[[], Any]) -> None:
        """Read the observer at each figure (it is made after the ledger object)."""
        self.observer = observer

    def ledger_latency(self, seconds: float) -> None:
        """One admission answered by the store."""
        if (observer := self.observer()) is not None:
            observer.ledger_latency_observed(seconds)

    def ledger_error(self, reason: str) -> None:
        """One store failure."""
        if (observer := self.observer()) is not None:
            observer.ledger_error(reason)
