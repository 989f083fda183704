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

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

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
_BANS_NONE: Mapping[str, int] = MappingProxyType({"user": 0, "host": 0})


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
    sasl_failure_hosts: tuple[tuple[str, int], ...] = ()
    """``(client host, failed authentications in the last 60 s)`` of the hosts with the most
    (:class:`~.recent.RecentFailures`)."""
    upstreams_up: tuple[tuple[str, int], ...] = ()
    """``(upstream address, 1 up / 0 down or not probed yet)`` per configured upstream, from
    the active probes and the client connects (``daemon/probe.py``)."""
    bans_active: Mapping[str, int] = field(default_factory=lambda: _BANS_NONE)
    """Bans in force per kind (``user``, ``host``): an operator's or a quarantine's."""
    jwks: Any = None
    """The JWKS cache's figures (``daemon.tokens.JwksFigures``: ``source``,
    ``age_seconds``, ``keys``, ``usable``, ``failures_total``), None without ``[token_auth]``
    (no samples)."""


class LiveCollector:
    """Exports the current :class:`MetricsSnapshot` at scrape time.

    Families: ``amqp_proxy_connections_active{vhost,group}`` (gauge),
    ``amqp_proxy_bytes_total{vhost,direction}`` and ``amqp_proxy_transfers_total{vhost,direction}``
    (counters), ``amqp_proxy_limit{vhost,group,limit}`` (gauge, count limits),
    ``amqp_proxy_limit_bytes{vhost,group,limit}`` (gauge, byte-valued limits: ``maxFrameSize``,
    ``maxMessageSize``, ``maxSessionWindow``), ``amqp_proxy_policy_info{digest}`` (gauge,
    always 1) and, for credit shaping, ``amqp_proxy_throttled_seconds_total{vhost,group}``,
    ``amqp_proxy_shaped_messages_total{vhost,group}`` and
    ``amqp_proxy_shaped_bytes_total{vhost,group}`` (counters), and
    ``amqp_proxy_bans_active{kind}`` (gauge, bans in force). Families are yielded even
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
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_connections_active",
            "Open connections per vhost and policy group.",
            ("vhost", "group"),
            snap.connections_active.items(),
        )
        yield _family(
            CounterMetricFamily,
            "amqp_proxy_bytes_total",
            "Bytes relayed per vhost and direction, AMQP frames included.",
            ("vhost", "direction"),
            snap.bytes_total.items(),
        )
        yield _family(
            CounterMetricFamily,
            "amqp_proxy_transfers_total",
            "Transfer frames relayed per vhost and direction.",
            ("vhost", "direction"),
            snap.transfers_total.items(),
        )
        for in_bytes, name, doc in _LIMIT_FAMILIES:
            yield _family(
                GaugeMetricFamily,
                name,
                doc,
                ("vhost", "group", "limit"),
                (((vhost, group, limit), value) for vhost, group, limit, value in snap.limits
                 if (limit in BYTE_LIMIT_NAMES) == in_bytes),
            )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_policy_info",
            "Always 1; the digest label identifies the running policy.",
            ("digest",),
            [((snap.policy_digest,), 1)] if snap.policy_digest else (),
        )
        # snap.shaping's values are (throttled seconds, messages, bytes): one family each.
        for index, (name, doc) in enumerate(_SHAPING_FAMILIES):
            yield _family(
                CounterMetricFamily,
                name,
                doc,
                ("vhost", "group"),
                ((key, figures[index]) for key, figures in snap.shaping.items()),
            )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_ledger_mode",
            "1 for the connection ledger's mode in force: redis (the fleet's store decides), "
            "local-share, closed or open (its failure mode), in-process (no [ledger]).",
            ("mode",),
            (((mode,), 1 if mode == snap.ledger_mode else 0) for mode in LEDGER_MODES),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_sasl_failure_hosts",
            "Failed authentications in the last 60 s of the 10 client hosts with the most.",
            ("remote_host",),
            (((host,), n) for host, n in snap.sasl_failure_hosts),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_upstream_up",
            "1 while the upstream's last probe or connect succeeded, 0 while it is down or "
            "not probed yet (a TCP connect and the AMQP SASL header, every 5 s).",
            ("upstream",),
            (((address,), up) for address, up in snap.upstreams_up),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_ledger_proxies",
            "Live proxies last seen in the fleet ledger (the local-share divisor).",
            (),
            [((), snap.ledger_proxies)] if snap.ledger_proxies is not None else (),
        )
        jwks = snap.jwks
        source = () if jwks is None else (jwks.source,)
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_jwks_age_seconds",
            "Seconds since the issuer's JWKS was last fetched (or read) successfully; no sample "
            "before the first success. It grows while the source is down: the cached keys "
            "stay in use.",
            ("source",),
            [(source, jwks.age_seconds)] if jwks is not None and jwks.age_seconds is not None
            else (),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_jwks_usable",
            "1 while tokens can be checked (JWKS keys held, not older than "
            "jwks_max_stale_seconds), else 0: every token is refused (jwks_unavailable).",
            ("source",),
            [(source, int(jwks.usable))] if jwks is not None else (),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_jwks_keys",
            "Usable signing keys of the cached JWKS.",
            ("source",),
            [(source, jwks.keys)] if jwks is not None else (),
        )
        yield _family(
            CounterMetricFamily,
            "amqp_proxy_jwks_fetch_failures",
            "Failed fetches of the issuer's JWKS (refused, timed out, HTTP error, unusable "
            "document) since start.",
            ("source",),
            [(source, jwks.failures_total)] if jwks is not None else (),
        )
        yield _family(
            GaugeMetricFamily,
            "amqp_proxy_bans_active",
            "Bans in force by kind (user or host), an operator's or a quarantine's; with a "
            "[ledger] the fleet's list (every process reports it alike).",
            ("kind",),
            (((kind,), n) for kind, n in snap.bans_active.items()),
        )


#: ``(byte-valued, name, help)`` of the two families of configured limits.
_LIMIT_FAMILIES: tuple[tuple[bool, str, str], ...] = (
    (
        False,
        "amqp_proxy_limit",
        "Configured policy count limits (connections, sessions, links) by QDR setting "
        "name; no sample when unlimited.",
    ),
    (
        True,
        "amqp_proxy_limit_bytes",
        "Configured policy size limits in bytes (maxFrameSize, maxMessageSize, "
        "maxSessionWindow); no sample when unlimited.",
    ),
)

#: ``(name, help)`` of the credit shaping counters, in the order of
#: :attr:`MetricsSnapshot.shaping`'s figures.
_SHAPING_FAMILIES: tuple[tuple[str, str], ...] = (
    (
        "amqp_proxy_throttled_seconds",
        "Seconds users of a group spent throttled by credit shaping (a sending link with "
        "no credit left waiting for maxMessageRatePerUser / maxByteRatePerUser tokens), "
        "summed over users.",
    ),
    (
        "amqp_proxy_shaped_messages",
        "Messages sent on links shaped by maxMessageRatePerUser / maxByteRatePerUser.",
    ),
    ("amqp_proxy_shaped_bytes", "Message payload bytes sent on shaped links."),
)


def _family(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    labels: tuple[str, ...],
    samples: Iterable[tuple[tuple[str, ...], float]],
) -> Metric:
    """Return a new family of ``kind`` with one sample per ``(label values, value)``."""
    family = kind(name, doc, labels=labels)
    for label_values, value in samples:
        family.add_metric(label_values, value)
    return family
