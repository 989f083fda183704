"""The daemon's lifecycle: startup → serve → shutdown, reload on SIGHUP (uvicorn ``Server`` shape).

Owns the current policy snapshot, the connection ledger (in-process, or the fleet ledger in
Redis with ``[ledger]``), the listeners, the metrics endpoint with its health probes
(``/healthz``, ``/readyz``) and the event log writer, and fans core events out to them. Signal
handlers only schedule work on the loop (gunicorn's rule).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ..core.admission import AdmissionLedger
from ..core.connection import ProxyConnection
from ..core.events import ConnectionDenied, PolicyReloaded, ProxyEvent, SaslFailed
from ..fleet.ledger import IN_PROCESS, FleetLedger, LedgerObserver
from ..fleet.rates import FleetRates
from ..ingress.peer import ClientAddress, client_address
from ..limits.connections import ConnectionLedger
from ..limits.rates import RateLimits
from ..metrics.recent import RecentFailures
from ..policy.errors import ConfigIssue, PolicyError
from ..policy.load import load_policy
from ..policy.model import Policy
from ..policy.naming import Naming
from ..policy.reasons import ConnectionDenyReason
from ..resolver import system_resolver
from . import systemd
from .bans import BanService
from .config import BindError, ConfigError, DaemonConfig, ListenerConfig, UpstreamConfig
from .pacing import PacedCloser
from .preauth import PreauthBudget
from .probe import UpstreamProber
from .proxy_listener import Proxied, ProxyProtocolServer
from .reevaluation import reevaluate_open
from .relay import ClientProtocol
from .upstreams import UpstreamHealth

logger = logging.getLogger(__name__)

#: Seconds between metrics snapshots (the scrape reads the last one).
SNAPSHOT_INTERVAL = 1.0
#: Pending connections the kernel queues on a listener before accept (``listen`` backlog).
LISTEN_BACKLOG = 4096
#: Seconds between two log lines about transports refused over ``max_connection_rate``.
RATE_LOG_INTERVAL = 10.0
#: Peer addresses remembered (parsed) by :meth:`Daemon.peer_address`.
PEER_MEMO_SIZE = 4096
#: ``/healthz`` answers 503 when the event loop has not run its 1 s tick for this long.
LOOP_STALL_SECONDS = 5.0


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
        self.ledger = ConnectionLedger(config.policy.max_connections)
        """This process's own counts (the global count at accept, and the vhost counts)."""
        self.rates = RateLimits(config.policy.max_connection_rate)
        """Connection-rate buckets and the users' shaping buckets, shared by connections."""
        self.naming = config.upstreams[0].naming() if config.upstreams else Naming()
        """How the upstreams resolve names (one for all: the config validates it)."""
        self.fleet: FleetLedger | None = None
        """The fleet ledger (``[ledger]``), started with the listeners."""
        self.admission_ledger: AdmissionLedger = self.ledger
        self.connection_rates: RateLimits | FleetRates = self.rates
        """The rate buckets connections use: the process's own, or with a fleet ledger the
        store's connection rates (:class:`~..fleet.rates.FleetRates`)."""
        """What the core admits against: the fleet ledger, else :attr:`ledger`."""
        self._heartbeat = time.monotonic()
        self._readiness: tuple[bool, str] = (False, "starting: no policy loaded yet")
        self.upstream_health: UpstreamHealth[UpstreamConfig] = UpstreamHealth()
        self.sasl_failures = RecentFailures()
        """Failed authentications per client host in the last minute (the per-host gauge)."""
        self.prober: UpstreamProber | None = None
        self.revocation_closes: PacedCloser[Any] | None = None
        """The paced close of the last reload's revoked connections
        (``[policy] reevaluate_close_rate``), None before one."""
        """Probes every upstream on an interval (``daemon/probe.py``) once started."""
        """Failed upstreams are tried last for a back-off period (exponential, capped)."""
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
        self._stop: asyncio.Event | None = None  # created in start(), on the loop
        self._drained: asyncio.Event | None = None
        self._force = False
        self._reload_lock: asyncio.Lock | None = None
        self._wall_offset = 0.0
        self._peers: dict[str, ClientAddress] = {}
        self._snapshot: Any = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self.metrics_server: Any = None
        self.observer: Any = None
        self.writer: Any = None
        self._server_ssl: dict[int, ssl.SSLContext] = {}
        self._upstream_ssl: dict[UpstreamConfig, ssl.SSLContext] = {}
        self.tls_reload_failures = 0
        """SIGHUP reloads whose certificate/key files failed to load (old ones kept)."""
        self._last_status = ""
        self._config_digest: str | None = None
        self._stop_reason = "requested"
        self.paused_vhosts: set[str] = set()
        """Vhosts an operator paused (``vhost pause``): read by every Open decision; kept
        across reloads, not restarts."""
        self.bans = BanService(self, self.naming)
        """Bans and quarantine: the ban list every Open decision reads; with ``[ledger]``
        shared with the fleet (its store is set at start)."""
        self.started_at = 0.0
        self.policy_loaded_at = 0.0
        self.last_reload: PolicyReloaded | None = None
        """The last policy reload's record (``ok`` or ``error`` with its issues), None before
        one: ``status`` shows it, so a rejected reload is not only in the log."""
        """Loop-clock seconds of the start and of the last successful policy load."""
        self.admin: Any = None
        """The admin interface (:class:`~.admin.AdminServer`) when ``[admin]`` is set."""
        self._rate_logged = (-RATE_LOG_INTERVAL, 0)  # (when, global_denied then)

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
        reason: ConnectionDenyReason | None = None
        if self.draining or not self.ledger.try_accept():
            reason = ConnectionDenyReason.GLOBAL_LIMIT
        elif not self.rates.try_accept(self.loop.time()):
            self.ledger.release_accept()
            reason = ConnectionDenyReason.GLOBAL_RATE
            self._log_rate_refusals()
        elif not self.preauth.accept():
            self.ledger.release_accept()
            reason = ConnectionDenyReason.PREAUTH_MEMORY
        if reason is not None:
            self.emit(ConnectionDenied(conn_id=proto.conn_id, at=self.loop.time(),
                                       remote_host=str(remote_host), listener=proto.listener,
                                       reason=reason, balancer_host=_balancer(proto)))
        return reason

    def _log_rate_refusals(self) -> None:
        """One WARNING line at most every :data:`RATE_LOG_INTERVAL` seconds for transports
        refused over ``[policy] max_connection_rate`` (a storm must not flood the journal;
        each refusal is in the metrics and the event log)."""
        now = self.loop.time()
        when, before = self._rate_logged
        if now - when < RATE_LOG_INTERVAL:
            return
        denied = self.rates.global_denied
        self._rate_logged = (now, denied)
        logger.warning("refusing connections at accept over [policy] max_connection_rate "
                       "%d/s (%d refused so far, %d since the last line)",
                       self.rates.max_connection_rate, denied, denied - before)

    def open_connection(self, proto: ClientProtocol, remote_host: ClientAddress,
                        tls_subject: str | None,
                        tls_not_after: float | None = None) -> ProxyConnection:
        """The core of an accepted transport, under the current policy; registered."""
        conn = ProxyConnection(
            proto.conn_id, remote_host=remote_host, listener=proto.listener,
            policy=self.policy, ledger=self.admission_ledger, now=self.loop.time(),
            handshake_timeout=self.config.handshake_seconds, tls_subject=tls_subject,
            wall_offset=self._wall_offset, balancer_host=_balancer(proto),
            paused_vhosts=self.paused_vhosts, rates=self.connection_rates, naming=self.naming,
            tls_not_after=tls_not_after, bans=self.bans.table)
        self.connections[proto.conn_id] = proto
        return conn

    def connection_finished(self, proto: ClientProtocol) -> None:
        """A client transport is gone: uncount it and forget it."""
        self.ledger.release_accept()
        self.connections.pop(proto.conn_id, None)
        if self.draining and not self.connections and self._drained is not None:
            self._drained.set()

    def _ledger_answer(self, conn_id: str, reason: ConnectionDenyReason | None) -> None:
        """The fleet ledger's answer to a pending admission: feed it to the connection."""
        proto = self.connections.get(conn_id)
        if proto is not None:
            proto.ledger_answered(reason)

    async def _start_fleet(self) -> None:
        """Start the fleet ledger (``[ledger]``) before the listeners accept anything."""
        settings = self.config.ledger
        if settings is None:
            return
        if not settings.proxy_id:
            port = self.listen_addresses[0][1] if self.listen_addresses else 0
            settings = replace(settings, proxy_id=f"{socket.gethostname()}:{port}")
        self.fleet = FleetLedger(self.ledger, settings, on_answer=self._ledger_answer,
                                 observer=_LedgerFigures(self))
        await self.fleet.start()
        self.admission_ledger = self.fleet
        self.connection_rates = FleetRates(self.rates, self.fleet)
        logger.info("ledger %s: proxy id %s, mode %s, lease %g s, timeout %g ms, failure mode "
                    "%s", settings.url.rpartition("@")[2], settings.proxy_id, self.fleet.mode,
                    settings.lease_seconds, settings.timeout_ms, settings.failure_mode)

    async def _start_bans(self) -> None:
        """Follow the fleet's ban list (``[ledger]``) before the listeners accept anything,
        so that a restarted proxy refuses what the fleet bans from its first Open."""
        if self.config.ledger is not None:
            from ..fleet.bans import BanStore

            self.bans.store = BanStore(self.config.ledger.url)
        await self.bans.start()

    @property
    def ledger_mode(self) -> str:
        """``redis``, a failure mode, or ``in-process`` (no ``[ledger]``)."""
        return IN_PROCESS if self.fleet is None else self.fleet.mode

    def readiness(self) -> tuple[bool, str]:
        """Whether a load balancer should send clients here, and why (``/readyz``).

        Ready while listening (not draining), with a policy loaded, at least one upstream
        not in connect back-off, and the ledger in a mode that admits (``closed`` does not).
        """
        if self.draining:
            return False, "draining"
        if self.policy is None:
            return False, "no policy loaded"
        if not self.servers or not all(server.is_serving() for server in self.servers):
            return False, "not listening"
        now = self.loop.time()
        upstreams = self.config.upstreams
        health = self.upstream_health
        if upstreams and not any(health.known(u) is True and health.is_up(u, now)
                                 for u in upstreams):
            if all(health.known(u) is None for u in upstreams):
                return False, "no upstream probed yet"
            return False, "no upstream reachable (every one failed its last probe or connect)"
        if self.ledger_mode == "closed":
            return False, "ledger unreachable and failure_mode = closed"
        return True, f"ready: ledger {self.ledger_mode}"

    def _probe_health(self) -> tuple[bool, str]:
        """``/healthz``: the event loop ran its 1 s tick recently."""
        stalled = time.monotonic() - self._heartbeat
        if stalled > LOOP_STALL_SECONDS:
            return False, f"event loop stalled for {stalled:.1f} s"
        return True, "ok"

    def _probe_ready(self) -> tuple[bool, str]:
        """``/readyz``: :meth:`readiness` as the loop last published it (and a live loop)."""
        alive, why = self._probe_health()
        return self._readiness if alive else (False, why)

    def _publish_readiness(self) -> None:
        self._heartbeat = time.monotonic()
        self._readiness = self.readiness()

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

    def upstream_ssl_context(self, upstream: UpstreamConfig) -> ssl.SSLContext | None:
        """Return the current client-side TLS context for ``upstream`` (None for plain TCP).

        Contexts are built once at start and rebuilt on SIGHUP (:meth:`reload`), so each new
        upstream connection uses the certificate files as of the last successful reload and
        no file is read on the connect path.

        Raises:
            OSError: ``ssl.SSLError`` included, only if the context was never built and the
                files do not load.
        """
        if not upstream.tls:
            return None
        ctx = self._upstream_ssl.get(upstream)
        if ctx is None:
            ctx = self.build_upstream_ssl_context(upstream)
            assert ctx is not None
            self._upstream_ssl[upstream] = ctx
        return ctx

    @staticmethod
    def build_upstream_ssl_context(upstream: UpstreamConfig) -> ssl.SSLContext | None:
        """Build a client-side TLS context for ``upstream`` from its files.

        TLS 1.2 or later; the router's certificate is verified against ``tls_ca`` (the system
        store when unset) and its name against ``tls_server_name`` (default: the host);
        ``tls_cert``/``tls_key`` are the proxy's client certificate, when the router asks.

        Returns:
            The context, or None when ``upstream.tls`` is false.

        Raises:
            OSError: a file is missing or unreadable; ``ssl.SSLError`` (a subclass) when a
                file is not a valid certificate/key or the key does not match.
        """
        if not upstream.tls:
            return None
        ctx = ssl.create_default_context(cafile=upstream.tls_ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if upstream.tls_cert:
            ctx.load_cert_chain(upstream.tls_cert, upstream.tls_key)
        return ctx

    @staticmethod
    def server_ssl_context(listener: ListenerConfig) -> ssl.SSLContext | None:
        """Build the server-side TLS context of a listener from its files.

        TLS 1.2 or later. With ``tls_ca`` client certificates are verified against it
        (required when ``require_client_cert``, else optional).

        Returns:
            The context, or None when the listener has no certificate (plain AMQP).

        Raises:
            OSError: a file is missing or unreadable; ``ssl.SSLError`` (a subclass) when a
                file is not a valid certificate/key or the key does not match.
        """
        if not listener.tls_cert:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(listener.tls_cert, listener.tls_key)
        if listener.tls_ca:
            ctx.load_verify_locations(listener.tls_ca)
            ctx.verify_mode = (ssl.CERT_REQUIRED if listener.require_client_cert
                               else ssl.CERT_OPTIONAL)
        elif listener.require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def build_tls_contexts(self) -> tuple[dict[int, ssl.SSLContext],
                                          dict[UpstreamConfig, ssl.SSLContext]]:
        """Build every listener and upstream TLS context from the configured files.

        Runs off the event loop on reload (it reads files).

        Returns:
            ``(listener index -> server context, upstream -> client context)``.

        Raises:
            ConfigError: naming every listener/upstream whose files do not load.
        """
        servers: dict[int, ssl.SSLContext] = {}
        upstreams: dict[UpstreamConfig, ssl.SSLContext] = {}
        issues: list[str] = []

        def failed(key: str, i: int, end: ListenerConfig | UpstreamConfig, exc: OSError) -> None:
            issues.append(f"{key}[{i}] {end.address}: TLS files ({end.tls_cert}, "
                          f"{end.tls_key}, {end.tls_ca}): {exc}")

        for i, listener in enumerate(self.config.listeners):
            try:
                ctx = self.server_ssl_context(listener)
            except OSError as exc:  # ssl.SSLError is an OSError
                failed("listener", i, listener, exc)
                continue
            if ctx is not None:
                servers[i] = ctx
        for i, upstream in enumerate(self.config.upstreams):
            try:
                ctx = self.build_upstream_ssl_context(upstream)
            except OSError as exc:
                failed("upstream", i, upstream, exc)
                continue
            if ctx is not None:
                upstreams[upstream] = ctx
        if issues:
            raise ConfigError(issues)
        return servers, upstreams

    def _listener_ssl(self, index: int, base: ssl.SSLContext) -> ssl.SSLContext:
        """Make ``base`` (the context the server is created with) follow reloads.

        asyncio and uvloop capture the context given to ``create_server`` for the server's
        life, so a reload cannot replace it. Instead its ``sni_callback``, which OpenSSL runs
        for every ClientHello (with or without SNI), switches the new connection to the
        listener's current context (``SSLObject.context = ...``, OpenSSL ``SSL_set_SSL_CTX``):
        certificate chain and CA store come from the newest successful reload; connections
        already established keep the context they were made with.
        """
        self._server_ssl[index] = base

        def follow_reloads(sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
            current = self._server_ssl.get(index)
            if current is not None and current is not ctx:
                sslobj.context = current
            return None

        base.sni_callback = follow_reloads
        return base

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
        self._stop = asyncio.Event()
        self._drained = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self.started_at = self.policy_loaded_at = self.loop.time()
        if self.policy is None:
            self.policy = await asyncio.to_thread(self._load_policy)
            _log_policy_warnings(self.policy)
        self.ledger.max_connections = self.config.policy.max_connections
        self.rates.max_connection_rate = self.config.policy.max_connection_rate
        server_ssl, self._upstream_ssl = await asyncio.to_thread(self.build_tls_contexts)
        self._config_digest = await asyncio.to_thread(self._config_file_digest)
        self._start_observability()
        for index, listener in enumerate(self.config.listeners):
            base = server_ssl.get(index)
            ctx = self._listener_ssl(index, base) if base is not None else None
            name = str(listener.address)
            server: asyncio.Server | ProxyProtocolServer
            try:
                if listener.proxy_protocol:
                    server = await self._proxy_protocol_server(listener, name, ctx)
                else:
                    server = await self.loop.create_server(
                        lambda name=name: ClientProtocol(self, name, self.next_conn_id()),
                        listener.address.host, listener.address.port, ssl=ctx,
                        backlog=LISTEN_BACKLOG, reuse_address=True,
                        reuse_port=self.config.reuse_port or None, start_serving=False,
                        # a TLS handshake must finish within the Open-decision budget
                        ssl_handshake_timeout=self.config.handshake_seconds if ctx else None,
                    )
            except OSError as exc:
                await self._undo_start()
                raise self._bind_error(f"listener[{index}].address", listener.address,
                                       exc) from None
            self.servers.append(server)
            for sock in server.sockets:
                addr = sock.getsockname()
                self.listen_addresses.append((addr[0], addr[1]))
        await self._start_fleet()
        await self._start_bans()
        self.prober = UpstreamProber(self.config.upstreams, self.upstream_health,
                                     self.upstream_ssl_context, self.connect_timeout)
        # readiness is known when the start is announced (a black hole: at most 2 s late)
        await self.prober.first_round(timeout=min(self.connect_timeout, 2.0))
        for server in self.servers:
            await server.start_serving()
        if self.config.admin is not None:
            await self._start_admin()
        self._publish_readiness()
        self._publish_snapshot()
        line, fields = self.start_line()
        logger.info(line, extra=fields)
        self._snapshot_task = self.loop.create_task(self._snapshot_loop())
        if announce:
            self.announce_ready()

    async def _proxy_protocol_server(self, listener: ListenerConfig, name: str,
                                     ctx: ssl.SSLContext | None) -> ProxyProtocolServer:
        """Bind a listener with ``proxy_protocol`` (``daemon/proxy_listener.py``).

        Raises:
            OSError: the address cannot be bound.
        """
        def client(conn_id: str, proxied: Proxied) -> ClientProtocol:
            return ClientProtocol(self, name, conn_id, proxied)

        server = ProxyProtocolServer(self, listener, name, protocol_factory=client,
                                     ssl_context=ctx, backlog=LISTEN_BACKLOG,
                                     handshake_seconds=self.config.handshake_seconds,
                                     reuse_port=self.config.reuse_port)
        await server.start(start_serving=False)
        return server

    def announce_ready(self) -> None:
        """Tell systemd the listeners are up (``READY=1``) and start the watchdog pings."""
        self._last_status = self.status_line()
        extra = ""
        if self.config.worker is not None and self.metrics_server is not None:
            extra = f"\nMETRICS_PORT={self.metrics_server.port}"  # for the workers' parent
        systemd.notify(f"READY=1\nSTATUS={self._last_status}{extra}")
        if self._watchdog_task is None:
            self._watchdog_task = systemd.start_watchdog(self.loop)

    # -- start line and bind failures ---------------------------------------

    def start_line(self) -> tuple[str, dict[str, Any]]:
        """The one INFO line logged once every listener is bound, and its fields.

        Names the version, the bound listeners (``(amqps)`` for TLS), the upstreams, the
        policy digest and vhost count, the event-log directory and the metrics URL.

        Returns:
            ``(line, fields)``: the text, and the same facts as ``extra`` fields for the JSON
            log format (``event`` is ``"start"``).
        """
        from .. import __version__

        listeners = []
        for server, lc in zip(self.servers, self.config.listeners, strict=False):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                listeners.append(shown + (" (amqps)" if lc.tls_cert else "")
                                 + (" (PROXY protocol)" if lc.proxy_protocol else ""))
        upstreams = ", ".join(f"{u.address}{' (tls)' if u.tls else ''}"
                              for u in self.config.upstreams) or "none"
        policy = self.policy
        vhosts = len(getattr(policy, "vhosts", ()) or ())
        metrics = (self.metrics_server.url if self.metrics_server is not None
                   else "off")
        digest = getattr(policy, "digest", "-")
        admin = self.admin
        admin_at = ", ".join(a for a in (getattr(admin, "socket_path", None),
                                         getattr(admin, "tcp_address", None)) if a) or "off"
        line = (f"amqp-policy-proxy {__version__} started: listening on "
                f"{', '.join(listeners) or 'nothing'}; upstreams {upstreams}; policy "
                f"{digest} ({vhosts} vhost{'s' if vhosts != 1 else ''}"
                f" from {self.config.policy_path or 'memory'}); event log "
                f"{self.config.event_log_dir or 'off'}; metrics {metrics}; admin {admin_at}")
        fields = {"event": "start", "version": __version__, "listeners": listeners,
                  "upstreams": [str(u.address) for u in self.config.upstreams],
                  "policy_digest": digest, "vhosts": vhosts,
                  "policy_path": self.config.policy_path,
                  "event_log_dir": self.config.event_log_dir,
                  "metrics": None if self.metrics_server is None else metrics,
                  "admin": None if admin is None else admin_at}
        return line, fields

    def _bind_error(self, key: str, address: Any, exc: OSError) -> BindError:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        where = f"{self.config.source}: " if self.config.source else ""
        return BindError([f"{where}{key}: cannot listen on {address}: {reason}"])

    async def _start_admin(self) -> None:
        """Serve the admin interface (``[admin]``); undo the start if it cannot bind."""
        from .admin import AdminServer, build_app
        from .control import Control

        config = self.config.admin
        assert config is not None
        control = Control(self)
        admin = AdminServer(lambda token: build_app(control, token, config.forwarded_peer),
                            config, self.config.source)
        try:
            await admin.start()
        except BindError:
            await self._undo_start()
            raise
        self.admin = admin

    async def _undo_start(self) -> None:
        """Close what :meth:`start` opened before a listener failed to bind."""
        if self.prober is not None:
            await self.prober.stop()
            self.prober = None
        for server in self.servers:
            server.close()
        self.servers.clear()
        self.listen_addresses.clear()
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.writer is not None:
            await asyncio.to_thread(self.writer.stop)
            self.writer = None

    def _load_policy(self) -> Policy:
        path = self.config.policy_path
        if path is None:
            raise PolicyError([ConfigIssue(file=None, path="policy.path",
                                           message="no policy path configured")])
        return load_policy(path, self.config.policy, resolver=system_resolver,
                           allow_empty=self.config.allow_empty_policy)

    def _start_observability(self) -> None:
        from ..metrics.collectors import LiveCollector
        from ..metrics.observer import MetricsObserver
        from ..metrics.registry import build_registry

        registry = build_registry()
        self.registry = registry
        self.observer = MetricsObserver(registry)
        registry.register(LiveCollector(lambda: self._snapshot))
        if self.config.event_log_dir:  # first: an unusable directory stops the start here
            from ..eventlog.sinks import FileEventSink
            from ..eventlog.writer import EventLogWriter

            observer = self.observer
            writer = EventLogWriter(
                FileEventSink(self.config.event_log_dir), max_queue=self.config.event_log_queue,
                on_drop=observer.event_log_dropped, on_error=observer.event_log_errors,
                retention_days=self.config.event_log_retention_days,
            )
            try:
                writer.start()
            except OSError as exc:
                raise ConfigError([f"event_log.directory: {exc}"]) from None
            self.writer = writer
        if self.config.metrics_address is not None:
            from ..metrics.exposition import start_metrics_server

            addr = self.config.metrics_address
            try:
                self.metrics_server = start_metrics_server(
                    registry, addr.host, addr.port,
                    probes={"/healthz": self._probe_health, "/readyz": self._probe_ready})
            except OSError as exc:
                raise self._bind_error("metrics.address", addr, exc) from None

    def status_line(self) -> str:
        """One-line status for systemd ``STATUS=``."""
        policy = self.policy
        digest = getattr(policy, "digest", "-")
        ledger = f", ledger {self.fleet.mode}" if self.fleet is not None else ""
        return (f"{len(self.connections)} connections, {self.ledger.active()} admitted, "
                f"policy {digest}{ledger}")

    def _publish_snapshot(self) -> None:
        from ..metrics.collectors import MetricsSnapshot

        live = [(view.vhost or "", view.figures)
                for view in (proto.conn.view for proto in list(self.connections.values())
                             if proto.conn is not None) if view.admitted]
        bytes_total, transfers_total = (self.observer.traffic(live)
                                        if self.observer is not None else ({}, {}))
        policy = self.policy
        # every (vhost, group) of the policy has a sample, 0 while nobody is connected
        active = {(v, g): 0 for v, vh in (getattr(policy, "vhosts", None) or {}).items()
                  for g in vh.groups}
        active.update(self.ledger.snapshot().active)
        health, now = self.upstream_health, self.loop.time()
        self._snapshot = MetricsSnapshot(
            connections_active=active,
            bytes_total=bytes_total,
            transfers_total=transfers_total,
            limits=tuple(policy.limits_table()) if policy is not None else (),
            shaping=self.rates.totals(self.loop.time()),
            policy_digest=getattr(policy, "digest", ""),
            ledger_mode=self.ledger_mode,
            ledger_proxies=None if self.fleet is None else self.fleet.proxies_alive,
            sasl_failure_hosts=self.sasl_failures.top(now),
            upstreams_up=tuple((str(u.address),
                                int(health.known(u) is True and health.is_up(u, now)))
                               for u in self.config.upstreams),
            bans_active=self.bans.counts(),
        )

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            self._publish_readiness()
            try:
                self._publish_snapshot()
            except Exception:
                logger.exception("metrics snapshot failed")
            status = self.status_line()
            if status != self._last_status and not self.draining:
                # live counts for `systemctl status` (no-op without NOTIFY_SOCKET)
                self._last_status = status
                systemd.notify(f"STATUS={status}")

    def publish_now(self) -> None:
        """Publish a metrics snapshot immediately (tests call this before scraping)."""
        self._publish_snapshot()

    async def reload(self) -> bool:
        """SIGHUP: reload policy files and TLS files off the event loop.

        The policy is swapped atomically only when the whole new policy is valid: new
        connections use it, existing ones keep the snapshot they were admitted with, and the
        ledger's counts carry over. An invalid policy leaves the running one in force; every
        issue is logged and the failure counted (``amqp_proxy_policy_reloads_total{result=
        "error"}``). Certificate, key and CA files are re-read the same way: all-or-nothing,
        for new TLS connections only. Changes to the daemon config file itself (listeners,
        upstreams, paths) need a restart; a reload only warns about them.

        Returns:
            True when the new policy is in force.
        """
        assert self._reload_lock is not None
        async with self._reload_lock:
            systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}\n"
                           "STATUS=reloading policy and TLS files")
            ok = await self._reload_policy()
            tls_ok = await self._reload_tls()
            await self._warn_config_changes()
            problems = [what for what, good in (("policy", ok), ("TLS", tls_ok)) if not good]
            prefix = f"{' and '.join(problems)} reload failed; " if problems else ""
            systemd.notify(f"READY=1\nSTATUS={prefix}{self.status_line()}")
            return ok

    async def _reload_policy(self) -> bool:
        now = self.loop.time()
        try:
            new = await asyncio.to_thread(self._load_policy)
        except PolicyError as exc:
            for issue in exc.issues:
                logger.error("policy reload rejected: %s", issue)
            self._reloaded(PolicyReloaded(at=now, digest=getattr(self.policy, "digest", ""),
                                          result="error",
                                          issues=tuple(str(i) for i in exc.issues)))
            return False
        except Exception as exc:  # unreadable files etc.
            logger.error("policy reload failed: %s", exc)
            self._reloaded(PolicyReloaded(at=now, digest=getattr(self.policy, "digest", ""),
                                          result="error", issues=(str(exc),)))
            return False
        self.policy = new
        self.policy_loaded_at = self.loop.time()
        _log_policy_warnings(new)
        self._reloaded(PolicyReloaded(at=now, digest=new.digest, result="ok",
                                      issues=tuple(str(i) for i in new.warnings)))
        self._publish_snapshot()
        logger.info("policy reloaded: digest %s", new.digest)
        mode = self.config.reevaluate_open
        if mode != "off" and self.connections:
            rate = self.config.reevaluate_close_rate
            done = await reevaluate_open(self.connections, new, mode,
                                         close_later=rate is not None)
            logger.info("open connections re-checked against the new policy (%s): %d in %.0f "
                        "ms, the loop held at most %.1f ms at a time", mode, done.connections,
                        done.seconds * 1000, done.longest_slice * 1000)
            if done.to_close and rate is not None:
                self._pace_revocations(done.to_close, rate)
        return True

    def _reloaded(self, record: PolicyReloaded) -> None:
        """Keep the reload's record for ``status`` and emit it."""
        self.last_reload = record
        self.emit(record)

    def _pace_revocations(self, protos: list[Any], rate: float) -> None:
        """Close the connections a reload revoked at ``rate`` per second
        (``[policy] reevaluate_close_rate``, :mod:`.pacing`)."""
        def close_one(proto: Any) -> bool:
            conn = proto.conn
            if conn is None or proto.closed or not conn.revocation_due:
                return False  # gone, or a later reload admitted it again
            proto.run(conn.close_revoked)
            return True

        n = len(protos)
        pacer = PacedCloser(self.loop, protos, close_one, rate).start()
        self.revocation_closes = pacer
        logger.info("closing the %d connection%s the new policy no longer admits at %g/s "
                    "(about %.0f s)", n, "" if n == 1 else "s", rate, n / rate)
        pacer.done.add_done_callback(lambda _f: logger.info(
            "revoked connections closed: %d, gone meanwhile: %d, in %.1f s", pacer.closed,
            pacer.skipped, pacer.progress()["elapsed_seconds"]))

    async def _reload_tls(self) -> bool:
        if not self._server_ssl and not self._upstream_ssl:
            return True
        try:
            servers, upstreams = await asyncio.to_thread(self.build_tls_contexts)
        except ConfigError as exc:
            self.tls_reload_failures += 1
            if self.observer is not None:
                self.observer.tls_reload_failed()
            for issue in exc.issues:
                logger.error("TLS reload rejected, keeping the current certificates: %s", issue)
            return False
        # Swap on the loop thread: a handshake sees either all old or all new contexts.
        # Listener indexes without TLS at start stay plain (the server was made without TLS).
        for index in list(self._server_ssl):
            if index in servers:
                self._server_ssl[index] = servers[index]
        self._upstream_ssl = upstreams
        logger.info("TLS certificate, key and CA files reloaded")
        return True

    def _config_file_digest(self) -> str | None:
        source = self.config.source
        if not source:
            return None
        try:
            with open(source, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None

    async def _warn_config_changes(self) -> None:
        if self._config_digest is None:
            return
        digest = await asyncio.to_thread(self._config_file_digest)
        if digest != self._config_digest:
            logger.warning("config file %s changed since start; a reload applies only policy "
                           "and TLS files, restart the service to apply the rest",
                           self.config.source)

    def request_stop(self, force: bool = False, reason: str = "requested") -> None:
        """Ask the daemon to drain and exit (a second request exits at once).

        Args:
            force: exit without waiting for the drain.
            reason: why, for the stop line (``SIGTERM``, ``SIGINT``...); the first one counts.
        """
        if self._stop is None:
            return
        if not self._stop.is_set():
            self._stop_reason = reason
        if self._stop.is_set() or force:
            self._force = True
            if self._drained is not None:
                self._drained.set()
        self._stop.set()

    async def serve(self) -> None:
        """Wait until a stop is requested, then shut down gracefully."""
        assert self._stop is not None
        await self._stop.wait()
        await self.shutdown()

    async def shutdown(self) -> None:
        """Drain: stop accepting, Close every client (forced), wait for the grace period.

        Ends with the stop line: the reason, how many connections closed within the grace
        period (drained) and how many were cut, and the seconds the shutdown took.
        """
        self.draining = True
        self._readiness = (False, "draining")
        stop_began = time.monotonic()
        open_at_stop = len(self.connections)
        systemd.notify(f"STOPPING=1\nSTATUS=draining {len(self.connections)} connections")
        for server in self.servers:
            server.close()
        for proto in list(self.connections.values()):
            conn = proto.conn
            if conn is not None and not proto.closed:
                # each client has the linger time to answer the Close; the grace period
                # bounds the whole drain
                proto.run(conn.begin_shutdown)
        if self.connections and not self._force:
            assert self._drained is not None
            try:
                await asyncio.wait_for(self._drained.wait(),
                                       timeout=self.config.shutdown_grace_seconds)
            except TimeoutError:
                logger.warning("%d connections still open after the grace period",
                               len(self.connections))
        cut = len(self.connections)
        for proto in list(self.connections.values()):
            proto.abort()
        await asyncio.sleep(0)
        await self.bans.stop()
        if self.fleet is not None:  # every count is released: the fields go
            await self.fleet.stop()
        if self.prober is not None:
            await self.prober.stop()
        for task in (self._snapshot_task, self._watchdog_task):
            if task is not None:
                task.cancel()
        if self.writer is not None:
            await asyncio.to_thread(self.writer.stop)
            self.writer = None
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.admin is not None:
            await self.admin.stop()
            self.admin = None
        for server in self.servers:
            await server.wait_closed()
        drained, seconds = open_at_stop - cut, time.monotonic() - stop_began
        logger.info("stopped (%s): %d connection%s drained, %d cut after the grace period, "
                    "in %.1f s", self._stop_reason, drained, "" if drained == 1 else "s", cut,
                    seconds, extra={"event": "stop", "reason": self._stop_reason,
                                    "drained": drained, "cut": cut,
                                    "seconds": round(seconds, 3)})

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


class _LedgerFigures(LedgerObserver):
    """The fleet ledger's figures, into the daemon's metrics (when it has them)."""

    __slots__ = ("daemon",)

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def ledger_latency(self, seconds: float) -> None:
        """One admission answered by the store."""
        if self.daemon.observer is not None:
            self.daemon.observer.ledger_latency_observed(seconds)

    def ledger_error(self, reason: str) -> None:
        """One store failure."""
        if self.daemon.observer is not None:
            self.daemon.observer.ledger_error(reason)


def _log_policy_warnings(policy: Policy) -> None:
    """Log each warning of a loaded policy (the lines ``check`` prints), e.g. a QDR key that
    is accepted but not enforced, or a session window smaller than a frame."""
    for issue in policy.warnings:
        logger.warning("policy: %s", issue)


async def run_daemon(config: DaemonConfig) -> int:
    """Run until stopped; return the process exit code (0 clean, 1 runtime failure).

    With ``ledger = "auto"`` a private redis-server is started first and stopped last.

    Raises:
        ConfigError: ``ledger = "auto"`` and redis-server does not start.
    """
    private = None
    if config.ledger is not None and config.ledger.url == "auto":
        from ..fleet.private_redis import PrivateRedis, PrivateRedisError
        from .workers import die_with_parent

        # started from the main thread (before anything is served), so that it ends with
        # this process however it ends
        private = PrivateRedis(config.runtime_dir, preexec_fn=die_with_parent)
        try:
            url = private.start()
        except PrivateRedisError as exc:
            raise ConfigError([f"ledger: {exc}"]) from None
        config = replace(config, ledger=replace(config.ledger, url=url))
    try:
        daemon = Daemon(config)
        await daemon.start(announce=False)
        daemon.install_signal_handlers()
        daemon.announce_ready()
        await daemon.serve()
        return 0
    finally:
        if private is not None:
            await asyncio.to_thread(private.stop)
