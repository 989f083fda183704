"""Connection churn per vhost and per client host, and its flagged periods. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon. Builds on :mod:`.common` and :mod:`.events`
(the prepared records, :func:`events.records_in_window` and :func:`events.open_at_start`):
the level is counted as the concurrency sweep counts it (docs/spark-reports.md).

The rule is the one of RabbitMQ's cluster-operator alert ``HighConnectionChurn``, applied to
the event log instead of scraped counters: a key churns when its connection opens plus closes
per second exceed ``ratio`` (10 %) of its open connections, the key has at least
``min_connections`` (100) open, and both hold for ``sustain`` (10 minutes) without a break.
Here the rate is measured per **minute** (opens + closes of the minute / 60 s) and the open
connections are the key's level at the end of that minute (what a scrape at the minute's end
would see); a minute without any open or close breaks a period.

Keys: ``vhost`` (all connections of a vhost, fleet-wide) and ``remote_host`` (the connections
of one client IP to one vhost, as for ``maxConnectionsPerHost``). Everything is Spark
aggregations and windows partitioned by key: nothing proportional to the events reaches the
driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.common import (
    US_PER_MINUTE,
    ReportWindow,
    bucket_index,
    micros_to_timestamp,
)
from amqp_policy_proxy.spark_reports.events import open_at_start, records_in_window

#: The scopes churn is computed for, and the record column that is the key of each.
CHURN_SCOPES: tuple[str, ...] = ("vhost", "remote_host")


@dataclass(frozen=True)
class ChurnRule:
    """The thresholds of the churn rule (defaults: cluster-operator's ``HighConnectionChurn``)."""

    ratio: float = 0.1
    """Opens plus closes per second above this fraction of the open connections (> 0)."""
    sustain_minutes: int = 10
    """For at least this many consecutive minutes (>= 1)."""
    min_connections: int = 100
    """Ignored while the key has fewer open connections than this (>= 0)."""

    def __post_init__(self) -> None:
        if not self.ratio > 0:
            raise ValueError("the churn ratio must be positive")
        if self.sustain_minutes < 1:
            raise ValueError("the churn duration must be at least one minute")
        if self.min_connections < 0:
            raise ValueError("the churn minimum of connections must not be negative")


def churn_rates(events: DataFrame, window: ReportWindow, rule: ChurnRule = ChurnRule(),
                carried: bool = True) -> DataFrame:
    """Compute the churn of every vhost and (vhost, client host) per minute, with its flags.

    Args:
        events: output of :func:`.events.prepare_events` (with the look-back before the
            window when ``carried``).
        window: the report window (minutes are epoch-aligned; the first and last may be
            partial).
        rule: the thresholds.
        carried: count the connections open since before the window in the level (as for
            :func:`.events.connection_changes`).

    Returns:
        One row per key and minute with an open or a close in the window: ``scope``
        (vhost|remote_host), ``vhost``, ``key``, ``window_start`` (timestamp of the minute),
        ``opens``, ``closes`` (longs), ``connections`` (long: open connections at the end of
        the minute), ``churn_per_s`` (double: (opens + closes) / 60), ``ratio`` (double:
        ``churn_per_s / connections``, null at 0 connections), ``over`` (the minute meets
        the rule's ratio and minimum) and ``flagged`` (the minute belongs to a run of at
        least ``rule.sustain_minutes`` consecutive ``over`` minutes).
    """
    w0 = F.lit(window.start_us)
    one, zero = F.lit(1), F.lit(0)

    def change(t: Column, d: int, o: int, c: int) -> Column:
        return F.struct(t.alias("t_us"), F.lit(d).alias("d"), F.lit(o).alias("o"),
                        F.lit(c).alias("c"))

    # One pass per event, as the sweep's changes: +1 per open, -1 per close, +1 at the window
    # start for a close opened before it (and for the connections of open_at_start).
    cols = ("vhost", "remote_host")
    opens = records_in_window(events, window, ev.CONNECTION_OPENED).select(
        *cols, F.col("t_us"), one.alias("d"), one.alias("o"), zero.alias("c"))
    early = F.col("opened_us") < window.start_us
    closes = records_in_window(events, window, ev.CONNECTION_CLOSED).select(
        *cols, F.explode(F.array(
            change(F.col("t_us"), -1, 0, 1),
            change(F.when(early, w0), 1, 0, 0))).alias("x")
    ).select(*cols, "x.t_us", "x.d", "x.o", "x.c").where(F.col("t_us").isNotNull())
    rows = opens.unionByName(closes)
    if carried:
        rows = rows.unionByName(open_at_start(events, window).select(
            *cols, w0.alias("t_us"), one.alias("d"), zero.alias("o"), zero.alias("c")))
    keyed = rows.where(F.col("vhost").isNotNull()).select(
        "vhost", bucket_index(F.col("t_us"), US_PER_MINUTE).alias("minute"), "d", "o", "c",
        F.explode(F.array(
            F.struct(F.lit("vhost").alias("scope"), F.col("vhost").alias("key")),
            F.struct(F.lit("remote_host").alias("scope"), F.col("remote_host").alias("key")),
        )).alias("k")).select(F.col("k.scope").alias("scope"), "vhost",
                              F.col("k.key").alias("key"), "minute", "d", "o", "c") \
        .where(F.col("key").isNotNull())
    per_min = keyed.groupBy("scope", "vhost", "key", "minute").agg(
        F.sum("o").cast("long").alias("opens"), F.sum("c").cast("long").alias("closes"),
        F.sum("d").cast("long").alias("net"))
    by_key = Window.partitionBy("scope", "vhost", "key").orderBy("minute")
    level_col = F.sum("net").over(by_key.rowsBetween(Window.unboundedPreceding,
                                                     Window.currentRow))
    with_level = per_min.select("*", level_col.alias("connections")).where(
        (F.col("opens") + F.col("closes")) > 0)
    rate = (F.col("opens") + F.col("closes")) / F.lit(60.0)
    ratio = F.when(F.col("connections") > 0, rate / F.col("connections"))
    over = ((F.col("connections") >= rule.min_connections) & (F.col("connections") > 0)
            & (rate > F.lit(rule.ratio) * F.col("connections")))
    scored = with_level.select("scope", "vhost", "key", "minute", "opens", "closes",
                               "connections", rate.alias("churn_per_s"), ratio.alias("ratio"),
                               over.alias("over"))
    # Runs of consecutive over-minutes: minute - row number is constant along a run.
    rn = F.row_number().over(Window.partitionBy("scope", "vhost", "key", "over")
                             .orderBy("minute"))
    runs = scored.select("*", (F.col("minute") - rn).alias("run"))
    run_len = F.count(F.lit(1)).over(Window.partitionBy("scope", "vhost", "key", "over", "run"))
    flagged = F.col("over") & (run_len >= rule.sustain_minutes)
    return runs.select(
        "scope", "vhost", "key",
        micros_to_timestamp(F.col("minute") * US_PER_MINUTE).alias("window_start"),
        "opens", "closes", F.col("connections").cast("long").alias("connections"),
        "churn_per_s", "ratio", "over", flagged.alias("flagged"))


def churn_periods(rates: DataFrame) -> DataFrame:
    """Reduce the flagged minutes of :func:`churn_rates` to one row per flagged period.

    Args:
        rates: output of :func:`churn_rates`.

    Returns:
        ``scope``, ``vhost``, ``key``, ``start`` (timestamp: the first flagged minute),
        ``end`` (timestamp, exclusive: the end of the last one), ``minutes``, ``opens``,
        ``closes`` (sums over the period), ``peak_churn_per_s``, ``peak_ratio`` (doubles),
        ``max_connections``, ``min_connections`` (longs: the level at the end of its minutes).
    """
    f = rates.where(F.col("flagged")).select(
        "*", F.unix_micros("window_start").alias("us"))
    minute = (F.col("us") / F.lit(US_PER_MINUTE)).cast("long")
    rn = F.row_number().over(Window.partitionBy("scope", "vhost", "key").orderBy("us"))
    runs = f.select("*", (minute - rn).alias("run"))
    return runs.groupBy("scope", "vhost", "key", "run").agg(
        F.min("us").alias("s"), F.max("us").alias("e"), F.count(F.lit(1)).alias("minutes"),
        F.sum("opens").alias("opens"), F.sum("closes").alias("closes"),
        F.max("churn_per_s").alias("peak_churn_per_s"), F.max("ratio").alias("peak_ratio"),
        F.max("connections").alias("max_connections"),
        F.min("connections").alias("min_connections"),
    ).select("scope", "vhost", "key", micros_to_timestamp(F.col("s")).alias("start"),
             micros_to_timestamp(F.col("e") + US_PER_MINUTE).alias("end"),
             F.col("minutes").cast("long").alias("minutes"),
             F.col("opens").cast("long").alias("opens"),
             F.col("closes").cast("long").alias("closes"), "peak_churn_per_s", "peak_ratio",
             "max_connections", "min_connections")
