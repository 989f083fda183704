"""Golden-log tests of spark_reports.transforms; every expected value is worked out by hand.

The fixtures are in tests/fixtures/eventlog/. ``overlap.jsonl`` (vhost v1; all times
2026-11-21 UTC), read with the window [10:00, 10:05) and a 1-minute grid (5 buckets):

    conn  user   host      group  open       close      in the window
    c1    alice  10.0.0.1  g1     09:58:00   10:01:30   [10:00:00, 10:01:30)  opened before
    c2    bob    10.0.0.1  g1     10:00:30   10:01:30   [10:00:30, 10:01:30)
    c3    carol  10.0.0.2  g2     10:01:30   -          [10:01:30, 10:05:00)  never closed
    c4    alice  10.0.0.2  g1     10:02:10   10:02:50   [10:02:10, 10:02:50)
    c5    alice  10.0.0.1  g1     10:02:20   10:06:00   [10:02:20, 10:05:00)  closes after
    c6    bob    10.0.0.1  g1     10:06:30   -          outside

At 10:01:30 two closes and one open coincide: closes first, so v1 goes 2 -> 0 -> 1 and never
shows 3 (opens first would make the peak 3 at 10:01:30). v1 over time: 1 from 10:00, 2 from
10:00:30, 1 from 10:01:30, 2 from 10:02:10, 3 from 10:02:20, 2 from 10:02:50 to the end.
Per-bucket maxima (10:00..10:04): 2, 2, 3, 2, 2; sorted 2 2 2 2 3; nearest ranks for N=5:
p50 = rank 3, p95 = p99 = rank 5.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual, assertSchemaEqual

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports import transforms as tf
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from amqp_policy_proxy.spark_reports.limits import load_limits

UTC = dt.UTC
CONTRACT = schemas.CONCURRENCY.fieldNames()


def ts(hms: str, day: int = 21) -> dt.datetime:
    """2026-11-<day> at HH:MM:SS[.fff] UTC."""
    t = dt.time.fromisoformat(hms)
    return dt.datetime(2026, 11, day, t.hour, t.minute, t.second, t.microsecond, tzinfo=UTC)


def us(hms: str) -> int:
    d = ts(hms) - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def window(start: str, end: str, grid_s: int = 60) -> tf.ReportWindow:
    return tf.ReportWindow(us(start), us(end), grid_s * 1_000_000)


def load(spark, path: Path, w: tf.ReportWindow | None = None):
    raw = read_events(spark, str(path), None if w is None else w.start_us - 3_600_000_000,
                      None if w is None else w.end_us)
    return tf.prepare_events(raw)


def conc_rows(rows: list[tuple]) -> list[Row]:
    return [Row(scope=s, vhost=v, key=k, peak=p, p50=a, p95=b, p99=c, peak_ts=ts(t))
            for s, v, k, p, a, b, c, t in rows]


def assert_rows(actual, rows: list) -> None:
    """assertDataFrameEqual against rows given in ``actual``'s column order.

    The expected rows become a DataFrame with ``actual``'s schema, so timestamps (written as
    UTC-aware datetimes here) go through the same conversion on both sides.
    """
    expected = actual.sparkSession.createDataFrame(rows, actual.schema)
    assertDataFrameEqual(actual, expected)


@pytest.fixture(scope="module")
def overlap(spark, fixtures):
    w = window("10:00", "10:05")
    events = load(spark, fixtures / "overlap.jsonl", w).persist()
    sweep = tf.prepare_sweep(events, w).persist(events)
    conc = tf.concurrency(sweep).persist()
    yield events, sweep, conc, w
    conc.unpersist()
    sweep.unpersist()
    events.unpersist()


def test_event_log_schema_follows_the_contract():
    s = schemas.event_log_schema()
    assert s.fieldNames() == [*ev.ALL_FIELDS, "dt", "hour"]
    assert s["ts"].dataType.typeName() == "string"
    assert s["bytes_in"].dataType.typeName() == "long"
    assert s["dt"].dataType.typeName() == "date"
    assert schemas.event_log_schema(partitions=False).fieldNames() == list(ev.ALL_FIELDS)


def test_nearest_rank_and_window():
    assert [tf.nearest_rank(p, 5) for p in (50, 95, 99)] == [3, 5, 5]
    assert [tf.nearest_rank(p, 100) for p in (50, 95, 99)] == [50, 95, 99]
    assert tf.nearest_rank(50, 1) == 1
    w = window("10:00:30", "10:05")
    assert (w.buckets, w.last_bucket - w.first_bucket) == (5, 4)  # partial first bucket counts
    with pytest.raises(ValueError):
        window("10:05", "10:00")


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
    pts = tf.sweep_points(sweep.keyed, sweep.keys, w, tf.SCOPES)
    assertDataFrameEqual(tf.bucket_samples(pts, w, dense=True),
                         tf.bucket_samples(pts, w, dense=False))


def test_hash_collision_falls_back_to_exact_keys(spark, fixtures, monkeypatch, overlap):
    """If two key combinations ever shared a ``combo`` hash, the sweep numbers them exactly.

    Forced here by hashing every combination to the same value.
    """
    from pyspark.sql import functions as F

    monkeypatch.setattr(tf, "_combo_hash", lambda: F.lit(7).cast("long"))
    w = window("10:00", "10:05")
    events = load(spark, fixtures / "overlap.jsonl", w)
    sweep = tf.prepare_sweep(events, w)
    # one row per combination: all four share the hash, so all four are flagged
    assert sweep.keys.where("clash").count() == 4
    sweep = sweep.persist(events)
    try:
        assert sweep.keys.select("combo").distinct().count() == 4
        assertDataFrameEqual(tf.concurrency(sweep).select(*CONTRACT),
                             overlap[2].select(*CONTRACT))
    finally:
        sweep.unpersist()


def test_timeline(overlap):
    """Dense scopes get one sample per bucket; v1's are 2 2 3 2 2 (see module docstring)."""
    _, sweep, _, w = overlap
    pts = tf.sweep_points(sweep.keyed, sweep.keys, w, ("vhost",))
    tl = tf.name_ids(tf.timeline(tf.bucket_samples(pts, w, dense=True), w), sweep.keys,
                     ("vhost",))
    expected = [Row(scope="vhost", vhost="v1", key="v1", window_start=ts(f"10:0{i}"),
                    concurrent=n) for i, n in enumerate((2, 2, 3, 2, 2))]
    assert_rows(tl, expected)


def test_one_bucket_grid(spark, fixtures):
    """--grid 5m: a single bucket whose sample is the peak, so p50 = p95 = p99 = 3."""
    w = window("10:00", "10:05", grid_s=300)
    sweep = tf.prepare_sweep(load(spark, fixtures / "overlap.jsonl", w), w)
    conc = tf.concurrency(sweep, ("vhost",)).select(*CONTRACT)
    assert_rows(conc, conc_rows([("vhost", "v1", "v1", 3, 3, 3, 3, "10:02:20")]))


def test_default_window_is_the_data(spark, fixtures):
    """No --from/--to: the window is [first record 09:58, last record 10:06:30 + 1 ms).

    c1 now opens inside the window (09:58), c5 closes at 10:06 and c6 opens at 10:06:30.
    Bucket maxima 09:58..10:06: 1 1 2 2 3 2 2 2 2 -> N=9, p50 = rank 5 = 2,
    p95 = p99 = rank 9 = 3.
    """
    events = tf.prepare_events(read_events(spark, str(fixtures / "overlap.jsonl")))
    r = tf.event_time_range(events).collect()[0]
    assert (r.min_us, r.max_us) == (us("09:58"), us("10:06:30"))
    w = tf.ReportWindow(r.min_us, r.max_us + 1000, 60_000_000)
    conc = tf.concurrency(tf.prepare_sweep(events, w), ("vhost",)).select(*CONTRACT)
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
    conc = tf.concurrency(tf.prepare_sweep(load(spark, fixtures / "lookback.jsonl", w), w),
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
    monkeypatch.setattr(tf, "PROXY_COLUMNS", columns)
    w = window("12:00", "12:10", grid_s=300)
    events = load(spark, fixtures / "proxies", w)
    assert {r.proxy for r in events.select("proxy").distinct().collect()} == {"pa-1", "pb-2"}
    sweep = tf.prepare_sweep(events, w)
    assert tf.proxy_columns(sweep.keys) == (2 if columns == 8 else 0)
    conc = tf.concurrency(sweep)
    rows = [(s, "v3", k, 4, 2, 4, 4, "12:02") for s, k in (
        ("vhost", "v3"), ("group", "g"), ("user", "frank"), ("remote_host", "10.1.0.1"))]
    assert_rows(conc.select(*CONTRACT), conc_rows(rows))
    assertDataFrameEqual(
        tf.limit_peaks(conc),
        [Row(scope=s, vhost="v3", key=k, peak=2)
         for s, k in (("vhost", "v3"), ("user", "frank"), ("remote_host", "10.1.0.1"))])


def test_close_without_open_is_flagged(spark, tmp_path):
    """A close whose open (inside the window) was dropped: the count goes to -1 (low < 0)."""
    rec = {"schema_version": 1, "event": "connection_closed", "ts": "2026-11-21T10:01:00.000Z",
           "conn_id": "x", "vhost": "v", "group": "g", "user": "u", "remote_host": "h",
           "listener": "l", "opened_ts": "2026-11-21T10:00:30.000Z", "duration_seconds": 30.0}
    (tmp_path / "e.jsonl").write_text(json.dumps(rec) + "\n")
    w = window("10:00", "10:02")
    conc = tf.concurrency(tf.prepare_sweep(load(spark, tmp_path, w), w), ("vhost",))
    assert [(r.peak, r.low) for r in conc.collect()] == [(0, -1)]


def test_denials(overlap):
    """Connection denials per vhost, reason and 1-minute bucket (link_denied is not one)."""
    events, _, _, w = overlap
    assert_rows(tf.denials(events, w), [
        Row(vhost="v1", reason="user_limit", window_start=ts("10:00"), count=2),
        Row(vhost="v1", reason="host_limit", window_start=ts("10:03"), count=1),
        Row(vhost="nope", reason="no_vhost", window_start=ts("10:03"), count=1),
        Row(vhost=None, reason="global_limit", window_start=ts("10:04"), count=1),
    ])


def test_top_denied(overlap):
    """alice 2x user_limit and bob 1x host_limit, both from 10.0.0.1 (3, top user_limit)."""
    events, _, _, w = overlap
    assertDataFrameEqual(tf.top_denied(events, w), [
        Row(scope="user", vhost="v1", key="alice", count=2, top_reason="user_limit"),
        Row(scope="user", vhost="v1", key="bob", count=1, top_reason="host_limit"),
        Row(scope="user", vhost="nope", key="mallory", count=1, top_reason="no_vhost"),
        Row(scope="user", vhost=None, key=None, count=1, top_reason="global_limit"),
        Row(scope="remote_host", vhost="v1", key="10.0.0.1", count=3, top_reason="user_limit"),
        Row(scope="remote_host", vhost="nope", key="10.9.9.9", count=1, top_reason="no_vhost"),
        Row(scope="remote_host", vhost=None, key="10.9.9.9", count=1,
            top_reason="global_limit"),
    ])


def test_traffic_durations_churn(overlap):
    """Closes in the window: c1 (210 s), c2 (60 s), c4 (40 s); c5 closes after it.

    Bytes 100+200+300 in, 1000+2000+3000 out; transfers 6 in, 60 out. Durations sorted
    40, 60, 210: p50 60, p95 = p99 = max = 210. Histogram: 40 s in [10 s, 1 min), 60 s and
    210 s in [1, 10 min). Opens per minute 10:00 1 (c2), 10:01 1 (c3), 10:02 2 (c4, c5);
    closes 10:01 2 (c1, c2), 10:02 1 (c4).
    """
    events, _, _, w = overlap
    assertDataFrameEqual(tf.traffic(events, w), [Row(
        vhost="v1", group="g1", connections=3, bytes_in=600, bytes_out=6000, transfers_in=6,
        transfers_out=60, duration_p50=60.0, duration_p95=210.0, duration_p99=210.0,
        duration_max=210.0)])
    assertDataFrameEqual(tf.durations(events, w), [
        Row(vhost="v1", le_seconds=60.0, label="10 s-1 min", count=1),
        Row(vhost="v1", le_seconds=600.0, label="1-10 min", count=2)])
    assert_rows(tf.churn(events, w), [
        Row(vhost="v1", window_start=ts("10:00"), opens=1, closes=0),
        Row(vhost="v1", window_start=ts("10:01"), opens=1, closes=2),
        Row(vhost="v1", window_start=ts("10:02"), opens=2, closes=1)])


POLICY = """# limits for overlap.jsonl
[["vhost", {"hostname": "v1", "maxConnections": 4, "maxConnectionsPerUser": 3,
  "maxConnectionsPerHost": 2,
  "groups": {"g1": {"users": "alice, bob", "remoteHosts": "*"},
             "g2": {"users": ["carol"], "maxConnectionsPerUser": 1,
                    "maxConnectionsPerHost": 4}}}]]
"""


def policy_tables(spark, tmp_path: Path, text: str) -> tf.LimitTables:
    p = tmp_path / "policy.json"
    p.write_text(text)
    return tf.limit_tables(spark, load_limits(p))


def test_headroom_and_recommendations(spark, overlap, tmp_path):
    """Limits: v1 4, per user 3, per host 2; g2 overrides per user 1 and per host 4.

    Headroom: v1 3/4; alice 2/3, bob 1/3 (g1: vhost values); carol 1/1 (g2); host .1 2/2
    (alice, bob: g1); host .2 2/2 (carol g2 allows 4, alice g1 allows 2: the smaller).
    Recommendations, ceil(peak x 1.25): maxConnections ceil(3.75) = 4; per user for the
    vhost from alice's 2 -> 3, for g2 from carol's 1 -> 2; per host for the vhost from the
    g1 hosts (.1 and .2, both 2) -> 3, for g2 from .2 (2) -> 3.
    """
    _, sweep, conc, _ = overlap
    lt = policy_tables(spark, tmp_path, POLICY)
    peaks = tf.limit_peaks(conc)
    pairs = tf.key_groups(sweep.keys)
    hr = tf.headroom(peaks, pairs, lt)
    assertSchemaEqual(hr.schema, schemas.HEADROOM)
    assertDataFrameEqual(hr, [
        Row(scope="vhost", vhost="v1", key="v1", limit=4, peak=3, utilisation=0.75),
        Row(scope="user", vhost="v1", key="alice", limit=3, peak=2, utilisation=2 / 3),
        Row(scope="user", vhost="v1", key="bob", limit=3, peak=1, utilisation=1 / 3),
        Row(scope="user", vhost="v1", key="carol", limit=1, peak=1, utilisation=1.0),
        Row(scope="remote_host", vhost="v1", key="10.0.0.1", limit=2, peak=2, utilisation=1.0),
        Row(scope="remote_host", vhost="v1", key="10.0.0.2", limit=2, peak=2, utilisation=1.0),
    ])
    rec = tf.recommendations(peaks, pairs, lt)
    assertSchemaEqual(rec.schema, schemas.RECOMMENDATIONS)
    assertDataFrameEqual(rec, [
        Row(vhost="v1", group="", setting="maxConnections", current=4, recommended=4,
            change="keep"),
        Row(vhost="v1", group="", setting="maxConnectionsPerUser", current=3, recommended=3,
            change="keep"),
        Row(vhost="v1", group="g2", setting="maxConnectionsPerUser", current=1, recommended=2,
            change="raise"),
        Row(vhost="v1", group="", setting="maxConnectionsPerHost", current=2, recommended=3,
            change="raise"),
        # g2's per-host limit 4 is more than its peak needs: marked as lowering the limit
        Row(vhost="v1", group="g2", setting="maxConnectionsPerHost", current=4, recommended=3,
            change="lower"),
    ])
    # Without a policy: vhost rows only, no current value, so no change either.
    assertDataFrameEqual(tf.recommendations(peaks, pairs, None), [
        Row(vhost="v1", group="", setting=s, current=None, recommended=r, change=None)
        for s, r in (("maxConnections", 4), ("maxConnectionsPerUser", 3),
                     ("maxConnectionsPerHost", 3))])


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
    peaks = tf.limit_peaks(conc)
    pairs = tf.key_groups(sweep.keys)
    alt = policy_tables(spark, tmp_path, WHATIF_HOSTS)
    binding = tf.whatif_candidates(peaks, pairs, alt)
    # Observed per-proxy peaks above the new limits: alice 2 > 1, both hosts 2 > 1.
    assertDataFrameEqual(binding, [Row(scope="user", vhost="v1", key="alice"),
                                   Row(scope="remote_host", vhost="v1", key="10.0.0.1"),
                                   Row(scope="remote_host", vhost="v1", key="10.0.0.2")])
    wi = tf.whatif(sweep, alt, binding)
    assertSchemaEqual(wi.schema, schemas.WHATIF)
    expected = [Row(vhost="v1", scope="remote_host", key="10.0.0.1", would_deny=1),
                Row(vhost="v1", scope="remote_host", key="10.0.0.2", would_deny=1)]
    assertDataFrameEqual(wi, expected)
    # Replaying everything (as if the vhost limit were binding) gives the same answer.
    everything = binding.sparkSession.createDataFrame([("vhost", "v1", "v1")], binding.schema)
    assertDataFrameEqual(tf.whatif(sweep, alt, everything), expected)
    # Workers without pyarrow (the spark-submit case of test_submit): the RDD path, same answer.
    assert tf.workers_have_pyarrow(spark)
    monkeypatch.setitem(tf._WORKERS_PYARROW, spark.sparkContext.applicationId, False)
    assertDataFrameEqual(tf.whatif(sweep, alt, binding), expected)
    monkeypatch.undo()
    # Vhost limit 2 binds the whole vhost (the replay itself: test_job's end-to-end run).
    binding = tf.whatif_candidates(peaks, pairs, policy_tables(spark, tmp_path, WHATIF_VHOST))
    assertDataFrameEqual(binding, [Row(scope="vhost", vhost="v1", key="v1")])
    # The POLICY limits are never exceeded (peaks at most equal them): nothing to replay.
    binding = tf.whatif_candidates(peaks, pairs, policy_tables(spark, tmp_path, POLICY))
    assert binding.count() == 0
    assert tf.whatif(sweep, alt, binding).count() == 0


def test_workers_run_this_python(monkeypatch):
    """Only a local master whose PYSPARK_PYTHON names this very file skips the worker probe."""
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert tf._workers_run_this_python("local[2]", None)
    assert not tf._workers_run_this_python("spark://127.0.0.1:7077", None)
    assert not tf._workers_run_this_python("local[2]", "/nonexistent/python3")  # conf wins
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert not tf._workers_run_this_python("local[*]", None)
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert not tf._workers_run_this_python("local", None)


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
    assert tf.replay_admissions(rows) == {("v", "vhost", "v"): 2}
    assert tf.replay_admissions(rows[:1]) == {}
    limited = [
        ("p", "v", 1, 1, "a", "u", "h1", None, 1, 5),
        ("p", "v", 2, 1, "b", "u", "h2", None, 1, 5),   # user limit first
        ("p", "v", 3, 1, "c", "w", "h1", None, 1, 1),   # host limit of w's group
    ]
    assert tf.replay_admissions(limited) == {("v", "user", "u"): 1,
                                             ("v", "remote_host", "h1"): 1}
