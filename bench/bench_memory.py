#!/usr/bin/env python3
"""Memory per idle connection: RSS growth of the target process while N connections sit idle.

Bench tooling, not part of the package. For every round and every target a FRESH stack is
started (so no round reuses memory an earlier one freed), the target process's VmRSS is read
(``/proc/PID/status``), a ``loadgen.py hold`` process opens ``--conns`` connections through
SASL ANONYMOUS, Open and Begin and keeps them idle, VmRSS is read again, and
``(after - before) / N`` is the figure. The measured process is the peer for ``direct``, the
HAProxy process for ``haproxy`` and the proxy process for ``proxy``.

Usage: ``.venv/bin/python bench/bench_memory.py [--rounds 3] [--conns 2000]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import loadgen
import pinned


def measure(stack: Any, target: str, conns: int, settle: float = 1.0) -> dict[str, Any]:
    """Hold ``conns`` idle connections to ``target`` of a started stack; return RSS figures."""
    address, watch = stack.targets()[target]
    pid = watch.get("target", watch["peer"])
    time.sleep(settle)
    before = pinned.rss_kib(pid)
    cmd = [sys.executable, str(loadgen.BENCH_DIR / "loadgen.py"), "hold", "--target", address,
           "--conns", str(conns), "--concurrency", "64"]
    if stack.loadgen_cpus:
        cmd += ["--cpus", stack.loadgen_cpus]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = json.loads(proc.stdout.readline())
        time.sleep(settle)
        after = pinned.rss_kib(pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        end = json.loads(out.strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {
        "rss_before_kib": before, "rss_after_kib": after, "conns": ready["ready"],
        "alive_at_end": end.get("alive_at_end"), "open_seconds": ready.get("open_seconds"),
        "per_conn_kib": (after - before) / max(1, ready["ready"]),
    }


def run(*, pin: bool, rounds: int, conns: int = 2000) -> list[dict[str, Any]]:
    """Run the memory benchmark with a fresh stack per sample; return its table row."""
    layouts = {
        "direct": {"haproxy": False, "policies": {}},
        "haproxy": {"haproxy": True, "policies": {}},
        "proxy": {"haproxy": False},
    }
    samples: dict[str, list[dict[str, Any]]] = {t: [] for t in layouts}
    print(f"memory per idle connection ({conns} connections, fresh processes per sample)",
          flush=True)
    for r in range(rounds):
        for target, layout in layouts.items():
            with pinned.Stack(pin=pin, **layout) as stack:
                result = measure(stack, target, conns)
            samples[target].append(result)
            print(f"  memory round {r + 1}/{rounds} {target:8s} "
                  f"{result['per_conn_kib']:.2f} KiB/conn (RSS {result['rss_before_kib']} -> "
                  f"{result['rss_after_kib']} KiB)", flush=True)
    return [{
        "name": f"memory per idle connection ({conns} held)", "unit": "KiB",
        "key": "per_conn_kib", "summary": pinned.summarize(samples, "per_conn_kib"),
        "goal": "(lower is better)", "samples": samples,
    }]


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args(argv)
    rows = run(pin=not args.no_pin, rounds=args.rounds, conns=args.conns)
    print(pinned.render_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
