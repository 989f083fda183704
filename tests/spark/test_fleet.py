"""Fleet-wide limits: the proxies of a fleet are summed before their counts meet a limit.

Two proxies' logs, written with the daemon's own record builder: alice holds 2 connections
on proxy pa and 1 on proxy pb at once (10:01:00-10:03:00), and is denied twice on pb. With a
fleet ledger (``[ledger]``) her fleet-wide limit of 3 is reached: 3 of 3; each proxy alone
saw at most 2.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from amqp_policy_proxy.core import events as ce
from amqp_policy_proxy.eventlog.records import format_ts, proxy_info_record, to_record
from amqp_policy_proxy.eventlog.sinks import dumps_record
from amqp_policy_proxy.spark_reports.common import ReportWindow
from amqp_policy_proxy.spark_reports.concurrency import concurrency
from amqp_policy_proxy.spark_reports.events import prepare_events, prepare_sweep
from amqp_policy_proxy.spark_reports.fleet import limit_scope
from amqp_policy_proxy.spark_reports.jobs.capacity import main, read_events

T0 = 1_795_255_200.0  # 2026-11-21T10:00:00Z
COMMON = {"vhost": "v1", "group": "g1", "user": "alice", "listener": "0.0.0.0:5672"}

# proxy -> (conn_id, host, open s, close s) of alice's connections, seconds after 10:00
CONNECTIONS = {
    "pa-1": [("1", "10.0.0.1", 10, 180), ("2", "10.0.0.1", 60, 200)],
    "pb-2": [("1", "10.0.0.2", 50, 240)],
}


def write_fleet_log(root: Path, ledgers: dict[str, tuple[str, str | None] | None]) -> Path:
    """Write both proxies' hour-10 files under ``root``.

    Args:
        ledgers: proxy -> (``ledger``, ``fleet``) of its proxy_info header, or None for no
            header (a log older than schema 4).
    """
    d = root / "dt=2026-11-21" / "hour=10"
    d.mkdir(parents=True)
    for proxy, conns in CONNECTIONS.items():
        evs: list[object] = []
        for cid, host, t_open, t_close in conns:
            evs.append(ce.ConnectionApproved(conn_id=cid, at=float(t_open), remote_host=host,
                                             **COMMON))
            evs.append(ce.ConnectionClosed(
                conn_id=cid, at=float(t_close), opened_at=float(t_open),
                duration_seconds=float(t_close - t_open), bytes_in=1, bytes_out=1,
                transfers_in=0, transfers_out=0, max_sessions=1, max_senders=0,
                max_receivers=0, close_reason="client_close", remote_host=host, **COMMON))
        if proxy == "pb-2":  # the fleet's ledger refused her fourth and fifth connection
            for i, at in enumerate((70.0, 90.0)):
                evs.append(ce.ConnectionDenied(
                    conn_id=str(10 + i), at=at, reason=ce.ConnectionDenyReason.USER_LIMIT,
                    condition="amqp:resource-limit-exceeded", description="limit",
                    remote_host="10.0.0.2", **COMMON))
        records = sorted((to_record(e, wall_offset=T0) for e in evs), key=lambda r: r["ts"])
        lines = [dumps_record(r) for r in records]
        info = ledgers.get(proxy)
        if info is not None:
            ledger, fleet = info
            lines.insert(0, dumps_record(proxy_info_record(
                format_ts(T0 + 10), ledger=ledger, fleet=fleet, proxy_id=proxy)))
        (d / f"events-{proxy}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _policy(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.json"
    policy.write_text('[["vhost", {"hostname": "v1", "maxConnections": 10, '
                      '"maxConnectionsPerUser": 3, "maxConnectionsPerHost": 3}]]')
    return policy


def _headroom(out: Path) -> dict[tuple[str, str], tuple[str, str]]:
    with open(out / "headroom.csv", newline="") as f:
        return {(r["scope"], r["key"]): (r["peak"], r["limit"]) for r in csv.DictReader(f)}


def _run(tmp_path: Path, ev: Path, *extra: str) -> Path:
    out = tmp_path / "out"
    assert main(["--events", str(ev), "--policy", str(_policy(tmp_path)), "--out", str(out),
                 "--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T10:05:00Z",
                 *extra]) == 0
    return out


FLEET = ("fleet", "redis://10.0.0.5:6379/0")


@pytest.mark.parametrize("case", ["recorded", "flag"])
def test_fleet_wide_limit_shows_the_fleet_sum(spark, tmp_path, case):
    """Recorded by the proxies (schema 4 proxy_info) or given with --fleet on an older log:
    alice is at 3 of her fleet-wide 3; the vhost at 3 of 10; each host alone."""
    if case == "recorded":
        out = _run(tmp_path, write_fleet_log(tmp_path / "ev", {p: FLEET for p in CONNECTIONS}))
        said = "fleet-wide for the proxies that recorded a fleet ledger"
    else:
        out = _run(tmp_path, write_fleet_log(tmp_path / "ev", {}), "--fleet")
        said = "Limits are fleet-wide (--fleet)"
    room = _headroom(out)
    assert room[("user", "alice")] == ("3", "3")
    assert room[("vhost", "v1")] == ("3", "10")
    assert room[("remote_host", "10.0.0.1")] == ("2", "3")
    assert room[("remote_host", "10.0.0.2")] == ("1", "3")
    page = (out / "report.html").read_text()
    assert said in page and "per-proxy peaks" not in page
    if case == "recorded":
        assert "redis://10.0.0.5:6379/0 (2 proxy processes)" in page


def test_per_process_limits_keep_the_per_proxy_view(spark, tmp_path):
    """Proxies that recorded no ledger (``local``) enforce alone: alice shows 2 of 3."""
    out = _run(tmp_path, write_fleet_log(tmp_path / "ev", {p: ("local", None)
                                                           for p in CONNECTIONS}))
    room = _headroom(out)
    assert room[("user", "alice")] == ("2", "3")
    assert room[("vhost", "v1")] == ("2", "10")
    page = (out / "report.html").read_text()
    assert "Limits apply per proxy process" in page
    assert "2 proxy processes recorded no fleet ledger" in page
    with open(out / "concurrency.csv", newline="") as f:  # the concurrency table: all proxies
        conc = {(r["scope"], r["key"]): r["peak"] for r in csv.DictReader(f)}
    assert conc[("user", "alice")] == "3"


def test_two_fleets_are_summed_each_on_its_own(spark, tmp_path):
    """Proxies in different fleets (different ledgers) never add up: 2, not 3."""
    ev = write_fleet_log(tmp_path / "ev", {"pa-1": ("fleet", "redis://a:6379/0"),
                                           "pb-2": ("fleet", "redis://b:6379/0")})
    events = prepare_events(read_events(spark, str(ev)))
    w = ReportWindow(int(T0 * 1e6), int((T0 + 300) * 1e6), 60_000_000)
    scope = limit_scope(spark, events, fleet=False)
    assert scope.fleets == {"redis://a:6379/0": 1, "redis://b:6379/0": 1}
    conc = concurrency(prepare_sweep(events, w, domains=scope.domains), ("user",))
    (row,) = conc.collect()
    assert (row.key, row.peak, row.proxy_peak) == ("alice", 3, 2)
    same = limit_scope(spark, events, fleet=True)
    (row,) = concurrency(prepare_sweep(events, w, fleet=same.fleet), ("user",)).collect()
    assert (row.peak, row.proxy_peak) == (3, 3)
