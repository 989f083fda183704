"""spark_reports.traffic: denials, top denied, traffic, durations and churn of overlap.jsonl.

The connections of ``overlap.jsonl`` are listed in tests/spark/golden.py; its denials are
alice 2x user_limit and bob 1x host_limit on v1, mallory's no_vhost and one global_limit.
"""

from __future__ import annotations

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from amqp_policy_proxy.spark_reports.traffic import (
    churn,
    denials,
    durations,
    top_denied,
    traffic,
)
from tests.spark.golden import assert_rows, ts


def test_denials(overlap):
    """Connection denials per vhost, reason and 1-minute bucket (link_denied is not one)."""
    events, _, _, w = overlap
    assert_rows(denials(events, w), [
        Row(vhost="v1", reason="user_limit", window_start=ts("10:00"), count=2),
        Row(vhost="v1", reason="host_limit", window_start=ts("10:03"), count=1),
        Row(vhost="nope", reason="no_vhost", window_start=ts("10:03"), count=1),
        Row(vhost=None, reason="global_limit", window_start=ts("10:04"), count=1),
    ])


def test_top_denied(overlap):
    """alice 2x user_limit and bob 1x host_limit, both from 10.0.0.1 (3, top user_limit)."""
    events, _, _, w = overlap
    assertDataFrameEqual(top_denied(events, w), [
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
    assertDataFrameEqual(traffic(events, w), [Row(
        vhost="v1", group="g1", connections=3, bytes_in=600, bytes_out=6000, transfers_in=6,
        transfers_out=60, duration_p50=60.0, duration_p95=210.0, duration_p99=210.0,
        duration_max=210.0)])
    assertDataFrameEqual(durations(events, w), [
        Row(vhost="v1", le_seconds=60.0, label="10 s-1 min", count=1),
        Row(vhost="v1", le_seconds=600.0, label="1-10 min", count=2)])
    assert_rows(churn(events, w), [
        Row(vhost="v1", window_start=ts("10:00"), opens=1, closes=0),
        Row(vhost="v1", window_start=ts("10:01"), opens=1, closes=2),
        Row(vhost="v1", window_start=ts("10:02"), opens=2, closes=1)])
