"""The contract with the daemon: records written by eventlog.records/sinks read back here.

Uses the daemon's own record builder and serialiser (not the report's code) to write a small
log, then reads it with the report's reader and checks every value the report relies on.
"""

from __future__ import annotations

from amqp_policy_proxy.core import events as ce
from amqp_policy_proxy.eventlog import schema
from amqp_policy_proxy.eventlog.records import to_record
from amqp_policy_proxy.eventlog.sinks import dumps_record
from amqp_policy_proxy.spark_reports.common import ReportWindow
from amqp_policy_proxy.spark_reports.events import prepare_events
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from amqp_policy_proxy.spark_reports.traffic import denials, top_denied

T0 = 1_795_255_200.0  # 2026-11-21T10:00:00Z; the loop clock is offset by this much


def test_daemon_records_read_back(spark, tmp_path):
    common = {"vhost": "v1", "group": "g1", "user": "alice", "remote_host": "10.0.0.1",
              "listener": "0.0.0.0:5672"}
    evs = [
        ce.ConnectionApproved(conn_id="1", at=10.0, **common),
        ce.ConnectionDenied(conn_id="2", at=20.25, reason=ce.ConnectionDenyReason.USER_LIMIT,
                            condition="amqp:resource-limit-exceeded",
                            description="connection disallowed by local policy", **common),
        ce.LinkDenied(conn_id="1", at=30.0, role="sender", address="q",
                      reason=ce.LinkDenyReason.TARGET, **common),
        ce.ConnectionClosed(conn_id="1", at=70.5, opened_at=10.0, duration_seconds=60.5,
                            bytes_in=100, bytes_out=200, transfers_in=1, transfers_out=2,
                            max_sessions=1, max_senders=1, max_receivers=0,
                            close_reason="client_close", **common),
        ce.PolicyReloaded(at=80.0, digest="abc", result="ok"),
    ]
    lines = [dumps_record(to_record(e, wall_offset=T0)) for e in evs]
    path = tmp_path / "dt=2026-11-21" / "hour=10"
    path.mkdir(parents=True)
    (path / schema.partition_path("2026-11-21", 10, "hostA", 42).split("/")[-1]).write_text(
        "\n".join(lines) + "\n")

    raw = read_events(spark, str(tmp_path))
    assert raw.count() == len(evs)  # every record parses with the explicit schema
    rows = {r.event: r for r in prepare_events(raw).collect()}
    assert set(rows) == {"connection_opened", "connection_denied", "connection_closed"}
    t0_us = int(T0 * 1_000_000)
    opened, closed = rows["connection_opened"], rows["connection_closed"]
    assert (opened.proxy, opened.conn_id, opened.t_us) == ("hostA-42", "1", t0_us + 10_000_000)
    assert (closed.t_us, closed.opened_us) == (t0_us + 70_500_000, t0_us + 10_000_000)
    assert (closed.bytes_in, closed.transfers_out, closed.duration_seconds) == (100, 2, 60.5)
    assert rows["connection_denied"].reason == "user_limit"
    assert rows["connection_denied"].t_us == t0_us + 20_250_000


def test_schema_versions_1_and_2_read_together(spark, tmp_path):
    """Version 2 adds ``balancer_host`` (connections through a PROXY-protocol load balancer);
    a log holding version-1 records and version-2 records with and without it reads as one,
    the field null where absent, and the reports count the client's address from the header."""
    v1_line = ('{"schema_version":1,"event":"connection_opened","ts":"2026-11-21T10:00:05.000Z",'
               '"conn_id":"9","vhost":"v1","group":"g1","user":"bob","remote_host":"10.0.0.9",'
               '"listener":"0.0.0.0:5672"}')
    proxied = ce.ConnectionApproved(conn_id="1", at=10.0, vhost="v1", group="g1", user="alice",
                                    remote_host="192.0.2.7", listener="0.0.0.0:5672",
                                    balancer_host="10.0.0.2")
    direct = ce.ConnectionApproved(conn_id="2", at=11.0, vhost="v1", group="g1", user="carol",
                                   remote_host="10.0.0.3", listener="0.0.0.0:5673")
    lines = [v1_line] + [dumps_record(to_record(e, wall_offset=T0)) for e in (proxied, direct)]
    path = tmp_path / "dt=2026-11-21" / "hour=10"
    path.mkdir(parents=True)
    (path / "events-hostA-42.jsonl").write_text("\n".join(lines) + "\n")

    raw = read_events(spark, str(tmp_path))
    got = {r.conn_id: (r.schema_version, r.remote_host, r.balancer_host)
           for r in raw.collect()}
    now = schema.SCHEMA_VERSION  # what the daemon writes today: version 2's fields and more
    assert got == {"9": (1, "10.0.0.9", None), "1": (now, "192.0.2.7", "10.0.0.2"),
                   "2": (now, "10.0.0.3", None)}
    prepared = {r.conn_id: r.remote_host for r in prepare_events(raw).collect()}
    assert prepared == {"9": "10.0.0.9", "1": "192.0.2.7", "2": "10.0.0.3"}


def test_rate_denials_reach_the_denials_tables(spark, tmp_path):
    """Connections over a connection rate (issue 20) are denials like any other: the daemon's
    records carry their reasons, and the report's denials and top_denied tables count them."""
    common = {"group": "g1", "user": "alice", "remote_host": "10.0.0.1",
              "listener": "0.0.0.0:5672"}
    reasons = [ce.ConnectionDenyReason.USER_RATE, ce.ConnectionDenyReason.USER_RATE,
               ce.ConnectionDenyReason.HOST_RATE, ce.ConnectionDenyReason.VHOST_RATE]
    evs = [ce.ConnectionDenied(conn_id=str(i), at=10.0 + i, reason=r, vhost="v1",
                               condition="amqp:resource-limit-exceeded",
                               description="connection disallowed by local policy", **common)
           for i, r in enumerate(reasons)]
    evs.append(ce.ConnectionDenied(conn_id="g", at=15.0, remote_host="10.0.0.9",
                                   listener="0.0.0.0:5672",
                                   reason=ce.ConnectionDenyReason.GLOBAL_RATE))
    records = [to_record(e, wall_offset=T0) for e in evs]
    path = tmp_path / "dt=2026-11-21" / "hour=10"
    path.mkdir(parents=True)
    (path / schema.partition_path("2026-11-21", 10, "hostA", 42).split("/")[-1]).write_text(
        "\n".join(dumps_record(r) for r in records) + "\n")
    events = prepare_events(read_events(spark, str(tmp_path)))
    window = ReportWindow(int(T0 * 1e6), int((T0 + 3600) * 1e6), 3_600_000_000)
    counted = {(r.vhost, r.reason): r["count"] for r in denials(events, window).collect()}
    assert counted == {("v1", "user_rate"): 2, ("v1", "host_rate"): 1, ("v1", "vhost_rate"): 1,
                       (None, "global_rate"): 1}
    top = {(r.scope, r.key): (r["count"], r.top_reason)
           for r in top_denied(events, window).collect()}
    assert top[("user", "alice")] == (4, "user_rate")
    assert top[("remote_host", "10.0.0.9")] == (1, "global_rate")
