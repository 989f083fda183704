#!/usr/bin/env python3
"""The fleet: what the Redis ledger adds per Open, and what workers give.

Bench tooling, not part of the package. Three parts, each printed as a table (and written as
JSON to ``bench/results/fleet.json``):

1. **Added time per Open** (``ledger``): the admission itself, timed where the proxy's
   decision waits for it, on uvloop: the in-process ledger (``try_admit`` + ``release``), and
   the fleet ledger against a private ``redis-server`` over loopback TCP and over a unix
   socket (``try_admit`` until the answer is delivered, one admission at a time, so each is
   one Lua call and one round trip). p50/p99 in microseconds.
2. **Connect rate** (``connrate``): ``loadgen.py connrate`` (TCP connect, SASL ANONYMOUS,
   Open, Close) through the proxy with the in-process ledger, with ``--ledger`` over TCP and
   over a unix socket; rounds alternate the targets.
3. **Workers** (``workers``): connections/s and 100 B messages/s through ``--workers 1`` and
   ``--workers 2`` (``--ledger auto``) and HAProxy ``nbthread 1`` and ``nbthread 2``, in the
   same run, targets alternating. Nothing is pinned (two workers need two cores).

Every sample records the machine's busy cores not ours (``other``): the machine is shared.

Usage: ``.venv/bin/python bench/bench_fleet.py [--parts ledger,connrate,workers]
[--rounds 3] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import loadgen
import pinned as run_all  # the pinned bench's helpers (peer, proxy, samples, quiet wait)

sys.path.insert(0, str(run_all.ROOT))
sys.path.insert(0, str(run_all.ROOT / "src"))

from amqp_policy_proxy.core.admission import LEDGER_PENDING  # noqa: E402
from amqp_policy_proxy.daemon.loop import loop_factory  # noqa: E402
from amqp_policy_proxy.fleet.ledger import FleetLedger, LedgerSettings  # noqa: E402
from amqp_policy_proxy.limits.connections import ConnectionLedger  # noqa: E402
from amqp_policy_proxy.policy.compile import compile_policy  # noqa: E402
from amqp_policy_proxy.policy.model import PolicySettings  # noqa: E402
from tests.support.haproxy import HAProxy  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.redis import RedisServer  # noqa: E402

POLICY = run_all.POLICY_DIR / "allow-all.json"


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- 1. the admission itself -------------------------------------------------------------


def _policy_objects() -> tuple[Any, Any]:
    policy = compile_policy([(None, [["vhost", {
        "hostname": "bench", "maxConnections": 65535, "maxConnectionsPerUser": 65535,
        "maxConnectionsPerHost": 65535, "allowUnknownUser": True,
        "groups": {"$default": {"users": "*", "remoteHosts": "*"}}}]])], PolicySettings())
    vhost = policy.vhosts["bench"]
    return vhost, vhost.groups["$default"]


def admission_in_process(n: int) -> list[float]:
    """Seconds per ``try_admit`` + ``release`` of the in-process ledger."""
    vhost, group = _policy_objects()
    ledger = ConnectionLedger(100000)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        ledger.try_admit(f"c{i}", vhost=vhost, group=group, user=f"u{i % 50}",
                         remote_host=f"10.0.0.{i % 200}")
        out.append(time.perf_counter() - t0)
        ledger.release(f"c{i}")
    return out


async def _admission_fleet(url: str, n: int) -> list[float]:
    vhost, group = _policy_objects()
    answered: dict[str, Any] = {}
    event = asyncio.Event()

    def on_answer(conn_id: str, reason: Any) -> None:
        answered[conn_id] = reason
        event.set()

    ledger = FleetLedger(ConnectionLedger(100000),
                         LedgerSettings(url=url, proxy_id="bench", timeout_ms=1000),
                         on_answer=on_answer)
    if not await ledger.start():
        raise RuntimeError(f"redis at {url} unreachable")
    out = []
    try:
        for i in range(n):
            conn_id = f"c{i}"
            event.clear()
            t0 = time.perf_counter()
            got = ledger.try_admit(conn_id, vhost=vhost, group=group, user=f"u{i % 50}",
                                   remote_host=f"10.0.0.{i % 200}")
            if got is LEDGER_PENDING:
                await event.wait()
            out.append(time.perf_counter() - t0)
            ledger.release(conn_id)
    finally:
        await ledger.stop()
    return out


def admission_fleet(url: str, n: int) -> list[float]:
    """Seconds from ``try_admit`` to the delivered answer, one admission at a time."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_admission_fleet(url, n))


def part_ledger(n: int) -> dict[str, Any]:
    """Added time per Open: p50/p99 microseconds per ledger kind."""
    rows: dict[str, Any] = {}
    quiet = run_all.wait_quiet()
    samples = admission_in_process(n)
    rows["in-process"] = samples
    with RedisServer() as tcp, RedisServer(unix=True) as unix:
        admission_fleet(tcp.url, 200)  # warm up
        rows["redis tcp"] = admission_fleet(tcp.url, n)
        rows["redis unix"] = admission_fleet(unix.url, n)
    out = {}
    for name, values in rows.items():
        out[name] = {"p50_us": round(pct(values, 0.5) * 1e6, 1),
                     "p99_us": round(pct(values, 0.99) * 1e6, 1),
                     "mean_us": round(statistics.mean(values) * 1e6, 1), "n": len(values)}
    out["quiet"] = quiet
    return out


# --- 2. connect rate with and without the ledger --------------------------------------------


class FleetProxy:
    """``amqp-policy-proxy run`` with extra flags (not pinned)."""

    def __init__(self, upstream: str, flags: list[str], log: Path) -> None:
        self.host = "127.0.0.1"
        self.port = free_port(self.host)
        cmd = [str(run_all.PROXY_BIN), "run", "--listen", f"{self.host}:{self.port}",
               "--upstream", upstream, "--policy", str(POLICY), "--default-vhost", "$default",
               *flags]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.pid = self.proc.pid
        run_all.wait_listening(self.host, self.port, self.proc, log=log)
        time.sleep(1.0 if "--workers" in flags else 0.2)  # every worker listening

    @property
    def address(self) -> str:
        """``HOST:PORT``."""
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ThreadedHAProxy(HAProxy):
    """The test-support HAProxy with ``nbthread N``."""

    def __init__(self, backend: str, threads: int) -> None:
        super().__init__(backend)
        self.threads = threads

    def config_text(self) -> str:
        """The support configuration plus ``nbthread N``."""
        return super().config_text().replace("global\n", f"global\n    nbthread {self.threads}\n",
                                             1)


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (a supervisor's workers and its redis-server)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def watched(base: dict[str, int], extra: list[int]) -> dict[str, int]:
    """``base`` plus ``part0``, ``part1``... for processes that count as the target."""
    return {**base, **{f"part{i}": pid for i, pid in enumerate(extra)}}


def fold(result: dict[str, Any]) -> dict[str, Any]:
    """Add the CPU of the ``part*`` processes (workers, the ledger's redis-server) to
    ``target``: the proxy's whole cost."""
    cpu = result.get("cpu") or {}
    parts = [k for k in cpu if k.startswith("part")]
    if parts:
        cpu["target"] = round((cpu.get("target") or 0.0)
                              + sum(cpu.pop(k) or 0.0 for k in parts), 3)
    return result


def _rate_row(samples: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any]:
    summary = run_all.summarize(samples, key)
    return {t: {"median": s["median"], "values": s["values"], "cpu": s["cpu"],
                "target_us_per_op": round(statistics.median(
                    r["target_us_per_op"] for r in samples[t] if "target_us_per_op" in r), 1)
                if any("target_us_per_op" in r for r in samples[t]) else None}
            for t, s in summary.items()}


def part_connrate(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    """Connections/s through the proxy with the in-process ledger and the Redis ledger."""
    logs = run_all.RESULTS_DIR / "logs"
    peer = run_all.Peer(None)
    procs: list[Any] = []
    try:
        with RedisServer() as tcp, RedisServer(unix=True) as unix:
            targets: dict[str, tuple[str, dict[str, int]]] = {}
            for name, flags, store in (("in-process", [], None),
                                       ("redis tcp", ["--ledger", tcp.url], tcp),
                                       ("redis unix", ["--ledger", unix.url], unix)):
                p = FleetProxy(peer.address, flags, logs / f"fleet-{name.replace(' ', '-')}.log")
                procs.append(p)
                extra = [store._proc.pid] if store is not None and store._proc else []
                targets[name] = (p.address, watched({"peer": peer.pid, "target": p.pid},
                                                    extra))
            out = {}
            for conc in (1, concurrency):
                def one(name: str, address: str, watch: dict[str, int], c: int = conc
                        ) -> dict[str, Any]:
                    return fold(loadgen.spawn("connrate", address, watch=watch, concurrency=c,
                                              seconds=seconds, warmup=1.0))

                samples = run_all.alternate(rounds, targets, one, label=f"connrate c={conc}")
                out[f"concurrency {conc}"] = _rate_row(samples, "conns_per_s")
            return out
    finally:
        for p in procs:
            p.stop()
        peer.stop()


def part_workers(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    """Workers 1 and 2 against HAProxy nbthread 1 and 2: conn/s and 100 B msgs/s."""
    logs = run_all.RESULTS_DIR / "logs"
    peer = run_all.Peer(None)
    procs: list[Any] = []
    runtime = tempfile.mkdtemp(prefix="bench-fleet-")
    try:
        targets: dict[str, tuple[str, dict[str, int]]] = {}
        for n in (1, 2):
            h = ThreadedHAProxy(peer.address, n)
            h.start()
            procs.append(h)
            targets[f"haproxy nbthread {n}"] = (h.address, {"peer": peer.pid,
                                                            "target": h.pid or 0})
        for n in (1, 2):
            env_dir = os.path.join(runtime, f"w{n}")
            os.makedirs(env_dir, exist_ok=True)
            flags = ["--workers", str(n), "--ledger", "auto"] if n > 1 else []
            p = FleetProxy(peer.address, flags, logs / f"fleet-workers-{n}.log")
            procs.append(p)
            targets[f"proxy workers {n}"] = (p.address, watched(
                {"peer": peer.pid, "target": p.pid}, children(p.pid)))
        out: dict[str, Any] = {}

        def conn(name: str, address: str, watch: dict[str, int]) -> dict[str, Any]:
            return fold(loadgen.spawn("connrate", address, watch=watch,
                                      concurrency=concurrency, seconds=seconds, warmup=1.0,
                                      procs=2))

        samples = run_all.alternate(rounds, targets, conn, label="workers connrate")
        out["connections/s"] = _rate_row(samples, "conns_per_s")

        def msgs(name: str, address: str, watch: dict[str, int]) -> dict[str, Any]:
            return fold(loadgen.spawn("throughput", address, watch=watch, conns=8, size=100,
                                      seconds=seconds, warmup=1.0, procs=2))

        samples = run_all.alternate(rounds, targets, msgs, label="workers 100B")
        out["100 B msgs/s"] = _rate_row(samples, "msgs_per_s")
        return out
    finally:
        for p in procs:
            p.stop()
        peer.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts and print and write the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="ledger,connrate,workers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--admissions", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "cpus": os.cpu_count()}
    if "ledger" in parts:
        results["ledger"] = part_ledger(args.admissions)
        print(json.dumps(results["ledger"], indent=1), flush=True)
    if "connrate" in parts:
        results["connrate"] = part_connrate(args.rounds, args.seconds, args.concurrency)
    if "workers" in parts:
        results["workers"] = part_workers(args.rounds, args.seconds, args.concurrency)
    run_all.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    name = "fleet.json" if parts == {"ledger", "connrate", "workers"} else (
        f"fleet-{'-'.join(sorted(parts))}.json")
    (run_all.RESULTS_DIR / name).write_text(json.dumps(results, indent=1))
    for part in ("connrate", "workers"):
        for what, row in results.get(part, {}).items():
            print(f"{part} {what}:")
            for target, fig in row.items():
                print(f"  {target:22s} median {fig['median']:.0f}  values "
                      f"{[round(v) for v in fig['values']]}  target CPU us/op "
                      f"{fig['target_us_per_op']}  cpu {fig['cpu']}")
    return 0


if __name__ == "__main__":
    sys.modules.setdefault("run_all", run_all)
    sys.exit(main())
