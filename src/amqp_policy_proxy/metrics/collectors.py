"""Shell-side. Scrape-time collector for live state (the gauges of docs/observability.md).

The event loop owns the live state (connection ledger, traffic counters, policy). It publishes
an immutable :class:`MetricsSnapshot` by swapping one reference; :class:`LiveCollector` runs on
the exporter's HTTP thread and reads only that snapshot, once per scrape, never a live dict, so
no lock is shared with the event loop. The pattern is prometheus_client's
``ProcessCollector``: an injected data source, fresh metric families built on every
``collect()``.

May import prometheus_client; must not import the daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from amqp_policy_proxy.policy.keys import BYTE_LIMIT_NAMES

__all__ = ["DIRECTIONS", "LEDGER_MODES", "LiveCollector", "MetricsSnapshot"]

#: The ``mode`` label values of ``amqp_proxy_ledger_mode`` (one sample each, 1 for the mode
#: in force).
LEDGER_MODES: tuple[str, ...] = ("redis", "local-share", "closed", "open", "in-process")

#: The ``direction`` label values: bytes/transfers received from the client, and sent to it.
DIRECTIONS: tuple[str, str] = ("client_to_broker", "broker_to_client")

_EMPTY: Mapping[tuple[str, str], int] = MappingProxyType({})
_SHAPING_EMPTY: Mapping[tuple[str, str], tuple[float, int, int]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """The live figures at one instant, published by the event loop for scrapes.

    Build a new snapshot and swap the reference the collector's source returns; never mutate
    the mappings of a published snapshot (the exporter thread may be iterating them). The
    default instance is the empty snapshot (no connections, no traffic, no policy).
    """

    connections_active: Mapping[tuple[str, str], int] = field(default_factory=lambda: _EMPTY)
    """Open (approved, not yet closed) connections per ``(vhost, group)``."""
    bytes_total: Mapping[tuple[str, str], int] = field(default_factory=lambda: _EMPTY)
    """Cumulative bytes per ``(vhost, direction)`` since the daemon started, frames included.
    Must never decrease: closed connections' bytes stay in the total."""
    transfers_total: Mapping[tuple[str, str], int] = field(default_factory=lambda: _EMPTY)
    """Cumulative Transfer frames per ``(vhost, direction)`` since the daemon started."""
    limits: tuple[tuple[str, str, str, float], ...] = field(default=())
    """Configured limits as ``(vhost, group, limit, value)``: ``limit`` is the QDR key
    (``maxConnections``, ``maxConnectionsPerUser``, ``maxFrameSize``, ...), ``group`` is ``""``
    for vhost-level limits, ``value`` a count or, for
    :data:`~amqp_policy_proxy.policy.keys.BYTE_LIMIT_NAMES`, bytes. Omit unlimited settings
    (no row, so no sample) rather than exporting 0 or a huge number
    (:meth:`~amqp_policy_proxy.policy.model.Policy.limits_table` does)."""
    policy_digest: str = ""
    """Digest of the running policy; ``""`` before one is loaded (no ``policy_info`` sample)."""
    shaping: Mapping[tuple[str, str], tuple[float, int, int]] = field(
        default_factory=lambda: _SHAPING_EMPTY)
    """Credit shaping per ``(vhost, group)`` since start: seconds users were throttled
    (summed over users), messages and payload bytes sent on shaped links (never decreasing;
    ``limits.rates.RateLimits.totals``)."""
    ledger_mode: str = "in-process"
    """The connection ledger's mode: ``redis``, ``local-share``, ``closed``, ``open`` (the
    fleet ledger, docs/fleet.md) or ``in-process`` (no ``[ledger]``)."""
    ledger_proxies: int | None = None
    """Live proxies last seen in the fleet ledger; None without one (no sample)."""


class LiveCollector:
    """Exports the current :class:`MetricsSnapshot` at scrape time.

    Families: ``amqp_proxy_connections_active{vhost,group}`` (gauge),
    ``amqp_proxy_bytes_total{vhost,direction}`` and ``amqp_proxy_transfers_total{vhost,direction}``
    (counters), ``amqp_proxy_limit{vhost,group,limit}`` (gauge, count limits),
    ``amqp_proxy_limit_bytes{vhost,group,limit}`` (gauge, byte-valued limits: ``maxFrameSize``,
    ``maxMessageSize``, ``maxSessionWindow``), ``amqp_proxy_policy_info{digest}`` (gauge,
    always 1) and, for credit shaping, ``amqp_proxy_throttled_seconds_total{vhost,group}``,
    ``amqp_proxy_shaped_messages_total{vhost,group}`` and
    ``amqp_proxy_shaped_bytes_total{vhost,group}`` (counters). Families are yielded even
    when empty; an unlimited setting has no sample.

    Args:
        source: zero-argument callable returning the current snapshot. It is called exactly
            once per scrape, on the exporter thread, so it must only read a reference (e.g.
            ``lambda: state.snapshot``), never compute from live event-loop state.
        registry: when given, the collector registers itself there.

    Raises:
        ValueError: ``registry`` already has a family of the same name.
    """

    def __init__(
        self,
        source: Callable[[], MetricsSnapshot],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._source = source
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Metric]:
        """Return the families without samples (the registry's clash check; no source call)."""
        return list(self._families(MetricsSnapshot()))

    def collect(self) -> Iterator[Metric]:
        """Read the snapshot once and yield the families built from it."""
        return self._families(self._source())

    @staticmethod
    def _families(snap: MetricsSnapshot) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "amqp_proxy_connections_active",
            "Open connections per vhost and policy group.",
            labels=("vhost", "group"),
        )
        for (vhost, group), count in snap.connections_active.items():
            active.add_metric((vhost, group), count)
        yield active

        traffic = CounterMetricFamily(
            "amqp_proxy_bytes_total",
            "Bytes relayed per vhost and direction, AMQP frames included.",
            labels=("vhost", "direction"),
        )
        for (vhost, direction), count in snap.bytes_total.items():
            traffic.add_metric((vhost, direction), count)
        yield traffic

        transfers = CounterMetricFamily(
            "amqp_proxy_transfers_total",
            "Transfer frames relayed per vhost and direction.",
            labels=("vhost", "direction"),
        )
        for (vhost, direction), count in snap.transfers_total.items():
            transfers.add_metric((vhost, direction), count)
        yield transfers

        limit = GaugeMetricFamily(
            "amqp_proxy_limit",
            "Configured policy count limits (connections, sessions, links) by QDR setting "
            "name; no sample when unlimited.",
            labels=("vhost", "group", "limit"),
        )
        limit_bytes = GaugeMetricFamily(
            "amqp_proxy_limit_bytes",
            "Configured policy size limits in bytes (maxFrameSize, maxMessageSize, "
            "maxSessionWindow); no sample when unlimited.",
            labels=("vhost", "group", "limit"),
        )
        for vhost, group, name, value in snap.limits:
            family = limit_bytes if name in BYTE_LIMIT_NAMES else limit
            family.add_metric((vhost, group, name), value)
        yield limit
        yield limit_bytes

        info = GaugeMetricFamily(
            "amqp_proxy_policy_info",
            "Always 1; the digest label identifies the running policy.",
            labels=("digest",),
        )
        if snap.policy_digest:
            info.add_metric((snap.policy_digest,), 1)
        yield info

        throttled = CounterMetricFamily(
            "amqp_proxy_throttled_seconds",
            "Seconds users of a group spent throttled by credit shaping (a sending link with "
            "no credit left waiting for maxMessageRatePerUser / maxByteRatePerUser tokens), "
            "summed over users.",
            labels=("vhost", "group"),
        )
        messages = CounterMetricFamily(
            "amqp_proxy_shaped_messages",
            "Messages sent on links shaped by maxMessageRatePerUser / maxByteRatePerUser.",
            labels=("vhost", "group"),
        )
        nbytes = CounterMetricFamily(
            "amqp_proxy_shaped_bytes",
            "Message payload bytes sent on shaped links.",
            labels=("vhost", "group"),
        )
        for (vhost, group), (seconds, n_messages, n_bytes) in snap.shaping.items():
            throttled.add_metric((vhost, group), seconds)
            messages.add_metric((vhost, group), n_messages)
            nbytes.add_metric((vhost, group), n_bytes)
        yield throttled
        yield messages
        yield nbytes
        mode = GaugeMetricFamily(
            "amqp_proxy_ledger_mode",
            "1 for the connection ledger's mode in force: redis (the fleet's store decides), "
            "local-share, closed or open (its failure mode), in-process (no [ledger]).",
            labels=("mode",),
        )
        for name in LEDGER_MODES:
            mode.add_metric((name,), 1 if name == snap.ledger_mode else 0)
        yield mode

        proxies = GaugeMetricFamily(
            "amqp_proxy_ledger_proxies",
            "Live proxies last seen in the fleet ledger (the local-share divisor).",
        )
        if snap.ledger_proxies is not None:
            proxies.add_metric((), snap.ledger_proxies)
        yield proxies
