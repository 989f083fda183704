"""The top of the house: the client side of the admin interface, for the ``connections``,
``vhost``, ``ban``, ``unban``, ``bans`` and ``status`` commands.

HTTP/1.1 with JSON bodies over the daemon's unix socket (``[admin] socket``), with the
standard library's :mod:`http.client` (only its ``connect`` is replaced, to dial the socket
instead of TCP). The API itself is documented in docs/operations.md ("Admin API") and served
by :mod:`amqp_policy_proxy.daemon.admin`.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
from typing import Any
from urllib.parse import quote, urlencode

from .daemon.config import admin_socket_from_file
from .daemon.settings import DEFAULT_ADMIN_SOCKET, ConfigError

#: The configuration the admin commands read the socket path from, when it exists.
DEFAULT_CONFIG = "/etc/amqp-policy-proxy/config.toml"
#: Seconds to wait for the daemon's answer.
TIMEOUT = 10.0


class AdminClientError(Exception):
    """The request failed; ``status`` is the HTTP status, or None when nothing answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        """``message`` is what the operator is shown."""
        super().__init__(message)
        self.status = status


class _UnixHTTPConnection(http.client.HTTPConnection):
    """:class:`http.client.HTTPConnection` over a unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        """Dial the unix socket instead of TCP."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def socket_path(admin_socket: str | None, config: str | None) -> str:
    """Where to find the daemon: ``--admin-socket``, else ``[admin] socket`` of ``--config``
    (default :data:`DEFAULT_CONFIG` when it exists, is readable and its ``[admin]`` table is
    valid), else :data:`DEFAULT_ADMIN_SOCKET`.

    Raises:
        ConfigError: ``--config`` was given and cannot be read, or its ``[admin]`` table is
            invalid.
    """
    if admin_socket:
        return admin_socket
    if config is None:
        if not os.access(DEFAULT_CONFIG, os.R_OK):
            return DEFAULT_ADMIN_SOCKET
        try:  # not asked for: a broken file must not lock the engineer on call out
            return admin_socket_from_file(DEFAULT_CONFIG) or DEFAULT_ADMIN_SOCKET
        except ConfigError:
            return DEFAULT_ADMIN_SOCKET
    return admin_socket_from_file(config) or DEFAULT_ADMIN_SOCKET


class AdminClient:
    """Requests to one daemon's admin socket; each method returns the decoded JSON answer."""

    def __init__(self, path: str, timeout: float = TIMEOUT) -> None:
        """Talk to the socket at ``path``."""
        self.path = path
        self.timeout = timeout

    def request(self, method: str, target: str, body: dict[str, Any] | None = None) -> Any:
        """One request; the decoded JSON answer.

        Raises:
            AdminClientError: the socket cannot be reached (the message says why and what to
                do), or the daemon answered with an error (its ``error`` text and status).
        """
        conn = _UnixHTTPConnection(self.path, self.timeout)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, target, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except OSError as exc:
            raise AdminClientError(self._explain(exc)) from None
        except http.client.HTTPException as exc:
            raise AdminClientError(f"{self.path}: bad answer from the daemon: {exc!r}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        if response.status >= 400:
            text = answer.get("error") if isinstance(answer, dict) else None
            raise AdminClientError(text or f"HTTP {response.status} {response.reason}",
                                   response.status)
        return answer

    def _explain(self, exc: OSError) -> str:
        path = self.path
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return (f"{path}: no daemon answers here ({exc.strerror}): is amqp-policy-proxy "
                    "running with [admin] socket set to this path? (--admin-socket PATH)")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return (f"{path}: permission denied: run as root or as a member of the socket's "
                    "group ([admin] group)")
        if isinstance(exc, TimeoutError):
            return f"{path}: the daemon did not answer within {self.timeout:g} s"
        return f"{path}: {exc.strerror or exc}"

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``."""
        return self.request("GET", "/v1/status")

    def connections(self, **filters: str | None) -> list[dict[str, Any]]:
        """``GET /v1/connections``: the admitted connections matching the filters given."""
        query = urlencode({k: v for k, v in filters.items() if v is not None})
        answer = self.request("GET", "/v1/connections" + (f"?{query}" if query else ""))
        return answer["connections"]

    def close(self, reason: str | None = None, rate: float | None = None,
              **selector: str | None) -> dict[str, Any]:
        """``POST /v1/connections/close`` with one selector (``id``, ``user``, ``vhost``,
        ``host``), the reason and, for a paced close, the rate (closes per second: the
        answer names a ``job`` to follow with :meth:`close_progress`)."""
        body: dict[str, Any] = {k: v for k, v in selector.items() if v is not None}
        if reason is not None:
            body["reason"] = reason
        if rate is not None:
            body["rate"] = rate
        return self.request("POST", "/v1/connections/close", body)

    def close_progress(self, job: str) -> dict[str, Any]:
        """``GET /v1/connections/close/JOB``: how far a paced close is."""
        return self.request("GET", f"/v1/connections/close/{quote(job, safe='')}")

    def ban(self, kind: str, value: str, seconds: float | None = None,
            reason: str | None = None) -> dict[str, Any]:
        """``POST /v1/bans/add``: ban a ``user`` or a ``host`` (address or CIDR network) for
        ``seconds`` (None: until lifted)."""
        body: dict[str, Any] = {kind: value}
        if seconds is not None:
            body["seconds"] = seconds
        if reason is not None:
            body["reason"] = reason
        return self.request("POST", "/v1/bans/add", body)

    def unban(self, kind: str, value: str) -> dict[str, Any]:
        """``POST /v1/bans/remove``: lift the ban of a ``user`` or a ``host``."""
        return self.request("POST", "/v1/bans/remove", {kind: value})

    def bans(self) -> list[dict[str, Any]]:
        """``GET /v1/bans``: the bans in force."""
        return self.request("GET", "/v1/bans")["bans"]

    def pause(self, vhost: str) -> dict[str, Any]:
        """``POST /v1/vhosts/pause``."""
        return self.request("POST", "/v1/vhosts/pause", {"vhost": vhost})

    def resume(self, vhost: str) -> dict[str, Any]:
        """``POST /v1/vhosts/resume``."""
        return self.request("POST", "/v1/vhosts/resume", {"vhost": vhost})


__all__ = ["AdminClient", "AdminClientError", "ConfigError", "DEFAULT_CONFIG", "socket_path"]
