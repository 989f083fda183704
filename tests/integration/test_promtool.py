"""Prometheus tooling against our artefacts: promtool on rules/metrics, and a real server scrape."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

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
from amqp_policy_proxy.metrics.exposition import MetricsServer, start_metrics_server
from amqp_policy_proxy.metrics.observer import MetricsObserver
from amqp_policy_proxy.metrics.registry import build_registry

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
)
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def feed(observer: MetricsObserver) -> None:
    """Emit one event of every type, and three remote_host denials on vh1."""
    who = {"vhost": "vh1", "group": "g1", "user": "alice", "remote_host": "10.0.0.7"}
    observer.handle(ConnectionApproved(conn_id="c1", at=1.0, **who))
    for i in range(3):
        observer.handle(
            ConnectionDenied(
                conn_id=f"d{i}", at=1.0, **who, reason=ConnectionDenyReason.REMOTE_HOST
            )
        )
    observer.handle(SessionDenied(conn_id="c1", at=2.0, **who))
    observer.handle(
        LinkDenied(conn_id="c1", at=2.0, **who, role="receiver", address="q",
                   reason=LinkDenyReason.SOURCE)
    )  # fmt: skip
    observer.handle(
        MessageDenied(conn_id="c1", at=2.0, **who, address="q",
                      reason=MessageDenyReason.MESSAGE_SIZE, size=10)
    )  # fmt: skip
    observer.handle(
        ProtocolViolation(conn_id="c1", at=2.0, **who, side="client",
                          condition="amqp:connection:framing-error", description="x")
    )  # fmt: skip
    observer.handle(
        ConnectionClosed(
            conn_id="c1", at=3.0, **who, opened_at=1.0, duration_seconds=2.0, bytes_in=1,
            bytes_out=1, transfers_in=0, transfers_out=0, max_sessions=1, max_senders=0,
            max_receivers=1, close_reason="client_close",
        )
    )  # fmt: skip
    observer.handle(UpstreamConnectFailed(conn_id="c2", at=3.0, upstream="127.0.0.1:1"))
    observer.handle(PolicyReloaded(at=4.0, digest="abc", result="ok"))
    observer.observe_open_decision(0.0003)
    observer.event_log_dropped(2)


@pytest.fixture
def endpoint() -> Iterator[tuple[MetricsServer, MetricsObserver]]:
    registry = build_registry()  # with process_* metrics, as the daemon runs it
    observer = MetricsObserver(registry)
    snapshot = MetricsSnapshot(
        connections_active={("vh1", "g1"): 4},
        bytes_total={("vh1", "client_to_broker"): 100, ("vh1", "broker_to_client"): 200},
        transfers_total={("vh1", "client_to_broker"): 1, ("vh1", "broker_to_client"): 2},
        limits=(("vh1", "", "maxConnections", 10), ("vh1", "g1", "maxFrameSize", 16384)),
        policy_digest="abc",
    )
    LiveCollector(lambda: snapshot, registry=registry)
    server = start_metrics_server(registry, "127.0.0.1", 0)
    try:
        yield server, observer
    finally:
        server.stop()


@needs_promtool
def test_promtool_check_rules():
    result = promtool("check", "rules", str(DASHBOARDS / "alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_test_rules():
    result = promtool("test", "rules", str(DASHBOARDS / "alerts.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path):
    """Every dashboard query, with Grafana's variables filled in, parses as PromQL."""
    dashboard = json.loads((DASHBOARDS / "amqp-policy-proxy.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    substitutions = {
        "$__rate_interval": "1m", "$__interval": "30s", "$job": "amqp-policy-proxy",
        "$instance": ".*", "$vhost": ".*",
    }  # fmt: skip
    rules = []
    for i, expr in enumerate(exprs):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_check_metrics_on_a_real_scrape(endpoint):
    server, observer = endpoint
    feed(observer)
    with urllib.request.urlopen(server.url, timeout=5) as response:
        text = response.read().decode()
    assert 'amqp_proxy_connections_denied_total{reason="remote_host",vhost="vh1"} 3.0' in text
    assert 'amqp_proxy_limit_bytes{group="g1",limit="maxFrameSize",vhost="vh1"} 16384.0' in text
    assert "amqp_proxy_event_log_errors_total 0.0" in text
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def query(base: str, promql: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except OSError as exc:  # server not listening yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus server not installed")
def test_real_prometheus_scrapes_the_denial_counter(endpoint, tmp_path, request):
    server, observer = endpoint
    feed(observer)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "amqp-policy-proxy",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}],
                    }
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("w")
    assert PROMETHEUS is not None
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def finalize() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            process.kill()
            process.wait(timeout=5)
        log.close()

    request.addfinalizer(finalize)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200

    wait_for(ready, 30, "prometheus ready")

    result = wait_for(
        lambda: query(base, "amqp_proxy_connections_denied_total"), 20, "a scraped sample"
    )
    # Prometheus stores an empty label value as an absent label: vhost="" has no vhost.
    by_reason = {}
    for r in result:
        labels, (_, value) = r["metric"], r["value"]  # type: ignore[misc]
        by_reason[(labels.get("vhost", ""), labels["reason"])] = value
    assert by_reason[("vh1", "remote_host")] == "3"
    assert by_reason[("", "global_limit")] == "0"
    for r in result:
        assert r["metric"]["job"] == "amqp-policy-proxy"  # type: ignore[index]
        assert r["metric"]["instance"] == f"127.0.0.1:{server.port}"  # type: ignore[index]

    # A later denial shows up at the next scrape: the counter is live, not a one-off.
    observer.handle(
        ConnectionDenied(conn_id="d9", at=9.0, vhost="vh1", reason=ConnectionDenyReason.REMOTE_HOST)
    )
    promql = 'amqp_proxy_connections_denied_total{vhost="vh1", reason="remote_host"}'
    wait_for(
        lambda: [r for r in query(base, promql) if r["value"][1] == "4"],  # type: ignore[index]
        20,
        "the fourth denial",
    )
    assert query(base, 'up{job="amqp-policy-proxy"}')[0]["value"][1] == "1"  # type: ignore[index]
