"""Shared helpers of the golden-log tests; every expected value is worked out by hand.

The fixtures are in tests/fixtures/eventlog/. ``overlap.jsonl`` (vhost v1; all times
2026-11-21 UTC), read with the window [10:00, 10:05) and a 1-minute grid (5 buckets), is
shared by test_concurrency, test_headroom, test_whatif and test_traffic (the ``overlap``
fixture of conftest.py):

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
from pathlib import Path

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from amqp_policy_proxy.spark_reports import schemas
from amqp_policy_proxy.spark_reports.common import ReportWindow
from amqp_policy_proxy.spark_reports.events import prepare_events
from amqp_policy_proxy.spark_reports.headroom import LimitTables, limit_tables
from amqp_policy_proxy.spark_reports.jobs.capacity import read_events
from amqp_policy_proxy.spark_reports.limits import load_limits

UTC = dt.UTC
CONTRACT = schemas.CONCURRENCY.fieldNames()


def ts(hms: str, day: int = 21) -> dt.datetime:
    """2026-11-<day> at HH:MM:SS[.fff] UTC."""
    t = dt.time.fromisoformat(hms)
    return dt.datetime(2026, 11, day, t.hour, t.minute, t.second, t.microsecond, tzinfo=UTC)


def us(hms: str) -> int:
    """2026-11-21 at HH:MM:SS[.fff] UTC, in microseconds since the epoch."""
    d = ts(hms) - dt.datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds


def window(start: str, end: str, grid_s: int = 60) -> ReportWindow:
    """The report window [start, end) of 2026-11-21 with a ``grid_s``-second grid."""
    return ReportWindow(us(start), us(end), grid_s * 1_000_000)


def load(spark, path: Path, w: ReportWindow | None = None):
    """Read a golden log as the job does (one hour of look-back) and prepare its events."""
    raw = read_events(spark, str(path), None if w is None else w.start_us - 3_600_000_000,
                      None if w is None else w.end_us)
    return prepare_events(raw)


def conc_rows(rows: list[tuple]) -> list[Row]:
    """Concurrency contract rows from (scope, vhost, key, peak, p50, p95, p99, "HH:MM")."""
    return [Row(scope=s, vhost=v, key=k, peak=p, p50=a, p95=b, p99=c, peak_ts=ts(t))
            for s, v, k, p, a, b, c, t in rows]


def assert_rows(actual, rows: list) -> None:
    """assertDataFrameEqual against rows given in ``actual``'s column order.

    The expected rows become a DataFrame with ``actual``'s schema, so timestamps (written as
    UTC-aware datetimes here) go through the same conversion on both sides.
    """
    expected = actual.sparkSession.createDataFrame(rows, actual.schema)
    assertDataFrameEqual(actual, expected)


POLICY = """# limits for overlap.jsonl
[["vhost", {"hostname": "v1", "maxConnections": 4, "maxConnectionsPerUser": 3,
  "maxConnectionsPerHost": 2,
  "groups": {"g1": {"users": "alice, bob", "remoteHosts": "*"},
             "g2": {"users": ["carol"], "maxConnectionsPerUser": 1,
                    "maxConnectionsPerHost": 4}}}]]
"""


def policy_tables(spark, tmp_path: Path, text: str) -> LimitTables:
    """The limit tables of a policy given as text (written to ``tmp_path/policy.json``)."""
    p = tmp_path / "policy.json"
    p.write_text(text)
    return limit_tables(spark, load_limits(p))
