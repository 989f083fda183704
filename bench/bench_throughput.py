#!/usr/bin/env python3
"""Message throughput (messages per second) with 100-byte and 16 KiB messages.

Bench tooling, not part of the package. Each sample is one ``loadgen.py throughput`` process:
``--conns`` connections writing pre-settled Transfers as fast as the peer's credit allows; the
rate is what the peer acknowledged (its Flow delivery-count) over the measured window. Targets
alternate direct, haproxy, proxy, round after round.

Usage: ``.venv/bin/python bench/bench_throughput.py [--rounds 3] [--seconds 3]`` (or via
``pinned.py``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import loadgen
import pinned

SIZES = (100, 16384)


def run(stack: Any, *, rounds: int, seconds: float, warmup: float, sizes: tuple[int, ...] = SIZES,
        conns: int = 4, procs: int = 1) -> list[dict[str, Any]]:
    """Run the throughput benchmark for each size; return one table row per size."""
    rows = []
    for size in sizes:
        def one(name: str, address: str, watch: dict[str, int], size: int = size) -> dict[str, Any]:
            """One sample against one target."""
            return loadgen.spawn("throughput", address, procs=procs, cpus=stack.loadgen_cpus,
                                 watch=watch, size=size, conns=conns, seconds=seconds,
                                 warmup=warmup)

        label = f"throughput {size} B"
        print(f"{label} ({conns} connections, {procs} loadgen process(es))", flush=True)
        samples = pinned.alternate(rounds, stack.targets(), one, label=label)
        rows.append({
            "name": f"throughput, {size} B messages", "unit": "msg/s", "key": "msgs_per_s",
            "summary": pinned.summarize(samples, "msgs_per_s"), "goal": ">= 0.95x",
            "goal_ratio": 0.95, "samples": samples,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--sizes", default="100,16384")
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    with pinned.Stack(pin=not args.no_pin) as stack:
        rows = run(stack, rounds=args.rounds, seconds=args.seconds, warmup=args.warmup,
                   sizes=sizes, conns=args.conns, procs=args.procs)
    print(pinned.render_table(rows))
    print(pinned.render_cpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
