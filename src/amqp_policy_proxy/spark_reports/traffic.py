"""The event-count tables: denials, top denied, traffic, durations, churn. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`amqp_policy_proxy.eventlog.schema` (event names), :mod:`.common` and :mod:`.events`
(the prepared records and :func:`events.records_in_window`).

These tables count records of one event within the report window and need no sweep: the job
runs them on a branch of their own, beside the concurrency chain. ``denials`` and
``top_denied`` count ``connection_denied`` records (connections); ``traffic`` and
``durations`` sum the figures of ``connection_closed`` records (bytes, transfers, seconds),
so a connection's traffic is attributed to the moment it closes; ``churn`` counts opens and
closes per minute.
"""

from __future__ import annotations

import math

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.common import (
    US_PER_MINUTE,
    ReportWindow,
    bucket_index,
    micros_to_timestamp,
)
from amqp_policy_proxy.spark_reports.events import records_in_window
from amqp_policy_proxy.spark_reports.schemas import ADMIN_JSON

#: Upper bounds (seconds) of the connection duration histogram; the last bin is open.
DURATION_BINS: tuple[tuple[float, str], ...] = (
    (1.0, "< 1 s"), (10.0, "1-10 s"), (60.0, "10 s-1 min"), (600.0, "1-10 min"),
    (3600.0, "10 min-1 h"), (21600.0, "1-6 h"), (86400.0, "6-24 h"), (math.inf, ">= 24 h"),
)


# --------------------------------------------------------------------------------------------
# Denials


def admin_actions(events: DataFrame, window: ReportWindow) -> DataFrame:
    """The ``admin_actions`` table: every operator change through the admin interface in the
    window (schema version 2 logs; none in older ones), oldest first.

    Args:
        events: output of :func:`.events.prepare_events`.
        window: the report window.

    Returns:
        :data:`~.schemas.ADMIN_ACTIONS` columns: ``ts`` (timestamp), ``action``, ``vhost``,
        ``selector``, ``targets`` (array of strings), ``count``, ``result``, ``uid``, ``pid``
        (the admin client's peer credentials; null over TCP), ``peer``, ``description``.
    """
    a = records_in_window(events, window, ev.ADMIN_ACTION)
    fields = F.from_json(F.col("admin"), ADMIN_JSON).alias("a")
    return (a.select(micros_to_timestamp(F.col("t_us")).alias("ts"), "vhost", fields)
            .select("ts", "a.action", "vhost", "a.selector", "a.targets", "a.count", "a.result",
                    "a.uid", "a.pid", "a.peer", "a.description"))


def denials(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Compute the ``denials`` table: connection denials per vhost, reason and grid bucket.

    Args:
        events: output of :func:`events.prepare_events`.
        window: the report window (``connection_denied`` records within it).

    Returns:
        ``vhost`` (null when denied before a vhost was known), ``reason``, ``window_start``
        (bucket start), ``count``.
    """
    d = records_in_window(events, window, ev.CONNECTION_DENIED)
    b = bucket_index(F.col("t_us"), window.grid_us)
    return (d.groupBy("vhost", "reason", b.alias("bucket")).agg(F.count("*").alias("count"))
            .select("vhost", "reason", micros_to_timestamp(F.col("bucket") * window.grid_us)
                    .alias("window_start"), "count"))


def top_denied(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Count connection denials per user and per remote host.

    Args:
        events: output of :func:`events.prepare_events`.
        window: the report window.

    Returns:
        ``scope`` (user|remote_host), ``vhost``, ``key``, ``count``, ``top_reason`` (the most
        frequent reason; at equal counts the alphabetically first). Denials with no user (or host) are counted
        under a null key.
    """
    d = records_in_window(events, window, ev.CONNECTION_DENIED)
    parts = []
    for scope in ("user", "remote_host"):
        by_reason = d.groupBy("vhost", F.col(scope).alias("key"), "reason").count()
        parts.append(by_reason.groupBy("vhost", "key").agg(
            F.sum("count").alias("count"),
            F.min(F.struct((-F.col("count")).alias("n"), F.col("reason"))).alias("m"),
        ).select(F.lit(scope).alias("scope"), "vhost", "key", "count",
                 F.col("m.reason").alias("top_reason")))
    return parts[0].unionByName(parts[1])


# --------------------------------------------------------------------------------------------
# Traffic, durations and churn


def traffic(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Compute bytes, transfers and duration figures per vhost and group.

    Figures come from ``connection_closed`` records, so they are attributed to the moment a
    connection closes; connections still open at the window end are not included.

    Args:
        events: output of :func:`events.prepare_events`.
        window: the report window.

    Returns:
        ``vhost``, ``group``, ``connections`` (closed in the window), ``bytes_in``,
        ``bytes_out``, ``transfers_in``, ``transfers_out`` (sums; ``in`` = client to broker),
        ``duration_p50``/``p95``/``p99`` (seconds, approximate: ``percentile_approx``) and
        ``duration_max``.
    """
    c = records_in_window(events, window, ev.CONNECTION_CLOSED)
    q = F.percentile_approx("duration_seconds", [0.5, 0.95, 0.99], 1000)
    return c.groupBy("vhost", "group").agg(
        F.count("*").alias("connections"),
        *[F.coalesce(F.sum(x), F.lit(0)).cast("long").alias(x)
          for x in ("bytes_in", "bytes_out", "transfers_in", "transfers_out")],
        q.alias("q"), F.max("duration_seconds").alias("duration_max"),
    ).select("vhost", "group", "connections", "bytes_in", "bytes_out", "transfers_in",
             "transfers_out", F.col("q")[0].alias("duration_p50"),
             F.col("q")[1].alias("duration_p95"), F.col("q")[2].alias("duration_p99"),
             "duration_max")


def durations(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Compute the connection duration histogram per vhost.

    Args:
        events: output of :func:`events.prepare_events`.
        window: the report window (connections closed within it).

    Returns:
        ``vhost``, ``le_seconds`` (the bin's exclusive upper bound; ``Infinity`` for the
        last), ``label``, ``count``; only non-empty bins.
    """
    c = records_in_window(events, window, ev.CONNECTION_CLOSED).where(
        F.col("duration_seconds").isNotNull())
    dur = F.col("duration_seconds")
    widest, *narrower = reversed(DURATION_BINS)
    le, label = F.lit(widest[0]), F.lit(widest[1])
    for bound, text in narrower:
        le = F.when(dur < bound, F.lit(bound)).otherwise(le)
        label = F.when(dur < bound, F.lit(text)).otherwise(label)
    return (c.groupBy("vhost", le.cast("double").alias("le_seconds"), label.alias("label"))
            .agg(F.count("*").alias("count")))


def churn(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Count connection opens and closes per vhost and minute (not the grid: always 1 min).

    Args:
        events: output of :func:`events.prepare_events`.
        window: the report window.

    Returns:
        ``vhost``, ``window_start`` (minute), ``opens``, ``closes``; minutes with neither are
        absent.
    """
    m = bucket_index(F.col("t_us"), US_PER_MINUTE).alias("m")
    one, zero = F.lit(1), F.lit(0)
    # One branch per event (no per-record comparison of the event name).
    e = (records_in_window(events, window, ev.CONNECTION_OPENED)
         .select("vhost", m, one.alias("o"), zero.alias("c"))
         .unionByName(records_in_window(events, window, ev.CONNECTION_CLOSED)
                      .select("vhost", m, zero.alias("o"), one.alias("c"))))
    return (e.groupBy("vhost", "m").agg(F.sum("o").cast("long").alias("opens"),
                                        F.sum("c").cast("long").alias("closes"))
            .select("vhost", micros_to_timestamp(F.col("m") * US_PER_MINUTE).alias("window_start"),
                    "opens", "closes"))
