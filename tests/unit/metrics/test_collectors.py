"""LiveCollector: scrape-time families from an injected snapshot (client_python's pattern)."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from amqp_policy_proxy.metrics.collectors import DIRECTIONS, LiveCollector, MetricsSnapshot

SNAPSHOT = MetricsSnapshot(
    connections_active={("vh1", "admins"): 2, ("vh1", "$default"): 5, ("vh2", "g"): 0},
    bytes_total={("vh1", "client_to_broker"): 1234, ("vh1", "broker_to_client"): 98765},
    transfers_total={("vh1", "client_to_broker"): 10, ("vh1", "broker_to_client"): 42},
    limits=(
        ("vh1", "", "maxConnections", 100),
        ("vh1", "admins", "maxConnectionsPerUser", 4),
        ("vh1", "admins", "maxFrameSize", 16384),
        ("vh1", "admins", "maxMessageSize", 1048576),
        ("vh1", "admins", "maxSessionWindow", 65536),
        ("vh1", "admins", "maxSessions", 10),
        ("vh2", "", "maxConnections", 10),
    ),
    policy_digest="sha256:abc123",
)


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    LiveCollector(lambda: SNAPSHOT, registry=registry)
    return registry


def test_connections_active(registry):
    get = registry.get_sample_value
    assert get("amqp_proxy_connections_active", {"vhost": "vh1", "group": "admins"}) == 2
    assert get("amqp_proxy_connections_active", {"vhost": "vh1", "group": "$default"}) == 5
    assert get("amqp_proxy_connections_active", {"vhost": "vh2", "group": "g"}) == 0


def test_traffic_counters(registry):
    get = registry.get_sample_value
    labels = {"vhost": "vh1", "direction": "client_to_broker"}
    assert get("amqp_proxy_bytes_total", labels) == 1234
    assert get("amqp_proxy_transfers_total", labels) == 10
    labels = {"vhost": "vh1", "direction": "broker_to_client"}
    assert get("amqp_proxy_bytes_total", labels) == 98765
    assert get("amqp_proxy_transfers_total", labels) == 42
    assert DIRECTIONS == ("client_to_broker", "broker_to_client")


def test_limits(registry):
    get = registry.get_sample_value
    assert get("amqp_proxy_limit", {"vhost": "vh1", "group": "", "limit": "maxConnections"}) == 100
    labels = {"vhost": "vh1", "group": "admins", "limit": "maxConnectionsPerUser"}
    assert get("amqp_proxy_limit", labels) == 4
    assert get("amqp_proxy_limit", {"vhost": "vh2", "group": "", "limit": "maxConnections"}) == 10
    assert get("amqp_proxy_limit", {"vhost": "vh1", "group": "admins", "limit": "maxSessions"}) == 10


def test_byte_limits_are_their_own_family(registry):
    get = registry.get_sample_value
    for name, size in (("maxFrameSize", 16384), ("maxMessageSize", 1048576),
                       ("maxSessionWindow", 65536)):
        labels = {"vhost": "vh1", "group": "admins", "limit": name}
        assert get("amqp_proxy_limit_bytes", labels) == size
        assert get("amqp_proxy_limit", labels) is None
    assert get("amqp_proxy_limit_bytes",
               {"vhost": "vh1", "group": "admins", "limit": "maxSessions"}) is None


def test_unlimited_settings_have_no_sample():
    """A compiled policy's defaults (maxSenders 2147483647, no maxSessions, maxFrameSize 0):
    no sample at all, never 2147483647 or 0."""
    from amqp_policy_proxy.policy.compile import compile_policy

    policy = compile_policy([(None, [{"hostname": "v", "groups": {
        "g": {"users": "u", "remoteHosts": "*", "maxSenders": 0, "maxFrameSize": 0}}}])])
    registry = CollectorRegistry(auto_describe=True)
    snapshot = MetricsSnapshot(limits=tuple(policy.limits_table()))
    LiveCollector(lambda: snapshot, registry=registry)
    text = generate_latest(registry).decode()
    assert "2147483647" not in text and "2.147483647e+09" not in text
    limits = {s.labels["limit"] for f in registry.collect() for s in f.samples
              if f.name in ("amqp_proxy_limit", "amqp_proxy_limit_bytes")
              and s.labels["group"] == "g"}
    assert limits == {"maxConnectionsPerUser", "maxConnectionsPerHost"}


def test_policy_info(registry):
    assert registry.get_sample_value("amqp_proxy_policy_info", {"digest": "sha256:abc123"}) == 1


def test_types_in_exposition(registry):
    text = generate_latest(registry).decode()
    assert "# TYPE amqp_proxy_connections_active gauge" in text
    assert "# TYPE amqp_proxy_bytes_total counter" in text
    assert "# TYPE amqp_proxy_transfers_total counter" in text
    assert "# TYPE amqp_proxy_limit gauge" in text
    assert "# TYPE amqp_proxy_limit_bytes gauge" in text
    assert "# TYPE amqp_proxy_policy_info gauge" in text
    assert "_created" not in text


def test_empty_snapshot_yields_empty_families():
    collector = LiveCollector(MetricsSnapshot)
    families = list(collector.collect())
    assert [f.name for f in families] == [
        "amqp_proxy_connections_active",
        "amqp_proxy_bytes",
        "amqp_proxy_transfers",
        "amqp_proxy_limit",
        "amqp_proxy_limit_bytes",
        "amqp_proxy_policy_info",
        "amqp_proxy_throttled_seconds",
        "amqp_proxy_shaped_messages",
        "amqp_proxy_shaped_bytes",
        "amqp_proxy_ledger_mode",
        "amqp_proxy_sasl_failure_hosts",
        "amqp_proxy_upstream_up",
        "amqp_proxy_ledger_proxies",
        "amqp_proxy_jwks_age_seconds",
        "amqp_proxy_jwks_usable",
        "amqp_proxy_jwks_keys",
        "amqp_proxy_jwks_fetch_failures",
        "amqp_proxy_bans_active",
    ]
    assert all(not f.samples for f in families
               if f.name not in ("amqp_proxy_ledger_mode", "amqp_proxy_bans_active"))
    # the ledger's mode is always exported: in-process without [ledger]
    assert {s.labels["mode"]: s.value for s in families[9].samples} == {
        "redis": 0, "local-share": 0, "closed": 0, "open": 0, "in-process": 1}


def test_shaping_counters_per_vhost_and_group():
    registry = CollectorRegistry()
    snap = MetricsSnapshot(shaping={("v", "g"): (2.5, 10, 1000)})
    LiveCollector(lambda: snap, registry=registry)
    labels = {"vhost": "v", "group": "g"}
    assert registry.get_sample_value("amqp_proxy_throttled_seconds_total", labels) == 2.5
    assert registry.get_sample_value("amqp_proxy_shaped_messages_total", labels) == 10
    assert registry.get_sample_value("amqp_proxy_shaped_bytes_total", labels) == 1000


def test_snapshot_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SNAPSHOT.policy_digest = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        MetricsSnapshot().connections_active[("a", "b")] = 1  # type: ignore[index]


def test_register_does_not_call_source():
    def source() -> MetricsSnapshot:
        raise AssertionError("describe must not read the snapshot")

    LiveCollector(source, registry=CollectorRegistry(auto_describe=True))


def test_source_is_read_once_per_scrape_and_swaps_are_seen():
    calls = []
    current = [MetricsSnapshot(connections_active={("vh", "g"): 1})]

    def source() -> MetricsSnapshot:
        calls.append(threading.current_thread().name)
        return current[0]

    registry = CollectorRegistry()
    LiveCollector(source, registry=registry)
    labels = {"vhost": "vh", "group": "g"}
    assert registry.get_sample_value("amqp_proxy_connections_active", labels) == 1
    assert len(calls) == 1
    current[0] = MetricsSnapshot(connections_active={("vh", "g"): 7})  # the loop's swap
    assert registry.get_sample_value("amqp_proxy_connections_active", labels) == 7
    assert len(calls) == 2


def test_duplicate_registration_is_refused(registry):
    with pytest.raises(ValueError):
        LiveCollector(MetricsSnapshot, registry=registry)


def test_bans_active_per_kind_zero_from_the_start():
    families = {f.name: f for f in LiveCollector(MetricsSnapshot).collect()}
    assert {s.labels["kind"]: s.value for s in families["amqp_proxy_bans_active"].samples} == {
        "user": 0, "host": 0}
    snap = MetricsSnapshot(bans_active={"user": 2, "host": 1})
    families = {f.name: f for f in LiveCollector(lambda: snap).collect()}
    assert {s.labels["kind"]: s.value for s in families["amqp_proxy_bans_active"].samples} == {
        "user": 2, "host": 1}
