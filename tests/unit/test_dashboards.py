"""The Grafana dashboard and the alert rules only use metrics the daemon exports (§4.3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from amqp_policy_proxy.metrics.observer import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "amqp-policy-proxy.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"
ALERT_TESTS = ROOT / "dashboards" / "alerts.test.yml"
README = ROOT / "dashboards" / "README.md"

METRIC_TOKEN = re.compile(r"amqp_proxy_[a-z_]+")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def referenced_metrics(expr: str) -> set[str]:
    return {HISTOGRAM_SUFFIX.sub("", token) for token in METRIC_TOKEN.findall(expr)}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def test_dashboard_is_importable_json(dashboard):
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] == "amqp-policy-proxy"
    assert dashboard["title"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert dashboard["id"] is None  # import creates a new dashboard


def test_datasource_and_vhost_variables(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    datasource = variables["datasource"]
    assert (datasource["type"], datasource["query"]) == ("datasource", "prometheus")
    vhost = variables["vhost"]
    assert vhost["type"] == "query"
    assert vhost["query"]["query"].startswith("label_values(amqp_proxy_")
    assert vhost["includeAll"] and vhost["allValue"] == ".*"  # "All" also matches vhost=""


def test_every_panel_uses_the_datasource_variable(dashboard):
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_metrics_are_exported(dashboard):
    used: set[str] = set()
    for expr in dashboard_exprs(dashboard):
        names = referenced_metrics(expr)
        assert names <= METRIC_NAMES, (expr, names - METRIC_NAMES)
        used |= names
    # And every exported family is on the dashboard somewhere.
    assert used == METRIC_NAMES, METRIC_NAMES - used


def test_dashboard_required_panels(dashboard):
    exprs = "\n".join(dashboard_exprs(dashboard))
    selector = 'job=~"$job", instance=~"$instance", vhost=~"$vhost"'
    assert f'amqp_proxy_limit{{{selector}, limit="maxConnections"' in exprs
    for q in ("0.5", "0.95", "0.99"):
        bucket_rate = "rate(amqp_proxy_open_decision_seconds_bucket"
        assert f"histogram_quantile({q}, sum by (le) ({bucket_rate}" in exprs
    assert "sum by (reason) (rate(amqp_proxy_connections_denied_total" in exprs
    assert "sum by (vhost, direction) (rate(amqp_proxy_bytes_total" in exprs


def test_alert_rules_are_complete(rules):
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
    exprs = {rule["alert"]: " ".join(rule["expr"].split()) for rule in rules}
    assert exprs["AmqpProxyDown"] == 'up{job="amqp-policy-proxy"} == 0'
    assert "amqp_proxy_limit{limit=\"maxConnections\", group=\"\"}" in exprs[
        "AmqpProxyVhostNearConnectionLimit"
    ]
    assert exprs["AmqpProxyVhostNearConnectionLimit"].endswith("> 0.9")


def test_alert_metrics_are_exported(rules):
    for rule in rules:
        names = referenced_metrics(rule["expr"])
        assert names <= METRIC_NAMES, (rule["alert"], names - METRIC_NAMES)
        assert names or "up{" in rule["expr"], rule["alert"]


def test_every_alert_has_a_runbook_section_and_a_unit_test(rules):
    readme = README.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in readme.splitlines()
        if line.startswith("#")
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    for rule in rules:
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, rule["alert"]
        assert rule["alert"] in tested, rule["alert"]
