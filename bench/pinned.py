"""The machinery of the pinned bench (``bench/run_all.py``) shared by its benchmarks.

Bench tooling, not part of the package: the bench peer, HAProxy and the proxy as processes
(``Stack``), CPU pinning, RSS, waiting for a quiet machine, alternating targets round by
round, medians and the tables. ``run_all.py`` is the command; ``bench_throughput``,
``bench_latency``, ``bench_connrate``, ``bench_memory`` and ``bench_limits`` are its
benchmarks, each importing this module (never ``run_all``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for _p in (str(BENCH_DIR), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from tests.support.haproxy import HAProxy  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

POLICY_DIR = BENCH_DIR / "policies"
RESULTS_DIR = BENCH_DIR / "results"
PROXY_BIN = Path(sys.executable).parent / "amqp-policy-proxy"
TARGETS = ("direct", "haproxy", "proxy")

_CHILDREN: list[subprocess.Popen[Any]] = []


def _kill_children() -> None:
    for proc in _CHILDREN:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
    for proc in _CHILDREN:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


atexit.register(_kill_children)


def pin_process(pid: int, cpus: set[int] | None) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (no-op when None)."""
    if not cpus:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (from ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def wait_listening(host: str, port: int, proc: subprocess.Popen[Any], timeout: float = 20.0,
                   log: Path | None = None) -> None:
    """Wait until ``host:port`` accepts a TCP connection (fail if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode}: {text}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{host}:{port} not listening after {timeout}s")


class BenchHAProxy(HAProxy):
    """The test-support HAProxy with ``nbthread 1``: one thread, like the proxy's one loop."""

    def config_text(self) -> str:
        """The support configuration plus ``nbthread 1`` in ``global``."""
        return super().config_text().replace("global\n", "global\n    nbthread 1\n", 1)

    @property
    def pid(self) -> int:
        """The HAProxy process id."""
        assert self._proc is not None
        return self._proc.pid


class Peer:
    """The bench peer as a child process."""

    def __init__(self, cpus: set[int] | None, credit: int = 4000) -> None:
        """Start it; it stops when this process exits (its stdin closes)."""
        cmd = [sys.executable, str(BENCH_DIR / "peer.py"), "--port", "0", "--credit",
               str(credit), "--exit-on-stdin-eof"]
        if cpus:
            cmd += ["--cpus", ",".join(map(str, sorted(cpus)))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        _CHILDREN.append(self.proc)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "listening":
            raise RuntimeError(f"peer did not start: {line}")
        host, _, port = line[1].rpartition(":")
        self.host, self.port = host, int(port)
        self.pid = self.proc.pid

    @property
    def address(self) -> str:
        """``HOST:PORT``."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Terminate it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Proxy:
    """``amqp-policy-proxy run`` as a child process, pinned to ``cpus``."""

    def __init__(self, upstream: str, policy: Path, cpus: set[int] | None,
                 log_dir: Path) -> None:
        """Start it on a free port and wait until it listens."""
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"proxy-{policy.stem}-{self.port}.log"
        cmd = [str(PROXY_BIN), "run", "--listen", f"{self.host}:{self.port}",
               "--upstream", upstream, "--policy", str(policy), "--default-vhost", "$default"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        _CHILDREN.append(self.proc)
        self.pid = self.proc.pid
        wait_listening(self.host, self.port, self.proc, log=self.log)

    @property
    def address(self) -> str:
        """``HOST:PORT``."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Stack:
    """Peer, HAProxy and one or more proxies (one per policy), with the CPU layout.

    Args:
        pin: target on ``target_cpus``, load generator and peer on ``load_cpus``.
        policies: name -> policy file; one proxy process each (``proxy`` by default).
        haproxy: start HAProxy too.
    """

    def __init__(self, *, pin: bool = True, policies: dict[str, Path] | None = None,
                 haproxy: bool = True, load_cpus: str = "0", target_cpus: str = "1") -> None:
        """Create (not start) the stack."""
        ncpu = os.cpu_count() or 1
        self.pin = pin and ncpu > 1
        self.load_cpus = {int(c) for c in load_cpus.split(",")} if self.pin else None
        self.target_cpus = {int(c) for c in target_cpus.split(",")} if self.pin else None
        self.policies = policies if policies is not None else {
            "proxy": POLICY_DIR / "allow-all.json"}
        self.with_haproxy = haproxy
        self.peer: Peer | None = None
        self.haproxy: BenchHAProxy | None = None
        self.proxies: dict[str, Proxy] = {}

    def start(self) -> Stack:
        """Start every process; return self."""
        self.peer = Peer(self.load_cpus)
        if self.with_haproxy:
            self.haproxy = BenchHAProxy((self.peer.host, self.peer.port))
            self.haproxy.start()
            pin_process(self.haproxy.pid, self.target_cpus)
        for name, policy in self.policies.items():
            self.proxies[name] = Proxy(self.peer.address, policy, self.target_cpus,
                                       RESULTS_DIR / "logs")
        return self

    def stop(self) -> None:
        """Stop every process."""
        for proxy in self.proxies.values():
            proxy.stop()
        if self.haproxy is not None:
            self.haproxy.stop()
        if self.peer is not None:
            self.peer.stop()

    def __enter__(self) -> Stack:
        """Start."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop."""
        self.stop()

    @property
    def loadgen_cpus(self) -> str | None:
        """The ``--cpus`` argument for load generators."""
        return ",".join(map(str, sorted(self.load_cpus))) if self.load_cpus else None

    def targets(self) -> dict[str, tuple[str, dict[str, int]]]:
        """Target name -> (address, pids to watch)."""
        assert self.peer is not None
        out = {"direct": (self.peer.address, {"peer": self.peer.pid})}
        if self.haproxy is not None:
            out["haproxy"] = (self.haproxy.address,
                              {"peer": self.peer.pid, "target": self.haproxy.pid})
        for name, proxy in self.proxies.items():
            out[name] = (proxy.address, {"peer": self.peer.pid, "target": proxy.pid})
        return out


# --- results ----------------------------------------------------------------------------------


def add_cpu_per_op(result: dict[str, Any]) -> None:
    """Add ``target_us_per_op``/``peer_us_per_op``: CPU microseconds per message (or per
    connection) spent in the target process / the peer; unlike rates, these do not depend on
    how much CPU time other processes took from them."""
    rate = result.get("msgs_per_s") or result.get("conns_per_s")
    cpu = result.get("cpu") or {}
    for label in ("target", "peer"):
        value = cpu.get(label)
        if rate and value is not None:
            result[f"{label}_us_per_op"] = value / rate * 1e6


def summarize(samples: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any]:
    """Medians of ``key`` and of the CPU figures per target, over the rounds."""
    out: dict[str, Any] = {}
    for target, rows in samples.items():
        values = [r[key] for r in rows if r.get(key) is not None]
        cpu: dict[str, Any] = {}
        for label in ("loadgen", "peer", "target", "other", "machine"):
            vals = []
            for r in rows:
                v = (r.get("cpu") or {}).get(label)
                if isinstance(v, list):
                    v = max((x for x in v if x is not None), default=None)
                if v is not None:
                    vals.append(v)
            if vals:
                cpu[label] = round(statistics.median(vals), 3)
        out[target] = {"median": statistics.median(values) if values else None,
                       "values": values, "cpu": cpu}
    return out


def ratio(summary: dict[str, Any], a: str = "proxy", b: str = "haproxy") -> float | None:
    """``median(a) / median(b)``."""
    x, y = summary.get(a, {}).get("median"), summary.get(b, {}).get("median")
    if x is None or not y:
        return None
    return x / y


def machine_info() -> dict[str, Any]:
    """nproc, CPU model, kernel, Python, HAProxy version, load average."""
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    haproxy = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        haproxy = subprocess.run(["haproxy", "-v"], capture_output=True, text=True,
                                 timeout=5).stdout.splitlines()[0]
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "haproxy": haproxy,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def fmt(value: float | None, unit: str) -> str:
    """Human formatting of one figure."""
    if value is None:
        return "-"
    if unit in ("msg/s", "conn/s"):
        return f"{value:,.0f}"
    if unit == "µs":
        return f"{value:,.0f}"
    if unit == "KiB":
        return f"{value:,.1f}"
    return f"{value:.3g}"


def render_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the benchmark rows (median per target, proxy/haproxy ratio, goal)."""
    lines = [
        "| benchmark | unit | direct | haproxy | proxy | proxy/haproxy | goal |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        s = row["summary"]
        r = ratio(s)
        lines.append(
            f"| {row['name']} | {row['unit']}"
            f" | {fmt(s.get('direct', {}).get('median'), row['unit'])}"
            f" | {fmt(s.get('haproxy', {}).get('median'), row['unit'])}"
            f" | {fmt(s.get('proxy', {}).get('median'), row['unit'])}"
            f" | {'-' if r is None else f'{r:.2f}x'} | {row.get('goal', '')} |"
        )
    return "\n".join(lines)


def render_cost_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of CPU microseconds per message/connection in HAProxy vs the proxy."""
    lines = [
        "| benchmark | peer (direct) | haproxy | proxy | proxy/haproxy |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        samples = row.get("samples")
        if not samples or row["unit"] not in ("msg/s", "conn/s"):
            continue
        t = summarize(samples, "target_us_per_op")
        p = summarize(samples, "peer_us_per_op")
        row["cpu_per_op"] = {"target_us": t, "peer_us": p}
        h, x = t.get("haproxy", {}).get("median"), t.get("proxy", {}).get("median")
        d = p.get("direct", {}).get("median")
        lines.append(
            f"| {row['name']} | {'-' if d is None else f'{d:.2f}'}"
            f" | {'-' if h is None else f'{h:.2f}'} | {'-' if x is None else f'{x:.2f}'}"
            f" | {'-' if not h or x is None else f'{x / h:.1f}x'} |"
        )
    return "\n".join(lines)


def render_cpu_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of median CPU (cores) of loadgen / peer / target / other per sample."""
    lines = [
        "| benchmark | target | loadgen | peer | target proc | other (not ours) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        for target, s in row["summary"].items():
            cpu = s.get("cpu", {})
            lines.append(
                f"| {row['name']} | {target} | {cpu.get('loadgen', '-')} | {cpu.get('peer', '-')}"
                f" | {cpu.get('target', '-')} | {cpu.get('other', '-')} |"
            )
    return "\n".join(lines)


#: Before each sample, wait (at most QUIET_MAX_WAIT s) until the rest of the machine uses less
#: than QUIET_THRESHOLD cores (the machine may be shared with other work). Set by ``main``.
QUIET_THRESHOLD = 0.5
QUIET_MAX_WAIT = 20.0


def wait_quiet(threshold: float | None = None, max_wait: float | None = None) -> dict[str, float]:
    """Wait until the machine's busy cores (over 0.5 s) drop below ``threshold``.

    Our own processes are idle between samples, so what is busy then is someone else's.

    Returns:
        ``{"waited_s": ..., "busy_cores": ...}`` (the last reading).
    """
    from loadgen import system_busy_seconds

    threshold = QUIET_THRESHOLD if threshold is None else threshold
    max_wait = QUIET_MAX_WAIT if max_wait is None else max_wait
    start = time.monotonic()
    while True:
        b0, t0 = system_busy_seconds(), time.monotonic()
        time.sleep(0.5)
        busy = (system_busy_seconds() - b0) / (time.monotonic() - t0)
        waited = time.monotonic() - start
        if busy < threshold or waited >= max_wait:
            return {"waited_s": round(waited, 1), "busy_cores": round(busy, 2)}


def bottleneck_warnings(rows: list[dict[str, Any]], pinned: bool) -> list[str]:
    """Samples where the load generator (or, pinned, its shared core) may be the bottleneck."""
    out = []
    for row in rows:
        for target, s in row["summary"].items():
            cpu = s.get("cpu", {})
            lg, peer = cpu.get("loadgen"), cpu.get("peer")
            if lg is not None and lg > 0.9:
                out.append(f"{row['name']} / {target}: load generator at {lg:.2f} cores")
            elif pinned and lg is not None and peer is not None and lg + peer > 0.9:
                out.append(f"{row['name']} / {target}: loadgen + peer share CPU 0 and use"
                           f" {lg + peer:.2f} of it: the tooling core may be the bottleneck")
    return out


def alternate(rounds: int, targets: dict[str, Any], run_one: Any,
              label: str = "") -> dict[str, list[dict[str, Any]]]:
    """Run ``run_one(name, address, watch)`` for ``rounds`` rounds over ``targets`` in order.

    Each sample waits for a quiet machine first (:func:`wait_quiet`); the reading is kept in
    the sample as ``quiet``.
    """
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for r in range(rounds):
        for name, (address, watch) in targets.items():
            quiet = wait_quiet()
            result = run_one(name, address, watch)
            result["quiet"] = quiet
            add_cpu_per_op(result)
            samples[name].append(result)
            brief = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()
                     if k in ("msgs_per_s", "conns_per_s", "p50_us", "p99_us", "per_conn_kib",
                              "errors")}
            print(f"  {label} round {r + 1}/{rounds} {name:8s} {brief} cpu={result.get('cpu')}"
                  f" quiet={quiet}", flush=True)
    return samples
