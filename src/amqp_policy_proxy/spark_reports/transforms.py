"""Capacity report transforms: pure DataFrame -> DataFrame functions. Imports pyspark.

No I/O and no SparkSession building; the only driver-side work is a few one-row queries
(:func:`proxy_columns`, the collision check in :meth:`Sweep.persist`, the workers' pyarrow
probe in :func:`workers_have_pyarrow`). The job
(``jobs/capacity.py``) reads, calls these and writes. Everything heavy runs as Spark
aggregations and window functions; the one Python step is the what-if replay
(:func:`whatif`), which streams sorted rows through :func:`replay_admissions` per partition.

Time is carried as ``long`` microseconds since the epoch (``*_us`` columns) and turned back
into timestamps only in the output tables. The report window is half-open
``[start_us, end_us)``. docs/spark-reports.md explains the semantics for readers; in short:

- A connection counts from its ``connection_opened`` ts (inclusive) to its
  ``connection_closed`` ts (exclusive). The sweep turns records into +1/-1 changes
  (:func:`connection_changes`): +1 per open and -1 per close in the window, +1 at the window
  start for a close whose ``opened_ts`` is earlier, and +1 at the window start for a
  connection opened before the window with no close at all (:func:`open_at_start`, the only
  place records are paired, by ``(proxy, conn_id)``: conn_ids restart in every proxy
  process, and ``proxy`` is ``<host>-<pid>`` from the file name). A connection still open at
  the end simply has no -1.
- Changes of a key are applied in ``(ts, -1 before +1)`` order: a close and an open at the
  same instant do not overlap. Only values after the last change of an instant are real;
  values between changes at one instant are never counted.
- Grid buckets are aligned to the epoch (``floor(ts / grid)``); the window's first and last
  buckets may be partial and count as whole buckets. A bucket's sample is the **maximum**
  concurrency held at any instant of it. p50/p95/p99 are nearest-rank percentiles over
  **every** bucket of the window, zero buckets included, for every key with at least one
  connection in the window (rank ``ceil(p * N / 100)`` of the ``N`` sorted samples).
- ``peak`` is the highest sample, ``peak_ts`` the earliest instant it was reached.
- Limits are enforced by each proxy process on its own connections, so headroom,
  recommendations and the what-if use the highest concurrency within one proxy
  (``proxy_peak``), while the concurrency table is fleet-wide.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.limits import ConnectionLimits
from amqp_policy_proxy.spark_reports.schemas import ADMIN_JSON

logger = logging.getLogger(__name__)

US_PER_SECOND = 1_000_000
US_PER_MS = 1_000
US_PER_MINUTE = 60 * US_PER_SECOND

#: Concurrency scopes, and the interval column that is the key of each.
SCOPES: tuple[str, ...] = ("vhost", "group", "user", "remote_host")
#: Scopes with a connection limit (QDR maxConnections / PerUser / PerHost).
LIMIT_SCOPES: tuple[str, ...] = ("vhost", "user", "remote_host")
#: Scopes with few keys and many changes: their per-bucket timeline is materialised.
DENSE_SCOPES: tuple[str, ...] = ("vhost", "group")
SPARSE_SCOPES: tuple[str, ...] = ("user", "remote_host")
#: Percentiles reported (nearest rank).
PERCENTILES: tuple[int, ...] = (50, 95, 99)
#: Recommended limit = ceil(observed peak x HEADROOM_FACTOR), at least 1, at most 65535.
HEADROOM_FACTOR = 1.25
#: Upper bound of every QDR connection limit.
MAX_LIMIT = 65535
#: Upper bounds (seconds) of the connection duration histogram; the last bin is open.
DURATION_BINS: tuple[tuple[float, str], ...] = (
    (1.0, "< 1 s"), (10.0, "1-10 s"), (60.0, "10 s-1 min"), (600.0, "1-10 min"),
    (3600.0, "10 min-1 h"), (21600.0, "1-6 h"), (86400.0, "6-24 h"), (math.inf, ">= 24 h"),
)
#: peak_ts is packed with the level into one long: level << 37 | reversed ms offset.
_CODE_SHIFT = 37
_CODE_MASK = (1 << _CODE_SHIFT) - 1
#: The longest window the packing allows (2^37 ms, about 4.3 years).
MAX_WINDOW_US = _CODE_MASK * US_PER_MS

_DIMS = ("vhost", "group", "user", "remote_host")
#: The fields of an ``admin_action`` record kept (as one JSON column) by :func:`prepare_events`.
ADMIN_FIELDS = tuple(ev.EVENT_FIELDS[ev.ADMIN_ACTION])


@dataclass(frozen=True)
class ReportWindow:
    """The time window of a report and its grid."""

    start_us: int
    """Inclusive start, microseconds since the epoch (a whole millisecond)."""
    end_us: int
    """Exclusive end, microseconds since the epoch (a whole millisecond)."""
    grid_us: int
    """Grid bucket width in microseconds (buckets are aligned to the epoch)."""

    def __post_init__(self) -> None:
        if self.grid_us <= 0:
            raise ValueError("grid must be positive")
        if self.end_us <= self.start_us:
            raise ValueError("the window end must be after its start")
        if self.end_us - self.start_us > MAX_WINDOW_US:
            raise ValueError("the window is longer than 4 years")

    @property
    def first_bucket(self) -> int:
        """Index of the bucket holding ``start_us``."""
        return self.start_us // self.grid_us

    @property
    def last_bucket(self) -> int:
        """Index of the bucket holding the last instant of the window."""
        return (self.end_us - 1) // self.grid_us

    @property
    def buckets(self) -> int:
        """Number of grid buckets in the window, partial ones included."""
        return self.last_bucket - self.first_bucket + 1


def nearest_rank(p: int, n: int) -> int:
    """Return the 1-based nearest rank of the p-th percentile among ``n`` sorted values.

    Args:
        p: percentile, 1..100.
        n: number of values, >= 1.

    Returns:
        ``ceil(p * n / 100)``, computed in integers.
    """
    return max(1, (p * n + 99) // 100)


def _bucket(col: Column, grid_us: int) -> Column:
    # floor(t / grid) in exact integer arithmetic (t - pmod(t, g) is a multiple of g).
    g = F.lit(grid_us)
    return ((col - F.pmod(col, g)) / g).cast("long")


def _ts(us: Column) -> Column:
    return F.timestamp_micros(us)


# --------------------------------------------------------------------------------------------
# Events and connection changes


def prepare_events(raw: DataFrame, drop_unparsed: bool = True) -> DataFrame:
    """Select and normalise the columns the reports use from the raw event log.

    Args:
        raw: the event log read with :func:`schemas.event_log_schema` (``ts`` and
            ``opened_ts`` as strings), plus a string column ``proxy`` (``<host>-<pid>`` of the
            writing process; ``""`` when unknown).
        drop_unparsed: drop the records whose ``ts`` does not parse. ``False`` keeps them
            with a null ``t_us`` (for a caller that stores the result and filters on
            ``t_us IS NOT NULL`` when reading it back: filtering here makes Spark parse
            ``ts`` twice per record, once for the filter and once for the column), and also
            keeps the lines that are not JSON objects or have no ``event`` (all columns
            null), so that :func:`event_time_range_columns` counts both kinds as skipped.

    Returns:
        Only ``connection_opened``, ``connection_closed``, ``connection_denied`` and
        ``admin_action`` records
        with a parsable ``ts`` (see ``drop_unparsed``), with columns ``proxy``, ``event``, ``t_us`` (long),
        ``conn_id``, ``vhost``, ``group``, ``user``, ``remote_host``, ``reason``,
        ``opened_us`` (long, closes only: ``opened_ts``, else ``ts - duration_seconds``),
        ``duration_seconds``, ``bytes_in``, ``bytes_out``, ``transfers_in``,
        ``transfers_out``, and ``combo``: a 64-bit hash of (``proxy``, ``vhost``, ``group``,
        ``user``, ``remote_host``) computed in this pass, so that later joins on the key
        combination compare one long instead of five strings (:meth:`Sweep.persist` checks
        that no two combinations share a hash and falls back to comparing the strings if
        they ever do), and ``admin``: an ``admin_action`` record's own fields as one JSON
        object (null for every other record: one column that costs the connection records
        nothing but its null; :func:`admin_actions` reads it).
    """
    events = (ev.CONNECTION_OPENED, ev.CONNECTION_CLOSED, ev.CONNECTION_DENIED,
              ev.ADMIN_ACTION)
    t_us = F.unix_micros(F.expr("try_cast(ts AS TIMESTAMP)"))
    opened = F.coalesce(F.unix_micros(F.expr("try_cast(opened_ts AS TIMESTAMP)")),
                        t_us - (F.col("duration_seconds") * US_PER_SECOND).cast("long"))
    known = F.col("event").isin(*events)
    out = (
        raw.where(known if drop_unparsed else known | F.col("event").isNull())
        .select(
            F.coalesce(F.col("proxy"), F.lit("")).alias("proxy"),
            "event", t_us.alias("t_us"), "conn_id", *_DIMS, "reason",
            F.when(F.col("event") == ev.CONNECTION_CLOSED, opened).alias("opened_us"),
            "duration_seconds", "bytes_in", "bytes_out", "transfers_in", "transfers_out",
            _combo_hash().alias("combo"),
            F.when(F.col("event") == ev.ADMIN_ACTION,
                   F.to_json(F.struct(*ADMIN_FIELDS))).alias("admin"),
        )
    )
    return out.where(F.col("t_us").isNotNull()) if drop_unparsed else out


def _combo_hash() -> Column:
    # Spark's hashes skip nulls, so (a, null) and (null, a) would collide: mark nulls.
    return F.xxhash64(*[F.coalesce(F.col(c), F.lit("\u0000")) for c in ("proxy", *_DIMS)])


def event_time_range_columns() -> list[Column]:
    """Return the aggregate columns ``min_us``, ``max_us`` and ``skipped`` of prepared events.

    Also usable as observed metrics (``DataFrame.observe``) of a query that writes the
    prepared events, so that the range costs no second pass (nulls are ignored).
    ``min_us`` and ``max_us`` leave ``admin_action`` records out. ``skipped`` counts the
    records without a ``t_us``: with
    ``prepare_events(drop_unparsed=False)``, the lines that are not JSON objects or have no
    ``event`` and the connection records whose ``ts`` does not parse (a line cut short by a
    crash, a hand edit). The report leaves them out and says how many there were.
    """
    # the window is the connection records' (an admin action alone does not make one)
    t_us = F.when(F.col("event") != ev.ADMIN_ACTION, F.col("t_us"))
    return [F.min(t_us).alias("min_us"), F.max(t_us).alias("max_us"),
            F.count(F.when(F.col("t_us").isNull(), F.lit(1))).alias("skipped")]


def event_time_range(events: DataFrame) -> DataFrame:
    """Return the first and last event time of prepared events.

    Args:
        events: output of :func:`prepare_events`.

    Returns:
        One row ``(min_us, max_us, skipped)`` (microseconds; both null when there are no
        events), see :func:`event_time_range_columns`.
    """
    return events.agg(*event_time_range_columns())


def open_at_start(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Find connections opened before the window that no close in the data ends before it.

    These are the connections open at the window start *and* still open at its end (or
    closed after the data ends): the ones that close inside the window are found from their
    close's ``opened_ts`` instead. Records are paired by ``(proxy, conn_id)``; only records
    before the window and closes of connections opened before it take part, so the join is
    small.

    Args:
        events: output of :func:`prepare_events`, including the look-back before the window.
        window: the report window.

    Returns:
        The ``connection_opened`` records (``proxy``, ``conn_id``, ``vhost``, ``group``,
        ``user``, ``remote_host``, ``combo``) opened before ``window.start_us`` with no close
        before ``window.end_us``.
    """
    keys = ["proxy", "conn_id"]
    before = events.where((F.col("event") == ev.CONNECTION_OPENED)
                          & (F.col("t_us") < window.start_us))
    closes = events.where((F.col("event") == ev.CONNECTION_CLOSED)
                          & (F.col("t_us") < window.end_us)
                          & (F.col("opened_us") < window.start_us)).select(*keys)
    return before.join(closes, keys, "left_anti").select(*keys, *_DIMS, "combo")


def connection_changes(events: DataFrame, window: ReportWindow,
                       carried: bool = True) -> DataFrame:
    """Turn connection records into the +1/-1 changes of the sweep.

    - ``connection_opened`` in the window: +1 at its ``ts`` (the connection counts from its
      open, inclusive);
    - ``connection_closed`` in the window: -1 at its ``ts`` (exclusive end), and +1 at the
      window start when it was opened before it (``opened_ts``);
    - connections from :func:`open_at_start`: +1 at the window start.

    Connections open at the window end simply have no -1. A close whose open record is
    missing although it was opened inside the window (a record dropped by the writer) has no
    +1; :func:`concurrency` reports such keys as ``inconsistent``.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.
        carried: look for connections open since before the window (:func:`open_at_start`);
            pass False when the window starts at the first event (nothing precedes it).

    Returns:
        ``proxy``, ``conn_id``, ``vhost``, ``group``, ``user``, ``remote_host``, ``combo``,
        ``t_us``, ``d`` (+1 or -1), all ``t_us`` within the window.
    """
    w0 = F.lit(window.start_us)
    cols = ("proxy", "conn_id", *_DIMS, "combo")
    # One branch per event, each with constant signs: no per-record comparison of the event
    # name, and each branch reads only its own partition of an event-partitioned table.
    opens = _window_records(events, window, ev.CONNECTION_OPENED).select(
        *cols, "t_us", F.lit(1).alias("d"))
    early = F.col("opened_us") < window.start_us
    closes = _window_records(events, window, ev.CONNECTION_CLOSED).select(
        *cols,
        F.explode(F.array(
            F.struct(F.col("t_us").alias("t_us"), F.lit(-1).alias("d")),
            F.struct(F.when(early, w0).alias("t_us"), F.lit(1).alias("d")),
        )).alias("c"),
    ).select(*cols, "c.t_us", "c.d").where(F.col("t_us").isNotNull())
    changes = opens.unionByName(closes)
    if not carried:
        return changes
    return changes.unionByName(
        open_at_start(events, window).select("*", w0.alias("t_us"), F.lit(1).alias("d")))


def _window_records(events: DataFrame, window: ReportWindow, event: str) -> DataFrame:
    # The `event` records in the window; for closes, except the close at exactly the window
    # start of a connection opened before it (that connection is not in the window at all).
    records = _in_window(events, window, event)
    if event == ev.CONNECTION_CLOSED:
        records = records.where(~((F.col("opened_us") < window.start_us)
                                  & (F.col("t_us") == window.start_us)))
    return records


# --------------------------------------------------------------------------------------------
# Keys: every scope key gets a long id, so the sweep sorts longs, not strings.

#: Scope index in the low bits of a key id.
_SCOPE_INDEX = {s: i for i, s in enumerate(SCOPES)}
#: Per-proxy ids are ``-(id << _PROXY_BITS | proxy_ix) - 1``.
_PROXY_BITS = 20
#: A limited key seen on 2..PROXY_COLUMNS proxies gets its per-proxy levels as that many
#: conditional running sums in the sweep's own window (no extra rows); a key seen on more
#: proxies (a vhost of a large fleet) gets one extra key id per proxy instead.
PROXY_COLUMNS = 8


def connection_keys(events: DataFrame, window: ReportWindow, exact: bool = False,
                    carried: bool = True) -> DataFrame:
    """Number the keys of every scope, for the connections in the window.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.
        exact: group the key combinations by their five strings and number them, instead of
            grouping by the ``combo`` hash (the fallback after a hash collision, see
            :meth:`Sweep.persist`).
        carried: as for :func:`connection_changes`.

    Returns:
        One row per distinct (``proxy``, ``vhost``, ``group``, ``user``, ``remote_host``)
        of the connections in :func:`connection_changes`, with its ``combo`` (the hash, or a
        row number when ``exact``), ``clash`` (true when two combinations share the hash),
        ``proxy_ix`` (0-based), the fleet-wide key ids ``vhost_id``, ``group_id``,
        ``user_id``, ``remote_host_id`` (null when the key is null; positive, unique across
        scopes), and for each limited scope ``s``: ``s_np`` (the number of proxies the key
        was seen on), ``s_pix`` (this proxy's 0-based index among them, when
        ``2 <= s_np <= PROXY_COLUMNS``) and ``s_pid`` (a negative per-proxy key id, when
        ``s_np > PROXY_COLUMNS``). With one proxy the per-proxy peak is the fleet-wide one.
        Small: its size depends on the population, not on the number of events.
    """
    cols = ("proxy", *_DIMS)
    records = _window_records(events, window, ev.CONNECTION_OPENED).select("combo", *cols) \
        .unionByName(_window_records(events, window, ev.CONNECTION_CLOSED)
                     .select("combo", *cols))
    if carried:
        records = records.unionByName(open_at_start(events, window).select("combo", *cols))
    if exact:
        n = F.row_number().over(Window.orderBy(*[F.col(c).asc_nulls_first() for c in cols]))
        combos = records.select(*cols).distinct().select(
            n.cast("long").alias("combo"), *cols, F.lit(False).alias("clash"))
    else:
        # Group by the hash *and* the strings: only fixed-width aggregation buffers, so Spark
        # hash-aggregates (string buffers such as first() forced a sort of every record).
        # Two combinations sharing a hash come out as two rows with the same combo: clash.
        distinct = records.select("combo", *cols).distinct()
        rows_per_hash = F.count(F.lit(1)).over(Window.partitionBy("combo"))
        combos = distinct.select("combo", *cols, (rows_per_hash > 1).alias("clash"))
    ids = []
    for scope in SCOPES:
        keycols = ["vhost"] if scope == "vhost" else ["vhost", scope]
        rank = F.dense_rank().over(Window.orderBy(*[F.col(c).asc_nulls_first()
                                                    for c in keycols]))
        ok = F.col("vhost").isNotNull() & F.col(scope).isNotNull()
        ids.append(F.when(ok, rank * len(SCOPES) + _SCOPE_INDEX[scope]).cast("long")
                   .alias(f"{scope}_id"))
    proxy_ix = (F.dense_rank().over(Window.orderBy("proxy")) - 1).cast("long").alias("proxy_ix")
    k = combos.select(*cols, "combo", "clash", proxy_ix, *ids)
    local = [(F.dense_rank().over(Window.partitionBy(f"{sc}_id").orderBy("proxy_ix")) - 1)
             .alias(f"{sc}_lix") for sc in LIMIT_SCOPES]
    k = k.select("*", *local)
    more = []
    for sc in LIMIT_SCOPES:
        n = (F.max(f"{sc}_lix").over(Window.partitionBy(f"{sc}_id")) + 1).cast("int")
        more.append(F.when(F.col(f"{sc}_id").isNotNull(), n).alias(f"{sc}_np"))
    k = k.select("*", *more)
    out = []
    for sc in LIMIT_SCOPES:
        np_, ix = F.col(f"{sc}_np"), F.col(f"{sc}_lix")
        out.append(F.when((np_ >= 2) & (np_ <= PROXY_COLUMNS), ix).cast("int")
                   .alias(f"{sc}_pix"))
        pid = -(F.shiftleft(F.col(f"{sc}_id"), _PROXY_BITS) + F.col("proxy_ix")) - 1
        out.append(F.when(np_ > PROXY_COLUMNS, pid).alias(f"{sc}_pid"))
    return k.select(*[c for c in k.columns if not c.endswith("_lix")], *out)


def proxy_columns(keys: DataFrame, scopes: Iterable[str] = LIMIT_SCOPES) -> int:
    """Return how many per-proxy running sums the sweep needs (0 with a single proxy).

    Runs one small query on the key table.

    Args:
        keys: output of :func:`connection_keys`.
        scopes: the scopes being swept.

    Returns:
        The largest ``s_np`` among keys with ``2 <= s_np <= PROXY_COLUMNS``, or 0.
    """
    cols = [F.when(F.col(f"{sc}_pix").isNotNull(), F.col(f"{sc}_np"))
            for sc in scopes if sc in LIMIT_SCOPES]
    if not cols:
        return 0
    row = keys.select(F.greatest(*cols, F.lit(0)).alias("n")).agg(F.max("n")).collect()[0]
    return int(row[0] or 0)


def scope_keys(keys: DataFrame, scopes: Iterable[str] = SCOPES) -> DataFrame:
    """Return the key id table: which (scope, vhost, key) each fleet-wide id stands for.

    Args:
        keys: output of :func:`connection_keys`.
        scopes: which scopes to list.

    Returns:
        Distinct ``id``, ``scope``, ``vhost``, ``key``.
    """
    parts = [keys.select(F.col(f"{s}_id").alias("id"), F.lit(s).alias("scope"), "vhost",
                         F.col(s).alias("key")).where(F.col("id").isNotNull())
             for s in scopes]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.distinct()


def keyed_changes(changes: DataFrame, keys: DataFrame, exact: bool = False) -> DataFrame:
    """Reduce each change to its key combination, time and sign.

    Args:
        changes: output of :func:`connection_changes`.
        keys: output of :func:`connection_keys` over the same window.
        exact: take ``combo`` from ``keys`` by joining on the five strings (with the keys of
            ``connection_keys(..., exact=True)``) instead of the change's own hash.

    Returns:
        ``combo`` (long), ``t_us``, ``d`` (byte): narrow enough to cache.
    """
    if not exact:
        return changes.select("combo", "t_us", F.col("d").cast("byte"))
    k = keys.select(*[F.col(c).alias(f"k_{c}") for c in ("proxy", *_DIMS)],
                    F.col("combo").alias("k_combo"))
    cond = [changes[c].eqNullSafe(k[f"k_{c}"]) for c in ("proxy", *_DIMS)]
    return changes.join(F.broadcast(k), cond, "inner").select(
        F.col("k_combo").alias("combo"), "t_us", F.col("d").cast("byte"))


def sweep_points(keyed: DataFrame, keys: DataFrame, window: ReportWindow,
                 scopes: Iterable[str], by_bucket: bool = False) -> DataFrame:
    """Key the sweep changes by scope key id.

    Args:
        keyed: output of :func:`keyed_changes`.
        keys: output of :func:`connection_keys`.
        window: the report window (for the bucket index).
        scopes: which of :data:`SCOPES` to produce (with the per-proxy ids of the limited
            ones).
        by_bucket: distribute by (``id``, ``bucket``) rather than ``id``, for the dense plan
            of :func:`bucket_samples`: a vhost with half the changes is then spread over all
            tasks instead of one.

    Returns:
        ``id``, ``pix`` (the change's proxy among the key's proxies, for keys summed per
        proxy in the window), ``bucket``, ``t_us``, ``d``: one row per change and key id
        (fleet-wide, plus a per-proxy id for keys seen on more than :data:`PROXY_COLUMNS`
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
                _bucket(F.col("t_us"), window.grid_us).alias("bucket"), "t_us", "d")
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
    return peak, _ts(F.lit(window.start_us) + offset_ms * US_PER_MS)


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
        nprox: number of per-proxy running sums (:func:`proxy_columns`); 0 for none.

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
    next_b = F.coalesce(_bucket(F.col("next_us"), g), last)
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
    peak_ts = F.when(code_peak == F.col("peak"), code_ts).otherwise(_ts(F.lit(window.start_us)))
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
    ).select("id", _ts(F.col("bucket") * window.grid_us).alias("window_start"), "concurrent")


@dataclass(frozen=True)
class Sweep:
    """The inputs of the sweep for one window, built once and reused."""

    changes: DataFrame
    """Output of :func:`connection_changes` (with strings; the what-if replay uses it)."""
    keys: DataFrame
    """Output of :func:`connection_keys` (small)."""
    keyed: DataFrame
    """Output of :func:`keyed_changes` (narrow; the sweeps use it)."""
    window: ReportWindow
    """The report window."""
    carried: bool = True
    """Whether connections open since before the window were looked for."""

    def persist(self, events: DataFrame) -> Sweep:
        """Return a copy with ``keys`` and ``keyed`` persisted (call :meth:`unpersist`).

        Checks that no two key combinations share a ``combo`` hash (among thousands of
        combinations a 64-bit collision is astronomically unlikely, but would merge two keys);
        if one does, numbers the combinations exactly instead (slower: string joins).

        Args:
            events: the events this sweep was prepared from (for the exact fallback).

        Returns:
            The persisted sweep.
        """
        keys = self.keys.persist()
        if keys.where(F.col("clash")).limit(1).count() == 0:
            return Sweep(self.changes, keys, keyed_changes(self.changes, keys).persist(),
                         self.window, self.carried)
        logger.warning("key combination hashes collide: numbering them exactly")
        keys.unpersist()
        exact = connection_keys(events, self.window, exact=True,
                                carried=self.carried).persist()
        keyed = keyed_changes(self.changes, exact, exact=True).persist()
        changes = self.changes.drop("combo").join(
            F.broadcast(exact.select("combo", *[F.col(c).alias(f"e_{c}")
                                                for c in ("proxy", *_DIMS)])),
            [self.changes[c].eqNullSafe(F.col(f"e_{c}")) for c in ("proxy", *_DIMS)],
        ).drop(*[f"e_{c}" for c in ("proxy", *_DIMS)])
        return Sweep(changes, exact, keyed, self.window, self.carried)

    def unpersist(self) -> None:
        """Release what :meth:`persist` cached."""
        self.keyed.unpersist()
        self.keys.unpersist()


def prepare_sweep(events: DataFrame, window: ReportWindow, carried: bool = True) -> Sweep:
    """Build the sweep inputs.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.
        carried: as for :func:`connection_changes`.

    Returns:
        The changes, the key table and the keyed changes (nothing cached: see
        :meth:`Sweep.persist`).
    """
    changes = connection_changes(events, window, carried)
    keys = connection_keys(events, window, carried=carried)
    return Sweep(changes=changes, keys=keys, keyed=keyed_changes(changes, keys),
                 window=window, carried=carried)


def name_ids(df: DataFrame, keys: DataFrame, scopes: Iterable[str] = SCOPES) -> DataFrame:
    """Replace the fleet-wide key ``id`` column of ``df`` by ``scope``, ``vhost``, ``key``.

    Args:
        df: a DataFrame with an ``id`` column (rows with per-proxy ids are dropped).
        keys: output of :func:`connection_keys`.
        scopes: the scopes ``df`` may contain.

    Returns:
        ``scope``, ``vhost``, ``key`` and the other columns of ``df``.
    """
    rest = [c for c in df.columns if c != "id"]
    return df.join(F.broadcast(scope_keys(keys, scopes)), "id").select(
        "scope", "vhost", "key", *rest)


def name_keys(stats: DataFrame, keys: DataFrame, scopes: Iterable[str] = SCOPES) -> DataFrame:
    """Name the keys of per-id statistics and attach each key's per-proxy peak.

    Args:
        stats: output of :func:`concurrency_stats` (fleet-wide and per-proxy ids).
        keys: output of :func:`connection_keys`.
        scopes: the scopes ``stats`` may contain.

    Returns:
        ``scope``, ``vhost``, ``key``, ``peak``, ``p50``, ``p95``, ``p99``, ``peak_ts``,
        ``proxy_peak`` (highest concurrency within one proxy process; null for groups,
        which have no limit), ``low``.
    """
    names = scope_keys(keys, scopes)
    # One aggregation (not a union of two filtered branches, which would compute the whole
    # sweep twice): per-proxy rows fold into their fleet-wide key id.
    fleet = F.col("id") >= 0
    base = F.when(fleet, F.col("id")).otherwise(F.shiftright(-F.col("id") - 1, _PROXY_BITS))
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
        sweep: from :func:`prepare_sweep`.
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


def key_groups(keys: DataFrame) -> DataFrame:
    """Return which users connected from which hosts under which group, per vhost.

    Args:
        keys: output of :func:`connection_keys`.

    Returns:
        Distinct ``vhost``, ``user``, ``group``, ``remote_host`` of connections in the
        window.
    """
    return keys.select("vhost", "user", "group", "remote_host").distinct()


# --------------------------------------------------------------------------------------------
# Limits


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
    """Turn connection limits into the lookup DataFrames used by the transforms.

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


def local_table(spark: SparkSession, rows: Iterable[tuple], schema: T.StructType) -> DataFrame:
    """Return a small DataFrame of driver-side rows that the JVM alone can evaluate.

    ``spark.createDataFrame(list)`` builds a Python RDD: every query that reads it (again)
    starts Python workers to re-serialise the rows, which costs seconds per query on a busy
    machine. Here the rows travel as one JSON string literal that the JVM parses
    (``from_json``) and expands (``inline``): no Python worker, ever.

    Args:
        spark: the session.
        rows: tuples in ``schema``'s field order; only strings, integers, floats and
            ``None`` (a few thousand rows at most: they become one literal in the plan).
        schema: a flat ``StructType``.

    Returns:
        The rows as a DataFrame with exactly ``schema`` (all fields nullable).
    """
    names = schema.fieldNames()
    text = json.dumps([dict(zip(names, r, strict=True)) for r in rows])
    parsed = F.from_json(F.lit(text), T.ArrayType(schema))
    return spark.range(1).select(F.inline(parsed)).select(
        *[F.col(f.name).cast(f.dataType) for f in schema.fields])


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


def headroom(peaks: DataFrame, pairs: DataFrame, lt: LimitTables) -> DataFrame:
    """Compute the ``headroom`` table: observed peaks against the configured limits.

    Args:
        peaks: output of :func:`limit_peaks` (per-proxy peaks; limits are per proxy).
        pairs: output of :func:`key_groups`.
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
        peaks: output of :func:`limit_peaks`.
        pairs: output of :func:`key_groups`.
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


# --------------------------------------------------------------------------------------------
# What-if replay


def replay_admissions(rows: Iterable[tuple]) -> Counter:
    """Replay connection attempts against limits; count who would be denied. Pure Python.

    The rows must be sorted by ``(proxy, vhost, t_us, kind, conn_id)``: within one proxy and
    vhost, in time order, closes (kind 0) before opens (kind 1) at the same instant, opens
    at the same instant in ``conn_id`` order. Each proxy process counts its own connections,
    as the daemon's ledger does.

    An open is admitted when, in QDR's order (``PolicyAppConnectionMgr.can_connect``), the vhost has fewer than
    ``max_connections`` admitted connections, the user fewer than ``per_user`` and the remote
    host fewer than ``per_host`` (both counted over the vhost, whatever the group). A denied
    connection never occupies a slot: its close is ignored. A connection closed at the very
    instant it opened (its close sorts first) is still an attempt, but occupies nothing.

    Args:
        rows: tuples ``(proxy, vhost, t_us, kind, conn_id, user, remote_host,
            max_connections, per_user, per_host)``; a null limit is no limit.

    Returns:
        A ``Counter`` of ``(vhost, scope, key) -> denied connections``; each denial is
        counted once, under the first limit it fails (scope ``vhost``, ``user`` or
        ``remote_host``).
    """
    denied: Counter = Counter()
    cur_proxy: object = None
    cur_vhost: object = None
    vhost_n = 0
    users: dict = {}
    hosts: dict = {}
    admitted: dict[str, tuple[str | None, str | None]] = {}
    now = None
    closed_now: set[str] = set()  # closes at instant `now` of connections not yet admitted
    for proxy, vhost, t, kind, conn, user, host, vmax, ulim, hlim in rows:
        if vhost != cur_vhost or proxy != cur_proxy:
            cur_proxy, cur_vhost = proxy, vhost
            vhost_n = 0
            users = {}
            hosts = {}
            admitted = {}
        if t != now:
            now = t
            if closed_now:
                closed_now.clear()
        if kind == 0:
            who = admitted.pop(conn, None)
            if who is None:
                closed_now.add(conn)
            else:
                vhost_n -= 1
                users[who[0]] -= 1
                hosts[who[1]] -= 1
            continue
        if vmax is not None and vhost_n >= vmax:
            denied[(vhost, "vhost", vhost)] += 1
            continue
        nu = users.get(user, 0)
        if ulim is not None and nu >= ulim:
            denied[(vhost, "user", user)] += 1
            continue
        nh = hosts.get(host, 0)
        if hlim is not None and nh >= hlim:
            denied[(vhost, "remote_host", host)] += 1
            continue
        if conn not in closed_now:
            admitted[conn] = (user, host)
            vhost_n += 1
            users[user] = nu + 1
            hosts[host] = nh + 1
    return denied


#: Bits of the replay group number in the what-if sort key (then 39 bits: the instant in ms
#: from the window start, < 2^37, and the kind; the sign bit stays clear).
_GROUP_BITS = 24
_REPLAY_COLS = ("combo", "t_us", "kind", "conn_id")
_REPLAY_OUT = T.StructType([T.StructField("vhost_id", T.LongType()),
                            T.StructField("scope", T.StringType()),
                            T.StructField("key_id", T.LongType()),
                            T.StructField("would_deny", T.LongType())])


def _replay_input(info: dict, rows: Iterable[tuple]) -> Iterator[tuple]:
    # (combo, t_us, kind, conn_id) -> the 10-tuples of replay_admissions.
    for combo, t, kind, conn in rows:
        proxy, vhost, user, host, vmax, ulim, hlim = info[combo]
        yield (proxy, vhost, t, kind, conn, user, host, vmax, ulim, hlim)


def _replay_arrow(info: dict, batches: Iterator) -> Iterator:
    import pyarrow as pa

    def rows() -> Iterator[tuple]:
        for batch in batches:
            yield from zip(*[batch.column(c).to_pylist() for c in _REPLAY_COLS], strict=True)

    counts = replay_admissions(_replay_input(info, rows()))
    if counts:
        keys = list(counts)
        yield pa.RecordBatch.from_pydict({
            "vhost_id": [k[0] for k in keys], "scope": [k[1] for k in keys],
            "key_id": [k[2] for k in keys], "would_deny": [counts[k] for k in keys],
        }, schema=pa.schema([("vhost_id", pa.int64()), ("scope", pa.string()),
                             ("key_id", pa.int64()), ("would_deny", pa.int64())]))


def _replay_rows(info: dict, it: Iterator) -> Iterator[tuple]:
    counts = replay_admissions(_replay_input(info, (tuple(r) for r in it)))
    for (vhost, scope, key), n in counts.items():
        yield (vhost, scope, key, n)


#: Per Spark application id: whether its Python workers can import pyarrow.
_WORKERS_PYARROW: dict[str, bool] = {}


def _import_pyarrow(_: object) -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def workers_have_pyarrow(spark: SparkSession) -> bool:
    """Return whether the executors' Python workers can import pyarrow (for ``mapInArrow``).

    The driver having pyarrow says nothing about the executors: under spark-submit their
    Python is ``PYSPARK_PYTHON`` on other machines. A local run whose workers run this very
    interpreter is answered without a job; otherwise one small job (one task per default
    parallelism slot, at most 64) imports pyarrow on the workers, once per application.

    Args:
        spark: the session whose executors run the replay.

    Returns:
        True when the driver and every probed worker import pyarrow; False sends the what-if
        replay down the RDD path (same answers, slower).
    """
    if not _import_pyarrow(None):
        return False
    sc = spark.sparkContext
    app = sc.applicationId
    known = _WORKERS_PYARROW.get(app)
    if known is None:
        if _workers_run_this_python(sc.master, sc.getConf().get("spark.pyspark.python")):
            known = True
        else:
            n = max(1, min(sc.defaultParallelism, 64))
            known = all(sc.parallelize(range(n), n).map(_import_pyarrow).collect())
        _WORKERS_PYARROW[app] = known
    return known


def _workers_run_this_python(master: str, conf_python: str | None) -> bool:
    # Local executors start PYSPARK_PYTHON (the conf wins over the environment); it is this
    # interpreter when it names the same file, compared unresolved: a venv's python is a
    # symlink to a base interpreter that does not have the venv's packages.
    if not master.startswith("local"):
        return False
    named = conf_python or os.environ.get("PYSPARK_PYTHON")
    found = shutil.which(named) if named else None
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def whatif_candidates(peaks: DataFrame, pairs: DataFrame, alt: LimitTables) -> DataFrame:
    """Return the keys whose observed peak exceeds their limit in the what-if policy.

    A replay admits a subset of the connections that really were admitted, so its counts
    never exceed the observed ones: only a key whose per-proxy peak is above its
    alternative limit can ever deny, and only connections of such keys (or of a vhost that is
    one) need replaying.

    Args:
        peaks: output of :func:`limit_peaks`.
        pairs: output of :func:`key_groups`.
        alt: the what-if policy's limit tables.

    Returns:
        ``scope`` (vhost|user|remote_host), ``vhost``, ``key``; empty when nothing would be
        denied.
    """
    return (headroom(peaks, pairs, alt).where(F.col("peak") > F.col("limit"))
            .select("scope", "vhost", "key"))


def whatif(sweep: Sweep, alt: LimitTables, binding: DataFrame) -> DataFrame:
    """Compute the ``whatif`` table: replay the history under alternative limits.

    Every connection is replayed as an attempt at its open (connections already open at the
    window start: at the window start) and frees its slot at its close; see
    :func:`replay_admissions` for the admission rule and tie order. Only what can change the
    answer is replayed: every connection of a vhost whose own limit binds, otherwise only the
    connections of users and hosts in ``binding`` (the others can never reach their limit,
    and the counts they would add cannot reach any limit either). Vhosts not in the what-if
    policy are not replayed.

    Runs one query at once: it collects the key combinations to replay (one row per
    combination, with its ids and limits) and ships them to the replay, so the changes that
    Spark shuffles and sorts carry only (combination, instant, kind, conn_id).

    Args:
        sweep: from :func:`prepare_sweep`.
        alt: the what-if policy's limit tables.
        binding: output of :func:`whatif_candidates`.

    Returns:
        ``vhost``, ``scope`` (vhost|user|remote_host), ``key``, ``would_deny`` (connections
        that would have been denied, each under the first limit it fails).
    """
    spark = sweep.changes.sparkSession
    k = sweep.keys
    # Per key combination (small): its ids, its limits under the what-if policy, and whether
    # its vhost, user or host binds (then its connections must be replayed).
    lim = resolve_limits(k.select("combo", "proxy_ix", "vhost_id", "user_id", "remote_host_id",
                                  "vhost", "user", "group", "remote_host"), alt)
    for scope in ("vhost", "user", "remote_host"):
        b = binding.where(F.col("scope") == scope).select(
            F.col("vhost").alias("b_vhost"), F.col("key").alias("b_key"),
            F.lit(True).alias(f"f_{scope}"))
        lim = lim.join(b, (lim["vhost"] == b["b_vhost"]) & (lim[scope] == b["b_key"]),
                       "left").drop("b_vhost", "b_key")
    # g numbers the replay groups (proxy, vhost): 1.. in (proxy_ix, vhost_id) order.
    g = F.dense_rank().over(Window.orderBy("proxy_ix", "vhost_id")).cast("long")
    combos = lim.where(F.col("f_vhost") | F.col("f_user") | F.col("f_remote_host")).select(
        "combo", "proxy_ix", "vhost_id", "user_id", "remote_host_id", "max_connections",
        "per_user", "per_host", g.alias("g")).collect()
    # One row per key combination that binds (small): the replay looks up ids and limits
    # here, so the shuffled and sorted rows carry 4 columns, not 10.
    info = {r["combo"]: (r["proxy_ix"], r["vhost_id"], r["user_id"], r["remote_host_id"],
                         r["max_connections"], r["per_user"], r["per_host"]) for r in combos}
    groups = max((r["g"] for r in combos), default=0)
    to_g = local_table(spark, [(r["combo"], r["g"]) for r in combos], T.StructType([
        T.StructField("combo", T.LongType()), T.StructField("g", T.LongType())]))
    kind = F.when(F.col("d") > 0, F.lit(1)).otherwise(F.lit(0))
    rows = sweep.changes.select("combo", "conn_id", "t_us", "d").join(
        F.broadcast(to_g), "combo").select("g", "combo", "t_us", kind.alias("kind"), "conn_id")
    if groups < 1 << _GROUP_BITS:
        # One long decides the order but for ties (same group, instant and kind): the sort
        # compares its 8-byte prefix instead of four columns per comparison.
        t_ms = ((F.col("t_us") - F.lit(sweep.window.start_us)) / F.lit(US_PER_MS)).cast("long")
        rows = rows.select("*", (F.shiftleft(F.col("g"), 39) + F.shiftleft(t_ms, 1)
                                 + F.col("kind")).alias("sk"))
        order = ["sk", "conn_id"]
    else:  # pragma: no cover - more than 16 million (proxy, vhost) pairs
        order = ["g", "t_us", "kind", "conn_id"]
    ordered = rows.repartition("g").sortWithinPartitions(*order).select(*_REPLAY_COLS)
    if workers_have_pyarrow(spark):
        counted = ordered.mapInArrow(functools.partial(_replay_arrow, info), _REPLAY_OUT)
    else:
        counted = spark.createDataFrame(
            ordered.rdd.mapPartitions(functools.partial(_replay_rows, info)), _REPLAY_OUT)
    totals = counted.groupBy("key_id", "scope").agg(
        F.sum("would_deny").cast("long").alias("would_deny"))
    names = scope_keys(k, LIMIT_SCOPES)
    return totals.join(F.broadcast(names), (totals["key_id"] == names["id"])
                       & (totals["scope"] == names["scope"])).select(
        "vhost", names["scope"], "key", "would_deny")


# --------------------------------------------------------------------------------------------
# Denials and traffic


def _in_window(events: DataFrame, window: ReportWindow, event: str) -> DataFrame:
    return events.where((F.col("event") == event) & (F.col("t_us") >= window.start_us)
                        & (F.col("t_us") < window.end_us))


def admin_actions(events: DataFrame, window: ReportWindow) -> DataFrame:
    """The ``admin_actions`` table: every operator change through the admin interface in the
    window (schema version 2 logs; none in older ones), oldest first.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.

    Returns:
        :data:`~.schemas.ADMIN_ACTIONS` columns: ``ts`` (timestamp), ``action``, ``vhost``,
        ``selector``, ``targets`` (array of strings), ``count``, ``result``, ``uid``, ``pid``
        (the admin client's peer credentials; null over TCP), ``peer``, ``description``.
    """
    a = _in_window(events, window, ev.ADMIN_ACTION)
    fields = F.from_json(F.col("admin"), ADMIN_JSON).alias("a")
    return (a.select(_ts(F.col("t_us")).alias("ts"), "vhost", fields)
            .select("ts", "a.action", "vhost", "a.selector", "a.targets", "a.count", "a.result",
                    "a.uid", "a.pid", "a.peer", "a.description"))


def denials(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Compute the ``denials`` table: connection denials per vhost, reason and grid bucket.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window (``connection_denied`` records within it).

    Returns:
        ``vhost`` (null when denied before a vhost was known), ``reason``, ``window_start``
        (bucket start), ``count``.
    """
    d = _in_window(events, window, ev.CONNECTION_DENIED)
    b = _bucket(F.col("t_us"), window.grid_us)
    return (d.groupBy("vhost", "reason", b.alias("bucket")).agg(F.count("*").alias("count"))
            .select("vhost", "reason", _ts(F.col("bucket") * window.grid_us)
                    .alias("window_start"), "count"))


def top_denied(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Count connection denials per user and per remote host.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.

    Returns:
        ``scope`` (user|remote_host), ``vhost``, ``key``, ``count``, ``top_reason`` (the most
        frequent reason; at equal counts the alphabetically first). Denials with no user (or host) are counted
        under a null key.
    """
    d = _in_window(events, window, ev.CONNECTION_DENIED)
    parts = []
    for scope in ("user", "remote_host"):
        by_reason = d.groupBy("vhost", F.col(scope).alias("key"), "reason").count()
        parts.append(by_reason.groupBy("vhost", "key").agg(
            F.sum("count").alias("count"),
            F.min(F.struct((-F.col("count")).alias("n"), F.col("reason"))).alias("m"),
        ).select(F.lit(scope).alias("scope"), "vhost", "key", "count",
                 F.col("m.reason").alias("top_reason")))
    return parts[0].unionByName(parts[1])


def traffic(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Compute bytes, transfers and duration figures per vhost and group.

    Figures come from ``connection_closed`` records, so they are attributed to the moment a
    connection closes; connections still open at the window end are not included.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.

    Returns:
        ``vhost``, ``group``, ``connections`` (closed in the window), ``bytes_in``,
        ``bytes_out``, ``transfers_in``, ``transfers_out`` (sums; ``in`` = client to broker),
        ``duration_p50``/``p95``/``p99`` (seconds, approximate: ``percentile_approx``) and
        ``duration_max``.
    """
    c = _in_window(events, window, ev.CONNECTION_CLOSED)
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
        events: output of :func:`prepare_events`.
        window: the report window (connections closed within it).

    Returns:
        ``vhost``, ``le_seconds`` (the bin's exclusive upper bound; ``Infinity`` for the
        last), ``label``, ``count``; only non-empty bins.
    """
    c = _in_window(events, window, ev.CONNECTION_CLOSED).where(
        F.col("duration_seconds").isNotNull())
    dur = F.col("duration_seconds")
    le = None
    label = None
    for bound, text in reversed(DURATION_BINS):
        if le is None:
            le, label = F.lit(bound), F.lit(text)
        else:
            le = F.when(dur < bound, F.lit(bound)).otherwise(le)
            label = F.when(dur < bound, F.lit(text)).otherwise(label)
    return (c.groupBy("vhost", le.cast("double").alias("le_seconds"), label.alias("label"))
            .agg(F.count("*").alias("count")))


def churn(events: DataFrame, window: ReportWindow) -> DataFrame:
    """Count connection opens and closes per vhost and minute (not the grid: always 1 min).

    Args:
        events: output of :func:`prepare_events`.
        window: the report window.

    Returns:
        ``vhost``, ``window_start`` (minute), ``opens``, ``closes``; minutes with neither are
        absent.
    """
    m = _bucket(F.col("t_us"), US_PER_MINUTE).alias("m")
    one, zero = F.lit(1), F.lit(0)
    # One branch per event (no per-record comparison of the event name).
    e = (_in_window(events, window, ev.CONNECTION_OPENED)
         .select("vhost", m, one.alias("o"), zero.alias("c"))
         .unionByName(_in_window(events, window, ev.CONNECTION_CLOSED)
                      .select("vhost", m, zero.alias("o"), one.alias("c"))))
    return (e.groupBy("vhost", "m").agg(F.sum("o").cast("long").alias("opens"),
                                        F.sum("c").cast("long").alias("closes"))
            .select("vhost", _ts(F.col("m") * US_PER_MINUTE).alias("window_start"), "opens",
                    "closes"))
