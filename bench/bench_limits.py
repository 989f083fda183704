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
import pinned

POLICIES = {
    "allow-all": pinned.POLICY_DIR / "allow-all.json",
    "limits-pattern": pinned.POLICY_DIR / "limits.json",
    "limits-list": pinned.POLICY_DIR / "limits-list.json",
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
    with pinned.Stack(pin=pin, haproxy=False, policies=POLICIES) as stack:
        targets = {k: v for k, v in stack.targets().items() if k in POLICIES}
        for case, options in CASES:
            def one(name: str, address: str, watch: dict[str, int],
                    options: dict[str, Any] = options) -> dict[str, Any]:
                """One sample against one target."""
                return loadgen.spawn("throughput", address, cpus=stack.loadgen_cpus,
                                     watch=watch, conns=conns, seconds=seconds, warmup=warmup,
                                     **options)

            print(f"limits: {case}", flush=True)
            samples = pinned.alternate(rounds, targets, one, label=f"limits {case}")
            summary = pinned.summarize(samples, "msgs_per_s")
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
            cpu = pinned.summarize(samples, "target_us_per_op")
            cpu_costs = {}
            for name in POLICIES:
                ref, lim = cpu["allow-all"]["median"], cpu[name]["median"]
                if name != "allow-all" and ref and lim is not None:
                    cpu_costs[name] = 100.0 * (lim / ref - 1.0)
            rows.append({"case": case, "summary": summary, "cost_percent": costs,
                         "paired_cost_percent": paired, "cpu_us_per_msg": cpu,
                         "cpu_cost_percent": cpu_costs, "samples": samples})
    return rows


# --- the same comparison on the sans-IO core alone (no sockets, no event loop) -------------------


def _core_connection(policy_path: Any, to: str | None) -> Any:
    """A :class:`ProxyConnection` driven through SASL, Open, Begin and a sender Attach."""
    from amqp_policy_proxy.amqp.codec import symbol_array
    from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER, FrameType
    from amqp_policy_proxy.amqp.framing import encode_frame
    from amqp_policy_proxy.amqp.performatives import (
        Attach,
        Begin,
        Open,
        SaslMechanisms,
        SaslOutcome,
    )
    from amqp_policy_proxy.core.commands import Side
    from amqp_policy_proxy.core.connection import ProxyConnection
    from amqp_policy_proxy.limits.connections import ConnectionLedger
    from amqp_policy_proxy.policy.load import load_policy
    from amqp_policy_proxy.policy.model import PolicySettings

    policy = load_policy(policy_path, PolicySettings(default_vhost="$default"))
    conn = ProxyConnection("bench", remote_host="127.0.0.1", listener="127.0.0.1:5672",
                           policy=policy, ledger=ConnectionLedger(100), now=0.0)
    client = lambda data: conn.receive_data(Side.CLIENT, data, 0.0)  # noqa: E731
    broker = lambda data: conn.receive_data(Side.ROUTER, data, 0.0)  # noqa: E731
    client(SASL_HEADER)
    conn.router_connected(0.0)
    broker(SASL_HEADER + encode_frame(0, SaslMechanisms(
        sasl_server_mechanisms=symbol_array(["ANONYMOUS"])).encode(), FrameType.SASL))
    client(loadgen.SASL_INIT_ANONYMOUS)
    broker(encode_frame(0, SaslOutcome(code=0).encode(), FrameType.SASL))
    client(AMQP_HEADER)
    broker(AMQP_HEADER)
    client(loadgen.OPEN_FRAME)
    broker(encode_frame(0, Open(container_id="peer", max_frame_size=loadgen.MAX_FRAME).encode()))
    client(loadgen.BEGIN_FRAME)
    broker(encode_frame(0, Begin(remote_channel=0, next_outgoing_id=0,
                                 incoming_window=loadgen.WINDOW,
                                 outgoing_window=loadgen.WINDOW).encode()))
    client(loadgen.attach_frame(0, sender=True, address=None if to else "bench.q0",
                                name="bench-core"))
    broker(encode_frame(0, Attach(name="bench-core", handle=0, role=True,
                                  snd_settle_mode=1).encode()))
    broker(loadgen.flow_frame(0, next_incoming_id=0, next_outgoing_id=0, handle=0,
                              delivery_count=0, link_credit=1 << 30))
    return client, conn


def core_sample(policy_path: Any, size: int, to: str | None, messages: int) -> dict[str, Any]:
    """Feed ``messages`` pre-settled Transfers to one core connection in 256-frame reads.

    Returns:
        CPU microseconds per message (``time.process_time``) and whether all were forwarded.
    """
    import time

    client, conn = _core_connection(policy_path, to)
    chunk = 256
    payload = loadgen.message(size, to)
    blocks = []
    for b in range(8):  # distinct delivery-ids over a few blocks, reused cyclically
        blocks.append(b"".join(loadgen.encode_transfer(0, 0, b * chunk + i, b"bench-tg", True,
                                                       payload) for i in range(chunk)))
    forwarded = 0
    n = max(1, messages // chunk)
    t0 = time.process_time()
    for i in range(n):
        for cmd in client(blocks[i % 8]):
            data = getattr(cmd, "data", None)
            if data is not None:
                forwarded += 1
    cpu = time.process_time() - t0
    return {"us_per_msg": cpu / (n * chunk) * 1e6, "messages": n * chunk,
            "writes": forwarded, "transfers_in": conn.transfers_in}


def run_core(*, rounds: int, messages: int = 200_000) -> list[dict[str, Any]]:
    """The sans-IO comparison: each case and policy alternately, ``rounds`` times."""
    rows = []
    for case, options in CASES:
        size, to = options["size"], options.get("to")
        n = messages if size < 1000 else messages // 4
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in POLICIES}
        for _ in range(rounds):
            for name, path in POLICIES.items():
                samples[name].append(core_sample(path, size, to, n))
        med = {name: statistics.median(x["us_per_msg"] for x in v) for name, v in samples.items()}
        rows.append({
            "case": case, "us_per_msg": med,
            "cost_percent": {name: 100.0 * (med[name] / med["allow-all"] - 1.0)
                             for name in POLICIES if name != "allow-all"},
            "samples": samples,
        })
        print(f"  core {case}: " + ", ".join(f"{k} {v:.2f} µs/msg" for k, v in med.items()),
              flush=True)
    return rows


def render_core(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the sans-IO comparison."""
    lines = [
        "| traffic (core only) | allow-all µs/msg | limits-pattern | cost | limits-list | cost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        u, c = row["us_per_msg"], row["cost_percent"]
        lines.append(
            f"| {row['case']} | {u['allow-all']:.2f} | {u['limits-pattern']:.2f}"
            f" | {c['limits-pattern']:+.1f}% | {u['limits-list']:.2f} | {c['limits-list']:+.1f}% |"
        )
    return "\n".join(lines)


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
    print("limits: sans-IO core replay")
    core = run_core(rounds=max(args.rounds, 5))
    print(render(rows))
    print()
    print(render_core(core))
    return 0


if __name__ == "__main__":
    sys.exit(main())
