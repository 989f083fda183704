"""Shell-side. Active upstream probes: readiness that tells the truth before a client fails.

Every upstream is probed on an interval: a TCP connect (with the upstream's TLS when it has
one) and the AMQP SASL protocol header (``AMQP 3 1 0 0``, Part 5 §5.3.1), answered by any AMQP
1.0 router or broker with a protocol header of its own (``AMQP`` and the protocol it speaks).
The answer feeds the same :class:`~.upstreams.UpstreamHealth` the client connects feed: a
success makes the upstream known up, a failure backs it off (1 s doubling to 30 s) and it is
probed again when the back-off ends (at most every :data:`INTERVAL` seconds while up). So
``/readyz``, ``status`` and ``amqp_proxy_upstream_up`` say an upstream is down before any
client meets it, and a client that arrives while every upstream is known down is answered at
once (SASL ``sys-temp``) instead of waiting for connects that will fail.

Nothing of a client goes over a probe connection; the router sees a connection that sends a
protocol header and closes (qdrouterd logs it at INFO as a connection that closed before
its Open). RabbitMQ logs a WARNING ("client unexpectedly closed TCP connection") for every
such connection and nothing for one that sends no byte, so its upstreams are probed with a
connect only (``probe = "tcp"``, what ``probe = "auto"`` means for ``kind = "rabbitmq"``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Sequence
from typing import Any

from .upstreams import UpstreamHealth

logger = logging.getLogger(__name__)

#: Seconds between two probes of an upstream that is up.
INTERVAL = 5.0
#: The AMQP SASL protocol header a probe sends (Part 5 §5.3.1).
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


async def probe(upstream: Any, ssl_context: ssl.SSLContext | None, timeout: float) -> str | None:
    """Probe one upstream: connect, send the SASL protocol header, read the 8-byte protocol
    header it answers with; only connect (and the TLS handshake) when its
    :meth:`~.config.UpstreamConfig.probe_mode` is ``tcp``.

    Returns:
        None when the upstream answered like an AMQP 1.0 peer, else what went wrong (for the
        log line): a refused or timed-out connect, a closed connection, a non-AMQP answer.
    """
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(
                upstream.address.host, upstream.address.port, ssl=ssl_context,
                server_hostname=(upstream.tls_server_name or upstream.address.host)
                if ssl_context else None)
            if upstream.probe_mode() == "tcp":
                return None
            writer.write(SASL_HEADER)
            answer = await reader.readexactly(8)
        if not answer.startswith(b"AMQP"):
            return f"not an AMQP 1.0 peer (answered {answer!r})"
        return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except asyncio.IncompleteReadError:
        return "closed the connection without a protocol header"
    except (OSError, ssl.SSLError) as exc:
        return str(exc) or type(exc).__name__
    finally:
        if writer is not None:
            writer.close()


class UpstreamProber:
    """Probes every upstream of the daemon and records what it finds in ``health``.

    Args:
        upstreams: the configured upstreams.
        health: the daemon's upstream health (shared with client connects).
        ssl_context: ``ssl_context(upstream)``: the upstream's current client TLS context.
        timeout: seconds a probe may take (the daemon's connect timeout).
        interval: seconds between two probes of an upstream that is up.
    """

    def __init__(self, upstreams: Sequence[Any], health: UpstreamHealth[Any],
                 ssl_context: Callable[[Any], ssl.SSLContext | None], timeout: float,
                 interval: float = INTERVAL) -> None:
        self.upstreams = list(upstreams)
        self.health = health
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._due: dict[Any, float] = {}

    async def first_round(self, timeout: float) -> None:
        """Probe every upstream once, waiting at most ``timeout`` seconds (the start waits
        so that readiness is known when the daemon announces it), then keep probing."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        round_ = asyncio.gather(*(self._probe(u) for u in self.upstreams))
        try:
            await asyncio.wait_for(asyncio.shield(round_), timeout)
        except TimeoutError:
            pass  # a black-holed upstream: the loop below finishes its probe
        self._task = loop.create_task(self._run(round_))

    def soon(self) -> None:
        """Probe the backed-off upstreams now (a client met them all down)."""
        for upstream in self.upstreams:
            if not self.health.is_up(upstream, 0.0):
                self._due[upstream] = 0.0
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        """Stop probing."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled
                pass

    async def _probe(self, upstream: Any) -> None:
        loop = asyncio.get_running_loop()
        problem = await probe(upstream, self.ssl_context(upstream), self.timeout)
        now = loop.time()
        was = self.health.known(upstream)
        if problem is None:
            self.health.succeeded(upstream)
            self._due[upstream] = now + self.interval
            if was is False:
                logger.warning("upstream %s is up again", upstream.address)
            return
        backoff = self.health.failed(upstream, now)
        self._due[upstream] = now + min(backoff, self.interval)
        if was is not False:
            logger.warning("upstream %s is down: %s (probed again in %.0f s)", upstream.address,
                           problem, min(backoff, self.interval))

    async def _run(self, first: Any) -> None:
        """Probe each upstream when it is due, forever."""
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        try:
            await first
        except Exception:  # noqa: BLE001 - probe never raises; defensive
            logger.exception("upstream probe failed")
        while True:
            now = loop.time()
            due = [u for u in self.upstreams if self._due.get(u, 0.0) <= now]
            if due:
                await asyncio.gather(*(self._probe(u) for u in due), return_exceptions=True)
                continue
            wait = min(self._due.get(u, now) for u in self.upstreams) - now
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.05, wait))
            except TimeoutError:
                pass
