"""Daemon layer. Operator control: list and close live connections (at once, or paced at N
per second: :mod:`.pacing`), pause and resume vhosts, ban and unban users and client addresses
(:mod:`.bans`), the daemon's status; every change recorded as an
:class:`~..core.events.AdminAction`.

This is what the admin interface (:mod:`.admin`, HTTP on a unix socket) calls; it reads the
daemon through :class:`ControlHost` and each connection through its
:class:`~..core.view.ConnectionView` and the relay's own facts (listener, upstream, last
activity, the socket peer), and closes a connection through
:meth:`~..core.connection.ProxyConnection.close_by_operator`. Nothing here does I/O of its own:
the shapes returned are plain JSON-ready values (docs/operations.md, "Admin API").

The paused vhosts are a set owned by the daemon and read by every Open decision (the core's
``paused_vhosts``): a pause outlives a reload (a reload swaps the policy, not the set) but not
a restart.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..core.events import AdminAction
from ..core.state import ClientState
from ..ingress.peer import normalise_peer
from .bans import MAX_REASON_LENGTH as MAX_BAN_REASON_LENGTH
from .bans import BanError, parse_duration
from .pacing import MAX_RATE, PacedCloser

logger = logging.getLogger(__name__)

#: The selectors of ``connections close`` (exactly one is given) and of ``connections list``.
CLOSE_SELECTORS = ("id", "user", "vhost", "host")
LIST_FILTERS = ("vhost", "user", "host", "group")
#: The Close description when the operator gives no reason.
DEFAULT_CLOSE_REASON = "closed by an operator"
#: Longest reason accepted (it goes into the client's Close and the event log).
MAX_REASON_LENGTH = 1024
#: The Close description and ban reason when the operator gives none.
DEFAULT_BAN_REASON = "no reason given"
#: Paced-close jobs remembered for their progress (the oldest finished ones go first).
MAX_JOBS = 64
#: What a job id given by a workers' parent may look like.
_JOB_ID = re.compile(r"[0-9a-z][0-9a-z-]{0,63}")


class ControlError(Exception):
    """A request the operator must fix; ``status`` is the HTTP status that says so."""

    def __init__(self, message: str, status: int = 400) -> None:
        """``message`` is shown to the operator as is."""
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Peer:
    """Who asked: the admin client's peer credentials (``SO_PEERCRED``) on the unix socket, or
    its address over TCP."""

    uid: int | None = None
    pid: int | None = None
    address: str = "unix"
    """``unix``, or the TCP client's ``HOST:PORT``."""

    def __str__(self) -> str:
        """``uid 0 pid 1234`` or the TCP address, for log lines."""
        if self.uid is None:
            return self.address
        return f"uid {self.uid} pid {self.pid}"


class ControlHost(Protocol):
    """What operator control needs from the daemon (:class:`~.app.Daemon`)."""

    @property
    def connections(self) -> Mapping[str, Any]:
        """conn_id -> the relay's ``ClientProtocol`` of every client transport."""

    paused_vhosts: set[str]
    bans: Any
    """The :class:`~.bans.BanService`."""
    policy: Any

    @property
    def ledger(self) -> Any:
        """This process's counts (:class:`~..limits.connections.ConnectionLedger`)."""

    @property
    def ledger_mode(self) -> str:
        """``redis``, a fleet ledger's failure mode, or ``in-process``."""

    config: Any
    upstream_health: Any
    loop: Any
    draining: bool
    started_at: float
    """Loop-clock seconds of the start."""
    policy_loaded_at: float
    """Loop-clock seconds of the last successful policy load."""
    servers: list[Any]
    """The listening servers, one per ``config.listeners`` entry."""

    @property
    def wall_offset(self) -> float:
        """POSIX seconds minus loop-clock seconds."""

    def emit(self, event: Any) -> None:
        """Fan an event out (metrics, event log)."""


def wall_time(loop_seconds: float, wall_offset: float) -> str:
    """A loop-clock time as UTC RFC 3339 with milliseconds (as the event log's ``ts``)."""
    moment = datetime.fromtimestamp(loop_seconds + wall_offset, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class Control:
    """The operator's handle on one daemon."""

    def __init__(self, host: ControlHost) -> None:
        """Control ``host``."""
        self.host = host
        self.jobs: dict[str, PacedCloser[Any]] = {}
        """Paced closes by job id (``connections close --rate``), newest last."""
        self._job_ids = itertools.count(1)

    # ------------------------------------------------------------------ reading

    def connections(self, **filters: str | None) -> list[dict[str, Any]]:
        """The admitted connections, optionally only those matching every filter given.

        Args:
            filters: ``vhost``, ``user``, ``host`` (the client's IP, any textual form),
                ``group``; exact matches. None or absent: no filter.

        Returns:
            One object per connection, sorted by ``id`` (docs/operations.md lists the fields).

        Raises:
            ControlError: an unknown filter.
        """
        unknown = set(filters) - set(LIST_FILTERS)
        if unknown:
            raise ControlError(f"unknown filter {sorted(unknown)[0]!r}; filters: "
                               f"{', '.join(LIST_FILTERS)}")
        return [self._describe(proto) for proto in self._select(filters)]

    def _live(self) -> Iterable[Any]:
        """The client protocols of admitted connections that are not over."""
        for proto in list(self.host.connections.values()):
            conn = proto.conn
            if conn is None or proto.closed:
                continue
            view = conn.view
            if view.admitted and not view.finished:
                yield proto

    def _select(self, filters: Mapping[str, str | None]) -> list[Any]:
        wanted = {k: v for k, v in filters.items() if v is not None}
        if "host" in wanted:
            wanted["host"] = normalise_peer(wanted["host"])
        out = []
        for proto in self._live():
            view = proto.conn.view
            facts = {"id": view.conn_id, "vhost": view.vhost, "user": view.user,
                     "host": view.remote_host, "group": view.group}
            if all(facts[k] == v for k, v in wanted.items()):
                out.append(proto)
        return sorted(out, key=lambda p: _id_key(p.conn_id))

    def _describe(self, proto: Any) -> dict[str, Any]:
        host = self.host
        view = proto.conn.view
        now = host.loop.time()
        offset = host.wall_offset
        f = view.figures
        upstream = proto.upstream
        last = proto.last_activity or view.accepted_at
        return {
            "id": view.conn_id,
            "vhost": view.vhost,
            "group": view.group,
            "user": view.user,
            "remote_host": view.remote_host,
            "balancer": _balancer(proto, view.remote_host),
            "listener": view.listener,
            "upstream": None if upstream is None else str(upstream.address),
            "tls_subject": view.tls_subject,
            "enforcement": view.enforcement,
            "state": view.client_state.value,
            "opened_at": wall_time(view.opened_at, offset),
            "age_seconds": round(now - view.accepted_at, 3),
            "bytes_in": f.bytes_in,
            "bytes_out": f.bytes_out,
            "transfers_in": f.transfers_in,
            "transfers_out": f.transfers_out,
            "sessions": f.active_sessions,
            "senders": f.active_senders,
            "receivers": f.active_receivers,
            "last_activity": wall_time(last, offset),
            "idle_seconds": round(max(0.0, now - last), 3),
        }

    def status(self) -> dict[str, Any]:
        """The daemon at a glance: version, uptime, policy (with the last reload's result),
        listeners, upstreams with their health, ledger, connection counts per vhost, paused
        vhosts, workers."""
        from .. import __version__

        host = self.host
        now = host.loop.time()
        offset = host.wall_offset
        policy = host.policy
        config = host.config
        health = host.upstream_health
        per_vhost: dict[str, int] = {}
        for (vhost, _group), n in host.ledger.snapshot().active:
            per_vhost[vhost] = per_vhost.get(vhost, 0) + n
        return {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": wall_time(host.started_at, offset),
            "uptime_seconds": round(now - host.started_at, 3),
            "draining": host.draining,
            "workers": 1,
            "policy": {
                "digest": getattr(policy, "digest", ""),
                "loaded_at": wall_time(host.policy_loaded_at, offset),
                "last_reload": _last_reload(host, offset),
                "files": list(getattr(policy, "files", ())),
                "vhosts": sorted(getattr(policy, "vhosts", {}) or {}),
                "shadow": [{"vhost": v, "enforcement": str(e), "groups": list(g)}
                           for v, e, g in policy.shadowed()] if policy is not None else [],
            },
            "listeners": _listeners(host),
            "upstreams": [
                {"address": str(u.address), "tls": u.tls,
                 "healthy": health.known(u) is not False and health.is_up(u, now),
                 "state": {True: "up", False: "down", None: "unknown"}[health.known(u)],
                 "consecutive_failures": health.failures(u)}
                for u in config.upstreams
            ],
            "ledger": {"mode": host.ledger_mode, "max_connections": host.ledger.max_connections,
                       "transports": host.ledger.global_current()},
            "connections": {"transports": len(host.connections),
                            "admitted": host.ledger.active(), "per_vhost": per_vhost},
            "paused_vhosts": sorted(host.paused_vhosts),
            "bans": host.bans.counts() if host.bans is not None else {"user": 0, "host": 0},
        }

    # ------------------------------------------------------------------ changing

    def close(self, selector: Mapping[str, Any], peer: Peer) -> dict[str, Any]:
        """Close the admitted connections that match one selector.

        Args:
            selector: exactly one of ``id``, ``user``, ``vhost``, ``host`` (a string), and
                optionally ``reason`` (the Close description the clients get; default
                :data:`DEFAULT_CLOSE_REASON`), ``rate`` (closes per second: paced, see
                below) and ``job`` (the paced close's id, given by a workers' parent).
            peer: who asked.

        Returns:
            ``{"closed": n, "ids": [...]}``; each client got Close ``amqp:connection:forced``
            with the reason, and its counts are released once it answers (or after the
            linger time). Connections whose Close exchange is under way already (``state``
            ``closing`` in the list) are left to finish it and not counted. With ``rate``
            the selected connections are closed at that many per second with jitter
            (:mod:`.pacing`) and the answer comes at once: ``{"job": J, "closing": n,
            "ids": [...], "rate": r, "eta_seconds": s, "closed": 0}``; :meth:`close_progress`
            follows it.

        Raises:
            ControlError: not exactly one selector, a selector or reason that is not a string,
                a rate that is not a positive number, or (404) an ``id`` that is not an
                admitted connection.
        """
        reason = selector.get("reason")
        rate = selector.get("rate")
        job = selector.get("job")
        given = {k: v for k, v in selector.items()
                 if k not in ("reason", "rate", "job") and v is not None}
        unknown = set(given) - set(CLOSE_SELECTORS)
        if unknown:
            raise ControlError(f"unknown selector {sorted(unknown)[0]!r}; give exactly one of "
                               f"{', '.join(CLOSE_SELECTORS)}")
        if len(given) != 1:
            raise ControlError(f"give exactly one of {', '.join(CLOSE_SELECTORS)}")
        (key, value), = given.items()
        if not isinstance(value, str):
            raise ControlError(f"{key} must be a string")
        if reason is None:
            reason = DEFAULT_CLOSE_REASON
        if not isinstance(reason, str) or not reason.strip():
            raise ControlError("reason must be a non-empty string")
        if len(reason) > MAX_REASON_LENGTH:
            raise ControlError(f"reason is longer than {MAX_REASON_LENGTH} characters")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                                 or not math.isfinite(rate) or not 0 < rate <= MAX_RATE):
            raise ControlError(f"rate must be a number of closes per second, more than 0 and "
                               f"at most {MAX_RATE:g}")
        if job is not None and (not isinstance(job, str) or not _JOB_ID.fullmatch(job)):
            raise ControlError("job must be a short id of lower-case letters, digits and -")
        targets = self._select({key: value})
        described = f"{key}={value}"
        if key == "id" and not targets:
            self._record("connections_close", peer, described, (), "error", 0,
                         f"no admitted connection with id {value}")
            raise ControlError(f"no admitted connection with id {value!r}", status=404)
        if rate is not None:
            return self._paced_close(targets, float(rate), reason, described, job, peer,
                                     vhost=value if key == "vhost" else None)
        ids = []
        for proto in targets:
            if proto.conn.view.client_state is not ClientState.OPENED:
                continue  # its Close exchange is under way already (listed as closing)
            proto.run(proto.conn.close_by_operator, reason)
            ids.append(proto.conn_id)
        logger.info("admin: closed %d connection%s (%s) for %s: %s", len(ids),
                    "" if len(ids) == 1 else "s", described, peer, reason,
                    extra={"event": "admin_action", "action": "connections_close",
                           "selector": described, "targets": ids, "peer": str(peer)})
        self._record("connections_close", peer, described, tuple(ids), "ok", len(ids), reason,
                     vhost=value if key == "vhost" else None)
        return {"closed": len(ids), "ids": ids}

    def _paced_close(self, targets: list[Any], rate: float, reason: str, described: str,
                     job: str | None, peer: Peer, vhost: str | None) -> dict[str, Any]:
        """Start closing ``targets`` at ``rate`` per second (see :meth:`close`)."""
        protos = [p for p in targets if p.conn.view.client_state is ClientState.OPENED]

        def close_one(proto: Any) -> bool:
            conn = proto.conn
            if conn is None or proto.closed or conn.view.client_state is not ClientState.OPENED:
                return False  # gone, or closing already
            proto.run(conn.close_by_operator, reason)
            return True

        job_id = job or f"{os.getpid():x}-j{next(self._job_ids)}"
        pacer = PacedCloser(self.host.loop, protos, close_one, rate).start()
        self._remember(job_id, pacer)
        ids = [p.conn_id for p in protos]
        n = len(ids)
        logger.info("admin: closing %d connection%s (%s) at %g/s for %s: %s (job %s)", n,
                    "" if n == 1 else "s", described, rate, peer, reason, job_id,
                    extra={"event": "admin_action", "action": "connections_close",
                           "selector": described, "targets": ids, "peer": str(peer),
                           "rate": rate, "job": job_id})
        self._record("connections_close", peer, described, tuple(ids), "ok", n,
                     f"{reason} (paced at {rate:g}/s, job {job_id})", vhost=vhost)
        pacer.done.add_done_callback(functools.partial(self._paced_done, job_id, described))
        return {"job": job_id, "closing": n, "ids": ids, "rate": rate, "closed": 0,
                "eta_seconds": round(n / rate, 3)}

    def _paced_done(self, job_id: str, described: str, _future: Any) -> None:
        pacer = self.jobs.get(job_id)
        if pacer is None:
            return
        p = pacer.progress()
        logger.info("admin: paced close %s (%s) done: %d closed, %d gone meanwhile, in %.1f s",
                    job_id, described, p["closed"], p["skipped"], p["elapsed_seconds"])

    def _remember(self, job_id: str, pacer: PacedCloser[Any]) -> None:
        old = self.jobs.pop(job_id, None)
        if old is not None:
            old.cancel()
        self.jobs[job_id] = pacer
        while len(self.jobs) > MAX_JOBS:
            finished = [j for j, p in self.jobs.items() if p.done.done()]
            if not finished:
                break
            del self.jobs[finished[0]]

    def close_progress(self, job: str) -> dict[str, Any]:
        """The progress of a paced close: ``job``, ``total``, ``closed``, ``skipped`` (gone
        meanwhile), ``remaining``, ``rate``, ``elapsed_seconds``, ``eta_seconds``, ``done``.

        Raises:
            ControlError: (404) no such job here.
        """
        pacer = self.jobs.get(job)
        if pacer is None:
            raise ControlError(f"no paced close with job id {job!r}", status=404)
        return {"job": job, **pacer.progress()}

    # ------------------------------------------------------------------ bans

    async def ban(self, body: Mapping[str, Any], peer: Peer) -> dict[str, Any]:
        """Ban a user or a client address (``{"user"|"host": V, "seconds": S, "reason": T}``;
        no ``seconds``: until lifted): new connections are refused at the Open (reason
        ``banned``) and the open ones it covers are closed at once.

        Returns:
            The ban (:meth:`~.bans.BanService.describe`) with ``closed`` (the connection ids),
            ``replaced`` and ``stored`` (written to the fleet's store; null without one).

        Raises:
            ControlError: not exactly one of user and host, a bad name, address, duration or
                reason.
        """
        kind, value = self._ban_target(body, ("seconds", "reason"))
        reason = body.get("reason")
        if reason is None:
            reason = DEFAULT_BAN_REASON
        if not isinstance(reason, str) or not reason.strip():
            raise ControlError("reason must be a non-empty string")
        if len(reason) > MAX_BAN_REASON_LENGTH:
            raise ControlError(f"reason is longer than {MAX_BAN_REASON_LENGTH} characters")
        seconds = body.get("seconds")
        try:
            duration = None if seconds is None else parse_duration(seconds)
            result = await self.host.bans.ban(kind, value, duration, reason, str(peer))
        except BanError as exc:
            self._record("ban", peer, f"{kind}={value}", (), "error", 0, str(exc))
            raise ControlError(str(exc)) from None
        closed = result["closed"]
        until = result["expires_at"] or "it is lifted"
        logger.warning("admin: %s %s banned until %s for %s: %s; %d connection%s closed",
                       result["kind"], result["value"], until, peer, reason, len(closed),
                       "" if len(closed) == 1 else "s",
                       extra={"event": "admin_action", "action": "ban",
                              "selector": f"{result['kind']}={result['value']}",
                              "targets": closed, "peer": str(peer)})
        self._record("ban", peer, f"{result['kind']}={result['value']}", tuple(closed), "ok",
                     len(closed), f"{reason} (until {until})")
        return result

    async def unban(self, body: Mapping[str, Any], peer: Peer) -> dict[str, Any]:
        """Lift a ban (``{"user"|"host": V}``), an operator's or a quarantine's.

        Returns:
            ``{"kind", "value", "lifted": bool, "stored": bool | None}``.

        Raises:
            ControlError: not exactly one of user and host, or a bad name or address.
        """
        kind, value = self._ban_target(body, ())
        try:
            result = await self.host.bans.unban(kind, value)
        except BanError as exc:
            self._record("unban", peer, f"{kind}={value}", (), "error", 0, str(exc))
            raise ControlError(str(exc)) from None
        selector = f"{result['kind']}={result['value']}"
        logger.warning("admin: %s %s unbanned for %s%s", result["kind"], result["value"], peer,
                       "" if result["lifted"] else " (it was not banned)",
                       extra={"event": "admin_action", "action": "unban",
                              "selector": selector, "peer": str(peer)})
        self._record("unban", peer, selector, (), "ok", 0,
                     "" if result["lifted"] else "it was not banned")
        return result

    def bans(self) -> list[dict[str, Any]]:
        """The bans in force (users first, then hosts)."""
        return self.host.bans.bans() if self.host.bans is not None else []

    @staticmethod
    def _ban_target(body: Mapping[str, Any], extra: tuple[str, ...]) -> tuple[str, Any]:
        unknown = set(body) - {"user", "host", *extra}
        if unknown:
            raise ControlError(f"unknown field {sorted(unknown)[0]!r}; expected user or host"
                               + "".join(f", {e}" for e in extra))
        given = [k for k in ("user", "host") if body.get(k) is not None]
        if len(given) != 1:
            raise ControlError("give exactly one of user, host")
        return given[0], body[given[0]]

    def pause(self, vhost: Any, peer: Peer) -> dict[str, Any]:
        """Pause ``vhost``: new connections to it get QDR's connection denial (reason
        ``vhost_paused``) until :meth:`resume`; existing ones stay.

        Returns:
            ``{"vhost": V, "paused": true, "changed": bool}`` (changed: it was not paused).

        Raises:
            ControlError: not a string, or (404) no such vhost in the running policy.
        """
        name = self._vhost_name(vhost)
        policy = self.host.policy
        if policy is None or name not in policy.vhosts:
            self._record("vhost_pause", peer, f"vhost={name}", (name,), "error", 0,
                         f"no vhost '{name}' in the running policy", vhost=name)
            raise ControlError(f"no vhost {name!r} in the running policy", status=404)
        changed = name not in self.host.paused_vhosts
        self.host.paused_vhosts.add(name)
        logger.info("admin: vhost '%s' paused for %s%s: new connections are denied", name,
                    peer, "" if changed else " (it was paused already)",
                    extra={"event": "admin_action", "action": "vhost_pause", "vhost": name,
                           "peer": str(peer)})
        self._record("vhost_pause", peer, f"vhost={name}", (name,), "ok", 0, "", vhost=name)
        return {"vhost": name, "paused": True, "changed": changed}

    def resume(self, vhost: Any, peer: Peer) -> dict[str, Any]:
        """Resume a paused vhost: new connections are decided by the policy again.

        Returns:
            ``{"vhost": V, "paused": false, "changed": bool}`` (changed: it was paused).

        Raises:
            ControlError: not a string.
        """
        name = self._vhost_name(vhost)
        changed = name in self.host.paused_vhosts
        self.host.paused_vhosts.discard(name)
        logger.info("admin: vhost '%s' resumed for %s%s", name, peer,
                    "" if changed else " (it was not paused)",
                    extra={"event": "admin_action", "action": "vhost_resume", "vhost": name,
                           "peer": str(peer)})
        self._record("vhost_resume", peer, f"vhost={name}", (name,), "ok", 0, "", vhost=name)
        return {"vhost": name, "paused": False, "changed": changed}

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _vhost_name(vhost: Any) -> str:
        if not isinstance(vhost, str):
            raise ControlError("vhost must be a string")
        return vhost

    def _record(self, action: str, peer: Peer, selector: str, targets: tuple[str, ...],
                result: str, count: int, description: str, vhost: str | None = None) -> None:
        """Emit the audit record of one admin action (``admin_action`` in the event log)."""
        self.host.emit(AdminAction(
            at=self.host.loop.time(), action=action, uid=peer.uid, pid=peer.pid,
            peer=peer.address, selector=selector, targets=targets, result=result, count=count,
            description=description, vhost=vhost))


def _id_key(conn_id: str) -> tuple[str, int]:
    """Sort ``<pid hex>-<n>`` ids by number, not as text."""
    prefix, _, n = conn_id.rpartition("-")
    return (prefix, int(n)) if n.isdigit() else (conn_id, 0)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _balancer(proto: Any, remote_host: str) -> str | None:
    """The load balancer's address when the client's came from its PROXY protocol header
    (``proxy_protocol`` listeners), else None."""
    proxied = getattr(proto, "proxied", None)
    return None if proxied is None else proxied.balancer


def _listeners(host: ControlHost) -> list[dict[str, Any]]:
    """Each bound listening socket: its address, its configured address, amqps or not."""
    out = []
    for server, lc in zip(host.servers, host.config.listeners, strict=False):
        for sock in server.sockets:
            bound = sock.getsockname()
            out.append({"address": _host_port(bound[0], bound[1]),
                        "configured": str(lc.address), "tls": bool(lc.tls_cert)})
    return out



def _last_reload(host: Any, offset: float) -> dict[str, Any] | None:
    """The last policy reload: ``at`` (wall time), ``result`` (``ok``/``error``), ``digest``
    (the policy running after it) and ``issues``; None before any reload."""
    record = getattr(host, "last_reload", None)
    if record is None:
        return None
    return {"at": wall_time(record.at, offset), "result": record.result,
            "digest": record.digest, "issues": list(record.issues)}
