"""The ``whatif`` table: the window's history replayed under another policy. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`.common`, :mod:`.events` (the work table, :class:`events.Sweep`) and :mod:`.headroom`
(the what-if policy's limit tables and how a user's limits are looked up).

Every admitted connection of the window is replayed as an attempt at its open against the
what-if policy's ``maxConnections``, ``maxConnectionsPerUser`` and ``maxConnectionsPerHost``,
per proxy process and vhost, in time order; the table counts the connections that would have
been denied (a number of connections per key). :func:`replay_admissions` is the admission
rule itself, in pure Python; :func:`whatif` runs it with ``mapInArrow`` (or the RDD API when
the executors have no pyarrow, :func:`workers_have_pyarrow`) on partitions that Spark sorted.
This is the one step of the reports that runs Python on the executors. Driver-side work: one
collect of the key combinations to replay (one row each) and, once per application, a probe
of the workers' pyarrow.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Iterator

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from amqp_policy_proxy.spark_reports.common import LIMIT_SCOPES, US_PER_MS, local_table
from amqp_policy_proxy.spark_reports.events import Sweep, scope_keys
from amqp_policy_proxy.spark_reports.headroom import LimitTables, headroom, resolve_limits

# --------------------------------------------------------------------------------------------
# The admission rule (pure Python: it runs on the executors)


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


# --------------------------------------------------------------------------------------------
# The replay on Spark

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
        if _workers_run_this_python(sc.master or "", sc.getConf().get("spark.pyspark.python")):
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
        peaks: output of :func:`concurrency.limit_peaks`.
        pairs: output of :func:`events.key_groups`.
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
        sweep: from :func:`events.prepare_sweep`.
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
    binding_rows = lim.where(F.col("f_vhost") | F.col("f_user") | F.col("f_remote_host")).select(
        "combo", "proxy_ix", "vhost_id", "user_id", "remote_host_id", "max_connections",
        "per_user", "per_host").collect()
    # g numbers the replay groups (proxy, vhost): 1.. in (proxy_ix, vhost_id) order, here on
    # the driver (the rows are collected anyway; a window over them would have no partition).
    numbers = {pv: i for i, pv in enumerate(sorted({(r["proxy_ix"], r["vhost_id"])
                                                    for r in binding_rows}), 1)}
    combos = [r.asDict() | {"g": numbers[(r["proxy_ix"], r["vhost_id"])]}
              for r in binding_rows]
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


