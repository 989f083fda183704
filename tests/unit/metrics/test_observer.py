"""MetricsObserver: every core event type lands in its §4.3 family with the right labels."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from amqp_policy_proxy.core import events as ev
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    ConnectionDenyReason,
    LinkDenied,
    LinkDenyReason,
    MessageDenied,
    MessageDenyReason,
    PolicyReloaded,
    ProtocolViolation,
    SessionDenied,
    UpstreamConnectFailed,
)
from amqp_policy_proxy.metrics.collectors import LiveCollector, MetricsSnapshot
from amqp_policy_proxy.metrics.observer import (
    CONNECTION_DURATION_BUCKETS,
    METRIC_NAMES,
    OPEN_DECISION_BUCKETS,
    MetricsObserver,
)
from amqp_policy_proxy.metrics.registry import build_registry

# Label names the contract allows (docs/observability.md: bounded label sets only), plus the histogram's own ``le``.
ALLOWED_LABELS = {
    "vhost", "group", "reason", "role", "side", "condition", "result", "upstream", "direction",
    "limit", "digest", "le", "kind",
}  # fmt: skip

WHO = {"user": "alice", "remote_host": "10.1.2.3", "listener": "0.0.0.0:5672"}


@pytest.fixture
def registry() -> CollectorRegistry:
    return build_registry(process_metrics=False)


@pytest.fixture
def observer(registry: CollectorRegistry) -> MetricsObserver:
    return MetricsObserver(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def closed(vhost: str | None, duration: float) -> ConnectionClosed:
    return ConnectionClosed(
        conn_id="c1", at=100.0, vhost=vhost, group="g", **WHO,
        opened_at=100.0 - duration, duration_seconds=duration, bytes_in=10, bytes_out=20,
        transfers_in=1, transfers_out=2, max_sessions=1, max_senders=1, max_receivers=0,
        close_reason="client_close",
    )  # fmt: skip


def test_connection_approved(registry, observer):
    event = ConnectionApproved(conn_id="c1", at=1.0, vhost="vh", group="g", hostname="vh", **WHO)
    observer.handle(event)
    observer.handle(event)
    assert value(registry, "amqp_proxy_connections_approved_total", vhost="vh", group="g") == 2


def test_connection_approved_without_group_uses_empty_label(registry, observer):
    observer.handle(ConnectionApproved(conn_id="c1", at=1.0, vhost="vh"))
    assert value(registry, "amqp_proxy_connections_approved_total", vhost="vh", group="") == 1


def test_connection_approved_series_stay_apart_across_repeats(registry, observer):
    # the observer remembers labelled children; each (vhost, group) must keep its own series
    # and None and "" must land in the same one
    for vhost, group in [("vh", "g"), ("vh", "h"), ("other", "g"), ("vh", "g"), ("vh", None),
                         ("vh", "")]:
        observer.handle(ConnectionApproved(conn_id="c1", at=1.0, vhost=vhost, group=group))
    name = "amqp_proxy_connections_approved_total"
    assert value(registry, name, vhost="vh", group="g") == 2
    assert value(registry, name, vhost="vh", group="h") == 1
    assert value(registry, name, vhost="other", group="g") == 1
    assert value(registry, name, vhost="vh", group="") == 2


@pytest.mark.parametrize("reason", list(ConnectionDenyReason))
def test_connection_denied_every_reason(registry, observer, reason):
    observer.handle(ConnectionDenied(conn_id="c1", at=1.0, vhost="vh", reason=reason, **WHO))
    assert value(registry, "amqp_proxy_connections_denied_total", vhost="vh", reason=reason) == 1


def test_connection_denied_without_vhost_is_empty_label(registry, observer):
    observer.handle(
        ConnectionDenied(conn_id="c1", at=1.0, vhost=None, reason=ConnectionDenyReason.NO_VHOST)
    )
    assert (
        value(registry, "amqp_proxy_connections_denied_total", vhost="", reason="no_vhost") == 1
    )


def test_connection_denied_series_are_one_per_label_value_across_repeats(registry, observer):
    # The observer remembers children by the events' raw values: a reason given as its enum
    # and as its plain string, and a None vhost and "", must still land in one series.
    for vhost, reason in ((None, ConnectionDenyReason.NO_VHOST), ("", "no_vhost"),
                          ("vh", ConnectionDenyReason.NO_VHOST), ("vh", "no_vhost")):
        observer.handle(ConnectionDenied(conn_id="c1", at=1.0, vhost=vhost, reason=reason))
    assert value(registry, "amqp_proxy_connections_denied_total",
                 vhost="", reason="no_vhost") == 2
    assert value(registry, "amqp_proxy_connections_denied_total",
                 vhost="vh", reason="no_vhost") == 2


def test_session_denied(registry, observer):
    for _ in range(3):
        observer.handle(SessionDenied(conn_id="c1", at=1.0, vhost="vh", channel=7, **WHO))
    assert value(registry, "amqp_proxy_sessions_denied_total", vhost="vh") == 3


@pytest.mark.parametrize("reason", list(LinkDenyReason))
@pytest.mark.parametrize("role", ["sender", "receiver"])
def test_link_denied(registry, observer, role, reason):
    observer.handle(
        LinkDenied(conn_id="c1", at=1.0, vhost="vh", role=role, address="q1", reason=reason)
    )
    assert (
        value(registry, "amqp_proxy_links_denied_total", vhost="vh", role=role, reason=reason)
        == 1
    )


@pytest.mark.parametrize("reason", list(MessageDenyReason))
def test_message_denied(registry, observer, reason):
    observer.handle(
        MessageDenied(conn_id="c1", at=1.0, vhost="vh", address=None, reason=reason, size=9)
    )
    assert value(registry, "amqp_proxy_messages_denied_total", vhost="vh", reason=reason) == 1


def test_protocol_violation(registry, observer):
    observer.handle(
        ProtocolViolation(
            conn_id="c1", at=1.0, side="client", condition="amqp:connection:framing-error",
            description="frame too large",
        )
    )  # fmt: skip
    assert (
        value(
            registry, "amqp_proxy_protocol_errors_total",
            side="client", condition="amqp:connection:framing-error",
        )
        == 1
    )  # fmt: skip


def test_connection_closed_observes_duration_per_vhost(registry, observer):
    observer.handle(closed("vh", 0.5))
    observer.handle(closed("vh", 120.0))
    observer.handle(closed(None, 5.0))
    name = "amqp_proxy_connection_duration_seconds"
    assert value(registry, f"{name}_count", vhost="vh") == 2
    assert value(registry, f"{name}_sum", vhost="vh") == 120.5
    assert value(registry, f"{name}_bucket", vhost="vh", le="1.0") == 1
    assert value(registry, f"{name}_bucket", vhost="vh", le="300.0") == 2
    assert value(registry, f"{name}_count", vhost="") == 1
    observer.handle(closed("", 1.0))  # "" and None are one series
    assert value(registry, f"{name}_count", vhost="") == 2


def test_negative_durations_are_clamped(registry, observer):
    observer.handle(closed("vh", -1.0))
    observer.observe_open_decision(-0.001)
    assert value(registry, "amqp_proxy_connection_duration_seconds_sum", vhost="vh") == 0
    assert value(registry, "amqp_proxy_open_decision_seconds_sum") == 0


def test_upstream_connect_failed(registry, observer):
    observer.handle(UpstreamConnectFailed(conn_id="c1", at=1.0, upstream="127.0.0.1:25672"))
    assert (
        value(registry, "amqp_proxy_upstream_connect_failures_total", upstream="127.0.0.1:25672")
        == 1
    )


def test_policy_reloaded(registry, observer):
    observer.handle(PolicyReloaded(at=1.0, digest="d1", result="ok"))
    observer.handle(PolicyReloaded(at=2.0, digest="d1", result="error", issues=("bad key",)))
    observer.handle(PolicyReloaded(at=3.0, digest="d2", result="ok"))
    assert value(registry, "amqp_proxy_policy_reloads_total", result="ok") == 2
    assert value(registry, "amqp_proxy_policy_reloads_total", result="error") == 1


def test_open_decision_histogram_buckets(registry, observer):
    for seconds in (0.000005, 0.00003, 0.0007, 0.2):
        observer.observe_open_decision(seconds)
    name = "amqp_proxy_open_decision_seconds"
    assert value(registry, f"{name}_count") == 4
    assert value(registry, f"{name}_bucket", le="1e-05") == 1
    assert value(registry, f"{name}_bucket", le="5e-05") == 2
    assert value(registry, f"{name}_bucket", le="0.001") == 3
    assert value(registry, f"{name}_bucket", le="0.1") == 3
    assert value(registry, f"{name}_bucket", le="+Inf") == 4
    assert OPEN_DECISION_BUCKETS[0] == 0.00001
    assert list(OPEN_DECISION_BUCKETS) == sorted(OPEN_DECISION_BUCKETS)
    assert list(CONNECTION_DURATION_BUCKETS) == sorted(CONNECTION_DURATION_BUCKETS)


def test_event_log_dropped(registry, observer):
    assert value(registry, "amqp_proxy_event_log_dropped_total") == 0
    observer.event_log_dropped()
    observer.event_log_dropped(5)
    observer.event_log_dropped(0)
    assert value(registry, "amqp_proxy_event_log_dropped_total") == 6
    with pytest.raises(ValueError):
        observer.event_log_dropped(-1)


def test_event_log_errors(registry, observer):
    assert value(registry, "amqp_proxy_event_log_errors_total") == 0
    observer.event_log_errors()
    observer.event_log_errors(2)
    observer.event_log_errors(0)
    assert value(registry, "amqp_proxy_event_log_errors_total") == 3
    with pytest.raises(ValueError):
        observer.event_log_errors(-1)


def test_precreated_zero_series(registry, observer):
    for result in ("ok", "error"):
        assert value(registry, "amqp_proxy_policy_reloads_total", result=result) == 0
    for reason in ("global_limit", "no_vhost", "handshake_timeout"):
        assert value(registry, "amqp_proxy_connections_denied_total", vhost="", reason=reason) == 0


def test_unknown_events_are_ignored(registry, observer):
    @dataclasses.dataclass(frozen=True)
    class SomethingNew:
        at: float

    observer.handle(SomethingNew(at=1.0))
    observer.handle(object())


def test_every_core_event_type_is_handled():
    event_types = {
        obj
        for obj in vars(ev).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj is not ev.ProxyEvent
    }
    handled = set(MetricsObserver(CollectorRegistry())._handlers)
    assert event_types == handled


def test_no_created_series_and_only_contract_labels(registry, observer):
    observer.handle(ConnectionApproved(conn_id="c1", at=1.0, vhost="vh", group="g", **WHO))
    observer.handle(closed("vh", 3.0))
    observer.observe_open_decision(0.001)
    for family in registry.collect():
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample
            assert set(sample.labels) <= ALLOWED_LABELS, sample
            assert "alice" not in sample.labels.values()
            assert "10.1.2.3" not in sample.labels.values()


def test_metric_names_are_exactly_what_is_exported():
    registry = build_registry(process_metrics=False)
    MetricsObserver(registry)
    LiveCollector(lambda: MetricsSnapshot(), registry=registry)
    exported = set()
    for family in registry.collect():
        exported.add(family.name + "_total" if family.type == "counter" else family.name)
    assert exported == METRIC_NAMES
    assert all(name.startswith("amqp_proxy_") for name in METRIC_NAMES)
    assert len(METRIC_NAMES) == 41


def test_second_observer_on_same_registry_is_refused(registry, observer):
    with pytest.raises(ValueError):
        MetricsObserver(registry)


def test_build_registry_is_dedicated_and_has_process_metrics():
    from prometheus_client import REGISTRY

    first, second = build_registry(), build_registry()
    assert first is not REGISTRY and first is not second
    names = {family.name for family in first.collect()}
    assert "process_cpu_seconds" in names or not names  # /proc may be absent off Linux
    assert not list(build_registry(process_metrics=False).collect())
