#!/usr/bin/env python3
"""Microbenchmark of the sans-IO core: µs of CPU per frame, no sockets, no event loop.

Bench tooling, not part of the package. Pre-built byte streams are fed straight into one
:class:`~amqp_policy_proxy.core.connection.ProxyConnection` (``receive_data``) in reads of a
fixed size, so frames straddle reads as they do on a socket. What is measured is the
proxy's own work per frame (decoding, policy checks, building the ``SendData`` commands),
which is what limits its throughput on one core; the kernel's copies are not included.

Cases (each on a connection driven through SASL, Open, Begin and an Attach first):

``named-100`` / ``named-16k``
    pre-settled single-frame Transfers of a 100 B / 16 KiB message on a named sender link
    (the load of ``bench_throughput.py``).
``multi-16k``
    16 KiB messages split into 4 KiB frames (``more``), unsettled: the per-delivery size
    counting across frames.
``relay-100``
    an anonymous-relay sender whose 100 B messages carry ``properties.to``: the address rules
    are applied to every message (with ``--policy limits``, ``targetPattern``).
``router-100``
    the router-to-client direction: 100 B Transfers on a receiver link plus a Flow every 64.
``connection``
    one whole connection per iteration (SASL ANONYMOUS, Open both ways, Close both ways,
    transports lost), in µs per connection: the core's share of the connection rate.

Usage::

    .venv/bin/python bench/bench_core.py                  # every case, allow-all, 5 rounds
    .venv/bin/python bench/bench_core.py --cases named-100,relay-100 --policy limits
    .venv/bin/python bench/bench_core.py --policy qdr-default  # user-id checked per message
    .venv/bin/python bench/bench_core.py --profile named-100   # cProfile of one case
    AMQP_PROXY_NO_ACCEL=1 .venv/bin/python bench/bench_core.py  # without the C relay scanner

Each round replays every case once; the table shows the median (and the best) over rounds
of ``time.process_time`` per frame. Every forwarded stream is checked to be byte-identical to
the one fed in, so a fast path that drops or changes bytes shows up as an error, not a speed-up.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen  # noqa: E402  (bench/ is not a package)
from peer import MAX_FRAME, WINDOW, encode_transfer, flow_frame  # noqa: E402

from amqp_policy_proxy.amqp import accel  # noqa: E402
from amqp_policy_proxy.amqp.codec import symbol_array  # noqa: E402
from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER, FrameType  # noqa: E402
from amqp_policy_proxy.amqp.framing import encode_frame  # noqa: E402
from amqp_policy_proxy.amqp.performatives import (  # noqa: E402
    Attach,
    Begin,
    Close,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from amqp_policy_proxy.core.commands import SendData, Side  # noqa: E402
from amqp_policy_proxy.core.connection import ProxyConnection  # noqa: E402
from amqp_policy_proxy.ingress.peer import client_address  # noqa: E402
from amqp_policy_proxy.limits.connections import ConnectionLedger  # noqa: E402
from amqp_policy_proxy.limits.rates import RateLimits  # noqa: E402
from amqp_policy_proxy.policy.load import load_policy  # noqa: E402
from amqp_policy_proxy.policy.model import PolicySettings  # noqa: E402

POLICY_DIR = Path(__file__).resolve().parent / "policies"
POLICIES = {"allow-all": "allow-all.json", "limits": "limits.json",
            "limits-list": "limits-list.json", "qdr-default": "realrouter.json"}
"""``qdr-default`` is the real-router bench's policy: QDR's defaults, so ``allowUserIdProxy``
is false and every message's ``user-id`` is checked (the others allow user-id proxying)."""
CASES = ("named-100", "named-16k", "multi-16k", "relay-100", "router-100", "connection")
READ_SIZE = 65536
"""Bytes per ``receive_data`` call (uvloop reads up to 256 KiB; 64 KiB is a typical read)."""

_SASL_MECHS = SASL_HEADER + encode_frame(0, SaslMechanisms(
    sasl_server_mechanisms=symbol_array(["ANONYMOUS", "PLAIN"])).encode(), FrameType.SASL)
_SASL_OK = encode_frame(0, SaslOutcome(code=0).encode(), FrameType.SASL)
_ROUTER_OPEN = AMQP_HEADER + encode_frame(0, Open(container_id="router",
                                                  max_frame_size=MAX_FRAME).encode())
_CLOSE = encode_frame(0, Close().encode())


def _policy(name: str) -> Any:
    return load_policy(POLICY_DIR / POLICIES[name], PolicySettings(default_vhost="$default"))


#: The process's rate buckets, shared by every connection as in the daemon. The bench policies
#: set no rate: their links are not shaped, and what that costs the relay is what is measured.
RATES = RateLimits()


#: The client's address as the daemon hands it to the core: parsed once per peer address by the
#: daemon's peer cache (``Daemon.peer_address``), not once per connection.
PEER = client_address("127.0.0.1")


def _connection(policy: Any, conn_id: str = "bench") -> ProxyConnection:
    return ProxyConnection(conn_id, remote_host=PEER, listener="127.0.0.1:5672",
                           policy=policy, ledger=ConnectionLedger(1 << 30), now=0.0,
                           rates=RATES)


def _handshake(conn: ProxyConnection) -> None:
    c, b = Side.CLIENT, Side.ROUTER
    conn.receive_data(c, SASL_HEADER, 0.0)
    conn.router_connected(0.0)
    conn.receive_data(b, _SASL_MECHS, 0.0)
    conn.receive_data(c, loadgen.SASL_INIT_ANONYMOUS, 0.0)
    conn.receive_data(b, _SASL_OK, 0.0)
    conn.receive_data(c, AMQP_HEADER + loadgen.OPEN_FRAME, 0.0)
    conn.receive_data(b, _ROUTER_OPEN, 0.0)
    conn.receive_data(c, loadgen.BEGIN_FRAME, 0.0)
    conn.receive_data(b, encode_frame(0, Begin(remote_channel=0, next_outgoing_id=0,
                                               incoming_window=WINDOW,
                                               outgoing_window=WINDOW).encode()), 0.0)


def _sender(policy: Any, address: str | None) -> ProxyConnection:
    conn = _connection(policy)
    _handshake(conn)
    conn.receive_data(Side.CLIENT, loadgen.attach_frame(0, sender=True, address=address,
                                                        name="bench-core"), 0.0)
    conn.receive_data(Side.ROUTER, encode_frame(0, Attach(name="bench-core", handle=0, role=True,
                                                          snd_settle_mode=1).encode()), 0.0)
    conn.receive_data(Side.ROUTER, flow_frame(0, next_incoming_id=0, next_outgoing_id=0,
                                              handle=0, delivery_count=0,
                                              link_credit=1 << 30), 0.0)
    return conn


def _receiver(policy: Any) -> ProxyConnection:
    conn = _connection(policy)
    _handshake(conn)
    conn.receive_data(Side.CLIENT, loadgen.attach_frame(0, sender=False, address="bench.q0",
                                                        name="bench-rx"), 0.0)
    conn.receive_data(Side.ROUTER, encode_frame(0, Attach(
        name="bench-rx", handle=0, role=False, initial_delivery_count=0).encode()), 0.0)
    return conn


def _stream(frames: int, make: Callable[[int], bytes]) -> bytes:
    return b"".join(make(i) for i in range(frames))


def _reads(stream: bytes, read_size: int) -> list[bytes]:
    return [stream[i:i + read_size] for i in range(0, len(stream), read_size)]


def _replay(conn: ProxyConnection, side: Side, reads: list[bytes]) -> float:
    """Feed ``reads`` and drop the commands (as the relay does once written); CPU seconds."""
    receive = conn.receive_data
    t0 = time.process_time()
    for data in reads:
        receive(side, data, 0.0)
    return time.process_time() - t0


def _forwarded(conn: ProxyConnection, side: Side, reads: list[bytes]) -> bytes:
    """Feed ``reads``; return the bytes sent to the other side (the correctness check)."""
    other = Side.ROUTER if side is Side.CLIENT else Side.CLIENT
    sent = []
    for data in reads:
        for cmd in conn.receive_data(side, data, 0.0):
            if type(cmd) is SendData and cmd.side is other:
                sent.append(bytes(cmd.data))
    return b"".join(sent)


def case_stream(case: str, frames: int) -> tuple[bytes, int]:
    """Return (stream, frame count) for a Transfer case."""
    tag = b"bench-tg"
    if case == "named-100":
        payload = loadgen.message(100)
        return _stream(frames, lambda i: encode_transfer(0, 0, i, tag, True, payload)), frames
    if case == "named-16k":
        payload = loadgen.message(16384)
        return _stream(frames, lambda i: encode_transfer(0, 0, i, tag, True, payload)), frames
    if case == "relay-100":
        payload = loadgen.message(100, "bench.q0")
        return _stream(frames, lambda i: encode_transfer(0, 0, i, tag, True, payload)), frames
    if case == "multi-16k":
        payload = loadgen.message(16384)
        parts = [payload[j:j + 4096] for j in range(0, len(payload), 4096)]
        messages = max(1, frames // len(parts))

        def one(i: int) -> bytes:
            out = []
            for k, part in enumerate(parts):
                more = k < len(parts) - 1
                t = (Transfer(handle=0, delivery_id=i, delivery_tag=b"%d" % i, message_format=0,
                              more=more) if k == 0 else Transfer(handle=0, more=more))
                out.append(encode_frame(0, t.encode() + part))
            return b"".join(out)

        return _stream(messages, one), messages * len(parts)
    if case == "router-100":
        payload = loadgen.message(100)
        flow = flow_frame(0, next_incoming_id=0, next_outgoing_id=0, handle=0,
                          delivery_count=0, link_credit=1000)

        def rx(i: int) -> bytes:
            t = encode_transfer(0, 0, i, tag, True, payload)
            return t + flow if i % 64 == 63 else t

        return _stream(frames, rx), frames + frames // 64
    raise ValueError(case)


def run_case(case: str, policy: Any, frames: int, read_size: int) -> float:
    """One sample: µs of CPU per frame (per connection for ``connection``)."""
    if case == "connection":
        return _connections(policy, max(200, frames // 100))
    stream, n = case_stream(case, frames)
    reads = _reads(stream, read_size)
    side = Side.ROUTER if case == "router-100" else Side.CLIENT

    def fresh() -> ProxyConnection:
        if case == "router-100":
            return _receiver(policy)
        return _sender(policy, None if case == "relay-100" else "bench.q0")

    # correctness first, on a prefix of the stream (untimed): byte-for-byte forwarding of
    # every whole frame (the last one may be cut by the prefix)
    check = reads[: max(1, (4 << 20) // read_size)]
    expected = b"".join(check)
    sent = _forwarded(fresh(), side, check)
    if not expected.startswith(sent) or len(expected) - len(sent) > 20000:
        raise SystemExit(f"{case}: forwarded bytes differ from the input")
    cpu = _replay(fresh(), side, reads)
    return cpu / n * 1e6


def _connections(policy: Any, count: int) -> float:
    c, b = Side.CLIENT, Side.ROUTER
    client_close = _CLOSE
    t0 = time.process_time()
    for i in range(count):
        conn = _connection(policy, f"c{i}")
        _ = conn.receive_data(c, SASL_HEADER + loadgen.SASL_INIT_ANONYMOUS, 0.0)
        conn.router_connected(0.0)
        conn.receive_data(b, _SASL_MECHS, 0.0)
        conn.receive_data(b, _SASL_OK, 0.0)
        conn.receive_data(c, AMQP_HEADER + loadgen.OPEN_FRAME, 0.0)
        conn.receive_data(b, _ROUTER_OPEN, 0.0)
        conn.receive_data(c, client_close, 0.0)
        conn.receive_data(b, _CLOSE, 0.0)
        conn.connection_lost(b, 0.0)
        conn.connection_lost(c, 0.0)
        if not conn.finished:
            raise SystemExit("connection case: the connection did not finish")
    return (time.process_time() - t0) / count * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the cases, print a Markdown table (or a profile)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--policy", choices=sorted(POLICIES), default="allow-all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=100_000,
                    help="frames per 100 B sample (16 KiB cases use a tenth)")
    ap.add_argument("--read-size", type=int, default=READ_SIZE)
    ap.add_argument("--profile", metavar="CASE", help="cProfile one sample of CASE instead")
    args = ap.parse_args(argv)
    policy = _policy(args.policy)

    def frames_for(case: str) -> int:
        return args.frames // 10 if "16k" in case else args.frames

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run_case(args.profile, policy, frames_for(args.profile), args.read_size)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
        return 0
    cases = [c for c in args.cases.split(",") if c]
    samples: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for case in cases:
            samples[case].append(run_case(case, policy, frames_for(case), args.read_size))
    scanner = "C" if accel.scan is not None else f"none (built: {accel.scan_c is not None})"
    print(f"policy {args.policy}, {args.rounds} rounds, reads of {args.read_size} bytes, "
          f"relay scanner {scanner}")
    print("| case | unit | median | best |")
    print("|---|---|---:|---:|")
    for case in cases:
        unit = "µs/connection" if case == "connection" else "µs/frame"
        print(f"| {case} | {unit} | {statistics.median(samples[case]):.3f} "
              f"| {min(samples[case]):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
