"""Connection floods against the real daemon (``amqp-policy-proxy run`` in a subprocess).

10,000 concurrent AMQP connections (header + Open, then idle) are held through the proxy to a
raw upstream, the proxy's resident memory per idle connection is measured, the global
``maxConnections`` refuses the excess at accept without writing a byte or opening an upstream
connection, and after everything closes every count is back to zero: the gauges read 0 and
the full 10,000 can be opened again.

The daemon runs in its own process so that its RSS is its own; the raw upstream runs in
another (``python -m tests.support.rawpeer``) and the asyncio clients in the test process,
because each proxied connection costs the daemon two file descriptors and every process is
bound by RLIMIT_NOFILE. The test raises the soft limit to the hard one (and the hard one when
it may: root with CAP_SYS_RESOURCE). Where the hard limit is below what 10,000 connections
need (this sandbox: 20,000 and no CAP_SYS_RESOURCE, so the daemon can hold at most ~9,990),
the 10,000 are held by as few daemon instances as fit (two here, 5,000 each, as an operator
would run two instances behind a load balancer or one per core), each with its own global
``maxConnections``; the figures say how many instances held them.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port
from tests.support.rawpeer import AsyncClient, open_async_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = 10_000
EXCESS = 200
WARMUP = 300
CONCURRENCY = 400
#: goal from the issue: HAProxy needs about 3.4 KiB per idle connection; we aim under 8 KiB
MEMORY_GOAL = 8 * 1024
#: what this test enforces (a regression guard with headroom over the measured figure)
MEMORY_LIMIT = 16 * 1024

POLICY = [["vhost", {
    "hostname": "test",
    "maxConnections": TARGET,
    "groups": {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*"}},
}]]


def raise_nofile(want: int) -> int:
    """Raise the open-file limits towards ``want``; return the soft limit now in force.

    The hard limit can be raised only with CAP_SYS_RESOURCE; without it the soft limit is
    raised to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def limit_info() -> int:
    """The soft RLIMIT_NOFILE in force (inherited by the daemon)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of the proxy's /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def active(port: int) -> float:
    """``amqp_proxy_connections_active`` summed over every (vhost, group)."""
    return sum(v for (n, _), v in scrape(port).items() if n == "amqp_proxy_connections_active")


def wait_until(pred, timeout: float = 30.0, interval: float = 0.1) -> bool:  # noqa: ANN001
    """Poll ``pred()`` until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


class UpstreamProcess:
    """``python -m tests.support.rawpeer`` in a subprocess, queried over its stdin/stdout."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.rawpeer"], cwd=root, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("listening "), line
        self.port = int(line.split()[1])

    def stats(self) -> dict[str, int]:
        """connections_made, active, bytes_received."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        """Close stdin (the process exits) and reap it."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def limit() -> int:
    """Connections per daemon instance: all of TARGET if one process may hold them (two
    descriptors each, plus the excess it must refuse), else an equal share for the fewest
    instances that can."""
    soft = raise_nofile(2 * (TARGET + EXCESS) + 4096)
    per_process = (soft - 100) // 2 - EXCESS
    instances = -(-TARGET // per_process)
    return TARGET // instances


@pytest.fixture
def upstream(limit: int) -> Iterator[UpstreamProcess]:
    up = UpstreamProcess()
    try:
        yield up
    finally:
        up.stop()


class Instance:
    """One ``amqp-policy-proxy run`` process with its own listener and metrics port."""

    def __init__(self, directory: Path, upstream_port: int, max_connections: int) -> None:
        """Start it; :meth:`stop` terminates it."""
        policy = directory / "policy.json"
        policy.write_text(json.dumps(POLICY))
        self.port, self.metrics_port = free_port(), free_port()
        exe = Path(sys.executable).with_name("amqp-policy-proxy")
        self.log_path = directory / "daemon.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(exe), "--log-level", "WARNING", "run", "--listen", f"127.0.0.1:{self.port}",
             "--upstream", f"127.0.0.1:{upstream_port}", "--policy", str(policy),
             "--max-connections", str(max_connections),
             "--metrics", f"127.0.0.1:{self.metrics_port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def wait_listening(self) -> None:
        """Block until the listener accepts (or fail with the daemon's log)."""
        assert wait_until(lambda: _listening(self.port) or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.log_path.read_text()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def daemon(tmp_path: Path, upstream: UpstreamProcess, limit: int) -> Iterator[list[Instance]]:
    count = TARGET // limit
    instances = []
    try:
        for i in range(count):
            directory = tmp_path / f"instance-{i}"
            directory.mkdir()
            instances.append(Instance(directory, upstream.port, limit))
        for instance in instances:
            instance.wait_listening()
        yield instances
    finally:
        for instance in instances:
            instance.stop()


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


async def open_many(port: int, n: int) -> list[AsyncClient]:
    """Open ``n`` admitted connections, at most CONCURRENCY handshakes in flight."""
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one() -> AsyncClient:
        async with sem:
            client = await open_async_client(port, timeout=60)
            client.keep_items = False
            client.items.clear()
            return client

    return list(await asyncio.gather(*[one() for _ in range(n)]))


async def close_all(clients: list[AsyncClient]) -> None:
    """Close every client transport and wait until each is gone."""
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    await asyncio.wait_for(asyncio.gather(*[c.closed for c in clients]), 60)


async def refused(port: int, n: int) -> list[int]:
    """Connect ``n`` times, send a protocol header; return the bytes each got before EOF."""
    loop = asyncio.get_running_loop()
    got = []
    for _ in range(n):
        _, proto = await loop.create_connection(AsyncClient, "127.0.0.1", port)
        with_header = proto.transport is not None and not proto.transport.is_closing()
        if with_header:
            proto.send(b"AMQP\x00\x01\x00\x00")
        await asyncio.wait_for(proto.closed, 10)
        got.append(proto.bytes_received)
    return got


def test_ten_thousand_idle_connections_memory_global_limit_and_counts(daemon, upstream, limit):
    instances: list[Instance] = daemon
    per = limit  # connections each instance holds (its global maxConnections)
    total = per * len(instances)
    assert total == TARGET

    def all_active() -> float:
        return sum(active(i.metrics_port) for i in instances)

    def rss() -> int:
        return sum(rss_bytes(i.proc.pid) for i in instances)

    async def open_spread(n_each: int) -> list[AsyncClient]:
        groups = await asyncio.gather(*[open_many(i.port, n_each) for i in instances])
        return [c for g in groups for c in g]

    async def scenario() -> dict[str, float]:
        figures: dict[str, float] = {"connections": total, "instances": len(instances),
                                     "per_instance": per, "nofile_soft_limit": limit_info()}
        # warm up allocator pools and code paths, then take the baseline
        warm = await open_spread(WARMUP // len(instances))
        await close_all(warm)
        assert await asyncio.to_thread(wait_until, lambda: all_active() == 0)
        await asyncio.sleep(1.5)
        base = rss()
        t0 = time.monotonic()
        clients = await open_spread(per)
        figures["open_seconds"] = time.monotonic() - t0
        await asyncio.sleep(1.5)  # let the snapshot task publish
        held = rss()
        figures["rss_base_mib"] = base / 2**20
        figures["rss_held_mib"] = held / 2**20
        figures["bytes_per_connection"] = (held - base) / total
        assert await asyncio.to_thread(wait_until, lambda: all_active() == total)
        assert upstream.stats()["active"] == total
        made = upstream.stats()["connections_made"]
        # the excess is refused at accept: no byte written, no upstream connection made
        for instance in instances:
            excess = await refused(instance.port, EXCESS)
            assert excess == [0] * EXCESS
            samples = await asyncio.to_thread(scrape, instance.metrics_port)
            assert metric(samples, "amqp_proxy_connections_denied_total", vhost="",
                          reason="global_limit") == EXCESS, {
                k: v for k, v in samples.items() if "denied" in k[0]}
        assert upstream.stats()["connections_made"] == made
        assert all(not c.closed.done() for c in clients), "a held connection was dropped"
        # everything closes: counts back to zero
        t0 = time.monotonic()
        await close_all(clients)
        assert await asyncio.to_thread(wait_until, lambda: all_active() == 0)
        assert await asyncio.to_thread(wait_until, lambda: upstream.stats()["active"] == 0)
        figures["close_seconds"] = time.monotonic() - t0
        # every global count is exactly zero again: the full number is admitted once more
        again = await open_spread(per)
        assert await asyncio.to_thread(wait_until, lambda: all_active() == total)
        for instance in instances:
            assert await refused(instance.port, 1) == [0]
        await close_all(again)
        assert await asyncio.to_thread(wait_until, lambda: all_active() == 0)
        return figures

    figures = asyncio.run(scenario())
    print(f"\nflood figures: {json.dumps(figures, indent=1)}")
    record = os.environ.get("FLOOD_FIGURES")
    if record:
        Path(record).write_text(json.dumps(figures, indent=1))
    assert all(i.proc.poll() is None for i in instances)
    assert figures["bytes_per_connection"] < MEMORY_LIMIT, figures


# ------------------------------------------------------------------ pre-authentication memory

PREAUTH_CONNECTIONS = 2000
PREAUTH_PARTIAL = 65_000  # bytes of a 64 KiB SASL frame that never completes
PREAUTH_BUDGET = 8 * 1024 * 1024

_PREAUTH_DAEMON = """
import sys
from dataclasses import replace
from amqp_policy_proxy.daemon.config import DaemonConfig
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.proxy import ProxyThread
policy = compile_policy([(None, {policy})], PolicySettings())
config = DaemonConfig(preauth_buffer_bytes=int(sys.argv[2]), handshake_seconds=60.0)
with ProxyThread([("127.0.0.1", int(sys.argv[1]))], policy=policy, config=config,
                 metrics=True, handshake_seconds=60.0) as proxy:
    print(proxy.port, proxy.metrics_port, flush=True)
    sys.stdin.read()
"""


async def hold_partial_frames(port: int, n: int) -> list[AsyncClient]:
    """``n`` clients that each send the SASL header and 65,000 bytes of a 64 KiB frame."""
    loop = asyncio.get_running_loop()
    partial = (65536).to_bytes(4, "big") + b"\x02\x01\x00\x00" + b"\x00" * (PREAUTH_PARTIAL - 8)
    clients = []
    for _ in range(n):
        _, proto = await loop.create_connection(AsyncClient, "127.0.0.1", port)
        proto.keep_items = False
        if proto.transport is not None and not proto.transport.is_closing():
            proto.send(b"AMQP\x03\x01\x00\x00" + partial)
        clients.append(proto)
    await asyncio.sleep(1.0)
    return clients


@pytest.mark.parametrize("budget", [PREAUTH_BUDGET])
def test_unauthenticated_connections_hold_at_most_the_preauth_budget(upstream, budget):
    """Issue 14 finding 12: 2,000 unauthenticated connections each holding a 65 KB partial
    frame took the proxy from 47 to 178 MiB. With an 8 MiB budget the growth stays near the
    budget: once it is reached, connections not yet admitted wait (no more reads) and new
    ones are refused at accept, counted as ``preauth_memory``."""
    raise_nofile(2 * PREAUTH_CONNECTIONS + 1024)
    root = Path(__file__).resolve().parents[2]
    policy = json.dumps(POLICY)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PREAUTH_DAEMON.replace("{policy}", policy),
         str(upstream.port), str(budget)],
        cwd=root, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port, metrics_port = map(int, proc.stdout.readline().split())
        base = rss_bytes(proc.pid)

        async def run() -> tuple[int, int]:
            clients = await hold_partial_frames(port, PREAUTH_CONNECTIONS)
            held = rss_bytes(proc.pid)
            closed = sum(1 for c in clients if c.closed.done())
            for c in clients:
                if c.transport is not None:
                    c.transport.close()
            return held, closed

        held, refused_clients = asyncio.run(run())
        growth = held - base
        samples = scrape(metrics_port)
        refused = metric(samples, "amqp_proxy_connections_denied_total", vhost="",
                         reason="preauth_memory")
        print(f"preauth: base {base / 2**20:.1f} MiB, with {PREAUTH_CONNECTIONS} partial "
              f"frames {held / 2**20:.1f} MiB (+{growth / 2**20:.1f}), refused {refused:.0f}")
        assert refused > 0 and refused_clients >= refused
        # the budget, plus the per-connection state of the connections that wait (a few KiB
        # each) and the allocator's slack; without the budget this was 130 MiB and more
        assert growth < budget + PREAUTH_CONNECTIONS * 16 * 1024 + 16 * 2**20
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
