"""``report compact``: closed hours of JSON Lines become Parquet; reports read either alike.

The kill test runs the real command (``python -m amqp_policy_proxy report compact``) in its
own process group, kills it with SIGKILL half-way (after its first committed hour, the JVM
with it), and reruns it: no record is lost or doubled at any point.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from amqp_policy_proxy.spark_reports import layout
from amqp_policy_proxy.spark_reports.jobs import compact as job
from amqp_policy_proxy.spark_reports.jobs.capacity import main as capacity_main
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from tests.spark.test_job import end_to_end_argv

BENCH = Path(__file__).resolve().parents[2] / "bench"
SRC = Path(job.__file__).resolve().parents[3]
FAR = 4_000_000_000.0  # a "now" after every hour of the test logs


def _records(spark, root: Path) -> Counter:
    """Every record of the log (compacted or not) as a multiset of its identifying fields."""
    rows = read_events(spark, str(root)).select(
        "proxy", "event", "ts", "conn_id", "dt", "hour").collect()
    return Counter(tuple(r) for r in rows)


def _gen(root: Path) -> Path:
    subprocess.run([sys.executable, str(BENCH / "gen_events.py"), "--out", str(root),
                    "--events", "6000", "--users", "50", "--hosts", "20", "--days", "1",
                    "--proxies", "2", "--seed", "3"], check=True, capture_output=True)
    return root


def test_compaction_commits_closed_hours_only_and_is_idempotent(spark, tmp_path):
    root = _gen(tmp_path / "ev")
    before = _records(spark, root)
    hours = layout.list_hours(str(root))
    assert len(hours) == 24 and all(h.jsonl and not h.marker for h in hours)
    # "now" 30 minutes after the last hour ended, grace 1 h: the last hour is not closed yet
    now = hours[-1].start.timestamp() + 3600 + 1800
    summary = job.compact(spark, str(root), grace=3600, now=now)
    assert len(summary["hours"]) == 23 and summary["files"] == 46
    after = layout.list_hours(str(root))
    assert [bool(h.marker) for h in after] == [True] * 23 + [False]
    for h in after[:23]:
        assert not h.jsonl and h.live_parquet and h.parquet_files == h.live_parquet
    assert not (root / job.TMP_DIR).exists()
    assert _records(spark, root) == before  # Parquet for 23 hours, JSON Lines for 1
    # idempotent: nothing left to do in the closed hours
    assert job.compact(spark, str(root), grace=3600, now=now)["hours"] == []
    # a file the proxy created in a compacted hour later stays readable, and is compacted next
    late = after[0]
    record = {"schema_version": 4, "event": "connection_denied",
              "ts": late.start.strftime("%Y-%m-%dT%H:59:59.999Z"), "conn_id": "x1",
              "vhost": "iot", "group": None, "user": None, "remote_host": "10.9.9.9",
              "listener": "0.0.0.0:5672", "reason": "no_vhost", "condition": "c",
              "description": "d"}
    line = json.dumps(record) + "\n"
    (Path(late.path) / "events-late-7.jsonl").write_text(line)
    grown = _records(spark, root)
    assert sum(grown.values()) == sum(before.values()) + 1
    assert job.compact(spark, str(root), grace=3600, now=now)["files"] == 1
    assert _records(spark, root) == grown
    assert len(layout.list_hours(str(root))[0].live_parquet) == 2


def test_killed_half_way_and_rerun_loses_and_doubles_nothing(spark, tmp_path):
    root = _gen(tmp_path / "ev")
    before = _records(spark, root)
    env = {**os.environ, job.PAUSE_ENV: "60",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "amqp_policy_proxy", "report", "compact", "--events", str(root),
         "--master", "local[1]"], env=env, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    seen = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 400
        for line in proc.stderr:
            seen.append(line)
            if "compacted dt=" in line or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, mid-run
        proc.wait()
    assert any("compacted dt=" in line for line in seen), "".join(seen[-20:])
    half = layout.list_hours(str(root))
    done = [h for h in half if h.marker]
    assert 1 <= len(done) < 24  # killed half-way: one hour committed, the others not
    assert (root / job.TMP_DIR).exists()  # its uncommitted Parquet is still there
    assert _records(spark, root) == before  # readers see every record once, even now
    summary = job.compact(spark, str(root), grace=60)
    assert len(summary["hours"]) == 24 - len(done)
    final = layout.list_hours(str(root))
    assert all(h.marker and not h.jsonl for h in final)
    assert not (root / job.TMP_DIR).exists()
    assert _records(spark, root) == before


def _rows(path: Path) -> list[tuple[str, ...]]:
    with open(path, newline="") as f:
        return sorted(tuple(r) for r in csv.reader(f))


def test_reports_on_json_lines_and_on_parquet_are_identical(spark, fixtures, tmp_path):
    """The end-to-end run (bad lines, admin actions, what-if) on its JSON Lines log and on
    the same log compacted: the same CSV files and the same Parquet tables."""
    argv, out = end_to_end_argv(tmp_path, fixtures)
    ev = Path(argv[argv.index("--events") + 1])
    assert capacity_main([*argv, "--master", "local[1]"]) == 0
    compacted = tmp_path / "ev-parquet"
    shutil.copytree(ev, compacted)
    job.compact(spark, str(compacted), now=FAR)
    assert all(h.marker and not h.jsonl for h in layout.list_hours(str(compacted)))
    argv2 = list(argv)
    argv2[argv.index("--events") + 1] = str(compacted)
    out2 = tmp_path / "out-parquet"
    argv2[argv.index("--out") + 1] = str(out2)
    assert capacity_main([*argv2, "--master", "local[1]"]) == 0
    csvs = sorted(p.name for p in out.glob("*.csv"))
    assert {"concurrency.csv", "headroom.csv", "recommendations.csv", "whatif.csv",
            "top_denied.csv", "traffic.csv", "admin_actions.csv"} <= set(csvs)
    for name in csvs:
        assert _rows(out / name) == _rows(out2 / name), name
    for table in ("concurrency", "headroom", "denials", "whatif", "timeline", "top_denied",
                  "traffic", "durations", "churn"):
        a = sorted(map(tuple, spark.read.parquet(str(out / table)).collect()), key=repr)
        b = sorted(map(tuple, spark.read.parquet(str(out2 / table)).collect()), key=repr)
        assert a == b, table
    assert "3 records of the event log were skipped" in (out2 / "report.html").read_text()


@pytest.mark.parametrize("argv,message", [
    (["--events", "{tmp}/absent"], "no such directory"),
    (["--events", "hdfs:///logs"], "only local directories"),
    (["--events", "{tmp}", "--grace", "5"], "--grace must be at least 60"),
])
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    assert job.main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_help_describes_every_option(capsys):
    with pytest.raises(SystemExit):
        job.build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--events", "--grace", "--master", "--dry-run"):
        assert flag in out
