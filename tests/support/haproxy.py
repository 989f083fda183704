"""HAProxy 2.6 (Debian) in TCP mode: the generic-proxy baseline for benchmarks and tests.

One foreground ``haproxy -db`` process per :class:`HAProxy`, listening on 127.0.0.1 (a free port by
default) and forwarding every connection to one backend: ``mode tcp``, ``timeout client/server
1h``, ``maxconn 20000``, no logging (HAProxy 2.6 from Debian in its plain TCP-proxy form). The
backend sees HAProxy's address as the client's, unless ``send_proxy`` makes HAProxy send the
PROXY protocol header (``send-proxy`` v1 or ``send-proxy-v2``) with the client's address first.

Typical use::

    with HAProxy(("127.0.0.1", broker.port)) as proxy:
        connect_to(proxy.host, proxy.port)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from . import spawn_watchdog, stop_watchdog
from .ports import free_port

__all__ = ["HAProxy", "HAProxyError"]

_LIVE: weakref.WeakSet[HAProxy] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class HAProxyError(RuntimeError):
    """HAProxy could not be started; the message carries its stderr."""


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        proxies = list(_LIVE)
    for proxy in proxies:
        with contextlib.suppress(Exception):
            proxy.stop()


atexit.register(_stop_all_at_exit)


def _listening(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a socket listening on TCP ``port`` (Linux ``/proc``).

    Used instead of a test connection, which HAProxy would forward to the backend.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


def _parse_backend(backend: tuple[str, int] | str) -> tuple[str, int]:
    if isinstance(backend, str):
        host, sep, port = backend.rpartition(":")
        if not sep or not host:
            raise ValueError(f"backend must be HOST:PORT, got {backend!r}")
        return host.strip("[]"), int(port)
    host, port = backend
    return host, int(port)


def _fd_connection_budget() -> int:
    """How many proxied connections the hard file descriptor limit allows (2 fds each)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (hard - 100) // 2)


class HAProxy:
    """A TCP-mode HAProxy in front of one backend.

    Args:
        backend: ``(host, port)`` or ``"HOST:PORT"`` of the server to forward to.
        host: the address to listen on (loopback by default).
        port: the port to listen on; a free port when ``None``.
        maxconn: the global and per-frontend connection limit wanted. HAProxy needs two file
            descriptors per connection and cannot go above this process's hard ``RLIMIT_NOFILE``
            (20000 on the CI machines, which HAProxy cannot raise there), so the limit actually
            configured is clamped to fit; see :attr:`maxconn` and :attr:`requested_maxconn`.
        connect_timeout: seconds HAProxy waits for the backend's TCP handshake.
        send_proxy: ``"send-proxy"`` (PROXY protocol v1) or ``"send-proxy-v2"`` on the server
            line; None: no header.
        source: the address HAProxy connects to the backend from (``source`` on the server
            line); None: the kernel's choice (127.0.0.1 on loopback).
        health_check: check the backend every 200 ms, the PROXY header included
            (``check-send-proxy``; v2 sends the ``LOCAL`` command): the check sends the AMQP
            SASL header and expects the backend to answer with an AMQP header. See
            :meth:`server_state`.

    Attributes:
        host, port: where HAProxy listens (``port`` is known from construction on).
        backend: ``(host, port)`` it forwards to.
        maxconn: the connection limit configured (``requested_maxconn`` clamped to the file
            descriptor limit).
        requested_maxconn: the ``maxconn`` argument.
    """

    def __init__(
        self,
        backend: tuple[str, int] | str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        maxconn: int = 20000,
        connect_timeout: float = 5.0,
        send_proxy: str | None = None,
        source: str | None = None,
        health_check: bool = False,
    ) -> None:
        if send_proxy not in (None, "send-proxy", "send-proxy-v2"):
            raise ValueError(f"send_proxy must be send-proxy or send-proxy-v2, got {send_proxy!r}")
        self.send_proxy = send_proxy
        self.source = source
        self.health_check = health_check
        self.backend = _parse_backend(backend)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.requested_maxconn = maxconn
        self.maxconn = min(maxconn, _fd_connection_budget())
        self.connect_timeout = connect_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._last_status: int | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def available() -> bool:
        """Whether an ``haproxy`` binary is on ``PATH``."""
        return shutil.which("haproxy") is not None

    @property
    def address(self) -> str:
        """``host:port`` of the listener."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The HAProxy process id while started, else ``None``."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the HAProxy process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def config_text(self) -> str:
        """The configuration file this instance runs with."""
        bhost, bport = self.backend
        bind_host = f"[{self.host}]" if ":" in self.host else self.host
        server = f"[{bhost}]" if ":" in bhost else bhost
        connect_ms = max(1, int(self.connect_timeout * 1000))
        options = ""
        if self.send_proxy:
            options += f" {self.send_proxy}"
        if self.source:
            options += f" source {self.source}"
        check = ""
        if self.health_check:
            options += " check check-send-proxy inter 200ms fall 2 rise 1"
            check = ("    option tcp-check\n"
                     "    tcp-check connect default\n"
                     "    tcp-check send-binary 414d515003010000\n"  # AMQP 3.1.0.0 (SASL)
                     "    tcp-check expect binary 414d5150\n")
        stats = (f"    stats socket {self._workdir}/admin.sock mode 600 level admin\n"
                 if self._workdir is not None and self.health_check else "")
        return (
            "global\n"
            f"{stats}"
            f"    maxconn {self.maxconn}\n"
            "defaults\n"
            "    mode tcp\n"
            f"    maxconn {self.maxconn}\n"
            f"    timeout connect {connect_ms}ms\n"
            "    timeout client 1h\n"
            "    timeout server 1h\n"
            "frontend amqp_in\n"
            f"    bind {bind_host}:{self.port}\n"
            "    default_backend amqp_out\n"
            "backend amqp_out\n"
            f"{check}"
            f"    server upstream {server}:{bport}{options}\n"
        )

    def server_state(self, backend: str = "amqp_out", server: str = "upstream") -> dict[str, str]:
        """With ``health_check``: the backend server's row of HAProxy's ``show stat`` (``status``: ``UP``, ``DOWN``
        or ``no check``; ``chkfail``: failed checks; ``check_status``...), read from the
        admin socket (``stats socket WORKDIR/admin.sock``)."""
        assert self._workdir is not None, "HAProxy is not running"
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self._workdir / "admin.sock"))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == backend and row.get("svname") == server:
                return row
        raise AssertionError(f"no server row in: {data!r}")

    def start(self, timeout: float = 10.0) -> int:
        """Start HAProxy in the foreground (``haproxy -db``) and wait until it listens.

        Readiness is read from ``/proc/net/tcp`` rather than probed with a connection, so the
        backend sees no extra connection.

        Args:
            timeout: seconds to wait for the listener.

        Returns:
            The listening port.

        Raises:
            HAProxyError: when ``haproxy`` is missing, exits, or does not listen in time.
            RuntimeError: when already started.
        """
        haproxy = shutil.which("haproxy")
        if haproxy is None:
            raise HAProxyError("haproxy is not installed")
        with self._lock:
            if self._proc is not None:
                raise RuntimeError("HAProxy already started")
            self._workdir = Path(tempfile.mkdtemp(prefix="haproxy-test-"))
            os.chmod(self._workdir, 0o700)
            cfg = self._workdir / "haproxy.cfg"
            cfg.write_text(self.config_text())
            stderr = open(self._workdir / "stderr.log", "wb")
            with stderr:
                self._proc = subprocess.Popen(
                    [haproxy, "-db", "-f", str(cfg)],
                    cwd=self._workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    start_new_session=True,
                )
            proc = self._proc
            self._watchdog = spawn_watchdog(
                f"kill -TERM {proc.pid} 2>/dev/null; rm -rf {shlex.quote(str(self._workdir))}"
            )
            with _LIVE_LOCK:
                _LIVE.add(self)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                err = self._stderr_text()
                self.stop()
                raise HAProxyError(f"haproxy exited with status {proc.returncode}:\n{err}")
            if _listening(proc.pid, self.port):
                return self.port
            if time.monotonic() > deadline:
                err = self._stderr_text()
                self.stop()
                raise HAProxyError(f"haproxy did not listen on {self.address} in time:\n{err}")
            time.sleep(0.02)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate HAProxy (SIGTERM, SIGKILL after ``timeout`` s) and remove its files.

        Idempotent; also run at interpreter exit for every instance still running.
        """
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None:
                self._last_status = proc.poll()
                if self._last_status is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout)
                    self._last_status = proc.returncode
            stop_watchdog(self._watchdog)
            self._watchdog = None
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self) -> HAProxy:
        """Start HAProxy and return it."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop HAProxy."""
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        bhost, bport = self.backend
        return f"<HAProxy {self.address} -> {bhost}:{bport} {state}>"

    def _stderr_text(self) -> str:
        if self._workdir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self._workdir / "stderr.log").read_text(errors="replace")
        return ""
