"""spark_reports.whatif: the replay of overlap.jsonl under other limits, and its pure rule."""

from __future__ import annotations

import sys

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports import whatif as report_whatif
from amqp_policy_proxy.spark_reports.concurrency import limit_peaks
from amqp_policy_proxy.spark_reports.events import key_groups
from amqp_policy_proxy.spark_reports.whatif import (
    replay_admissions,
    whatif,
    whatif_candidates,
    workers_have_pyarrow,
)
from tests.spark.golden import POLICY, policy_tables

WHATIF_HOSTS = """[["vhost", {"hostname": "v1", "maxConnections": 3,
  "maxConnectionsPerUser": 1, "maxConnectionsPerHost": 1}]]"""
WHATIF_VHOST = """[["vhost", {"hostname": "v1", "maxConnections": 2}]]"""


def test_whatif(spark, overlap, tmp_path, monkeypatch):
    """Replay of overlap.jsonl (closes first at equal instants, opens in conn_id order).

    Limits 3 / 1 per user / 1 per host: 10:00 c1 alice@.1 in; 10:00:30 c2 bob@.1 denied
    (host .1 has c1); 10:01:30 c1 closes, c2's close is ignored, c3 carol@.2 in; 10:02:10
    c4 alice@.2 denied (host .2 has c3); 10:02:20 c5 alice@.1 in (c4 never counted).
    Limit 2 for the vhost only: c1, c2 in; both close; c3 in; c4 in; c5 denied (c3, c4)
    (checked end to end in test_job).
    """
    _, sweep, conc, _ = overlap
    peaks = limit_peaks(conc)
    pairs = key_groups(sweep.keys)
    alt = policy_tables(spark, tmp_path, WHATIF_HOSTS)
    binding = whatif_candidates(peaks, pairs, alt)
    # Observed per-proxy peaks above the new limits: alice 2 > 1, both hosts 2 > 1.
    assertDataFrameEqual(binding, [Row(scope="user", vhost="v1", key="alice"),
                                   Row(scope="remote_host", vhost="v1", key="10.0.0.1"),
                                   Row(scope="remote_host", vhost="v1", key="10.0.0.2")])
    wi = whatif(sweep, alt, binding)
    assertSchemaEqual(wi.schema, schemas.WHATIF)
    expected = [Row(vhost="v1", scope="remote_host", key="10.0.0.1", would_deny=1),
                Row(vhost="v1", scope="remote_host", key="10.0.0.2", would_deny=1)]
    assertDataFrameEqual(wi, expected)
    # Replaying everything (as if the vhost limit were binding) gives the same answer.
    everything = binding.sparkSession.createDataFrame([("vhost", "v1", "v1")], binding.schema)
    assertDataFrameEqual(whatif(sweep, alt, everything), expected)
    # Workers without pyarrow (the spark-submit case of test_submit): the RDD path, same answer.
    assert workers_have_pyarrow(spark)
    monkeypatch.setitem(report_whatif._WORKERS_PYARROW, spark.sparkContext.applicationId, False)
    assertDataFrameEqual(whatif(sweep, alt, binding), expected)
    monkeypatch.undo()
    # Vhost limit 2 binds the whole vhost (the replay itself: test_job's end-to-end run).
    binding = whatif_candidates(peaks, pairs, policy_tables(spark, tmp_path, WHATIF_VHOST))
    assertDataFrameEqual(binding, [Row(scope="vhost", vhost="v1", key="v1")])
    # The POLICY limits are never exceeded (peaks at most equal them): nothing to replay.
    binding = whatif_candidates(peaks, pairs, policy_tables(spark, tmp_path, POLICY))
    assert binding.count() == 0
    assert whatif(sweep, alt, binding).count() == 0


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


def test_replay_admissions_rules():
    """Pure replay: a denied connection holds no slot; a zero-length one is an attempt."""
    rows = [
        ("p", "v", 10, 1, "a", "u", "h", 1, None, None),  # a in (vhost 1/1)
        ("p", "v", 20, 1, "b", "u", "h", 1, None, None),  # b denied: vhost full
        ("p", "v", 30, 0, "b", "u", "h", 1, None, None),  # b's close: ignored
        ("p", "v", 30, 1, "c", "u", "h", 1, None, None),  # c denied: a still open
        ("p", "v", 40, 0, "a", "u", "h", 1, None, None),  # a closes
        ("p", "v", 50, 0, "d", "u", "h", 1, None, None),  # d opens and closes at 50
        ("p", "v", 50, 1, "d", "u", "h", 1, None, None),  #   admitted, holds nothing
        ("p", "v", 60, 1, "e", "u", "h", 1, None, None),  # e in
        ("q", "v", 60, 1, "f", "u", "h", 1, None, None),  # another proxy: its own count
    ]
    assert replay_admissions(rows) == {("v", "vhost", "v"): 2}
    assert replay_admissions(rows[:1]) == {}
    limited = [
        ("p", "v", 1, 1, "a", "u", "h1", None, 1, 5),
        ("p", "v", 2, 1, "b", "u", "h2", None, 1, 5),   # user limit first
        ("p", "v", 3, 1, "c", "w", "h1", None, 1, 1),   # host limit of w's group
    ]
    assert replay_admissions(limited) == {("v", "user", "u"): 1,
                                          ("v", "remote_host", "h1"): 1}
