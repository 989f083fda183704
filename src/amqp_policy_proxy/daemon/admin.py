"""Daemon layer. The admin interface: a small HTTP API with JSON bodies (aiohttp, on the
daemon's own event loop) on a unix socket, and optionally on TCP with a bearer token.

The socket is made here rather than by aiohttp so that nobody can connect before its mode and
group are set: it is bound, given mode 0660 and the configured group, and only then listened
on. Who may use it is decided by the kernel from that mode (connect needs write permission on
the socket file); the peer credentials of each client (``SO_PEERCRED``: pid, uid) go into the
``admin_action`` record of every change. Over TCP (``[admin] address``) every request must
carry ``Authorization: Bearer <token>`` (the content of ``[admin] token_file``).

The API (docs/operations.md, "Admin API"), version 1:

========  ===========================  ==================================================
GET       ``/v1/status``               the daemon at a glance
GET       ``/v1/connections``          admitted connections; query ``vhost``, ``user``,
                                       ``host``, ``group`` filter them
POST      ``/v1/connections/close``    body ``{"id"|"user"|"vhost"|"host": ..., "reason": ...}``,
                                       optionally ``"rate": N`` (paced: answers a ``job``)
GET       ``/v1/connections/close/J``  the progress of the paced close ``J``
POST      ``/v1/vhosts/pause``         body ``{"vhost": ...}``
POST      ``/v1/vhosts/resume``        body ``{"vhost": ...}``
GET       ``/v1/bans``                 the bans in force
POST      ``/v1/bans/add``             body ``{"user"|"host": ..., "seconds": S, "reason": T}``
POST      ``/v1/bans/remove``          body ``{"user"|"host": ...}``
========  ===========================  ==================================================

Errors are ``{"error": "..."}`` with 400 (bad request), 401 (TCP without the token), 404
(no such connection id, vhost or path), 405 (wrong method).

With ``--workers N`` the parent serves this same API on the configured socket and address
(:func:`build_workers_app`): each request goes to every worker's private admin socket (in the
parent's 0700 directory; only the service itself can reach them) and the answers are merged,
so the operator sees one daemon. The worker records the operator's peer credentials, which
the parent passes in ``X-Admin-Peer`` (trusted on those private sockets only).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import hmac
import itertools
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from .control import Control, ControlError, ControlHost, Peer
from .settings import AdminConfig, BindError

logger = logging.getLogger(__name__)

API_PREFIX = "/v1"
#: Mode of the admin socket: owner and group may connect (read and write), nobody else.
SOCKET_MODE = 0o660
#: Largest request body accepted, bytes (a close selector and a reason).
MAX_BODY = 64 * 1024
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

#: Header carrying the operator's peer credentials from a workers' parent to a worker.
PEER_HEADER = "X-Admin-Peer"
#: Seconds the workers' parent waits for one worker's answer.
WORKER_TIMEOUT = 10.0

_CONTROL_KEY = web.AppKey("control", Control)
_TOKEN_KEY = web.AppKey("token", str)
_FORWARDED_KEY = web.AppKey("forwarded_peer", bool)
_WORKERS_KEY: web.AppKey[Callable[[], list[WorkerAdmin]]] = web.AppKey("workers")
_PARENT_JOBS = itertools.count(1)


def peer_of(request: web.Request) -> Peer:
    """The admin client: ``SO_PEERCRED`` on a unix socket, the address over TCP; on a
    worker's private socket, the operator the parent names in ``X-Admin-Peer``."""
    if request.app.get(_FORWARDED_KEY) and PEER_HEADER in request.headers:
        try:
            given = json.loads(request.headers[PEER_HEADER])
            return Peer(uid=given.get("uid"), pid=given.get("pid"),
                        address=str(given.get("address", "unix")))
        except (ValueError, AttributeError, TypeError):
            pass
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, _gid = _PEERCRED.unpack(raw)
        return Peer(uid=uid, pid=pid)
    peername = transport.get_extra_info("peername") if transport is not None else None
    if peername:
        host, port = peername[0], peername[1]
        return Peer(address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return Peer(address="unknown")


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """Who is asking (the bearer token over TCP), and errors as JSON."""
    peer = peer_of(request)
    if peer.uid is None:  # TCP: the token is the only credential
        token = request.app[_TOKEN_KEY]
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if not token or scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), token.encode()):
            logger.warning("admin: request from %s without a valid bearer token refused", peer)
            return _error("a valid bearer token is required (Authorization: Bearer TOKEN)",
                          401)
    try:
        return await handler(request)
    except ControlError as exc:
        return _error(str(exc), exc.status)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.reason, exc.status)
        raise


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ControlError(f"request body larger than {MAX_BODY} bytes")
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ControlError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ControlError("the body must be a JSON object")
    return body


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[_CONTROL_KEY].status())


async def _connections(request: web.Request) -> web.Response:
    query = request.query
    filters = {k: query.get(k) for k in query}
    control = request.app[_CONTROL_KEY]
    return web.json_response({"connections": control.connections(**filters)})


async def _close(request: web.Request) -> web.Response:
    body = await _body(request)
    result = request.app[_CONTROL_KEY].close(body, peer_of(request))
    return web.json_response(result)


async def _progress(request: web.Request) -> web.Response:
    control = request.app[_CONTROL_KEY]
    return web.json_response(control.close_progress(request.match_info["job"]))


async def _bans(request: web.Request) -> web.Response:
    return web.json_response({"bans": request.app[_CONTROL_KEY].bans()})


async def _ban(request: web.Request) -> web.Response:
    body = await _body(request)
    return web.json_response(await request.app[_CONTROL_KEY].ban(body, peer_of(request)))


async def _unban(request: web.Request) -> web.Response:
    body = await _body(request)
    return web.json_response(await request.app[_CONTROL_KEY].unban(body, peer_of(request)))


async def _pause(request: web.Request) -> web.Response:
    body = await _body(request)
    _only(body, "vhost")
    return web.json_response(request.app[_CONTROL_KEY].pause(body.get("vhost"),
                                                             peer_of(request)))


async def _resume(request: web.Request) -> web.Response:
    body = await _body(request)
    _only(body, "vhost")
    return web.json_response(request.app[_CONTROL_KEY].resume(body.get("vhost"),
                                                              peer_of(request)))


def _only(body: dict[str, Any], key: str) -> None:
    extra = set(body) - {key}
    if extra:
        raise ControlError(f"unknown field {sorted(extra)[0]!r}; expected only {key!r}")
    if key not in body:
        raise ControlError(f"missing field {key!r}")


def build_app(control: Control, token: str = "", forwarded_peer: bool = False
              ) -> web.Application:
    """The admin API as an aiohttp application (the routes of the module docstring).

    Args:
        control: what the handlers call.
        token: the bearer token TCP requests must carry ("" refuses every TCP request).
        forwarded_peer: trust ``X-Admin-Peer`` (a worker's private socket, which only the
            service's own user can reach).
    """
    app = _application(token, _Handlers(_status, _connections, _close, _progress, _pause,
                                        _resume, _bans, _ban, _unban))
    app[_CONTROL_KEY] = control
    app[_FORWARDED_KEY] = forwarded_peer
    return app


@dataclass(frozen=True, slots=True)
class _Handlers:
    """The handler of each route of the module docstring's table."""

    status: Any
    connections: Any
    close: Any
    progress: Any
    pause: Any
    resume: Any
    bans: Any
    ban: Any
    unban: Any


def _application(token: str, h: _Handlers) -> web.Application:
    """The API's routes (the module docstring's table) served by ``h``, behind the token
    guard."""
    app = web.Application(middlewares=[_guard], client_max_size=MAX_BODY)
    app[_TOKEN_KEY] = token
    app.router.add_get(f"{API_PREFIX}/status", h.status)
    app.router.add_get(f"{API_PREFIX}/connections", h.connections)
    app.router.add_post(f"{API_PREFIX}/connections/close", h.close)
    app.router.add_get(f"{API_PREFIX}/connections/close/{{job}}", h.progress)
    app.router.add_post(f"{API_PREFIX}/vhosts/pause", h.pause)
    app.router.add_post(f"{API_PREFIX}/vhosts/resume", h.resume)
    app.router.add_get(f"{API_PREFIX}/bans", h.bans)
    app.router.add_post(f"{API_PREFIX}/bans/add", h.ban)
    app.router.add_post(f"{API_PREFIX}/bans/remove", h.unban)
    return app


#: Mode of an admin-socket directory the daemon creates (the unit's RuntimeDirectoryMode).
RUNTIME_DIR_MODE = 0o750


def bind_unix_socket(path: str, group: str | None) -> socket.socket:
    """Create the admin socket at ``path``: bound, mode 0660, group ``group``, listening.

    A stale socket file (nobody accepts on it) is replaced; a live one means another daemon
    is running, and a path that is not a socket is never removed.

    A missing directory is created as the unit's ``RuntimeDirectory=`` would (mode 0750, owned
    by the user the daemon runs as) when the daemon may: run in the foreground as root, or
    under a directory it can write; else the error says how to create it.

    Raises:
        OSError: it cannot be made (the message says why), e.g. the directory is missing and
            cannot be created.
    """
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        try:
            os.mkdir(parent, RUNTIME_DIR_MODE)
        except FileNotFoundError:
            raise OSError(f"{parent} does not exist (nor its parent)") from None
        except PermissionError:
            raise OSError(
                f"{parent} does not exist and this user may not create it: under systemd the "
                f"unit's RuntimeDirectory= makes it; in the foreground run `install -d -m 0750 "
                f"-o USER -g USER {parent}` as root first") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: left by a process that is gone
        else:
            raise OSError(f"{path} is in use (another amqp-policy-proxy is running?)")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        # nobody can connect before listen(): set mode and group first
        os.chmod(path, SOCKET_MODE)
        if group is not None:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return sock


@dataclass(eq=False)
class AdminServer:
    """The admin interface of one daemon: started after the listeners, stopped at exit.

    It serves the application ``build(token)`` makes (:func:`build_app`, or
    :func:`build_workers_app` in a workers' parent) as ``config`` says; ``source`` names the
    config file in errors.
    """

    build: Callable[[str], web.Application]
    config: AdminConfig
    source: str | None = None
    runner: web.AppRunner | None = field(default=None, init=False)
    socket_path: str | None = field(default=None, init=False)
    """The Unix socket served, once started."""
    tcp_address: str | None = field(default=None, init=False)
    """The TCP address served (``HOST:PORT``), once started."""

    async def start(self) -> None:
        """Create the socket (and the TCP listener) and serve.

        Raises:
            BindError: the socket or the TCP address cannot be made or bound, or the token
                file cannot be read or is empty; nothing stays bound.
        """
        config = self.config
        token = ""
        if config.token_file is not None:
            token = self._read_token(config.token_file)
        self.runner = web.AppRunner(self.build(token), access_log=None, handle_signals=False)
        await self.runner.setup()
        try:
            if config.socket is not None:
                try:
                    sock = bind_unix_socket(config.socket, config.group)
                except OSError as exc:
                    raise self._error("admin.socket", config.socket, exc) from None
                await web.SockSite(self.runner, sock).start()
                self.socket_path = config.socket
            if config.address is not None:
                site = web.TCPSite(self.runner, config.address.host, config.address.port,
                                   reuse_address=True)
                try:
                    await site.start()
                except OSError as exc:
                    raise self._error("admin.address", str(config.address), exc) from None
                bound = [a for a in self.runner.addresses if isinstance(a, tuple)][0]
                host = bound[0]
                self.tcp_address = (f"[{host}]:{bound[1]}" if ":" in host
                                    else f"{host}:{bound[1]}")
        except BaseException:
            await self.stop()
            raise

    def _read_token(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise self._error("admin.token_file", path, exc) from None
        if not token:
            where = f"{self.source}: " if self.source else ""
            raise BindError([f"{where}admin.token_file: {path} is empty"])
        return token

    def _error(self, key: str, what: str, exc: BaseException) -> BindError:
        where = f"{self.source}: " if self.source else ""
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return BindError([f"{where}{key}: cannot use {what}: {reason}"])

    async def stop(self) -> None:
        """Stop serving and remove the socket file."""
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            self.socket_path = None


async def serve_admin(host: ControlHost, config: AdminConfig, source: str | None
                      ) -> AdminServer:
    """Start the admin interface of one daemon (``[admin]``): operator control over ``host``.

    Raises:
        BindError: the socket or the TCP address cannot be bound (nothing stays bound).
    """
    control = Control(host)
    admin = AdminServer(lambda token: build_app(control, token, config.forwarded_peer),
                        config, source)
    await admin.start()
    return admin


# ---------------------------------------------------------------------- a workers' parent


@dataclass(frozen=True, slots=True)
class WorkerAdmin:
    """One running worker's private admin socket (``--workers N``)."""

    index: int
    pid: int
    socket: str


@dataclass(slots=True)
class _Answer:
    worker: WorkerAdmin
    status: int
    body: Any


async def _ask(worker: WorkerAdmin, method: str, path: str, query: str, body: Any,
               peer: Peer) -> _Answer:
    """One request to one worker; a worker that does not answer is a 503 answer."""
    url = f"http://worker{path}" + (f"?{query}" if query else "")
    headers = {PEER_HEADER: json.dumps(asdict(peer))}
    try:
        connector = aiohttp.UnixConnector(path=worker.socket)
        timeout = aiohttp.ClientTimeout(total=WORKER_TIMEOUT)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            async with session.request(method, url, json=body, headers=headers) as resp:
                return _Answer(worker, resp.status, await resp.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
        return _Answer(worker, 503, {"error": f"worker {worker.index} did not answer: {exc}"})


async def _fan_out(request: web.Request, workers: Sequence[WorkerAdmin], body: Any = None
                   ) -> list[_Answer]:
    if not workers:
        raise ControlError("no worker is running", status=503)
    peer = peer_of(request)
    return list(await asyncio.gather(*(
        _ask(w, request.method, request.path, request.query_string, body, peer)
        for w in workers)))


def _first_error(answers: Sequence[_Answer]) -> web.Response | None:
    """The first answer that is not 200, when every worker failed alike (a bad request is
    refused by all of them), or any worker did not answer."""
    failed = [a for a in answers if a.status != 200]
    if not failed:
        return None
    unanswered = [a for a in failed if a.status == 503]
    first = (unanswered or failed)[0]
    if unanswered or len(failed) == len(answers):
        return web.json_response(first.body, status=first.status)
    return None


def _workers(request: web.Request) -> list[WorkerAdmin]:
    return request.app[_WORKERS_KEY]()


async def _workers_status(request: web.Request) -> web.Response:
    answers = await _fan_out(request, _workers(request))
    error = _first_error(answers)
    if error is not None:
        return error
    statuses = [a.body for a in answers]
    merged = dict(statuses[0])
    merged["pid"] = os.getpid()
    merged["workers"] = len(statuses)
    merged["draining"] = any(s.get("draining") for s in statuses)
    merged["uptime_seconds"] = max(s.get("uptime_seconds", 0) for s in statuses)
    per_vhost: dict[str, int] = {}
    transports = admitted = 0
    for s in statuses:
        conns = s.get("connections", {})
        transports += conns.get("transports", 0)
        admitted += conns.get("admitted", 0)
        for vhost, n in conns.get("per_vhost", {}).items():
            per_vhost[vhost] = per_vhost.get(vhost, 0) + n
    merged["connections"] = {"transports": transports, "admitted": admitted,
                             "per_vhost": per_vhost}
    ledger = dict(merged.get("ledger", {}))
    ledger["transports"] = sum(s.get("ledger", {}).get("transports", 0) for s in statuses)
    merged["ledger"] = ledger
    merged["paused_vhosts"] = sorted(set().union(*(s.get("paused_vhosts", [])
                                                  for s in statuses)))
    merged["per_worker"] = [
        {"worker": a.worker.index, "pid": a.body.get("pid"),
         "uptime_seconds": a.body.get("uptime_seconds"),
         "connections": a.body.get("connections", {}).get("admitted", 0),
         "ledger_mode": a.body.get("ledger", {}).get("mode")}
        for a in answers]
    return web.json_response(merged)


async def _workers_connections(request: web.Request) -> web.Response:
    answers = await _fan_out(request, _workers(request))
    error = _first_error(answers)
    if error is not None:
        return error
    rows = []
    for a in answers:
        for row in a.body.get("connections", []):
            rows.append({**row, "worker": a.worker.index})
    return web.json_response({"connections": rows})


async def _workers_close(request: web.Request) -> web.Response:
    body = await _body(request)
    workers = _workers(request)
    conn_id = body.get("id")
    if isinstance(conn_id, str):
        # a connection id starts with its worker's pid (hex): only that worker is asked; an
        # id of nobody's goes to the first worker, which refuses it (and records that)
        owner = [w for w in workers if conn_id.startswith(f"{w.pid:x}-")]
        workers = owner or workers[:1]
    rate = body.get("rate")
    if rate is not None:
        return await _workers_paced_close(request, workers, body)
    answers = await _fan_out(request, workers, body)
    error = _first_error(answers)
    if error is not None:
        return error
    ids = [i for a in answers if a.status == 200 for i in a.body.get("ids", [])]
    return web.json_response({"closed": len(ids), "ids": ids})


async def _workers_paced_close(request: web.Request, workers: list[WorkerAdmin],
                               body: dict[str, Any]) -> web.Response:
    """A paced close over several workers: each closes its own share of the selected
    connections at its share of the rate (its count over the total), so that all of them
    together close at the rate and finish together; one job id for all."""
    rate = body.get("rate")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
        raise ControlError("rate must be a number of closes per second, more than 0")
    filters = {k: v for k, v in body.items() if k in ("user", "vhost", "host")
               and isinstance(v, str)}
    peer = peer_of(request)
    if workers and len(workers) > 1 and filters:
        counted = await asyncio.gather(*(
            _ask(w, "GET", f"{API_PREFIX}/connections", urlencode(filters), None, peer)
            for w in workers))
        shares = {a.worker.index: sum(1 for row in a.body.get("connections", [])
                                      if row.get("state") == "opened")
                  for a in counted if a.status == 200}
        total = sum(shares.values())
        chosen = [w for w in workers if shares.get(w.index, 0) > 0] or workers[:1]
    else:
        shares, total, chosen = {}, 0, workers
    job = body.get("job") or f"{os.getpid():x}-j{next(_PARENT_JOBS)}"
    answers = []
    for w in chosen:
        part = rate * shares[w.index] / total if total else rate
        answers.append(_ask(w, "POST", request.path, "", {**body, "rate": part, "job": job},
                            peer))
    got = list(await asyncio.gather(*answers))
    error = _first_error(got)
    if error is not None:
        return error
    ok = [a for a in got if a.status == 200]
    ids = [i for a in ok for i in a.body.get("ids", [])]
    return web.json_response({"job": job, "closing": len(ids), "ids": ids, "rate": rate,
                              "closed": 0, "eta_seconds": max(
                                  (a.body.get("eta_seconds", 0) for a in ok), default=0)})


async def _workers_progress(request: web.Request) -> web.Response:
    answers = await _fan_out(request, _workers(request))
    unanswered = [a for a in answers if a.status not in (200, 404)]
    if unanswered:
        return web.json_response(unanswered[0].body, status=unanswered[0].status)
    found = [a.body for a in answers if a.status == 200]
    if not found:
        return web.json_response(answers[0].body, status=404)
    merged: dict[str, Any] = {"job": request.match_info["job"]}
    for key in ("total", "closed", "skipped", "remaining", "rate"):
        merged[key] = sum(p.get(key, 0) for p in found)
    for key in ("elapsed_seconds", "eta_seconds"):
        merged[key] = max(p.get(key, 0) for p in found)
    merged["done"] = all(p.get("done") for p in found)
    merged["cancelled"] = any(p.get("cancelled") for p in found)
    return web.json_response(merged)


async def _workers_bans(request: web.Request) -> web.Response:
    answers = await _fan_out(request, _workers(request))
    error = _first_error(answers)
    if error is not None:
        return error
    seen: dict[tuple[str, str], Any] = {}
    for a in answers:  # one list in the fleet's store: each worker shows the same bans
        for ban in a.body.get("bans", []) if a.status == 200 else []:
            seen.setdefault((ban.get("kind"), ban.get("value")), ban)
    bans = sorted(seen.values(), key=lambda b: (b.get("kind") != "user", b.get("value")))
    return web.json_response({"bans": bans})


async def _workers_ban(request: web.Request) -> web.Response:
    body = await _body(request)
    answers = await _fan_out(request, _workers(request), body)
    failed = [a for a in answers if a.status != 200]
    if failed:  # the same request in every worker: a refusal is everyone's
        return web.json_response(failed[0].body, status=failed[0].status)
    merged = dict(answers[0].body)
    if "closed" in merged:
        merged["closed"] = sorted(i for a in answers for i in a.body.get("closed", []))
        merged["replaced"] = any(a.body.get("replaced") for a in answers)
    if "lifted" in merged:
        merged["lifted"] = any(a.body.get("lifted") for a in answers)
    stored = [a.body.get("stored") for a in answers]
    merged["stored"] = any(stored) if any(v is not None for v in stored) else None
    return web.json_response(merged)


async def _workers_vhost(request: web.Request) -> web.Response:
    body = await _body(request)
    _only(body, "vhost")
    answers = await _fan_out(request, _workers(request), body)
    failed = [a for a in answers if a.status != 200]
    if failed:  # one policy in every worker: a refusal is everyone's
        return web.json_response(failed[0].body, status=failed[0].status)
    merged = dict(answers[0].body)
    merged["changed"] = any(a.body.get("changed") for a in answers)
    return web.json_response(merged)


def build_workers_app(workers: Callable[[], list[WorkerAdmin]], token: str = ""
                      ) -> web.Application:
    """The admin API of a workers' parent: the same routes, each answered by every running
    worker (``workers()``) and merged: ``status`` sums the counts (``per_worker`` lists each
    worker), ``connections`` lists every worker's (with its ``worker``), ``close`` by id asks
    the worker the id belongs to, by user, vhost or host every worker, and ``pause`` and
    ``resume`` apply in every worker, a paced ``close`` gives each worker its share of the
    rate (its selected connections over all) under one job id whose progress is summed, and
    ``bans`` add and remove apply in every worker (each writes the fleet's store; the list is
    the same in all). A worker that does not answer makes the request fail with 503 naming
    it.

    Args:
        workers: the running workers' private admin sockets, asked at each request.
        token: the bearer token TCP requests must carry.
    """
    app = _application(token, _Handlers(
        _workers_status, _workers_connections, _workers_close, _workers_progress,
        _workers_vhost, _workers_vhost, _workers_bans, _workers_ban, _workers_ban))
    app[_WORKERS_KEY] = workers
    return app
