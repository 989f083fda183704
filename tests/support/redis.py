"""A private Debian ``redis-server`` for tests: on 127.0.0.1 (a free port) or on a unix socket
in a temporary directory, no persistence, stopped by :meth:`RedisServer.stop` (and at
interpreter exit, or by a watchdog should the test process die).

Typical use::

    with RedisServer() as redis:
        ledger_url = redis.url
"""

from __future__ import annotations

import atexit
import contextlib
import shlex
import shutil
import signal
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

__all__ = ["RedisServer"]

_LIVE: weakref.WeakSet[RedisServer] = weakref.WeakSet()
_LOCK = threading.Lock()


def _stop_all() -> None:
    with _LOCK:
        servers = list(_LIVE)
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


atexit.register(_stop_all)


class RedisServer:
    """One ``redis-server`` process.

    Args:
        unix: listen on a unix socket in a temporary directory instead of TCP.
        port: the TCP port (a free one when None); kept across :meth:`restart`.
    """

    def __init__(self, *, unix: bool = False, port: int | None = None) -> None:
        self.unix = unix
        self.port = 0 if unix else (port or free_port())
        self.workdir = Path(tempfile.mkdtemp(prefix="redis-", dir="/tmp"))
        self.socket_path = str(self.workdir / "redis.sock")
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        """Whether ``redis-server`` is installed."""
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` or ``unix:///…/redis.sock``."""
        return f"unix://{self.socket_path}" if self.unix else f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start and wait until it answers PING."""
        args = ["redis-server", "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
                "--port", str(self.port), "--dir", str(self.workdir), "--daemonize", "no",
                "--loglevel", "warning"]
        if self.unix:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        log = open(self.workdir / "redis.log", "ab")
        with log:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=log, start_new_session=True)
        self._watchdog = spawn_watchdog(f"kill -KILL {self._proc.pid} 2>/dev/null; "
                                        f"rm -rf {shlex.quote(str(self.workdir))}")
        with _LOCK:
            _LIVE.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError("redis-server exited:\n"
                                   + (self.workdir / "redis.log").read_text(errors="replace"))
            if self.ping():
                return self
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING in time")

    def ping(self) -> bool:
        """One PING over a plain socket (no client library)."""
        try:
            if self.unix:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(0.5)
                sock.connect(self.socket_path)
            else:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
            with sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout``); the directory stays until
        :meth:`close`. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connected clients see it as slow, not gone."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a paused server (SIGCONT)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> RedisServer:
        """Stop and start again on the same address, empty."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the directory and the watchdog."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception):
                self.resume()
        self.stop()
        stop_watchdog(self._watchdog)
        self._watchdog = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        with _LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
