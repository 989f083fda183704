"""The event log as the reports read it, and the per-connection work table. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`amqp_policy_proxy.eventlog.schema` (event names) and :mod:`.common`; the report modules
(``concurrency``, ``headroom``, ``whatif``, ``traffic``) build on this one.

Pure DataFrame -> DataFrame functions: no I/O and no SparkSession building (the job,
``jobs/capacity.py``, reads the JSON Lines files and writes the tables). The only
driver-side work here is the one-row queries of :func:`proxy_columns` and of the collision
check in :meth:`Sweep.persist`. Three steps, each feeding the next:

1. :func:`prepare_events` normalises the raw records (``connection_opened``,
   ``connection_closed``, ``connection_denied``) into typed columns, times in ``long``
   microseconds since the epoch (``t_us``, ``opened_us``), with a 64-bit hash ``combo`` of
   each record's key combination (proxy, vhost, group, user, remote_host).
2. :func:`connection_changes` turns the records into the +1/-1 changes of the sweep. A
   connection counts from its ``connection_opened`` ts (inclusive) to its
   ``connection_closed`` ts (exclusive): +1 per open and -1 per close in the window, +1 at
   the window start for a close whose ``opened_ts`` is earlier, and +1 at the window start
   for a connection opened before the window with no close at all (:func:`open_at_start`,
   the only place records are paired, by ``(proxy, conn_id)``: conn_ids restart in every
   proxy process, and ``proxy`` is ``<host>-<pid>`` from the file name). A connection still
   open at the end simply has no -1.
3. :func:`connection_keys` numbers the keys of every scope (a small key table: one row per
   key combination), so the sweeps sort longs, not strings; :func:`keyed_changes` reduces
   each change to (``combo``, ``t_us``, ``d``). :class:`Sweep` holds the three tables of a
   window (:func:`prepare_sweep`): the concurrency sweep and the what-if replay both start
   from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from amqp_policy_proxy.eventlog import schema as ev
from amqp_policy_proxy.spark_reports.common import (
    LIMIT_SCOPES,
    SCOPES,
    US_PER_SECOND,
    ReportWindow,
)

logger = logging.getLogger(__name__)

#: The key columns of a connection record (one per scope).
_DIMS = ("vhost", "group", "user", "remote_host")
#: The fields of an ``admin_action`` record kept (as one JSON column) by :func:`prepare_events`.
ADMIN_FIELDS = tuple(ev.EVENT_FIELDS[ev.ADMIN_ACTION])


# --------------------------------------------------------------------------------------------
# Events and connection changes


def prepare_events(raw: DataFrame, drop_unparsed: bool = True,
                   hostnames: bool = False) -> DataFrame:
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
        hostnames: also keep the ``auth_decision`` records (schema 2 on) with their Open
            ``hostname`` (the column is null on every other record): the exact what-if
            (:mod:`.replay`) resolves each connection's vhost from it.

    Returns:
        Only ``connection_opened``, ``connection_closed``, ``connection_denied`` and
        ``admin_action`` records with a parsable ``ts`` (see ``drop_unparsed``), with columns ``proxy``, ``event``, ``t_us`` (long),
        ``conn_id``, ``vhost``, ``group``, ``user``, ``remote_host``, ``reason``,
        ``opened_us`` (long, closes only: ``opened_ts``, else ``ts - duration_seconds``),
        ``duration_seconds``, ``bytes_in``, ``bytes_out``, ``transfers_in``,
        ``transfers_out``, and ``combo``: a 64-bit hash of (``proxy``, ``vhost``, ``group``,
        ``user``, ``remote_host``) computed in this pass, so that later joins on the key
        combination compare one long instead of five strings (:meth:`Sweep.persist` checks
        that no two combinations share a hash and falls back to comparing the strings if
        they ever do), and ``admin``: an ``admin_action`` record's own fields as one JSON
        object (null for every other record: one column that costs the connection records
        nothing but its null; :func:`.traffic.admin_actions` reads it).
    """
    events: tuple[str, ...] = (ev.CONNECTION_OPENED, ev.CONNECTION_CLOSED,
                               ev.CONNECTION_DENIED, ev.ADMIN_ACTION)
    if hostnames:
        events += (ev.AUTH_DECISION,)
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
            (F.when(F.col("event") == ev.AUTH_DECISION, F.col("hostname")) if hostnames
             else F.lit(None).cast("string")).alias("hostname"),
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
    ``min_us`` and ``max_us`` leave ``admin_action`` and ``auth_decision`` records out. ``skipped`` counts the
    records without a ``t_us``: with
    ``prepare_events(drop_unparsed=False)``, the lines that are not JSON objects or have no
    ``event`` and the connection records whose ``ts`` does not parse (a line cut short by a
    crash, a hand edit). The report leaves them out and says how many there were.
    """
    # the window is the connection records' (an admin action alone does not make one)
    t_us = F.when(~F.col("event").isin(ev.ADMIN_ACTION, ev.AUTH_DECISION), F.col("t_us"))
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
    +1; :func:`concurrency.concurrency` flags such keys (``low`` below 0).

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


def records_in_window(events: DataFrame, window: ReportWindow, event: str) -> DataFrame:
    """Return the records of one event whose ``t_us`` lies in the window.

    Args:
        events: output of :func:`prepare_events`.
        window: the report window, ``[start_us, end_us)``.
        event: an event name (``eventlog.schema.CONNECTION_OPENED``, ``..._CLOSED`` or
            ``..._DENIED``).

    Returns:
        ``events``' rows of that event with ``window.start_us <= t_us < window.end_us``, all
        columns.
    """
    return events.where((F.col("event") == event) & (F.col("t_us") >= window.start_us)
                        & (F.col("t_us") < window.end_us))


def _window_records(events: DataFrame, window: ReportWindow, event: str) -> DataFrame:
    # The `event` records in the window; for closes, except the close at exactly the window
    # start of a connection opened before it (that connection is not in the window at all).
    records = records_in_window(events, window, event)
    if event == ev.CONNECTION_CLOSED:
        records = records.where(~((F.col("opened_us") < window.start_us)
                                  & (F.col("t_us") == window.start_us)))
    return records


# --------------------------------------------------------------------------------------------
# Keys: every scope key gets a long id, so the sweep sorts longs, not strings.

#: Scope index in the low bits of a key id.
_SCOPE_INDEX = {s: i for i, s in enumerate(SCOPES)}
#: Per-proxy ids are ``-(id << PROXY_BITS | proxy_ix) - 1``.
PROXY_BITS = 20
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
        pid = -(F.shiftleft(F.col(f"{sc}_id"), PROXY_BITS) + F.col("proxy_ix")) - 1
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


# --------------------------------------------------------------------------------------------
# The work table of one window: what the sweeps and the what-if replay start from


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


def key_groups(keys: DataFrame) -> DataFrame:
    """Return which users connected from which hosts under which group, per vhost.

    Args:
        keys: output of :func:`connection_keys`.

    Returns:
        Distinct ``vhost``, ``user``, ``group``, ``remote_host`` of connections in the
        window.
    """
    return keys.select("vhost", "user", "group", "remote_host").distinct()


