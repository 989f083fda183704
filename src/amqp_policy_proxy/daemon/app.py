"""The daemon's lifecycle: startup → serve → shutdown, reload on SIGHUP (uvicorn ``Server`` shape).

:class:`Daemon` owns the current policy snapshot and the listeners, is the relay's host (each
accepted transport, its core connection, the upstreams to try) and fans core events out to
metrics and the event log. Its parts live beside it: the counts (:mod:`.ledgers`), TLS
contexts (:mod:`.tls`), the listeners (:mod:`.listeners`), readiness (:mod:`.health`), the
metrics snapshot and status lines (:mod:`.snapshots`), metrics and event-log outputs
(:mod:`.outputs`), SIGHUP reloads (:mod:`.reload`), the drain (:mod:`.drain`); :mod:`.run` runs
it. Signal handlers only schedule work on the loop (gunicorn's rule).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..core.connection import ProxyConnection
from ..core.events import ConnectionDenied, PolicyReloaded, ProxyEvent, SaslFailed
from ..fleet.ledger import FleetLedger
from ..ingress.peer import ClientAddress, client_address
from ..limits.connections import ConnectionLedger
from ..limits.rates import RateLimits
from ..metrics.recent import RecentFailures
from ..policy.model import Policy
from ..policy.naming import Naming
from ..policy.reasons import ConnectionDenyReason
from . import systemd
from .bans import BanService
from .compaction import Compactor, compact_command
from .drain import StopRequest, drain_connections, log_stop
from .health import Probes, readiness
from .ledgers import Ledgers
from .listeners import bind_listeners
from .outputs import LedgerFigures, proxy_info_header, start_outputs, stop_outputs
from .pacing import PacedCloser
from .preauth import PreauthBudget
from .probe import UpstreamProber
from .proxy_listener import ProxyProtocolServer
from .relay import ClientProtocol
from .reload import Reloader, load_configured_policy, log_policy_warnings
from .settings import BindError, DaemonConfig, UpstreamConfig
from .snapshots import Snapshots, start_line, status_line
from .tls import TlsContexts
from .tokens import TokenService
from .upstreams import UpstreamHealth

logger = logging.getLogger(__name__)

#: Peer addresses remembered (parsed) by :meth:`Daemon.peer_address`.
PEER_MEMO_SIZE = 4096


class Daemon:
    """One running proxy process."""

    def __init__(self, config: DaemonConfig, *, policy: Policy | None = None,
                 event_sink: Callable[[ProxyEvent | PolicyReloaded], None] | None = None) -> None:
        """Create the daemon; nothing is bound until :meth:`start`.

        Args:
            config: the validated configuration.
            policy: an already-loaded policy (else loaded from ``config.policy_path``).
            event_sink: extra observer called with every event (tests, the demo).
        """
        self.config = config
        self.policy: Policy | None = policy
        self.ledgers = Ledgers(config.policy.max_connections, config.policy.max_connection_rate)
        """Where connections are counted (:mod:`.ledgers`): this process, or the fleet."""
        self.naming = config.upstreams[0].naming() if config.upstreams else Naming()
        """How the upstreams resolve names (one for all: the config validates it)."""
        self.probes = Probes(self.readiness)
        """``/healthz`` and ``/readyz`` (:mod:`.health`), published on the 1 s tick."""
        self.upstream_health: UpstreamHealth[UpstreamConfig] = UpstreamHealth()
        """Failed upstreams are tried last for a back-off period (exponential, capped)."""
        self.sasl_failures = RecentFailures()
        """Failed authentications per client host in the last minute (the per-host gauge)."""
        self.prober: UpstreamProber | None = None
        """Probes every upstream on an interval (``daemon/probe.py``) once started."""
        self.revocation_closes: PacedCloser[Any] | None = None
        """The paced close of the last reload's revoked connections
        (``[policy] reevaluate_close_rate``), None before one."""
        self.preauth = PreauthBudget(config.preauth_buffer_bytes)
        """Bytes held by connections not yet admitted, under a process-wide budget."""
        self.connections: dict[str, ClientProtocol] = {}
        self.servers: list[asyncio.base_events.Server | ProxyProtocolServer] = []
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.draining = False
        self.internal_errors = 0
        self.listen_addresses: list[tuple[str, int]] = []
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}"
        self._event_sink = event_sink
        self.stopping = StopRequest()
        """The stop the signals request (:mod:`.drain`)."""
        self._wall_offset = 0.0
        self._peers: dict[str, ClientAddress] = {}
        self.snapshots = Snapshots(self, self.probes.publish)
        """The metrics snapshot and its 1 s tick (:mod:`.snapshots`)."""
        self.reloader = Reloader(self, self.status_line)
        """SIGHUP reloads (:mod:`.reload`)."""
        self._watchdog_task: asyncio.Task[None] | None = None
        self.metrics_server: Any = None
        self.observer: Any = None
        self.writer: Any = None
        self.compactor: Compactor | None = None
        """``[event_log] compact_after``: the compaction schedule (worker 0 only), else None."""
        self.tls = TlsContexts(config)
        """The listeners' and upstreams' TLS contexts (:mod:`.tls`)."""
        self.paused_vhosts: set[str] = set()
        """Vhosts an operator paused (``vhost pause``): read by every Open decision; kept
        across reloads, not restarts."""
        self.bans = BanService(self, self.naming)
        """Bans and quarantine: the ban list every Open decision reads; with ``[ledger]``
        shared with the fleet (its store is set at start)."""
        self.started_at = 0.0
        self.policy_loaded_at = 0.0
        """Loop-clock seconds of the start and of the last successful policy load."""
        self.last_reload: PolicyReloaded | None = None
        """The last policy reload's record (``ok`` or ``error`` with its issues), None before
        one: ``status`` shows it, so a rejected reload is not only in the log."""
        self.admin: Any = None
        """The admin interface (:class:`~.admin.AdminServer`) when ``[admin]`` is set."""
        self.tokens: TokenService | None = None
        """Token connections (``[token_auth]``): the JWKS fetches and the service
        identities (:mod:`.tokens`), made at :meth:`start`."""

    # ------------------------------------------------------------------ plumbing

    @property
    def wall_offset(self) -> float:
        """POSIX seconds minus loop-clock seconds, fixed at start (for the core's date checks)."""
        return self._wall_offset

    def next_conn_id(self) -> str:
        """Return a new process-unique connection id."""
        return f"{self._prefix}-{next(self._ids)}"

    def emit(self, event: ProxyEvent | PolicyReloaded) -> None:
        """Fan an event out to metrics, the event log and the optional sink. Never raises."""
        try:
            if type(event) is SaslFailed:
                self.sasl_failures.add(event.remote_host, event.at)
            self.bans.observe(event)  # quarantine: counts denials, acts on the next tick
            if self.observer is not None:
                self.observer.handle(event)
            if self.writer is not None:
                from ..eventlog.records import to_record

                record = to_record(event, wall_offset=self._wall_offset)
                if record is not None:
                    self.writer.submit(record)
            if self._event_sink is not None:
                self._event_sink(event)
        except Exception:
            logger.exception("event fan-out failed for %r", type(event).__name__)

    def observe_open_decision(self, seconds: float) -> None:
        """Record how long the call that decided a client's Open took (seconds)."""
        if self.observer is not None:
            self.observer.observe_open_decision(seconds)

    # ------------------------------------------------------------------ the relay's host

    @property
    def connect_timeout(self) -> float:
        """Seconds for one upstream connect attempt (``[timeouts] connect_seconds``)."""
        return self.config.connect_timeout_seconds

    def peer_address(self, raw: str) -> ClientAddress:
        """The client address of a socket peer, parsed once per address (clients reconnect
        from few addresses; the memo is bounded and started over when full)."""
        found = self._peers.get(raw)
        if found is None:
            if len(self._peers) >= PEER_MEMO_SIZE:
                self._peers.clear()
            found = self._peers[raw] = client_address(raw)
        return found

    def accept(self, proto: ClientProtocol,
               remote_host: ClientAddress) -> ConnectionDenyReason | None:
        """Count a new client transport, or refuse it before any byte (QDR's global
        ``maxConnections``; also while draining; then ``[policy] max_connection_rate``, and
        the pre-authentication budget)."""
        reason = self.ledgers.accept(self.loop.time(), self.draining, self.preauth.accept)
        if reason is not None:
            self.emit(ConnectionDenied(conn_id=proto.conn_id, at=self.loop.time(),
                                       remote_host=str(remote_host), listener=proto.listener,
                                       reason=reason, balancer_host=_balancer(proto)))
        return reason

    def open_connection(self, proto: ClientProtocol, remote_host: ClientAddress,
                        tls_subject: str | None,
                        tls_not_after: float | None = None) -> ProxyConnection:
        """The core of an accepted transport, under the current policy; registered."""
        conn = ProxyConnection(
            proto.conn_id, remote_host=remote_host, listener=proto.listener,
            policy=self.policy, ledger=self.ledgers.admission, now=self.loop.time(),
            handshake_timeout=self.config.handshake_seconds, tls_subject=tls_subject,
            wall_offset=self._wall_offset, balancer_host=_balancer(proto),
            paused_vhosts=self.paused_vhosts, rates=self.ledgers.connection_rates, naming=self.naming,
            tls_not_after=tls_not_after, bans=self.bans.table,
            tokens=None if self.tokens is None else self.tokens.token_auth)
        self.connections[proto.conn_id] = proto
        return conn

    def connection_finished(self, proto: ClientProtocol) -> None:
        """A client transport is gone: uncount it and forget it."""
        self.ledger.release_accept()
        self.connections.pop(proto.conn_id, None)
        if self.draining and not self.connections:
            self.stopping.drained()

    def _ledger_answer(self, conn_id: str, reason: ConnectionDenyReason | None) -> None:
        """The fleet ledger's answer to a pending admission: feed it to the connection."""
        proto = self.connections.get(conn_id)
        if proto is not None:
            proto.ledger_answered(reason)

    @property
    def ledger(self) -> ConnectionLedger:
        """This process's own counts (:attr:`.ledgers.Ledgers.ledger`)."""
        return self.ledgers.ledger

    @property
    def rates(self) -> RateLimits:
        """This process's rate buckets (:attr:`.ledgers.Ledgers.rates`)."""
        return self.ledgers.rates

    @property
    def fleet(self) -> FleetLedger | None:
        """The fleet ledger (``[ledger]``) once started, else None."""
        return self.ledgers.fleet

    @property
    def ledger_mode(self) -> str:
        """``redis``, a failure mode, or ``in-process`` (no ``[ledger]``)."""
        return self.ledgers.mode

    def readiness(self) -> tuple[bool, str]:
        """Whether a load balancer should send clients here, and why (:func:`.health.readiness`
        of this daemon now)."""
        return readiness(draining=self.draining, policy_loaded=self.policy is not None,
                         servers=self.servers, upstreams=self.config.upstreams,
                         health=self.upstream_health, now=self.loop.time(),
                         ledger_mode=self.ledger_mode)

    def preauth_held(self, proto: ClientProtocol, held: int) -> None:
        """A connection not yet admitted now holds ``held`` bytes (0: admitted or gone)."""
        self.preauth.update(proto, held, self._waiting())

    def _waiting(self) -> Iterator[ClientProtocol]:
        for proto in self.connections.values():
            conn = proto.conn
            if conn is not None and not proto.closed and not conn.view.decided:
                yield proto

    def internal_error(self, proto: ClientProtocol) -> None:
        """Count a bug contained to one connection."""
        self.internal_errors += 1
        if self.observer is not None:
            self.observer.internal_error()

    def upstreams(self) -> list[UpstreamConfig]:
        """The upstreams to try for a new connection: healthy ones first; none while every
        one is known down (its last probe or connect failed and its back-off runs): the client
        is answered at once, and the probes are told to look again now."""
        now = self.loop.time()
        if self.upstream_health.all_down(self.config.upstreams, now):
            if self.prober is not None:
                self.prober.soon()
            return []
        return self.upstream_health.order(self.config.upstreams, now)

    def upstream_connected(self, upstream: UpstreamConfig) -> None:
        """A connect to ``upstream`` succeeded: it is healthy."""
        self.upstream_health.succeeded(upstream)

    def upstream_failed(self, upstream: UpstreamConfig) -> float:
        """A connect to ``upstream`` failed: back it off; returns the back-off in seconds."""
        return self.upstream_health.failed(upstream, self.loop.time())

    def service_login(self, upstream: UpstreamConfig) -> Any:
        """The identity the proxy logs in to ``upstream`` with for token connections
        (``token_authority = "proxy"``), else None."""
        return None if self.tokens is None else self.tokens.login(upstream)

    def upstream_ssl_context(self, upstream: UpstreamConfig) -> ssl.SSLContext | None:
        """The current client-side TLS context for ``upstream`` (None for plain TCP):
        :meth:`.tls.TlsContexts.upstream`."""
        return self.tls.upstream(upstream)

    @property
    def tls_reload_failures(self) -> int:
        """SIGHUP reloads whose certificate/key files failed to load (old ones kept)."""
        return self.tls.reload_failures

    # ------------------------------------------------------------------ lifecycle

    async def start(self, *, announce: bool = True) -> None:
        """Load the policy, start metrics and the event log, bind every listener.

        Args:
            announce: call :meth:`announce_ready` at the end. ``run`` passes False and
                announces after installing its signal handlers, so that systemd never sends
                a SIGHUP the process is not ready for (the default action would kill it).

        Raises:
            PolicyError: the policy does not load (nothing is bound).
            ConfigError: a TLS certificate, key or CA file does not load, or the event log
                directory cannot be created or written (nothing is bound).
            BindError: a listener or the metrics endpoint cannot bind its address (a
                ConfigError naming the key and the address; nothing stays bound).
        """
        self.loop = asyncio.get_running_loop()
        self._wall_offset = time.time() - self.loop.time()
        self.stopping.start()
        self.started_at = self.policy_loaded_at = self.loop.time()
        if self.policy is None:
            self.policy = await asyncio.to_thread(load_configured_policy, self.config)
            log_policy_warnings(self.policy)
        self.ledger.max_connections = self.config.policy.max_connections
        self.rates.max_connection_rate = self.config.policy.max_connection_rate
        server_ssl = await self.tls.start()
        if self.config.token_auth is not None:
            self.tokens = TokenService(self.config, self.loop.time, lambda: self.connections)
            self.tokens.log_mapping_issues(self.policy)
        await self.reloader.start()
        self._start_outputs()
        if self.tokens is not None:
            await self.tokens.start(first_wait=min(self.connect_timeout, 5.0))
        try:
            self.servers = await bind_listeners(self, self.config, self.tls, server_ssl)
        except BindError:
            await self._undo_start()
            raise
        self.listen_addresses = [sock.getsockname()[:2] for server in self.servers
                                 for sock in server.sockets]
        if self.config.ledger is not None:  # the fleet ledger, before anything is accepted
            port = self.listen_addresses[0][1] if self.listen_addresses else 0
            await self.ledgers.start_fleet(self.config.ledger, port, self._ledger_answer,
                                           LedgerFigures(lambda: self.observer))
        await self.bans.start(self.config.ledger.url if self.config.ledger else None)
        self.prober = UpstreamProber(self.config.upstreams, self.upstream_health,
                                     self.upstream_ssl_context, self.connect_timeout)
        # readiness is known when the start is announced (a black hole: at most 2 s late)
        await self.prober.first_round(timeout=min(self.connect_timeout, 2.0))
        for server in self.servers:
            await server.start_serving()
        if self.config.admin is not None:
            await self._start_admin()
        self.probes.publish()
        self.snapshots.publish()
        line, fields = start_line(self)
        logger.info(line, extra=fields)
        self.snapshots.start()
        if announce:
            self.announce_ready()

    def announce_ready(self) -> None:
        """Tell systemd the listeners are up (``READY=1``) and start the watchdog pings."""
        self.snapshots.last_status = self.status_line()
        extra = ""
        if self.config.worker is not None and self.metrics_server is not None:
            extra = f"\nMETRICS_PORT={self.metrics_server.port}"  # for the workers' parent
        systemd.notify(f"READY=1\nSTATUS={self.snapshots.last_status}{extra}")
        if self._watchdog_task is None:
            self._watchdog_task = systemd.start_watchdog(self.loop)

    async def _start_admin(self) -> None:
        """Serve the admin interface (``[admin]``); undo the start if it cannot bind."""
        from .admin import serve_admin  # aiohttp: only with an [admin] socket

        assert self.config.admin is not None
        try:
            self.admin = await serve_admin(self, self.config.admin, self.config.source)
        except BindError:
            await self._undo_start()
            raise

    async def _undo_start(self) -> None:
        """Close what :meth:`start` opened before a listener failed to bind."""
        if self.tokens is not None:
            await self.tokens.stop()
        if self.prober is not None:
            await self.prober.stop()
            self.prober = None
        for server in self.servers:
            server.close()
        self.servers.clear()
        self.listen_addresses.clear()
        await self._stop_outputs()

    def _start_outputs(self) -> None:
        """Metrics, probes and the event log (:func:`.outputs.start_outputs`).

        Raises:
            ConfigError: the event-log directory; BindError: the metrics address.
        """
        out = start_outputs(self.config, lambda: self.snapshots.current,
                            self.probes.health, self.probes.ready,
                            header=proxy_info_header(self.config, self._proxy_id))
        self.registry, self.observer = out.registry, out.observer
        self.writer, self.metrics_server = out.writer, out.metrics_server
        after = self.config.event_log_compact_after
        if self.config.event_log_dir and after is not None and not self.config.worker:
            self.compactor = Compactor(compact_command(self.config.event_log_dir, after))
            self.compactor.start()

    def _proxy_id(self) -> str:
        """This proxy's name in the fleet ledger once it started, else ``""``."""
        fleet = self.ledgers.fleet
        return fleet.settings.proxy_id if fleet is not None else ""

    def status_line(self) -> str:
        """One-line status for systemd ``STATUS=`` (:func:`.snapshots.status_line`)."""
        return status_line(self)

    def publish_now(self) -> None:
        """Publish a metrics snapshot immediately (tests call this before scraping)."""
        self.snapshots.publish()

    async def reload(self) -> bool:
        """SIGHUP: reload policy files and TLS files off the event loop
        (:meth:`.reload.Reloader.reload`); True when the new policy is in force."""
        return await self.reloader.reload()

    def request_stop(self, force: bool = False, reason: str = "requested") -> None:
        """Ask the daemon to drain and exit; a second request exits at once
        (:meth:`.drain.StopRequest.request`)."""
        self.stopping.request(force, reason)

    async def serve(self) -> None:
        """Wait until a stop is requested, then shut down gracefully."""
        await self.stopping.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Drain (:func:`.drain.drain_connections`), then stop every service; ends with the
        stop line (:func:`.drain.log_stop`)."""
        self.draining = True
        self.probes.set_ready((False, "draining"))
        began = time.monotonic()
        systemd.notify(f"STOPPING=1\nSTATUS=draining {len(self.connections)} connections")
        open_at_stop, cut = await drain_connections(self.connections, self.servers,
                                                    self.stopping,
                                                    self.config.shutdown_grace_seconds)
        await self.bans.stop()
        if self.tokens is not None:
            await self.tokens.stop()
        if self.fleet is not None:  # every count is released: the fields go
            await self.fleet.stop()
        if self.prober is not None:
            await self.prober.stop()
        self.snapshots.stop()
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
        await self._stop_outputs()
        if self.admin is not None:
            await self.admin.stop()
            self.admin = None
        for server in self.servers:
            await server.wait_closed()
        log_stop(self.stopping.reason, open_at_stop, cut, time.monotonic() - began)

    async def _stop_outputs(self) -> None:
        """Stop the compaction schedule, then the event log and the metrics endpoint
        (:func:`.outputs.stop_outputs`)."""
        if self.compactor is not None:
            await self.compactor.stop()
        writer, server = self.writer, self.metrics_server
        self.compactor = self.writer = self.metrics_server = None
        await stop_outputs(writer, server)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: drain (twice: exit now); SIGHUP: reload. Handlers only schedule."""
        loop = self.loop
        loop.add_signal_handler(signal.SIGTERM,
                                functools.partial(self.request_stop, reason="SIGTERM"))
        loop.add_signal_handler(signal.SIGINT,
                                functools.partial(self.request_stop, reason="SIGINT"))
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload()))


def _balancer(proto: ClientProtocol) -> str | None:
    """The load balancer's address of a connection whose client address came from its PROXY
    header, else None."""
    return proto.proxied.balancer if proto.proxied is not None else None
