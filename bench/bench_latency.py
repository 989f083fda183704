#!/usr/bin/env python3
"""Request/response round-trip latency (p50, p99) of 100-byte messages.

Bench tooling, not part of the package. Each sample is one ``loadgen.py latency`` process: one
connection, a sender and a receiver link; the peer echoes each message on the receiver link;
one message in flight. Targets alternate direct, haproxy, proxy, round after round; the table
shows the median over rounds of each sample's p50 and p99.

Usage: ``.venv/bin/python bench/bench_latency.py [--rounds 3] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import loadgen
import pinned


def run(stack: Any, *, rounds: int, seconds: float, warmup: float,
        size: int = 100) -> list[dict[str, Any]]:
    """Run the latency benchmark; return the p50 and p99 table rows."""
    def one(name: str, address: str, watch: dict[str, int]) -> dict[str, Any]:
        """One sample against one target."""
        return loadgen.spawn("latency", address, cpus=stack.loadgen_cpus, watch=watch,
                             size=size, seconds=seconds, warmup=warmup)

    print(f"latency ({size} B request, echoed)", flush=True)
    samples = pinned.alternate(rounds, stack.targets(), one, label="latency")
    return [
        {"name": f"round trip p50, {size} B", "unit": "µs", "key": "p50_us",
         "summary": pinned.summarize(samples, "p50_us"), "goal": "(lower is better)",
         "samples": samples},
        {"name": f"round trip p99, {size} B", "unit": "µs", "key": "p99_us",
         "summary": pinned.summarize(samples, "p99_us"), "goal": "(lower is better)"},
    ]


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args(argv)
    with pinned.Stack(pin=not args.no_pin) as stack:
        rows = run(stack, rounds=args.rounds, seconds=args.seconds, warmup=args.warmup)
    print(pinned.render_table(rows))
    print(pinned.render_cpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
