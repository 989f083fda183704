"""The contract with the daemon: records written by eventlog.records/sinks read back here.

Uses the daemon's own record builder and serialiser (not the report's code) to write a small
log, then reads it with the report's reader and checks every value the report relies on.
"""

from __future__ import annotations

from amqp_policy_proxy.core import events as ce
from amqp_policy_proxy.eventlog import schema
from amqp_policy_proxy.eventlog.records import to_record
from amqp_policy_proxy.eventlog.sinks import dumps_record
from amqp_policy_proxy.spark_reports.events import prepare_events
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events

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
