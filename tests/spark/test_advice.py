"""spark_reports.advice, rule and policy_writer: recommendations with their evidence, written
as policy files that the real ``check`` accepts.

overlap.jsonl (tests/spark/golden.py), window [10:00, 10:05), 1-minute grid, one proxy: the
per-minute peaks (10:00 .. 10:04) of v1 are 2, 2, 3, 2, 2; alice's 1, 1, 2, 1, 1 (c1, then c5
with c4); bob's 1, 1, 0, 0, 0; carol's 0, 1, 1, 1, 1; host 10.0.0.1: 2, 2, 1, 1, 1; 10.0.0.2:
0, 1, 2, 1, 1. p50 is the 3rd of the 5 sorted samples. The opens in the window (c2 10:00:30,
c3 10:01:30, c4 10:02:10, c5 10:02:20) are one per second.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from amqp_policy_proxy.spark_reports.advice import key_percentiles, open_rates, recommend
from amqp_policy_proxy.spark_reports.events import key_groups
from amqp_policy_proxy.spark_reports.policy_writer import Change, new_policy, write_policy
from amqp_policy_proxy.spark_reports.rule import Rule, RuleError
from tests.spark.golden import POLICY, policy_tables
from tests.spark.golden import ts as utc_ts


def ts(hms: str) -> dt.datetime:
    """2026-11-21 HH:MM:SS as Spark collects it in a UTC session (naive)."""
    return utc_ts(hms).replace(tzinfo=None)

REPO = Path(__file__).resolve().parents[2]


def check(path: Path) -> subprocess.CompletedProcess:
    """The real ``amqp-policy-proxy check --policy PATH``."""
    return subprocess.run([sys.executable, "-m", "amqp_policy_proxy", "check", "--policy",
                           str(path)], capture_output=True, text=True)


def test_rule():
    """Exact ranks (99.9 is a decimal, not a float) and clear errors."""
    r = Rule.parse("99.9", "1.25")
    assert (r.rank(1000), r.rank(1001), r.rank(5), r.rank(10080)) == (999, 1000, 5, 10070)
    assert Rule.parse("50", "2").rank(5) == 3
    assert r.text() == "ceil(p99.9 of the per-bucket peak x 1.25)"
    for p, f in (("0", "1"), ("100.1", "1"), ("x", "1"), ("nan", "1"), ("50", "0"),
                 ("50", "-1"), ("50", "inf"), ("50", "y")):
        with pytest.raises(RuleError):
            Rule.parse(p, f)


def test_key_percentiles_and_recommend(spark, overlap, tmp_path):
    """p50 and p99.9 of the per-minute peaks, then the settings they give, with evidence."""
    events, sweep, _, w = overlap
    p50 = {(r["scope"], r["key"]): (r["value"], r["peak"], r["peak_ts"])
           for r in key_percentiles(sweep, Rule(Decimal("50"), 2.0)).collect()}
    assert p50 == {
        ("vhost", "v1"): (2, 3, ts("10:02:20")),
        ("user", "alice"): (1, 2, ts("10:02:20")),
        ("user", "bob"): (0, 1, ts("10:00:30")),
        ("user", "carol"): (1, 1, ts("10:01:30")),
        ("remote_host", "10.0.0.1"): (1, 2, ts("10:00:30")),
        ("remote_host", "10.0.0.2"): (1, 2, ts("10:02:10")),
    }
    rule = Rule(Decimal("50"), 2.0)
    values = key_percentiles(sweep, rule)
    rates = open_rates(events, w, rule)
    lt = policy_tables(spark, tmp_path, POLICY)
    rows = {(r["group"], r["setting"]): r.asDict()
            for r in recommend(values, key_groups(sweep.keys), lt, rule, rates).collect()}
    got = {k: (r["current"], r["recommended"], r["change"], r["basis"], r["percentile"],
               r["peak"]) for k, r in rows.items()}
    assert got == {
        # v1: p50 2 x 2 = 4 against 4
        ("", "maxConnections"): (4, 4, "keep", "v1", 2, 3),
        # users governed by the vhost value (g1: alice, bob): alice's p50 1 -> 2
        ("", "maxConnectionsPerUser"): (3, 2, "lower", "alice", 1, 2),
        # g2 overrides per user (carol: p50 1 -> 2) and per host (its host .2: 1 -> 2)
        ("g2", "maxConnectionsPerUser"): (1, 2, "raise", "carol", 1, 1),
        # hosts of g1 users: .1 and .2 tie (1, peak 2): the earlier peak decides
        ("", "maxConnectionsPerHost"): (2, 2, "keep", "10.0.0.1", 1, 2),
        ("g2", "maxConnectionsPerHost"): (4, 2, "lower", "10.0.0.2", 1, 2),
        # opens per second: never two in one second, so p50 1 -> 2 (no current value here;
        # the job fills it from the policy); ties: the earliest second decides
        ("", "maxConnectionRate"): (None, 2, None, "v1", 1, 1),
        ("", "maxConnectionRatePerUser"): (None, 2, None, "bob", 1, 1),
        ("", "maxConnectionRatePerHost"): (None, 2, None, "10.0.0.1", 1, 1),
    }
    assert rows[("", "maxConnections")]["peak_ts"] == ts("10:02:20")
    assert rows[("", "maxConnections")]["rule"] == "ceil(p50 of the per-bucket peak x 2)"
    values.unpersist()
    rates.unpersist()


POLICY_DIR = {
    "a.json": """# vhost a: QDR policyDir JSON, comments kept
[
    ["vhost", {
        "hostname": "a",
        "maxConnections": 100,
        "groups": {
            "g": {
                "users": "u1",
                "remoteHosts": "*",
                "maxConnectionsPerUser": 9
            },
            "h": {"users": "u2", "remoteHosts": "*"}
        }
    }]
]
""",
    "b.yaml": """# vhost b in YAML
- [vhost, {hostname: b, maxConnections: 10, maxConnectionRate: 50,
    groups: {all: {users: '*', remoteHosts: '*'}}}]
""",
    "c.json": '[["vhost", {"hostname": "c", "groups": {"x": {"users": "*", "remoteHosts": "*"}}}]]\n',
}


def test_write_policy_and_check(tmp_path):
    """A copy of a policy directory with the changes, accepted by the real check; JSON is
    edited in place (comments kept), YAML rewritten; rates only where already set."""
    src = tmp_path / "policy.d"
    src.mkdir()
    for name, text in POLICY_DIR.items():
        (src / name).write_text(text)
    assert check(src).returncode == 0
    changes = [
        Change("a", "", "maxConnections", 40, 100),
        Change("a", "g", "maxConnectionsPerUser", 3, 9),
        Change("a", "h", "maxConnectionsPerHost", 7, None),       # inserted
        Change("a", "", "maxConnectionRatePerUser", 5, None),     # a sets no rate: skipped
        Change("b", "", "maxConnections", 10, 10),                # equal: nothing to change
        Change("b", "", "maxConnectionRate", 20, 50),
        Change("zz", "", "maxConnections", 1, None),              # not in the policy
    ]
    out = tmp_path / "out"
    w = write_policy(src, changes, out)
    assert w.files == ["a.json", "b.yaml", "c.json"]
    assert w.changed == ["a.json", "b.yaml"]
    assert [(c.vhost, c.group, c.setting) for c in w.applied] == [
        ("a", "", "maxConnections"), ("a", "g", "maxConnectionsPerUser"),
        ("a", "h", "maxConnectionsPerHost"), ("b", "", "maxConnectionRate")]
    res = check(out / "policy")
    assert res.returncode == 0, res.stderr
    a = (out / "policy" / "a.json").read_text()
    assert a.startswith("# vhost a: QDR policyDir JSON, comments kept\n")
    assert '"maxConnections": 40,' in a and '"maxConnectionsPerUser": 3' in a
    assert '"h": {"maxConnectionsPerHost": 7,"users": "u2"' not in a  # spacing kept:
    assert '"h": {"maxConnectionsPerHost": 7, "users": "u2", "remoteHosts": "*"}' in a
    assert (out / "policy" / "c.json").read_text() == POLICY_DIR["c.json"]
    assert (out / "policy" / "b.yaml").read_text().startswith("# vhost b in YAML\n")
    diff = (out / "policy.diff").read_text()
    assert "-        \"maxConnections\": 100,\n+        \"maxConnections\": 40,\n" in diff
    assert "--- a/a.json\n+++ b/a.json\n" in diff and "--- a/b.yaml\n" in diff
    assert "c.json" not in diff
    # applying the diff to the current files gives the written ones
    work = tmp_path / "apply"
    work.mkdir()
    for name, text in POLICY_DIR.items():
        (work / name).write_text(text)
    patched = subprocess.run(["patch", "-p1", "-s", "-d", str(work), "-i", str(out / "policy.diff")],
                             capture_output=True, text=True)
    if patched.returncode != 127:  # patch(1) installed
        assert patched.returncode == 0, patched.stderr
        for name in POLICY_DIR:
            assert (work / name).read_text() == (out / "policy" / name).read_text(), name


def test_new_policy_and_check(tmp_path):
    """Without --policy: a new policy of the log's vhosts and groups that check accepts."""
    w = new_policy([Change("v1", "", "maxConnections", 4), Change("v1", "", "maxConnectionsPerUser", 3),
                    Change("v1", "g2", "maxConnectionsPerUser", 2),
                    Change("v2", "", "maxConnections", 1)],
                   {"v1": {"g1": ["alice", "bob"], "g2": ["carol"]}}, tmp_path)
    assert w.files == ["recommended.json"]
    res = check(tmp_path / "policy")
    assert res.returncode == 0, res.stderr
    assert "2 vhost(s): v1, v2" in res.stdout


def test_job_without_policy(spark, fixtures, tmp_path):
    """The job with --percentile 50 --headroom 2 and no --policy writes a policy check
    accepts, and refuses a bad rule with exit code 2."""
    from amqp_policy_proxy.spark_reports.jobs.capacity import main

    out = tmp_path / "out"
    argv = ["--events", str(fixtures / "overlap.jsonl"), "--out", str(out),
            "--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T10:05:00Z"]
    assert main([*argv, "--percentile", "101"]) == 2
    assert main([*argv, "--headroom", "0"]) == 2
    assert main([*argv, "--percentile", "50", "--headroom", "2", "--master", "local[1]"]) == 0
    res = check(out / "policy")
    assert res.returncode == 0, res.stderr
    text = (out / "policy" / "recommended.json").read_text()
    assert '"maxConnections": 4' in text  # p50 of v1's per-minute peaks (2) x 2
    assert (out / "policy.diff").read_text() == ""


def test_diff_applies_without_final_newline(tmp_path):
    """A policy file without a final newline: the diff marks it, and patch applies it."""
    src = tmp_path / "p.json"
    src.write_text('[["vhost", {"hostname": "v", "maxConnections": 5, '
                   '"groups": {"g": {"users": "*", "remoteHosts": "*"}}}]]')
    out = tmp_path / "out"
    write_policy(src, [Change("v", "", "maxConnections", 4, 5)], out)
    diff = (out / "policy.diff").read_text()
    assert diff.count("\\ No newline at end of file\n") == 2
    work = tmp_path / "w"
    work.mkdir()
    (work / "p.json").write_text(src.read_text())
    done = subprocess.run(["patch", "-p1", "-s", "-d", str(work), "-i", str(out / "policy.diff")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (work / "p.json").read_text() == (out / "policy" / "p.json").read_text()


def test_diff_shows_only_changed_lines(tmp_path):
    """A long policy whose lines repeat (a ``remoteHosts`` per group): the diff holds the
    changed line and its context, not unchanged lines marked as changed."""
    import json

    groups = {f"g{i}": {"users": [f"u{i}"], "remoteHosts": "*", "sources": "*",
                        "maxConnectionsPerUser": 5} for i in range(60)}
    src = tmp_path / "p.json"
    src.write_text(json.dumps([["vhost", {"hostname": "v", "maxConnections": 9,
                                          "groups": groups}]], indent=1) + "\n")
    assert len(src.read_text().splitlines()) > 300
    out = tmp_path / "out"
    write_policy(src, [Change("v", "", "maxConnections", 4, 9),
                       Change("v", "g30", "maxConnectionsPerUser", 2, 5)], out)
    diff = (out / "policy.diff").read_text().splitlines()
    assert [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")] == [
        '-   "maxConnections": 9,', '+   "maxConnections": 4,',
        '-     "maxConnectionsPerUser": 5', '+     "maxConnectionsPerUser": 2']
    assert check(out / "policy").returncode == 0
