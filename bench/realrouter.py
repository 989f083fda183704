#!/usr/bin/env python3
"""The headline benchmark: a real Qpid Dispatch Router, direct / HAProxy / proxy, unpinned.

Bench tooling, not part of the package (and never run by the test suite). Starts, all on
127.0.0.1 and each stopped again by its PID at the end (also on Ctrl-C or SIGTERM):

- ``qdrouterd`` (from ``QDR_HOME``; ``source /opt/qdr-env.sh`` or ``--qdr-env``) with a
  SASL ANONYMOUS listener and a permissive vhost policy at QDR's maximum limits;
- HAProxy (Debian's 2.6) in TCP mode, ``nbthread 1``, in front of the router;
- the proxy exactly as deployed: ``amqp-policy-proxy run --listen .. --upstream ..
  --policy bench/policies/realrouter.json --metrics .. --event-log DIR`` (metrics listener
  and event log on), without ``PYTHONPATH``, so it runs the installed package next to
  ``--proxy-bin`` (by default the one next to this Python);

and measures each target with ``bench/loadgen/amqpload.c`` (the project's C load client on
Qpid Proton's proactor, built on first use): unsettled 100 B and 16 KiB throughput (one
sender, one receiver, credit 1000, the receiver accepts each message), request/response
round trip p50/p99, connection rate with time to Open (TCP + SASL ANONYMOUS + Open + Close,
8 workers) and idle RSS per connection (2000 connections, fresh processes per sample).
Nothing is pinned. Every benchmark runs ``--rounds`` times per target, targets alternating
(the order rotates each round). Every sample records the CPU of the router, HAProxy, the
proxy and the load clients over the measured window, the whole machine's busy CPU, and
"other": the machine minus every process of the run (load from outside the run).

Writes ``bench/results/realrouter-latest.{md,json}`` (and a time-stamped copy) and prints
the Markdown tables. Refuses to run (exit 2, a clear message) when qdrouterd, HAProxy, a C
compiler or the Proton C headers are missing.

Usage::

    .venv/bin/python bench/realrouter.py                       # 3 rounds, ~6 minutes
    .venv/bin/python bench/realrouter.py --benches tput-100B,connect --rounds 5
    .venv/bin/python bench/realrouter.py --quick --rounds 1    # smoke run, ~1 minute
    .venv/bin/python bench/realrouter.py --profile             # + py-spy of the proxy
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for _p in (str(BENCH_DIR), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

RESULTS_DIR = BENCH_DIR / "results"
LOADGEN_SRC = BENCH_DIR / "loadgen" / "amqpload.c"
LOADGEN_BUILD = BENCH_DIR / "loadgen" / "build"
POLICY_FILE = BENCH_DIR / "policies" / "realrouter.json"
DEFAULT_QDR_ENV = Path("/opt/qdr-env.sh")
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGETS = ("direct", "haproxy", "proxy")
VHOST = "bench.vhost"

# Router configuration: one SASL ANONYMOUS listener (maxFrameSize 65536, so a 16 KiB message
# is one frame, as through the proxy), vhost policy on with QDR's maximum limits so that
# thousands of benchmark connections are admitted, warnings only in the log (per-connection
# info lines would cost router CPU). Worker threads: qdrouterd's default.
ROUTER_CONF = """\
router {{
    mode: standalone
    id: bench-router
}}
listener {{
    name: bench-amqp
    host: 127.0.0.1
    port: {port}
    role: normal
    authenticatePeer: no
    saslMechanisms: ANONYMOUS
    maxFrameSize: 65536
}}
policy {{
    maxConnections: 65535
    enableVhostPolicy: true
    enableVhostNamePatterns: false
    defaultVhost: $default
}}
vhost {{
    hostname: $default
    maxConnections: 65535
    maxConnectionsPerUser: 65535
    maxConnectionsPerHost: 65535
    allowUnknownUser: true
    groups: {{
        "$default": {{
            "users": "*",
            "remoteHosts": "*",
            "sources": "*",
            "targets": "*",
            "allowDynamicSource": true,
            "allowAnonymousSender": true,
            "allowAdminStatusUpdate": true
        }}
    }}
}}
log {{
    module: DEFAULT
    enable: warning+
    includeTimestamp: yes
    outputFile: {log}
}}
"""


class Unavailable(SystemExit):
    """Something the bench needs is missing: exit 2 with a message saying what."""

    def __init__(self, message: str) -> None:
        """``message``: what is missing and how to get it."""
        super().__init__(2)
        self.message = message


# --- environment ------------------------------------------------------------------------------


@dataclass
class QdrEnv:
    """Where qdrouterd and the Proton C library are (from the environment or an env file)."""

    home: Path
    pythonpath: str
    ld_library_path: str
    proton_home: Path | None

    @property
    def qdrouterd(self) -> Path:
        """The router binary."""
        return self.home / "sbin" / "qdrouterd"


def read_env_file(path: Path) -> dict[str, str]:
    """``export NAME=VALUE`` lines of a shell file (values unquoted, ``$VAR`` not expanded)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("export "):
            line = line[len("export "):]
        name, eq, value = line.partition("=")
        if eq and name.isidentifier():
            out[name] = value.strip().strip("'\"")
    return out


def find_qdr(env_file: Path | None) -> QdrEnv:
    """QDR_HOME & co from the environment, else from ``env_file``; Unavailable if absent."""
    env = dict(os.environ)
    if "QDR_HOME" not in env and env_file is not None and env_file.exists():
        env = {**read_env_file(env_file), **env}
    home = env.get("QDR_HOME")
    hint = ("build qdrouterd 1.19.0 and a Cyrus proton 0.37.0 (see bench/README.md, "
            "'Real router'), then `source /opt/qdr-env.sh` or pass --qdr-env FILE")
    if not home:
        raise Unavailable(f"qdrouterd not found: QDR_HOME is not set and {env_file} does "
                          f"not exist; {hint}")
    qenv = QdrEnv(
        home=Path(home),
        pythonpath=env.get("QDR_PYTHONPATH", ""),
        ld_library_path=env.get("QDR_LD_LIBRARY_PATH", env.get("PROTON_HOME", "") + "/lib"),
        proton_home=Path(env["PROTON_HOME"]) if env.get("PROTON_HOME") else None,
    )
    if not os.access(qenv.qdrouterd, os.X_OK):
        raise Unavailable(f"qdrouterd not found at {qenv.qdrouterd}; {hint}")
    return qenv


def proton_flags(qenv: QdrEnv | None) -> list[str]:
    """Compiler and linker flags for Proton C: ``$PROTON_HOME`` (the router's own proton),
    else pkg-config: the split core/proactor libraries, or Debian's ``libqpid-proton11-dev``
    (one ``libqpid-proton``, the proactor included); Unavailable when none works."""
    if qenv and qenv.proton_home and (qenv.proton_home / "include/proton/proactor.h").exists():
        lib = qenv.proton_home / "lib"
        return [f"-I{qenv.proton_home / 'include'}", f"-L{lib}", f"-Wl,-rpath,{lib}",
                "-lqpid-proton-proactor", "-lqpid-proton-core"]
    errors = []
    for pkgs in (["libqpid-proton-proactor", "libqpid-proton-core"], ["libqpid-proton"]):
        try:
            out = subprocess.run(["pkg-config", "--cflags", "--libs", *pkgs],
                                 capture_output=True, text=True, check=True)
            return out.stdout.split()
        except (OSError, subprocess.CalledProcessError) as exc:
            errors.append(f"{' '.join(pkgs)}: {getattr(exc, 'stderr', '') or exc}".strip())
    raise Unavailable("Proton C headers not found: set PROTON_HOME or install "
                      f"libqpid-proton11-dev ({'; '.join(errors)})")


def loadgen_binary(qenv: QdrEnv | None) -> Path:
    """The compiled ``amqpload`` client; (re)built when the source or the flags changed."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise Unavailable("no C compiler (gcc) to build bench/loadgen/amqpload.c")
    flags = proton_flags(qenv)
    digest = hashlib.sha1(LOADGEN_SRC.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    path = LOADGEN_BUILD / f"amqpload-{digest}"
    if not path.exists():
        LOADGEN_BUILD.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        subprocess.run([cc, "-O2", "-Wall", "-o", str(tmp), str(LOADGEN_SRC), *flags],
                       check=True)
        os.replace(tmp, path)
    return path


def raise_nofile() -> None:
    """Raise the open-file soft limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- /proc ------------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all threads; also readable while a zombie)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu_seconds() -> dict[str, float]:
    """Whole-machine CPU seconds since boot from ``/proc/stat``: ``tasks`` (user, nice,
    system), ``irq`` (irq and softirq: on this kernel's tick accounting, softirq time, e.g.
    loopback TCP, is not charged to any process) and ``steal`` (taken by the hypervisor)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"tasks": (v[0] + v[1] + v[2]) / CLK_TCK, "irq": (v[5] + v[6]) / CLK_TCK,
            "steal": v[7] / CLK_TCK}


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class CpuSampler:
    """CPU seconds of named processes and of the machine, sampled every ``period`` seconds.

    ``between(t0, t1)`` gives, for each name, the cores used over ``[t0, t1]``
    (``time.monotonic()`` seconds), interpolating between samples; ``"machine"`` is the whole
    machine's busy cores (tasks + irq/softirq), ``"irq"`` the irq and softirq part of it,
    ``"steal"`` what the hypervisor took, and ``"other"`` the machine's task time minus every
    watched process (load from outside the run). Processes may
    be added while it runs; a process that exits keeps its last reading (keep children
    unreaped until :meth:`stop` so their last reading is their total).
    """

    def __init__(self, watch: dict[str, int], period: float = 0.05) -> None:
        """``watch``: name -> pid."""
        self.watch = dict(watch)
        self.period = period
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str, pid: int) -> None:
        """Watch one more process from now on (its CPU before now is not counted)."""
        with self._lock:
            self.watch[name] = pid
            base = self._read_pid(pid)
            for _, vals in self.samples:
                vals.setdefault(name, base)

    @staticmethod
    def _read_pid(pid: int) -> float:
        try:
            return proc_cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            return 0.0

    def sample(self) -> None:
        """Take one sample now."""
        with self._lock:
            m = machine_cpu_seconds()
            vals = {"machine": m["tasks"] + m["irq"], "_tasks": m["tasks"], "irq": m["irq"],
                    "steal": m["steal"]}
            last = self.samples[-1][1] if self.samples else {}
            for name, pid in self.watch.items():
                try:
                    vals[name] = proc_cpu_seconds(pid)
                except (OSError, IndexError, ValueError):
                    vals[name] = last.get(name, 0.0)
            self.samples.append((time.monotonic(), vals))

    def start(self) -> CpuSampler:
        """Start the sampling thread."""
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def stop(self) -> None:
        """Stop sampling (one last sample)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _at(self, t: float) -> dict[str, float]:
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (ta, va), (tb, vb) in zip(s, s[1:], strict=False):
            if ta <= t <= tb:
                f = (t - ta) / (tb - ta) if tb > ta else 1.0
                return {k: va.get(k, 0.0) + f * (vb.get(k, 0.0) - va.get(k, 0.0)) for k in vb}
        return s[-1][1]

    def between(self, t0: float | None = None, t1: float | None = None) -> dict[str, float]:
        """Cores used per name over ``[t0, t1]`` (default: the whole sampled span)."""
        t0 = self.samples[0][0] if t0 is None else t0
        t1 = self.samples[-1][0] if t1 is None else t1
        a, b = self._at(t0), self._at(t1)
        wall = max(t1 - t0, 1e-9)
        out = {k: round((b.get(k, 0.0) - a.get(k, 0.0)) / wall, 4) for k in b}
        own = sum(v for k, v in out.items() if k not in ("machine", "_tasks", "irq", "steal"))
        out["other"] = round(max(0.0, out.pop("_tasks") - own), 4)
        return out


# --- processes --------------------------------------------------------------------------------


_LIVE: set[subprocess.Popen[Any]] = set()


def _stop_proc(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, by PID; reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)
    _LIVE.discard(proc)


def stop_all() -> None:
    """Stop every process this module started that still runs."""
    for proc in list(_LIVE):
        _stop_proc(proc, 5.0)


def wait_tcp(host: str, port: int, proc: subprocess.Popen[Any], timeout: float,
             log: Path) -> None:
    """Wait until ``host:port`` accepts TCP connections; raise if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}; "
                               f"{log}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{host}:{port} not listening after {timeout}s; see {log}")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (see tests/support/ports.py)."""
    from tests.support.ports import free_port as _free_port

    return _free_port("127.0.0.1")


class Client:
    """One ``amqpload`` process: stdout read line by line, left unreaped until :meth:`reap`
    so that its CPU stays readable in ``/proc`` (as a zombie) after it exits."""

    def __init__(self, exe: Path, args: list[str]) -> None:
        """Start ``exe args``."""
        self.argv = [str(exe), *args]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        _LIVE.add(self.proc)
        self.pid = self.proc.pid
        self.out = b""
        self.err = b""
        self.status: int | None = None

    def read_line(self, prefix: str, timeout: float) -> str:
        """Block until a stdout line starting with ``prefix`` arrives."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            for line in self.out.decode(errors="replace").splitlines()[:-1] + (
                    [self.out.decode(errors="replace")] if self.out.endswith(b"\n") else []):
                if line.startswith(prefix):
                    return line
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.argv[1]}: no {prefix!r} line in {timeout}s")
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"{self.argv[1]} exited before {prefix!r}: "
                                       f"{self._stderr()}")
                self.out += chunk

    def _stderr(self) -> str:
        assert self.proc.stderr is not None
        with contextlib.suppress(OSError):
            self.err += self.proc.stderr.read()
        return self.err.decode(errors="replace")[-800:]

    def exited(self) -> bool:
        """Whether the process has exited (without reaping it)."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def kill(self) -> None:
        """SIGKILL it (if still running)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        """Collect its output and exit status."""
        assert self.proc.stdout is not None
        self.out += self.proc.stdout.read()
        self._stderr()
        self.status = self.proc.wait()
        _LIVE.discard(self.proc)

    def result(self) -> dict[str, Any]:
        """The JSON object on its last ``{`` line."""
        for line in reversed(self.out.decode(errors="replace").splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"{' '.join(self.argv[1:3])} printed no result (exit "
                           f"{self.status}): {self.err.decode(errors='replace')[-500:]}")


def wait_clients(clients: Iterable[Client], timeout: float) -> bool:
    """Wait until every client exited (unreaped); kill them all after ``timeout`` seconds."""
    clients = list(clients)
    deadline = time.monotonic() + timeout
    while not all(c.exited() for c in clients):
        if time.monotonic() > deadline:
            for c in clients:
                c.kill()
            while not all(c.exited() for c in clients):
                time.sleep(0.01)
            return False
        time.sleep(0.005)
    return True


# --- the services -----------------------------------------------------------------------------


class Router:
    """qdrouterd with :data:`ROUTER_CONF` on a free port."""

    def __init__(self, qenv: QdrEnv, rundir: Path) -> None:
        """Create (not start)."""
        self.qenv, self.rundir = qenv, rundir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it listens."""
        self.port = free_port()
        conf = self.rundir / "qdrouterd.conf"
        conf.write_text(ROUTER_CONF.format(port=self.port, log=self.rundir / "qdrouterd.log"))
        out = self.rundir / "qdrouterd.stdout"
        env = {**os.environ, "PYTHONPATH": self.qenv.pythonpath,
               "LD_LIBRARY_PATH": self.qenv.ld_library_path}
        with open(out, "ab") as log:
            self.proc = subprocess.Popen([str(self.qenv.qdrouterd), "-c", str(conf)], env=env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self.proc)
        wait_tcp("127.0.0.1", self.port, self.proc, 30.0, out)

    @property
    def pid(self) -> int:
        """The router's process id."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop it."""
        if self.proc is not None:
            _stop_proc(self.proc)
            self.proc = None


class Proxy:
    """``amqp-policy-proxy run`` as deployed: metrics listener and event log on."""

    def __init__(self, proxy_bin: Path, rundir: Path, policy: Path = POLICY_FILE,
                 pythonpath: str | None = None) -> None:
        """Create (not start); ``pythonpath``: the proxy's only ``PYTHONPATH`` (e.g. the
        ``src`` of a clean checkout in front of the venv's editable install), else none."""
        self.proxy_bin, self.rundir, self.policy = proxy_bin, rundir, policy
        self.pythonpath = pythonpath
        self.port = self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []
        self.event_dir = rundir / "events"

    def start(self, upstream: str) -> None:
        """Start it in front of ``upstream`` and wait until it listens."""
        self.port, self.metrics_port = free_port(), free_port()
        self.event_dir.mkdir(parents=True, exist_ok=True)
        # with a PYTHONPATH onto another checkout, the venv's entry-point script may belong to
        # another version (it imports its own module path): run the package as a module then
        launcher = ([str(self.proxy_bin.parent / "python"), "-m", "amqp_policy_proxy"]
                    if self.pythonpath else [str(self.proxy_bin)])
        self.argv = [*launcher, "run", "--listen", f"127.0.0.1:{self.port}",
                     "--upstream", upstream, "--policy", str(self.policy),
                     "--metrics", f"127.0.0.1:{self.metrics_port}",
                     "--event-log", str(self.event_dir)]
        log = self.rundir / "proxy.log"
        env = proxy_env(self.pythonpath)
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(self.argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self.proc)
        wait_tcp("127.0.0.1", self.port, self.proc, 30.0, log)

    @property
    def pid(self) -> int:
        """The proxy's process id."""
        assert self.proc is not None
        return self.proc.pid

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def accel_loaded(self) -> bool:
        """Whether the C relay scanner ``_relayscan`` is mapped into the process."""
        with contextlib.suppress(OSError):
            return "_relayscan" in Path(f"/proc/{self.pid}/maps").read_text()
        return False

    def scrape(self) -> dict[str, float]:
        """A few counters from ``/metrics`` (to show the metrics listener is on)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        out: dict[str, float] = {}
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(("amqp_proxy_connections_approved_total",
                                    "amqp_proxy_connections_denied_total",
                                    "amqp_proxy_event_log_dropped_total")):
                    name, _, value = line.rpartition(" ")
                    out[name] = float(value)
        return out

    def event_log_bytes(self) -> int:
        """Bytes written to the event log directory so far."""
        return sum(p.stat().st_size for p in self.event_dir.rglob("*") if p.is_file())

    def stop(self) -> None:
        """Stop it (SIGTERM: the proxy drains, then SIGKILL after the timeout)."""
        if self.proc is not None:
            _stop_proc(self.proc, 40.0)
            self.proc = None


def proxy_env(pythonpath: str | None) -> dict[str, str]:
    """The proxy's environment: ours without ``PYTHONPATH``/``PYTHONHOME``, plus
    ``pythonpath`` when given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def proxy_source(proxy_bin: Path, pythonpath: str | None = None) -> dict[str, Any]:
    """Where the proxy's package is imported from, its git commit and whether it is dirty."""
    py = proxy_bin.parent / "python"
    env = proxy_env(pythonpath)
    info: dict[str, Any] = {"bin": str(proxy_bin), "pythonpath": pythonpath}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        pkg = subprocess.run([str(py), "-c", "import amqp_policy_proxy, os; "
                              "print(os.path.dirname(amqp_policy_proxy.__file__))"],
                             env=env, capture_output=True, text=True, timeout=30).stdout.strip()
        info["package"] = pkg
        git = ["git", "-C", pkg]
        info["commit"] = subprocess.run([*git, "rev-parse", "--short", "HEAD"], text=True,
                                        capture_output=True, timeout=10).stdout.strip()
        info["dirty"] = bool(subprocess.run([*git, "status", "--porcelain", "--", "."],
                                            text=True, capture_output=True,
                                            timeout=10).stdout.strip())
    return info


class Stack:
    """Router, HAProxy (``nbthread 1``) and proxy, started and stopped together."""

    def __init__(self, qenv: QdrEnv, proxy_bin: Path, rundir: Path,
                 targets: Iterable[str] = TARGETS, proxy_pythonpath: str | None = None,
                 policy: Path = POLICY_FILE) -> None:
        """Create (not start)."""
        from pinned import BenchHAProxy

        self.targets_wanted = tuple(targets)
        self.router = Router(qenv, rundir)
        self._haproxy_cls = BenchHAProxy
        self.haproxy: Any = None
        self.proxy = (Proxy(proxy_bin, rundir, policy, pythonpath=proxy_pythonpath)
                      if "proxy" in self.targets_wanted else None)

    def start(self) -> Stack:
        """Start everything (router first)."""
        self.router.start()
        if "haproxy" in self.targets_wanted:
            self.haproxy = self._haproxy_cls(("127.0.0.1", self.router.port))
            self.haproxy.start()
        if self.proxy is not None:
            self.proxy.start(self.router.address)
        return self

    def stop(self) -> None:
        """Stop everything (router last)."""
        if self.proxy is not None:
            self.proxy.stop()
        if self.haproxy is not None:
            self.haproxy.stop()
            self.haproxy = None
        self.router.stop()

    def restart(self) -> None:
        """Fresh processes (allocators keep freed memory: idle RSS needs new ones)."""
        self.stop()
        time.sleep(0.3)
        self.start()

    def pids(self) -> dict[str, int]:
        """Every service process: role -> pid."""
        out = {"router": self.router.pid}
        if self.haproxy is not None:
            out["haproxy"] = self.haproxy.pid
        if self.proxy is not None and self.proxy.proc is not None:
            out["proxy"] = self.proxy.pid
        return out

    def address(self, target: str) -> str:
        """Where a client connects for ``target``."""
        if target == "direct":
            return self.router.address
        if target == "haproxy":
            return self.haproxy.address
        assert self.proxy is not None
        return self.proxy.address

    @staticmethod
    def front(target: str) -> str:
        """The process whose RSS and CPU per operation the target is judged by."""
        return {"direct": "router", "haproxy": "haproxy", "proxy": "proxy"}[target]


# --- quiet machine ----------------------------------------------------------------------------


def wait_quiet(stack: Stack, max_wait: float, threshold: float) -> dict[str, Any]:
    """Wait up to ``max_wait`` s until load from outside the run is below ``threshold``
    cores over a 0.5 s window; returns what was seen."""
    t0 = time.monotonic()
    while True:
        s = CpuSampler({**stack.pids(), "harness": os.getpid()}).start()
        time.sleep(0.5)
        s.stop()
        other = s.between()["other"]
        waited = time.monotonic() - t0
        if other < threshold or waited >= max_wait:
            return {"other_before": round(other, 3), "waited_s": round(waited, 1),
                    "quiet": other < threshold}
        time.sleep(1.0)


# --- one sample of each benchmark -------------------------------------------------------------


@dataclass
class Ctx:
    """What a benchmark sample needs."""

    exe: Path
    stack: Stack
    quick: bool = False
    seq: list[int] = field(default_factory=lambda: [0])

    def next_address(self, kind: str) -> str:
        """A fresh address per sample (nothing left over from an earlier one)."""
        self.seq[0] += 1
        return f"bench.{kind}.{os.getpid()}.{self.seq[0]}"

    def sampler(self) -> CpuSampler:
        """A CPU sampler over every service and this harness."""
        return CpuSampler({**self.stack.pids(), "harness": os.getpid()})


def _finish(clients: list[Client], sampler: CpuSampler, timeout: float) -> bool:
    ok = wait_clients(clients, timeout)
    sampler.stop()
    for c in clients:
        c.reap()
    return ok


def bench_throughput(ctx: Ctx, target: str, size: int, count: int) -> dict[str, Any]:
    """One sender and one receiver moving ``count`` unsettled messages of ``size`` bytes."""
    if ctx.quick:
        count //= 4
    addr = ctx.stack.address(target)
    address = ctx.next_address("tput")
    res: dict[str, Any] = {"ok": False, "count": count, "size": size}
    recv = Client(ctx.exe, ["recv", addr, address, str(count), "--credit", "1000",
                            "--vhost", VHOST])
    try:
        recv.read_line("READY", 20)
    except (TimeoutError, RuntimeError) as exc:
        recv.kill()
        wait_clients([recv], 5)
        recv.reap()
        res["error"] = str(exc)
        return res
    sampler = ctx.sampler()
    sampler.add("receiver", recv.pid)
    sampler.start()
    send = Client(ctx.exe, ["send", addr, address, str(count), str(size), "--vhost", VHOST])
    sampler.add("sender", send.pid)
    finished = _finish([recv, send], sampler, 180)
    try:
        s, r = send.result(), recv.result()
    except (RuntimeError, ValueError) as exc:
        res["error"] = str(exc)
        return res
    t0, t1 = s["t_first_send"], r["t_last"]
    elapsed = max(t1 - t0, 1e-9)
    res.update({
        "ok": finished and r["received"] == count and s["accepted"] == count
        and not s["errors"] and not r["errors"],
        "received": r["received"], "elapsed_s": round(elapsed, 4),
        "msgs_per_s": round(r["received"] / elapsed, 1),
        "payload_MB_per_s": round(r["received"] * size / elapsed / 1e6, 2),
        "encoded_size": s["encoded_size"], "cpu": sampler.between(t0, t1),
        "errors": s["errors"] + r["errors"], "first_error": s["first_error"] or r["first_error"],
    })
    return res


def bench_rtt(ctx: Ctx, target: str, count: int = 1000, interval_ms: float = 2.0
              ) -> dict[str, Any]:
    """Request/response round trips, one in flight, one request every ``interval_ms``."""
    if ctx.quick:
        count //= 4
    sampler = ctx.sampler().start()
    c = Client(ctx.exe, ["rr", ctx.stack.address(target), str(count), "100", str(interval_ms),
                         "--vhost", VHOST, "--address-prefix", ctx.next_address("rr")])
    sampler.add("client", c.pid)
    finished = _finish([c], sampler, 120)
    res: dict[str, Any] = {"ok": False, "count": count, "cpu": sampler.between()}
    try:
        r = c.result()
    except (RuntimeError, ValueError) as exc:
        res["error"] = str(exc)
        return res
    res.update({"ok": finished and r["samples"] == count and not r["errors"],
                "rtt_us": r["rtt_us"], "skipped_ticks": r["skipped_ticks"],
                "errors": r["errors"], "first_error": r["first_error"]})
    return res


def bench_connect(ctx: Ctx, target: str, workers: int = 8, seconds: float = 5.0
                  ) -> dict[str, Any]:
    """``workers`` loops of connect + SASL ANONYMOUS + Open + Close for ``seconds``."""
    if ctx.quick:
        seconds = min(seconds, 1.5)
    sampler = ctx.sampler().start()
    c = Client(ctx.exe, ["connect", ctx.stack.address(target), str(workers), str(seconds),
                         "--vhost", VHOST])
    sampler.add("client", c.pid)
    finished = _finish([c], sampler, seconds + 60)
    res: dict[str, Any] = {"ok": False, "workers": workers, "seconds": seconds}
    try:
        r = c.result()
    except (RuntimeError, ValueError) as exc:
        res["error"] = str(exc)
        res["cpu"] = sampler.between()
        return res
    res.update({"ok": finished and r["failed"] == 0, "completed": r["completed"],
                "completed_after_window": r["completed_after_window"],
                "failed": r["failed"], "conn_per_s": r["conn_per_s"], "open_ms": r["open_ms"],
                "cpu": sampler.between(r["t_begin"], r["t_stop"] or None),
                "errors": r["errors"], "first_error": r["first_error"]})
    front = res["cpu"].get(Stack.front(target)) if target != "direct" else None
    if front is not None and r["conn_per_s"]:
        res["front_us_per_conn"] = round(us_per_op(front, r["conn_per_s"]), 1)
    return res


def bench_idle(ctx: Ctx, target: str, connections: int = 2000, hold: float = 3.0
               ) -> dict[str, Any]:
    """RSS growth per held idle connection (SASL + Open), on freshly started services."""
    if ctx.quick:
        connections //= 4
    ctx.stack.restart()
    time.sleep(1.0)
    pids = ctx.stack.pids()
    before = {n: rss_kib(p) for n, p in pids.items()}
    t0 = time.monotonic()
    c = Client(ctx.exe, ["idle", ctx.stack.address(target), str(connections),
                         str(hold + 3.0), "--inflight", "50", "--vhost", VHOST])
    res: dict[str, Any] = {"ok": False, "connections": connections}
    try:
        line = c.read_line("READY", 120)
    except (TimeoutError, RuntimeError) as exc:
        c.kill()
        wait_clients([c], 5)
        c.reap()
        res["error"] = str(exc)
        return res
    open_all = time.monotonic() - t0
    _, opened, failed = line.split()
    time.sleep(1.0)
    held = dict.fromkeys(pids, 0)
    for _ in range(5):
        for n, p in pids.items():
            held[n] = max(held[n], rss_kib(p))
        time.sleep(hold / 5)
    wait_clients([c], 60)
    c.reap()
    n_open = max(int(opened), 1)
    res.update({
        "ok": int(failed) == 0 and int(opened) == connections,
        "opened": int(opened), "failed": int(failed), "open_all_s": round(open_all, 3),
        "rss": {n: {"before_kib": before[n], "held_kib": held[n],
                    "per_conn_kib": round((held[n] - before[n]) / n_open, 3)} for n in pids},
    })
    res["front_kib_per_conn"] = res["rss"][Stack.front(target)]["per_conn_kib"]
    res["front_rest_mib"] = round(res["rss"][Stack.front(target)]["before_kib"] / 1024, 1)
    res["router_kib_per_conn"] = res["rss"]["router"]["per_conn_kib"]
    return res


BENCHES: dict[str, Callable[[Ctx, str], dict[str, Any]]] = {
    "tput-100B": lambda ctx, t: bench_throughput(ctx, t, 100, 200_000),
    "tput-16KiB": lambda ctx, t: bench_throughput(ctx, t, 16384, 20_000),
    "rtt": bench_rtt,
    "connect": bench_connect,
    "idle": bench_idle,
}

# Rows of the headline table: (label, bench, value getter, unit, "higher is better").
METRICS: list[tuple[str, str, Callable[[dict[str, Any]], float], str, bool]] = [
    ("100 B unsettled, msgs/s", "tput-100B", lambda r: r["msgs_per_s"], "msg/s", True),
    ("16 KiB unsettled, msgs/s", "tput-16KiB", lambda r: r["msgs_per_s"], "msg/s", True),
    ("request/response RTT p50, µs", "rtt", lambda r: r["rtt_us"]["p50"], "µs", False),
    ("request/response RTT p99, µs", "rtt", lambda r: r["rtt_us"]["p99"], "µs", False),
    ("connect cycles/s, 8 workers", "connect", lambda r: r["conn_per_s"], "conn/s", True),
    ("connect: to Open p50, ms", "connect", lambda r: r["open_ms"]["p50"], "ms", False),
    ("connect: to Open p99, ms", "connect", lambda r: r["open_ms"]["p99"], "ms", False),
    ("connect: front CPU per connection, µs", "connect", lambda r: r["front_us_per_conn"],
     "µs", False),
    ("RSS at rest, MiB (front process, fresh start)", "idle", lambda r: r["front_rest_mib"],
     "MiB", False),
    ("idle RSS per connection, KiB (front process)", "idle",
     lambda r: r["front_kib_per_conn"], "KiB", False),
    ("idle RSS per connection, KiB (router)", "idle",
     lambda r: r["router_kib_per_conn"], "KiB", False),
]

# Goals of issues 17 and 34, as proxy/HAProxy ratios (None: no goal).
GOALS = {
    "100 B unsettled, msgs/s": (">=", 0.95),
    "16 KiB unsettled, msgs/s": (">=", 1.0),
    "request/response RTT p50, µs": ("<=", 1.10),
    "connect cycles/s, 8 workers": (">=", 0.90),
    "connect: to Open p50, ms": ("<=", 1.2),
    "connect: front CPU per connection, µs": ("<=", 1.5),
}
# Goals on the proxy's own figure, not a ratio (issue 34: memory at rest).
ABSOLUTE_GOALS = {"RSS at rest, MiB (front process, fresh start)": ("<=", 40.0)}

def us_per_op(cores: float, per_second: float) -> float:
    """CPU µs per operation: ``cores`` busy (1.0 = one core) at ``per_second`` operations."""
    return cores / per_second * 1e6


def meets(value: float, goal: tuple[str, float]) -> bool:
    """Whether ``value`` meets ``goal``, an ``(">=" or "<=", bound)`` pair of GOALS."""
    return value >= goal[1] if goal[0] == ">=" else value <= goal[1]


# Operations per second for "CPU µs per operation" (messages, round trips, connections).
RATE = {"tput-100B": lambda r: r.get("msgs_per_s"), "tput-16KiB": lambda r: r.get("msgs_per_s"),
        "connect": lambda r: r.get("conn_per_s"), "rtt": lambda r: 500.0}


# --- summary ----------------------------------------------------------------------------------


def median_minmax(values: list[float]) -> dict[str, Any]:
    """``{"median", "min", "max", "values"}`` of the non-None values."""
    good = [v for v in values if v is not None]
    return {"median": statistics.median(good) if good else None,
            "min": min(good) if good else None, "max": max(good) if good else None,
            "values": values}


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per headline row and target: median, min, max and the per-round values; ratios."""
    rows: dict[str, Any] = {}
    for label, bench, get, unit, _higher in METRICS:
        if bench not in results:
            continue
        row: dict[str, Any] = {"unit": unit, "bench": bench}
        for target, samples in results[bench].items():
            vals = []
            for s in samples:
                try:
                    vals.append(float(get(s)) if s.get("ok") else None)
                except (KeyError, TypeError):
                    vals.append(None)
            row[target] = median_minmax(vals)
        for a, b in (("proxy", "haproxy"), ("haproxy", "direct"), ("proxy", "direct")):
            if a in row and b in row and row[a]["median"] and row[b]["median"]:
                paired = [x / y for x, y in zip(row[a]["values"], row[b]["values"], strict=False)
                          if x is not None and y]
                row[f"{a}/{b}"] = {"ratio": row[a]["median"] / row[b]["median"],
                                   "paired_min": min(paired) if paired else None,
                                   "paired_max": max(paired) if paired else None}
        rows[label] = row
    return rows


CPU_ROLES = ("sender", "receiver", "client", "router", "haproxy", "proxy", "machine", "irq",
             "steal", "other")


def cpu_summary(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per bench and target: median cores per role, max "other", and CPU µs per operation."""
    out: dict[str, Any] = {}
    for bench, per_target in results.items():
        if bench == "idle":
            continue
        out[bench] = {}
        for target, samples in per_target.items():
            roles: dict[str, list[float]] = {}
            per_op: dict[str, list[float]] = {}
            for s in samples:
                cpu = s.get("cpu") or {}
                for role in CPU_ROLES:
                    if role in cpu:
                        roles.setdefault(role, []).append(cpu[role])
                rate = RATE[bench](s) if s.get("ok") else None
                if rate:
                    for role in ("router", Stack.front(target)):
                        if role in cpu:
                            per_op.setdefault(role, []).append(us_per_op(cpu[role], rate))
            out[bench][target] = {
                "cores": {k: round(statistics.median(v), 3) for k, v in roles.items()},
                "other_max": round(max(roles.get("other", [0.0])), 3),
                "us_per_op": {k: round(statistics.median(v), 2) for k, v in per_op.items()},
            }
    return out


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit in ("msg/s", "conn/s") or abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def render_markdown(doc: dict[str, Any]) -> str:
    """The headline table, the CPU table and the run's conditions, as Markdown."""
    rows, cpu, meta = doc["summary"], doc["cpu"], doc["meta"]
    targets = [t for t in TARGETS if t in meta["targets"]]
    lines = [
        f"Run {meta['started']} – {meta['finished']}, proxy at {meta['proxy'].get('commit', '?')}"
        f"{' (dirty)' if meta['proxy'].get('dirty') else ''}, C scanner "
        f"{'loaded' if meta.get('proxy_accel') else 'not loaded'}; {meta['rounds']} rounds, "
        f"targets alternating; load average {meta['loadavg_start']} at the start, "
        f"{meta['loadavg_end']} at the end. Medians (min–max):",
        "",
        "| benchmark | " + " | ".join(targets) + " | proxy / HAProxy (per-round range) | goal |",
        "|---|" + "---:|" * len(targets) + "---:|---|",
    ]
    for label, row in rows.items():
        cells = []
        for t in targets:
            c = row.get(t)
            if not c or c["median"] is None:
                cells.append("-")
                continue
            cells.append(f"{_fmt(c['median'], row['unit'])} ({_fmt(c['min'], row['unit'])}–"
                         f"{_fmt(c['max'], row['unit'])})")
        r = row.get("proxy/haproxy")
        ratio = (f"**{r['ratio']:.2f}** ({r['paired_min']:.2f}–{r['paired_max']:.2f})"
                 if r and r["paired_min"] is not None else "-")
        goal = GOALS.get(label)
        goal_s = "-"
        if goal and r:
            goal_s = f"{goal[0]} {goal[1]:.2f}: {'met' if meets(r['ratio'], goal) else 'missed'}"
        absolute, mine = ABSOLUTE_GOALS.get(label), row.get("proxy")
        if absolute and mine and mine["median"] is not None:
            goal_s = (f"proxy {absolute[0]} {_fmt(absolute[1])} {row['unit']}: "
                      f"{'met' if meets(mine['median'], absolute) else 'missed'}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} | {goal_s} |")
    lines += [
        "",
        "CPU over the measured windows, cores (1.0 = one core busy; the machine has "
        f"{meta['nproc']}), medians over rounds. *irq + softirq*: kernel interrupt work not "
        "charged to any process (mostly the run's own loopback TCP); *machine*: every busy "
        "core (tasks + irq); *other*: the machine's task time minus every process of the run "
        "(router, HAProxy, proxy, clients, this harness), i.e. load from outside the run, with "
        "its largest value over the rounds; *steal*: CPU the hypervisor gave to other guests; "
        "µs/op: CPU µs per message, round trip or connection (round trips: 500 per second):",
        "",
        "| benchmark | target | clients | router | HAProxy / proxy | irq + softirq | machine "
        "| other (max) | steal | router µs/op | front µs/op |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for bench, per_t in cpu.items():
        for t in targets:
            if t not in per_t:
                continue
            c = per_t[t]["cores"]
            clients = sum(c.get(k, 0.0) for k in ("sender", "receiver", "client"))
            front = Stack.front(t)
            front_cores = c.get(front) if t != "direct" else None
            uo = per_t[t]["us_per_op"]
            lines.append(
                f"| {bench} | {t} | {clients:.2f} | {c.get('router', 0.0):.2f} | "
                f"{'-' if front_cores is None else f'{front_cores:.2f}'} | "
                f"{c.get('irq', 0.0):.2f} | {c.get('machine', 0.0):.2f} | "
                f"{c.get('other', 0.0):.2f} ({per_t[t]['other_max']:.2f}) | "
                f"{c.get('steal', 0.0):.2f} | {_fmt(uo.get('router'))} | "
                f"{'-' if t == 'direct' else _fmt(uo.get(front))} |")
    disturbed = doc.get("disturbed") or []
    per_bench: dict[str, int] = {}
    for d in disturbed:
        per_bench[d.split()[0]] = per_bench.get(d.split()[0], 0) + 1
    n_per_bench = meta["rounds"] * len(targets)
    lines += ["", f"Samples with other load above {meta['disturbed_threshold']} cores "
              "(disturbed): " + (", ".join(f"{b} {n} of {n_per_bench}"
                                           for b, n in per_bench.items())
                                 if disturbed else "none") + "."]
    return "\n".join(lines) + "\n"


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, kernel, Python, HAProxy and qdrouterd versions."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    haproxy = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        haproxy = subprocess.run(["haproxy", "-v"], capture_output=True, text=True,
                                 timeout=5).stdout.splitlines()[0]
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "haproxy": haproxy}


# --- profiling --------------------------------------------------------------------------------


def profile_proxy(ctx: Ctx, bench: str, out_dir: Path, seconds: float = 6.0) -> dict[str, Any]:
    """py-spy (``--native``) of the proxy during one extra, unmeasured sample of ``bench``;
    returns the top functions by own time and the share per source area."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(pyspy, os.X_OK):
        return {"error": "py-spy not installed (pip install py-spy)"}
    assert ctx.stack.proxy is not None
    raw = out_dir / f"pyspy-{bench}.txt"
    # --native (uvloop's and libc's frames too) needs py-spy's default blocking mode: it
    # stops the proxy 200 times a second, so this sample is slower and is not measured.
    with open(out_dir / f"pyspy-{bench}.log", "wb") as log:
        prof = subprocess.Popen([pyspy, "record", "--pid", str(ctx.stack.proxy.pid),
                                 "--native", "--rate", "200", "--duration", str(int(seconds)),
                                 "--format", "raw", "--output", str(raw)],
                                stdout=log, stderr=subprocess.STDOUT)
    _LIVE.add(prof)
    time.sleep(0.5)
    t_end = time.monotonic() + seconds - 0.5
    while time.monotonic() < t_end:
        if bench == "connect":
            BENCHES[bench](ctx, "proxy")
        else:
            bench_throughput(ctx, "proxy", 100 if bench == "tput-100B" else 16384,
                             200_000 if bench == "tput-100B" else 20_000)
    prof.wait(60)
    _LIVE.discard(prof)
    return summarize_collapsed(raw)


def syscall_counts(ctx: Ctx, bench: str, target: str, out_dir: Path) -> dict[str, Any]:
    """System calls per message or per connection of the front process (HAProxy or the
    proxy) during one extra, unmeasured sample of ``bench`` (``perf stat`` on the
    ``syscalls:sys_enter_*`` tracepoints of that process; a few % slower, counts exact)."""
    perf = shutil.which("perf")
    if perf is None:
        return {"error": "perf not installed"}
    pid = ctx.stack.pids()[Stack.front(target)]
    out = out_dir / f"perf-syscalls-{bench}-{target}.csv"
    proc = subprocess.Popen([perf, "stat", "-x,", "-e", "syscalls:sys_enter_*", "-p", str(pid),
                             "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _LIVE.add(proc)
    time.sleep(1.0)
    r = BENCHES[bench](ctx, target)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    _LIVE.discard(proc)
    ops = (r.get("received") if bench.startswith("tput") else
           (r.get("completed") or 0) + (r.get("completed_after_window") or 0))
    if not r.get("ok") or not ops or not out.exists():
        return {"error": f"sample failed or no perf output: {r.get('error') or r.get('ok')}"}
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].isdigit() and int(parts[0]) > 0:
            counts[parts[2].removeprefix("syscalls:sys_enter_")] = int(parts[0])
    per_op = {k: round(v / ops, 2) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    return {"ops": ops, "total_per_op": round(sum(counts.values()) / ops, 2), "per_op": per_op}


def perf_profile(ctx: Ctx, bench: str, out_dir: Path) -> dict[str, Any]:
    """On-CPU profile of the proxy during one extra, unmeasured sample of ``bench``:
    ``perf record`` (cpu-clock, 999 Hz, only while the proxy runs), then the share of
    samples per shared object (kernel, libpython, uvloop, ...) and the top symbols.

    py-spy samples at wall-clock rate, so a thread descheduled inside a system call (on
    loopback a write wakes the reader, which may then preempt the writer) shows as that
    call; perf counts only CPU time, the figure that matters on a shared 2-core machine."""
    perf = shutil.which("perf")
    if perf is None:
        return {"error": "perf not installed"}
    assert ctx.stack.proxy is not None
    data = out_dir / f"perf-{bench}.data"
    proc = subprocess.Popen([perf, "record", "-e", "cpu-clock", "-F", "999", "-p",
                             str(ctx.stack.proxy.pid), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _LIVE.add(proc)
    time.sleep(1.0)
    r = BENCHES[bench](ctx, "proxy")
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    _LIVE.discard(proc)
    if not data.exists():
        return {"error": f"no perf data ({r.get('error') or 'perf failed'})"}

    def report(sort: str, n: int) -> list[tuple[str, float]]:
        out = subprocess.run([perf, "report", "-i", str(data), "--stdio", "--sort", sort,
                              "--percent-limit", "0.5"], capture_output=True, text=True,
                             timeout=120).stdout
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith("%") and not line.startswith("#"):
                rows.append((" ".join(parts[1:]), float(parts[0].rstrip("%"))))
        return rows[:n]

    return {"by_dso": report("dso", 8), "top_symbols": report("dso,sym", 15)}


# Frames that mean "this thread is waiting, not running": the event loop's epoll, the metrics
# server's poll, lock and condition waits of the event-log writer and the thread pool, sleeps.
# py-spy samples every thread at wall-clock rate; these samples are not CPU and are dropped.
IDLE_FRAMES = ("epoll_pwait", "epoll_wait", "select_poll_poll_impl", "PyThread_acquire_lock_timed",
               "pthread_cond_timedwait", "pthread_cond_wait", "clock_nanosleep", "time_sleep",
               "select (libc")
SYSCALLS = ("write", "writev", "read", "readv", "send", "sendmsg", "sendto", "recv", "recvmsg",
            "recvfrom", "connect", "accept", "accept4", "close", "shutdown", "getsockname",
            "getpeername", "setsockopt", "getsockopt", "socket", "epoll_ctl", "ioctl", "fcntl")


def _area(frame: str) -> str:
    """A frame of py-spy's collapsed output -> the area of the code it belongs to."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for key, area in (("amqp_policy_proxy/core/", "core (sans-IO state machine)"),
                      ("amqp_policy_proxy/amqp/", "amqp (codec, handshake, framing)"),
                      ("amqp_policy_proxy/daemon/", "daemon shell (relay, app)"),
                      ("amqp_policy_proxy/metrics/", "metrics"),
                      ("amqp_policy_proxy/eventlog/", "event log"),
                      ("amqp_policy_proxy/policy/", "policy / ingress / limits"),
                      ("amqp_policy_proxy/ingress/", "policy / ingress / limits"),
                      ("amqp_policy_proxy/limits/", "policy / ingress / limits"),
                      ("prometheus_client", "metrics"),
                      ("uvloop", "uvloop / asyncio"), ("loop.c", "uvloop / asyncio"),
                      ("asyncio/", "uvloop / asyncio"), ("proton", "proton codec")):
        if key in where or key in name:
            return area
    return "other"


def summarize_collapsed(path: Path, top: int = 15) -> dict[str, Any]:
    """Where the proxy's CPU goes, from a py-spy ``raw`` (collapsed stacks) file.

    Samples of waiting threads (:data:`IDLE_FRAMES`) are dropped; the rest are "busy".
    ``by_area``: each busy sample goes to "system calls" when its innermost frame is a
    system call wrapper (:data:`SYSCALLS`; on loopback a send also runs the receiver's TCP
    input), else to the innermost frame of ours or of a library we know; ``own_top``: the
    innermost frames; ``by_function``: the innermost project function on the stack.
    """
    own: dict[str, int] = {}
    area_incl: dict[str, int] = {}
    func_incl: dict[str, int] = {}
    total = idle = 0
    if not path.exists():
        return {"error": f"no profile written ({path}; see pyspy-*.log next to it)"}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not count_s.isdigit():
            continue
        count = int(count_s)
        if any(marker in stack for marker in IDLE_FRAMES):
            idle += count
            continue
        frames = stack.split(";")
        total += count
        leaf = frames[-1]
        own[leaf] = own.get(leaf, 0) + count
        area = "other"
        if leaf.partition(" (")[0] in SYSCALLS:
            area = "system calls"
        else:
            for frame in reversed(frames):
                area = _area(frame)
                if area != "other":
                    break
        area_incl[area] = area_incl.get(area, 0) + count
        for frame in reversed(frames):
            if "amqp_policy_proxy/" in frame:
                fn = frame.split(" (")[0] + " (" + frame.split("amqp_policy_proxy/")[1]
                fn = fn.rsplit(":", 1)[0] + ")"
                func_incl[fn] = func_incl.get(fn, 0) + count
                break

    def pct(d: dict[str, int], n: int | None = None) -> list[tuple[str, float]]:
        items = sorted(d.items(), key=lambda kv: -kv[1])
        return [(k, round(100.0 * c / total, 1)) for k, c in items[:n]] if total else []

    return {"samples": total, "idle_samples": idle, "own_top": pct(own, top),
            "by_area": dict(pct(area_incl)), "by_function": pct(func_incl, top),
            "raw": str(path)}


# --- main -------------------------------------------------------------------------------------


def check_tools() -> None:
    """Unavailable unless HAProxy is installed."""
    if shutil.which("haproxy") is None:
        raise Unavailable("haproxy not installed (scripts/install-system-deps.sh)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--benches", default=",".join(BENCHES),
                    help=f"comma list from {', '.join(BENCHES)}")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--quick", action="store_true", help="a quarter of the counts")
    ap.add_argument("--proxy-bin", type=Path,
                    default=Path(sys.executable).parent / "amqp-policy-proxy",
                    help="the amqp-policy-proxy to measure (default: next to this Python)")
    ap.add_argument("--proxy-pythonpath", default=None,
                    help="PYTHONPATH for the proxy only, e.g. CHECKOUT/src to measure a clean "
                         "checkout with this venv; the proxy then runs as `python -m "
                         "amqp_policy_proxy run ...` (default: none, the venv's own install "
                         "through its amqp-policy-proxy script)")
    ap.add_argument("--policy", type=Path, default=POLICY_FILE,
                    help="the proxy's policy (default bench/policies/realrouter.json: the "
                         "router's permissive vhost, allowUserIdProxy left at QDR's false)")
    ap.add_argument("--qdr-env", type=Path, default=DEFAULT_QDR_ENV,
                    help="shell file with QDR_HOME etc., read when QDR_HOME is not set")
    ap.add_argument("--quiet-wait", type=float, default=15.0,
                    help="seconds to wait before a sample for other load to drop")
    ap.add_argument("--quiet-threshold", type=float, default=0.25,
                    help="cores of other load counted as quiet / flagged as disturbed")
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, py-spy the proxy during tput-100B and connect")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR,
                    help="directory for realrouter-*.md/json")
    ap.add_argument("--label", default="", help="a note stored with the results")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the headline benchmark; see the module docstring."""
    a = parse_args(argv)
    try:
        check_tools()
        qenv = find_qdr(a.qdr_env)
        targets = [t for t in a.targets.split(",") if t]
        if "proxy" in targets and not os.access(a.proxy_bin, os.X_OK):
            raise Unavailable(f"no amqp-policy-proxy at {a.proxy_bin} (--proxy-bin)")
        exe = loadgen_binary(qenv)
    except Unavailable as exc:
        print(f"realrouter: cannot run: {exc.message}", file=sys.stderr)
        return 2
    benches = [b for b in a.benches.split(",") if b]
    for b in benches:
        if b not in BENCHES:
            print(f"realrouter: unknown benchmark {b!r}", file=sys.stderr)
            return 2
    raise_nofile()
    rundir = Path(tempfile.mkdtemp(prefix="realrouter-"))
    print(f"run directory (configs, logs, event log): {rundir}", flush=True)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stack = Stack(qenv, a.proxy_bin, rundir, targets, a.proxy_pythonpath, a.policy)
    ctx = Ctx(exe=exe, stack=stack, quick=a.quick)
    meta: dict[str, Any] = {
        **machine_info(), "started": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "loadavg_start": loadavg(), "rounds": a.rounds, "targets": targets, "quick": a.quick,
        "proxy": proxy_source(a.proxy_bin, a.proxy_pythonpath) if "proxy" in targets else {},
        "qdrouterd": str(qenv.qdrouterd), "loadgen": str(exe), "label": a.label,
        "policy": str(a.policy),
        "disturbed_threshold": a.quiet_threshold, "argv": sys.argv,
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    disturbed: list[str] = []
    profiles: dict[str, Any] = {}
    interrupted = False
    try:
        stack.start()
        if stack.proxy is not None:
            meta["proxy_argv"] = stack.proxy.argv
            meta["proxy_accel"] = stack.proxy.accel_loaded()
        for bench in benches:
            results[bench] = {}
            for rnd in range(a.rounds):
                order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
                for target in order:
                    quiet = wait_quiet(stack, a.quiet_wait, a.quiet_threshold)
                    r = BENCHES[bench](ctx, target)
                    r.update({"round": rnd + 1, "target": target, **quiet,
                              "loadavg": loadavg()})
                    results[bench].setdefault(target, []).append(r)
                    other = (r.get("cpu") or {}).get("other", quiet["other_before"])
                    if other > a.quiet_threshold:
                        disturbed.append(f"{bench} round {rnd + 1} {target} ({other:.2f})")
                    brief = {k: r[k] for k in ("msgs_per_s", "conn_per_s", "front_kib_per_conn",
                                               "error", "first_error") if r.get(k)}
                    if "rtt_us" in r:
                        brief["rtt_p50_us"] = r["rtt_us"]["p50"]
                    if "open_ms" in r:
                        brief["open_p50_ms"] = r["open_ms"]["p50"]
                    print(f"{bench:<11} round {rnd + 1} {target:<8} ok={r.get('ok')} "
                          f"other={other:.2f} {json.dumps(brief)}", flush=True)
            if bench != "idle" and stack.proxy is not None and stack.proxy.proc is not None:
                # the metrics listener and the event log were on (idle restarts the proxy)
                meta["proxy_metrics"] = stack.proxy.scrape()
                meta["proxy_event_log_bytes"] = stack.proxy.event_log_bytes()
        if a.profile and stack.proxy is not None:
            for bench in ("tput-100B", "connect"):
                profiles[bench] = profile_proxy(ctx, bench, rundir)
                print(f"profile {bench}: {json.dumps(profiles[bench].get('by_area'))}",
                      flush=True)
            for bench in ("tput-100B", "connect"):
                profiles.setdefault("perf", {})[bench] = perf_profile(ctx, bench, rundir)
                print(f"perf {bench}: {profiles['perf'][bench].get('by_dso')}", flush=True)
            for bench in ("tput-100B", "connect"):
                for target in ("haproxy", "proxy"):
                    if target in targets:
                        sc = syscall_counts(ctx, bench, target, rundir)
                        profiles.setdefault("syscalls", {})[f"{bench} {target}"] = sc
                        print(f"syscalls {bench} {target}: {sc.get('total_per_op')} per op",
                              flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: stopping services", file=sys.stderr)
    finally:
        stack.stop()
        stop_all()
    meta["finished"] = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    meta["loadavg_end"] = loadavg()
    meta["interrupted"] = interrupted
    doc = {"meta": meta, "summary": summarize(results), "cpu": cpu_summary(results),
           "disturbed": disturbed, "profiles": profiles, "samples": results}
    md = render_markdown(doc)
    if profiles:
        md += render_profiles(profiles)
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for name in (f"realrouter-{stamp}", "realrouter-latest"):
        (a.out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
        (a.out / f"{name}.md").write_text(md)
    print()
    print(md)
    print(f"written: {a.out / f'realrouter-{stamp}.md'} and .json", flush=True)
    return 1 if interrupted else 0


def render_profiles(profiles: dict[str, Any]) -> str:
    """The py-spy summaries as Markdown."""
    lines = ["", "py-spy of the proxy (`--native`, 200 Hz, one extra unmeasured sample; samples "
             "of waiting threads dropped; shares of the busy samples):", ""]
    for bench, p in profiles.items():
        if bench in ("syscalls", "perf"):
            continue
        if "error" in p:
            lines.append(f"- {bench}: {p['error']}")
            continue
        areas = ", ".join(f"{a} {v:.0f} %" for a, v in p["by_area"].items())
        lines.append(f"- **{bench}** ({p['samples']} busy samples, {p['idle_samples']} "
                     f"waiting), by area: {areas}")
        lines.append("  - innermost frames: " + ", ".join(
            f"`{f}` {v:.1f} %" for f, v in p["own_top"][:8]))
        lines.append("  - innermost function of ours: " + ", ".join(
            f"`{f}` {v:.1f} %" for f, v in p["by_function"][:8]))
    for bench, p in (profiles.get("perf") or {}).items():
        if "error" in p:
            lines.append(f"- perf {bench}: {p['error']}")
            continue
        lines.append(f"- **{bench}**, on-CPU (`perf record -e cpu-clock`), by shared object: "
                     + ", ".join(f"{d} {v:.0f} %" for d, v in p["by_dso"]))
        lines.append("  - top symbols: " + ", ".join(f"`{d}` {v:.1f} %"
                                                      for d, v in p["top_symbols"][:10]))
    sc = profiles.get("syscalls")
    if sc:
        lines += ["", "System calls of the front process per message (tput-100B) or per "
                  "connection (connect), one extra sample each (`perf stat` on the "
                  "`syscalls:sys_enter_*` tracepoints):", "",
                  "| sample | total | largest |", "|---|---:|---|"]
        for name, c in sc.items():
            if "error" in c:
                lines.append(f"| {name} | - | {c['error']} |")
                continue
            top = ", ".join(f"{k} {v:g}" for k, v in list(c["per_op"].items())[:8])
            lines.append(f"| {name} | {c['total_per_op']:g} | {top} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        stop_all()
