"""The /metrics endpoint over real HTTP on loopback: exact sample values, clean stop."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionDenied,
    ConnectionDenyReason,
    LinkDenied,
    LinkDenyReason,
    PolicyReloaded,
)
from amqp_policy_proxy.metrics.collectors import LiveCollector, MetricsSnapshot
from amqp_policy_proxy.metrics.exposition import MetricsServer, start_metrics_server
from amqp_policy_proxy.metrics.observer import METRIC_NAMES, MetricsObserver
from amqp_policy_proxy.metrics.registry import build_registry


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


@pytest.fixture
def server() -> Iterator[tuple[MetricsServer, MetricsObserver]]:
    registry = build_registry(process_metrics=False)
    observer = MetricsObserver(registry)
    snapshot = MetricsSnapshot(
        connections_active={("vh1", "g1"): 3},
        bytes_total={("vh1", "client_to_broker"): 512},
        limits=(("vh1", "", "maxConnections", 50),),
        policy_digest="d1",
    )
    LiveCollector(lambda: snapshot, registry=registry)
    srv = start_metrics_server(registry, "127.0.0.1", 0)
    try:
        yield srv, observer
    finally:
        srv.stop()


def test_scrape_exact_values(server):
    srv, observer = server
    assert srv.port > 0
    assert srv.url == f"http://127.0.0.1:{srv.port}/metrics"
    for _ in range(2):
        observer.handle(ConnectionApproved(conn_id="c", at=1.0, vhost="vh1", group="g1"))
    for _ in range(3):
        observer.handle(
            ConnectionDenied(
                conn_id="c", at=1.0, vhost="vh1", reason=ConnectionDenyReason.REMOTE_HOST
            )
        )
    observer.handle(
        LinkDenied(
            conn_id="c", at=1.0, vhost="vh1", role="sender", address="x",
            reason=LinkDenyReason.TARGET,
        )
    )  # fmt: skip
    observer.handle(PolicyReloaded(at=1.0, digest="d1", result="error"))
    observer.observe_open_decision(0.00004)

    samples = scrape(srv.url)
    assert samples[key("amqp_proxy_connections_approved_total", vhost="vh1", group="g1")] == 2
    denied = "amqp_proxy_connections_denied_total"
    assert samples[key(denied, vhost="vh1", reason="remote_host")] == 3
    assert samples[key("amqp_proxy_connections_denied_total", vhost="", reason="no_vhost")] == 0
    assert (
        samples[key("amqp_proxy_links_denied_total", vhost="vh1", role="sender", reason="target")]
        == 1
    )
    assert samples[key("amqp_proxy_policy_reloads_total", result="error")] == 1
    assert samples[key("amqp_proxy_policy_reloads_total", result="ok")] == 0
    assert samples[key("amqp_proxy_open_decision_seconds_bucket", le="5e-05")] == 1
    assert samples[key("amqp_proxy_open_decision_seconds_bucket", le="2.5e-05")] == 0
    assert samples[key("amqp_proxy_open_decision_seconds_count")] == 1
    assert samples[key("amqp_proxy_connections_active", vhost="vh1", group="g1")] == 3
    assert samples[key("amqp_proxy_bytes_total", vhost="vh1", direction="client_to_broker")] == 512
    assert samples[key("amqp_proxy_limit", vhost="vh1", group="", limit="maxConnections")] == 50
    assert samples[key("amqp_proxy_policy_info", digest="d1")] == 1
    assert samples[key("amqp_proxy_event_log_dropped_total")] == 0
    assert samples[key("amqp_proxy_event_log_errors_total")] == 0

    # Every family is in METRIC_NAMES and nothing else is exported.
    names = {name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
             for name, _ in samples}  # fmt: skip
    assert names <= METRIC_NAMES
    assert not any(name.endswith("_created") for name, _ in samples)

    # A second scrape sees later events.
    observer.handle(PolicyReloaded(at=2.0, digest="d2", result="ok"))
    assert scrape(srv.url)[key("amqp_proxy_policy_reloads_total", result="ok")] == 1


def test_openmetrics_negotiation(server):
    srv, _ = server
    request = urllib.request.Request(
        srv.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    assert text.endswith("# EOF\n")
    assert "_created" not in text


def test_stop_is_idempotent_and_releases_the_port():
    srv = start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", 0)
    port = srv.port
    srv.stop()
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    # The port can be bound again: the listening socket was closed.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def test_context_manager_stops():
    with start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", 0) as srv:
        assert scrape(srv.url) == {}
    assert srv._thread.is_alive() is False


def test_binds_only_the_given_address():
    with start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", 0) as srv:
        assert srv._httpd.socket.getsockname()[0] == "127.0.0.1"


@pytest.mark.parametrize(("host", "port"), [("", 0), ("127.0.0.1", -1), ("127.0.0.1", 65536)])
def test_bad_arguments(host, port):
    with pytest.raises(ValueError):
        start_metrics_server(build_registry(process_metrics=False), host, port)


def test_port_in_use_raises_oserror():
    with start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", 0) as srv:
        with pytest.raises(OSError):
            start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", srv.port)


def test_probes_answer_200_or_503_with_their_text_beside_metrics() -> None:
    state = {"ready": (False, "draining")}
    server = start_metrics_server(build_registry(process_metrics=False), "127.0.0.1", 0,
                                  probes={"/healthz": lambda: (True, "ok"),
                                          "/readyz": lambda: state["ready"]})
    base = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
            assert (resp.status, resp.read()) == (200, b"ok\n")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert err.value.code == 503 and err.value.read() == b"draining\n"
        state["ready"] = (True, "ready: ledger redis")
        with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.stop()
