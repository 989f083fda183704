"""Shell-side. Turns core events into Prometheus counters and histograms (docs/observability.md).

The daemon fans every :mod:`amqp_policy_proxy.core.events` event out to
:meth:`MetricsObserver.handle` on the event loop thread. Counters and histograms live here;
gauges and traffic counters that describe live state come from
:class:`~amqp_policy_proxy.metrics.collectors.LiveCollector` at scrape time.

Label discipline (the contract): labels only from ``vhost``, ``group``, ``reason``, ``role``,
``side``, ``condition``, ``result``, ``upstream``, ``direction``, ``kind``. Never a user, remote host,
container-id or address: those go to the event log only.

May import prometheus_client; must not import the daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric

from amqp_policy_proxy.core.events import (
    AdminAction,
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    ConnectionDenyReason,
    LinkDenied,
    MessageDenied,
    OpenDecided,
    PolicyReloaded,
    ProtocolViolation,
    ProxyInfo,
    Revoked,
    SaslFailed,
    SessionDenied,
    ShadowDenied,
    TokenRefused,
    TokenRenewed,
    UpstreamConnectFailed,
)
from amqp_policy_proxy.metrics.collectors import DIRECTIONS

__all__ = [
    "CONNECTION_DURATION_BUCKETS",
    "METRIC_NAMES",
    "OPEN_DECISION_BUCKETS",
    "MetricsObserver",
]

#: Every ``amqp_proxy_`` family the daemon exports, as documented in docs/observability.md (counters
#: with their ``_total``; histograms without ``_bucket``/``_sum``/``_count``). Includes the
#: families of :class:`~amqp_policy_proxy.metrics.collectors.LiveCollector`.
METRIC_NAMES: frozenset[str] = frozenset(
    {
        "amqp_proxy_connections_active",
        "amqp_proxy_connections_approved_total",
        "amqp_proxy_connections_denied_total",
        "amqp_proxy_sessions_denied_total",
        "amqp_proxy_links_denied_total",
        "amqp_proxy_messages_denied_total",
        "amqp_proxy_shadow_denials_total",
        "amqp_proxy_revocations_total",
        "amqp_proxy_upstream_up",
        "amqp_proxy_sasl_failures_total",
        "amqp_proxy_sasl_failure_hosts",
        "amqp_proxy_protocol_errors_total",
        "amqp_proxy_bytes_total",
        "amqp_proxy_transfers_total",
        "amqp_proxy_open_decision_seconds",
        "amqp_proxy_connection_duration_seconds",
        "amqp_proxy_limit",
        "amqp_proxy_limit_bytes",
        "amqp_proxy_policy_reloads_total",
        "amqp_proxy_policy_info",
        "amqp_proxy_upstream_connect_failures_total",
        "amqp_proxy_event_log_dropped_total",
        "amqp_proxy_event_log_errors_total",
        "amqp_proxy_internal_errors_total",
        "amqp_proxy_tls_reload_failures_total",
        "amqp_proxy_throttled_seconds_total",
        "amqp_proxy_shaped_messages_total",
        "amqp_proxy_shaped_bytes_total",
        "amqp_proxy_ledger_mode",
        "amqp_proxy_ledger_proxies",
        "amqp_proxy_ledger_errors_total",
        "amqp_proxy_ledger_latency_seconds",
        "amqp_proxy_connections_closed_total",
        "amqp_proxy_bans_active",
        "amqp_proxy_quarantines_total",
        "amqp_proxy_token_rejections_total",
        "amqp_proxy_token_renewals_total",
        "amqp_proxy_jwks_age_seconds",
        "amqp_proxy_jwks_usable",
        "amqp_proxy_jwks_keys",
        "amqp_proxy_jwks_fetch_failures_total",
    }
)

#: Fleet ledger answer latency buckets, seconds: 50 µs .. 1 s (one Lua call on a LAN is
#: 0.1-1 ms; a late answer is waited for up to ``timeout_ms``, 1000 ms by default, then the
#: failure mode answers instead).
LEDGER_LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
    1.0,
)
#: The ``reason`` label values of ``amqp_proxy_ledger_errors_total``.
LEDGER_ERROR_REASONS: tuple[str, ...] = ("timeout", "unreachable", "restarted", "error")

#: Open decision latency buckets, seconds: 10 µs .. 100 ms. A decision is a few dict lookups
#: plus a remoteHosts match, so the interesting range is microseconds to a few milliseconds;
#: the upper buckets catch event-loop stalls.
OPEN_DECISION_BUCKETS: tuple[float, ...] = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
)

#: Connection lifetime buckets, seconds: 100 ms (connect-and-go clients) .. 1 day.
CONNECTION_DURATION_BUCKETS: tuple[float, ...] = (
    0.1,
    1.0,
    10.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    14400.0,
    86400.0,
)

#: Denial reasons that happen before a vhost is resolved; their ``vhost=""`` series are
#: pre-created at zero so ``rate()`` sees the first increment and dashboards show a flat line.
_VHOSTLESS_DENY_REASONS = (
    ConnectionDenyReason.GLOBAL_LIMIT,
    ConnectionDenyReason.GLOBAL_RATE,
    ConnectionDenyReason.NO_VHOST,
    ConnectionDenyReason.HANDSHAKE_TIMEOUT,
)


def _label(value: object) -> str:
    """Return a label value: ``""`` for None, the plain string otherwise (StrEnum → value)."""
    return "" if value is None else str(value)


def _no_metric(event: object) -> None:
    """The handler of an event that is only written to the event log."""


#: The counter of each counted event type: ``(name, help, labels)``. Each label's value is
#: the event's attribute of the same name (:func:`_label`). In export order.
_EVENT_COUNTERS: dict[type, tuple[str, str, tuple[str, ...]]] = {
    ConnectionApproved: (
        "amqp_proxy_connections_approved_total",
        "Connections whose Open passed every admission rule.",
        ("vhost", "group"),
    ),
    ConnectionDenied: (
        "amqp_proxy_connections_denied_total",
        "Connections refused at TCP accept, at Open or by the handshake timeout.",
        ("vhost", "reason"),
    ),
    SessionDenied: (
        "amqp_proxy_sessions_denied_total",
        "Begin frames denied by maxSessions (answered Begin+End).",
        ("vhost",),
    ),
    LinkDenied: (
        "amqp_proxy_links_denied_total",
        "Attach frames denied by policy (answered Attach+Detach); role is the client's side.",
        ("vhost", "role", "reason"),
    ),
    MessageDenied: (
        "amqp_proxy_messages_denied_total",
        "Deliveries rejected by policy.",
        ("vhost", "reason"),
    ),
    SaslFailed: (
        "amqp_proxy_sasl_failures_total",
        "Failed authentication attempts: the router's sasl-outcome by name (auth, sys, "
        "sys-perm, sys-temp), or dropped (the client left in the middle of SASL).",
        ("reason",),
    ),
    TokenRefused: (
        "amqp_proxy_token_rejections_total",
        "Token connections refused by the proxy (sasl-outcome auth), by reason: expired, "
        "not_yet_valid, bad_audience, bad_issuer, bad_signature, unknown_kid, "
        "algorithm_not_allowed, malformed, oversized, username_mismatch, no_token...",
        ("reason",),
    ),
    TokenRenewed: (
        "amqp_proxy_token_renewals_total",
        "In-band token renewals on live token connections (CBS put-token on $cbs, PUT "
        "/auth/tokens on /management), by result (accepted, refused, bad_request) and reason "
        "(a rejection reason, subject_changed, not_newer, groups_denied, upstream_refused, "
        "not_upstream_authority, bad_request; empty when accepted).",
        ("result", "reason"),
    ),
    Revoked: (
        "amqp_proxy_revocations_total",
        "Open connections closed (kind connection) and links detached (kind link) because a "
        "reloaded policy no longer allows them; mode shadow: reported only.",
        ("vhost", "kind", "reason", "mode"),
    ),
    ShadowDenied: (
        "amqp_proxy_shadow_denials_total",
        "Denials shadow mode let through (enforcement: shadow): allowed, logged SHADOW DENY.",
        ("vhost", "kind", "reason"),
    ),
    ProtocolViolation: (
        "amqp_proxy_protocol_errors_total",
        "Connections closed because a side broke the AMQP protocol.",
        ("side", "condition"),
    ),
    UpstreamConnectFailed: (
        "amqp_proxy_upstream_connect_failures_total",
        "Failed attempts to connect to an upstream router or broker.",
        ("upstream",),
    ),
    PolicyReloaded: (
        "amqp_proxy_policy_reloads_total",
        "Policy reloads by result (error: the running policy was kept).",
        ("result",),
    ),
}


class _Children(dict[Any, Any]):
    """The labelled children of one metric, by an event's raw values of the label names.

    ``.labels()`` builds and validates the label tuple under a lock on every call; a child
    looked up here is built once, on first use (``__missing__``). Children are never removed
    from the observer's metrics, so a remembered child stays the one prometheus exports; the
    keys are bounded like the series.
    """

    def __init__(self, metric: Counter | Histogram, labels: tuple[str, ...]) -> None:
        super().__init__()
        self._metric = metric
        self._one = len(labels) == 1
        self.key: Callable[[Any], Any] = attrgetter(*labels)
        """Returns the key of an event: its values of the label names (one value for one)."""

    def __missing__(self, key: Any) -> Any:
        """Build, remember and return the child of ``key``."""
        child = self._metric.labels(*map(_label, (key,) if self._one else key))
        self[key] = child
        return child


def _counting(counter: Counter, labels: tuple[str, ...]) -> Callable[[Any], None]:
    """Return the handler that counts an event in ``counter`` (labels from the event)."""
    children = _Children(counter, labels)
    key = children.key

    def count(event: Any) -> None:
        children[key(event)].inc()

    return count


class _NoCreatedSeries:
    """Collector exposing a fixed set of metrics without their ``_created`` samples.

    prometheus_client adds a ``<name>_created`` series to every counter and histogram child.
    They are not part of the documented metrics and double the series count, so the observer's
    metrics are built unregistered and exported through this filter instead. This keeps the
    filter local to our registry (``disable_created_metrics()`` would be process-global).
    """

    def __init__(self, metrics: Iterable[Counter | Histogram]) -> None:
        self._metrics = tuple(metrics)

    def describe(self) -> list[Metric]:
        """Return the families without samples (used by the registry to detect clashes)."""
        return [family for metric in self._metrics for family in metric.describe()]

    def collect(self) -> Iterator[Metric]:
        """Yield each metric's families, minus the ``_created`` samples."""
        for metric in self._metrics:
            for family in metric.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family


class MetricsObserver:
    """Counts core events into the counters and histograms of one registry.

    Args:
        registry: the daemon's dedicated registry (:func:`~.registry.build_registry`); the
            observer registers its families there once.

    Raises:
        ValueError: a family of the same name is already registered in ``registry`` (for
            example a second observer on the same registry).

    Thread-safety: :meth:`handle` and :meth:`observe_open_decision` run on the event loop;
    :meth:`event_log_dropped` may also be called from the event log writer thread. The
    prometheus_client metrics are thread-safe.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=None)

        self._event_counters = {
            event_type: counter(name, doc, labels)
            for event_type, (name, doc, labels) in _EVENT_COUNTERS.items()
        }
        self.event_log_dropped_total = counter(
            "amqp_proxy_event_log_dropped_total",
            "Event log records dropped (writer queue full, writer stopped or sink failure).",
        )
        self.event_log_errors_total = counter(
            "amqp_proxy_event_log_errors_total",
            "Failed event log disk operations (a batch write or flush, a retention pass).",
        )
        self.internal_errors_total = counter(
            "amqp_proxy_internal_errors_total",
            "Connections closed because of a bug in the proxy (logged with a traceback).",
        )
        self.tls_reload_failures_total = counter(
            "amqp_proxy_tls_reload_failures_total",
            "Reloads whose TLS certificate, key or CA files did not load (the old ones stay).",
        )
        self.ledger_errors = counter(
            "amqp_proxy_ledger_errors_total",
            "Fleet ledger store failures: timeout (silent for timeout_ms), unreachable, "
            "restarted (lost its scripts), error.",
            ("reason",),
        )
        self.ledger_latency = Histogram(
            "amqp_proxy_ledger_latency_seconds",
            "Time from an Open's admission request to the fleet ledger store's answer, "
            "seconds.",
            buckets=LEDGER_LATENCY_BUCKETS,
            registry=None,
        )
        self.connections_closed = counter(
            "amqp_proxy_connections_closed_total",
            "Approved connections that ended, by reason: the event log's close_reason "
            "(client_close, broker_close, admin_close, banned, shutdown, timeout, ...).",
            ("vhost", "reason"),
        )
        self.quarantines = counter(
            "amqp_proxy_quarantines_total",
            "Users (kind=user) and client addresses (kind=host) banned by a vhost's "
            "quarantine for collecting its number of denials within its window.",
            ("vhost", "kind"),
        )
        self.open_decision = Histogram(
            "amqp_proxy_open_decision_seconds",
            "Time to decide on a client's Open (vhost, group, remoteHosts, limits), seconds.",
            buckets=OPEN_DECISION_BUCKETS,
            registry=None,
        )
        self.connection_duration = Histogram(
            "amqp_proxy_connection_duration_seconds",
            "Lifetime of approved connections from approval to close, seconds.",
            ("vhost",),
            buckets=CONNECTION_DURATION_BUCKETS,
            registry=None,
        )
        registry.register(
            _NoCreatedSeries(
                (
                    *self._event_counters.values(),
                    self.event_log_dropped_total,
                    self.event_log_errors_total,
                    self.internal_errors_total,
                    self.tls_reload_failures_total,
                    self.ledger_errors,
                    self.connections_closed,
                    self.quarantines,
                    self.ledger_latency,
                    self.open_decision,
                    self.connection_duration,
                )
            )
        )

        # Zero series that dashboards and alerts rely on being present from the start.
        for result in ("ok", "error"):
            self._event_counters[PolicyReloaded].labels(result)
        for reason in _VHOSTLESS_DENY_REASONS:
            self._event_counters[ConnectionDenied].labels("", reason.value)
        for error_reason in LEDGER_ERROR_REASONS:
            self.ledger_errors.labels(error_reason)

        # The duration histogram's children by the events' raw vhost.
        self._durations = _Children(self.connection_duration, ("vhost",))
        # Traffic of closed connections per (vhost, direction): the live connections' figures
        # are added at each snapshot (:meth:`traffic`), so the totals never decrease.
        self._closed_bytes: dict[tuple[str, str], int] = {}
        self._closed_transfers: dict[tuple[str, str], int] = {}

        self._handlers: dict[type, Callable[[Any], None]] = {
            event_type: _counting(metric, _EVENT_COUNTERS[event_type][2])
            for event_type, metric in self._event_counters.items()
        }
        self._closes: dict[tuple[str | None, str], Any] = {}
        self._handlers[ConnectionClosed] = self._on_connection_closed
        # event log only: the decisions are counted from ConnectionApproved/Denied
        self._handlers[OpenDecided] = _no_metric
        # event log only: the file header of each event-log file (the ledger mode)
        self._handlers[ProxyInfo] = _no_metric
        self._handlers[AdminAction] = self._on_admin_action

    def handle(self, event: object) -> None:
        """Update the metrics for one core event.

        Args:
            event: any event of :mod:`amqp_policy_proxy.core.events`. Event types without a
                metric (including types added to the core later) are ignored, so a new event
                can never break the daemon's fan-out.
        """
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event)

    def observe_open_decision(self, seconds: float) -> None:
        """Record the time one Open decision took (``amqp_proxy_open_decision_seconds``).

        Args:
            seconds: elapsed loop-clock seconds from the Open's arrival to the decision;
                negative values (clock glitches) are recorded as 0.
        """
        self.open_decision.observe(max(0.0, seconds))

    def event_log_dropped(self, n: int = 1) -> None:
        """Count event log records that were dropped (``amqp_proxy_event_log_dropped_total``).

        Suitable as :class:`~amqp_policy_proxy.eventlog.writer.EventLogWriter`'s ``on_drop``.

        Args:
            n: number of records dropped (0 is a no-op).

        Raises:
            ValueError: ``n`` is negative (counters only go up).
        """
        if n:
            self.event_log_dropped_total.inc(n)

    def event_log_errors(self, n: int = 1) -> None:
        """Count failed event log disk operations (``amqp_proxy_event_log_errors_total``).

        Suitable as :class:`~amqp_policy_proxy.eventlog.writer.EventLogWriter`'s ``on_error``
        (called from the writer thread; the counter is thread-safe).

        Args:
            n: number of failures (0 is a no-op).

        Raises:
            ValueError: ``n`` is negative (counters only go up).
        """
        if n:
            self.event_log_errors_total.inc(n)

    def internal_error(self) -> None:
        """Count a bug contained to one connection (``amqp_proxy_internal_errors_total``)."""
        self.internal_errors_total.inc()

    def ledger_error(self, reason: str) -> None:
        """Count one fleet ledger store failure (``reason``: one of
        :data:`LEDGER_ERROR_REASONS`)."""
        self.ledger_errors.labels(reason).inc()

    def ledger_latency_observed(self, seconds: float) -> None:
        """Record one admission answered by the fleet ledger's store (seconds)."""
        self.ledger_latency.observe(seconds)

    def tls_reload_failed(self) -> None:
        """Count a reload whose TLS files did not load
        (``amqp_proxy_tls_reload_failures_total``)."""
        self.tls_reload_failures_total.inc()

    def traffic(self, live: Iterable[tuple[str, Any]]
                ) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """Bytes and Transfer frames per ``(vhost, direction)`` since start.

        Args:
            live: ``(vhost, figures)`` of every connection approved and not closed yet
                (``figures`` has ``bytes_in``, ``bytes_out``, ``transfers_in``,
                ``transfers_out``).

        Returns:
            ``(bytes_total, transfers_total)``: the closed connections' traffic (from
            ``ConnectionClosed`` events) plus the live connections' figures so far.
        """
        inbound, outbound = DIRECTIONS
        bytes_total = dict(self._closed_bytes)
        transfers_total = dict(self._closed_transfers)
        for vhost, f in live:
            for key, n in (((vhost, inbound), f.bytes_in), ((vhost, outbound), f.bytes_out)):
                bytes_total[key] = bytes_total.get(key, 0) + n
            for key, n in (((vhost, inbound), f.transfers_in),
                           ((vhost, outbound), f.transfers_out)):
                transfers_total[key] = transfers_total.get(key, 0) + n
        return bytes_total, transfers_total

    def _on_admin_action(self, event: AdminAction) -> None:
        """Count a quarantine (``amqp_proxy_quarantines_total``); other actions are in the
        event log only."""
        if event.action == "quarantine" and event.result == "ok":
            kind = event.selector.partition("=")[0]
            self.quarantines.labels(event.vhost or "", kind).inc()

    def _on_connection_closed(self, event: ConnectionClosed) -> None:
        inbound, outbound = DIRECTIONS
        vhost = event.vhost or ""
        for totals, n_in, n_out in ((self._closed_bytes, event.bytes_in, event.bytes_out),
                                    (self._closed_transfers, event.transfers_in,
                                     event.transfers_out)):
            totals[(vhost, inbound)] = totals.get((vhost, inbound), 0) + n_in
            totals[(vhost, outbound)] = totals.get((vhost, outbound), 0) + n_out
        self._durations[event.vhost].observe(max(0.0, event.duration_seconds))
        key = (event.vhost, event.close_reason)
        child = self._closes.get(key)
        if child is None:
            child = self._closes[key] = self.connections_closed.labels(vhost, event.close_reason)
        child.inc()
