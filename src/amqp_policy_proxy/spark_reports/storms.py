"""Connection storms per vhost, who made them, and the connection rates that would have
smoothed them. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon. Builds on :mod:`.common` and :mod:`.events`.

**The rule** (:class:`StormRule`). From the ``connection_opened`` records of each vhost
(fleet-wide: all proxies together):

1. the opens of every second, and a baseline per minute: the **median** (nearest-rank) of
   the vhost's opens per minute over the ``baseline_minutes`` (60) minutes before it (minutes without an open
   count as 0; the first minutes of the window have a shorter history), divided by 60;
2. a second is *stormy* when its opens are at least ``floor`` (20) and at least ``factor``
   (5) times that baseline per second;
3. stormy seconds less than ``gap_seconds`` (30 s) apart are merged into one storm, from its
   first stormy second to the end of its last; a storm needs ``min_seconds`` (3) stormy
   seconds.

**Who**: the users and client hosts with the most opens during the storm (``top_users``,
``top_hosts``: ``name:opens`` separated by spaces, most first).

**Rates that would have smoothed it** (:func:`storm_limits`), the daemon's connection-rate
keys (docs/policy.md, "Rate limits"): for each storm and key, the rate that caps the storm at
what was normal in the :data:`PRE_STORM_SECONDS` (24 hours: a whole daily cycle, so that the
rate also fits the busy hours) before it, cut at the window start:

- ``maxConnectionRate`` (vhost): the p99 of the vhost's opens per second over every second
  of that period (zero seconds included), at least 1;
- ``maxConnectionRatePerUser`` / ``maxConnectionRatePerHost``: the p99 of a user's (host's)
  opens per second over the seconds of that period in which it opened a connection, at
  least 1.

With ``storm_peak_per_s`` (the highest opens in one second of the vhost, or of any single
user or host, during the storm) and ``over_rate_opens`` (the storm's opens above the rate,
second by second: what the rate would have refused; the burst of ``connectionRateBurst`` is
not modelled). The percentiles are nearest-rank (``ceil(0.99 N)``-th smallest of the N
values).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.common import (
    US_PER_MINUTE,
    US_PER_SECOND,
    ReportWindow,
    bucket_index,
    micros_to_timestamp,
)
from amqp_policy_proxy.spark_reports.events import records_in_window

#: How many users and hosts each storm lists.
TOP_WHO = 3
#: The rate settings :func:`storm_limits` recommends, and the record column each counts by.
RATE_SETTINGS: tuple[tuple[str, str | None], ...] = (
    ("maxConnectionRate", None),
    ("maxConnectionRatePerUser", "user"),
    ("maxConnectionRatePerHost", "remote_host"),
)
#: The period before a storm that its rates are computed from, in seconds.
PRE_STORM_SECONDS = 86_400


@dataclass(frozen=True)
class StormRule:
    """The thresholds of the storm rule (see the module docstring)."""

    factor: float = 5.0
    """A stormy second has at least this many times the baseline opens per second (> 0)."""
    floor: int = 20
    """... and at least this many opens (>= 1)."""
    gap_seconds: int = 30
    """Stormy seconds closer than this are one storm (>= 1)."""
    min_seconds: int = 3
    """A storm has at least this many stormy seconds (>= 1)."""
    baseline_minutes: int = 60
    """The baseline is the median opens per minute over this many minutes before (>= 1)."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError("the storm factor must be positive")
        if self.floor < 1 or self.gap_seconds < 1 or self.min_seconds < 1 \
                or self.baseline_minutes < 1:
            raise ValueError("the storm floor, gap, minimum seconds and baseline must be >= 1")


def _opens(events: DataFrame, window: ReportWindow) -> DataFrame:
    return records_in_window(events, window, ev.CONNECTION_OPENED).where(
        F.col("vhost").isNotNull()).select(
        "vhost", "user", "remote_host", "t_us",
        bucket_index(F.col("t_us"), US_PER_SECOND).alias("sec"))


def storms(events: DataFrame, window: ReportWindow, rule: StormRule = StormRule()) -> DataFrame:
    """Find the connection storms of every vhost.

    Args:
        events: output of :func:`.events.prepare_events`.
        window: the report window.
        rule: the thresholds.

    Returns:
        One row per storm: ``storm_id`` (``<vhost>@<start>``), ``vhost``, ``start``,
        ``end`` (timestamps; end exclusive, the end of the last stormy second),
        ``seconds`` (its length), ``stormy_seconds``, ``opens`` (all opens of the vhost
        within it), ``peak_opens_per_s``, ``peak_ts`` (the first second with the peak),
        ``baseline_per_s`` (double: the baseline at the storm's start), ``top_users``,
        ``top_hosts`` (``name:opens`` separated by spaces), ``top_user``, ``top_host``
        (the first of each, or null).
    """
    o = _opens(events, window)
    per_sec = o.groupBy("vhost", "sec").agg(F.count(F.lit(1)).alias("n"))
    minute_of = (F.col("sec") - F.pmod(F.col("sec"), F.lit(60))) / 60
    per_min = per_sec.groupBy("vhost", minute_of.cast("long").alias("minute")).agg(
        F.sum("n").alias("n"))
    # Dense minutes per vhost (a few per minute of the window: small), so that quiet minutes
    # count as 0 in the median.
    m0 = window.start_us // US_PER_MINUTE
    m1 = (window.end_us - 1) // US_PER_MINUTE
    vhosts = per_min.select("vhost").distinct()
    dense = vhosts.select("vhost", F.explode(F.sequence(F.lit(m0), F.lit(m1))).alias("minute"))
    minutes = dense.join(per_min, ["vhost", "minute"], "left").select(
        "vhost", "minute", F.coalesce(F.col("n"), F.lit(0)).alias("n"))
    before = Window.partitionBy("vhost").orderBy("minute").rowsBetween(
        -rule.baseline_minutes, -1)
    # nearest-rank median of the minutes before: the ceil(k/2)-th smallest of k
    prior = F.sort_array(F.collect_list("n").over(before))
    median = F.element_at(prior, F.greatest(F.lit(1), F.ceil(F.size(prior) / 2).cast("int")))
    base = minutes.select("vhost", "minute", F.when(F.size(prior) > 0, median / F.lit(60.0))
                          .alias("baseline"))
    threshold = F.greatest(F.lit(float(rule.floor)),
                           F.lit(rule.factor) * F.coalesce(F.col("baseline"), F.lit(0.0)))
    stormy = (per_sec.select("*", minute_of.cast("long").alias("minute"))
              .join(base, ["vhost", "minute"])
              .where(F.col("n") >= threshold))
    prev = F.lag("sec").over(Window.partitionBy("vhost").orderBy("sec"))
    starts = stormy.select("*", F.when(prev.isNull() | (F.col("sec") - prev >= rule.gap_seconds),
                                       1).otherwise(0).alias("new"))
    run = F.sum("new").over(Window.partitionBy("vhost").orderBy("sec").rowsBetween(
        Window.unboundedPreceding, Window.currentRow))
    grouped = starts.select("*", run.alias("run")).groupBy("vhost", "run").agg(
        F.min("sec").alias("s0"), F.max("sec").alias("s1"), F.count(F.lit(1)).alias("k"),
        F.max(F.struct(F.col("n"), (-F.col("sec")).alias("neg"))).alias("pk"),
        F.min_by("baseline", "sec").alias("baseline_per_s"))
    found = grouped.where(F.col("k") >= rule.min_seconds).select(
        "vhost", "s0", "s1", "k", F.col("pk.n").alias("peak"),
        (-F.col("pk.neg")).alias("peak_sec"), "baseline_per_s")
    found = found.select(
        F.concat_ws("@", "vhost", F.date_format(micros_to_timestamp(F.col("s0") * US_PER_SECOND),
                                                "yyyy-MM-dd'T'HH:mm:ss'Z'")).alias("storm_id"),
        "*")
    # Who: the records of each storm (few storms: broadcast, range condition per vhost).
    span = F.broadcast(found.select("storm_id", F.col("vhost").alias("s_vhost"), "s0", "s1"))
    inside = o.join(span, (o["vhost"] == span["s_vhost"]) & (o["sec"] >= span["s0"])
                    & (o["sec"] <= span["s1"]))
    opens_in = inside.groupBy("storm_id").agg(F.count(F.lit(1)).alias("opens"))
    tops = [_top_who(inside, col, name) for col, name in (("user", "users"),
                                                          ("remote_host", "hosts"))]
    out = found.join(opens_in, "storm_id", "left")
    for t in tops:
        out = out.join(t, "storm_id", "left")
    return out.select(
        "storm_id", "vhost",
        micros_to_timestamp(F.col("s0") * US_PER_SECOND).alias("start"),
        micros_to_timestamp((F.col("s1") + 1) * US_PER_SECOND).alias("end"),
        (F.col("s1") - F.col("s0") + 1).cast("long").alias("seconds"),
        F.col("k").cast("long").alias("stormy_seconds"),
        F.coalesce(F.col("opens"), F.lit(0)).cast("long").alias("opens"),
        F.col("peak").cast("long").alias("peak_opens_per_s"),
        micros_to_timestamp(F.col("peak_sec") * US_PER_SECOND).alias("peak_ts"),
        F.col("baseline_per_s").cast("double").alias("baseline_per_s"),
        "top_users", "top_hosts", "top_user", "top_host")


def _top_who(inside: DataFrame, col: str, name: str) -> DataFrame:
    # storm_id, top_<name> ("a:12 b:3"), top_<single> (the first), from the records of storms.
    single = "top_user" if name == "users" else "top_host"
    counts = inside.where(F.col(col).isNotNull()).groupBy("storm_id", col).agg(
        F.count(F.lit(1)).alias("n"))
    rank = F.row_number().over(Window.partitionBy("storm_id").orderBy(F.col("n").desc(),
                                                                       F.col(col)))
    top = counts.select("*", rank.alias("r")).where(F.col("r") <= TOP_WHO)
    return top.groupBy("storm_id").agg(
        F.array_sort(F.collect_list(F.struct("r", F.concat_ws(":", F.col(col),
                                                              F.col("n").cast("string"))
                                              .alias("s")))).alias("l"),
        F.min_by(F.col(col), F.col("r")).alias(single),
    ).select("storm_id", F.array_join(F.col("l.s"), " ").alias(f"top_{name}"), single)


def storm_limits(events: DataFrame, window: ReportWindow, found: DataFrame) -> DataFrame:
    """Recommend, per storm, the connection rates that would have capped it at the normal
    rate of the hour before (see the module docstring).

    Args:
        events: output of :func:`.events.prepare_events`.
        window: the report window (the hour before a storm is cut at the window start).
        found: output of :func:`storms`.

    Returns:
        One row per storm and setting: ``storm_id``, ``vhost``, ``setting``
        (``maxConnectionRate``, ``maxConnectionRatePerUser``, ``maxConnectionRatePerHost``),
        ``recommended`` (long, connections per second, >= 1), ``pre_storm_p99_per_s``
        (double), ``storm_peak_per_s`` (long: the vhost's, or the highest single user's or
        host's, opens in one second of the storm) and ``over_rate_opens`` (long: opens of
        the storm above the rate, second by second).
    """
    o = _opens(events, window)
    s = (found.select(
        "storm_id", F.col("vhost").alias("s_vhost"),
        (F.unix_micros("start") / US_PER_SECOND).cast("long").alias("s0"),
        (F.unix_micros("end") / US_PER_SECOND).cast("long").alias("s1")))
    first_sec = window.start_us // US_PER_SECOND
    pre0 = F.greatest(F.col("s0") - PRE_STORM_SECONDS, F.lit(first_sec))
    same = o["vhost"] == s["s_vhost"]
    pre = o.join(F.broadcast(s), same & (o["sec"] >= pre0) & (o["sec"] < s["s0"]))
    during = o.join(F.broadcast(s), same & (o["sec"] >= s["s0"]) & (o["sec"] < s["s1"]))
    # the number of seconds of each storm's pre-storm period (the vhost's zeros count)
    span = s.select("storm_id", (F.col("s0") - pre0).alias("span"))
    parts = []
    for setting, col in RATE_SETTINGS:
        keys = ["storm_id"] + ([col] if col else [])
        pre_n = pre.groupBy(*keys, "sec").agg(F.count(F.lit(1)).alias("n"))
        p99 = _p99(pre_n, span if col is None else None)
        dur_n = during.groupBy(*keys, "sec").agg(F.count(F.lit(1)).alias("n"))
        rec = F.greatest(F.lit(1), F.ceil(F.coalesce(F.col("pre_storm_p99_per_s"),
                                                     F.lit(0.0)))).cast("long")
        per = (found.select("storm_id", "vhost").join(p99, "storm_id", "left")
               .select("storm_id", "vhost", "pre_storm_p99_per_s", rec.alias("recommended")))
        over = dur_n.join(per.select("storm_id", "recommended"), "storm_id").groupBy(
            "storm_id").agg(F.max("n").cast("long").alias("storm_peak_per_s"),
                            F.sum(F.greatest(F.col("n") - F.col("recommended"), F.lit(0)))
                            .cast("long").alias("over_rate_opens"))
        parts.append(per.join(over, "storm_id", "left").select(
            "storm_id", "vhost", F.lit(setting).alias("setting"), "recommended",
            F.coalesce(F.col("pre_storm_p99_per_s"), F.lit(0.0)).alias("pre_storm_p99_per_s"),
            F.coalesce(F.col("storm_peak_per_s"), F.lit(0)).cast("long")
            .alias("storm_peak_per_s"),
            F.coalesce(F.col("over_rate_opens"), F.lit(0)).cast("long")
            .alias("over_rate_opens")))
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def _p99(counts: DataFrame, span: DataFrame | None) -> DataFrame:
    """Nearest-rank p99 of ``counts.n`` per ``storm_id``; with ``span`` (storm_id, span),
    the values are the ``span`` seconds of the period, those absent from ``counts`` being 0.

    Returns:
        ``storm_id``, ``pre_storm_p99_per_s`` (double; storms without values are absent).
    """
    per = counts.groupBy("storm_id").agg(F.count(F.lit(1)).alias("present"))
    if span is not None:
        per = per.join(span, "storm_id")
    else:
        per = per.select("*", F.col("present").alias("span"))
    # rank of the p99 among the present values, after span - present zeros
    rank = F.ceil(F.col("span") * 0.99) - (F.col("span") - F.col("present"))
    order = F.row_number().over(Window.partitionBy("storm_id").orderBy("n"))
    ranked = counts.select("storm_id", "n", order.alias("r")).join(
        per.select("storm_id", rank.alias("want")), "storm_id")
    hit = ranked.where(F.col("r") == F.col("want")).select(
        "storm_id", F.col("n").cast("double").alias("pre_storm_p99_per_s"))
    zeros = per.where(F.col("span") > 0).where(rank <= 0).select(
        "storm_id", F.lit(0.0).alias("pre_storm_p99_per_s"))
    return hit.unionByName(zeros)
