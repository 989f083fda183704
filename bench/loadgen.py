#!/usr/bin/env python3
"""Load generators for the proxy benchmarks (asyncio + uvloop), one mode per run.

Bench tooling, not part of the package. Each mode connects to ``--target HOST:PORT`` (the bench
peer directly, HAProxy or the proxy), does its work, and prints ONE JSON object on stdout:

``throughput``
    ``--conns`` connections (SASL ANONYMOUS, Open, Begin, Attach of a sender link with
    snd-settle-mode *settled*) each write pre-encoded pre-settled Transfer frames of a
    ``--size`` byte message (100 or 16384) as fast as link credit and the socket allow, in
    blocks of pre-encoded frames whose delivery-ids are patched in place (numpy when
    available). The rate is counted from the receiver's Flows (its delivery-count), so it is
    what the upstream peer received, over ``--seconds`` after ``--warmup``.
``latency``
    one connection with a sender and a receiver link; the peer echoes every message on the
    receiver link. One message in flight: the round-trip time of each is recorded (p50/p99).
``connrate``
    ``--concurrency`` loops each doing: TCP connect, SASL header + ANONYMOUS sasl-init, wait for
    the outcome, AMQP header + Open, wait for the Open, Close, wait for the Close, disconnect.
    Connections completed per second.
``hold``
    opens ``--conns`` connections through SASL, Open and Begin (waiting for each answer),
    prints ``{"ready": N}``, keeps them idle until a line (or EOF) on stdin, then closes them
    and prints the result. Used for memory per idle connection.

Every mode reports its own CPU (``resource.getrusage``: user+system seconds / wall seconds over
the measured window, 1.0 = one full core) and, for the pids given with ``--watch``, their CPU
over the same window (from ``/proc/PID/stat``). :func:`spawn` runs one or more loadgen
processes from the harness and merges their output.

Usage: ``.venv/bin/python bench/loadgen.py MODE --target 127.0.0.1:5672 [options]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER, FrameType
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Flow,
    Open,
    SaslInit,
    SaslOutcome,
    Source,
    Target,
    decode_performative,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import (  # noqa: E402  (bench/ is not a package)
    DELIVERY_ID_OFFSET,
    HDR,
    MAX_FRAME,
    U32,
    UINT_MASK,
    WINDOW,
    encode_transfer,
    flow_frame,
)

try:  # vectorised delivery-id patching; a plain loop otherwise
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

BENCH_DIR = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

SASL_INIT_ANONYMOUS = encode_frame(
    0, SaslInit(mechanism="ANONYMOUS", initial_response=b"bench").encode(), FrameType.SASL
)
OPEN_FRAME = encode_frame(0, Open(container_id="bench-loadgen", max_frame_size=MAX_FRAME,
                                  channel_max=255).encode())
BEGIN_FRAME = encode_frame(0, Begin(next_outgoing_id=0, incoming_window=WINDOW,
                                    outgoing_window=WINDOW, handle_max=255).encode())
CLOSE_FRAME = encode_frame(0, Close().encode())


# --- messages --------------------------------------------------------------------------------


def message(size: int, to: str | None = None) -> bytes:
    """Return an encoded message of exactly ``size`` bytes: one data section (after an optional
    properties section carrying ``to``, for anonymous-relay senders)."""
    head = b""
    if to is not None:
        addr = to.encode()
        props = b"\x40\x40\xa1" + bytes([len(addr)]) + addr  # message-id, user-id, to
        head = b"\x00\x53\x73\xc0" + bytes([len(props) + 1, 3]) + props
    short = size - len(head) - 5
    if short <= 255:
        return head + b"\x00\x53\x75\xa0" + bytes([short]) + b"m" * short
    n = size - len(head) - 8
    return head + b"\x00\x53\x75\xb0" + U32.pack(n) + b"m" * n


# --- process CPU -------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of process ``pid`` (all its threads), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_seconds() -> float:
    """This process's user+system CPU seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def system_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return (total - fields[3] - fields[4]) / CLK_TCK


class CpuWindow:
    """CPU use of this process and of watched pids between :meth:`start` and :meth:`stop`.

    Also reports ``machine`` (busy cores, all processes) and ``other`` (busy cores minus this
    process and the watched ones: whatever else ran on the machine meanwhile).
    """

    def __init__(self, watch: dict[str, int]) -> None:
        """``watch`` maps a label (``peer``, ``target``) to a pid."""
        self.watch = watch
        self.t0 = 0.0
        self.c0: dict[str, float | None] = {}
        self.result: dict[str, float | None] = {}

    def start(self) -> None:
        """Take the first reading."""
        self.t0 = time.perf_counter()
        self.c0 = {"loadgen": self_cpu_seconds(), "machine": system_busy_seconds()}
        self.c0.update({k: proc_cpu_seconds(p) for k, p in self.watch.items()})

    def stop(self) -> dict[str, float | None]:
        """Take the second reading; return CPU per label as a fraction of one core."""
        wall = time.perf_counter() - self.t0
        now: dict[str, float | None] = {"loadgen": self_cpu_seconds(),
                                        "machine": system_busy_seconds()}
        now.update({k: proc_cpu_seconds(p) for k, p in self.watch.items()})
        result: dict[str, float | None] = {}
        for k, v in now.items():
            v0 = self.c0.get(k)
            result[k] = None if v0 is None or v is None else round((v - v0) / wall, 3)
        ours = sum(v for k, v in result.items() if k != "machine" and v is not None)
        machine = result["machine"]
        result["other"] = None if machine is None else round(max(0.0, machine - ours), 3)
        self.result = result
        return result


# --- a small AMQP client protocol ----------------------------------------------------------------


class Client(asyncio.Protocol):
    """Client side of one connection: parses what the server sends, resolves :meth:`expect`.

    Subclasses override :meth:`on_flow` and :meth:`on_transfer`.
    """

    def __init__(self) -> None:
        """Create an unconnected client."""
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.mode = "header"
        self.want: type | None = None
        self.waiter: asyncio.Future[Any] | None = None
        self.lost = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail a pending :meth:`expect`."""
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def pause_writing(self) -> None:
        """The socket is full."""
        self.paused = True

    def resume_writing(self) -> None:
        """The socket drained."""
        self.paused = False
        self.on_resume()

    def on_resume(self) -> None:
        """Called when writing may continue."""

    def send(self, data: bytes) -> None:
        """Write ``data``."""
        assert self.transport is not None
        self.transport.write(data)

    async def expect(self, kind: type, timeout: float = 10.0) -> Any:
        """Wait for the next performative (or SASL frame) of class ``kind``; others are passed to
        the ``on_*`` hooks or ignored."""
        if self.lost:
            raise ConnectionError("connection lost")
        self.want = kind
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(self.waiter, timeout)
        finally:
            self.want = None
            self.waiter = None

    def data_received(self, data: bytes) -> None:
        """Parse protocol headers and frames."""
        buf: Any
        if self.buf:
            self.buf += data
            buf = self.buf
        else:
            buf = data
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            if self.mode == "header":
                self.mode = "sasl" if bytes(buf[pos : pos + 8]) == SASL_HEADER else "amqp"
                pos += 8
                continue
            size, doff, _ftype, ch = HDR.unpack_from(buf, pos)
            if end - pos < size:
                break
            body = pos + doff * 4
            fend = pos + size
            if body < fend:
                if buf[body + 2] == 0x14 and buf[body + 1] == 0x53:
                    self.on_transfer(buf, body, fend, ch)
                else:
                    perf, _ = decode_performative(bytes(buf[body:fend]))
                    if type(perf) is SaslOutcome:
                        self.mode = "header"
                    if type(perf) is Flow:
                        self.on_flow(perf)
                    if self.want is type(perf) and self.waiter is not None:
                        if not self.waiter.done():
                            self.waiter.set_result(perf)
            pos = fend
        if self.buf:
            del self.buf[:pos]
        elif pos < end:
            self.buf += data[pos:]

    def on_flow(self, perf: Flow) -> None:
        """A Flow arrived."""

    def on_transfer(self, buf: Any, body: int, fend: int, ch: int) -> None:
        """A Transfer arrived (``buf[body:fend]`` is its body)."""


async def connect(target: tuple[str, int], factory: Any, *, begin: bool) -> Any:
    """Connect and go through SASL ANONYMOUS and Open (and Begin when ``begin``).

    Returns:
        The protocol instance, with its handshake done.
    """
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(factory, target[0], target[1])
    client.send(SASL_HEADER + SASL_INIT_ANONYMOUS)
    outcome = await client.expect(SaslOutcome)
    if outcome.code is not None and int(outcome.code) != 0:
        raise ConnectionError(f"SASL outcome {outcome.code}")
    client.send(AMQP_HEADER + OPEN_FRAME)
    await client.expect(Open)
    if begin:
        client.send(BEGIN_FRAME)
        await client.expect(Begin)
    return client


def attach_frame(handle: int, *, sender: bool, address: str | None, name: str) -> bytes:
    """Return an Attach frame for a sender (snd-settle-mode settled) or a receiver link."""
    if sender:
        return encode_frame(0, Attach(
            name=name, handle=handle, role=False, snd_settle_mode=1, rcv_settle_mode=0,
            source=Source(address="bench-loadgen"), target=Target(address=address),
            initial_delivery_count=0,
        ).encode())
    return encode_frame(0, Attach(
        name=name, handle=handle, role=True, snd_settle_mode=1, rcv_settle_mode=0,
        source=Source(address=address), target=Target(address="bench-loadgen"),
    ).encode())


# --- throughput ------------------------------------------------------------------------------


class Sender(Client):
    """Writes pre-encoded pre-settled Transfers on handle 0 as fast as credit allows."""

    def __init__(self, payload: bytes, chunk: int) -> None:
        """Pre-encode ``chunk`` frames carrying ``payload``."""
        super().__init__()
        frames = [encode_transfer(0, 0, i, b"bench-tg", True, payload) for i in range(chunk)]
        self.frame_size = len(frames[0])
        self.block = bytearray(b"".join(frames))
        self.chunk = chunk
        self.ids: Any = None
        if np is not None:
            self.ids = np.ndarray((chunk,), dtype=">u4", buffer=self.block,
                                  offset=DELIVERY_ID_OFFSET, strides=(self.frame_size,))
        self.next_id = 0
        self.sent = 0
        self.limit = 0  # delivery-count the receiver allows us to reach (sent counted from 0)
        self.acked = 0  # deliveries the receiver reported (its delivery-count)
        self.running = False
        self.credited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_flow(self, perf: Flow) -> None:
        """Take the receiver's credit and delivery-count."""
        if perf.handle is None or int(perf.handle) != 0:
            return
        dc = 0 if perf.delivery_count is None else int(perf.delivery_count)
        lc = 0 if perf.link_credit is None else int(perf.link_credit)
        self.acked = dc  # initial delivery-count is 0; runs are far below 2**32
        self.limit = dc + lc
        if not self.credited.done():
            self.credited.set_result(None)
        self.pump()

    def on_resume(self) -> None:
        """Writing may continue."""
        self.pump()

    def _next_block(self) -> bytes:
        data = bytes(self.block)
        chunk = self.chunk
        if self.ids is not None:
            self.ids += chunk
        else:
            block, fs, pack = self.block, self.frame_size, U32.pack_into
            base = self.next_id + chunk
            for i in range(chunk):
                pack(block, DELIVERY_ID_OFFSET + i * fs, (base + i) & UINT_MASK)
        self.next_id += chunk
        return data

    def pump(self) -> None:
        """Write blocks while running, credit allows and the socket is not full."""
        transport = self.transport
        if transport is None or self.lost:
            return
        chunk = self.chunk
        while self.running and not self.paused and self.limit - self.sent >= chunk:
            transport.write(self._next_block())
            self.sent += chunk


def chunk_for(size: int) -> int:
    """Frames per pre-encoded block: ~32-64 KiB per write."""
    return max(2, min(256, 48 * 1024 // (size + 40)))


async def run_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """The ``throughput`` mode."""
    target = parse_target(args.target)
    payload = message(args.size, args.to)
    chunk = chunk_for(args.size)
    senders: list[Sender] = []
    for i in range(args.conns):
        s = await connect(target, lambda: Sender(payload, chunk), begin=True)
        address = None if args.anonymous else f"{args.address}{i}"
        s.send(attach_frame(0, sender=True, address=address, name=f"bench-snd-{os.getpid()}-{i}"))
        await s.expect(Attach)
        await asyncio.wait_for(s.credited, 10)
        senders.append(s)
    for s in senders:
        s.running = True
        s.pump()
    await asyncio.sleep(args.warmup)
    cpu = CpuWindow(parse_watch(args.watch))
    acked0 = sum(s.acked for s in senders)
    sent0 = sum(s.sent for s in senders)
    t0 = time.perf_counter()
    cpu.start()
    await asyncio.sleep(args.seconds)
    acked1 = sum(s.acked for s in senders)
    sent1 = sum(s.sent for s in senders)
    wall = time.perf_counter() - t0
    cpus = cpu.stop()
    lost = sum(1 for s in senders if s.lost)
    for s in senders:
        s.running = False
        if s.transport is not None:
            s.transport.abort()
    rate = (acked1 - acked0) / wall
    return {
        "mode": "throughput", "size": args.size, "conns": args.conns, "seconds": wall,
        "msgs_per_s": rate, "sent_per_s": (sent1 - sent0) / wall,
        "mib_per_s": rate * args.size / 1048576, "lost_connections": lost, "cpu": cpus,
    }


# --- latency -----------------------------------------------------------------------------------


class Echo(Client):
    """Sends one message on handle 0 and waits for its echo on handle 1."""

    def __init__(self) -> None:
        """Create the client."""
        super().__init__()
        self.echo: asyncio.Future[None] | None = None
        self.received = 0

    def on_transfer(self, buf: Any, body: int, fend: int, ch: int) -> None:
        """An echoed message: wake the waiting sender."""
        self.received += 1
        if self.echo is not None and not self.echo.done():
            self.echo.set_result(None)


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    idx = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[idx]


async def run_latency(args: argparse.Namespace) -> dict[str, Any]:
    """The ``latency`` mode."""
    loop = asyncio.get_running_loop()
    target = parse_target(args.target)
    payload = message(args.size)
    c: Echo = await connect(target, Echo, begin=True)
    c.send(attach_frame(0, sender=True, address=f"{args.address}echo", name="bench-req"))
    await c.expect(Attach)
    c.send(attach_frame(1, sender=False, address=f"{args.address}echo", name="bench-resp"))
    await c.expect(Attach)
    credit = 1000
    c.send(flow_frame(0, next_incoming_id=0, next_outgoing_id=0, handle=1, delivery_count=0,
                      link_credit=credit))
    rtts: list[float] = []
    did = 0
    cpu = CpuWindow(parse_watch(args.watch))
    perf_ns = time.perf_counter_ns
    measure_from = time.perf_counter() + args.warmup
    deadline = measure_from + args.seconds
    measuring = False
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        if not measuring and now >= measure_from:
            measuring = True
            cpu.start()
        frame = encode_transfer(0, 0, did, U32.pack(did), True, payload)
        did += 1
        c.echo = loop.create_future()
        t = perf_ns()
        c.send(frame)
        await asyncio.wait_for(c.echo, 10)
        if measuring:
            rtts.append((perf_ns() - t) / 1000.0)
        if c.received % (credit // 2) == 0:
            c.send(flow_frame(0, next_incoming_id=c.received, next_outgoing_id=did, handle=1,
                              delivery_count=c.received, link_credit=credit))
    cpus = cpu.stop()
    if c.transport is not None:
        c.transport.abort()
    rtts.sort()
    return {
        "mode": "latency", "size": args.size, "count": len(rtts),
        "p50_us": percentile(rtts, 0.5), "p99_us": percentile(rtts, 0.99),
        "mean_us": sum(rtts) / len(rtts) if rtts else float("nan"), "cpu": cpus,
    }


# --- connection rate -----------------------------------------------------------------------------


async def one_connection(target: tuple[str, int], close_wait: bool = True) -> None:
    """TCP connect, SASL ANONYMOUS, Open, Close, wait for Close (if ``close_wait``), disconnect."""
    c: Client = await connect(target, Client, begin=False)
    c.send(CLOSE_FRAME)
    if close_wait:
        await c.expect(Close, timeout=5.0)
    assert c.transport is not None
    c.transport.close()


async def run_connrate(args: argparse.Namespace) -> dict[str, Any]:
    """The ``connrate`` mode."""
    target = parse_target(args.target)
    loop = asyncio.get_running_loop()
    start = loop.time()
    t0 = start + args.warmup
    t1 = t0 + args.seconds
    done = 0
    errors: list[str] = []
    cpu = CpuWindow(parse_watch(args.watch))

    async def worker() -> None:
        """Open and close connections back to back until the window ends."""
        nonlocal done
        while loop.time() < t1:
            try:
                await one_connection(target, not args.no_close_wait)
            except (OSError, TimeoutError, AssertionError) as exc:
                errors.append(repr(exc))
                await asyncio.sleep(0.01)
                continue
            if t0 <= loop.time() < t1:
                done += 1

    async def window() -> None:
        """Read the CPU counters at the start and end of the measured window."""
        await asyncio.sleep(max(0.0, t0 - loop.time()))
        cpu.start()
        await asyncio.sleep(max(0.0, t1 - loop.time()))
        cpu.stop()

    await asyncio.gather(window(), *(worker() for _ in range(args.concurrency)))
    return {
        "mode": "connrate", "concurrency": args.concurrency, "seconds": args.seconds,
        "close_wait": not args.no_close_wait,
        "conns_per_s": done / args.seconds, "errors": len(errors), "first_errors": errors[:3],
        "cpu": cpu.result,
    }


# --- idle connections -------------------------------------------------------------------------


async def run_hold(args: argparse.Namespace) -> dict[str, Any]:
    """The ``hold`` mode: open ``--conns`` idle connections and keep them until told."""
    target = parse_target(args.target)
    sem = asyncio.Semaphore(args.concurrency)
    clients: list[Client] = []

    async def opener() -> None:
        """Open one idle connection."""
        async with sem:
            clients.append(await connect(target, Client, begin=True))

    t = time.perf_counter()
    await asyncio.gather(*(opener() for _ in range(args.conns)))
    print(json.dumps({"ready": len(clients), "open_seconds": time.perf_counter() - t}),
          flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    alive = sum(1 for c in clients if not c.lost)
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    await asyncio.sleep(0.2)
    return {"mode": "hold", "conns": args.conns, "alive_at_end": alive}


# --- command line and harness helpers -----------------------------------------------------------


def parse_target(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``."""
    host, _, port = text.rpartition(":")
    return host, int(port)


def parse_watch(text: str | None) -> dict[str, int]:
    """``label=pid,label=pid`` -> dict."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        if item:
            label, _, pid = item.partition("=")
            out[label] = int(pid)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["throughput", "latency", "connrate", "hold"])
    ap.add_argument("--target", required=True, metavar="HOST:PORT")
    ap.add_argument("--size", type=int, default=100, help="message size in bytes")
    ap.add_argument("--conns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--address", default="bench.q", help="address prefix of the links")
    ap.add_argument("--anonymous", action="store_true",
                    help="throughput: anonymous sender (no target address), 'to' in each message")
    ap.add_argument("--to", default=None, help="throughput: properties.to of every message")
    ap.add_argument("--no-close-wait", action="store_true",
                    help="connrate: disconnect right after sending Close")
    ap.add_argument("--watch", help="label=pid,... processes whose CPU to report")
    ap.add_argument("--cpus", help="comma-separated CPUs to pin to (sched_setaffinity)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one mode and print its JSON result."""
    args = build_parser().parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    runner = {"throughput": run_throughput, "latency": run_latency,
              "connrate": run_connrate, "hold": run_hold}[args.mode]
    try:
        import uvloop
        result = uvloop.run(runner(args))
    except ImportError:  # pragma: no cover
        result = asyncio.run(runner(args))
    print(json.dumps(result), flush=True)
    return 0


def spawn(mode: str, target: str, *, procs: int = 1, cpus: str | None = None,
          watch: dict[str, int] | None = None, timeout: float = 120.0,
          **options: Any) -> dict[str, Any]:
    """Run ``procs`` loadgen processes in parallel and merge their results (harness side).

    Args:
        mode: ``throughput``, ``latency`` or ``connrate``.
        target: ``HOST:PORT``.
        procs: processes to run; ``conns``/``concurrency`` are split between them.
        cpus: CPUs to pin them to.
        watch: label -> pid of processes whose CPU the first process reports.
        timeout: seconds before they are killed.
        options: further ``--option value`` pairs (``True`` for flags).

    Returns:
        The first process's result with the rates summed over processes, and
        ``cpu["loadgen"]`` replaced by the list of every process's CPU.
    """
    cmds = []
    for i in range(procs):
        cmd = [sys.executable, str(BENCH_DIR / "loadgen.py"), mode, "--target", target]
        opts = dict(options)
        for key in ("conns", "concurrency"):
            if key in opts:
                n = int(opts[key])
                opts[key] = n // procs + (1 if i < n % procs else 0)
        for key, value in opts.items():
            if value is None or value is False:
                continue
            cmd.append("--" + key.replace("_", "-"))
            if value is not True:
                cmd.append(str(value))
        if cpus:
            cmd += ["--cpus", cpus]
        if watch and i == 0:
            cmd += ["--watch", ",".join(f"{k}={v}" for k, v in watch.items())]
        cmds.append(cmd)
    running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True) for c in cmds]
    results = []
    try:
        for p in running:
            out, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"loadgen {mode} failed ({p.returncode}): {err.strip()[-2000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
                p.wait()
    merged = dict(results[0])
    for key in ("msgs_per_s", "sent_per_s", "mib_per_s", "conns_per_s", "errors",
                "lost_connections"):
        if key in merged:
            merged[key] = sum(r[key] for r in results)
    merged["cpu"] = dict(results[0].get("cpu") or {})
    loadgens = [(r.get("cpu") or {}).get("loadgen") for r in results]
    merged["cpu"]["loadgen"] = loadgens
    other = merged["cpu"].get("other")
    if other is not None:  # the other loadgen processes are ours, not "other"
        merged["cpu"]["other"] = round(max(0.0, other - sum(x or 0.0 for x in loadgens[1:])), 3)
    return merged


if __name__ == "__main__":
    sys.exit(main())
