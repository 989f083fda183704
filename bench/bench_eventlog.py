#!/usr/bin/env python3
"""Measure what event logging costs the event loop, and how fast the writer thread drains.

Bench tooling, not part of the package. Four figures, each the best of ``--repeat`` runs:

1. caller cost: ``to_record`` + ``EventLogWriter.submit`` per record, in the calling thread
   (the event loop's share), with a :class:`FileEventSink` on a temporary directory and a
   queue large enough that nothing is dropped; measured while the writer thread drains
   concurrently (it competes for the GIL, as in production under load) and with the writer
   idle (the caller's own work);
2. per-connection overhead: one ``connection_opened`` plus one ``connection_closed`` record
   (what every approved connection costs the loop), in microseconds;
3. paced: the caller's cost per record when records arrive at a steady ``--paced-rate`` in
   bursts of 100 with the production defaults (the writer lingers 20 ms and writes batches);
4. end-to-end: records per second from the first submit until ``stop()`` returned with
   everything on disk, and how many records a producer running flat out loses with the
   default ``max_queue`` (10 000) when it outruns the disk.

Usage: ``.venv/bin/python bench/bench_eventlog.py [--records N] [--repeat R]
[--paced-rate R] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionClosed
from amqp_policy_proxy.eventlog.records import to_record
from amqp_policy_proxy.eventlog.sinks import FileEventSink
from amqp_policy_proxy.eventlog.writer import EventLogWriter

WALL_OFFSET = 1795261320.0  # loop time 0 = 2026-11-21T11:42:00Z
WHO = {"vhost": "iot", "group": "devices", "remote_host": "10.20.30.40", "listener": "0.0.0.0:5672"}


def make_events(n_connections: int) -> list[ConnectionApproved | ConnectionClosed]:
    """Approve/close pairs for ``n_connections`` connections, 10 ms apart (crosses no hour)."""
    events: list[ConnectionApproved | ConnectionClosed] = []
    for i in range(n_connections):
        at = i * 0.01
        events.append(ConnectionApproved(conn_id=str(i), at=at, user=f"device-{i % 5000}",
                                         hostname="iot", **WHO))  # fmt: skip
        events.append(
            ConnectionClosed(
                conn_id=str(i), at=at + 0.005, user=f"device-{i % 5000}", **WHO,
                opened_at=at, duration_seconds=0.005, bytes_in=2_345, bytes_out=12_345,
                transfers_in=3, transfers_out=17, max_sessions=1, max_senders=1,
                max_receivers=1, close_reason="client_close",
            )
        )  # fmt: skip
    return events


def run_once(
    events: list, directory: Path, max_queue: int, *, concurrent: bool = True
) -> dict[str, float]:
    """Submit every event's record as fast as possible; return timings and counts.

    With ``concurrent`` False the writer thread starts only after the last submit, which
    isolates the caller's own cost from the writer thread's competition for the GIL.
    """
    sink = FileEventSink(directory, host="bench", pid=os.getpid())
    writer = EventLogWriter(sink, max_queue=max_queue)
    if concurrent:
        writer.start()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        for event in events:
            writer.submit(to_record(event, wall_offset=WALL_OFFSET))  # type: ignore[arg-type]
        submitted = time.perf_counter()
        if not concurrent:
            writer.start()
        writer.stop(timeout=120)
        done = time.perf_counter()
    finally:
        gc.enable()
    size = sum(p.stat().st_size for p in directory.rglob("*.jsonl"))
    return {
        "caller_s": submitted - start,
        "total_s": done - start,
        "written": writer.written,
        "dropped": writer.dropped,
        "bytes": size,
    }


def paced(events: list, directory: Path, rate: float, burst: int = 100) -> dict[str, float]:
    """Submit at ``rate`` records/s in bursts (an event loop's pattern); return the time the
    caller spent inside ``to_record`` + ``submit`` per record, and the drops."""
    sink = FileEventSink(directory, host="bench", pid=os.getpid())
    writer = EventLogWriter(sink)  # production defaults: max_queue 10 000, linger 20 ms
    writer.start()
    busy = 0.0
    period = burst / rate
    next_burst = time.perf_counter()
    for i in range(0, len(events), burst):
        delay = next_burst - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter()
        for event in events[i : i + burst]:
            writer.submit(to_record(event, wall_offset=WALL_OFFSET))  # type: ignore[arg-type]
        busy += time.perf_counter() - start
        next_burst += period
    writer.stop(timeout=120)
    return {"caller_us": busy / len(events) * 1e6, "dropped": writer.dropped}


def record_only(events: list) -> float:
    """Seconds to build the records without submitting them (to split the caller cost)."""
    start = time.perf_counter()
    for event in events:
        to_record(event, wall_offset=WALL_OFFSET)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run (even)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    parser.add_argument("--paced-rate", type=float, default=20_000.0,
                        help="records/s of the paced run (default 20 000 = 10 000 conn/s)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args(argv)
    # The flat-out run drops on purpose; its warnings would only add noise (and cost).
    logging.getLogger("amqp_policy_proxy.eventlog").setLevel(logging.ERROR)
    n = max(2, args.records // 2 * 2)
    events = make_events(n // 2)

    best_caller = best_total = best_record = best_alone = float("inf")
    dropped_flat_out = []
    bytes_per_record = 0.0
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            result = run_once(events, Path(tmp) / "a", max_queue=n + 1)  # nothing dropped
            assert result["written"] == n and result["dropped"] == 0, result
            best_caller = min(best_caller, result["caller_s"])
            best_total = min(best_total, result["total_s"])
            bytes_per_record = result["bytes"] / n
            alone = run_once(events, Path(tmp) / "c", max_queue=n + 1, concurrent=False)
            best_alone = min(best_alone, alone["caller_s"])
            flat_out = run_once(events, Path(tmp) / "b", max_queue=10_000)  # the default
            dropped_flat_out.append(flat_out["dropped"])
        best_record = min(best_record, record_only(events))

    rate = args.paced_rate
    paced_events = events[: min(len(events), int(rate * 2)) // 2 * 2]  # about 2 s of load
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        pacing = [paced(paced_events, Path(tmp) / str(i), rate) for i in range(args.repeat)]
    paced_us = min(p["caller_us"] for p in pacing)
    paced_dropped = max(p["dropped"] for p in pacing)

    per_record_us = best_caller / n * 1e6
    record_us = best_record / n * 1e6
    python = f"Python {platform.python_version()}, {platform.machine()}"
    print(f"event log benchmark: {n} records/run, best of {args.repeat}, "
          f"{python}, {os.cpu_count()} CPUs")  # fmt: skip
    print(f"  to_record + submit (caller) : {n / best_caller:12,.0f} records/s "
          f"({per_record_us:.2f} us/record; to_record alone {record_us:.2f} us)")  # fmt: skip
    print(f"  same, writer thread idle    : {n / best_alone:12,.0f} records/s "
          f"({best_alone / n * 1e6:.2f} us/record: no GIL competition)")  # fmt: skip
    print(f"  per connection (open+close) : {2 * per_record_us:12.2f} us on the event loop "
          f"({2 * best_alone / n * 1e6:.2f} us with the writer idle)")  # fmt: skip
    print(f"  paced at {rate:,.0f} records/s   : {paced_us:12.2f} us/record on the caller, "
          f"{2 * paced_us:.2f} us/connection, dropped {paced_dropped}")  # fmt: skip
    print(f"  end-to-end to disk          : {n / best_total:12,.0f} records/s "
          f"({bytes_per_record:.0f} bytes/record)")  # fmt: skip
    print(f"  flat-out producer, max_queue=10000: dropped {min(dropped_flat_out)}.."
          f"{max(dropped_flat_out)} of {n} records")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
