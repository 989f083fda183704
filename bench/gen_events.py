#!/usr/bin/env python3
"""Write a realistic synthetic connection event log for a fleet of proxies.

Bench tooling, not part of the package. Writes the partitioned layout of the event log (docs/observability.md),
``DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl``, one file per proxy and hour, each
file in ``ts`` order, and streams hour by hour (memory holds only the connections still open
and the current hour's lines).

The model, per proxy fleet:

- ``--users`` users spread over six vhosts (``iot`` has half of them) and three groups
  (``devices`` 81 %, ``services`` 15 %, ``admins`` 4 %). User activity is Zipf-like, so a
  few users open many connections.
- ``--hosts`` client IPs; users map to hosts with a skew, so a few hosts are NAT gateways
  shared by many users.
- Diurnal load (quiet at 03:00 UTC, busy at 14:00 UTC, weekends at 60 %) plus reconnect
  storms: about one 5-minute burst a day where devices reconnect at 8x the rate with short
  connections and a much higher denial rate.
- Each proxy enforces the limits of :func:`fleet_policy` on its own connections, as the daemon
  does: ``vhost_limit``, ``user_limit`` and ``host_limit`` denials happen when a limit is
  really reached (mostly in bursts and for the busiest users and NAT hosts), so per-proxy
  peaks never exceed the limits. The other reasons are drawn at random (3 % of attempts).
  Link, session and message denials and protocol errors happen inside connections; one
  ``policy_reloaded`` per proxy and day.
- ``connection_closed`` with its duration, bytes and transfers (lognormal, scaled with the
  duration), session/link high-water marks and a close reason. Service connections live for
  hours; some were already open before the log starts (their close carries an ``opened_ts``
  before the first record); connections open at the end have no close.
- Planted for the report's tests (all off by default): ``--storm-at`` a connection storm
  (``--storm-size`` connection attempts within ``--storm-seconds`` to vhost ``iot``, from
  one client host, :data:`STORM_HOST`, by ``--storm-users`` users ``storm-NN``, each
  connection a few seconds long); ``--over-limit-user`` a tenant of ``--over-limit-vhost``
  that tries to hold ``--over-limit-factor`` times its per-user limit (hour-long
  connections), so the proxies deny the excess (``user_limit``); ``--growth`` a trend: the
  arrival rate grows by that many percent per week (compounded hourly).
- ``conn_id`` counters are per proxy process and start at 1 on each, so conn_ids repeat across
  proxies, as the Spark job must handle.
- Schema 4 (the default, as the daemon writes it: a ``proxy_info`` line, ledger ``local``,
  at the top of every file; 3 and 2 write the rest with that number): an ``auth_decision`` for every Open decision
  (admitted or denied at the Open), a few ``shadow_denied`` links (0.5 % of connections) and
  one ``admin_action`` per proxy and day. ``--schema-version 1`` writes the older mix (no
  audit records), whose figures bench/README.md reports for earlier runs: at the same
  ``--events``, schema 2 has about a third fewer connections.

The number of events is approximately ``--events`` (within about 1 %) plus the planted
storm's and tenant's, which come on top (the fleet's own traffic is not cut to make room
for them); the exact count is printed. ``--policy-out`` also writes a QDR policy file
matching the generated fleet.

Usage::

    python bench/gen_events.py --out /tmp/events --events 10000000 --users 5000 \
        --hosts 2000 --days 7 --proxies 4 --seed 1
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import heapq
import json
import math
import os
import random
import sys
import time
from collections import Counter, defaultdict

VHOSTS: tuple[tuple[str, float], ...] = (
    ("iot", 0.50),
    ("telemetry", 0.20),
    ("billing", 0.10),
    ("orders", 0.10),
    ("ops", 0.05),
    ("partners", 0.05),
)
GROUPS: tuple[tuple[str, float], ...] = (
    ("devices", 0.81),
    ("services", 0.15),
    ("admins", 0.04),
)
#: Median connection duration (seconds) and lognormal sigma per group.
DURATION = {"devices": (300.0, 1.6), "services": (6 * 3600.0, 1.0), "admins": (600.0, 1.2)}
#: Reasons drawn at random; the limit reasons come from enforcing the policy.
DENIAL_REASONS: tuple[tuple[str, float], ...] = (
    ("unknown_user", 0.30),
    ("remote_host", 0.25),
    ("handshake_timeout", 0.20),
    ("no_vhost", 0.15),
    ("global_limit", 0.10),
)
DENIAL_TEXT = {
    "global_limit": ("", ""),
    "no_vhost": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "unknown_user": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "remote_host": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "vhost_limit": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "user_limit": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "host_limit": ("amqp:resource-limit-exceeded", "connection disallowed by local policy"),
    "handshake_timeout": ("amqp:connection:forced", "handshake timeout"),
}
CLOSE_REASONS: tuple[tuple[str, float], ...] = (
    ("client_close", 0.86),
    ("broker_close", 0.05),
    ("timeout", 0.05),
    ("shutdown", 0.02),
    ("upstream_unavailable", 0.01),
    ("internal_error", 0.01),
)
#: Per admitted connection: probability of one extra event of each kind.
P_LINK_DENIED = 0.04
P_SESSION_DENIED = 0.01
P_MESSAGE_DENIED = 0.01
P_PROTOCOL_ERROR = 0.005
P_SHADOW = 0.005
P_DENIED = 0.03
#: Schema 3: per attempt, a failed login (no connection follows); per admitted connection, a
#: link a reload revoked.
P_SASL_FAILED = 0.004
P_REVOKED = 0.002
#: Schema 4: the share of connections that renew a token in-band (a ``token_renewed``
#: record), drawn from a random stream of its own so the rest of a seeded log is unchanged.
P_TOKEN_RENEWED = 0.002
BURST_FACTOR = 8.0
BURST_MINUTES = 5
#: The client host of a planted storm (``--storm-at``), and the vhost it connects to.
STORM_HOST = "10.250.0.1"
STORM_VHOST = "iot"
#: The group of the planted storm's users and of the over-limit tenant (``*`` members).
PLANTED_GROUP = "devices"
#: Median connection duration (seconds) of a storm's connections and of the tenant's.
STORM_DURATION = 3.0
TENANT_DURATION = 3600.0
#: Arrival kinds.
_NORMAL, _BURST, _STORM, _TENANT = range(4)

MS_HOUR = 3_600_000
MS_DAY = 24 * MS_HOUR


def _cdf(weights: list[float]) -> list[float]:
    total = sum(weights)
    acc = 0.0
    out = []
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out


def _pick(cdf: list[float], items: tuple, u: float):
    return items[bisect.bisect_left(cdf, u)]


def diurnal(hour_of_day: int, weekday: int) -> float:
    """Relative arrival rate for an hour (UTC).

    Args:
        hour_of_day: 0..23.
        weekday: 0 (Monday) .. 6 (Sunday).

    Returns:
        A positive weight: a cosine between 0.15 at 03:00 and 1.0 at 15:00, times 0.6 at
        weekends.
    """
    base = 0.575 - 0.425 * math.cos((hour_of_day - 3) / 24.0 * 2 * math.pi)
    return base * (0.6 if weekday >= 5 else 1.0)


class Fleet:
    """The synthetic population: users, hosts, vhosts and groups, fixed by the seed."""

    def __init__(self, users: int, hosts: int, rng: random.Random) -> None:
        vh_cdf = _cdf([w for _, w in VHOSTS])
        gr_cdf = _cdf([w for _, w in GROUPS])
        vh_names = tuple(v for v, _ in VHOSTS)
        gr_names = tuple(g for g, _ in GROUPS)
        self.host_ips = [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(hosts)]
        self.users: list[tuple[str, str, str, int]] = []  # name, vhost, group, host index
        weights = []
        for i in range(users):
            vhost = _pick(vh_cdf, vh_names, rng.random())
            group = _pick(gr_cdf, gr_names, rng.random())
            # Squared uniform: low host indexes (NAT gateways) get many users.
            host = min(hosts - 1, int(hosts * rng.random() ** 2))
            self.users.append((f"u{i:06d}", vhost, group, host))
            # Zipf-like activity; services reconnect rarely but hold connections long.
            w = 1.0 / (i + 10) ** 0.8 + 0.01
            weights.append(w * (0.3 if group == "services" else 1.0))
        self.user_cdf = _cdf(weights)
        self.device_idx = [i for i, u in enumerate(self.users) if u[2] == "devices"] or [0]


def _ts_formatter():
    """Return ``fmt(ms) -> 'YYYY-MM-DDTHH:MM:SS.mmmZ'`` with a per-minute prefix cache."""
    cache: dict[int, str] = {}

    def fmt(ms: int) -> str:
        minute, rest = divmod(ms, 60_000)
        prefix = cache.get(minute)
        if prefix is None:
            if len(cache) > 100_000:
                cache.clear()
            d = dt.datetime.fromtimestamp(minute * 60, tz=dt.UTC)
            prefix = d.strftime("%Y-%m-%dT%H:%M:")
            cache[minute] = prefix
        sec, milli = divmod(rest, 1000)
        return f"{prefix}{sec:02d}.{milli:03d}Z"

    return fmt


def _j(s: str | None) -> str:
    return "null" if s is None else json.dumps(s)


COMMON = ('{"schema_version":%d,"event":"%s","ts":"%s","conn_id":"%s","vhost":%s,"group":%s,'
          '"user":%s,"remote_host":"%s","listener":"0.0.0.0:5672"')
OPENED = COMMON + "}\n"
CLOSED = (COMMON + ',"opened_ts":"%s","duration_seconds":%.3f,"bytes_in":%d,"bytes_out":%d,'
          '"transfers_in":%d,"transfers_out":%d,"max_sessions":%d,"max_senders":%d,'
          '"max_receivers":%d,"close_reason":"%s"}\n')
DENIED = COMMON + ',"reason":"%s","condition":"%s","description":"%s"}\n'
LINK = COMMON + ',"role":"%s","address":"%s","reason":"%s"}\n'
MESSAGE = COMMON + ',"address":"%s","reason":"%s","size":%d}\n'
PROTO = COMMON + ',"side":"%s","condition":"%s","description":"%s"}\n'
RELOAD = ('{"schema_version":%d,"event":"policy_reloaded","ts":"%s","conn_id":"","vhost":null,'
          '"group":null,"user":null,"remote_host":null,"listener":null,"digest":"%s",'
          '"result":"ok","issues":[]}\n')
DECIDED = COMMON + ',"decision":"%s","reason":%s,"enforcement":"enforce","rule":"%s",' \
    '"hostname":%s}\n'
SHADOW = COMMON + ',"kind":"link","reason":"target","role":"sender","address":"%s"}\n'
SASL = ('{"schema_version":%d,"event":"sasl_failed","ts":"%s","conn_id":"%s","vhost":null,'
        '"group":null,"user":%s,"remote_host":"%s","listener":"0.0.0.0:5672","mechanism":"PLAIN",'
        '"reason":"auth","code":1}\n')
REVOKED = COMMON + ',"kind":"link","reason":"target","mode":"enforce","role":"sender",' \
    '"address":"%s"}\n'
RENEWED = COMMON + ',"node":"$cbs","result":"accepted","reason":""}\n'
ADMIN = ('{"schema_version":%d,"event":"admin_action","ts":"%s","conn_id":"","vhost":"%s",'
         '"group":null,"user":null,"remote_host":null,"listener":null,"action":"%s","uid":0,'
         '"pid":%d,"peer":"unix","selector":"vhost=%s","targets":["%s"],"result":"ok",'
         '"count":0,"description":""}\n')
#: Schema 4: the first line of every file, as the daemon's sink writes it. The generated
#: proxies enforce their limits each on its own (no ledger): ``local``.
PROXY_INFO = ('{"schema_version":%d,"event":"proxy_info","ts":"%s","conn_id":"","vhost":null,'
              '"group":null,"user":null,"remote_host":null,"listener":null,"ledger":"local",'
              '"fleet":null,"proxy_id":""}\n')


def generate(out: str, events: int, users: int, hosts: int, days: int, proxies: int,
             seed: int, start: dt.date, limit_scale: float = 1.0,
             schema_version: int = 4, storm_at_ms: int | None = None, storm_size: int = 3000,
             storm_seconds: int = 60, storm_users: int = 20, over_limit_user: str | None = None,
             over_limit_vhost: str = "billing", over_limit_factor: float = 2.0,
             growth: float = 0.0) -> int:
    """Write the event log and return the number of events written.

    Args:
        out: root directory of the partitioned layout (created).
        events: target number of the fleet's events (approximate, within about 1 %); the
            planted storm's and tenant's come on top.
        users: number of distinct users.
        hosts: number of distinct client IPs.
        days: length of the log in days, starting at ``start`` 00:00 UTC.
        proxies: number of proxy processes (one file per proxy and hour).
        seed: random seed; the same arguments give the same files.
        start: first UTC day of the log.
        limit_scale: multiplies the limits each proxy enforces (see :func:`fleet_policy`).
        schema_version: the ``schema_version`` the records carry; 2 or later writes the
            audit records too (``auth_decision``, ``shadow_denied``, ``admin_action``); 1 the
            older mix. Version 3 adds event types (``sasl_failed``, ``revoked``); version 4
            (the default, what the daemon writes) a ``proxy_info`` line at the top of every
            file and ``token_renewed`` records (:data:`P_TOKEN_RENEWED`).
        storm_at_ms: plant a connection storm starting at this instant (epoch ms), or
            ``None``: ``storm_size`` attempts spread evenly at random over
            ``storm_seconds``, by ``storm_users`` users ``storm-NN`` of vhost ``iot`` from
            :data:`STORM_HOST`.
        storm_size: connection attempts of the storm.
        storm_seconds: length of the storm.
        storm_users: users of the storm.
        over_limit_user: plant a tenant of ``over_limit_vhost`` (group ``devices``) with this
            user name that tries to hold ``over_limit_factor`` times its per-user limit all
            the time (hour-long connections, attempts spread evenly): the proxies deny the
            excess with ``user_limit``. ``None``: no tenant.
        over_limit_vhost: the tenant's vhost.
        over_limit_factor: the tenant's demand as a multiple of its per-user limit (> 1
            for denials).
        growth: the arrival rate grows by this many percent per week (compounded hourly;
            0: no trend).

    Returns:
        The exact number of lines written.
    """
    rng = random.Random(seed)
    renew_rng = random.Random(seed + 1)  # token renewals: their own stream (P_TOKEN_RENEWED)
    fleet = Fleet(users, hosts, rng)
    fmt = _ts_formatter()
    t0 = int(dt.datetime(start.year, start.month, start.day, tzinfo=dt.UTC).timestamp() * 1000)
    n_hours = days * 24
    proxy_names = [(f"proxy-{p + 1:02d}", 1000 + 7 * p) for p in range(proxies)]
    next_id = [0] * proxies

    # Per-hour attempt counts: diurnal weight x bursts, scaled so the expected total is `events`.
    audit = schema_version >= 2
    v3 = schema_version >= 3
    v4 = schema_version >= 4
    sv = schema_version
    per_attempt = (1 - P_DENIED) * (2 + P_LINK_DENIED + P_SESSION_DENIED + P_MESSAGE_DENIED
                                    + P_PROTOCOL_ERROR + audit * (1 + P_SHADOW)
                                    + v3 * P_REVOKED) \
        + P_DENIED * (1 + audit) + v3 * P_SASL_FAILED
    bursts: dict[int, int] = {}  # hour index -> burst start minute
    for d in range(days):
        h = d * 24 + rng.randrange(6, 22)
        bursts[h] = rng.randrange(0, 60 - BURST_MINUTES)
    weights = []
    for h in range(n_hours):
        day = start + dt.timedelta(days=h // 24)
        w = diurnal(h % 24, day.weekday())
        if h in bursts:
            w += diurnal(h % 24, day.weekday()) * (BURST_FACTOR - 1) * BURST_MINUTES / 60
        weights.append(w * (1 + growth / 100) ** (h / 168))
    reloads = n_hours // 24 * proxies * (1 + 2 * audit)  # and a pause and a resume each

    den_cdf = _cdf([w for _, w in DENIAL_REASONS])
    den_names = tuple(r for r, _ in DENIAL_REASONS)
    close_cdf = _cdf([w for _, w in CLOSE_REASONS])
    close_names = tuple(r for r, _ in CLOSE_REASONS)
    fleet_users = fleet.users
    host_ips = fleet.host_ips
    user_cdf = fleet.user_cdf
    n_users = len(fleet_users)
    # Planted users come after the fleet's (the random picks never choose them).
    storm_ui: list[int] = []
    if storm_at_ms is not None:
        host_ips.append(STORM_HOST)
        for k in range(storm_users):
            storm_ui.append(len(fleet_users))
            fleet_users.append((f"storm-{k:02d}", STORM_VHOST, PLANTED_GROUP, len(host_ips) - 1))
    tenant_ui = None
    tenant_rate_ms = 0.0
    if over_limit_user is not None:
        tenant_ui = len(fleet_users)
        # a host of its own: the per-host limit never binds first
        host_ips.append("10.251.0.1")
        fleet_users.append((over_limit_user, over_limit_vhost, PLANTED_GROUP, len(host_ips) - 1))

    future: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    written = 0
    # Lines produced so far (written or scheduled): [0] the fleet's, which the calibration
    # holds to `events`, [1] the planted storm's and tenant's, on top of them (else the planted
    # lines would use up the budget and starve the log's last days). `lane` says which.
    generated = [0, 0]
    lane = [0]
    # The limits each proxy enforces (fleet_policy), and its live connection counts.
    vlim: dict[str, tuple[int, int, int]] = {}
    glim: dict[tuple[str, str], tuple[int, int]] = {}
    for _, v in fleet_policy(scale=limit_scale):
        vlim[v["hostname"]] = (v["maxConnections"], v["maxConnectionsPerUser"],
                               v["maxConnectionsPerHost"])
        for g, ga in v["groups"].items():
            glim[(v["hostname"], g)] = (ga.get("maxConnectionsPerUser", v["maxConnectionsPerUser"]),
                                        ga.get("maxConnectionsPerHost", v["maxConnectionsPerHost"]))
    if tenant_ui is not None:
        if over_limit_vhost not in vlim:
            raise ValueError(f"--over-limit-vhost {over_limit_vhost!r} is not a vhost of the fleet")
        demand = over_limit_factor * glim[(over_limit_vhost, PLANTED_GROUP)][0]
        tenant_rate_ms = demand / (TENANT_DURATION * 1000)  # attempts per ms (Little's law)
    live: list[tuple[int, int, str, int, int]] = []  # heap of (close_ms, proxy, vhost, user, host)
    n_vhost: Counter = Counter()
    n_user: Counter = Counter()
    n_host: Counter = Counter()

    def admit(close_ms: int | None, p: int, vhost: str, ui: int, host: int) -> None:
        n_vhost[(p, vhost)] += 1
        n_user[(p, vhost, ui)] += 1
        n_host[(p, vhost, host)] += 1
        if close_ms is not None:
            heapq.heappush(live, (close_ms, p, vhost, ui, host))

    def release_until(ms: int) -> None:
        # Closes at the same instant as an open come first (they do not overlap).
        while live and live[0][0] <= ms:
            _, p, vhost, ui, host = heapq.heappop(live)
            n_vhost[(p, vhost)] -= 1
            n_user[(p, vhost, ui)] -= 1
            n_host[(p, vhost, host)] -= 1
    log_duration = {g: (math.log(m), s) for g, (m, s) in DURATION.items()}

    def life_hint(open_ms: int, close_ms: int | None) -> int:
        return (close_ms if close_ms is not None else open_ms + 60_000) - open_ms

    def conn_events(p: int, cid: str, ui: int, open_ms: int, close_ms: int | None,
                    write_open: bool, sink_now: list, hour_end: int) -> None:
        name, vhost, group, host = fleet_users[ui]
        vh = '"' + vhost + '"'
        gr = '"' + group + '"'
        us = '"' + name + '"'
        ip = host_ips[host]

        def put(ts: int, line: str) -> None:
            if ts < t0:  # a connection open before the log starts: earlier events are not in it
                return
            generated[lane[0]] += 1
            if ts < hour_end:
                sink_now.append((ts, p, line))
            else:
                future[(ts - t0) // MS_HOUR].append((ts, p, line))

        if write_open:
            if audit:
                put(open_ms, DECIDED % (sv, "auth_decision", fmt(open_ms), cid, vh, gr, us, ip,
                                        "allow", "null", f"vhost '{vhost}' (exact name); group "
                                        f"'{group}' (user listed); remoteHosts matches; counts "
                                        "within limits", vh))
            put(open_ms, OPENED % (sv, "connection_opened", fmt(open_ms), cid, vh, gr, us, ip))
        if audit and rng.random() < P_SHADOW:
            ts = open_ms + int(rng.random() * min(life_hint(open_ms, close_ms), 5000))
            put(ts, SHADOW % (sv, "shadow_denied", fmt(ts), cid, vh, gr, us, ip,
                              f"{vhost}/trial/{ui % 10}"))
        if v3 and rng.random() < P_REVOKED:  # a reload took a sender's target away
            ts = open_ms + int(rng.random() * life_hint(open_ms, close_ms))
            put(ts, REVOKED % (sv, "revoked", fmt(ts), cid, vh, gr, us, ip,
                               f"{vhost}/retired/{ui % 10}"))
        if v4 and renew_rng.random() < P_TOKEN_RENEWED:  # a token renewed on the connection
            ts = open_ms + int(renew_rng.random() * life_hint(open_ms, close_ms))
            put(ts, RENEWED % (sv, "token_renewed", fmt(ts), cid, vh, gr, us, ip))
        life = (close_ms if close_ms is not None else open_ms + 60_000) - open_ms
        close_reason = _pick(close_cdf, close_names, rng.random())
        u = rng.random()
        if u < P_LINK_DENIED:
            ts = open_ms + int(rng.random() * min(life, 5000))
            role = "sender" if rng.random() < 0.6 else "receiver"
            reason = "target" if role == "sender" else "source"
            if rng.random() < 0.3:
                reason = role + "_limit"
            put(ts, LINK % (sv, "link_denied", fmt(ts), cid, vh, gr, us, ip, role,
                            f"{vhost}/queue/{ui % 50}", reason))
        elif u < P_LINK_DENIED + P_SESSION_DENIED:
            ts = open_ms + int(rng.random() * min(life, 5000))
            put(ts, COMMON % (sv, "session_denied", fmt(ts), cid, vh, gr, us, ip) + "}\n")
        elif u < P_LINK_DENIED + P_SESSION_DENIED + P_MESSAGE_DENIED:
            ts = open_ms + int(rng.random() * life)
            put(ts, MESSAGE % (sv, "message_denied", fmt(ts), cid, vh, gr, us, ip,
                               f"{vhost}/topic/{ui % 20}", "message_size",
                               int(rng.lognormvariate(13, 1))))
            close_reason = "message_size" if rng.random() < 0.5 else close_reason
        elif u < P_LINK_DENIED + P_SESSION_DENIED + P_MESSAGE_DENIED + P_PROTOCOL_ERROR:
            ts = open_ms + int(rng.random() * life)
            put(ts, PROTO % (sv, "protocol_error", fmt(ts), cid, vh, gr, us, ip, "client",
                             "amqp:connection:framing-error", "frame larger than max-frame-size"))
            if close_ms is not None:
                close_ms = max(close_ms, ts)
            close_reason = "protocol_error"
        if close_ms is None:
            return
        dur = (close_ms - open_ms) / 1000.0
        rate = rng.lognormvariate(0.0, 1.2)  # transfers per second, per connection
        t_in = int(dur * rate * (0.2 if group == "services" else 1.0))
        t_out = int(dur * rate * (3.0 if group == "services" else 0.5))
        size = rng.lognormvariate(6.5, 1.0)
        put(close_ms, CLOSED % (
            sv, "connection_closed", fmt(close_ms), cid, vh, gr, us, ip, fmt(open_ms), dur,
            int(t_in * size) + 600, int(t_out * size) + 400, t_in, t_out,
            1 + (rng.random() < 0.2), 1 + int(rng.random() * 3), 1 + int(rng.random() * 3),
            close_reason))

    def new_conn(p: int) -> str:
        next_id[p] += 1
        return str(next_id[p])

    end_ms = t0 + n_hours * MS_HOUR
    # Connections already open when the log starts: long-lived services (no opened record).
    service_users = [i for i, u in enumerate(fleet_users) if u[2] == "services"][:200]
    pre: list[tuple[int, int, str]] = []
    for ui in service_users:
        p = rng.randrange(proxies)
        open_ms = t0 - int(rng.random() * 6 * MS_HOUR) - 1
        close_ms = t0 + int(rng.lognormvariate(math.log(4 * 3600_000), 0.8))
        close = close_ms if close_ms < end_ms else None
        conn_events(p, new_conn(p), ui, open_ms, close, False, pre, t0 + MS_HOUR)
        admit(close, p, fleet_users[ui][1], ui, fleet_users[ui][3])

    attempts_done = 0
    for h in range(n_hours):
        hour_start = t0 + h * MS_HOUR
        hour_end = hour_start + MS_HOUR
        now: list[tuple[int, int, str]] = future.pop(h, [])
        if h == 0:
            now.extend(pre)
        # Calibrate on what the attempts so far produced (limit denials make fewer events).
        per = generated[0] / attempts_done if attempts_done > 1000 else per_attempt
        left = sum(weights[h:])
        expected = max(0.0, (events - reloads * (1 - h / n_hours) - generated[0]) / per) \
            * weights[h] / left
        n_att = int(expected) + (rng.random() < expected - int(expected))
        attempts_done += n_att
        burst_min = bursts.get(h)
        dn = fmt(hour_start)[:10]
        if h % 24 == 3:
            for p in range(proxies):
                ts = hour_start + rng.randrange(MS_HOUR)
                now.append((ts, p, RELOAD % (sv, fmt(ts), f"{rng.getrandbits(64):016x}")))
                generated[0] += 1
                if audit:  # an operator pauses a vhost for a few minutes
                    vhost = fleet_users[int(rng.random() * n_users)][1]
                    for k, action in enumerate(("vhost_pause", "vhost_resume")):
                        at = ts + 1000 + k * 300_000
                        line = ADMIN % (sv, fmt(at), vhost, action, proxy_names[p][1], vhost, vhost)
                        if at < hour_end:
                            now.append((at, p, line))
                        else:
                            future[(at - t0) // MS_HOUR].append((at, p, line))
                        generated[0] += 1
        base_w = diurnal(h % 24, (start + dt.timedelta(days=h // 24)).weekday())
        burst_share = 0.0
        if burst_min is not None:
            burst_share = (weights[h] - base_w) / weights[h]
        arrivals = []
        for _ in range(n_att):
            in_burst = rng.random() < burst_share
            if in_burst:
                ui = fleet.device_idx[int(rng.random() * len(fleet.device_idx))]
                open_ms = hour_start + (burst_min * 60_000) + int(rng.random() * BURST_MINUTES
                                                                  * 60_000)
            else:
                ui = bisect.bisect_left(user_cdf, rng.random())
                if ui >= n_users:
                    ui = n_users - 1
                open_ms = hour_start + int(rng.random() * MS_HOUR)
            arrivals.append((open_ms, ui, _BURST if in_burst else _NORMAL))
        if storm_at_ms is not None and storm_size > 0:
            storm_end = storm_at_ms + storm_seconds * 1000
            lo, hi = max(hour_start, storm_at_ms), min(hour_end, storm_end)
            if lo < hi:  # this hour's share of the storm
                n = round(storm_size * (hi - lo) / (storm_end - storm_at_ms))
                for _ in range(n):
                    arrivals.append((lo + int(rng.random() * (hi - lo)),
                                     storm_ui[int(rng.random() * len(storm_ui))], _STORM))
        if tenant_ui is not None:
            n = tenant_rate_ms * MS_HOUR
            n = int(n) + (rng.random() < n - int(n))
            for _ in range(n):
                arrivals.append((hour_start + int(rng.random() * MS_HOUR), tenant_ui, _TENANT))
        arrivals.sort()
        for open_ms, ui, kind in arrivals:
            release_until(open_ms)
            lane[0] = int(kind in (_STORM, _TENANT))
            p = (ui * 2654435761 + (rng.random() < 0.1)) % proxies  # sticky load balancer
            name, vhost, group, host = fleet_users[ui]
            if v3 and rng.random() < P_SASL_FAILED:  # a wrong password: no Open follows
                generated[lane[0]] += 1
                now.append((open_ms, p, SASL % (sv, fmt(open_ms), new_conn(p), _j(name),
                                                host_ips[host])))
                continue
            reason = None
            if kind != _TENANT and rng.random() < P_DENIED:
                reason = _pick(den_cdf, den_names, rng.random())
            else:
                vmax, _, _ = vlim[vhost]
                ulim, hlim = glim[(vhost, group)]
                if n_vhost[(p, vhost)] >= vmax:
                    reason = "vhost_limit"
                elif n_user[(p, vhost, ui)] >= ulim:
                    reason = "user_limit"
                elif n_host[(p, vhost, host)] >= hlim:
                    reason = "host_limit"
            if reason is not None:
                cond, desc = DENIAL_TEXT[reason]
                vh: str | None = vhost
                us: str | None = name
                gr: str | None = None
                if reason == "global_limit":
                    vh = us = None
                elif reason == "no_vhost":
                    vh = vhost + "-typo"
                elif reason == "unknown_user":
                    us = f"guest{ui % 97}"
                elif reason in ("user_limit", "host_limit", "vhost_limit", "remote_host"):
                    gr = group
                elif reason == "handshake_timeout":
                    us = None
                generated[lane[0]] += 1
                cid = new_conn(p)
                if audit and reason not in ("global_limit", "handshake_timeout"):
                    generated[lane[0]] += 1
                    now.append((open_ms, p, DECIDED % (
                        sv, "auth_decision", fmt(open_ms), cid, _j(vh), _j(gr), _j(us),
                        host_ips[host], "deny", _j(reason), reason, _j(vh))))
                now.append((open_ms, p, DENIED % (
                    sv, "connection_denied", fmt(open_ms), cid, _j(vh), _j(gr), _j(us),
                    host_ips[host], reason, cond, desc)))
                continue
            mu, sigma = log_duration[group]
            if kind == _BURST:
                mu, sigma = math.log(20.0), 1.0
            elif kind == _STORM:
                mu, sigma = math.log(STORM_DURATION), 0.5
            elif kind == _TENANT:
                mu, sigma = math.log(TENANT_DURATION), 0.2
            dur_ms = max(1, int(rng.lognormvariate(mu, sigma) * 1000))
            close_ms = open_ms + dur_ms
            close = close_ms if close_ms < end_ms else None
            conn_events(p, new_conn(p), ui, open_ms, close, True, now, hour_end)
            admit(close, p, vhost, ui, host)
        lane[0] = 0
        now.sort()
        by_proxy: dict[int, list[str]] = defaultdict(list)
        for _, p, line in now:
            by_proxy[p].append(line)
        if by_proxy:
            d = os.path.join(out, f"dt={dn}", f"hour={h % 24:02d}")
            os.makedirs(d, exist_ok=True)
            for p, lines in by_proxy.items():
                host, pid = proxy_names[p]
                with open(os.path.join(d, f"events-{host}-{pid}.jsonl"), "w") as f:
                    if sv >= 4:
                        f.write(PROXY_INFO % (sv, lines[0][lines[0].index('"ts":"') + 6:][:24]))
                        written += 1
                    f.writelines(lines)
                written += len(lines)
    return written


def fleet_policy(max_connections: int = 5000, per_user: int = 20, per_host: int = 200,
                 scale: float = 1.0) -> list:
    """Return a QDR policy (list of ``["vhost", {...}]``) matching the generated fleet.

    Args:
        max_connections: vhost ``maxConnections`` for ``iot``; other vhosts get less, in
            proportion to their share of users.
        per_user: vhost ``maxConnectionsPerUser``.
        per_host: vhost ``maxConnectionsPerHost``.
        scale: multiplies every limit (0.5 gives a tighter what-if policy).

    Returns:
        A JSON-serialisable policy; every vhost has the four groups of the generator, with
        ``services`` overriding the per-user limit and ``devices`` the per-host limit.
    """
    def lim(x: float) -> int:
        return max(1, min(65535, int(x * scale)))

    out = []
    for vhost, share in VHOSTS:
        out.append(["vhost", {
            "hostname": vhost,
            "maxConnections": lim(max_connections * share / VHOSTS[0][1]),
            "maxConnectionsPerUser": lim(per_user),
            "maxConnectionsPerHost": lim(per_host),
            "allowUnknownUser": False,
            "groups": {
                "devices": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*",
                            "maxConnectionsPerHost": lim(per_host * 2)},
                "services": {"users": [], "remoteHosts": "*", "sources": "*", "targets": "*",
                             "maxConnectionsPerUser": lim(per_user * 5)},
                "admins": {"users": [], "remoteHosts": "*", "sources": "*", "targets": "*"},
            },
        }])
    return out


def _write_policy(path: str, fleet: Fleet, scale: float) -> None:
    policy = fleet_policy(scale=scale)
    members: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, vhost, group, _ in fleet.users:
        if group in ("services", "admins"):
            members[(vhost, group)].append(name)
    for _, v in policy:
        for g in ("services", "admins"):
            v["groups"][g]["users"] = sorted(members[(v["hostname"], g)])
    with open(path, "w") as f:
        f.write("# Generated by bench/gen_events.py for the synthetic fleet.\n")
        json.dump(policy, f, indent=1)
        f.write("\n")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="root directory of the event log")
    ap.add_argument("--events", type=int, default=100_000, help="approximate event count")
    ap.add_argument("--users", type=int, default=5000)
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--proxies", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", default="2026-11-02", help="first UTC day, YYYY-MM-DD")
    ap.add_argument("--limit-scale", type=float, default=1.0,
                    help="scale the limits the proxies enforce (and --policy-out writes)")
    ap.add_argument("--policy-out", metavar="PATH",
                    help="also write the QDR policy file the proxies enforce")
    ap.add_argument("--schema-version", type=int, choices=[1, 2, 3, 4], default=4,
                    help="4 (default): with a proxy_info line per file; 3 or 2: with the "
                         "audit records; 1: the older mix")
    ap.add_argument("--whatif-out", metavar="PATH",
                    help="also write a tighter what-if policy (limits x0.5 of that)")
    ap.add_argument("--storm-at", metavar="TS",
                    help="plant a connection storm starting at this UTC time (ISO 8601)")
    ap.add_argument("--storm-size", type=int, default=3000,
                    help="connection attempts of the planted storm (default 3000)")
    ap.add_argument("--storm-seconds", type=int, default=60,
                    help="length of the planted storm in seconds (default 60)")
    ap.add_argument("--storm-users", type=int, default=20,
                    help=f"users of the planted storm, all from {STORM_HOST} (default 20)")
    ap.add_argument("--over-limit-user", metavar="NAME",
                    help="plant a tenant that wants more connections than its per-user limit")
    ap.add_argument("--over-limit-vhost", default="billing",
                    help="the tenant's vhost (default billing)")
    ap.add_argument("--over-limit-factor", type=float, default=2.0,
                    help="the tenant's demand, in multiples of its per-user limit (default 2)")
    ap.add_argument("--growth", type=float, default=0.0, metavar="PCT",
                    help="the arrival rate grows by PCT %% per week (default 0)")
    args = ap.parse_args(argv)
    if min(args.users, args.hosts, args.days, args.proxies) < 1 or args.events < 0:
        ap.error("--users, --hosts, --days, --proxies must be >= 1 and --events >= 0")
    start = dt.date.fromisoformat(args.start)
    t = time.monotonic()
    if args.limit_scale <= 0:
        ap.error("--limit-scale must be positive")
    storm_at = None
    if args.storm_at:
        try:
            s = dt.datetime.fromisoformat(args.storm_at)
        except ValueError:
            ap.error(f"--storm-at: not an ISO 8601 time: {args.storm_at!r}")
        if s.tzinfo is None:
            s = s.replace(tzinfo=dt.UTC)
        storm_at = int(s.timestamp() * 1000)
    if args.storm_size < 0 or args.storm_seconds < 1 or args.storm_users < 1:
        ap.error("--storm-size must be >= 0, --storm-seconds and --storm-users >= 1")
    if args.over_limit_factor <= 0 or args.growth <= -100:
        ap.error("--over-limit-factor must be positive and --growth above -100")
    if args.over_limit_vhost not in {v for v, _ in VHOSTS}:
        ap.error(f"--over-limit-vhost must be one of {', '.join(v for v, _ in VHOSTS)}")
    n = generate(args.out, args.events, args.users, args.hosts, args.days, args.proxies,
                 args.seed, start, args.limit_scale, args.schema_version,
                 storm_at_ms=storm_at, storm_size=args.storm_size,
                 storm_seconds=args.storm_seconds, storm_users=args.storm_users,
                 over_limit_user=args.over_limit_user, over_limit_vhost=args.over_limit_vhost,
                 over_limit_factor=args.over_limit_factor, growth=args.growth)
    if args.policy_out or args.whatif_out:
        fleet = Fleet(args.users, args.hosts, random.Random(args.seed))
        if args.policy_out:
            _write_policy(args.policy_out, fleet, args.limit_scale)
        if args.whatif_out:
            _write_policy(args.whatif_out, fleet, args.limit_scale * 0.5)
    print(f"wrote {n} events to {args.out} in {time.monotonic() - t:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
