#!/usr/bin/env python3
"""Connections per second: TCP connect, SASL ANONYMOUS, Open, Close, disconnect.

Bench tooling, not part of the package. Each sample is one ``loadgen.py connrate`` process with
``--concurrency`` parallel loops. Two variants:

- ``close-wait``: the full handshake, waiting for the server's Close before disconnecting;
- ``close-nowait``: Close sent, then disconnect at once (no round trip for the Close reply).

Targets alternate direct, haproxy, proxy, round after round.

Usage: ``.venv/bin/python bench/bench_connrate.py [--rounds 3] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import loadgen
import pinned


def run(stack: Any, *, rounds: int, seconds: float, warmup: float, concurrency: int = 16,
        procs: int = 1) -> list[dict[str, Any]]:
    """Run both connection-rate variants; return one table row each."""
    rows = []
    for wait in (True, False):
        variant = "close-wait" if wait else "close-nowait"

        def one(name: str, address: str, watch: dict[str, int], wait: bool = wait
                ) -> dict[str, Any]:
            """One sample against one target."""
            return loadgen.spawn("connrate", address, procs=procs, cpus=stack.loadgen_cpus,
                                 watch=watch, concurrency=concurrency, seconds=seconds,
                                 warmup=warmup, no_close_wait=not wait)

        print(f"connrate {variant} (concurrency {concurrency}, {procs} process(es))", flush=True)
        samples = pinned.alternate(rounds, stack.targets(), one, label=f"connrate {variant}")
        rows.append({
            "name": f"connections/s ({variant})", "unit": "conn/s", "key": "conns_per_s",
            "summary": pinned.summarize(samples, "conns_per_s"), "goal": ">= 0.9x",
            "goal_ratio": 0.9, "samples": samples,
            "errors": {t: sum(s.get("errors", 0) for s in v) for t, v in samples.items()},
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args(argv)
    with pinned.Stack(pin=not args.no_pin) as stack:
        rows = run(stack, rounds=args.rounds, seconds=args.seconds, warmup=args.warmup,
                   concurrency=args.concurrency, procs=args.procs)
    print(pinned.render_table(rows))
    print(pinned.render_cpu_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
