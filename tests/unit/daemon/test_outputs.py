"""The event log's proxy_info header (schema 4): which fleet a [ledger] makes."""

from __future__ import annotations

from amqp_policy_proxy.daemon.config import DaemonConfig
from amqp_policy_proxy.daemon.outputs import fleet_name, proxy_info_header
from amqp_policy_proxy.fleet.ledger import LedgerSettings

TS = "2026-11-21T10:00:00.000Z"


def test_fleet_name_leaves_credentials_out_and_qualifies_local_stores():
    assert fleet_name("redis://10.0.0.5:6379/0") == "redis://10.0.0.5:6379/0"
    assert fleet_name("rediss://app:s3cret@redis.example:6380/2") == \
        "rediss://redis.example:6380/2"
    assert fleet_name("unix:///run/amqp/redis.sock", host="h1") == \
        "unix:///run/amqp/redis.sock@h1"
    assert fleet_name("auto", host="h1") == "auto@h1"


def test_header_says_local_without_a_ledger():
    record = proxy_info_header(DaemonConfig(), lambda: "ignored")(TS)
    assert (record["event"], record["ts"], record["ledger"], record["fleet"],
            record["proxy_id"]) == ("proxy_info", TS, "local", None, "")


def test_header_says_fleet_with_a_ledger_and_names_the_proxy_once_known():
    settings = LedgerSettings(url="redis://u:pw@10.0.0.5:6379/0", proxy_id="")
    config = DaemonConfig(ledger=settings)
    named = {"id": ""}
    header = proxy_info_header(config, lambda: named["id"])
    assert (header(TS)["ledger"], header(TS)["fleet"], header(TS)["proxy_id"]) == (
        "fleet", "redis://10.0.0.5:6379/0", "")
    named["id"] = "px-1:5672"
    assert header(TS)["proxy_id"] == "px-1:5672"
    assert "pw" not in str(header(TS))
