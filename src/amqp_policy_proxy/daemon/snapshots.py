"""What the daemon tells the outside about itself: the metrics snapshot, systemd's ``STATUS=``
line and the start line.

The metrics endpoint serves from a snapshot that the event loop rebuilds every
:data:`SNAPSHOT_INTERVAL` seconds (:class:`Snapshots`), so a scrape never walks live
connection state from the HTTP thread. The same 1 s tick publishes readiness (``/readyz``,
:mod:`.health`) and, when it changed, the ``STATUS=`` line ``systemctl status`` shows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import systemd
from .settings import DaemonConfig, UpstreamConfig
from .upstreams import UpstreamHealth

if TYPE_CHECKING:
    from ..fleet.ledger import FleetLedger
    from ..limits.connections import ConnectionLedger
    from ..limits.rates import RateLimits
    from ..metrics.collectors import MetricsSnapshot
    from ..metrics.recent import RecentFailures
    from ..policy.model import Policy
    from .bans import BanService

__all__ = ["SNAPSHOT_INTERVAL", "SnapshotHost", "Snapshots", "start_line", "status_line"]

logger = logging.getLogger(__name__)

#: Seconds between metrics snapshots (the scrape reads the last one).
SNAPSHOT_INTERVAL = 1.0


class SnapshotHost(Protocol):
    """What the snapshot, status and start lines read of the daemon."""

    config: DaemonConfig
    policy: Policy | None
    upstream_health: UpstreamHealth[UpstreamConfig]
    sasl_failures: RecentFailures
    bans: BanService
    draining: bool
    observer: Any
    metrics_server: Any
    admin: Any
    tokens: Any
    """The token service (:class:`~.tokens.TokenService`), or None."""

    @property
    def ledger(self) -> ConnectionLedger:
        """This process's counts."""
        ...

    @property
    def rates(self) -> RateLimits:
        """This process's rate buckets."""
        ...

    @property
    def fleet(self) -> FleetLedger | None:
        """The fleet ledger, if any."""
        ...

    @property
    def connections(self) -> Mapping[str, Any]:
        """Open client transports by connection id (each with its core ``conn``)."""
        ...

    @property
    def servers(self) -> Sequence[Any]:
        """The listeners' servers."""
        ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop."""
        ...

    @property
    def ledger_mode(self) -> str:
        """``redis``, a failure mode, or ``in-process``."""
        ...


def status_line(host: SnapshotHost) -> str:
    """One-line status for systemd ``STATUS=``: connections, admitted, policy digest, the
    ledger's mode with ``[ledger]``."""
    digest = getattr(host.policy, "digest", "-")
    ledger = f", ledger {host.fleet.mode}" if host.fleet is not None else ""
    return (f"{len(host.connections)} connections, {host.ledger.active()} admitted, "
            f"policy {digest}{ledger}")


def start_line(host: SnapshotHost) -> tuple[str, dict[str, Any]]:
    """The one INFO line logged once every listener is bound, and its fields.

    Names the version, the bound listeners (``(amqps)`` for TLS), the upstreams, the policy
    digest and vhost count, the event-log directory, the metrics URL and the admin endpoint.

    Returns:
        ``(line, fields)``: the text, and the same facts as ``extra`` fields for the JSON log
        format (``event`` is ``"start"``).
    """
    from .. import __version__

    config = host.config
    listeners = []
    for server, lc in zip(host.servers, config.listeners, strict=False):
        for sock in server.sockets:
            addr, port = sock.getsockname()[:2]
            shown = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
            listeners.append(shown + (" (amqps)" if lc.tls_cert else "")
                             + (" (PROXY protocol)" if lc.proxy_protocol else ""))
    upstreams = ", ".join(f"{u.address}{' (tls)' if u.tls else ''}"
                          for u in config.upstreams) or "none"
    policy = host.policy
    vhosts = len(getattr(policy, "vhosts", ()) or ())
    metrics = host.metrics_server.url if host.metrics_server is not None else "off"
    digest = getattr(policy, "digest", "-")
    admin = host.admin
    admin_at = ", ".join(a for a in (getattr(admin, "socket_path", None),
                                     getattr(admin, "tcp_address", None)) if a) or "off"
    line = (f"amqp-policy-proxy {__version__} started: listening on "
            f"{', '.join(listeners) or 'nothing'}; upstreams {upstreams}; policy "
            f"{digest} ({vhosts} vhost{'s' if vhosts != 1 else ''}"
            f" from {config.policy_path or 'memory'}); event log "
            f"{config.event_log_dir or 'off'}; metrics {metrics}; admin {admin_at}")
    fields = {"event": "start", "version": __version__, "listeners": listeners,
              "upstreams": [str(u.address) for u in config.upstreams],
              "policy_digest": digest, "vhosts": vhosts,
              "policy_path": config.policy_path,
              "event_log_dir": config.event_log_dir,
              "metrics": None if host.metrics_server is None else metrics,
              "admin": None if admin is None else admin_at}
    return line, fields


class Snapshots:
    """The daemon's metrics snapshot and the 1 s tick that renews it.

    Args:
        host: the daemon.
        tick: called first on every tick (the readiness probes' publish).
    """

    def __init__(self, host: SnapshotHost, tick: Callable[[], None]) -> None:
        """No snapshot until :meth:`publish`."""
        self.host = host
        self.tick = tick
        self.current: MetricsSnapshot | None = None
        """The last snapshot (the metrics collector serves it)."""
        self.last_status = ""
        self._task: asyncio.Task[None] | None = None

    def publish(self) -> None:
        """Build and publish a snapshot now: active connections per (vhost, group), with a
        sample at 0 for every group of the policy; traffic of the admitted connections;
        the limits table, shaping totals, ledger, SASL failures per host, upstreams up,
        active bans."""
        from ..metrics.collectors import MetricsSnapshot

        host = self.host
        live = [(view.vhost or "", view.figures)
                for view in (proto.conn.view for proto in list(host.connections.values())
                             if proto.conn is not None) if view.admitted]
        bytes_total, transfers_total = (host.observer.traffic(live)
                                        if host.observer is not None else ({}, {}))
        policy = host.policy
        active = {(v, g): 0 for v, vh in (getattr(policy, "vhosts", None) or {}).items()
                  for g in vh.groups}
        active.update(host.ledger.snapshot().active)
        health, now = host.upstream_health, host.loop.time()
        self.current = MetricsSnapshot(
            connections_active=active,
            bytes_total=bytes_total,
            transfers_total=transfers_total,
            limits=tuple(policy.limits_table()) if policy is not None else (),
            shaping=host.rates.totals(now),
            policy_digest=getattr(policy, "digest", ""),
            ledger_mode=host.ledger_mode,
            ledger_proxies=None if host.fleet is None else host.fleet.proxies_alive,
            sasl_failure_hosts=host.sasl_failures.top(now),
            upstreams_up=tuple((str(u.address),
                                int(health.known(u) is True and health.is_up(u, now)))
                               for u in host.config.upstreams),
            bans_active=host.bans.counts(),
            jwks=None if host.tokens is None else host.tokens.figures(),
        )

    def start(self) -> None:
        """Start the tick on the running loop."""
        self._task = self.host.loop.create_task(self._run())

    def stop(self) -> None:
        """Stop the tick."""
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            self.tick()
            try:
                self.publish()
            except Exception:
                logger.exception("metrics snapshot failed")
            status = status_line(self.host)
            if status != self.last_status and not self.host.draining:
                # live counts for `systemctl status` (no-op without NOTIFY_SOCKET)
                self.last_status = status
                systemd.notify(f"STATUS={status}")
