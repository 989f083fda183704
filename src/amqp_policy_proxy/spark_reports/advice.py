"""Recommendations you can apply: limits from a stated rule, with their evidence. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon. Here: :mod:`.common`, :mod:`.events` (the
sweep inputs), :mod:`.concurrency` (the sweep itself: :func:`concurrency.sweep_points`,
:func:`concurrency.bucket_samples`, :func:`concurrency.concurrency_stats`) and
:mod:`.headroom` (how a user's group and limits are looked up); :mod:`.policy_writer` turns
the rows into policy files and a diff.

The rule (:class:`Rule`): for each key (vhost, user, remote host) take its grid-bucket samples
(the maximum concurrency of each bucket: with the default ``--grid 1m``, the per-minute
peak) over every bucket of the window, zero buckets included; take their ``P``-th
nearest-rank percentile (rank ``ceil(P * N / 100)`` of the ``N`` sorted samples; default
``P = 99.9``); multiply by the headroom factor (default 1.25) and round up:
``recommended = min(65535, max(1, ceil(percentile * factor)))``. With per-process limits the
samples are those of each proxy process alone and the highest per-proxy percentile counts;
with fleet-wide limits (one shared ledger) those of the whole fleet. A setting governs
several keys (a vhost's ``maxConnectionsPerUser`` every user without a group override): it
gets the largest of their recommendations, and its evidence is that key's percentile, its
peak (the highest sample) and the instant of the peak.

Connection rates (``maxConnectionRate``, ``maxConnectionRatePerUser``,
``maxConnectionRatePerHost``, extensions over QDR, docs/policy.md "Rate limits") follow the
same rule over the connections admitted per second (``connection_opened`` records), the
percentile taken over the seconds with at least one open (over every second of a week
nearly every percentile would be 0, which means "unlimited").
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.common import LIMIT_SCOPES, ReportWindow
from amqp_policy_proxy.spark_reports.concurrency import (
    bucket_samples,
    concurrency_stats,
    sweep_points,
)
from amqp_policy_proxy.spark_reports.events import PROXY_BITS, Sweep, records_in_window
from amqp_policy_proxy.spark_reports.headroom import MAX_LIMIT, LimitTables, resolve_limits
from amqp_policy_proxy.spark_reports.rule import Rule

#: The largest connection rate a policy accepts (docs/policy.md).
MAX_RATE = 1_000_000


def _apply(rule: Rule, value: Column, cap: int = MAX_LIMIT) -> Column:
    """``min(cap, max(1, ceil(value * factor)))`` as a long column."""
    return F.least(F.greatest(F.ceil(value * F.lit(rule.factor)), F.lit(1)),
                   F.lit(cap)).cast("long")


# --------------------------------------------------------------------------------------------
# The percentile of every limited key


def key_percentiles(sweep: Sweep, rule: Rule, fleet: bool = False) -> DataFrame:
    """Sweep the limited scopes again and take the rule's percentile of every key.

    Args:
        sweep: from :func:`events.prepare_sweep` (persisted).
        rule: the recommendation rule.
        fleet: fleet-wide limits: the samples of the whole fleet; otherwise those of each
            proxy process (the highest per-proxy percentile counts).

    Returns:
        ``scope`` (vhost|user|remote_host), ``vhost``, ``key``, ``value`` (the percentile of
        the bucket samples), ``peak`` (the highest sample) and ``peak_ts`` (its earliest
        instant), of the proxy whose percentile is highest (per-process limits). Persisted
        (one row per key; the caller unpersists it).
    """
    w = sweep.window
    keys = sweep.keys
    if not fleet:
        # Every key seen on several proxies gets one id per proxy instead of its fleet-wide
        # one (no per-proxy running sums).
        for sc in LIMIT_SCOPES:
            many = F.col(f"{sc}_np") >= 2
            pid = -(F.shiftleft(F.col(f"{sc}_id"), PROXY_BITS) + F.col("proxy_ix")) - 1
            keys = (keys.withColumn(f"{sc}_pix", F.lit(None).cast("int"))
                    .withColumn(f"{sc}_pid", F.when(many, pid))
                    .withColumn(f"{sc}_id", F.when(~many, F.col(f"{sc}_id"))))
    else:
        for sc in LIMIT_SCOPES:
            keys = keys.withColumn(f"{sc}_pix", F.lit(None).cast("int")).withColumn(
                f"{sc}_pid", F.lit(None).cast("long"))
    parts = []
    for scopes, dense in ((("vhost",), True), (("user", "remote_host"), False)):
        pts = sweep_points(sweep.keyed, keys, w, scopes, by_bucket=dense)
        samples = bucket_samples(pts, w, dense=dense).persist()
        parts.append((samples, _percentile(samples, w, rule.rank(w.buckets))
                      .join(concurrency_stats(samples, w).select("id", "peak", "peak_ts"),
                            "id")))
    stats = parts[0][1].unionByName(parts[1][1])
    per_proxy = F.col("id") < 0
    base = F.when(per_proxy, F.shiftright(-F.col("id") - 1, PROXY_BITS)).otherwise(F.col("id"))
    # per key: the per-proxy rows when it has them (they exist for every proxy it was seen
    # on), else its one fleet-wide row
    ranked = stats.select(base.alias("base"), per_proxy.alias("pp"), "value", "peak",
                          "peak_ts")
    best = ranked.groupBy("base").agg(F.max(F.struct(
        "pp", "value", "peak", (-F.unix_micros("peak_ts")).alias("t"))).alias("b"))
    from amqp_policy_proxy.spark_reports.events import scope_keys

    names = scope_keys(sweep.keys, LIMIT_SCOPES)
    out = best.join(F.broadcast(names), best["base"] == names["id"]).select(
        "scope", "vhost", "key", F.col("b.value").alias("value"), F.col("b.peak").alias("peak"),
        F.timestamp_micros(-F.col("b.t")).alias("peak_ts")).persist()
    out.count()  # one row per key: computed once here, read by every setting's query
    for samples, _ in parts:
        samples.unpersist()
    return out


def _percentile(samples: DataFrame, window: ReportWindow, rank: int) -> DataFrame:
    """``id``, ``value``: the sample of ``rank`` in each id's sorted bucket samples (the
    histogram of :func:`concurrency.concurrency_stats`, at any rank)."""
    hist = (
        samples.select("id", F.explode(F.array(
            F.struct(F.col("v").alias("value"), F.lit(1).cast("long").alias("w")),
            F.struct(F.col("gv").alias("value"), F.col("gw").cast("long").alias("w")),
            F.struct(F.lit(0).cast("long").alias("value"), F.col("lw").cast("long").alias("w")),
        )).alias("s"))
        .where(F.col("s.w") > 0)
        .groupBy("id", F.col("s.value").alias("value")).agg(F.sum("s.w").alias("w"))
    )
    cum = F.sum("w").over(Window.partitionBy("id").orderBy("value")
                          .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return hist.select("id", "value", cum.alias("cum")).groupBy("id").agg(
        F.min(F.when(F.col("cum") >= rank, F.col("value"))).alias("value"))


def open_rates(events: DataFrame, window: ReportWindow, rule: Rule,
               fleet: bool = False) -> DataFrame:
    """The rule's percentile of the admitted opens per second of every limited key.

    Args:
        events: the prepared events.
        window: the report window.
        rule: the recommendation rule.
        fleet: count the opens of the whole fleet per second; otherwise per proxy process
            (the highest per-proxy value counts).

    Returns:
        ``scope``, ``vhost``, ``key``, ``value`` (the percentile of opens per second over the
        seconds with an open), ``peak`` (the most opens in one second), ``peak_ts`` (the
        first such second). Persisted (the caller unpersists it).
    """
    opens = records_in_window(events, window, ev.CONNECTION_OPENED).select(
        "proxy", "vhost", "user", "remote_host",
        (F.col("t_us") - F.pmod(F.col("t_us"), F.lit(1_000_000))).alias("sec"))
    parts = []
    for scope in LIMIT_SCOPES:
        key = F.col("vhost") if scope == "vhost" else F.col(scope)
        by = ["vhost", "k"] if fleet else ["proxy", "vhost", "k"]
        per_sec = (opens.where(F.col("vhost").isNotNull() & key.isNotNull())
                   .select("proxy", "vhost", key.alias("k"), "sec")
                   .groupBy(*by, "sec").agg(F.count(F.lit(1)).alias("n")))
        n_active = F.count(F.lit(1)).over(Window.partitionBy(*by))
        order = Window.partitionBy(*by).orderBy("n")
        ranked = per_sec.select(*by, "sec", "n", n_active.alias("m"),
                                F.row_number().over(order).alias("r"))
        a, b = rule.percentile.as_integer_ratio()  # rank = ceil(P * m / 100), exactly
        rank = F.greatest(F.lit(1), F.floor((F.col("m") * F.lit(a) + F.lit(100 * b - 1))
                                            / F.lit(100 * b)))
        stats = ranked.groupBy(*by).agg(
            F.min(F.when(F.col("r") >= rank, F.col("n"))).alias("value"),
            F.max(F.struct("n", (-F.col("sec")).alias("t"))).alias("top"))
        parts.append(stats.groupBy("vhost", "k").agg(
            F.max(F.struct("value", "top")).alias("b")).select(
            F.lit(scope).alias("scope"), "vhost", F.col("k").alias("key"),
            F.col("b.value").cast("long").alias("value"),
            F.col("b.top.n").cast("long").alias("peak"),
            F.timestamp_micros(-F.col("b.top.t")).alias("peak_ts")))
    out = parts[0].unionByName(parts[1]).unionByName(parts[2]).persist()
    out.count()  # one row per key, read by every setting's query
    return out


# --------------------------------------------------------------------------------------------
# Settings


#: (scope, count setting, rate setting, vhost-level column, group override column) for users
#: and hosts; the vhost's own settings are maxConnections and maxConnectionRate.
_PER_KEY = (
    ("user", "maxConnectionsPerUser", "maxConnectionRatePerUser"),
    ("remote_host", "maxConnectionsPerHost", "maxConnectionRatePerHost"),
)


def recommend(values: DataFrame, pairs: DataFrame, lt: LimitTables | None, rule: Rule,
              rates: DataFrame | None = None) -> DataFrame:
    """Recommend every connection setting from the keys' values, with the evidence.

    Settings and the keys they govern (as ``headroom.recommendations``): the vhost's
    ``maxConnections`` its own value; the vhost's ``maxConnectionsPerUser`` /
    ``maxConnectionsPerHost`` (``group`` empty) the users (hosts) whose group does not
    override it; a policy group's override the users of the group (the hosts its users
    connected from). Rates alike (``maxConnectionRate``, ``maxConnectionRatePerUser``,
    ``maxConnectionRatePerHost``; a group's rate override is not read from the policy: the
    rates of a group are recommended at vhost level).

    Args:
        values: output of :func:`key_percentiles`.
        pairs: output of :func:`events.key_groups`.
        lt: the ``--policy`` limit tables, or None (no current value; every key governed by
            the vhost value).
        rule: the rule (for the ``rule`` column and the rounding).
        rates: output of :func:`open_rates`, or None for no rate rows.

    Returns:
        ``vhost``, ``group`` (``""`` for vhost settings), ``setting``, ``current`` (null
        when unknown; always null for rates), ``recommended``, ``change`` (``lower``,
        ``raise``, ``keep``, null without a current value), then the evidence: ``rule``,
        ``basis_scope`` and ``basis`` (the key that decided), ``percentile`` (its value),
        ``peak``, ``peak_ts``.
    """
    if lt is not None:
        r = resolve_limits(pairs, lt)
        vlim = lt.vhosts.select(F.col("name").alias("r_vhost"), "lv_vhost",
                                "max_connections", "vhost_per_user", "vhost_per_host")
        vlim = vlim.where(F.col("r_vhost") == F.col("lv_vhost")).drop("lv_vhost")
    else:
        r = pairs.select("*", F.lit(None).cast("string").alias("policy_group"),
                         F.lit(None).cast("long").alias("per_user_override"),
                         F.lit(None).cast("long").alias("per_host_override"))
        vlim = pairs.select(F.col("vhost").alias("r_vhost")).distinct().select(
            "r_vhost", *[F.lit(None).cast("long").alias(c) for c in (
                "max_connections", "vhost_per_user", "vhost_per_host")])

    def best(df: DataFrame, by: list[str]) -> DataFrame:
        # the governed key with the highest value (then the highest peak, then name)
        return df.groupBy(*by).agg(F.max(F.struct(
            "value", "peak", (-F.unix_micros("peak_ts")).alias("t"), "scope", "key"))
            .alias("b"))

    def row(df: DataFrame, vhost: Column, group: Column, setting: str, current: Column,
            cap: int, unit: str) -> DataFrame:
        return df.select(
            vhost.alias("vhost"), group.alias("group"), F.lit(setting).alias("setting"),
            current.cast("long").alias("current"),
            _apply(rule, F.col("b.value"), cap).alias("recommended"),
            F.lit(rule.text(unit)).alias("rule"), F.col("b.scope").alias("basis_scope"),
            F.col("b.key").alias("basis"), F.col("b.value").cast("long").alias("percentile"),
            F.col("b.peak").cast("long").alias("peak"),
            F.timestamp_micros(-F.col("b.t")).alias("peak_ts"))

    out: list[DataFrame] = []
    for src, is_rate in ((values, False), (rates, True)):
        if src is None:
            continue
        cap = MAX_RATE if is_rate else MAX_LIMIT
        unit = "admitted opens per second (seconds with an open)" if is_rate \
            else "per-bucket peak"
        v = best(src.where(F.col("scope") == "vhost"), ["vhost"])
        v = v.join(vlim, v["vhost"] == vlim["r_vhost"], "inner" if lt is not None else "left")
        out.append(row(v, F.col("vhost"), F.lit(""),
                       "maxConnectionRate" if is_rate else "maxConnections",
                       F.lit(None) if is_rate else F.col("max_connections"), cap, unit))
        for scope, setting, rate_setting in _PER_KEY:
            override = "per_user_override" if scope == "user" else "per_host_override"
            vcol = "vhost_per_user" if scope == "user" else "vhost_per_host"
            gr = r.select(F.col("vhost").alias("g_vhost"), F.col(scope).alias("g_key"),
                          "policy_group", override).distinct()
            kp = src.where(F.col("scope") == scope)
            kp = kp.join(gr, (kp["vhost"] == gr["g_vhost"]) & (kp["key"] == gr["g_key"]))
            if is_rate:
                vrow = best(kp, ["vhost"])
                out.append(row(vrow, F.col("vhost"), F.lit(""), rate_setting, F.lit(None),
                               cap, unit))
                continue
            vrow = best(kp.where(F.col(override).isNull()), ["vhost"])
            vrow = vrow.join(vlim, vrow["vhost"] == vlim["r_vhost"], "left")
            out.append(row(vrow, F.col("vhost"), F.lit(""), setting, F.col(vcol), cap, unit))
            g = kp.where(F.col(override).isNotNull())
            grow = best(g, ["vhost", "policy_group"]).join(
                g.groupBy(F.col("vhost").alias("c_vhost"),
                          F.col("policy_group").alias("c_group"))
                .agg(F.max(override).alias("cur")),
                (F.col("vhost") == F.col("c_vhost")) & (F.col("policy_group") == F.col("c_group")))
            out.append(row(grow, F.col("vhost"), F.col("policy_group"), setting, F.col("cur"),
                           cap, unit))
    res = out[0]
    for o in out[1:]:
        res = res.unionByName(o)
    current, recommended = F.col("current"), F.col("recommended")
    change = (F.when(current.isNull(), F.lit(None).cast("string"))
              .when(recommended < current, F.lit("lower"))
              .when(recommended > current, F.lit("raise"))
              .otherwise(F.lit("keep")))
    return res.select("vhost", "group", "setting", "current", "recommended",
                      change.alias("change"), "rule", "basis_scope", "basis", "percentile",
                      "peak", "peak_ts")
