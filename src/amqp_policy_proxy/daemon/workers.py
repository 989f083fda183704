"""Daemon layer. ``--workers N``: N processes, each a whole proxy with its own event loop on the
same listeners, supervised by the parent (docs/fleet.md, "Workers").

The parent binds every listener once (``SO_REUSEPORT``, not listening: it only resolves port 0
and keeps the port reserved for restarts) and starts each worker as ``python -m
amqp_policy_proxy`` with its own command line and these variables:

- ``AMQP_POLICY_PROXY_WORKER`` (its number), ``..._PORTS`` (the listener ports),
  ``..._LEDGER`` (the ledger URL, ``ledger = "auto"`` resolved) and ``..._PROXY_ID`` (the
  base proxy id; the worker is ``<id>/w<number>``);
- ``NOTIFY_SOCKET``: a datagram socket of the parent's, one per worker. A worker speaks
  sd_notify exactly as under systemd (``READY=1``, ``RELOADING=1``, ``WATCHDOG=1``,
  ``STOPPING=1``, plus ``METRICS_PORT=`` for its private metrics endpoint); the parent
  turns them into one conversation with systemd: ``READY=1`` once every worker listens, one
  ``RELOADING=1``/``READY=1`` per SIGHUP once every worker has reloaded, ``WATCHDOG=1``
  only while every worker pings.

Each worker listens with ``SO_REUSEPORT``: the kernel spreads new connections over the
workers' listening sockets. Each worker counts in the shared ledger under its own proxy id,
so limits hold across the workers (and across hosts). A worker that exits unexpectedly is
started again after a back-off (1 s, doubling to 10 s; reset after a minute of running).
SIGHUP is forwarded to every worker; SIGTERM/SIGINT drain every worker (a second one: at
once). The parent serves ``--metrics`` with every worker's metrics merged
(:mod:`~amqp_policy_proxy.metrics.merge`) and ``/healthz``, ``/readyz`` for all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..fleet.private_redis import PrivateRedis, PrivateRedisError
from . import systemd
from .settings import Address, AdminConfig, BindError, ConfigError, DaemonConfig

if TYPE_CHECKING:
    from .admin import WorkerAdmin

logger = logging.getLogger(__name__)

WORKER_ENV = "AMQP_POLICY_PROXY_WORKER"
PORTS_ENV = "AMQP_POLICY_PROXY_WORKER_PORTS"
LEDGER_ENV = "AMQP_POLICY_PROXY_WORKER_LEDGER"
PROXY_ID_ENV = "AMQP_POLICY_PROXY_WORKER_PROXY_ID"
ADMIN_ENV = "AMQP_POLICY_PROXY_WORKER_ADMIN"
#: Restart back-off of a crashed worker, seconds: first, cap; reset after STABLE_SECONDS.
BACKOFF_FIRST, BACKOFF_MAX, STABLE_SECONDS = 1.0, 10.0, 60.0
#: Seconds the parent waits for every worker's READY=1 after a reload.
RELOAD_WAIT = 60.0


def worker_config(config: DaemonConfig, env: Mapping[str, str] | None = None
                  ) -> DaemonConfig | None:
    """The configuration of a worker started by :class:`Supervisor` (None: not a worker).

    The listeners get the ports the parent resolved (with ``SO_REUSEPORT``), the metrics go
    to a private ``127.0.0.1:0`` endpoint (the parent serves the merged ones), the ledger
    URL is the parent's (``auto`` resolved) and the proxy id is ``<base>/w<number>``.
    """
    e = os.environ if env is None else env
    if WORKER_ENV not in e:
        return None
    admin = config.admin
    if admin is not None:
        # the parent serves [admin]; the worker answers it on a private socket only
        admin = AdminConfig(socket=e[ADMIN_ENV], forwarded_peer=True) if e.get(ADMIN_ENV) \
            else None
    index = int(e[WORKER_ENV])
    ports = [int(p) for p in e.get(PORTS_ENV, "").split(",") if p]
    listeners = tuple(replace(lc, address=Address(lc.address.host, port))
                      for lc, port in zip(config.listeners, ports, strict=False))
    ledger = config.ledger
    if ledger is not None:
        ledger = replace(ledger, url=e.get(LEDGER_ENV, ledger.url),
                         proxy_id=f"{e.get(PROXY_ID_ENV, ledger.proxy_id)}/w{index}")
    return replace(config, listeners=listeners or config.listeners, workers=1,
                   reuse_port=True, ledger=ledger, worker=index, admin=admin,
                   metrics_address=(Address("127.0.0.1", 0)
                                    if config.metrics_address is not None else None))


@dataclass(slots=True)
class Worker:
    """One supervised worker process."""

    index: int
    notify_path: str
    sock: socket.socket
    admin_path: str = ""
    """The worker's private admin socket (with ``[admin]``), in the parent's directory."""
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    ready: bool = False
    reloading: bool = False
    metrics_port: int | None = None
    last_ping: float = 0.0
    backoff: float = BACKOFF_FIRST
    restarts: int = 0
    exits: list[int] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        """The process runs."""
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    """The parent of ``--workers N`` (see the module docstring).

    Args:
        config: the validated configuration (``workers`` > 1, a ledger).
        argv: the command line to start each worker with (``run ...``).
    """

    def __init__(self, config: DaemonConfig, argv: list[str]) -> None:
        self.config = config
        self.argv = argv
        self.workers: list[Worker] = []
        self.stopping = False
        self.ports: list[int] = []
        self.ledger_url = config.ledger.url if config.ledger is not None else ""
        self.proxy_id = ""
        self._reserved: list[socket.socket] = []
        self._redis: PrivateRedis | None = None
        self._dir = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._announced = False
        self._stop = asyncio.Event()
        self._stops = 0
        self.exit_code = 0
        """0 after a clean stop; 2 when a worker refused the configuration at start."""
        self._metrics: object | None = None
        self._admin: object | None = None
        self._heartbeat = time.monotonic()

    # ------------------------------------------------------------------ start

    def _reserve_ports(self) -> None:
        """Bind every listener once to resolve port 0 and keep the port (not listening)."""
        for index, lc in enumerate(self.config.listeners):
            family = socket.AF_INET6 if ":" in lc.address.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            try:
                sock.bind((lc.address.host, lc.address.port))
            except OSError as exc:
                sock.close()
                where = f"{self.config.source}: " if self.config.source else ""
                raise BindError([f"{where}listener[{index}].address: cannot listen on "
                                 f"{lc.address}: {os.strerror(exc.errno or 0) or exc}"]
                                ) from None
            self._reserved.append(sock)
            self.ports.append(sock.getsockname()[1])

    async def run(self) -> int:
        """Start every worker, supervise them until SIGTERM/SIGINT, drain them, clean up.

        Returns:
            0 after a clean stop, 2 when a worker refused the configuration at start.

        Raises:
            BindError: a listener cannot be bound.
            ConfigError: ``ledger = "auto"`` cannot start its redis-server.
        """
        self._loop = loop = asyncio.get_running_loop()
        self._reserve_ports()
        try:
            if self.ledger_url == "auto":
                # started from this (the main) thread, so that it ends with this process
                self._redis = PrivateRedis(self.config.runtime_dir, preexec_fn=die_with_parent)
                try:
                    self.ledger_url = self._redis.start()
                except PrivateRedisError as exc:
                    raise ConfigError([f"ledger: {exc}"]) from None
            ledger = self.config.ledger
            self.proxy_id = (ledger.proxy_id if ledger is not None and ledger.proxy_id
                             else f"{socket.gethostname()}:{self.ports[0] if self.ports else 0}")
            # the workers' sockets go under the runtime directory when there is one ([daemon]
            # runtime_directory, else $RUNTIME_DIRECTORY: systemd removes it at stop even
            # after a SIGKILL of this process), else under the temporary directory
            runtime = (self.config.runtime_dir
                       or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0])
            self._dir = tempfile.mkdtemp(prefix="amqp-policy-proxy-workers-",
                                         dir=runtime if runtime and os.path.isdir(runtime)
                                         else None)
            for index in range(self.config.workers):
                path = os.path.join(self._dir, f"w{index}.sock")
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.bind(path)
                sock.setblocking(False)
                worker = Worker(index, path, sock,
                                admin_path=os.path.join(self._dir, f"admin.w{index}.sock"))
                self.workers.append(worker)
                loop.add_reader(sock, self._on_notify, worker)
            self._install_signals()
            self._start_metrics()
            await self._start_admin()
            for worker in self.workers:
                await self._spawn(worker)
            tasks = [loop.create_task(self._watch(w)) for w in self.workers]
            watchdog = loop.create_task(self._watchdog())
            ticker = loop.create_task(self._tick())
            await self._stop.wait()
            await self._drain()
            for task in (*tasks, watchdog, ticker):
                task.cancel()
            return self.exit_code
        finally:
            await self._cleanup()

    def _worker_env(self, worker: Worker) -> dict[str, str]:
        env = dict(os.environ)
        env.update({WORKER_ENV: str(worker.index),
                    PORTS_ENV: ",".join(map(str, self.ports)),
                    LEDGER_ENV: self.ledger_url, PROXY_ID_ENV: self.proxy_id,
                    ADMIN_ENV: worker.admin_path if self.config.admin is not None else "",
                    "NOTIFY_SOCKET": worker.notify_path})
        env.pop("WATCHDOG_PID", None)
        if systemd.watchdog_interval() is None:
            env.pop("WATCHDOG_USEC", None)
        env.pop("LISTEN_FDS", None)
        return env

    async def _spawn(self, worker: Worker) -> None:
        worker.ready = False
        worker.reloading = False
        worker.metrics_port = None
        worker.last_ping = time.monotonic()
        worker.started = time.monotonic()
        worker.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "amqp_policy_proxy", *self.argv,
            env=self._worker_env(worker), stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=die_with_parent)
        logger.info("worker %d started (pid %d)", worker.index, worker.proc.pid)

    async def _watch(self, worker: Worker) -> None:
        """Restart the worker when it exits unexpectedly, with a back-off."""
        while True:
            assert worker.proc is not None
            code = await worker.proc.wait()
            worker.ready = False
            worker.exits.append(code)
            self._changed.set()
            if self.stopping:
                return
            if code == 2 and not self._announced:
                # a worker refused the configuration (a policy or TLS file, a bind): every
                # worker would; stop with the same exit code instead of restarting forever
                logger.error("worker %d refused the configuration (exit 2): stopping",
                             worker.index)
                self.exit_code = 2
                self._stop.set()
                return
            ran = time.monotonic() - worker.started
            if ran > STABLE_SECONDS:
                worker.backoff = BACKOFF_FIRST
            logger.error("worker %d (pid %d) exited with %s after %.1f s; starting it again "
                         "in %.0f s", worker.index, worker.proc.pid, _exit_text(code), ran,
                         worker.backoff)
            await asyncio.sleep(worker.backoff)
            worker.backoff = min(BACKOFF_MAX, worker.backoff * 2)
            if self.stopping:
                return
            worker.restarts += 1
            await self._spawn(worker)

    # ------------------------------------------------------------------ sd_notify from workers

    def _on_notify(self, worker: Worker) -> None:
        while True:
            try:
                data = worker.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode(errors="replace").split("\n")
                          if "=" in line)
            if fields.get("WATCHDOG") == "1":
                worker.last_ping = time.monotonic()
            if "METRICS_PORT" in fields:
                with contextlib.suppress(ValueError):
                    worker.metrics_port = int(fields["METRICS_PORT"])
            if fields.get("RELOADING") == "1":
                worker.reloading = True
            if fields.get("READY") == "1":
                worker.ready = True
                worker.reloading = False
                worker.last_ping = time.monotonic()
            if fields.get("STOPPING") == "1":
                worker.ready = False
            self._changed.set()
            if not self._announced and all(w.ready for w in self.workers):
                self._announced = True
                systemd.notify(f"READY=1\nSTATUS={self.status()}")
                logger.info("all %d workers listening on ports %s; ledger %s", len(self.workers),
                            ",".join(map(str, self.ports)), self.ledger_url.rpartition("@")[2])

    def status(self) -> str:
        """One line for systemd ``STATUS=``."""
        ready = sum(w.ready for w in self.workers)
        return f"{ready}/{len(self.workers)} workers ready, proxy id {self.proxy_id}"

    async def _watchdog(self) -> None:
        """``WATCHDOG=1`` to systemd while every worker pings within the period."""
        interval = systemd.watchdog_interval()
        if interval is None:
            return
        period = interval * 2
        while True:
            now = time.monotonic()
            if all(w.alive and now - w.last_ping < period for w in self.workers):
                systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _tick(self) -> None:
        while True:
            self._heartbeat = time.monotonic()
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ signals

    def _install_signals(self) -> None:
        loop = self._loop
        assert loop is not None
        loop.add_signal_handler(signal.SIGTERM, self._request_stop, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._request_stop, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload()))

    def _request_stop(self, why: str) -> None:
        self._stops += 1
        if self._stops > 1:  # a second signal: every worker exits at once
            self._signal_all(signal.SIGTERM)
            return
        logger.info("%s: draining %d workers", why, len(self.workers))
        self._stop.set()

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.alive:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(sig)  # type: ignore[union-attr]

    async def reload(self) -> bool:
        """SIGHUP: reload every worker; one ``RELOADING=1``/``READY=1`` for systemd.

        Returns:
            True when every worker answered READY=1 within :data:`RELOAD_WAIT`.
        """
        systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}\n"
                       "STATUS=reloading every worker")
        for worker in self.workers:
            worker.reloading = worker.alive
        self._signal_all(signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_WAIT
        while any(w.reloading and w.alive for w in self.workers):
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        done = not any(w.reloading and w.alive for w in self.workers)
        systemd.notify(f"READY=1\nSTATUS={self.status()}")
        return done

    async def _drain(self) -> None:
        self.stopping = True
        systemd.notify(f"STOPPING=1\nSTATUS=draining {len(self.workers)} workers")
        self._signal_all(signal.SIGTERM)
        for worker in self.workers:
            if worker.proc is not None:
                await worker.proc.wait()
        logger.info("every worker stopped")

    async def _cleanup(self) -> None:
        self.stopping = True
        self._signal_all(signal.SIGKILL)
        for worker in self.workers:
            if self._loop is not None:
                self._loop.remove_reader(worker.sock)
            worker.sock.close()
        if self._metrics is not None:
            self._metrics.stop()  # type: ignore[attr-defined]
        if self._admin is not None:
            await self._admin.stop()  # type: ignore[attr-defined]
        for sock in self._reserved:
            sock.close()
        if self._redis is not None:
            await asyncio.to_thread(self._redis.stop)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    # ------------------------------------------------------------------ the admin interface

    def admin_workers(self) -> list[WorkerAdmin]:
        """The workers that answer the admin interface now (running and ready)."""
        from .admin import WorkerAdmin  # aiohttp is loaded only with an [admin] socket

        return [WorkerAdmin(w.index, w.proc.pid, w.admin_path) for w in self.workers
                if w.alive and w.ready and w.proc is not None]

    async def _start_admin(self) -> None:
        """Serve ``[admin]`` here, answered by every worker (:func:`~.admin.build_workers_app`).

        Raises:
            BindError: the socket or address cannot be used.
        """
        admin = self.config.admin
        if admin is None:
            return
        from .admin import AdminServer, build_workers_app

        server = AdminServer(lambda token: build_workers_app(self.admin_workers, token),
                             admin, self.config.source)
        await server.start()
        self._admin = server

    # ------------------------------------------------------------------ metrics and probes

    def _endpoints(self) -> list[tuple[str, str]]:
        return [(str(w.index), f"http://127.0.0.1:{w.metrics_port}")
                for w in self.workers if w.alive and w.metrics_port]

    def _start_metrics(self) -> None:
        addr = self.config.metrics_address
        if addr is None:
            return
        from ..metrics.exposition import start_metrics_server
        from ..metrics.merge import scrape_workers
        from ..metrics.registry import build_registry

        def app(environ: dict[str, object], start_response: object) -> list[bytes]:
            body, missing = scrape_workers([(w, u + "/metrics") for w, u in self._endpoints()])
            headers = [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")]
            if missing:
                headers.append(("X-Missing-Workers", ",".join(missing)))
            start_response("200 OK", headers)  # type: ignore[operator]
            return [body]

        try:
            self._metrics = start_metrics_server(
                build_registry(process_metrics=False), addr.host, addr.port, app=app,
                probes={"/healthz": self._probe_health, "/readyz": self._probe_ready})
        except OSError as exc:
            where = f"{self.config.source}: " if self.config.source else ""
            raise BindError([f"{where}metrics.address: cannot listen on {addr}: "
                             f"{os.strerror(exc.errno or 0) or exc}"]) from None

    def _probe_health(self) -> tuple[bool, str]:
        if time.monotonic() - self._heartbeat > 5.0:
            return False, "supervisor loop stalled"
        down = [str(w.index) for w in self.workers if not w.alive]
        if down:
            return False, f"workers not running: {', '.join(down)}"
        return True, "ok"

    def _probe_ready(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "draining"
        lines = []
        ok = True
        for worker in self.workers:
            if not worker.alive or not worker.metrics_port:
                ok = False
                lines.append(f"worker {worker.index}: not running")
                continue
            try:
                url = f"http://127.0.0.1:{worker.metrics_port}/readyz"
                with urllib.request.urlopen(url, timeout=2.0) as resp:  # noqa: S310
                    lines.append(f"worker {worker.index}: {resp.read().decode().strip()}")
            except urllib.error.HTTPError as exc:
                ok = False
                lines.append(f"worker {worker.index}: {exc.read().decode().strip()}")
            except OSError as exc:
                ok = False
                lines.append(f"worker {worker.index}: {exc}")
        return ok, "\n".join(lines)


def die_with_parent() -> None:
    """In the child before exec: SIGTERM (a drain) when the parent dies, however it dies
    (Linux ``PR_SET_PDEATHSIG``), so that no worker (and no private redis-server) outlives
    the process that started it. The parent must fork from its main thread: the signal
    follows the forking thread's end, not the process's."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


async def run_supervisor(config: DaemonConfig, argv: list[str]) -> int:
    """Run ``config.workers`` workers until stopped (see :class:`Supervisor`)."""
    return await Supervisor(config, argv).run()
