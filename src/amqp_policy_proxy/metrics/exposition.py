"""Shell-side. Serves a registry over HTTP for Prometheus (the config's ``[metrics] address``).

A thin wrapper over prometheus_client's ``start_http_server`` (a WSGI server on a daemon
thread, returning ``(httpd, thread)``) that adds what the daemon needs: the actual port when
asked for port 0, and an idempotent :meth:`MetricsServer.stop` for shutdown and tests.
The server answers ``GET /metrics`` (prometheus_client serves the registry on any path, in the
text format, or OpenMetrics when the scraper asks for it).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["MetricsServer", "start_metrics_server"]

logger = logging.getLogger(__name__)


class MetricsServer:
    """A running ``/metrics`` endpoint; use :func:`start_metrics_server` to make one.

    Usable as a context manager (stops on exit).

    Args:
        httpd: the WSGI server returned by prometheus_client's ``start_http_server``.
        thread: the thread running ``httpd.serve_forever``.
        host: the address ``httpd`` is bound to, as the caller gave it.
    """

    def __init__(self, httpd: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self._lock = threading.Lock()
        self._stopped = False
        self.host = host
        """The address the server is bound to, as given to :func:`start_metrics_server`."""
        self.port: int = httpd.server_port
        """The TCP port actually bound (the kernel's choice when 0 was asked)."""

    @property
    def url(self) -> str:
        """The scrape URL, ``http://HOST:PORT/metrics`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close the listening socket and join the server thread.

        Idempotent and safe to call from any thread except the server's own.

        Args:
            timeout: seconds to wait for the server thread to end.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover - a scrape stuck in a handler
            logger.warning("metrics server thread did not stop within %.1f s", timeout)

    def __enter__(self) -> MetricsServer:
        """Return the running server."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server (see :meth:`stop`); exceptions propagate."""
        self.stop()


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` from a background thread.

    Args:
        registry: the daemon's registry (never the global one).
        host: the address to bind, exactly (e.g. ``127.0.0.1``, ``::1``, or ``0.0.0.0`` when
            the operator asks for it). An empty host is refused: it would bind everywhere.
        port: TCP port; 0 lets the kernel choose (read it back from ``.port``).

    Returns:
        The running :class:`MetricsServer`.

    Raises:
        ValueError: ``host`` is empty or ``port`` is outside 0..65535.
        OSError: the address cannot be bound (in use, not local, permission).
    """
    if not host:
        raise ValueError("metrics host must be an explicit address, not empty")
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port out of range: {port}")
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    thread.name = f"metrics-http-{host}:{httpd.server_port}"
    server = MetricsServer(httpd, thread, host)
    logger.info("serving metrics on %s", server.url)
    return server
