"""A private RabbitMQ 3.10 (Debian package) with AMQP 1.0, for integration tests.

The node runs as user ``rabbitmq``
(``su rabbitmq -s /bin/sh -c ...``, ``HOME=/var/lib/rabbitmq``), is configured only through an
env file of its own (``RABBITMQ_CONF_ENV_FILE``) with ``NODENAME=rabbit@localhost``, binds
127.0.0.1 only (AMQP listener, Erlang distribution, epmd), and keeps its Mnesia database, logs,
config and pid file in a private temporary directory owned by ``rabbitmq``.

Privacy beyond the notes: the node uses an epmd of its own on a free port (``ERL_EPMD_PORT``),
started by :meth:`RabbitMQ.start` as a direct child process. This lets several private nodes (and
a system RabbitMQ) coexist although they all are ``rabbit@localhost``, and lets :meth:`stop` end
exactly the epmd it started.

Typical use::

    with RabbitMQ() as rabbit:          # start(timeout=60)
        url = rabbit.url                # amqp://127.0.0.1:<port>
        ...                             # addresses look like /queue/NAME

Quirks observed here: 6-10 s from start to a working AMQP 1.0 handshake on the 2-CPU test
machines under load (:attr:`RabbitMQ.start_seconds` records each start; allow ``timeout`` well
above that); stopping with SIGTERM takes 1-3 s. epmd also binds ``::1`` (still loopback).
"""

from __future__ import annotations

import atexit
import contextlib
import grp
import os
import pwd
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

__all__ = ["RabbitMQ", "RabbitMQError"]

SERVER_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL_SCRIPT = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
PLUGINS_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_amqp1_0-*"
RABBITMQ_USER = "rabbitmq"
RABBITMQ_HOME = "/var/lib/rabbitmq"
NODENAME = "rabbit@localhost"

_LIVE: weakref.WeakSet[RabbitMQ] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class RabbitMQError(RuntimeError):
    """RabbitMQ could not be started or stopped; the message carries the tail of its logs."""


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        nodes = list(_LIVE)
    for node in nodes:
        with contextlib.suppress(Exception):
            node.stop()


atexit.register(_stop_all_at_exit)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return not _pid_alive(pid)


def _port_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RabbitMQ:
    """One private RabbitMQ node with the ``rabbitmq_amqp1_0`` plugin on 127.0.0.1.

    Args:
        host: the address every listener binds (AMQP, distribution, epmd); loopback by default.
        port: the AMQP port; a free port when ``None``.
        keep_workdir: keep the private directory (Mnesia, logs, config) after :meth:`stop`, for
            debugging; it is removed by default.
        config: the node's whole ``rabbitmq.conf`` (new-style ``key = value`` lines), e.g. the
            one a deployment guide shows; it must put ``listeners.tcp.1`` on ``host:port``.
            By default: that listener, ``amqp1_0.default_user = guest`` and
            ``amqp1_0.default_vhost = /``. File logging at ``info`` is added either way.
        plugins: the plugins enabled (``enabled_plugins``), e.g. with
            ``rabbitmq_auth_backend_oauth2`` for OAuth 2.0 tokens.

    Attributes:
        host, port: where the AMQP listener is (``port`` is known from construction on).
        url: ``amqp://host:port``.
        workdir: the private directory while the node exists (``None`` before :meth:`start`).
        start_seconds: wall-clock seconds the last :meth:`start` took until the AMQP 1.0
            handshake succeeded (``None`` before).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        keep_workdir: bool = False,
        config: str | None = None,
        plugins: tuple[str, ...] = ("rabbitmq_amqp1_0",),
    ) -> None:
        self.plugins = plugins
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.keep_workdir = keep_workdir
        self.config = config
        self.workdir: Path | None = None
        self.start_seconds: float | None = None
        self._dist_port: int | None = None
        self._epmd_port: int | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._console: object | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- discovery ---------------------------------------------------------------------------

    @staticmethod
    def unavailable_reason() -> str | None:
        """Say why a private node cannot be started here, or ``None`` when it can.

        Checks the Debian package (``rabbitmq-server`` script and the ``rabbitmq_amqp1_0``
        plugin), ``epmd``, ``su``, the ``rabbitmq`` user, and that we run as root (needed to
        ``su`` to ``rabbitmq`` without a password).
        """
        import glob

        if not SERVER_SCRIPT.exists():
            return f"RabbitMQ is not installed ({SERVER_SCRIPT} missing)"
        if not glob.glob(PLUGINS_GLOB):
            return "the rabbitmq_amqp1_0 plugin is not installed"
        if shutil.which("epmd") is None:
            return "epmd (Erlang) is not installed"
        if shutil.which("su") is None:
            return "su is not installed"
        try:
            pwd.getpwnam(RABBITMQ_USER)
        except KeyError:
            return f"user {RABBITMQ_USER!r} does not exist"
        if os.geteuid() != 0:
            return "starting RabbitMQ as user rabbitmq needs root"
        return None

    @classmethod
    def available(cls) -> bool:
        """Whether the Debian RabbitMQ package is installed and a private node can be started.

        See :meth:`unavailable_reason` for what is checked.
        """
        return cls.unavailable_reason() is None

    # -- properties ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The AMQP URL of the node's listener, ``amqp://host:port``."""
        return f"amqp://{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path | None:
        """The ``beam.smp`` pid file (in the Mnesia directory), once :meth:`start` ran."""
        if self.workdir is None:
            return None
        return self.workdir / "mnesia" / f"{NODENAME}.pid"

    @property
    def log_dir(self) -> Path | None:
        """The node's log directory, once :meth:`start` ran."""
        return None if self.workdir is None else self.workdir / "log"

    @property
    def running(self) -> bool:
        """Whether the node's processes are up (not whether AMQP works)."""
        return self._server is not None and self._server.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> int:
        """Start the node and wait until AMQP 1.0 works on :attr:`port`.

        Waits for the listener to accept TCP and then for a complete AMQP 1.0 handshake (SASL
        ANONYMOUS, Open, Close) with proton; with a ``config`` of the caller's (which may refuse
        ANONYMOUS), for the node to answer the AMQP 1.0 SASL protocol header. The time taken
        is stored in :attr:`start_seconds`.

        Args:
            timeout: seconds to wait for the handshake, from the start of the call.

        Returns:
            The AMQP port.

        Raises:
            RabbitMQError: when the package is unusable here, the node exits early, or the
                handshake does not succeed in time (the node is stopped first; the message ends
                with the tail of its logs).
            RuntimeError: when the node is already started.
        """
        reason = self.unavailable_reason()
        if reason is not None:
            raise RabbitMQError(reason)
        with self._lock:
            if self._server is not None:
                raise RuntimeError("RabbitMQ already started")
            began = time.monotonic()
            self._prepare_workdir()
            with _LIVE_LOCK:
                _LIVE.add(self)
            try:
                self._start_epmd()
                self._start_server()
                self._watchdog = spawn_watchdog(self._cleanup_script())
            except BaseException:
                self._stop_locked()
                raise
        try:
            self._wait_ready(began + timeout)
        except BaseException as exc:
            logs = self._log_tail()
            self.stop()
            if isinstance(exc, RabbitMQError):
                raise RabbitMQError(f"{exc}\n{logs}") from None
            raise
        self.start_seconds = time.monotonic() - began
        return self.port

    def ctl(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl ARGS`` against this node, as user ``rabbitmq``.

        It uses the node's own env file (node name, distribution interface) and epmd port, and
        the same Erlang cookie (``HOME=/var/lib/rabbitmq``). Each call starts an Erlang VM: 2-5
        s on the 2-CPU test machines.

        Args:
            args: the arguments, e.g. ``("add_user", "app", "secret")``.
            timeout: seconds before the call is abandoned (``subprocess.TimeoutExpired``).

        Returns:
            The finished process, with ``stdout``/``stderr`` as text; not checked.

        Raises:
            RuntimeError: when the node was not started.
        """
        if self.workdir is None or self._epmd_port is None:
            raise RuntimeError("RabbitMQ not started")
        env = self._child_env()
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.workdir / "rabbitmq-env.conf")
        assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        command = (f"exec env -i {assignments} {shlex.quote(str(CTL_SCRIPT))} "
                   + " ".join(shlex.quote(arg) for arg in args))
        return subprocess.run(
            ["su", RABBITMQ_USER, "-s", "/bin/sh", "-c", command],
            cwd=self.workdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout,
        )

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the node: SIGTERM ``beam.smp`` (pid file), SIGKILL after ``timeout``, then epmd.

        Idempotent; also run at interpreter exit for every node still running.

        Args:
            timeout: seconds to wait for a graceful shutdown before SIGKILL.
        """
        with self._lock:
            self._stop_locked(timeout)

    def __enter__(self) -> RabbitMQ:
        """Start the node (``start()`` with its default timeout) and return it."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the node."""
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RabbitMQ {self.url} {state}>"

    # -- internals -----------------------------------------------------------------------------

    def _prepare_workdir(self) -> None:
        work = Path(tempfile.mkdtemp(prefix="rabbitmq-test-"))
        self.workdir = work
        (work / "mnesia").mkdir()
        (work / "log").mkdir()
        self._dist_port = free_port(self.host)
        self._epmd_port = free_port(self.host)
        ip_tuple = "{" + ",".join(self.host.split(".")) + "}"
        (work / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        config = self.config
        if config is None:
            config = (f"listeners.tcp.1 = {self.host}:{self.port}\n"
                      "amqp1_0.default_user = guest\n"
                      "amqp1_0.default_vhost = /\n")
        (work / "rabbitmq.conf").write_text(
            config.rstrip("\n") + "\nlog.console = false\nlog.file.level = info\n")
        dist_args = f"-kernel inet_dist_use_interface {ip_tuple}"
        env_lines = {
            "NODENAME": NODENAME,
            "NODE_IP_ADDRESS": self.host,
            "NODE_PORT": str(self.port),
            "DIST_PORT": str(self._dist_port),
            "CONFIG_FILE": str(work / "rabbitmq.conf"),
            "ENABLED_PLUGINS_FILE": str(work / "enabled_plugins"),
            "MNESIA_BASE": str(work / "mnesia"),
            "LOG_BASE": str(work / "log"),
            "PID_FILE": str(work / "mnesia" / f"{NODENAME}.pid"),
            "SERVER_ADDITIONAL_ERL_ARGS": dist_args,
            "CTL_ERL_ARGS": dist_args,
            "ERL_EPMD_ADDRESS": self.host,
            "ERL_EPMD_PORT": str(self._epmd_port),
        }
        (work / "rabbitmq-env.conf").write_text(
            "".join(f"{key}={shlex.quote(value)}\n" for key, value in env_lines.items())
        )
        uid = pwd.getpwnam(RABBITMQ_USER).pw_uid
        gid = grp.getgrnam(RABBITMQ_USER).gr_gid if _group_exists(RABBITMQ_USER) else -1
        for path in [work, *work.rglob("*")]:
            os.chown(path, uid, gid)

    def _child_env(self) -> dict[str, str]:
        return {
            "HOME": RABBITMQ_HOME,
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ERL_EPMD_ADDRESS": self.host,
            "ERL_EPMD_PORT": str(self._epmd_port),
        }

    def _start_epmd(self) -> None:
        assert self.workdir is not None and self._epmd_port is not None
        self._epmd = subprocess.Popen(
            ["epmd", "-port", str(self._epmd_port), "-address", self.host],
            user=RABBITMQ_USER,
            cwd=self.workdir,
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while not _port_accepts(self.host, self._epmd_port):
            if self._epmd.poll() is not None:
                raise RabbitMQError(f"epmd exited with status {self._epmd.returncode}")
            if time.monotonic() > deadline:
                raise RabbitMQError("epmd did not listen within 10 s")
            time.sleep(0.02)

    def _start_server(self) -> None:
        assert self.workdir is not None
        env = self._child_env()
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.workdir / "rabbitmq-env.conf")
        assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        command = (
            f"cd {shlex.quote(str(self.workdir))} && "
            f"exec env -i {assignments} {shlex.quote(str(SERVER_SCRIPT))}"
        )
        console = open(self.workdir / "log" / "console.out", "wb")
        self._console = console
        self._server = subprocess.Popen(
            ["su", RABBITMQ_USER, "-s", "/bin/sh", "-c", command],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_ready(self, deadline: float) -> None:
        while True:
            if self._server is None or self._server.poll() is not None:
                code = None if self._server is None else self._server.returncode
                raise RabbitMQError(f"rabbitmq-server exited early (status {code})")
            if _port_accepts(self.host, self.port) and self._handshake_ok():
                return
            if time.monotonic() > deadline:
                raise RabbitMQError(
                    f"RabbitMQ did not complete an AMQP 1.0 handshake on {self.url} in time"
                )
            time.sleep(0.1)

    def _handshake_ok(self) -> bool:
        if self.config is not None:
            # A given config may refuse ANONYMOUS (amqp1_0.default_user = none): the AMQP 1.0
            # plugin answering the SASL protocol header with its own is the readiness sign.
            return _sasl_header_answered(self.host, self.port)
        from proton.utils import BlockingConnection

        try:
            conn = BlockingConnection(self.url, timeout=5, allowed_mechs="ANONYMOUS")
        except Exception:
            return False
        with contextlib.suppress(Exception):
            conn.close()
        return True

    def _beam_pids(self) -> list[int]:
        pids: list[int] = []
        pid_file = self.pid_file
        if pid_file is not None:
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(pid_file.read_text().strip()))
        if not pids and self.workdir is not None:
            # No pid file yet (early start): find beam.smp by its unique private directory.
            marker = str(self.workdir).encode()
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"beam" in cmdline.split(b"\0", 1)[0] and marker in cmdline:
                    pids.append(int(entry.name))
        return pids

    def _cleanup_script(self) -> str:
        """Shell commands doing :meth:`stop` if this process dies without running ``atexit``."""
        assert self.workdir is not None and self._server is not None and self._epmd is not None
        pid_file = shlex.quote(str(self.pid_file))
        return (
            f"b=$(cat {pid_file} 2>/dev/null)\n"
            'if [ -n "$b" ]; then\n'
            '  kill -TERM "$b" 2>/dev/null; i=0\n'
            '  while kill -0 "$b" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done\n'
            '  kill -KILL "$b" 2>/dev/null\n'
            "fi\n"
            f"kill -TERM {self._server.pid} {self._epmd.pid} 2>/dev/null\n"
            "sleep 1\n"
            + ("" if self.keep_workdir else f"rm -rf {shlex.quote(str(self.workdir))}\n")
        )

    def _stop_locked(self, timeout: float = 15.0) -> None:
        stop_watchdog(self._watchdog)
        self._watchdog = None
        for pid in self._beam_pids():
            if not _pid_alive(pid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not _wait_pid_gone(pid, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_pid_gone(pid, 5)
        if self._server is not None:
            if self._server.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._server.terminate()
                try:
                    self._server.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._server.kill()
                    self._server.wait(5)
            self._server = None
        if self._epmd is not None:
            if self._epmd.poll() is None:
                self._epmd.terminate()
                try:
                    self._epmd.wait(5)
                except subprocess.TimeoutExpired:
                    self._epmd.kill()
                    self._epmd.wait(5)
            self._epmd = None
        if self._console is not None:
            with contextlib.suppress(OSError):
                self._console.close()  # type: ignore[attr-defined]
            self._console = None
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_dir is None or not self.log_dir.exists():
            return "(no logs)"
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no logs)"


def _sasl_header_answered(host: str, port: int) -> bool:
    """Whether ``host:port`` answers the AMQP 1.0 SASL protocol header with the same header."""
    header = b"AMQP\x03\x01\x00\x00"
    try:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(header)
            got = b""
            while len(got) < len(header):
                chunk = sock.recv(len(header) - len(got))
                if not chunk:
                    return False
                got += chunk
            return got == header
    except OSError:
        return False


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True
