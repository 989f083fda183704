"""The ``concurrency`` and ``timeline`` tables: connections held at once, per key. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`.common` and :mod:`.events` (the per-connection work table, :class:`events.Sweep`);
``headroom`` and ``whatif`` read this module's :func:`limit_peaks`.

The sweep applies the +1/-1 changes of :func:`events.connection_changes` per scope key
(vhost, group, user, remote_host) with Spark window functions; docs/spark-reports.md explains
the semantics for readers. In short, all figures are numbers of connections:

- Changes of a key are applied in ``(ts, -1 before +1)`` order: a close and an open at the
  same instant do not overlap. Only values after the last change of an instant are real;
  values between changes at one instant are never counted.
- Grid buckets are aligned to the epoch (``floor(ts / grid)``); the window's first and last
  buckets may be partial and count as whole buckets. A bucket's sample is the **maximum**
  concurrency held at any instant of it. p50/p95/p99 are nearest-rank percentiles over
  **every** bucket of the window, zero buckets included, for every key with at least one
  connection in the window (rank ``ceil(p * N / 100)`` of the ``N`` sorted samples).
- ``peak`` is the highest sample, ``peak_ts`` the earliest instant it was reached.
- Limits are enforced per limit domain (:mod:`.fleet`): a proxy process alone, or the
  proxies of a fleet sharing a ledger together, so headroom, recommendations and the
  what-if use the highest concurrency within one domain (``proxy_peak``), while the
  concurrency table is fleet-wide.

The only driver-side work is the one-row query of :func:`events.proxy_columns`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from amqp_policy_proxy.spark_reports.common import (
    LIMIT_SCOPES,
    SCOPES,
    US_PER_MS,
    WINDOW_MS_BITS,
    ReportWindow,
    bucket_index,
    micros_to_timestamp,
)
from amqp_policy_proxy.spark_reports.events import (
    PROXY_BITS,
    Sweep,
    proxy_columns,
    scope_keys,
)

#: Scopes with few keys and many changes: their per-bucket timeline is materialised.
DENSE_SCOPES: tuple[str, ...] = ("vhost", "group")
SPARSE_SCOPES: tuple[str, ...] = ("user", "remote_host")
#: Percentiles reported (nearest rank).
PERCENTILES: tuple[int, ...] = (50, 95, 99)
#: peak_ts is packed with the level into one long: level << 37 | reversed ms offset.
_CODE_SHIFT = WINDOW_MS_BITS
_CODE_MASK = (1 << _CODE_SHIFT) - 1


def nearest_rank(p: int, n: int) -> int:
    """Return the 1-based nearest rank of the p-th percentile among ``n`` sorted values.

    Args:
        p: percentile, 1..100.
        n: number of values, >= 1.

    Returns:
        ``ceil(p * n / 100)``, computed in integers.
    """
    return max(1, (p * n + 99) // 100)


# --------------------------------------------------------------------------------------------
# Sweep points: the work table's changes keyed by scope key id


def sweep_points(keyed: DataFrame, keys: DataFrame, window: ReportWindow,
                 scopes: Iterable[str], by_bucket: bool = False) -> DataFrame:
    """Key the sweep changes by scope key id.

    Args:
        keyed: output of :func:`events.keyed_changes`.
        keys: output of :func:`events.connection_keys`.
        window: the report window (for the bucket index).
        scopes: which of :data:`SCOPES` to produce (with the per-proxy ids of the limited
            ones).
        by_bucket: distribute by (``id``, ``bucket``) rather than ``id``, for the dense plan
            of :func:`bucket_samples`: a vhost with half the changes is then spread over all
            tasks instead of one.

    Returns:
        ``id``, ``pix`` (the change's proxy among the key's proxies, for keys summed per
        proxy in the window), ``bucket``, ``t_us``, ``d``: one row per change and key id
        (fleet-wide, plus a per-proxy id for keys seen on more than :data:`events.PROXY_COLUMNS`
        proxies). Null keys (e.g. no user) are dropped.
    """
    scopes = tuple(scopes)
    none = F.lit(None).cast("int")

    def item(id_col: str, pix: Column) -> Column:
        return F.struct(F.col(id_col).alias("id"), pix.alias("pix"))

    items = [item(f"{s}_id", F.col(f"{s}_pix") if s in LIMIT_SCOPES else none)
             for s in scopes]
    items += [item(f"{s}_pid", none) for s in scopes if s in LIMIT_SCOPES]
    # Null ids are dropped from the (small) key table's arrays, not from the exploded rows.
    ids = keys.select("combo", F.filter(F.array(*items), lambda k: k["id"].isNotNull())
                      .alias("ids"))
    pts = (
        keyed.join(F.broadcast(ids), "combo")
        .select(F.explode("ids").alias("k"), "t_us", "d")
        .select(F.col("k.id").alias("id"), F.col("k.pix").alias("pix"),
                bucket_index(F.col("t_us"), window.grid_us).alias("bucket"), "t_us", "d")
    )
    pts = pts.repartition("id", "bucket") if by_bucket else pts.repartition("id")
    # Pre-sort each partition by one long that orders rows like the sweep's window does (id,
    # then instant, then -1 before +1): Spark radix-sorts a single long key in linear time,
    # and the window's own sort (id, bucket, t_us, d) then finds its input already in order
    # (Spark's TimSort: one run, n comparisons) instead of comparing four columns
    # n log n times. Halves the cost of the user/host sweep. Only a hint: an id too large
    # for the packing (per-proxy ids) just leaves more for the window's sort to do.
    t_ms = ((F.col("t_us") - F.lit(window.start_us)) / F.lit(US_PER_MS)).cast("long")
    hint = (F.shiftleft(F.col("id"), 38) + F.shiftleft(t_ms, 1)
            + F.when(F.col("d") > 0, F.lit(1)).otherwise(F.lit(0)))
    return pts.sortWithinPartitions(hint)


# --------------------------------------------------------------------------------------------
# The sweep


def _peak_code(level: Column, t_us: Column, window: ReportWindow) -> Column:
    # Larger level wins; at equal level the earlier instant wins (reversed offset). Linear in
    # the level: code(a + b, t) == (a << SHIFT) + code(b, t), also for negative b.
    offset_ms = ((t_us - F.lit(window.start_us)) / F.lit(US_PER_MS)).cast("long")
    return F.shiftleft(level.cast("long"), _CODE_SHIFT) + (F.lit(_CODE_MASK) - offset_ms)


def _decode_peak(code: Column, window: ReportWindow) -> tuple[Column, Column]:
    peak = F.shiftright(code, _CODE_SHIFT)
    offset_ms = F.lit(_CODE_MASK) - code.bitwiseAND(F.lit(_CODE_MASK))
    return peak, micros_to_timestamp(F.lit(window.start_us) + offset_ms * US_PER_MS)


_RUNNING = (Window.unboundedPreceding, Window.currentRow)


def _greatest(cols: list[Column]) -> Column:
    return cols[0] if len(cols) == 1 else F.greatest(*cols)


def bucket_samples(points: DataFrame, window: ReportWindow, dense: bool = False,
                   nprox: int = 0) -> DataFrame:
    """Run the sweep and summarise it per key and grid bucket that has a change.

    The changes of a key are applied in ``(t_us, d)`` order, so at equal instants the -1s
    come before the +1s. Only two kinds of running value are real concurrency: the value
    after the *last* change of an instant (held until the next instant), and the value before
    the *first* change of an instant (held since the previous one). The values between changes
    at one instant are transient and never counted. A bucket's sample is the maximum of the
    real values held at some instant of the bucket: the value before a bucket's first instant
    counts only when that instant is after the bucket start (otherwise it was held in the
    previous bucket only).

    Two plans give the same rows. ``dense=False`` runs one window per key over all its
    changes: right for keys with few changes (users, hosts). ``dense=True`` first sums within
    each bucket (window per key and bucket), then carries the level across buckets (window
    per key over one row per bucket): no window ever holds more than one bucket of one key,
    which keeps memory bounded for keys with millions of changes (vhosts, groups).

    Per-proxy levels (``nprox > 0``): the same window also keeps one running sum per proxy of
    the key (``pix`` 0..nprox-1), so the highest level within any single proxy comes out of
    the same sort; ``pmax`` is the highest of them after an instant of the bucket.

    Args:
        points: output of :func:`sweep_points`.
        window: the report window.
        dense: use the two-level plan.
        nprox: number of per-proxy running sums (:func:`events.proxy_columns`); 0 for none.

    Returns:
        One row per key id and bucket containing at least one change: ``id``, ``bucket``,
        ``v`` (the bucket's sample: the maximum concurrency at any instant of it, including
        the value carried in from the previous bucket), ``gv``/``gw`` (the value held through
        the ``gw`` change-free buckets that follow, up to the next change or the window
        end), ``lw`` (in a key's first bucket: the number of zero buckets before it),
        ``code`` (the highest value after an instant and its instant, packed, see
        :func:`_peak_code`) and ``low`` (the lowest value after an instant: negative only when
        closes are missing their opens), ``pmax`` (null without per-proxy sums). Every key's
        buckets add up to ``window.buckets``.
    """
    last = F.lit(window.last_bucket + 1)
    pcols = range(nprox)

    def on_proxy(j: int) -> Column:
        return F.when(F.col("pix") == j, F.col("d")).otherwise(F.lit(0))

    g = window.grid_us
    after_start = F.col("t_us") > F.col("bucket") * F.lit(g)
    if dense:
        w1 = Window.partitionBy("id", "bucket").orderBy("t_us", "d")
        rows = points.select(
            "id", "bucket", "t_us", "d", "pix",
            F.sum("d").over(w1.rowsBetween(*_RUNNING)).alias("p"),
            F.lead("t_us").over(w1).alias("next_us"), F.lag("t_us").over(w1).alias("prev_us"),
            *[F.sum(on_proxy(j)).over(w1.rowsBetween(*_RUNNING)).alias(f"p{j}")
              for j in pcols])
        final = F.col("next_us").isNull() | (F.col("next_us") != F.col("t_us"))
        first = F.col("prev_us").isNull() | (F.col("prev_us") != F.col("t_us"))
        per_bucket = rows.groupBy("id", "bucket").agg(
            F.sum("d").alias("net"),
            F.max(F.when(final, F.col("p"))).alias("maxp"),
            F.max(F.when(first & after_start, F.col("p") - F.col("d"))).alias("maxb"),
            F.min(F.when(final, F.col("p"))).alias("minp"),
            F.max(F.when(final, _peak_code(F.col("p"), F.col("t_us"), window)))
            .alias("code_rel"),
            *[F.sum(on_proxy(j)).alias(f"pnet{j}") for j in pcols],
            *[F.max(F.when(final, F.col(f"p{j}"))).alias(f"pmr{j}") for j in pcols],
        )
        w2 = Window.partitionBy("id").orderBy("bucket")
        before = w2.rowsBetween(Window.unboundedPreceding, -1)
        pcarry = [(F.coalesce(F.sum(f"pnet{j}").over(before), F.lit(0)) + F.col(f"pmr{j}"))
                  .alias(f"pv{j}") for j in pcols]
        carry = F.coalesce(F.sum("net").over(w2.rowsBetween(Window.unboundedPreceding, -1)),
                           F.lit(0))
        lv = per_bucket.select(
            "*", carry.alias("carry"), F.lead("bucket").over(w2).alias("next_b"),
            F.lag("bucket").over(w2).alias("prev_b"), *pcarry)
        pmax = _greatest([F.col(f"pv{j}") for j in pcols]) if nprox else F.lit(None)
        gap = F.coalesce(F.col("next_b"), last) - F.col("bucket") - 1
        return lv.select(
            "id", "bucket",
            (F.col("carry") + F.greatest(F.col("maxp"), F.col("maxb"))).alias("v"),
            F.when(gap > 0, F.col("carry") + F.col("net")).alias("gv"),
            gap.alias("gw"),
            F.when(F.col("prev_b").isNull(), F.col("bucket") - F.lit(window.first_bucket))
            .otherwise(F.lit(0)).alias("lw"),
            (F.shiftleft(F.col("carry"), _CODE_SHIFT) + F.col("code_rel")).alias("code"),
            (F.col("carry") + F.col("minp")).alias("low"),
            pmax.cast("long").alias("pmax"),
        )
    w = Window.partitionBy("id").orderBy("bucket", "t_us", "d")
    lv = points.select(
        "id", "bucket", "t_us", "d",
        F.sum("d").over(w.rowsBetween(*_RUNNING)).alias("level"),
        F.lead("t_us").over(w).alias("next_us"),
        F.lag("t_us").over(w).alias("prev_us"),
        *[F.sum(on_proxy(j)).over(w.rowsBetween(*_RUNNING)).alias(f"p{j}") for j in pcols],
    )
    final = F.col("next_us").isNull() | (F.col("next_us") != F.col("t_us"))
    first = F.col("prev_us").isNull() | (F.col("prev_us") != F.col("t_us"))
    next_b = F.coalesce(bucket_index(F.col("next_us"), g), last)
    gap = next_b - F.col("bucket") - 1
    real = F.when(final, F.col("level"))
    return (
        lv.select(
            "id", "bucket",
            F.greatest(real, F.when(first & after_start, F.col("level") - F.col("d")))
            .alias("v"),
            F.when(gap > 0, F.col("level")).alias("gv"),
            gap.alias("gw"),
            F.when(F.col("prev_us").isNull(), F.col("bucket") - F.lit(window.first_bucket))
            .otherwise(F.lit(0)).alias("lw"),
            F.when(final, _peak_code(F.col("level"), F.col("t_us"), window)).alias("code"),
            real.alias("low"),
            (F.when(final, _greatest([F.col(f"p{j}") for j in pcols])) if nprox
             else F.lit(None)).cast("long").alias("pmax"),
        )
        .groupBy("id", "bucket")
        .agg(F.max("v").alias("v"), F.max("gv").alias("gv"), F.max("gw").alias("gw"),
             F.max("lw").alias("lw"), F.max("code").alias("code"),
             F.min("low").alias("low"), F.max("pmax").alias("pmax"))
    )


def concurrency_stats(samples: DataFrame, window: ReportWindow) -> DataFrame:
    """Reduce bucket samples to peak, p50/p95/p99 and peak_ts per key id.

    Args:
        samples: output of :func:`bucket_samples`.
        window: the report window (``window.buckets`` is the percentile population).

    Returns:
        ``id``, ``peak``, ``p50``, ``p95``, ``p99`` (longs), ``peak_ts`` (the earliest
        instant the peak was reached), ``low`` (negative: the log has closes without opens
        for this key), ``pmax`` (the highest per-proxy level, when summed per proxy).
    """
    hist = (
        samples.select("id", "code", "low", "pmax", F.explode(F.array(
            F.struct(F.col("v").alias("value"), F.lit(1).cast("long").alias("w")),
            F.struct(F.col("gv").alias("value"), F.col("gw").cast("long").alias("w")),
            F.struct(F.lit(0).cast("long").alias("value"), F.col("lw").cast("long").alias("w")),
        )).alias("s"))
        .where(F.col("s.w") > 0)
        .groupBy("id", F.col("s.value").alias("value"))
        .agg(F.sum("s.w").alias("w"), F.max("code").alias("code"), F.min("low").alias("low"),
             F.max("pmax").alias("pmax"))
    )
    cum = F.sum("w").over(Window.partitionBy("id").orderBy("value").rowsBetween(*_RUNNING))
    n = window.buckets
    ranked = hist.select("id", "value", "code", "low", "pmax", cum.alias("cum"))
    aggs = [F.min(F.when(F.col("cum") >= nearest_rank(p, n), F.col("value"))).alias(f"p{p}")
            for p in PERCENTILES]
    out = ranked.groupBy("id").agg(F.max("value").alias("peak"), F.max("code").alias("code"),
                                   F.min("low").alias("low"), F.max("pmax").alias("pmax"),
                                   *aggs)
    code_peak, code_ts = _decode_peak(F.col("code"), window)
    # The peak is the highest sample. It is reached after a change (code) unless the key never
    # rises above the 0 it starts the window with (only possible with closes without opens).
    peak_ts = F.when(code_peak == F.col("peak"), code_ts).otherwise(
        micros_to_timestamp(F.lit(window.start_us)))
    return out.select("id", "peak", *[f"p{p}" for p in PERCENTILES],
                      peak_ts.alias("peak_ts"), "low", "pmax")


def timeline(samples: DataFrame, window: ReportWindow) -> DataFrame:
    """Expand bucket samples into one value per fleet-wide key id and bucket of the window.

    Meant for the dense scopes (vhost, group): ``keys x window.buckets`` rows.

    Args:
        samples: output of :func:`bucket_samples`.
        window: the report window.

    Returns:
        ``id``, ``window_start`` (timestamp of the bucket start), ``concurrent`` (the
        bucket's sample, the maximum concurrency within it).
    """
    runs = F.array(
        F.struct(F.col("bucket").alias("b0"), F.lit(1).cast("long").alias("n"),
                 F.col("v").alias("value")),
        F.struct((F.col("bucket") + 1).alias("b0"), F.col("gw").cast("long").alias("n"),
                 F.col("gv").alias("value")),
        F.struct(F.lit(window.first_bucket).cast("long").alias("b0"),
                 F.col("lw").cast("long").alias("n"), F.lit(0).cast("long").alias("value")),
    )
    r = samples.where(F.col("id") >= 0).select("id", F.explode(runs).alias("r")) \
        .where(F.col("r.n") > 0)
    return r.select(
        "id",
        F.explode(F.sequence(F.col("r.b0"), F.col("r.b0") + F.col("r.n") - 1)).alias("bucket"),
        F.col("r.value").alias("concurrent"),
    ).select("id", micros_to_timestamp(F.col("bucket") * window.grid_us).alias("window_start"),
             "concurrent")


# --------------------------------------------------------------------------------------------
# The concurrency table


def name_keys(stats: DataFrame, keys: DataFrame, scopes: Iterable[str] = SCOPES) -> DataFrame:
    """Name the keys of per-id statistics and attach each key's per-proxy peak.

    Args:
        stats: output of :func:`concurrency_stats` (fleet-wide and per-proxy ids).
        keys: output of :func:`events.connection_keys`.
        scopes: the scopes ``stats`` may contain.

    Returns:
        ``scope``, ``vhost``, ``key``, ``peak``, ``p50``, ``p95``, ``p99``, ``peak_ts``,
        ``proxy_peak`` (highest concurrency within one limit domain: a proxy process, or a
        fleet, see :func:`events.connection_keys`; null for groups, which have no limit),
        ``low``.
    """
    names = scope_keys(keys, scopes)
    # One aggregation (not a union of two filtered branches, which would compute the whole
    # sweep twice): per-proxy rows fold into their fleet-wide key id.
    fleet = F.col("id") >= 0
    base = F.when(fleet, F.col("id")).otherwise(F.shiftright(-F.col("id") - 1, PROXY_BITS))
    cols = ["peak", *[f"p{p}" for p in PERCENTILES], "peak_ts"]
    folded = stats.groupBy(base.alias("id")).agg(
        *[F.max(F.when(fleet, F.col(c))).alias(c) for c in cols],
        F.min(F.when(fleet, F.col("low"))).alias("low"),
        F.max(F.when(~fleet, F.col("peak"))).alias("pp"),
        F.max(F.when(fleet, F.col("pmax"))).alias("pmax"),
    )
    # Per-proxy ids, else per-proxy sums, else one proxy: the fleet peak is the proxy's.
    proxy_peak = F.when(F.col("scope").isin(*LIMIT_SCOPES), F.coalesce("pp", "pmax", "peak"))
    return folded.join(F.broadcast(names), "id").select(
        "scope", "vhost", "key", *cols, proxy_peak.alias("proxy_peak"), "low")


def concurrency(sweep: Sweep, scopes: Iterable[str] = SCOPES) -> DataFrame:
    """Compute the ``concurrency`` table (docs/spark-reports.md) for the given scopes.

    Args:
        sweep: from :func:`events.prepare_sweep`.
        scopes: subset of :data:`SCOPES`; vhost and group use the dense plan of
            :func:`bucket_samples`, user and remote_host the sparse one (the results are the
            same; only memory and speed differ).

    Returns:
        ``scope``, ``vhost``, ``key``, ``peak``, ``p50``, ``p95``, ``p99``, ``peak_ts`` (the
        contract columns, fleet-wide: all proxies together), then ``proxy_peak`` (the highest
        concurrency of the key within one proxy process, which is what a proxy's limits are
        checked against; null for groups) and ``low`` (below 0 when the log has closes
        without opens for the key). One row per key with at least one connection in the
        window.
    """
    scopes = tuple(scopes)
    w = sweep.window
    parts = []
    for group, dense in ((DENSE_SCOPES, True), (SPARSE_SCOPES, False)):
        sel = tuple(s for s in scopes if s in group)
        if sel:
            pts = sweep_points(sweep.keyed, sweep.keys, w, sel, by_bucket=dense)
            nprox = proxy_columns(sweep.keys, sel)
            parts.append(concurrency_stats(bucket_samples(pts, w, dense=dense, nprox=nprox), w))
    stats = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    return name_keys(stats, sweep.keys, scopes)


def limit_peaks(conc: DataFrame) -> DataFrame:
    """Return the per-proxy peaks of the limited scopes.

    Args:
        conc: output of :func:`concurrency` (with ``proxy_peak``).

    Returns:
        ``scope`` (vhost|user|remote_host), ``vhost``, ``key``, ``peak`` (= ``proxy_peak``).
    """
    return conc.where(F.col("scope").isin(*LIMIT_SCOPES)).select(
        "scope", "vhost", "key", F.col("proxy_peak").alias("peak"))


