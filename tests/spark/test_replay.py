"""spark_reports.replay: the exact what-if on a hand-built log whose answer is worked out below.

Candidate policy CANDIDATE: vhost ``shop`` (alias ``shop.example.com``), maxConnections 3,
per host 2; group ``staff`` (ann, ben) from 10.0.0.0/24 with 1 connection per user; group
``apps`` (every other user) from anywhere; vhost ``lab`` for lee. The live policy had admitted
every connection of the log (all are ``connection_opened``). Times 2026-11-21, one proxy:

    conn  time      user  host          asks for          candidate decision (counts after)
    c1    10:00:00  ann   10.0.0.5      shop.example.com  in              shop 1
    c2    10:00:10  ann   10.0.0.5      shop.example.com  user_limit (staff: 1 per user)
                                                          (its close at 10:00:20 is ignored)
    c3    10:00:30  ben   192.168.1.9   shop              remote_host (not in 10.0.0.0/24)
    c4    10:01:00  app1  10.0.0.7      shop              in              shop 2, .7: 1
    c5    10:01:10  app2  10.0.0.7      shop              in              shop 3, .7: 2
    c6    10:01:20  app3  10.0.0.8      shop              vhost_limit (3 held)
    c7    10:02:00  app3  10.0.0.7      shop              in: c5 closes at 10:02:00 first
    --    10:03:00  c6's close: c6 was never admitted, nothing is decremented
    c8    10:04:00  app4  10.0.0.9      shop              vhost_limit (still 3: c1, c4, c7)
    --    10:05:00  c1 closes                                             shop 2
    c9    10:06:00  app5  10.0.0.7      shop              host_limit (.7 holds c4, c7)
    c10   10:06:30  lee   10.1.1.1      old.example.com   no_vhost (an alias the candidate
                                                          dropped; logged as vhost shop)
    c11   10:07:00  zed   10.0.0.5      shop              in              shop 3
    c12   10:07:30  lee   10.1.1.1      lab               in (vhost lab)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqp_policy_proxy.policy.load import load_policy
from amqp_policy_proxy.spark_reports.concurrency import concurrency, limit_peaks
from amqp_policy_proxy.spark_reports.events import prepare_events, prepare_sweep
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from amqp_policy_proxy.spark_reports.limits import load_checked_policy
from amqp_policy_proxy.spark_reports.replay import (
    Admission,
    ReplayGroup,
    ReplayVhost,
    decide_open,
    denied_totals,
    replay,
    replay_group,
    replay_group_rows,
    replay_vhost,
    whatif_keys,
)
from tests.spark.golden import window

CANDIDATE = """# candidate policy of test_replay
[["vhost", {"hostname": "shop", "aliases": "shop.example.com", "maxConnections": 3,
  "maxConnectionsPerUser": 2, "maxConnectionsPerHost": 2,
  "groups": {"staff": {"users": "ann, ben", "remoteHosts": "10.0.0.0/24",
                       "maxConnectionsPerUser": 1},
             "apps": {"users": "*", "remoteHosts": "*"}}}],
 ["vhost", {"hostname": "lab", "maxConnections": 1,
  "groups": {"lab": {"users": "lee", "remoteHosts": "*"}}}]]
"""

#: (conn, open, close or None, user, host, hostname, logged group)
CONNECTIONS = [
    ("c1", "10:00:00", "10:05:00", "ann", "10.0.0.5", "shop.example.com", "staff"),
    ("c2", "10:00:10", "10:00:20", "ann", "10.0.0.5", "shop.example.com", "staff"),
    ("c3", "10:00:30", "10:00:40", "ben", "192.168.1.9", "shop", "staff"),
    ("c4", "10:01:00", "10:08:00", "app1", "10.0.0.7", "shop", "apps"),
    ("c5", "10:01:10", "10:02:00", "app2", "10.0.0.7", "shop", "apps"),
    ("c6", "10:01:20", "10:03:00", "app3", "10.0.0.8", "shop", "apps"),
    ("c7", "10:02:00", "10:09:00", "app3", "10.0.0.7", "shop", "apps"),
    ("c8", "10:04:00", "10:04:30", "app4", "10.0.0.9", "shop", "apps"),
    ("c9", "10:06:00", "10:06:10", "app5", "10.0.0.7", "shop", "apps"),
    ("c10", "10:06:30", "10:06:40", "lee", "10.1.1.1", "old.example.com", "apps"),
    ("c11", "10:07:00", None, "zed", "10.0.0.5", "shop", "apps"),
    ("c12", "10:07:30", None, "lee", "10.1.1.1", "lab", "lab"),
]

EXPECTED = [  # (time, conn, user, host, vhost, reason, limit)
    ("10:00:10", "c2", "ann", "10.0.0.5", "shop", "user_limit",
     "maxConnectionsPerUser 1 (group 'staff') reached"),
    ("10:00:30", "c3", "ben", "192.168.1.9", "shop", "remote_host",
     "vhost 'shop' (exact name); group 'staff' (user listed); no remoteHosts item of the "
     "group matches the client"),
    ("10:01:20", "c6", "app3", "10.0.0.8", "shop", "vhost_limit",
     "maxConnections 3 (vhost 'shop') reached"),
    ("10:04:00", "c8", "app4", "10.0.0.9", "shop", "vhost_limit",
     "maxConnections 3 (vhost 'shop') reached"),
    ("10:06:00", "c9", "app5", "10.0.0.7", "shop", "host_limit",
     "maxConnectionsPerHost 2 (vhost 'shop') reached"),
    ("10:06:30", "c10", "lee", "10.1.1.1", "old.example.com", "no_vhost",
     "no vhost, alias or pattern matches 'old.example.com' and defaultVhost '$default' is "
     "not defined"),
]


def _record(event: str, t: str, conn: str, user: str, host: str, group: str,
            vhost: str = "shop", **extra: object) -> str:
    return json.dumps({"schema_version": 3, "event": event, "ts": f"2026-11-21T{t}.000Z",
                       "conn_id": conn, "vhost": vhost, "group": group, "user": user,
                       "remote_host": host, "listener": "0.0.0.0:5672", **extra})


def write_log(path: Path, conns: list[tuple], proxy: str = "p1-1") -> Path:
    """Write the JSON Lines of ``conns`` (auth_decision, opened, closed) in time order."""
    lines = []
    for conn, t0, t1, user, host, hostname, group in conns:
        vhost = "lab" if hostname == "lab" else "shop"
        lines.append((t0, 0, _record("auth_decision", t0, conn, user, host, group, vhost,
                                     decision="allow", enforcement="enforce", rule="",
                                     hostname=hostname)))
        lines.append((t0, 1, _record("connection_opened", t0, conn, user, host, group, vhost)))
        if t1 is not None:
            lines.append((t1, 2, _record("connection_closed", t1, conn, user, host, group,
                                         vhost, opened_ts=f"2026-11-21T{t0}.000Z",
                                         close_reason="client_close")))
    path.mkdir(parents=True, exist_ok=True)
    f = path / f"events-{proxy}.jsonl"
    f.write_text("".join(line + "\n" for _, _, line in sorted(lines)))
    return f


def run_replay(spark, log_dir: Path, policy_text: str, tmp_path: Path, fleet: bool = False):
    """The job's pipeline up to the replay: (denied rows sorted by time, replayed vhosts)."""
    w = window("10:00", "10:10")
    raw = read_events(spark, str(log_dir), w.start_us - 3_600_000_000, w.end_us)
    events = prepare_events(raw, hostnames=True).persist()
    sweep = prepare_sweep(events, w).persist(events)
    conc = concurrency(sweep)
    if fleet:
        from pyspark.sql import functions as F
        peaks = conc.where(F.col("scope") != "group").select("scope", "vhost", "key", "peak")
    else:
        peaks = limit_peaks(conc)
    p = tmp_path / "candidate.json"
    p.write_text(policy_text)
    policy, _ = load_checked_policy(p)
    denied, replayed = replay(sweep, events, policy, peaks, fleet=fleet)
    denied = denied.persist()
    return denied, replayed


def test_replay_exact(spark, tmp_path):
    """Every denial of the table in the module docstring, in order, with QDR's reasons."""
    log = tmp_path / "log"
    write_log(log, CONNECTIONS)
    denied, replayed = run_replay(spark, log, CANDIDATE, tmp_path)
    rows = denied.orderBy("ts", "conn_id").collect()
    got = [(r["ts"].strftime("%H:%M:%S"), r["conn_id"], r["user"], r["remote_host"],
            r["vhost"], r["reason"], r["limit"]) for r in rows]
    assert got == EXPECTED
    assert {r["enforcement"] for r in rows} == {"enforce"}
    assert [r["log"] for r in rows if r["conn_id"] in ("c3", "c9", "c10")] == [
        "DENY AMQP Open for user 'ben', rhost '192.168.1.9', vhost 'shop': User is not "
        "allowed to connect from this network host",
        "DENY AMQP Open for user 'app5', rhost '10.0.0.7', vhost 'shop': host_limit",
        "DENY AMQP Open for user 'lee', rhost '10.1.1.1', vhost 'old.example.com': No policy "
        "defined for vhost",
    ]
    assert {r["logged_vhost"] for r in rows} == {"shop"}
    # lab (1 connection, limit 1) cannot deny: not replayed; old.example.com is denied
    # before any count and shop binds.
    assert replayed == ["old.example.com", "shop"]
    totals = {(r["vhost"], r["reason"]): r["denied"] for r in denied_totals(denied).collect()}
    assert totals == {("shop", "user_limit"): 1, ("shop", "remote_host"): 1,
                      ("shop", "vhost_limit"): 2, ("shop", "host_limit"): 1,
                      ("old.example.com", "no_vhost"): 1}
    keys = {(r["scope"], r["key"]): r["would_deny"] for r in whatif_keys(denied).collect()}
    assert keys == {("user", "ann"): 1, ("remote_host", "192.168.1.9"): 1,
                    ("vhost", "shop"): 2, ("remote_host", "10.0.0.7"): 1,
                    ("vhost", "old.example.com"): 1}
    denied.unpersist()


@pytest.mark.parametrize("fleet, expected", [(False, []), (True, ["b1"])])
def test_replay_fleet(spark, tmp_path, fleet, expected):
    """Two proxies, one lab connection each at once; lab allows 1. Per-process ledgers: each
    proxy holds 1, nothing denied; one fleet-wide ledger: the later one (b1) is denied."""
    log = tmp_path / "log"
    write_log(log, [("a1", "10:00:00", "10:05:00", "lee", "10.1.1.1", "lab", "lab")], "pa-1")
    write_log(log, [("b1", "10:01:00", "10:02:00", "lee", "10.1.1.2", "lab", "lab")], "pb-2")
    denied, _ = run_replay(spark, log, CANDIDATE, tmp_path, fleet=fleet)
    rows = denied.collect()
    assert [r["conn_id"] for r in rows] == expected
    if fleet:
        assert rows[0]["reason"] == "vhost_limit"
        assert rows[0]["proxy"] == "pb-2"
    denied.unpersist()


def _policy(tmp_path: Path, text: str):
    p = tmp_path / "p.json"
    p.write_text(text)
    return load_policy(p)


def test_replay_rates_and_shadow(tmp_path):
    """Pure replay: a rate denial releases its count slot; shadow mode reports and counts."""
    pol = _policy(tmp_path, """[["vhost", {"hostname": "v", "maxConnections": 1,
      "maxConnectionRatePerUser": 1,
      "groups": {"g": {"users": "u", "remoteHosts": "*"},
                 "s": {"users": "s", "remoteHosts": "*", "enforcement": "shadow"}}}]]""")
    a = decide_open(pol, "v", "u", "10.0.0.1", "v")
    assert a.denied is None and a.group == ReplayGroup("g", None, None, 1, None)
    # c1 in at 0 s; c1 closes at 0.5 s; c2 at 0.6 s: rate 1/s, burst 1 -> user_rate (and it
    # holds no slot); c3 at 1.5 s: a token again, and the vhost is empty -> in.
    rows = [(0, 1, "p", "c1", 0), (500_000, 0, "p", "c1", 0), (600_000, 1, "p", "c2", 0),
            (1_500_000, 1, "p", "c3", 0)]
    out = list(replay_group_rows(rows, {0: a}))
    assert [(d.conn_id, d.reason, d.limit) for d in out] == [
        ("c2", "user_rate", "maxConnectionRatePerUser 1/s (group 'g') exceeded")]  # as the daemon words it
    # Shadow: s2 would be denied (vhost full) but is counted, so s3 is reported too.
    s = decide_open(pol, "v", "s", "10.0.0.2", "v")
    assert s.shadow
    rows = [(0, 1, "p", "s1", 0), (1, 1, "p", "s2", 0), (2, 0, "p", "s1", 0),
            (3, 1, "p", "s3", 0)]
    out = list(replay_group_rows(rows, {0: s}))
    assert [(d.conn_id, d.reason, d.enforcement) for d in out] == [
        ("s2", "vhost_limit", "shadow"), ("s3", "vhost_limit", "shadow")]
    assert out[0].log.startswith("SHADOW DENY AMQP Open for user 's'")


def test_replay_zero_length(tmp_path):
    """A connection opened and closed at one instant (its close sorts first) is an attempt
    that holds nothing afterwards; a close of a denied connection decrements nothing."""
    pol = _policy(tmp_path, """[["vhost", {"hostname": "v", "maxConnections": 1,
      "groups": {"g": {"users": "*", "remoteHosts": "*"}}}]]""")
    a = decide_open(pol, "v", "u", "10.0.0.1", "v")
    rows = [(10, 0, "p", "z", 0), (10, 1, "p", "z", 0),  # z: in and out at 10
            (20, 1, "p", "a", 0),                          # a in (z left nothing)
            (30, 1, "p", "b", 0), (40, 0, "p", "b", 0),    # b denied; its close ignored
            (50, 1, "p", "c", 0)]                          # c denied: a still holds it
    assert [(d.conn_id, d.reason) for d in replay_group_rows(rows, {0: a})] == [
        ("b", "vhost_limit"), ("c", "vhost_limit")]


def test_stand_ins_carry_what_the_ledger_reads(tmp_path):
    """The executors' copies give the daemon's limit functions the same answers."""
    from amqp_policy_proxy.limits.connections import connection_limits
    from amqp_policy_proxy.limits.rates import connection_rates

    pol = _policy(tmp_path, """[["vhost", {"hostname": "v", "maxConnections": 7,
      "maxConnectionsPerUser": 3, "maxConnectionsPerHost": 5, "maxConnectionRate": 9,
      "maxConnectionRatePerHost": 4, "connectionRateBurst": 2,
      "groups": {"g": {"users": "u", "remoteHosts": "*", "maxConnectionsPerHost": 2,
                       "maxConnectionRatePerUser": 6}}}]]""")
    v = pol.vhosts["v"]
    g = v.groups["g"]
    rv, rg = replay_vhost(v), replay_group(g)
    assert isinstance(rv, ReplayVhost)
    assert connection_limits(rv, rg) == connection_limits(v, g) == (7, 3, 2)  # type: ignore[arg-type]
    assert connection_rates(rv, rg) == connection_rates(v, g) == (9, 6, 4, 2)  # type: ignore[arg-type]
    assert isinstance(decide_open(pol, "v", "u", "10.0.0.1", "v"), Admission)
