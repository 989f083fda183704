"""spark_reports.concurrency: the sweep, its percentiles and the timeline, worked out by hand.

Most tests read ``overlap.jsonl`` through the ``overlap`` fixture; its connections and v1's
level over time are in tests/spark/golden.py.
"""

from __future__ import annotations

import json

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports.common import SCOPES
from amqp_policy_proxy.spark_reports.concurrency import (
    bucket_samples,
    concurrency,
    nearest_rank,
    sweep_points,
    timeline,
)
from amqp_policy_proxy.spark_reports.events import name_ids, prepare_sweep
from tests.spark.golden import CONTRACT, assert_rows, conc_rows, load, ts, window


def test_nearest_rank():
    assert [nearest_rank(p, 5) for p in (50, 95, 99)] == [3, 5, 5]
    assert [nearest_rank(p, 100) for p in (50, 95, 99)] == [50, 95, 99]
    assert nearest_rank(50, 1) == 1


def test_concurrency_overlap(overlap):
    """Hand-worked per key (bucket maxima 10:00..10:04 -> peak, p50, p95, p99, peak_ts).

    v1     2 2 3 2 2  -> 3, 2, 3, 3 at 10:02:20 (not 10:01:30: closes come first)
    g1     2 2 2 1 1  -> 2, 2, 2, 2 at 10:00:30 (c1, c2 / c4, c5)
    g2     0 1 1 1 1  -> 1, 1, 1, 1 at 10:01:30
    alice  1 1 2 1 1  -> 2, 1, 2, 2 at 10:02:20
    bob    1 1 0 0 0  -> 1, 0, 1, 1 at 10:00:30 (zero buckets count: p50 = 0)
    carol  0 1 1 1 1  -> 1, 1, 1, 1 at 10:01:30
    .1     2 2 1 1 1  -> 2, 1, 2, 2 at 10:00:30 (c1, c2, then c5)
    .2     0 1 2 1 1  -> 2, 1, 2, 2 at 10:02:10 (c3, c4)
    """
    _, _, conc, _ = overlap
    expected = conc_rows([
        ("vhost", "v1", "v1", 3, 2, 3, 3, "10:02:20"),
        ("group", "v1", "g1", 2, 2, 2, 2, "10:00:30"),
        ("group", "v1", "g2", 1, 1, 1, 1, "10:01:30"),
        ("user", "v1", "alice", 2, 1, 2, 2, "10:02:20"),
        ("user", "v1", "bob", 1, 0, 1, 1, "10:00:30"),
        ("user", "v1", "carol", 1, 1, 1, 1, "10:01:30"),
        ("remote_host", "v1", "10.0.0.1", 2, 1, 2, 2, "10:00:30"),
        ("remote_host", "v1", "10.0.0.2", 2, 1, 2, 2, "10:02:10"),
    ])
    actual = conc.select(*CONTRACT)
    assertSchemaEqual(actual.schema, schemas.CONCURRENCY)
    assert_rows(actual, expected)
    # One proxy: the per-proxy peak is the fleet peak; groups have no limit.
    extra = {(r.scope, r.key): (r.proxy_peak, r.low) for r in conc.collect()}
    assert extra[("user", "alice")] == (2, 0)
    assert extra[("group", "g1")] == (None, 0)


def test_dense_and_sparse_plans_agree(overlap):
    """The two-level (dense) and one-window (sparse) sweeps give identical bucket samples."""
    _, sweep, _, w = overlap
    pts = sweep_points(sweep.keyed, sweep.keys, w, SCOPES)
    assertDataFrameEqual(bucket_samples(pts, w, dense=True),
                         bucket_samples(pts, w, dense=False))


def test_timeline(overlap):
    """Dense scopes get one sample per bucket; v1's are 2 2 3 2 2 (see golden.py)."""
    _, sweep, _, w = overlap
    pts = sweep_points(sweep.keyed, sweep.keys, w, ("vhost",))
    tl = name_ids(timeline(bucket_samples(pts, w, dense=True), w), sweep.keys, ("vhost",))
    expected = [Row(scope="vhost", vhost="v1", key="v1", window_start=ts(f"10:0{i}"),
                    concurrent=n) for i, n in enumerate((2, 2, 3, 2, 2))]
    assert_rows(tl, expected)


def test_one_bucket_grid(spark, fixtures):
    """--grid 5m: a single bucket whose sample is the peak, so p50 = p95 = p99 = 3."""
    w = window("10:00", "10:05", grid_s=300)
    sweep = prepare_sweep(load(spark, fixtures / "overlap.jsonl", w), w)
    conc = concurrency(sweep, ("vhost",)).select(*CONTRACT)
    assert_rows(conc, conc_rows([("vhost", "v1", "v1", 3, 3, 3, 3, "10:02:20")]))


def test_close_without_open_is_flagged(spark, tmp_path):
    """A close whose open (inside the window) was dropped: the count goes to -1 (low < 0)."""
    rec = {"schema_version": 1, "event": "connection_closed", "ts": "2026-11-21T10:01:00.000Z",
           "conn_id": "x", "vhost": "v", "group": "g", "user": "u", "remote_host": "h",
           "listener": "l", "opened_ts": "2026-11-21T10:00:30.000Z", "duration_seconds": 30.0}
    (tmp_path / "e.jsonl").write_text(json.dumps(rec) + "\n")
    w = window("10:00", "10:02")
    conc = concurrency(prepare_sweep(load(spark, tmp_path, w), w), ("vhost",))
    assert [(r.peak, r.low) for r in conc.collect()] == [(0, -1)]
