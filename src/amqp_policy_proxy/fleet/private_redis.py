"""Layer 5 (I/O: a child process). The private ``redis-server`` of ``ledger = "auto"``: one host's
workers share their counts through it, on a unix socket under the runtime directory, with no
TCP port, no persistence, started before the workers and stopped after them.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["PrivateRedis", "PrivateRedisError"]


class PrivateRedisError(RuntimeError):
    """``redis-server`` is missing, or did not start (the message says why)."""


class PrivateRedis:
    """One private ``redis-server`` on a unix socket.

    Args:
        runtime_dir: where the socket goes (``[daemon] runtime_directory``, else
            ``$RUNTIME_DIRECTORY`` as systemd's ``RuntimeDirectory=`` sets it, else a new
            directory under the system's temporary directory, removed at :meth:`stop`).
        preexec_fn: run in the child before ``redis-server`` starts (the daemon passes one
            that ends the server with the process that started it, however that one dies).
    """

    def __init__(self, runtime_dir: str | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.preexec_fn = preexec_fn
        base = runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or None
        self._made_dir = base is None
        self.directory = Path(base or tempfile.mkdtemp(prefix="amqp-policy-proxy-"))
        self.socket_path = str(self.directory / "ledger-redis.sock")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``unix://`` URL of the socket."""
        return f"unix://{self.socket_path}"

    def start(self, timeout: float = 10.0) -> str:
        """Start ``redis-server`` and wait until it answers on its socket.

        Returns:
            :attr:`url`.

        Raises:
            PrivateRedisError: not installed, exited, or silent for ``timeout`` seconds.
        """
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
        if binary is None:
            raise PrivateRedisError("ledger = \"auto\" needs redis-server (Debian package "
                                    "redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self._proc = subprocess.Popen(
            [binary, "--port", "0", "--unixsocket", self.socket_path, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.directory),
             "--daemonize", "no", "--loglevel", "warning", "--logfile", ""],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise PrivateRedisError(f"redis-server exited ({self._proc.returncode}): "
                                        f"{err.strip()}")
            if _pong(self.socket_path):
                logger.info("ledger: private redis-server (pid %d) on %s", self._proc.pid,
                            self.socket_path)
                return self.url
            time.sleep(0.02)
        self.stop()
        raise PrivateRedisError(f"redis-server did not answer on {self.socket_path} within "
                                f"{timeout:g} s")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove what was created. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stderr is not None:
            proc.stderr.close()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        if self._made_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


def _pong(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            sock.connect(path)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
