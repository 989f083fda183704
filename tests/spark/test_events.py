"""spark_reports.events: the prepared records, the window's changes and the key table.

Golden logs of tests/fixtures/eventlog/ (see tests/spark/golden.py); the figures are read
through the concurrency table, whose semantics test_concurrency pins down.
"""

from __future__ import annotations

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from amqp_policy_proxy.spark_reports import events as report_events
from amqp_policy_proxy.spark_reports.common import ReportWindow
from amqp_policy_proxy.spark_reports.concurrency import concurrency, limit_peaks
from amqp_policy_proxy.spark_reports.events import (
    event_time_range,
    prepare_events,
    prepare_sweep,
    proxy_columns,
)
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from tests.spark.golden import CONTRACT, assert_rows, conc_rows, load, us, window


def test_hash_collision_falls_back_to_exact_keys(spark, fixtures, monkeypatch, overlap):
    """If two key combinations ever shared a ``combo`` hash, the sweep numbers them exactly.

    Forced here by hashing every combination to the same value.
    """
    from pyspark.sql import functions as F

    monkeypatch.setattr(report_events, "_combo_hash", lambda: F.lit(7).cast("long"))
    w = window("10:00", "10:05")
    events = load(spark, fixtures / "overlap.jsonl", w)
    sweep = prepare_sweep(events, w)
    # one row per combination: all four share the hash, so all four are flagged
    assert sweep.keys.where("clash").count() == 4
    sweep = sweep.persist(events)
    try:
        assert sweep.keys.select("combo").distinct().count() == 4
        assertDataFrameEqual(concurrency(sweep).select(*CONTRACT),
                             overlap[2].select(*CONTRACT))
    finally:
        sweep.unpersist()


def test_default_window_is_the_data(spark, fixtures):
    """No --from/--to: the window is [first record 09:58, last record 10:06:30 + 1 ms).

    c1 now opens inside the window (09:58), c5 closes at 10:06 and c6 opens at 10:06:30.
    Bucket maxima 09:58..10:06: 1 1 2 2 3 2 2 2 2 -> N=9, p50 = rank 5 = 2,
    p95 = p99 = rank 9 = 3.
    """
    events = prepare_events(read_events(spark, str(fixtures / "overlap.jsonl")))
    r = event_time_range(events).collect()[0]
    assert (r.min_us, r.max_us) == (us("09:58"), us("10:06:30"))
    w = ReportWindow(r.min_us, r.max_us + 1000, 60_000_000)
    conc = concurrency(prepare_sweep(events, w), ("vhost",)).select(*CONTRACT)
    assert_rows(conc, conc_rows([("vhost", "v1", "v1", 3, 2, 3, 3, "10:02:20")]))


def test_connections_open_at_the_window_start(spark, fixtures):
    """lookback.jsonl, window [10:00, 10:02), grid 1m.

    k1 opened 09:50, never closed      -> counted 10:00-10:02 (found by the look-back)
    k2 opened 09:51, closed 09:55      -> not counted
    k3 opened 09:52, closed 10:00:00.000 exactly at the start -> not counted
    k4 opened 09:53, closed 10:01      -> counted 10:00-10:01 (from its close's opened_ts;
                                          its opened record must not count a second time)
    k5 erin 10:00:30, closed 10:03     -> counted 10:00:30-10:02 (close is after --to)
    v2: 2 (k1, k4), 3 from 10:00:30, 2 from 10:01 -> buckets 3, 2 -> p50 = rank 1 = 2.
    dave: 2 then 1 from 10:01 -> buckets 2, 1. erin: 1, 1.
    """
    w = window("10:00", "10:02")
    conc = concurrency(prepare_sweep(load(spark, fixtures / "lookback.jsonl", w), w),
                       ("vhost", "user"))
    assert_rows(conc.select(*CONTRACT), conc_rows([
        ("vhost", "v2", "v2", 3, 2, 3, 3, "10:00:30"),
        ("user", "v2", "dave", 2, 1, 2, 2, "10:00:00"),
        ("user", "v2", "erin", 1, 1, 1, 1, "10:00:30"),
    ]))


@pytest.mark.parametrize("columns", [8, 1], ids=["per-proxy sums", "per-proxy key ids"])
def test_conn_ids_are_paired_per_proxy(spark, fixtures, monkeypatch, columns):
    """proxies/: conn_id 7 exists on proxy pa-1 (closed 12:04) and pb-2 (never closed).

    Window [12:00, 12:10), grid 5m. Pairing by conn_id alone would let pa-1's close end
    pb-2's connection. frank: pa7 12:00-12:04, pb7 12:00-12:10, pa8 12:01-12:06,
    pb9 12:02-12:03 -> 2, 3 at 12:01, 4 at 12:02, 3, 2 at 12:04, 1 at 12:06. Buckets 4, 2:
    p50 = 2, p95 = p99 = 4. Within one proxy at most 2 (pa: 12:01-12:04; pb: 12:02-12:03).
    The per-proxy peak comes from running sums per proxy in the sweep's window, or (for
    keys on more proxies than PROXY_COLUMNS, forced here with 1) from per-proxy key ids.
    """
    monkeypatch.setattr(report_events, "PROXY_COLUMNS", columns)
    w = window("12:00", "12:10", grid_s=300)
    events = load(spark, fixtures / "proxies", w)
    assert {r.proxy for r in events.select("proxy").distinct().collect()} == {"pa-1", "pb-2"}
    sweep = prepare_sweep(events, w)
    assert proxy_columns(sweep.keys) == (2 if columns == 8 else 0)
    conc = concurrency(sweep)
    rows = [(s, "v3", k, 4, 2, 4, 4, "12:02") for s, k in (
        ("vhost", "v3"), ("group", "g"), ("user", "frank"), ("remote_host", "10.1.0.1"))]
    assert_rows(conc.select(*CONTRACT), conc_rows(rows))
    assertDataFrameEqual(
        limit_peaks(conc),
        [Row(scope=s, vhost="v3", key=k, peak=2)
         for s, k in (("vhost", "v3"), ("user", "frank"), ("remote_host", "10.1.0.1"))])
