"""SIGHUP: reload the policy and the TLS files without dropping a connection.

The policy is swapped atomically only when the whole new policy is valid: new connections
use it, and, with ``[policy] reevaluate_open``, every open connection and link is checked
against it (``daemon/reevaluation.py``; closes paced by ``[policy] reevaluate_close_rate``,
``daemon/pacing.py``). An invalid policy leaves the running one in force, with every issue
logged, counted and kept for ``status`` (:attr:`ReloadHost.last_reload`). Certificate, key and
CA files are re-read the same way, all-or-nothing (:class:`~.tls.TlsContexts`). Changes to
the daemon config file itself need a restart; a reload only warns about them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..core.events import PolicyReloaded
from ..policy.errors import ConfigIssue, PolicyError
from ..policy.load import load_policy
from ..policy.model import Policy
from ..resolver import system_resolver
from . import systemd
from .pacing import PacedCloser
from .reevaluation import reevaluate_open
from .settings import DaemonConfig
from .tls import TlsContexts

if TYPE_CHECKING:
    from .relay import ClientProtocol

__all__ = ["ReloadHost", "Reloader", "config_file_digest", "load_configured_policy",
           "log_policy_warnings"]

logger = logging.getLogger(__name__)


def load_configured_policy(config: DaemonConfig) -> Policy:
    """Load the policy ``config`` names (``[policy] path``), with its settings.

    Reads files: the daemon runs it off the event loop.

    Raises:
        PolicyError: no path configured, or the policy is invalid (every issue).
        OSError: a file cannot be read.
    """
    path = config.policy_path
    if path is None:
        raise PolicyError([ConfigIssue(file=None, path="policy.path",
                                       message="no policy path configured")])
    return load_policy(path, config.policy, resolver=system_resolver,
                       allow_empty=config.allow_empty_policy)


def log_policy_warnings(policy: Policy) -> None:
    """Log each warning of a loaded policy (the lines ``check`` prints), e.g. a QDR key that
    is accepted but not enforced, or a session window smaller than a frame."""
    for issue in policy.warnings:
        logger.warning("policy: %s", issue)


def config_file_digest(config: DaemonConfig) -> str | None:
    """SHA-256 (hex) of the config file ``config`` came from; None without one or when it
    cannot be read (reads a file: off the loop)."""
    source = config.source
    if not source:
        return None
    try:
        with open(source, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


class ReloadHost(Protocol):
    """What a reload reads and changes of the daemon."""

    config: DaemonConfig
    policy: Policy | None
    policy_loaded_at: float
    last_reload: PolicyReloaded | None
    revocation_closes: PacedCloser[Any] | None
    tls: TlsContexts
    observer: Any
    tokens: Any
    """The token service (:class:`~.tokens.TokenService`), or None."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop."""
        ...

    @property
    def connections(self) -> Mapping[str, ClientProtocol]:
        """Open client transports by connection id."""
        ...

    def emit(self, event: PolicyReloaded) -> None:
        """Fan an event out (metrics, event log)."""
        ...

    def publish_now(self) -> None:
        """Publish a metrics snapshot now."""
        ...


class Reloader:
    """The daemon's SIGHUP reloads, one at a time.

    Args:
        host: the daemon.
        status: the ``STATUS=`` line after a reload (:func:`~.snapshots.status_line`).
    """

    def __init__(self, host: ReloadHost, status: Callable[[], str]) -> None:
        """Ready once :meth:`start` ran on the loop."""
        self.host = host
        self.status = status
        self._lock: asyncio.Lock | None = None
        self._config_digest: str | None = None

    async def start(self) -> None:
        """On the loop, at start: the lock, and the config file's digest to compare later."""
        self._lock = asyncio.Lock()
        self._config_digest = await asyncio.to_thread(config_file_digest, self.host.config)

    async def reload(self) -> bool:
        """Reload the policy and the TLS files (see the module docstring); tell systemd
        ``RELOADING=1`` before and ``READY=1`` with the outcome after.

        Returns:
            True when the new policy is in force.
        """
        assert self._lock is not None, "Reloader.start() first"
        async with self._lock:
            systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}\n"
                           "STATUS=reloading policy and TLS files")
            ok = await self._reload_policy()
            observer = self.host.observer
            tls_ok = await self.host.tls.reload(
                lambda: observer.tls_reload_failed() if observer is not None else None)
            await self._warn_config_changes()
            problems = [what for what, good in (("policy", ok), ("TLS", tls_ok)) if not good]
            prefix = f"{' and '.join(problems)} reload failed; " if problems else ""
            systemd.notify(f"READY=1\nSTATUS={prefix}{self.status()}")
            return ok

    async def _reload_policy(self) -> bool:
        host = self.host
        now = host.loop.time()
        try:
            new = await asyncio.to_thread(load_configured_policy, host.config)
        except PolicyError as exc:
            for issue in exc.issues:
                logger.error("policy reload rejected: %s", issue)
            self._reloaded(PolicyReloaded(at=now, digest=getattr(host.policy, "digest", ""),
                                          result="error",
                                          issues=tuple(str(i) for i in exc.issues)))
            return False
        except Exception as exc:  # unreadable files etc.
            logger.error("policy reload failed: %s", exc)
            self._reloaded(PolicyReloaded(at=now, digest=getattr(host.policy, "digest", ""),
                                          result="error", issues=(str(exc),)))
            return False
        host.policy = new
        host.policy_loaded_at = host.loop.time()
        log_policy_warnings(new)
        tokens = host.tokens
        if tokens is not None:  # the service password files, and the mapping's names
            tokens.reload_logins(host.config)
            tokens.log_mapping_issues(new)
        self._reloaded(PolicyReloaded(at=now, digest=new.digest, result="ok",
                                      issues=tuple(str(i) for i in new.warnings)))
        host.publish_now()
        logger.info("policy reloaded: digest %s", new.digest)
        mode = host.config.reevaluate_open
        if mode != "off" and host.connections:
            rate = host.config.reevaluate_close_rate
            done = await reevaluate_open(host.connections, new, mode,
                                         close_later=rate is not None)
            logger.info("open connections re-checked against the new policy (%s): %d in %.0f "
                        "ms, the loop held at most %.1f ms at a time", mode, done.connections,
                        done.seconds * 1000, done.longest_slice * 1000)
            if done.to_close and rate is not None:
                self._pace_revocations(done.to_close, rate)
        return True

    def _reloaded(self, record: PolicyReloaded) -> None:
        """Keep the reload's record for ``status`` and emit it."""
        self.host.last_reload = record
        self.host.emit(record)

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
        pacer = PacedCloser(self.host.loop, protos, close_one, rate).start()
        self.host.revocation_closes = pacer
        logger.info("closing the %d connection%s the new policy no longer admits at %g/s "
                    "(about %.0f s)", n, "" if n == 1 else "s", rate, n / rate)
        pacer.done.add_done_callback(lambda _f: logger.info(
            "revoked connections closed: %d, gone meanwhile: %d, in %.1f s", pacer.closed,
            pacer.skipped, pacer.progress()["elapsed_seconds"]))

    async def _warn_config_changes(self) -> None:
        if self._config_digest is None:
            return
        digest = await asyncio.to_thread(config_file_digest, self.host.config)
        if digest != self._config_digest:
            logger.warning("config file %s changed since start; a reload applies only policy "
                           "and TLS files, restart the service to apply the rest",
                           self.host.config.source)
