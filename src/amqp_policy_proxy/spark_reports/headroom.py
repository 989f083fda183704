"""The ``headroom`` table and ``recommendations.csv``: peaks against limits. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`.common` and :mod:`.limits` (a policy's connection limits, loaded with the daemon's own
policy loader); the peaks come from ``concurrency.limit_peaks`` and the (vhost, user, group,
remote_host) pairs from ``events.key_groups``, both as DataFrames. ``whatif`` reuses
:class:`LimitTables`, :func:`resolve_limits` and :func:`headroom`.

All figures are numbers of connections. Limits are enforced by each proxy process on its own
connections, so a limit is compared with the highest concurrency within one proxy
(``proxy_peak`` of the concurrency table), not with the fleet-wide peak. A user's limit is
that of its group, looked up as QDR does (:func:`resolve_limits`); a host's is the smallest
per-host limit among the groups of the users seen connecting from it. Recommended limits are
``min(65535, max(1, ceil(peak * HEADROOM_FACTOR)))``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from amqp_policy_proxy.spark_reports.common import local_table
from amqp_policy_proxy.spark_reports.limits import ConnectionLimits

#: Recommended limit = ceil(observed peak x HEADROOM_FACTOR), at least 1, at most 65535.
HEADROOM_FACTOR = 1.25
#: Upper bound of every QDR connection limit.
MAX_LIMIT = 65535


# --------------------------------------------------------------------------------------------
# A policy's limits as small tables


@dataclass(frozen=True)
class LimitTables:
    """A policy's connection limits as small DataFrames (see ``ConnectionLimits.*_rows``)."""

    vhosts: DataFrame
    """``name`` (hostname or alias), ``lv_vhost``, ``max_connections``, ``vhost_per_user``,
    ``vhost_per_host``, ``star_group``, ``unknown_group``."""
    groups: DataFrame
    """``lg_vhost``, ``lg_group``, ``per_user``, ``per_host``, ``per_user_override``,
    ``per_host_override``."""
    members: DataFrame
    """``lm_vhost``, ``lm_user``, ``lm_group``."""


def limit_tables(spark: SparkSession, limits: ConnectionLimits) -> LimitTables:
    """Turn connection limits into the lookup DataFrames of :func:`resolve_limits`.

    Args:
        spark: the session.
        limits: from :func:`limits.load_limits`.

    Returns:
        The three tables (possibly empty).
    """
    s, i = T.StringType(), T.LongType()

    def schema(*cols: tuple[str, T.DataType]) -> T.StructType:
        return T.StructType([T.StructField(n, t, True) for n, t in cols])

    return LimitTables(
        vhosts=local_table(spark, limits.vhost_rows(), schema(
            ("name", s), ("lv_vhost", s), ("max_connections", i), ("vhost_per_user", i),
            ("vhost_per_host", i), ("star_group", s), ("unknown_group", s))),
        groups=local_table(spark, limits.group_rows(), schema(
            ("lg_vhost", s), ("lg_group", s), ("per_user", i), ("per_host", i),
            ("per_user_override", i), ("per_host_override", i))),
        members=local_table(spark, limits.member_rows(), schema(
            ("lm_vhost", s), ("lm_user", s), ("lm_group", s))),
    )


def resolve_limits(df: DataFrame, lt: LimitTables) -> DataFrame:
    """Attach the connection limits that apply to each (vhost, user, group) row.

    The user's group is looked up in the policy as QDR does (explicit member, else the ``*``
    group, else ``$default`` when unknown users are allowed); if the policy has none, the
    group recorded in the event log is used when the policy defines it; otherwise the vhost
    values apply. Rows whose vhost (or alias) is not in the policy are dropped.

    Args:
        df: any DataFrame with string columns ``vhost``, ``user`` and ``group``.
        lt: from :func:`limit_tables`.

    Returns:
        ``df``'s columns plus ``policy_vhost``, ``policy_group`` (may be null),
        ``max_connections``, ``per_user``, ``per_host`` and ``per_user_override``,
        ``per_host_override`` (null when the group does not override).
    """
    d = df.join(F.broadcast(lt.vhosts), df["vhost"] == lt.vhosts["name"], "inner")
    d = d.join(F.broadcast(lt.members),
               (d["lv_vhost"] == lt.members["lm_vhost"]) & (d["user"] == lt.members["lm_user"]),
               "left")
    known = lt.groups.select(F.col("lg_vhost").alias("k_vhost"), F.col("lg_group").alias("k_g"))
    d = d.join(F.broadcast(known),
               (d["lv_vhost"] == known["k_vhost"]) & (d["group"] == known["k_g"]), "left")
    d = d.withColumn("policy_group", F.coalesce("lm_group", "star_group", "unknown_group", "k_g"))
    d = d.join(F.broadcast(lt.groups),
               (d["lv_vhost"] == lt.groups["lg_vhost"])
               & (d["policy_group"] == lt.groups["lg_group"]), "left")
    return d.select(
        *df.columns,
        F.col("lv_vhost").alias("policy_vhost"), "policy_group", "max_connections",
        F.coalesce("per_user", "vhost_per_user").alias("per_user"),
        F.coalesce("per_host", "vhost_per_host").alias("per_host"),
        "per_user_override", "per_host_override",
    )


# --------------------------------------------------------------------------------------------
# Headroom and recommendations


def headroom(peaks: DataFrame, pairs: DataFrame, lt: LimitTables) -> DataFrame:
    """Compute the ``headroom`` table: observed peaks against the configured limits.

    Args:
        peaks: output of :func:`concurrency.limit_peaks` (per-proxy peaks; limits are per proxy).
        pairs: output of :func:`events.key_groups`.
        lt: the policy's limit tables.

    Returns:
        ``scope`` (vhost|user|remote_host), ``vhost``, ``key``, ``limit``, ``peak``,
        ``utilisation`` (peak / limit; null when the limit is 0; above 1 only if the limit
        was lowered during the window). A user's limit is that of its group (see
        :func:`resolve_limits`); a host's limit is the smallest per-host limit among the
        groups of the users seen connecting from it (the first that would deny). Keys of
        vhosts not in the policy have no row. The group scope has no limit and no rows.
    """
    r = resolve_limits(pairs, lt)
    vh = r.groupBy("vhost").agg(F.min("max_connections").alias("limit"))
    us = r.groupBy("vhost", "user").agg(F.min("per_user").alias("limit"))
    ho = r.groupBy("vhost", "remote_host").agg(F.min("per_host").alias("limit"))
    lim = (
        vh.select(F.lit("vhost").alias("scope"), "vhost", F.col("vhost").alias("key"), "limit")
        .unionByName(us.select(F.lit("user").alias("scope"), "vhost",
                               F.col("user").alias("key"), "limit"))
        .unionByName(ho.select(F.lit("remote_host").alias("scope"), "vhost",
                               F.col("remote_host").alias("key"), "limit"))
    )
    j = peaks.join(lim, ["scope", "vhost", "key"], "inner")
    util = F.when(F.col("limit") > 0, F.col("peak") / F.col("limit"))
    return j.select("scope", "vhost", "key", F.col("limit").cast("long").alias("limit"),
                    F.col("peak").cast("long").alias("peak"), util.alias("utilisation"))


def _recommend(peak: Column, factor: float) -> Column:
    return F.least(F.greatest(F.ceil(peak * F.lit(factor)), F.lit(1)),
                   F.lit(MAX_LIMIT)).cast("long")


def recommendations(peaks: DataFrame, pairs: DataFrame, lt: LimitTables | None,
                    factor: float = HEADROOM_FACTOR) -> DataFrame:
    """Compute ``recommendations.csv``: limits sized from observed peaks.

    ``recommended = min(65535, max(1, ceil(peak * factor)))`` where ``peak`` is the largest
    per-proxy peak of the keys a setting governs:

    - vhost ``maxConnections`` (``group`` empty): the vhost's peak;
    - vhost ``maxConnectionsPerUser`` / ``maxConnectionsPerHost`` (``group`` empty): the
      largest peak among users (hosts) that the vhost value governs, i.e. whose group does not
      override it;
    - group ``maxConnectionsPerUser`` / ``maxConnectionsPerHost``: only for groups of the
      policy that override the setting; the largest peak among the group's users (among
      hosts its users connected from).

    Args:
        peaks: output of :func:`concurrency.limit_peaks`.
        pairs: output of :func:`events.key_groups`.
        lt: the policy's limit tables, or ``None`` without ``--policy`` (then ``current`` is
            null and every user and host is governed by the vhost value).
        factor: the headroom factor (> 0).

    Returns:
        ``vhost``, ``group`` (``""`` for vhost settings), ``setting``, ``current`` (null when
        unknown), ``recommended``, ``change``: ``lower`` when applying the recommendation
        would lower the configured limit (less headroom than today: check before applying),
        ``raise``, ``keep``, or null when there is no current value.
    """
    if lt is not None:
        r = resolve_limits(pairs, lt)
        vlim = lt.vhosts.select(F.col("name").alias("r_vhost"), "max_connections",
                                "vhost_per_user", "vhost_per_host")
    else:
        r = pairs.select(
            "*", F.lit(None).cast("string").alias("policy_group"),
            *[F.lit(None).cast("long").alias(c) for c in (
                "max_connections", "per_user", "per_host", "per_user_override",
                "per_host_override")])
        vlim = pairs.select(F.col("vhost").alias("r_vhost")).distinct().select(
            "r_vhost", *[F.lit(None).cast("long").alias(c) for c in (
                "max_connections", "vhost_per_user", "vhost_per_host")])

    def scope_peaks(scope: str) -> DataFrame:
        return peaks.where(F.col("scope") == scope).select(
            F.col("vhost").alias("p_vhost"), F.col("key").alias("p_key"), "peak")

    def rec(peak: str) -> Column:
        return _recommend(F.col(peak), factor).alias("recommended")

    vp = scope_peaks("vhost")
    out = [vp.join(vlim, vp["p_key"] == vlim["r_vhost"], "inner").select(
        F.col("r_vhost").alias("vhost"), F.lit("").alias("group"),
        F.lit("maxConnections").alias("setting"), F.col("max_connections").alias("current"),
        rec("peak"))]
    for scope, setting, col, override in (
        ("user", "maxConnectionsPerUser", "vhost_per_user", "per_user_override"),
        ("remote_host", "maxConnectionsPerHost", "vhost_per_host", "per_host_override"),
    ):
        kp = scope_peaks(scope)
        gr = r.select(F.col("vhost").alias("g_vhost"), F.col(scope).alias("g_key"),
                      "policy_group", override).distinct()
        kp = kp.join(gr, (kp["p_vhost"] == gr["g_vhost"]) & (kp["p_key"] == gr["g_key"]))
        # vhost level: keys governed by the vhost value.
        vrow = (kp.where(F.col(override).isNull()).groupBy("p_vhost")
                .agg(F.max("peak").alias("peak")))
        vrow = vrow.join(vlim, vrow["p_vhost"] == vlim["r_vhost"], "left").select(
            F.col("p_vhost").alias("vhost"), F.lit("").alias("group"),
            F.lit(setting).alias("setting"), F.col(col).alias("current"), rec("peak"))
        grow = (kp.where(F.col(override).isNotNull())
                .groupBy("p_vhost", "policy_group")
                .agg(F.max("peak").alias("peak"), F.max(override).alias("current"))
                .select(F.col("p_vhost").alias("vhost"), F.col("policy_group").alias("group"),
                        F.lit(setting).alias("setting"), "current", rec("peak")))
        out += [vrow, grow]
    res = out[0]
    for o in out[1:]:
        res = res.unionByName(o)
    current, recommended = F.col("current"), F.col("recommended")
    change = (F.when(current.isNull(), F.lit(None).cast("string"))
              .when(recommended < current, F.lit("lower"))
              .when(recommended > current, F.lit("raise"))
              .otherwise(F.lit("keep")))
    return res.select("vhost", "group", "setting", current.cast("long").alias("current"),
                      recommended.cast("long").alias("recommended"), change.alias("change"))


