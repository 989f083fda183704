"""Where connections are counted: this process's ledger and rate buckets, or, with
``[ledger]``, the fleet's in Redis.

At accept, before any byte is read, a transport is counted against QDR's global
``maxConnections`` and ``[policy] max_connection_rate`` here (:meth:`Ledgers.accept`); the
Open decisions of the core count vhost, user and host against :attr:`Ledgers.admission`
(the fleet ledger when there is one) and take their rates from :attr:`Ledgers.connection_rates`.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import replace

from ..core.admission import AdmissionLedger
from ..fleet.ledger import IN_PROCESS, FleetLedger, LedgerObserver, LedgerSettings
from ..fleet.rates import FleetRates
from ..limits.connections import ConnectionLedger
from ..limits.rates import RateLimits
from ..policy.reasons import ConnectionDenyReason

__all__ = ["RATE_LOG_INTERVAL", "Ledgers"]

logger = logging.getLogger(__name__)

#: Seconds between two log lines about transports refused over ``max_connection_rate``.
RATE_LOG_INTERVAL = 10.0


class Ledgers:
    """One process's connection counts and rate buckets, and the fleet's when it has one.

    Args:
        max_connections: QDR's global ``maxConnections`` (``[policy] max_connections``).
        max_connection_rate: transports per second (``[policy] max_connection_rate``).

    Attributes:
        ledger: this process's own counts (the global count at accept, and the vhost counts).
        rates: connection-rate buckets and the users' shaping buckets of this process.
        fleet: the fleet ledger (``[ledger]``) once started, else None.
        admission: what the core admits against: the fleet ledger, else :attr:`ledger`.
        connection_rates: the rate buckets connections use: this process's own, or with a
            fleet ledger the store's (:class:`~..fleet.rates.FleetRates`).
    """

    def __init__(self, max_connections: int, max_connection_rate: int) -> None:
        """In-process counts until :meth:`start_fleet`."""
        self.ledger = ConnectionLedger(max_connections)
        self.rates = RateLimits(max_connection_rate)
        self.fleet: FleetLedger | None = None
        self.admission: AdmissionLedger = self.ledger
        self.connection_rates: RateLimits | FleetRates = self.rates
        self._rate_logged = (-RATE_LOG_INTERVAL, 0)  # (when, global_denied then)

    @property
    def mode(self) -> str:
        """``redis``, a failure mode, or ``in-process`` (no ``[ledger]``)."""
        return IN_PROCESS if self.fleet is None else self.fleet.mode

    def accept(self, now: float, draining: bool,
               preauth_accept: Callable[[], bool]) -> ConnectionDenyReason | None:
        """Count a new client transport at loop time ``now`` (seconds), or say why it is
        refused before any byte: QDR's global ``maxConnections`` (also while ``draining``),
        then ``[policy] max_connection_rate``, then the pre-authentication memory budget
        (``preauth_accept``). A refused transport is not counted."""
        if draining or not self.ledger.try_accept():
            return ConnectionDenyReason.GLOBAL_LIMIT
        if not self.rates.try_accept(now):
            self.ledger.release_accept()
            self._log_rate_refusals(now)
            return ConnectionDenyReason.GLOBAL_RATE
        if not preauth_accept():
            self.ledger.release_accept()
            return ConnectionDenyReason.PREAUTH_MEMORY
        return None

    def _log_rate_refusals(self, now: float) -> None:
        """One WARNING line at most every :data:`RATE_LOG_INTERVAL` seconds for transports
        refused over ``[policy] max_connection_rate`` (a storm must not flood the journal;
        each refusal is in the metrics and the event log)."""
        when, before = self._rate_logged
        if now - when < RATE_LOG_INTERVAL:
            return
        denied = self.rates.global_denied
        self._rate_logged = (now, denied)
        logger.warning("refusing connections at accept over [policy] max_connection_rate "
                       "%d/s (%d refused so far, %d since the last line)",
                       self.rates.max_connection_rate, denied, denied - before)

    async def start_fleet(self, settings: LedgerSettings, port: int,
                          on_answer: Callable[[str, ConnectionDenyReason | None], None],
                          observer: LedgerObserver) -> None:
        """Start the fleet ledger (``[ledger]``) before the listeners accept anything.

        Args:
            settings: ``[ledger]``; without a ``proxy_id`` this proxy is named
                ``HOST:PORT`` (host name, first listener's port).
            on_answer: called with ``(conn_id, reason)`` when the store answers an admission.
            observer: the ledger's latency and error figures.
        """
        if not settings.proxy_id:
            settings = replace(settings, proxy_id=f"{socket.gethostname()}:{port}")
        self.fleet = FleetLedger(self.ledger, settings, on_answer=on_answer, observer=observer)
        await self.fleet.start()
        self.admission = self.fleet
        self.connection_rates = FleetRates(self.rates, self.fleet)
        logger.info("ledger %s: proxy id %s, mode %s, lease %g s, timeout %g ms, failure mode "
                    "%s", settings.url.rpartition("@")[2], settings.proxy_id, self.fleet.mode,
                    settings.lease_seconds, settings.timeout_ms, settings.failure_mode)
