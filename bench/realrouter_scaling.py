#!/usr/bin/env python3
"""Scaling with the work: connections/s and msgs/s at 1, 100 and 1,000 concurrent connections.

Bench tooling, not part of the package (issue 17, part 4). The same router, HAProxy and proxy
as ``bench/realrouter.py`` (the proxy as deployed, metrics and event log on; nothing pinned;
targets alternating, the order rotating each round), driven by ``bench/loadgen/amqpload.c``:

- ``connect-N``: N concurrent loops of connect + SASL ANONYMOUS + Open + Close for 5 s
  (``amqpload connect HOST:PORT N 5``): cycles/s, time to Open p50/p99, and the CPU µs per
  connection of the router and of the front process (HAProxy or the proxy);
- ``msgs-N``: N connections, each with one sender and one receiver on its own address
  (unsettled, accepted, 100 B, receiver credit 250), opened at most 50 at a time, counted
  over a 5 s window after 1 s of warm-up (``amqpload multi HOST:PORT N 5 100 --credit 250``): msgs/s and CPU µs per message.

If the proxy's CPU per connection or per message stays flat from 1 to 1,000 concurrent
connections, its cost does not grow with the number of connections. Writes
``bench/results/realrouter-scaling-latest.{md,json}`` and prints the table.

Usage::

    .venv/bin/python bench/realrouter_scaling.py                  # 3 rounds, ~8 minutes
    .venv/bin/python bench/realrouter_scaling.py --levels 1,100 --rounds 1
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realrouter as rr  # noqa: E402


def bench_connect(ctx: rr.Ctx, target: str, workers: int, seconds: float) -> dict[str, Any]:
    """``workers`` concurrent connect/Open/Close loops (see :func:`realrouter.bench_connect`)."""
    return rr.bench_connect(ctx, target, workers=workers, seconds=seconds)


def bench_multi(ctx: rr.Ctx, target: str, connections: int, seconds: float,
                credit: int = 250) -> dict[str, Any]:
    """``connections`` connections each sending 100 B messages to itself through the target."""
    sampler = ctx.sampler().start()
    c = rr.Client(ctx.exe, ["multi", ctx.stack.address(target), str(connections), str(seconds),
                            "100", "--credit", str(credit), "--warmup", "1",
                            "--vhost", rr.VHOST, "--address-prefix", ctx.next_address("m")])
    sampler.add("client", c.pid)
    finished = rr._finish([c], sampler, seconds + 120)
    res: dict[str, Any] = {"ok": False, "connections": connections, "seconds": seconds}
    try:
        r = c.result()
    except (RuntimeError, ValueError) as exc:
        res["error"] = str(exc)
        res["cpu"] = sampler.between()
        return res
    res.update({"ok": finished and not r["errors"] and r["attached"] == connections,
                "msgs_per_s": r["msgs_per_s"], "received": r["received_in_window"],
                "attached": r["attached"], "failed": r["failed"],
                "cpu": sampler.between(r["t_start"], r["t_end"]),
                "errors": r["errors"], "first_error": r["first_error"]})
    return res


def per_op(sample: dict[str, Any], role: str) -> float | None:
    """CPU µs of ``role`` per connection or message in one sample."""
    rate = sample.get("conn_per_s") or sample.get("msgs_per_s")
    cpu = (sample.get("cpu") or {}).get(role)
    if not sample.get("ok") or not rate or cpu is None:
        return None
    return cpu / rate * 1e6


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per bench and target: median rate, time to Open, CPU µs per op, other load."""
    out: dict[str, Any] = {}
    for bench, per_t in results.items():
        out[bench] = {}
        for target, samples in per_t.items():
            front = rr.Stack.front(target)
            rates = [s.get("conn_per_s") or s.get("msgs_per_s") for s in samples if s.get("ok")]
            row: dict[str, Any] = {
                "rate": rr.median_minmax(rates),
                "front_us": rr.median_minmax([per_op(s, front) for s in samples]),
                "router_us": rr.median_minmax([per_op(s, "router") for s in samples]),
                "other_max": max((s.get("cpu") or {}).get("other", 0.0) for s in samples),
                "front_cores": statistics.median(
                    [(s.get("cpu") or {}).get(front, 0.0) for s in samples]),
            }
            opens = [s["open_ms"]["p50"] for s in samples if s.get("ok") and "open_ms" in s]
            if opens:
                row["open_p50_ms"] = statistics.median(opens)
                row["open_p99_ms"] = statistics.median(
                    [s["open_ms"]["p99"] for s in samples if s.get("ok") and "open_ms" in s])
            out[bench][target] = row
    return out


def render(doc: dict[str, Any]) -> str:
    """The scaling table as Markdown."""
    meta, summ = doc["meta"], doc["summary"]
    lines = [
        f"Run {meta['started']} – {meta['finished']}, proxy at "
        f"{meta['proxy'].get('commit', '?')}{' (dirty)' if meta['proxy'].get('dirty') else ''}; "
        f"{meta['rounds']} rounds, targets alternating; load average {meta['loadavg_start']} "
        f"→ {meta['loadavg_end']}. Medians (min–max); µs = CPU µs per connection (connect) "
        "or per message (msgs) of the router and of the front process:",
        "",
        "| benchmark | target | rate /s | to Open p50 / p99, ms | router µs | front µs "
        "| front cores | other (max) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for bench, per_t in summ.items():
        for target in rr.TARGETS:
            if target not in per_t:
                continue
            r = per_t[target]
            rate = r["rate"]
            opens = (f"{r['open_p50_ms']:.2f} / {r['open_p99_ms']:.1f}"
                     if "open_p50_ms" in r else "-")
            front = "-" if target == "direct" else (
                f"{rr._fmt(r['front_us']['median'])} ({rr._fmt(r['front_us']['min'])}–"
                f"{rr._fmt(r['front_us']['max'])})")
            cores = "-" if target == "direct" else f"{r['front_cores']:.2f}"
            lines.append(
                f"| {bench} | {target} | {rr._fmt(rate['median'], 'msg/s')} "
                f"({rr._fmt(rate['min'], 'msg/s')}–{rr._fmt(rate['max'], 'msg/s')}) | {opens} | "
                f"{rr._fmt(r['router_us']['median'])} | {front} | "
                f"{cores} | "
                f"{r['other_max']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the scaling benchmark; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--levels", default="1,100,1000", help="concurrent connections")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--benches", default="connect,msgs")
    ap.add_argument("--targets", default=",".join(rr.TARGETS))
    ap.add_argument("--proxy-bin", type=Path,
                    default=Path(sys.executable).parent / "amqp-policy-proxy")
    ap.add_argument("--proxy-pythonpath", default=None)
    ap.add_argument("--qdr-env", type=Path, default=rr.DEFAULT_QDR_ENV)
    ap.add_argument("--quiet-wait", type=float, default=15.0)
    ap.add_argument("--quiet-threshold", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=rr.RESULTS_DIR)
    a = ap.parse_args(argv)
    try:
        rr.check_tools()
        qenv = rr.find_qdr(a.qdr_env)
        exe = rr.loadgen_binary(qenv)
    except rr.Unavailable as exc:
        print(f"realrouter_scaling: cannot run: {exc.message}", file=sys.stderr)
        return 2
    rr.raise_nofile()
    targets = [t for t in a.targets.split(",") if t]
    levels = [int(x) for x in a.levels.split(",") if x]
    rundir = Path(tempfile.mkdtemp(prefix="realrouter-scaling-"))
    print(f"run directory: {rundir}", flush=True)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    stack = rr.Stack(qenv, a.proxy_bin, rundir, targets, a.proxy_pythonpath)
    ctx = rr.Ctx(exe=exe, stack=stack)
    meta: dict[str, Any] = {
        **rr.machine_info(), "started": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "loadavg_start": rr.loadavg(), "rounds": a.rounds, "levels": levels,
        "proxy": rr.proxy_source(a.proxy_bin, a.proxy_pythonpath) if "proxy" in targets else {},
        "argv": sys.argv,
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    interrupted = False
    try:
        stack.start()
        for kind in [b for b in a.benches.split(",") if b]:
            for n in levels:
                bench = f"{kind}-{n}"
                results[bench] = {}
                for rnd in range(a.rounds):
                    order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
                    for target in order:
                        quiet = rr.wait_quiet(stack, a.quiet_wait, a.quiet_threshold)
                        if kind == "connect":
                            r = bench_connect(ctx, target, n, a.seconds)
                        else:
                            r = bench_multi(ctx, target, n, a.seconds)
                        r.update({"round": rnd + 1, **quiet, "loadavg": rr.loadavg()})
                        results[bench].setdefault(target, []).append(r)
                        other = (r.get("cpu") or {}).get("other", 0.0)
                        print(f"{bench:<13} round {rnd + 1} {target:<8} ok={r.get('ok')} "
                              f"other={other:.2f} rate="
                              f"{r.get('conn_per_s') or r.get('msgs_per_s')} "
                              f"front_us={per_op(r, rr.Stack.front(target))} "
                              f"{r.get('first_error') or r.get('error') or ''}", flush=True)
                        time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: stopping services", file=sys.stderr)
    finally:
        stack.stop()
        rr.stop_all()
    meta["finished"] = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    meta["loadavg_end"] = rr.loadavg()
    doc = {"meta": meta, "summary": summarize(results), "samples": results}
    md = render(doc)
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for name in (f"realrouter-scaling-{stamp}", "realrouter-scaling-latest"):
        (a.out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
        (a.out / f"{name}.md").write_text(md)
    print()
    print(md)
    return 1 if interrupted else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        rr.stop_all()
