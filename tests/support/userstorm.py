"""A connect storm from one account (tests): THREADS clients of one user, each in a loop,
for SECONDS, against one or more proxy ports.

Run as ``python -m tests.support.userstorm USER VHOST THREADS SECONDS PORT [PORT ...]`` (its
own process, so its event loop does not share a GIL with the proxies). Each client in turn:
connects, runs SASL PLAIN (password ``secret``), sends the AMQP header and an Open, and then
one of three things, in rotation: waits for the answer, holds an admitted connection 0-0.3 s
and closes it (an AMQP Close), holds it and resets the socket (SO_LINGER 0), or drops the
socket with the Open still pending. An admitted connection is *open* from the client's point
of view from the moment its Open arrives to the moment the client starts to close it, so
the peak number open at once, seen from the clients, never exceeds what the proxies
admitted at once.

Prints one JSON object: ``attempts``, ``admitted``, ``denied``, ``dropped`` (Opens abandoned
on purpose), ``errors``, ``peak`` (the most admitted connections open at once) and
``open_ms`` (p50 / p99 milliseconds from sending the Open to the answer).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import sys
import time
from typing import Any

from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER
from amqp_policy_proxy.amqp.performatives import Close, Open
from tests.support.rawpeer import FrameParser, frame, sasl_plain_init


async def _until(reader: asyncio.StreamReader, parser: FrameParser, items: list[Any],
                 pred: Any, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(pred(i) for i in items):
        left = deadline - loop.time()
        if left <= 0:
            return False
        try:
            data = await asyncio.wait_for(reader.read(65536), left)
        except TimeoutError:
            return False
        if not data:
            return False
        items.extend(parser.feed(data))
    return True


def _abort(writer: asyncio.StreamWriter) -> None:
    """Reset the connection (RST, no FIN)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def client(n: int, ports: list[int], user: str, vhost: str, until: float,
                 stats: dict[str, Any], spans: list[tuple[float, float]],
                 waits: list[float]) -> None:
    """One client's loop (``n`` picks its first way out and its first port)."""
    rng = random.Random(n)
    i = n
    while time.monotonic() < until:
        i += 1
        port = ports[i % len(ports)]
        way = i % 4  # 0 wait and close, 1 close, 2 reset, 3 drop with the Open pending
        stats["attempts"] += 1
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 10)
            writer.write(SASL_HEADER + sasl_plain_init(user, "secret"))
            parser = FrameParser()
            items: list[Any] = []
            if not await _until(reader, parser, items, lambda x: x.name == "SaslOutcome", 10):
                stats["errors"] += 1
                continue
            items.clear()
            sent = time.monotonic()
            writer.write(AMQP_HEADER + frame(0, Open(container_id=f"storm-{n}-{i}",
                                                     hostname=vhost)))
            if way == 3:
                await asyncio.sleep(rng.random() * 0.002)
                stats["dropped"] += 1
                _abort(writer)
                writer = None
                continue
            if not await _until(reader, parser, items, lambda x: x.name == "Open", 10):
                stats["errors"] += 1
                continue
            await _until(reader, parser, items, lambda x: x.name == "Close", 0.02)
            waits.append(time.monotonic() - sent)
            if any(x.name == "Close" for x in items):
                stats["denied"] += 1
                continue
            stats["admitted"] += 1
            opened = time.monotonic()
            await asyncio.sleep(rng.random() * 0.3)
            spans.append((opened, time.monotonic()))
            if way == 2:
                _abort(writer)
                writer = None
            else:
                writer.write(frame(0, Close()))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            stats["errors"] += 1
        finally:
            if writer is not None:
                writer.close()


def peak(spans: list[tuple[float, float]]) -> int:
    """The most spans open at once (a span ending at an instant ends before one starts)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans],
                    key=lambda e: (e[0], e[1]))
    top = now = 0
    for _, d in events:
        now += d
        top = max(top, now)
    return top


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` in milliseconds (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


async def storm(user: str, vhost: str, threads: int, seconds: float,
                ports: list[int]) -> dict[str, Any]:
    """Run the storm; the figures of the module docstring."""
    stats: dict[str, Any] = {"attempts": 0, "admitted": 0, "denied": 0, "dropped": 0,
                             "errors": 0}
    spans: list[tuple[float, float]] = []
    waits: list[float] = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(client(n, ports, user, vhost, until, stats, spans, waits)
                           for n in range(threads)))
    stats["peak"] = peak(spans)
    stats["open_ms"] = {"p50": pct(waits, 0.5), "p99": pct(waits, 0.99)}
    return stats


def main(argv: list[str]) -> None:
    """``USER VHOST THREADS SECONDS PORT [PORT ...]``."""
    user, vhost, threads, seconds, *ports = argv
    print(json.dumps(asyncio.run(storm(user, vhost, int(threads), float(seconds),
                                       [int(p) for p in ports]))))


if __name__ == "__main__":
    main(sys.argv[1:])
