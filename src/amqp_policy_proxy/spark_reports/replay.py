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

1. On the driver, ``approve_open``'s three lookups under the candidate policy, each once per
   distinct value of the window (:class:`OpenLookups`): the vhost per Open hostname, the
   group per (hostname, user), the group's ``remoteHosts`` per (group, host); each outcome
   is worded once by ``decisions.open_outcome``, the daemon's own code. It either denies
   (``no_vhost``, ``unknown_user``, ``remote_host``, whatever the counts) or names the vhost
   and group. Spark gives every connection its outcome with two broadcast joins; the
   driver never holds a row per (user, host) pair (millions in a large log). The Open
   hostname is the one of the connection's ``auth_decision`` record (event log schema 2
   on); a connection without one (schema 1) asks for the vhost name it was admitted to.
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
all (:func:`plan_groups`, decided in Spark).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Iterator, Mapping
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


def replay_group_rows(rows: Iterable[tuple[int, int, str, str, Hashable]],
                      info: Mapping[Any, Admission], fleet: bool = False) -> Iterator[Denied]:
    """Replay the attempts of one replay group through the daemon's ledger and rate buckets.

    Args:
        rows: ``(t_us, kind, proxy, conn_id, key)`` sorted by ``(t_us, kind, proxy,
            len(conn_id), conn_id)``: closes (kind 0) before opens (kind 1) at one instant;
            ``key`` indexes ``info``. All rows of one candidate vhost (and one proxy unless
            ``fleet``).
        info: the decision per key (:func:`decide_open`; on the executors an
            :class:`Admissions` keyed by outcome, user, host and logged vhost).
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


def replay_sorted(rows: Iterable[tuple[int, int, int, str, str, Hashable]],
                  info: Mapping[Any, Admission], fleet: bool = False) -> Iterator[Denied]:
    """Replay several groups: ``rows`` are ``(g, t_us, kind, proxy, conn_id, key)`` sorted by
    ``g`` first, then as :func:`replay_group_rows` wants; each ``g`` is replayed alone."""
    cur: list[tuple[int, int, str, str, Hashable]] = []
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
# The decisions before the counts, made once per lookup (on the driver)

#: Stand-ins for the user and the host in an outcome's log text, filled in per connection on
#: the executors (:func:`fill_log`); NUL-delimited, so no policy name produces them.
USER_MARK = "\x00user\x00"
HOST_MARK = "\x00rhost\x00"


def fill_log(text: str, user: str, remote_host: str) -> str:
    """An outcome's log text (:data:`USER_MARK`, :data:`HOST_MARK` in it) for one connection;
    the user's and host's own text is never searched for marks."""
    if not text:
        return text
    return user.join(remote_host.join(part.split(HOST_MARK)) for part in text.split(USER_MARK))


class Outcome(NamedTuple):
    """One outcome of ``approve_open`` under the candidate policy, for any user and host that
    reach it: an :class:`Admission` without the connection's names (``log`` has the marks of
    :func:`fill_log`), and what the replay plan reads of it."""

    scope: str
    vhost: ReplayVhost | None
    group: ReplayGroup | None
    denied: str | None
    rule: str
    log: str
    shadow: bool
    count_rules: Mapping[str, str]

    def admission(self, user: str, remote_host: str, logged_vhost: str | None) -> Admission:
        """The decision for one connection of the log (as :func:`decide_open` makes it)."""
        return Admission(self.scope, self.vhost, self.group, self.denied, self.rule,
                         fill_log(self.log, user, remote_host), self.shadow, user, remote_host,
                         logged_vhost, self.count_rules)

    def limits(self) -> tuple[int, int, int, int, int, int]:
        """``(denied, no_vhost_or_off, rated, per_user, per_host, max_connections)`` as the
        plan compares them with the observed peaks (0/1 flags; the limits of the group, else
        its vhost's; 0 for an outcome without a vhost)."""
        v, g = self.vhost, self.group if self.group is not None else UNGROUPED
        if v is None:
            return (int(self.denied is not None), 1, 0, 0, 0, 0)
        rated = bool(v.max_connection_rate or g.max_connection_rate_per_user
                     or g.max_connection_rate_per_host)
        per_user = (v.max_connections_per_user if g.max_connections_per_user is None
                    else g.max_connections_per_user)
        per_host = (v.max_connections_per_host if g.max_connections_per_host is None
                    else g.max_connections_per_host)
        return (int(self.denied is not None), 0, int(rated), per_user, per_host,
                v.max_connections)


class Admissions(dict[tuple[int, str, str, str | None], Admission]):
    """``(outcome id, user, remote host, logged vhost) -> Admission``, built from the
    outcomes on first use (what :func:`replay_group_rows` reads as ``info`` on the
    executors); at most :data:`ADMISSIONS_KEPT` are kept, so a task's memory does not grow
    with its distinct users and hosts."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        super().__init__()
        self.outcomes = outcomes

    def __missing__(self, key: tuple[int, str, str, str | None]) -> Admission:
        if len(self) >= ADMISSIONS_KEPT:
            self.clear()
        a = self[key] = self.outcomes[key[0]].admission(key[1], key[2], key[3])
        return a


#: Admissions an executor task keeps built (:class:`Admissions`).
ADMISSIONS_KEPT = 100_000


class OpenLookups:
    """The candidate policy's Open decisions for a log, from its three lookups made once per
    distinct value: ``resolve_vhost`` per Open hostname, ``resolve_group`` per (hostname,
    user), the group's ``remoteHosts`` per (group, host), then ``decisions.open_outcome``
    (the daemon's own wording) per outcome. A connection's decision is then two broadcast
    joins in Spark (:meth:`attach`), not a per-connection table on the driver: the distinct
    (user, host) pairs of a large log run to millions, its users and hosts to thousands.

    Args:
        policy: the candidate policy.
        asked_users: the distinct (asked hostname, user) of the log.
        asked_hosts: the distinct (asked hostname, remote host) of the log.
    """

    def __init__(self, policy: Policy, asked_users: Iterable[tuple[str, str]],
                 asked_hosts: Iterable[tuple[str, str]]) -> None:
        from amqp_policy_proxy.policy import decisions
        from amqp_policy_proxy.policy.lookup import resolve_group, resolve_vhost

        self.outcomes: list[Outcome] = []
        self._outcome_ids: dict[tuple, int] = {}
        self.user_rows: list[tuple[str, str, int]] = []
        """``(asked, user, lookup id)``: a lookup id per (hostname, group, how it matched)."""
        self.host_rows: list[tuple[int, str, int]] = []
        """``(lookup id, remote host, outcome id)``."""
        on = policy.settings.enable_vhost_policy
        vmatch: dict[str, Any] = {}
        groups: dict[tuple, int] = {}
        members: dict[int, tuple[str, Any, Any]] = {}
        for asked, user in asked_users:
            if asked not in vmatch:
                vmatch[asked] = resolve_vhost(policy, asked) if on else None
            vm = vmatch[asked]
            gm = resolve_group(vm.vhost, user) if vm is not None else None
            gk = (asked, None if gm is None else (gm.group.name, gm.how))
            lid = groups.get(gk)
            if lid is None:
                lid = groups[gk] = len(groups)
                members[lid] = (asked, vm, gm)
            self.user_rows.append((asked, user, lid))
        hosts: dict[str, list[str]] = {}
        for asked, host in asked_hosts:
            hosts.setdefault(asked, []).append(host)
        matched: dict[tuple[int, str], bool] = {}  # (group, host) -> remoteHosts match
        for lid, (asked, vm, gm) in members.items():
            for host in hosts.get(asked, ()):
                ok = False
                if gm is not None:
                    mk = (id(gm.group), host)
                    if mk not in matched:
                        matched[mk] = gm.group.remote_hosts.matches(host)
                    ok = matched[mk]
                self.host_rows.append((lid, host, self._outcome(
                    policy, decisions, on, asked, vm, gm, ok)))

    def _outcome(self, policy: Policy, decisions: Any, on: bool, asked: str, vm: Any, gm: Any,
                 ok: bool) -> int:
        key = (asked, None if gm is None else (gm.group.name, gm.how), ok)
        oid = self._outcome_ids.get(key)
        if oid is not None:
            return oid
        if not on:  # only the global limit applies
            out = Outcome(asked, None, None, None, "", "", False, {})
        else:
            d = decisions.open_outcome(policy, asked, vm, gm, ok, USER_MARK, HOST_MARK)
            out = _outcome_of(d, asked, decisions)
        oid = self._outcome_ids[key] = len(self.outcomes)
        self.outcomes.append(out)
        return oid

    def attach(self, df: DataFrame) -> DataFrame:
        """``df`` (``hostname``, ``vhost``, ``user``, ``remote_host``, ...) with ``u`` and
        ``h`` (the user and host, ``""`` for none), ``oid`` (its outcome) and ``scope`` (the
        replay group's vhost); rows whose names were not looked up are dropped."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from amqp_policy_proxy.spark_reports.common import local_table

        spark = df.sparkSession
        s, long_ = T.StringType(), T.LongType()
        users = local_table(spark, self.user_rows, T.StructType(
            [T.StructField("asked", s), T.StructField("u", s), T.StructField("lid", long_)]))
        hosts = local_table(spark, self.host_rows, T.StructType(
            [T.StructField("lid", long_), T.StructField("h", s), T.StructField("oid", long_)]))
        scopes = local_table(spark, [(i, o.scope) for i, o in enumerate(self.outcomes)],
                             T.StructType([T.StructField("oid", long_),
                                           T.StructField("scope", s)]))
        return (df.withColumn("asked", _asked())
                .withColumn("u", F.coalesce(F.col("user"), F.lit("")))
                .withColumn("h", F.coalesce(F.col("remote_host"), F.lit("")))
                .join(F.broadcast(users), ["asked", "u"])
                .join(F.broadcast(hosts), ["lid", "h"])
                .join(F.broadcast(scopes), ["oid"]))


def _asked() -> Any:
    """The hostname an Open asked for: the ``auth_decision``'s, else (schema 1) the vhost
    it was admitted to (as :func:`decide_open`)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.col("hostname"), F.col("vhost"), F.lit(""))


def _outcome_of(d: Any, asked: str, decisions: Any) -> Outcome:
    """An :class:`Outcome` from ``open_outcome``'s answer (as :func:`decide_open` maps it)."""
    from amqp_policy_proxy.policy.keys import SHADOW
    from amqp_policy_proxy.policy.model import GroupSettings

    vhost = None if d.vhost is None else replay_vhost(d.vhost)
    group = None if d.group is None else replay_group(d.group)
    scope_obj: Any = d.group if d.group is not None else d.vhost
    shadow = scope_obj is not None and scope_obj.enforcement is SHADOW
    name = d.vhost.hostname if d.vhost is not None else asked
    rules: dict[str, str] = {}
    if d.vhost is not None:
        g = d.group if d.group is not None else GroupSettings(name="")  # UNGROUPED
        rules = {str(r): decisions.count_rule(r, d.vhost, g) for r in _COUNT_REASONS}
    if isinstance(d, decisions.OpenDenied):
        return Outcome(name, vhost, group, str(d.reason), d.rule, d.log, shadow, rules)
    return Outcome(name, vhost, group, None, "", "", shadow, rules)


# --------------------------------------------------------------------------------------------
# On Spark

_ROW_COLS = ("g", "t_us", "kind", "proxy", "conn_id", "oid", "u", "h", "vhost")


def denied_schema() -> Any:
    """The Spark schema of the replay's output (:class:`Denied`, ``ts`` as microseconds)."""
    from pyspark.sql import types as T

    s, long_ = T.StringType(), T.LongType()
    return T.StructType([T.StructField(n, long_ if n == "t_us" else s, True)
                         for n in Denied._fields])


def _keyed(rows: Iterable[tuple]) -> Iterator[tuple[int, int, int, str, str, tuple]]:
    """``(g, t_us, kind, proxy, conn_id, (oid, user, host, logged vhost))`` from the rows of
    :data:`_ROW_COLS`."""
    for g, t, kind, proxy, conn, oid, u, h, lv in rows:
        yield g, t, kind, proxy, conn, (oid, u, h, lv)


def _arrow_part(outcomes: list[Outcome], fleet: bool, batches: Iterator) -> Iterator:
    import pyarrow as pa

    def rows() -> Iterator[tuple]:
        for b in batches:
            yield from zip(*[b.column(c).to_pylist() for c in _ROW_COLS], strict=True)

    schema = pa.schema([(n, pa.int64() if n == "t_us" else pa.string())
                        for n in Denied._fields])
    out: list[Denied] = []
    for d in replay_sorted(_keyed(rows()), Admissions(outcomes), fleet):
        out.append(d)
        if len(out) >= 65536:
            yield pa.RecordBatch.from_pylist([d._asdict() for d in out], schema=schema)
            out = []
    if out:
        yield pa.RecordBatch.from_pylist([d._asdict() for d in out], schema=schema)


def _rdd_part(outcomes: list[Outcome], fleet: bool, it: Iterator) -> Iterator[tuple]:
    yield from (tuple(d) for d in replay_sorted(_keyed(tuple(r) for r in it),
                                                Admissions(outcomes), fleet))


def plan_groups(rows: DataFrame, zero: DataFrame, lookups: OpenLookups, peaks: DataFrame,
                fleet: bool = False) -> dict[tuple[str, str], bool]:
    """Which replay groups must be replayed, decided in Spark; one small collect (a row per
    group).

    A group (candidate vhost, and proxy unless ``fleet``) is skipped only when it provably
    denies nothing: no connection of it is denied before the counts, it has no connection
    rate, it takes its connections from one logged vhost only (so its counts are a subset of
    that vhost's observed ones), and the observed peaks (per proxy, or fleet-wide) of that
    vhost, of each of its users and of each of its hosts are within the candidate's limit (a
    host: the smallest per-host limit of the groups connecting from it); and no connection
    of it opened and closed at the same instant (such an attempt is checked against a count
    the sweep's peak does not show). A group whose vhost policy is off denies nothing.

    Args:
        rows: the changes with :meth:`OpenLookups.attach`'s columns.
        zero: the connections opened and closed at one instant, attached likewise.
        lookups: whose outcomes ``oid`` numbers.
        peaks: ``scope``, ``vhost``, ``key``, ``peak`` (scope vhost, user, remote_host).
        fleet: limits are fleet-wide (one group per vhost for every proxy).

    Returns:
        ``(scope, proxy or "") -> must replay`` for every group of ``rows``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from amqp_policy_proxy.spark_reports.common import local_table

    spark = rows.sparkSession
    long_ = T.LongType()
    cols = ["oid", "denied", "nolimits", "rated", "per_user", "per_host", "vmax"]
    limits = local_table(spark, [(i, *o.limits()) for i, o in enumerate(lookups.outcomes)],
                         T.StructType([T.StructField(c, long_) for c in cols]))
    gp = F.lit("") if fleet else F.col("proxy")
    gk = ["scope", "gp"]
    # the opens carry every (outcome, user, host, logged vhost) of a group: closes repeat them
    keys = (rows.where(F.col("d") > 0)
            .select("scope", gp.alias("gp"), "oid", "u", "h", F.col("vhost").alias("lv"))
            .join(F.broadcast(limits), ["oid"]))

    def peak(scope: str, name: str) -> DataFrame:
        return F.broadcast(peaks.where(F.col("scope") == scope).select(
            F.col("vhost").alias("lv"), F.col("key").alias(name),
            F.coalesce(F.col("peak"), F.lit(0)).cast("long").alias(f"{scope}_peak")))

    # every aggregation below meets few groups: Spark aggregates each partition first
    over_user = F.coalesce(F.col("user_peak"), F.lit(0)) > F.col("per_user")
    groups = (keys.join(peak("user", "u"), ["lv", "u"], "left").groupBy(*gk).agg(
        F.collect_set(F.coalesce(F.col("lv"), F.lit("\x00"))).alias("logged"),
        F.first("lv", ignorenulls=True).alias("lv"),
        F.max("denied").alias("denied"), F.max("nolimits").alias("nolimits"),
        F.max("rated").alias("rated"), F.max("vmax").alias("vmax"),
        F.max(over_user.cast("int")).alias("user_over")))
    vpeaks = peaks.where((F.col("scope") == "vhost") & (F.col("key") == F.col("vhost")))
    groups = groups.join(F.broadcast(vpeaks.select(F.col("vhost").alias("lv"), F.coalesce(
        F.col("peak"), F.lit(0)).cast("long").alias("vhost_peak"))), ["lv"], "left")
    hosts = (keys.groupBy(*gk, "lv", "h").agg(F.min("per_host").alias("per_host"))
             .join(peak("remote_host", "h"), ["lv", "h"], "left")
             .where(F.coalesce(F.col("remote_host_peak"), F.lit(0)) > F.col("per_host"))
             .select(*gk).distinct().withColumn("host_over", F.lit(1)))
    zl = zero.select("scope", gp.alias("gp")).distinct().withColumn("zero", F.lit(1))
    out = {}
    for r in (groups.join(hosts, gk, "left").join(zl, gk, "left").collect()):
        must = bool(r["zero"]) or len(r["logged"]) != 1 or bool(r["denied"]) or (
            not r["nolimits"] and bool(
                r["rated"] or r["user_over"] or r["host_over"]
                or (r["vhost_peak"] or 0) > r["vmax"]))
        out[(r["scope"], r["gp"])] = must
    return out


def replay(sweep: Sweep, events: DataFrame, policy: Policy, peaks: DataFrame,
           fleet: bool = False, release: list[DataFrame] | None = None,
           ) -> tuple[DataFrame, list[str]]:
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
        release: where to put the cached table ``denied`` reads (the changes with their
            Open hostnames), for the caller to ``unpersist`` once it used ``denied``; without
            it the cache is dropped before returning and each use of ``denied`` joins the
            hostnames again.

    Returns:
        ``(denied, replayed)``: ``denied`` has the columns of :class:`Denied` with ``ts``
        (timestamp) instead of ``t_us``, one row per denied connection; ``replayed`` lists
        the candidate vhosts replayed. The driver collects the distinct (hostname, user) and
        (hostname, host) of the window and one row per replay group, whatever the log's
        size; then one query per use of ``denied``.
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
    changes = (sweep.changes.select("proxy", "conn_id", "vhost", "user", "remote_host",
                                    "t_us", "d")
               .join(names, ["proxy", "conn_id"], "left").persist())
    # the distinct (hostname, user) and (hostname, host) of the window, in one job
    asked = _asked().alias("asked")
    opens = changes.where(F.col("d") > 0)
    pairs = (opens.select(F.lit(0).alias("kind"), asked,
                          F.coalesce(F.col("user"), F.lit("")).alias("name"))
             .union(opens.select(F.lit(1).alias("kind"), asked,
                                 F.coalesce(F.col("remote_host"), F.lit("")).alias("name")))
             .distinct().collect())
    lookups = OpenLookups(policy, [(r[1], r[2]) for r in pairs if r[0] == 0],
                          [(r[1], r[2]) for r in pairs if r[0] == 1])
    rows = lookups.attach(changes)
    zero = lookups.attach(
        events.where((F.col("event") == ev.CONNECTION_CLOSED)
                     & (F.col("opened_us") == F.col("t_us"))
                     & (F.col("t_us") >= sweep.window.start_us)
                     & (F.col("t_us") < sweep.window.end_us))
        .select("proxy", "conn_id", "vhost", "user", "remote_host")
        .join(names, ["proxy", "conn_id"], "left"))
    plan = plan_groups(rows, zero, lookups, peaks, fleet)
    chosen = sorted(k for k, must in plan.items() if must)
    replayed = sorted({scope for scope, _ in chosen})
    schema = denied_schema()
    cols = [micros_to_timestamp(F.col("t_us")).alias("ts")] + [
        F.col(n) for n in Denied._fields if n != "t_us"]
    if release is None or not chosen:
        changes.unpersist()
    else:
        release.append(changes)
    if not chosen:  # nothing can deny: no replay query at all
        return local_table(spark, [], schema).select(*cols), replayed
    table = local_table(spark, [(scope, gp, n) for n, (scope, gp) in enumerate(chosen, 1)],
                        T.StructType([T.StructField("scope", T.StringType()),
                                      T.StructField("gp", T.StringType()),
                                      T.StructField("g", T.LongType())]))
    kind = F.when(F.col("d") > 0, F.lit(1)).otherwise(F.lit(0))
    gp = F.lit("") if fleet else F.col("proxy")
    opened = F.col("kind") == 1  # a close needs no names: fewer bytes to shuffle
    ordered = (rows.withColumn("gp", gp).join(F.broadcast(table), ["scope", "gp"])
               .withColumn("kind", kind)
               .select("g", "t_us", "kind", "proxy", "conn_id", "oid",
                       *[F.when(opened, F.col(c)).alias(c) for c in ("u", "h", "vhost")])
               .repartition("g")
               .sortWithinPartitions("g", "t_us", "kind", "proxy", F.length("conn_id"),
                                     "conn_id")
               .select(*_ROW_COLS))
    outcomes, fl = lookups.outcomes, fleet
    if workers_have_pyarrow(spark):
        out = ordered.mapInArrow(functools.partial(_arrow_part, outcomes, fl), schema)
    else:
        out = spark.createDataFrame(
            ordered.rdd.mapPartitions(functools.partial(_rdd_part, outcomes, fl)), schema)
    return out.select(*cols), replayed


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
