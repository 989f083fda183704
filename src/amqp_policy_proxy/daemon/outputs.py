"""The daemon's outputs besides the relay: the metrics registry and endpoint (with the probes),
the event-log writer, and the fleet ledger's figures in those metrics.

Started by :meth:`~.app.Daemon.start` before the listeners bind: an event-log directory that
cannot be used or a metrics address that cannot be bound stops the start with a
:class:`~.config.ConfigError` naming the key, before any client is accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..fleet.ledger import LedgerObserver
from .settings import BindError, ConfigError, DaemonConfig

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..eventlog.writer import EventLogWriter
    from ..metrics.collectors import MetricsSnapshot
    from ..metrics.exposition import MetricsServer
    from ..metrics.observer import MetricsObserver

__all__ = ["LedgerFigures", "Outputs", "fleet_name", "proxy_info_header", "start_outputs"]

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
                  health: Probe, ready: Probe,
                  header: Callable[[str], dict[str, Any]] | None = None) -> Outputs:
    """Build the metrics registry and observer, start the event-log writer and the metrics
    endpoint as ``config`` asks.

    Args:
        snapshot: the live figures' source (the empty snapshot is served until it has one).
        health: ``/healthz``; ready: ``/readyz`` (:class:`~.health.Probes`).
        header: the first record of every event-log file (``proxy_info``), given the ``ts``
            of the file's first record (:class:`~..eventlog.sinks.FileEventSink`); default
            :func:`proxy_info_header` of ``config``.

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
            FileEventSink(config.event_log_dir,
                          header=header or proxy_info_header(config, lambda: "")),
            max_queue=config.event_log_queue,
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


async def stop_outputs(writer: EventLogWriter | None, server: MetricsServer | None) -> None:
    """Stop what :func:`start_outputs` started: the event-log writer first (in a thread: it
    writes and flushes every record submitted before), then the metrics endpoint."""
    if writer is not None:
        await asyncio.to_thread(writer.stop)
    if server is not None:
        server.stop()


def fleet_name(url: str, host: str | None = None) -> str:
    """Return the name of the fleet a ``[ledger] url`` makes: the proxies sharing one store.

    Credentials are left out (the name goes into the event log). A unix socket or a private
    store (``auto``) is local to its host, so the host name is part of the name.

    Args:
        url: ``redis://[user:password@]HOST:PORT/DB``, ``rediss://...``, ``unix:///path``
            or ``auto``.
        host: the host name for local stores; default :func:`socket.gethostname`.

    Returns:
        e.g. ``redis://10.0.0.5:6379/0``, ``unix:///run/redis.sock@host1``, ``auto@host1``.
    """
    import socket
    from urllib.parse import urlsplit

    here = socket.gethostname() if host is None else host
    if url == "auto":
        return f"auto@{here}"
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}@{here}"
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}"


def proxy_info_header(config: DaemonConfig,
                      proxy_id: Callable[[], str]) -> Callable[[str], dict[str, Any]]:
    """Return the header function of the event-log files: a ``proxy_info`` record (schema 4).

    ``ledger`` is ``fleet`` when ``config`` has a ``[ledger]`` (limits are counted in the
    shared store, so they are fleet-wide), else ``local``.

    Args:
        config: the daemon's configuration.
        proxy_id: returns the proxy's name in the fleet when a file is created (the ledger
            names itself when it starts, after the event log); ``""`` falls back to
            ``[ledger] proxy_id``.

    Returns:
        A function of the file's first ``ts``, returning the record.
    """
    from ..eventlog import schema
    from ..eventlog.records import proxy_info_record

    ledger = config.ledger
    if ledger is None:
        return lambda ts: proxy_info_record(ts, ledger=schema.LEDGER_LOCAL, proxy_id="")
    name = fleet_name(ledger.url)
    return lambda ts: proxy_info_record(ts, ledger=schema.LEDGER_FLEET, fleet=name,
                                        proxy_id=proxy_id() or ledger.proxy_id)


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
