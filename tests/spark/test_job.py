"""The capacity job: argv handling, exit codes, partition pruning, and one end-to-end run."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports.jobs import capacity
from amqp_policy_proxy.spark_reports.jobs.capacity import (
    UsageError,
    main,
    parse_grid,
    parse_timestamp,
    read_events,
)

T10 = 1_795_255_200_000_000  # 2026-11-21T10:00:00Z in microseconds


def test_parse_timestamp():
    assert parse_timestamp("2026-11-21T10:00:00Z") == T10
    assert parse_timestamp("2026-11-21 10:00") == T10
    assert parse_timestamp("2026-11-21T11:00:00+01:00") == T10
    assert parse_timestamp("2026-11-21T10:00:00.123456Z") == T10 + 123_000  # whole ms
    assert parse_timestamp("2026-11-21") == T10 - 10 * 3_600_000_000
    with pytest.raises(UsageError):
        parse_timestamp("yesterday")


def test_parse_grid():
    assert parse_grid("1m") == 60_000_000
    assert parse_grid("30s") == 30_000_000
    assert parse_grid("2h") == 7_200_000_000
    for bad in ("0m", "1w", "m", "-1m", "1.5m"):
        with pytest.raises(UsageError):
            parse_grid(bad)


@pytest.mark.parametrize("argv", [
    [],                                                            # required flags missing
    ["--events", "{ev}", "--out", "{out}", "--grid", "5x"],
    ["--events", "{ev}", "--out", "{out}", "--from", "2026-11-21T10:00",
     "--to", "2026-11-21T09:00"],
    ["--events", "{ev}/absent", "--out", "{out}"],
    ["--events", "{ev}", "--out", "{out}", "--policy", "{ev}/overlap.jsonl"],  # not a policy
    ["--events", "{ev}", "--out", "{out}", "--bogus"],
])
def test_usage_errors_exit_2(fixtures, tmp_path, argv, capsys):
    argv = [a.format(ev=fixtures, out=tmp_path) for a in argv]
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


BAD_POLICIES = {
    # what `check` rejects, and the report must refuse the same way
    "unknown-key.json": '[["vhost", {"hostname": "v1", "maxConections": 4}]]',
    "bad-limit.json": '[["vhost", {"hostname": "v1", "maxConnections": 70000}]]',
    "bad-bool.yaml": '- [vhost, {hostname: v1, allowUnknownUser: "True"}]\n',
    "two-groups.json": ('[["vhost", {"hostname": "v1", "groups": {"a": {"users": "u"}, '
                        '"b": {"users": "u"}}}]]'),
}


@pytest.mark.parametrize("name", sorted(BAD_POLICIES))
@pytest.mark.parametrize("flag", ["--policy", "--whatif"])
def test_a_policy_check_rejects_is_refused_with_checks_messages(fixtures, tmp_path, capsys,
                                                                   name, flag):
    from amqp_policy_proxy.cli import main as cli_main

    policy = tmp_path / name
    policy.write_text(BAD_POLICIES[name])
    assert cli_main(["check", "--policy", str(policy)]) == 2
    check_says = capsys.readouterr().out.strip()
    assert "\nerror: " in f"\n{check_says}"
    assert main(["--events", str(fixtures), "--out", str(tmp_path / "out"),
                 flag, str(policy)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == check_says
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_missing_policy_is_refused_like_check(fixtures, tmp_path, capsys):
    from amqp_policy_proxy.cli import main as cli_main

    absent = str(tmp_path / "absent")
    assert cli_main(["check", "--policy", absent]) == 2
    check_says = capsys.readouterr().out.strip()
    assert main(["--events", str(fixtures), "--out", str(tmp_path), "--policy", absent]) == 2
    assert capsys.readouterr().err.strip() == check_says


def test_policy_warnings_are_printed_like_check(tmp_path, capsys):
    policy = tmp_path / "p.json"
    policy.write_text('[["vhost", {"hostname": "v1", "groups": {"g": {"users": "u", '
                      '"maxFrameSize": 222222, "maxSessionWindow": 9999}}}]]')
    opts = capacity.parse_options(["--events", str(tmp_path), "--out", str(tmp_path / "o"),
                                   "--policy", str(policy)])
    assert opts.policy is not None and set(opts.policy.vhosts) == {"v1"}
    err = capsys.readouterr().err.splitlines()
    assert f"warning: {policy}: vhost[v1].groups.g: no remoteHosts: every connection in this " \
        "group is denied (as in QDR; use '*' to allow any host)" in err
    assert any("the session window becomes 1 frame" in line for line in err)


def test_console_progress_only_on_a_terminal(tmp_path):
    class Tty:
        def isatty(self) -> bool:
            return True

    with open(tmp_path / "log", "w") as f:
        assert capacity.console_progress(f) == "false"
    assert capacity.console_progress(Tty()) == "true"
    assert capacity.console_progress(object()) == "false"
    closed = open(tmp_path / "log")
    closed.close()
    assert capacity.console_progress(closed) == "false"


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--events", "--policy", "--out", "--from", "--to", "--grid", "--whatif",
                 "--master", "--percentile", "--headroom", "--fleet"):
        assert flag in out
    # every new output is named where its option is described
    for output in ("recommendations.csv", "policy/", "policy.diff", "whatif_denied.csv",
                   "whatif_totals.csv", "whatif_summary.json"):
        assert output in " ".join(out.split()), output


def test_console_script_runs_the_job(fixtures, tmp_path):
    """``amqp-policy-proxy report capacity`` (the installed command) reaches the job's parser."""
    exe = Path(sys.executable).with_name("amqp-policy-proxy")
    if not exe.is_file():
        pytest.skip(f"{exe} is not installed")
    shown = subprocess.run([str(exe), "report", "capacity", "--help"], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "--whatif" in shown.stdout and "--master" in shown.stdout
    bad = subprocess.run([str(exe), "report", "capacity", "--events", str(fixtures), "--out",
                          str(tmp_path), "--grid", "5x"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2
    assert "error: --grid must be a positive number" in bad.stderr


def _layout(root: Path, fixtures: Path) -> Path:
    """overlap.jsonl as one proxy's hourly files, DIR/dt=2026-11-21/hour=HH/events-px-9.jsonl."""
    lines = (fixtures / "overlap.jsonl").read_text().splitlines(keepends=True)
    for line in lines:
        hour = re.search(r'"ts":"2026-11-21T(\d\d)', line).group(1)
        d = root / "dt=2026-11-21" / f"hour={hour}"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "events-px-9.jsonl", "a") as f:
            f.write(line)
    return root


def test_partition_pruning_and_lookback(spark, fixtures, tmp_path):
    """Hours wholly outside [from - look-back, to) are not read.

    An opened record at 05:00 with no close: with the default 24 h look-back it is found and
    counts from the window start; with a 1 h look-back its partition is pruned.
    """
    ev = _layout(tmp_path / "ev", fixtures)
    stray = ev / "dt=2026-11-21" / "hour=05"
    stray.mkdir()
    (stray / "events-px-9.jsonl").write_text(
        (fixtures / "overlap.jsonl").read_text().splitlines()[0]
        .replace("09:58:00", "05:00:00").replace('"c1"', '"c0"') + "\n")
    raw = read_events(spark, str(ev), T10 - 3_600_000_000, T10 + 300_000_000)
    assert {r.hour for r in raw.select("hour").distinct().collect()} == {9, 10}
    assert {r.proxy for r in raw.select("proxy").distinct().collect()} == {"px-9"}
    assert "PartitionFilters: [" in raw._jdf.queryExecution().executedPlan().toString()
    raw = read_events(spark, str(ev), T10 - 24 * 3_600_000_000, T10 + 300_000_000)
    assert {r.hour for r in raw.select("hour").distinct().collect()} == {5, 9, 10}


def end_to_end_argv(tmp_path: Path, fixtures: Path) -> tuple[list[str], Path]:
    """Arguments of a whole run on overlap.jsonl, and its output directory.

    The log is laid out by hour under ``tmp_path/ev``; the policy gives vhost v1 limits 5
    connections (more than the peak of 3 needs: the recommendation lowers it), 3 per user,
    2 per host; the what-if lowers the vhost limit to 2; window
    10:00-10:05 on a 1-minute grid; three bad lines in the 10:00 file (skipped, counted).
    No ``--master``. Answers: :func:`check_csv_answers`.
    """
    ev = _layout(tmp_path / "ev", fixtures)
    # What a crash or a hand edit leaves: a line cut short, a line that is not JSON, and a
    # connection event whose ts does not parse. Skipped and counted; the answers stay.
    with open(ev / "dt=2026-11-21" / "hour=10" / "events-px-9.jsonl", "a") as f:
        f.write('{"ts":"2026-11-21T10:03:00.000Z","event":"connection_opened","conn_id":"x\n'
                "not json at all\n"
                '{"ts":"yesterday","event":"connection_opened","conn_id":"c9","vhost":"v1"}\n')
        # schema 2: operators' changes (the one at 10:06 is after the window)
        for ts, action, vhost, selector, targets, count, uid in (
                ("10:04:30", "connections_close", None, "user=alice", ["c5"], 1, 0),
                ("10:01:00", "vhost_pause", "v1", "vhost=v1", ["v1"], 0, 1001),
                ("10:06:00", "vhost_resume", "v1", "vhost=v1", ["v1"], 0, 1001)):
            f.write(json.dumps({
                "schema_version": 2, "event": "admin_action", "ts": f"2026-11-21T{ts}.000Z",
                "conn_id": "", "vhost": vhost, "group": None, "user": None,
                "remote_host": None, "listener": None, "action": action, "uid": uid,
                "pid": 31337, "peer": "unix", "selector": selector, "targets": targets,
                "result": "ok", "count": count, "description": "<maintenance>"}) + "\n")
    policy = tmp_path / "policy.json"
    policy.write_text('[["vhost", {"hostname": "v1", "maxConnections": 5, '
                      '"maxConnectionsPerUser": 3, "maxConnectionsPerHost": 2}]]')
    whatif = tmp_path / "whatif.yaml"
    whatif.write_text("- [vhost, {hostname: v1, maxConnections: 2,\n"
                      "    groups: {all: {users: '*', remoteHosts: '*'}}}]\n")
    out = tmp_path / "out"
    return ["--events", str(ev), "--policy", str(policy), "--out", str(out),
            "--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T10:05:00Z",
            "--grid", "1m", "--whatif", str(whatif)], out


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_csv_answers(out: Path) -> None:
    """Assert the CSV summaries of an :func:`end_to_end_argv` run.

    The answers are worked out in tests/spark/golden.py, test_concurrency, test_headroom and
    test_whatif.

    Raises:
        AssertionError: on any difference.
    """
    rows = _csv(out / "concurrency.csv")
    assert list(rows[0]) == schemas.CONCURRENCY.fieldNames()
    v1 = next(r for r in rows if r["scope"] == "vhost")
    assert (v1["peak"], v1["p50"], v1["p95"], v1["p99"], v1["peak_ts"]) == (
        "3", "2", "3", "3", "2026-11-21T10:02:20.000Z")
    assert len(rows) == 8
    assert [(r["vhost"], r["scope"], r["key"], r["would_deny"])
            for r in _csv(out / "whatif.csv")] == [("v1", "vhost", "v1", "1")]
    # the one connection the exact replay denies: c5, while c3 and c4 hold both slots
    assert [(r["ts"], r["conn_id"], r["user"], r["remote_host"], r["vhost"], r["reason"],
             r["limit"]) for r in _csv(out / "whatif_denied.csv")] == [
        ("2026-11-21T10:02:20.000Z", "c5", "alice", "10.0.0.1", "v1", "vhost_limit",
         "maxConnections 2 (vhost 'v1') reached")]
    summary = json.loads((out / "whatif_summary.json").read_text())
    assert (summary["denied"], summary["by_reason"], summary["by_vhost"]) == (
        1, {"vhost_limit": 1}, {"v1": 1})
    recs = _csv(out / "recommendations.csv")
    assert list(recs[0]) == ["vhost", "group", "setting", "current", "recommended", "change",
                             "rule", "basis_scope", "basis", "percentile", "peak", "peak_ts"]
    counts = [r for r in recs if "Rate" not in r["setting"]]
    assert {(r["setting"], r["current"], r["recommended"], r["change"]) for r in counts} == {
        ("maxConnections", "5", "4", "lower"), ("maxConnectionsPerUser", "3", "3", "keep"),
        ("maxConnectionsPerHost", "2", "3", "raise")}
    # the evidence: p99.9 of 5 per-minute peaks is the 5th (the highest), x 1.25 rounded up
    v1 = next(r for r in recs if r["setting"] == "maxConnections")
    assert (v1["rule"], v1["basis_scope"], v1["basis"], v1["percentile"], v1["peak"],
            v1["peak_ts"]) == ("ceil(p99.9 of the per-bucket peak x 1.25)", "vhost", "v1",
                               "3", "3", "2026-11-21T10:02:20.000Z")


def test_end_to_end(spark, fixtures, tmp_path, caplog):
    """The whole job on a partitioned copy of overlap.jsonl, reusing the test session.

    The window and the expected numbers are those of tests/spark/golden.py; here the point is
    the wiring: every output listed in docs/spark-reports.md with its exact columns, and the HTML report.
    """
    argv, out = end_to_end_argv(tmp_path, fixtures)
    with caplog.at_level(logging.INFO, logger="amqp_policy_proxy.spark_reports.capacity"):
        assert main([*argv, "--master", "local[1]"]) == 0
    assert spark.sparkContext._jsc is not None  # main reused the session and left it running
    check_csv_answers(out)
    # progress: one line per stage, with its own and the elapsed seconds
    progress = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith(("stage ", "branch "))]
    stages = [m.split(":")[0] for m in progress]
    assert stages == sorted(set(stages), key=stages.index)  # each stage once
    for name in ("read and prepare the event log", "concurrency sweeps", "what-if replay",
                 "headroom and recommendations", "HTML report"):
        assert any(m.split(":")[0].endswith(name) for m in progress), name
    assert all(re.fullmatch(r"(stage|branch) [^:]+: \d+\.\d s \(\d+\.\d s elapsed\)", m)
               for m in progress), progress

    for name, schema in (("concurrency", schemas.CONCURRENCY), ("headroom", schemas.HEADROOM),
                         ("denials", schemas.DENIALS), ("whatif", schemas.WHATIF)):
        df = spark.read.parquet(str(out / name))
        assert df.columns == schema.fieldNames(), name
    assert spark.read.parquet(str(out / "headroom")).count() == 6
    assert spark.read.parquet(str(out / "denials")).count() == 4
    assert [tuple(r) for r in spark.read.parquet(str(out / "whatif")).collect()] == [
        ("v1", "vhost", "v1", 1)]
    for extra in ("timeline", "top_denied", "traffic", "durations", "churn"):
        assert (out / extra).is_dir(), extra
    assert not (out / "_work").exists()

    html = (out / "report.html").read_text()
    assert "3 records of the event log were skipped" in html
    assert "1 recommendation(s) would <b>lower</b> a configured limit" in html
    assert ("<tr class=lower><td>v1</td><td></td><td>maxConnections</td><td>5</td><td>4</td>"
            "<td>lower</td><td>v1</td><td>3</td><td>3</td><td>2026-11-21T10:02:20.000Z</td>"
            "</tr>") in html
    # the recommended policy: a copy of --policy that check accepts, and its diff
    checked = subprocess.run([sys.executable, "-m", "amqp_policy_proxy", "check", "--policy",
                              str(out / "policy")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert (out / "policy.diff").read_text().splitlines()[2:] == [
        "@@ -1 +1 @@",
        '-[["vhost", {"hostname": "v1", "maxConnections": 5, "maxConnectionsPerUser": 3, '
        '"maxConnectionsPerHost": 2}]]',
        "\\ No newline at end of file",
        '+[["vhost", {"hostname": "v1", "maxConnections": 4, "maxConnectionsPerUser": 3, '
        '"maxConnectionsPerHost": 3}]]',
        "\\ No newline at end of file"]
    assert "<pre class=diff>" in html
    images = re.findall(r'<img src="([^"]+)"', html)
    assert "img/concurrency.png" in images and "img/whatif.png" in images
    for src in images:
        png = out / src
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", src
    assert "http://" not in html and "https://" not in html  # nothing to fetch: opens offline
    # the admin actions of the window, oldest first, as a table and a CSV file
    assert ("<tr><td>2026-11-21T10:01:00.000Z</td><td>vhost_pause</td><td>v1</td>"
            "<td>vhost=v1</td><td>v1</td><td>0</td><td>ok</td><td>1001</td><td>31337</td>"
            "<td>unix</td><td>&lt;maintenance&gt;</td></tr>") in html
    assert "<td>connections_close</td><td></td><td>user=alice</td><td>c5</td><td>1</td>" in html
    assert "vhost_resume" not in html
    with open(out / "admin_actions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["ts"], r["action"], r["targets"], r["uid"]) for r in rows] == [
        ("2026-11-21T10:01:00.000Z", "vhost_pause", "v1", "1001"),
        ("2026-11-21T10:04:30.000Z", "connections_close", "c5", "0")]



def test_empty_log_and_stale_outputs(spark, tmp_path):
    """An event log with no records: empty tables and a report saying so, exit 0; a what-if
    table left by an earlier run into the same directory is removed without --whatif."""
    events = tmp_path / "events"
    events.mkdir()
    out = tmp_path / "out"
    (out / "whatif").mkdir(parents=True)
    (out / "whatif.csv").write_text("stale\n")
    (out / "img").mkdir()
    (out / "img" / "whatif.png").write_bytes(b"stale")
    assert main(["--events", str(events), "--out", str(out)]) == 0
    assert not (out / "whatif").exists() and not (out / "whatif.csv").exists()
    assert not (out / "img" / "whatif.png").exists()
    assert "No connection events in the window" in (out / "report.html").read_text()
    assert spark.read.parquet(str(out / "concurrency")).columns == \
        schemas.CONCURRENCY.fieldNames()
    assert (out / "concurrency.csv").read_text().strip() == ",".join(
        schemas.CONCURRENCY.fieldNames())


def test_runtime_failure_exits_1(spark, fixtures, tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(capacity, "run_report", boom)
    assert main(["--events", str(fixtures), "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("extra", [[], ["--fleet"]])
def test_no_window_without_a_partition_key(fixtures, tmp_path, extra):
    """A whole report run (``amqp-policy-proxy report capacity`` in a subprocess, its own JVM
    with Spark's default console logging at WARN) logs no ``WindowExec`` warning: no window
    of the report runs without a partition key, on all rows in one task."""
    argv, out = end_to_end_argv(tmp_path, fixtures)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(capacity.__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "amqp_policy_proxy", "report", "capacity",
                          *argv, *extra, "--master", "local[2]"], capture_output=True,
                         text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    check_csv_answers(out)
    assert "WindowExec" not in run.stderr, [
        line for line in run.stderr.splitlines() if "WindowExec" in line][:5]


def test_a_jvm_that_died_is_named_with_what_to_do(tmp_path):
    """A week of tens of millions of events can take the JVM down (OutOfMemoryError, or the
    kernel's OOM killer): the job says so and what to change, instead of a Py4J traceback
    from stopping a session whose JVM is gone. A real local session whose JVM is killed."""
    code = (
        "import json\n"
        "from amqp_policy_proxy.spark_reports.jobs import capacity\n"
        "spark, created = capacity._build_session('local[1]')\n"
        "proc = spark.sparkContext._gateway.proc\n"
        "proc.kill(); proc.wait()\n"
        "try:\n"
        "    spark.range(3).count()\n"
        "except Exception as exc:\n"
        "    print(json.dumps({'hint': capacity.jvm_failure_hint(spark, exc)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARK_DRIVER_MEMORY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    hint = json.loads(out.stdout.strip().splitlines()[-1])["hint"]
    assert hint.startswith("the Spark JVM ended during the report (killed by signal 9): "
                           "give the driver more heap (SPARK_DRIVER_MEMORY, now 2g")


def test_a_large_csv_is_fetched_a_partition_at_a_time(spark, tmp_path):
    """write_csv(large=True) (whatif_denied.csv: a row per denied connection) writes the same
    sorted file as the one-partition fetch (which at 30M events gathered 1.1 GiB in one
    task result, over spark.driver.maxResultSize)."""
    from pyspark.sql import functions as F

    df = spark.range(0, 5000, numPartitions=7).select(
        (F.col("id") * 7919 % 5000).alias("n"), F.lit("x").alias("s")).repartition(5)
    small, large = tmp_path / "one.csv", tmp_path / "many.csv"
    assert capacity.write_csv(df, str(small), ["n"]) == 5000
    assert capacity.write_csv(df, str(large), ["n"], large=True) == 5000
    assert large.read_text() == small.read_text()
    rows = list(csv.reader(large.open()))
    assert rows[0] == ["n", "s"] and [int(r[0]) for r in rows[1:]] == list(range(5000))
