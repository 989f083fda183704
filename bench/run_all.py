#!/usr/bin/env python3
"""Run every proxy benchmark against direct / HAProxy / proxy, alternating (``make bench``).

Bench tooling, not part of the package. Starts (all on 127.0.0.1):

- the bench peer (``bench/peer.py``), the upstream of every target;
- HAProxy 2.6 in TCP mode in front of it (``tests/support/haproxy.py``, ``nbthread 1``);
- the proxy as a separate process (``amqp-policy-proxy run``) with ``bench/policies/
  allow-all.json`` and ``--default-vhost '$default'``;

then runs each benchmark round by round, and inside a round once per target in the order
direct, haproxy, proxy; prints a table of medians with the ratio proxy/haproxy and writes
``bench/results/latest.json``. Every load sample is a separate ``bench/loadgen.py`` process.

CPU layout (``--pin``, the default): the target under test (HAProxy or the proxy) alone on CPU 1,
the load generator and the peer on CPU 0. With ``--no-pin`` the scheduler places everything.

Usage: ``.venv/bin/python bench/run_all.py [--rounds 3] [--seconds 3] [--only throughput,...]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import bench_connrate
import bench_latency
import bench_limits
import bench_memory
import bench_throughput
import pinned
from pinned import (
    RESULTS_DIR,
    Stack,
    bottleneck_warnings,
    machine_info,
    render_cost_table,
    render_cpu_table,
    render_table,
)


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and print/write the results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per sample")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--only", default="throughput,latency,connrate,memory,limits",
                    help="comma-separated subset")
    ap.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    ap.add_argument("--idle-conns", type=int, default=2000, help="memory: idle connections")
    ap.add_argument("--out", default=str(RESULTS_DIR / "latest.json"))
    ap.add_argument("--quiet-threshold", type=float, default=0.5,
                    help="wait before each sample until other processes use fewer cores")
    ap.add_argument("--quiet-max-wait", type=float, default=20.0)
    args = ap.parse_args(argv)
    pinned.QUIET_THRESHOLD, pinned.QUIET_MAX_WAIT = args.quiet_threshold, args.quiet_max_wait
    only = set(args.only.split(","))
    pin = not args.no_pin
    info = machine_info()
    print(f"machine: {info}", flush=True)
    rows: list[dict[str, Any]] = []
    limits_rows: list[dict[str, Any]] = []
    started = time.time()
    if only & {"throughput", "latency", "connrate"}:
        with Stack(pin=pin) as stack:
            if "throughput" in only:
                rows += bench_throughput.run(stack, rounds=args.rounds, seconds=args.seconds,
                                             warmup=args.warmup)
            if "latency" in only:
                rows += bench_latency.run(stack, rounds=args.rounds, seconds=args.seconds,
                                          warmup=args.warmup)
            if "connrate" in only:
                rows += bench_connrate.run(stack, rounds=args.rounds, seconds=args.seconds,
                                           warmup=args.warmup)
    if "memory" in only:
        rows += bench_memory.run(pin=pin, rounds=args.rounds, conns=args.idle_conns)
    limits_core: list[dict[str, Any]] = []
    if "limits" in only:
        limits_rows = bench_limits.run(pin=pin, rounds=args.rounds, seconds=args.seconds,
                                       warmup=args.warmup)
        print("limits: sans-IO core replay", flush=True)
        limits_core = bench_limits.run_core(rounds=max(args.rounds, 5))
    info["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    info["duration_s"] = round(time.time() - started, 1)
    command = "make bench  # = .venv/bin/python bench/run_all.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print()
    print(f"command: {command}")
    print(f"machine: {info}")
    print(f"layout: {'pinned: target on CPU 1, loadgen + peer on CPU 0' if pin else 'unpinned'}")
    if rows:
        print()
        print(render_table(rows))
        print()
        print("median CPU per sample, in cores (1.0 = one core busy):")
        print(render_cpu_table(rows))
        print()
        print("CPU microseconds per message / per connection (median):")
        print(render_cost_table(rows))
        for warning in bottleneck_warnings(rows, pin):
            print(f"WARNING: {warning}")
    if limits_rows:
        print()
        print(bench_limits.render(limits_rows))
    if limits_core:
        print()
        print(bench_limits.render_core(limits_core))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": command, "machine": info, "pinned": pin, "rounds": args.rounds,
        "seconds": args.seconds, "benchmarks": rows, "limits": limits_rows,
        "limits_core": limits_core,
    }, indent=1, default=str))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
