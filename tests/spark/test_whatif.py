"""spark_reports.whatif (the workers' pyarrow probe) and the exact replay on overlap.jsonl."""

from __future__ import annotations

import sys

from amqp_policy_proxy.spark_reports import whatif as report_whatif
from amqp_policy_proxy.spark_reports.concurrency import limit_peaks
from amqp_policy_proxy.spark_reports.limits import load_checked_policy
from amqp_policy_proxy.spark_reports.replay import replay
from amqp_policy_proxy.spark_reports.whatif import workers_have_pyarrow

WHATIF_HOSTS = """[["vhost", {"hostname": "v1", "maxConnections": 3,
  "maxConnectionsPerUser": 1, "maxConnectionsPerHost": 1,
  "groups": {"all": {"users": "*", "remoteHosts": "*"}}}]]"""


def _denied(spark, overlap, tmp_path):
    events, sweep, conc, _ = overlap
    p = tmp_path / "whatif.json"
    p.write_text(WHATIF_HOSTS)
    policy, _ = load_checked_policy(p)
    denied, replayed = replay(sweep, events, policy, limit_peaks(conc))
    return [(r["ts"].strftime("%H:%M:%S"), r["conn_id"], r["reason"])
            for r in denied.orderBy("ts").collect()], replayed


def test_whatif(spark, overlap, tmp_path, monkeypatch):
    """Replay of overlap.jsonl (closes first at equal instants, opens in conn_id order).

    Limits 3 / 1 per user / 1 per host: 10:00 c1 alice@.1 in (open since 09:58: an attempt
    at the window start); 10:00:30 c2 bob@.1 denied (host .1 has c1); 10:01:30 c1 closes,
    c2's close is ignored, c3 carol@.2 in; 10:02:10 c4 alice@.2 denied (host .2 has c3);
    10:02:20 c5 alice@.1 in (c4 never counted). The same answer on the RDD path used when
    the workers have no pyarrow (the spark-submit case of test_submit).
    """
    expected = [("10:00:30", "c2", "host_limit"), ("10:02:10", "c4", "host_limit")]
    assert _denied(spark, overlap, tmp_path) == (expected, ["v1"])
    assert workers_have_pyarrow(spark)
    monkeypatch.setitem(report_whatif._WORKERS_PYARROW, spark.sparkContext.applicationId, False)
    assert _denied(spark, overlap, tmp_path) == (expected, ["v1"])


def test_workers_run_this_python(monkeypatch):
    """Only a local master whose PYSPARK_PYTHON names this very file skips the worker probe."""
    run_this = report_whatif._workers_run_this_python
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert run_this("local[2]", None)
    assert not run_this("spark://127.0.0.1:7077", None)
    assert not run_this("local[2]", "/nonexistent/python3")  # conf wins
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert not run_this("local[*]", None)
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert not run_this("local", None)
