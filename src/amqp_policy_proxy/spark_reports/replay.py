"""The exact what-if: the window's connections replayed through the daemon's own decisions.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon. Here: :mod:`.common`, :mod:`.events` (the
work table, :class:`events.Sweep`), :mod:`.whatif` (the workers' pyarrow probe) and, from the
proxy, the decision code itself: :func:`amqp_policy_proxy.policy.decisions.approve_open`
(vhost resolution, group assignment, ``remoteHosts``; on the driver),
:class:`amqp_policy_proxy.limits.connections.ConnectionLedger` (the counts, in QDR's order
``maxConnections``, ``maxConnectionsPerUser``, ``maxConnectionsPerHost``) and
:class:`amqp_policy_proxy.limits.rates.RateLimits` (the connection rates, after the counts);
both on the executors.

How a connection of the log is decided, as ``core/admission.py`` decides an Open:

1. On the driver, once per distinct (Open hostname, user, remote host): ``approve_open``
   under the candidate policy. It either denies (``no_vhost``, ``unknown_user``,
   ``remote_host``, whatever the counts) or names the vhost and group. The Open hostname is
   the one of the connection's ``auth_decision`` record (event log schema 2 on); a
   connection without one (schema 1) asks for the vhost name it was admitted to.
2. On the executors, per candidate vhost (and per proxy process unless the limits are
   fleet-wide), the attempts in time order go through one fresh ``ConnectionLedger`` and
   one ``RateLimits``: ``try_admit`` with the group's limits, then the rates; a connection
   over a rate is released at once (it holds no count slot); a close calls ``release``,
   which does nothing for a connection the replay denied, so **a denied connection never
   occupies a slot and its close decrements nothing**. In shadow mode (the group's, else the
   vhost's ``enforcement``) the would-be denial is reported and the connection counted, as
   the daemon does.

Why this is exact and still runs in parallel: the ledger keys every count by vhost (the
vhost's total, ``(vhost, user)`` and ``(vhost, host)``) and the rate buckets likewise, so two
vhosts never share a count; with per-process limits two proxies never share one either. The
attempts of one (vhost, proxy) group, sorted by Spark, are replayed by one task in order;
groups are independent. Ties: at one instant closes come before opens (as in the
concurrency sweep); opens of one instant in (proxy, conn_id) order, conn_ids compared as
the daemon numbers them (``<prefix>-<n>``: shorter first, then by text). The log has
millisecond timestamps, so the rate buckets see millisecond times.

What is replayed: every connection the log shows admitted in the window (and those open at
its start, as attempts at the window start). Connections the log shows denied are not:
how long they would have stayed is unknown. Groups that cannot deny are not replayed at
all (:func:`plan_replay`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.limits.rates import RateLimits
from amqp_policy_proxy.policy.reasons import ConnectionDenyReason

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy
    from amqp_policy_proxy.spark_reports.events import Sweep

#: Where each denial reason is counted in the ``whatif`` table (its ``scope``).
REASON_SCOPE: dict[str, str] = {
    "no_vhost": "vhost", "vhost_limit": "vhost", "vhost_rate": "vhost",
    "unknown_user": "user", "user_limit": "user", "user_rate": "user",
    "remote_host": "remote_host", "host_limit": "remote_host", "host_rate": "remote_host",
}


# --------------------------------------------------------------------------------------------
# What the executors get of the candidate policy


@dataclass(frozen=True, slots=True)
class ReplayVhost:
    """The settings of a candidate vhost that the ledger and the rate buckets read.

    The same attribute names as :class:`~amqp_policy_proxy.policy.model.VhostPolicy`, so
    ``ConnectionLedger.try_admit``, ``RateLimits.try_admit`` and ``decisions.count_rule`` run
    on it unchanged; plain values only, so the executors never import the policy loader
    (netaddr, PyYAML).
    """

    hostname: str
    max_connections: int
    max_connections_per_user: int
    max_connections_per_host: int
    max_connection_rate: int | None = None
    connection_rate_burst: int | None = None


@dataclass(frozen=True, slots=True)
class ReplayGroup:
    """The settings of a candidate group the ledger and the rate buckets read (see
    :class:`ReplayVhost`); ``name`` ``""`` for an unknown user admitted in shadow mode."""

    name: str
    max_connections_per_user: int | None = None
    max_connections_per_host: int | None = None
    max_connection_rate_per_user: int | None = None
    max_connection_rate_per_host: int | None = None


def replay_vhost(v: VhostPolicy) -> ReplayVhost:
    """Copy the count and rate settings of a compiled vhost."""
    return ReplayVhost(v.hostname, v.max_connections, v.max_connections_per_user,
                       v.max_connections_per_host, v.max_connection_rate,
                       v.connection_rate_burst)


def replay_group(g: GroupSettings) -> ReplayGroup:
    """Copy the count and rate settings of a compiled group."""
    return ReplayGroup(g.name, g.max_connections_per_user, g.max_connections_per_host,
                       g.max_connection_rate_per_user, g.max_connection_rate_per_host)


#: The group of an unknown user admitted in shadow mode (core/admission.py ``UNGROUPED``).
UNGROUPED = ReplayGroup("")


class Admission(NamedTuple):
    """The candidate policy's decision for one (Open hostname, user, remote host), before the
    counts (``approve_open``), plus the names the denials are reported with."""

    scope: str
    """The replay group: the candidate vhost's name (the requested name for ``no_vhost``)."""
    vhost: ReplayVhost | None
    """The candidate vhost (None for ``no_vhost``)."""
    group: ReplayGroup | None
    """The user's candidate group (None when ``approve_open`` found none)."""
    denied: str | None
    """``no_vhost``, ``unknown_user``, ``remote_host``, or None (the counts decide)."""
    rule: str
    """The rule text of that denial (the audit trail's words), or ``""``."""
    log: str
    """QDR's log line of that denial, or ``""``."""
    shadow: bool
    """The group's (else the vhost's) enforcement is ``shadow``: denials reported, not
    enforced."""
    user: str
    remote_host: str
    logged_vhost: str | None
    """The vhost the log recorded (under the live policy)."""
    count_rules: Mapping[str, str] = {}
    """The rule text of each count and rate denial (``vhost_limit`` ... ``host_rate``) for
    this vhost and group, worded by ``decisions.count_rule`` on the driver (the executors
    never import the policy package's decision code, which needs netaddr)."""


def decide_open(policy: Policy, hostname: str | None, user: str | None,
                remote_host: str | None, logged_vhost: str | None) -> Admission:
    """Run ``approve_open`` of the daemon on one (hostname, user, host) of the log.

    Args:
        policy: the candidate policy (from :func:`limits.load_checked_policy`).
        hostname: the Open hostname (None: use ``logged_vhost``, as a schema-1 log has no
            hostname).
        user: the authenticated user (an admitted connection always has one; None is
            treated as ``""``).
        remote_host: the client's normalised address.
        logged_vhost: the vhost the log recorded.

    Returns:
        The decision before the counts.
    """
    from amqp_policy_proxy.policy import decisions
    from amqp_policy_proxy.policy.keys import SHADOW
    from amqp_policy_proxy.policy.model import GroupSettings

    asked = hostname if hostname is not None else logged_vhost
    u, h = user or "", remote_host or ""
    if not policy.settings.enable_vhost_policy:  # only the global limit applies
        return Admission(asked or "", None, None, None, "", "", False, u, h, logged_vhost)
    d = decisions.approve_open(policy, hostname=asked, user=u, remote_host=h)
    vhost = None if d.vhost is None else replay_vhost(d.vhost)
    group = None if d.group is None else replay_group(d.group)
    scope_obj: Any = d.group if d.group is not None else d.vhost
    shadow = scope_obj is not None and scope_obj.enforcement is SHADOW
    name = d.vhost.hostname if d.vhost is not None else (asked or "")
    rules: dict[str, str] = {}
    if d.vhost is not None:
        g = d.group if d.group is not None else GroupSettings(name="")  # UNGROUPED
        rules = {str(r): decisions.count_rule(r, d.vhost, g) for r in _COUNT_REASONS}
    if isinstance(d, decisions.OpenDenied):
        return Admission(name, vhost, group, str(d.reason), d.rule, d.log, shadow, u, h,
                         logged_vhost, rules)
    return Admission(name, vhost, group, None, "", "", shadow, u, h, logged_vhost, rules)


#: The denials of the ledger and the rate buckets, in the order they are checked.
_COUNT_REASONS = (ConnectionDenyReason.VHOST_LIMIT, ConnectionDenyReason.USER_LIMIT,
                  ConnectionDenyReason.HOST_LIMIT, ConnectionDenyReason.VHOST_RATE,
                  ConnectionDenyReason.USER_RATE, ConnectionDenyReason.HOST_RATE)


# --------------------------------------------------------------------------------------------
# The replay of one group (pure Python: it runs on the executors)


class Denied(NamedTuple):
    """One connection the candidate policy would have denied (a row of ``whatif_denied``)."""

    t_us: int
    proxy: str
    conn_id: str
    vhost: str
    logged_vhost: str | None
    group: str | None
    user: str
    remote_host: str
    reason: str
    limit: str
    enforcement: str
    log: str


def replay_group_rows(rows: Iterable[tuple[int, int, str, str, int]],
                      info: Mapping[int, Admission], fleet: bool = False) -> Iterator[Denied]:
    """Replay the attempts of one replay group through the daemon's ledger and rate buckets.

    Args:
        rows: ``(t_us, kind, proxy, conn_id, key)`` sorted by ``(t_us, kind, proxy,
            len(conn_id), conn_id)``: closes (kind 0) before opens (kind 1) at one instant;
            ``key`` indexes ``info``. All rows of one candidate vhost (and one proxy unless
            ``fleet``).
        info: the driver's decision per key (:func:`decide_open`).
        fleet: the rows come from several proxies sharing fleet-wide counts (conn_ids are
            then told apart by proxy).

    Yields:
        The denied connections, in replay order (shadow-mode would-be denials included,
        with ``enforcement`` ``shadow``).
    """
    ledger = ConnectionLedger(max_connections=0)  # the global transport limit is not replayed
    rates = RateLimits()
    now = None
    closed_now: set[str] = set()  # closes at `now` of connections not (yet) admitted
    for t, kind, proxy, conn, key in rows:
        cid = f"{proxy}/{conn}" if fleet else conn
        if t != now:
            now = t
            closed_now.clear()
        if kind == 0:
            if not ledger.release(cid):
                closed_now.add(cid)  # never admitted, or opens at this very instant
            continue
        a = info[key]
        if a.vhost is None:  # no vhost, or vhost policy off (then nothing is counted)
            if a.denied is not None:
                yield _denied(t, proxy, conn, a, a.denied, a.rule, a.log, False)
            continue
        if ledger.is_admitted(cid):  # a duplicated open record: counted once
            continue
        shadow = a.shadow
        would = None
        if a.denied is not None:
            if not shadow:
                yield _denied(t, proxy, conn, a, a.denied, a.rule, a.log, False)
                continue
            would = (a.denied, a.rule, a.log)
        group = a.group if a.group is not None else UNGROUPED
        vh, gr = cast("VhostPolicy", a.vhost), cast("GroupSettings", group)
        reason = ledger.try_admit(cid, vhost=vh, group=gr, user=a.user,
                                  remote_host=a.remote_host, enforce=not shadow)
        if reason is None and would is None:
            reason = rates.try_admit(vhost=vh, group=gr, user=a.user,
                                     remote_host=a.remote_host, now=t / 1e6)
            if reason is not None and not shadow:
                ledger.release(cid)  # a denied connection holds no count slot
        if reason is not None and would is None:
            log = (f"{'SHADOW DENY' if shadow else 'DENY'} AMQP Open for user '{a.user}', "
                   f"rhost '{a.remote_host}', vhost '{a.vhost.hostname}': {reason}")
            would = (str(reason), a.count_rules.get(str(reason), str(reason)), log)
        if would is not None:
            log = would[2]  # the daemon's line: "SHADOW " before it in shadow mode
            if shadow and not log.startswith("SHADOW "):
                log = "SHADOW " + log
            yield _denied(t, proxy, conn, a, would[0], would[1], log, shadow)
        if cid in closed_now:  # opened and closed at this instant: holds nothing after it
            closed_now.discard(cid)
            ledger.release(cid)


def _denied(t: int, proxy: str, conn: str, a: Admission, reason: str, rule: str, log: str,
            shadow: bool) -> Denied:
    return Denied(t, proxy, conn, a.scope, a.logged_vhost,
                  None if a.group is None else a.group.name, a.user, a.remote_host, reason,
                  rule, "shadow" if shadow else "enforce", log)


def replay_sorted(rows: Iterable[tuple[int, int, int, str, str, int]],
                  info: Mapping[int, Admission], fleet: bool = False) -> Iterator[Denied]:
    """Replay several groups: ``rows`` are ``(g, t_us, kind, proxy, conn_id, key)`` sorted by
    ``g`` first, then as :func:`replay_group_rows` wants; each ``g`` is replayed alone."""
    cur: list[tuple[int, int, str, str, int]] = []
    g0 = None
    for g, t, kind, proxy, conn, key in rows:
        if g != g0 and cur:
            yield from replay_group_rows(cur, info, fleet)
            cur = []
        g0 = g
        cur.append((t, kind, proxy, conn, key))
    if cur:
        yield from replay_group_rows(cur, info, fleet)


# --------------------------------------------------------------------------------------------
# On Spark

_ROW_COLS = ("g", "t_us", "kind", "proxy", "conn_id", "key")


def denied_schema() -> Any:
    """The Spark schema of the replay's output (:class:`Denied`, ``ts`` as microseconds)."""
    from pyspark.sql import types as T

    s, long_ = T.StringType(), T.LongType()
    return T.StructType([T.StructField(n, long_ if n == "t_us" else s, True)
                         for n in Denied._fields])


def _arrow_part(info: Mapping[int, Admission], fleet: bool, batches: Iterator) -> Iterator:
    import pyarrow as pa

    def rows() -> Iterator[tuple]:
        for b in batches:
            yield from zip(*[b.column(c).to_pylist() for c in _ROW_COLS], strict=True)

    schema = pa.schema([(n, pa.int64() if n == "t_us" else pa.string())
                        for n in Denied._fields])
    out: list[Denied] = []
    for d in replay_sorted(rows(), info, fleet):
        out.append(d)
        if len(out) >= 65536:
            yield pa.RecordBatch.from_pylist([d._asdict() for d in out], schema=schema)
            out = []
    if out:
        yield pa.RecordBatch.from_pylist([d._asdict() for d in out], schema=schema)


def _rdd_part(info: Mapping[int, Admission], fleet: bool, it: Iterator) -> Iterator[tuple]:
    yield from (tuple(d) for d in replay_sorted((tuple(r) for r in it), info, fleet))


@dataclass(frozen=True)
class ReplayPlan:
    """What :func:`plan_replay` decided on the driver."""

    info: dict[int, Admission]
    """Decision per replay key (one per distinct key combination and Open hostname)."""
    group_of: dict[int, int]
    """Replay group number per key, for the keys whose group is replayed."""
    replayed: list[str]
    """The candidate vhosts replayed (the others cannot deny)."""


def plan_replay(policy: Policy, combos: Iterable[Mapping[str, Any]],
                peaks: Mapping[tuple[str, str, str], int], zero_length: set[int],
                fleet: bool = False) -> ReplayPlan:
    """Decide every key combination on the driver and choose the groups to replay.

    A group (candidate vhost, and proxy unless ``fleet``) is skipped only when it provably
    denies nothing: no key of it is denied before the counts, it has no connection rate,
    it takes its connections from one logged vhost only (so its counts are a subset of that
    vhost's observed ones), and the observed peaks (per proxy, or fleet-wide) of that vhost,
    of each of its users and of each of its hosts are within the candidate's limit (a host:
    the smallest per-host limit of the groups connecting from it); and no connection of it
    opened and closed at the same instant (such an attempt is checked against a count the
    sweep's peak does not show).

    Args:
        policy: the candidate policy.
        combos: one mapping per replay key: ``key`` (int), ``proxy``, ``vhost``, ``user``,
            ``remote_host``, ``hostname`` (may be None).
        peaks: ``(scope, vhost, key) -> observed peak`` (scope vhost, user, remote_host).
        zero_length: the keys with a connection opened and closed at the same instant.
        fleet: limits are fleet-wide (one group per vhost for every proxy).

    Returns:
        The plan.
    """
    info: dict[int, Admission] = {}
    decided: dict[tuple, Admission] = {}
    members: dict[tuple, list[int]] = {}
    rows = list(combos)
    for r in rows:
        seen = (r["hostname"], r["user"], r["remote_host"], r["vhost"])
        a = decided.get(seen)
        if a is None:
            a = decided[seen] = decide_open(policy, r["hostname"], r["user"], r["remote_host"],
                                         r["vhost"])
        info[int(r["key"])] = a
        gk = (a.scope,) if fleet else (a.scope, r["proxy"])
        members.setdefault(gk, []).append(int(r["key"]))
    group_of: dict[int, int] = {}
    replayed: set[str] = set()
    by_key = {int(r["key"]): r for r in rows}
    for n, (gk, keys) in enumerate(sorted(members.items(), key=lambda kv: str(kv[0])),
                                   start=1):
        if _must_replay([info[i] for i in keys], [by_key[i] for i in keys], peaks,
                        any(i in zero_length for i in keys)):
            for i in keys:
                group_of[i] = n
            replayed.add(gk[0])
    return ReplayPlan(info, group_of, sorted(replayed))


def _must_replay(adm: list[Admission], rows: list[Mapping[str, Any]],
                 peaks: Mapping[tuple[str, str, str], int], zero_length: bool) -> bool:
    if zero_length:
        return True
    logged = {r["vhost"] for r in rows}
    if len(logged) != 1:
        return True
    (lv,) = logged
    host_limit: dict[str, int] = {}
    for a in adm:
        if a.denied is not None:
            return True  # denied (or reported in shadow) whatever the counts
        v, g = a.vhost, a.group if a.group is not None else UNGROUPED
        if v is None:
            return False  # vhost policy off: nothing is counted, nothing denied
        if (v.max_connection_rate or g.max_connection_rate_per_user
                or g.max_connection_rate_per_host):
            return True
        per_user = v.max_connections_per_user if g.max_connections_per_user is None \
            else g.max_connections_per_user
        if peaks.get(("user", lv, a.user), 0) > per_user:
            return True
        per_host = v.max_connections_per_host if g.max_connections_per_host is None \
            else g.max_connections_per_host
        host_limit[a.remote_host] = min(per_host, host_limit.get(a.remote_host, per_host))
    v0 = adm[0].vhost
    if v0 is not None and peaks.get(("vhost", lv, lv), 0) > v0.max_connections:
        return True
    return any(peaks.get(("remote_host", lv, h), 0) > lim for h, lim in host_limit.items())


def replay(sweep: Sweep, events: DataFrame, policy: Policy, peaks: DataFrame,
           fleet: bool = False) -> tuple[DataFrame, list[str]]:
    """Replay the window under the candidate policy: every connection it would have denied.

    Args:
        sweep: from :func:`events.prepare_sweep` (its ``changes`` are the attempts and
            closes).
        events: the prepared events, with the ``auth_decision`` hostnames
            (``prepare_events(..., hostnames=True)``) when the log has them.
        policy: the candidate policy (``--whatif``).
        peaks: ``scope``, ``vhost``, ``key``, ``peak``: the observed peaks limits are
            compared with (per proxy for per-process limits, fleet-wide otherwise), for
            skipping the groups that cannot deny.
        fleet: the limits are fleet-wide (one shared ledger): replay per vhost across
            proxies instead of per (proxy, vhost).

    Returns:
        ``(denied, replayed)``: ``denied`` has the columns of :class:`Denied` with ``ts``
        (timestamp) instead of ``t_us``, one row per denied connection; ``replayed`` lists
        the candidate vhosts replayed. Runs two small driver collects (the key combinations
        with their hostnames, the observed peaks) and one query per use of ``denied``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from amqp_policy_proxy.eventlog import schema as ev
    from amqp_policy_proxy.spark_reports.common import local_table, micros_to_timestamp
    from amqp_policy_proxy.spark_reports.whatif import workers_have_pyarrow

    spark = sweep.changes.sparkSession
    names = (events.where(F.col("event") == ev.AUTH_DECISION)
             .where(F.col("hostname").isNotNull())
             .groupBy("proxy", "conn_id").agg(F.max("hostname").alias("hostname")))
    changes = sweep.changes.select("proxy", "conn_id", "vhost", "user", "remote_host",
                                   "t_us", "d").join(names, ["proxy", "conn_id"], "left")
    keycols = ["proxy", "vhost", "user", "remote_host", "hostname"]
    combos = [r.asDict() for r in changes.select(*keycols).distinct().collect()]
    for i, c in enumerate(combos):
        c["key"] = i
    zl = (events.where((F.col("event") == ev.CONNECTION_CLOSED)
                       & (F.col("opened_us") == F.col("t_us"))
                       & (F.col("t_us") >= sweep.window.start_us)
                       & (F.col("t_us") < sweep.window.end_us))
          .select("proxy", "conn_id", "vhost", "user", "remote_host")
          .join(names, ["proxy", "conn_id"], "left").select(*keycols).distinct().collect())
    index = {tuple(c[k] for k in keycols): c["key"] for c in combos}
    zero = {index[tuple(r[k] for k in keycols)] for r in zl
            if tuple(r[k] for k in keycols) in index}
    pk = {(r["scope"], r["vhost"], r["key"]): int(r["peak"] or 0) for r in peaks.collect()}
    plan = plan_replay(policy, combos, pk, zero, fleet)
    key_schema = T.StructType([T.StructField(n, T.StringType()) for n in keycols]
                              + [T.StructField("key", T.LongType()),
                                 T.StructField("g", T.LongType())])
    table = local_table(spark, [(*(c[k] for k in keycols), c["key"], plan.group_of[c["key"]])
                                for c in combos if c["key"] in plan.group_of], key_schema)
    kind = F.when(F.col("d") > 0, F.lit(1)).otherwise(F.lit(0))
    rows = changes.join(F.broadcast(table), [changes[c].eqNullSafe(table[c]) for c in keycols]
                        ).select("g", "t_us", kind.alias("kind"), changes["proxy"],
                                 "conn_id", "key")
    ordered = (rows.repartition("g")
               .sortWithinPartitions("g", "t_us", "kind", "proxy", F.length("conn_id"),
                                     "conn_id")
               .select(*_ROW_COLS))
    schema = denied_schema()
    info, fl = plan.info, fleet
    if workers_have_pyarrow(spark):
        out = ordered.mapInArrow(functools.partial(_arrow_part, info, fl), schema)
    else:
        out = spark.createDataFrame(
            ordered.rdd.mapPartitions(functools.partial(_rdd_part, info, fl)), schema)
    cols = [micros_to_timestamp(F.col("t_us")).alias("ts")] + [
        F.col(n) for n in Denied._fields if n != "t_us"]
    return out.select(*cols), plan.replayed


def denied_totals(denied: DataFrame) -> DataFrame:
    """Totals of the replay: denied connections per ``vhost``, ``reason`` and
    ``enforcement`` (``enforce``, or ``shadow`` for would-be denials a shadow group lets
    through), with the ``limit`` text of the first of them."""
    from pyspark.sql import functions as F

    return denied.groupBy("vhost", "reason", "enforcement").agg(
        F.count(F.lit(1)).alias("denied"), F.min("limit").alias("limit"))


def whatif_keys(denied: DataFrame) -> DataFrame:
    """The ``whatif`` contract table from the denied connections: ``vhost``, ``scope``,
    ``key``, ``would_deny``: per key, the connections denied under a limit of its scope
    (:data:`REASON_SCOPE`; enforced denials only)."""
    from pyspark.sql import functions as F

    scope = F.create_map(*[F.lit(x) for kv in REASON_SCOPE.items() for x in kv])[F.col("reason")]
    key = (F.when(scope == "vhost", F.col("vhost"))
           .when(scope == "user", F.col("user")).otherwise(F.col("remote_host")))
    return (denied.where(F.col("enforcement") == "enforce")
            .select("vhost", scope.alias("scope"), key.alias("key"))
            .groupBy("vhost", "scope", "key").agg(F.count(F.lit(1)).alias("would_deny")))
