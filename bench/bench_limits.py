#!/usr/bin/env python3
"""What policy limits cost the proxy's Transfer throughput: allow-all vs limits in force.

Bench tooling, not part of the package. One peer and three proxy processes (all pinned like
the other benchmarks), each with its own policy:

- ``allow-all``: ``bench/policies/allow-all.json`` (no limit, every address allowed);
- ``limits-pattern``: ``bench/policies/limits.json``: ``maxMessageSize`` (vhost and group),
  ``maxSenders``/``maxReceivers``/``maxSessions`` and ``targetPattern``/``sourcePattern`` rules;
- ``limits-list``: ``bench/policies/limits-list.json``: the same with ``targets``/``sources``
  lists (prefix wildcards, ``${user}``).

All traffic is allowed by every policy. Traffic cases: a named sender link (address
``bench.q<i>``) with 100 B and 16 KiB messages (the message size is checked on every Transfer,
the address once at Attach), and an anonymous sender whose 100 B messages carry
``properties.to = bench.q0`` (the address rules are then checked on every message). Samples
alternate between the policies round by round; the cost is ``1 - limits / allow-all``.

Usage: ``.venv/bin/python bench/bench_limits.py [--rounds 3] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import loadgen
import run_all

POLICIES = {
    "allow-all": run_all.POLICY_DIR / "allow-all.json",
    "limits-pattern": run_all.POLICY_DIR / "limits.json",
    "limits-list": run_all.POLICY_DIR / "limits-list.json",
}
CASES = (
    ("named link, 100 B", {"size": 100}),
    ("named link, 16 KiB", {"size": 16384}),
    ("anonymous relay (to per message), 100 B", {"size": 100, "anonymous": True,
                                                  "to": "bench.q0"}),
)


def run(*, pin: bool, rounds: int, seconds: float, warmup: float, conns: int = 4
        ) -> list[dict[str, Any]]:
    """Run every traffic case against every policy, alternating; return one row per case."""
    rows = []
    with run_all.Stack(pin=pin, haproxy=False, policies=POLICIES) as stack:
        targets = {k: v for k, v in stack.targets().items() if k in POLICIES}
        for case, options in CASES:
            def one(name: str, address: str, watch: dict[str, int],
                    options: dict[str, Any] = options) -> dict[str, Any]:
                return loadgen.spawn("throughput", address, cpus=stack.loadgen_cpus,
                                     watch=watch, conns=conns, seconds=seconds, warmup=warmup,
                                     **options)

            print(f"limits: {case}", flush=True)
            samples = run_all.alternate(rounds, targets, one, label=f"limits {case}")
            summary = run_all.summarize(samples, "msgs_per_s")
            base = summary["allow-all"]["median"]
            costs = {}
            for name in POLICIES:
                if name != "allow-all" and base:
                    costs[name] = 100.0 * (1.0 - summary[name]["median"] / base)
            # per-round paired cost (same round, adjacent samples): less sensitive to drift
            paired = {
                name: statistics.median(
                    100.0 * (1.0 - lim["msgs_per_s"] / ref["msgs_per_s"])
                    for lim, ref in zip(samples[name], samples["allow-all"], strict=True))
                for name in POLICIES if name != "allow-all"
            }
            cpu = run_all.summarize(samples, "target_us_per_op")
            cpu_costs = {}
            for name in POLICIES:
                ref, lim = cpu["allow-all"]["median"], cpu[name]["median"]
                if name != "allow-all" and ref and lim is not None:
                    cpu_costs[name] = 100.0 * (lim / ref - 1.0)
            rows.append({"case": case, "summary": summary, "cost_percent": costs,
                         "paired_cost_percent": paired, "cpu_us_per_msg": cpu,
                         "cpu_cost_percent": cpu_costs, "samples": samples})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown table: msg/s per policy and the cost of the limits in percent."""
    lines = [
        "| traffic | allow-all msg/s | limits-pattern msg/s | cost | limits-list msg/s | cost |"
        " goal |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        s, c = row["summary"], row["cost_percent"]
        lines.append(
            f"| {row['case']} | {s['allow-all']['median']:,.0f}"
            f" | {s['limits-pattern']['median']:,.0f} | {c['limits-pattern']:+.1f}%"
            f" | {s['limits-list']['median']:,.0f} | {c['limits-list']:+.1f}% | < 10% |"
        )
    lines += [
        "",
        "| traffic | allow-all µs CPU/msg | limits-pattern | cost | limits-list | cost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        u, c = row["cpu_us_per_msg"], row["cpu_cost_percent"]
        lines.append(
            f"| {row['case']} | {u['allow-all']['median']:.2f}"
            f" | {u['limits-pattern']['median']:.2f}"
            f" | {c.get('limits-pattern', float('nan')):+.1f}% | {u['limits-list']['median']:.2f}"
            f" | {c.get('limits-list', float('nan')):+.1f}% |"
        )
    lines.append("")
    lines.append("throughput cost = 1 - median(limits) / median(allow-all); CPU cost = proxy CPU"
                 " per message with limits / without - 1. Paired per-round throughput costs: "
                 + "; ".join(f"{row['case']}: " + ", ".join(
                     f"{k} {v:+.1f}%" for k, v in row["paired_cost_percent"].items())
                     for row in rows))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args(argv)
    rows = run(pin=not args.no_pin, rounds=args.rounds, seconds=args.seconds,
               warmup=args.warmup)
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
