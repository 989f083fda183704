"""Metrics and event log of a running proxy after real traffic and denials (exact values)."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException, Message
from proton.utils import LinkDetached

from amqp_policy_proxy.eventlog import schema
from tests.support.proxy import ProxyThread

from .test_proxy_e2e import connect, wait_for

pytestmark = pytest.mark.integration


def scrape(proxy: ProxyThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    proxy.call(proxy.daemon.publish_now)
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, text


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_and_event_log_after_real_traffic(broker_address, policy_path, tmp_path):
    events_dir = tmp_path / "events"
    proxy = ProxyThread([broker_address], policy_path=policy_path, metrics=True,
                        event_log_dir=str(events_dir)).start()
    try:
        c = connect(proxy.port, "alice")
        snd = c.create_sender("orders.metrics")
        for _ in range(4):
            snd.send(Message(body=b"x" * 100))
        rcv = c.create_receiver("orders.metrics")
        for _ in range(4):
            rcv.receive(timeout=5)
            rcv.accept()
        with pytest.raises(LinkDetached):
            c.create_receiver("payroll.secret")
        with pytest.raises(ConnectionException):
            connect(proxy.port, "mallory")
        with pytest.raises(ConnectionException):
            connect(proxy.port, "alice", vhost="nowhere")
        held = connect(proxy.port, "carol")
        assert wait_for(lambda: proxy.daemon.ledger.active() == 2)
        samples, text = scrape(proxy)
        assert value(samples, "amqp_proxy_connections_approved_total",
                     vhost="e2e", group="traders") == 1
        assert value(samples, "amqp_proxy_connections_approved_total",
                     vhost="e2e", group="newsreaders") == 1
        assert value(samples, "amqp_proxy_connections_denied_total",
                     vhost="e2e", reason="unknown_user") == 1
        assert value(samples, "amqp_proxy_connections_denied_total",
                     vhost="", reason="no_vhost") == 1
        assert value(samples, "amqp_proxy_links_denied_total",
                     vhost="e2e", role="receiver", reason="source") == 1
        assert value(samples, "amqp_proxy_connections_active", vhost="e2e", group="traders") == 1
        assert value(samples, "amqp_proxy_connections_active",
                     vhost="e2e", group="newsreaders") == 1
        assert value(samples, "amqp_proxy_transfers_total",
                     vhost="e2e", direction="client_to_broker") == 4
        assert value(samples, "amqp_proxy_transfers_total",
                     vhost="e2e", direction="broker_to_client") == 4
        assert value(samples, "amqp_proxy_limit", vhost="e2e", group="",
                     limit="maxConnections") == 20
        # counts and bytes are separate families; unlimited settings have no sample
        assert value(samples, "amqp_proxy_limit", vhost="e2e", group="traders",
                     limit="maxSenders") == 2
        assert value(samples, "amqp_proxy_limit_bytes", vhost="e2e", group="traders",
                     limit="maxMessageSize") == 2000
        assert ("amqp_proxy_limit", (("group", "traders"), ("limit", "maxMessageSize"),
                                     ("vhost", "e2e"))) not in samples
        assert ("amqp_proxy_limit", (("group", "guests"), ("limit", "maxSenders"),
                                     ("vhost", "e2e"))) not in samples  # QDR default: none
        assert not [line for line in text.splitlines()
                    if line.startswith("amqp_proxy_limit") and "2.147483647e+09" in line]
        assert value(samples, "amqp_proxy_event_log_errors_total") == 0
        assert value(samples, "amqp_proxy_open_decision_seconds_count") == 4
        for line in text.splitlines():  # never a user, client host or address in a label
            if line.startswith("amqp_proxy_upstream_up"):
                continue  # the configured upstream's address (127.0.0.1 here), not a client's
            assert "alice" not in line and "127.0.0.1" not in line and "orders" not in line
        promtool = shutil.which("promtool")
        if promtool:
            res = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                                 capture_output=True, check=False)
            assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
        c.close()
        held.close()
        assert wait_for(lambda: proxy.daemon.ledger.active() == 0)
        samples, _ = scrape(proxy)
        assert value(samples, "amqp_proxy_connections_active", vhost="e2e",
                     group="traders") == 0
        assert value(samples, "amqp_proxy_connection_duration_seconds_count", vhost="e2e") == 2
    finally:
        proxy.stop()
    # the event log was flushed on shutdown
    records = [json.loads(line) for f in sorted(Path(events_dir).rglob("*.jsonl"))
               for line in f.read_text().splitlines()]
    names = [r["event"] for r in records]
    # schema 4: every file starts with the writer's proxy_info (no [ledger]: local limits)
    for f in Path(events_dir).rglob("*.jsonl"):
        first = json.loads(f.read_text().splitlines()[0])
        assert (first["event"], first["ledger"], first["fleet"]) == ("proxy_info", "local", None)
    assert names.count(schema.PROXY_INFO) == len(list(Path(events_dir).rglob("*.jsonl")))
    assert names.count(schema.CONNECTION_OPENED) == 2
    assert names.count(schema.CONNECTION_DENIED) == 2
    assert names.count(schema.CONNECTION_CLOSED) == 2
    assert names.count(schema.LINK_DENIED) == 1
    # every Open decision in the audit trail: 2 allowed, 2 denied with their reasons
    decided = sorted((r["decision"], r["reason"]) for r in records
                     if r["event"] == schema.AUTH_DECISION)
    assert decided == [("allow", None), ("allow", None), ("deny", "no_vhost"),
                       ("deny", "unknown_user")]
    for r in records:
        allowed = set(schema.COMMON_FIELDS) | set(schema.EVENT_FIELDS[r["event"]])
        assert set(r) <= allowed and r["schema_version"] == schema.SCHEMA_VERSION == 4
        assert not {"password", "initial_response", "response"} & set(r)
        assert "secret" not in [v for v in r.values() if isinstance(v, str)]
    closed = [r for r in records if r["event"] == schema.CONNECTION_CLOSED and r["user"] == "alice"]
    assert closed[0]["transfers_in"] == 4 and closed[0]["transfers_out"] == 4
    assert closed[0]["max_receivers"] == 1 and closed[0]["max_senders"] == 1
    link = [r for r in records if r["event"] == schema.LINK_DENIED][0]
    assert (link["address"], link["reason"], link["role"]) == ("payroll.secret", "source",
                                                              "receiver")
    assert all(r.get("remote_host") in ("127.0.0.1", None) for r in records)
