"""The Grafana dashboard and the alert rules only use metrics the daemon exports
(docs/observability.md), and every alert has a runbook section in docs/alerts.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from amqp_policy_proxy.metrics.observer import METRIC_NAMES
from amqp_policy_proxy.metrics.registry import build_registry
from amqp_policy_proxy.policy.keys import BYTE_LIMIT_NAMES, LIMIT_NAMES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "amqp-policy-proxy.json"
ALERTS = ROOT / "dashboards" / "alerts.yml"
ALERT_TESTS = ROOT / "dashboards" / "alerts.test.yml"
RUNBOOK = ROOT / "docs" / "alerts.md"

METRIC_TOKEN = re.compile(r"amqp_proxy_[a-z_]+")
PROCESS_TOKEN = re.compile(r"process_[a-z_]+")
HISTOGRAM_SUFFIX = re.compile(r"_(bucket|sum|count)$")
#: prometheus_client's process collector, registered by build_registry (Linux only).
PROCESS_METRICS = {"process_open_fds", "process_max_fds"}
#: amqp_proxy_limit selectors: limit="X" and group="" / group!="".
LIMIT_SELECTOR = re.compile(r'(amqp_proxy_limit(?:_bytes)?)\{([^}]*)\}')
VHOST_LEVEL_LIMITS = {"maxConnections", "maxConnectionsPerUser", "maxConnectionsPerHost"}


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
        process = set(PROCESS_TOKEN.findall(rule["expr"]))
        assert process <= PROCESS_METRICS, (rule["alert"], process)
        assert names or process or "up{" in rule["expr"], rule["alert"]


def test_the_process_metrics_used_are_exported():
    exported = {family.name for family in build_registry().collect()}
    assert PROCESS_METRICS <= exported


def limit_selectors(exprs: list[str]) -> list[tuple[str, str | None, str | None]]:
    """(family, limit, group matcher) of every amqp_proxy_limit / _bytes selector."""
    found = []
    for expr in exprs:
        for family, matchers in LIMIT_SELECTOR.findall(expr):
            limit = re.search(r'limit="([^"]*)"', matchers)
            group = re.search(r'group(!?=)""', matchers)
            found.append((family, limit and limit.group(1), group and group.group(1)))
    return found


def test_limit_queries_select_series_that_exist(dashboard, rules):
    """A limit query must name a limit exported at that level and in that family: groups have
    no maxConnections (the bug this replaces), byte limits are amqp_proxy_limit_bytes."""
    exprs = dashboard_exprs(dashboard) + [rule["expr"] for rule in rules]
    selectors = limit_selectors(exprs)
    assert selectors
    for family, limit, group in selectors:
        if limit is None:
            continue
        assert limit in LIMIT_NAMES, limit
        assert (family == "amqp_proxy_limit_bytes") == (limit in BYTE_LIMIT_NAMES), (family, limit)
        if group == "!=":  # group level
            assert limit not in {"maxConnections"}, (family, limit, group)
        if group == "=":  # vhost level
            assert limit in VHOST_LEVEL_LIMITS, (family, limit, group)


def test_file_descriptor_panel_and_alert(dashboard, rules):
    exprs = dashboard_exprs(dashboard)
    assert any(e.startswith("process_open_fds{") for e in exprs)
    assert any(e.startswith("process_max_fds{") for e in exprs)
    rule = next(r for r in rules if r["alert"] == "AmqpProxyFileDescriptorsNearLimit")
    assert " ".join(rule["expr"].split()) == (
        'process_open_fds{job="amqp-policy-proxy"} / process_max_fds{job="amqp-policy-proxy"} '
        "> 0.8")
    assert rule["for"] == "5m"


def test_event_log_write_errors_are_shown_and_alerted(dashboard, rules):
    assert any("amqp_proxy_event_log_errors_total" in e for e in dashboard_exprs(dashboard))
    rule = next(r for r in rules if r["alert"] == "AmqpProxyEventLogWriteErrors")
    assert "amqp_proxy_event_log_errors_total" in rule["expr"]


def runbook_sections() -> dict[str, str]:
    """docs/alerts.md: GitHub-style anchor of each ``## `` heading -> its text."""
    sections: dict[str, str] = {}
    anchor = None
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("## "):
            title = line[3:].strip().lower()
            anchor = re.sub(r"[^a-z0-9 -]", "", title).replace(" ", "-")
            sections[anchor] = ""
        elif anchor is not None:
            sections[anchor] += line + "\n"
    return sections


def test_every_alert_has_a_runbook_url_section_and_a_unit_test(rules):
    sections = runbook_sections()
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    for rule in rules:
        annotations = rule["annotations"]
        assert "runbook" not in annotations, rule["alert"]  # the standard name only
        url = annotations["runbook_url"]
        assert url == f"docs/alerts.md#{rule['alert'].lower()}", rule["alert"]
        text = sections[url.split("#", 1)[1]]
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in text, (rule["alert"], part)
        assert rule["alert"] in tested, rule["alert"]
    # and no section for an alert that does not exist
    assert set(sections) == {rule["alert"].lower() for rule in rules}
