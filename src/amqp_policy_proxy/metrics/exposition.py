"""Shell-side. Serves a registry over HTTP for Prometheus (the config's ``[metrics] address``).

prometheus_client's WSGI app (``make_wsgi_app``) on its threading WSGI server, on a daemon
thread, as its ``start_http_server`` does, plus what the daemon needs: the actual port when
asked for port 0, an idempotent :meth:`MetricsServer.stop` for shutdown and tests, and the
health probes.
The server answers ``GET /metrics`` (prometheus_client serves the registry on any path, in the
text format, or OpenMetrics when the scraper asks for it), and, when the daemon gives probes,
``GET /healthz`` and ``GET /readyz`` for load balancers (docs/fleet.md): each probe returns
``(ok, text)``; the answer is ``200`` or ``503`` with the text as a plain body.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

Probe = Callable[[], tuple[bool, str]]
"""A health probe: ``(ok, text)``; called on the HTTP server's thread for every request, so
it reads only what the event loop published."""

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


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Log nothing."""


def probing_app(metrics_app: Callable[..., Iterable[bytes]],
                probes: Mapping[str, Probe]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``GET`` on a path of ``probes`` answers 200 or 503 with the probe's text;
    any other request goes to ``metrics_app``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return metrics_app(environ, start_response)
        try:
            ok, text = probe()
        except Exception as exc:  # noqa: BLE001 - a probe that fails says "not ok"
            ok, text = False, f"probe failed: {exc}"
        body = (text.rstrip("\n") + "\n").encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
        return [body]

    return app


def start_metrics_server(registry: CollectorRegistry, host: str, port: int, *,
                         probes: Mapping[str, Probe] | None = None,
                         app: Callable[..., Iterable[bytes]] | None = None) -> MetricsServer:
    """Serve ``registry`` on ``http://host:port/metrics`` from a background thread.

    Args:
        registry: the daemon's registry (never the global one).
        probes: extra paths (``/healthz``, ``/readyz``) answered by a probe.
        app: a WSGI app that serves the metrics instead of ``registry``'s (the workers'
            parent serves its workers' merged metrics).
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
    metrics_app = app if app is not None else make_wsgi_app(registry)
    wsgi = probing_app(metrics_app, probes or {})

    class Server(ThreadingWSGIServer):
        """ThreadingWSGIServer with the address family of ``host``."""

    Server.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    httpd = make_server(host, port, wsgi, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    thread.name = f"metrics-http-{host}:{httpd.server_port}"
    server = MetricsServer(httpd, thread, host)
    logger.info("serving metrics on %s", server.url)
    return server
