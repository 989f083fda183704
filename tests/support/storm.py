"""A connection storm: AMQP connection attempts at a fixed rate from one host (tests).

Run as ``python -m tests.support.storm PORT HOSTNAME RATE SECONDS`` (its own process, so its
event loop does not share a GIL with the proxy under test). Every 1/RATE seconds a new attempt
starts: TCP connect, SASL ANONYMOUS (pipelined with the SASL header), the AMQP header and an
Open for HOSTNAME; an attempt is *admitted* when the peer answers with an Open and no Close,
*denied* when the Open comes with a Close (its condition is recorded), else an error. Every
connection is closed once classified. Prints one JSON object: ``attempts``, ``admitted``,
``denied`` (condition -> count), ``errors``, ``elapsed`` (seconds from the first attempt to the
last start), ``answered`` (seconds from the first attempt to the first and to the last answer to
an Open: the span over which the peer decided).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER
from amqp_policy_proxy.amqp.performatives import Close, Open, SaslInit
from tests.support.rawpeer import FrameParser, frame

#: Seconds an attempt waits for a Close after the Open (the proxy writes its denial's Open and
#: Close together: they arrive in one read).
CLOSE_WAIT = 0.05


async def attempt(port: int, hostname: str, stats: dict[str, Any]) -> None:
    """One connection attempt, classified into ``stats``."""
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        init = frame(0, SaslInit(mechanism="ANONYMOUS", initial_response=b"storm"),
                     ftype=1)
        writer.write(SASL_HEADER + init)
        parser = FrameParser()
        items: list[Any] = []

        async def until(pred: Any, timeout: float) -> bool:
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

        if not await until(lambda i: i.name == "SaslOutcome", 10):
            stats["errors"] += 1
            return
        writer.write(AMQP_HEADER + frame(0, Open(container_id="storm", hostname=hostname)))
        if not await until(lambda i: i.name == "Open", 10):
            stats["errors"] += 1
            return
        answered = asyncio.get_running_loop().time()
        stats["answers"].append(answered)
        await until(lambda i: i.name == "Close", CLOSE_WAIT)
        close = next((i for i in items if i.name == "Close"), None)
        if close is None:
            stats["admitted"] += 1
            writer.write(frame(0, Close()))
        else:
            stats["denied"][str(close.condition)] += 1
    except (OSError, TimeoutError):
        stats["errors"] += 1
    finally:
        if writer is not None:
            writer.close()


async def storm(port: int, hostname: str, rate: float, seconds: float) -> dict[str, Any]:
    """Start ``rate`` attempts per second for ``seconds``; wait for all of them."""
    loop = asyncio.get_running_loop()
    stats: dict[str, Any] = {"attempts": 0, "admitted": 0, "denied": Counter(), "errors": 0,
                             "answers": []}
    tasks = []
    start = loop.time()
    n = int(rate * seconds)
    for k in range(n):
        delay = start + k / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stats["attempts"] += 1
        tasks.append(asyncio.ensure_future(attempt(port, hostname, stats)))
    stats["elapsed"] = loop.time() - start
    await asyncio.gather(*tasks)
    stats["denied"] = dict(stats["denied"])
    answers = stats.pop("answers")
    stats["answered"] = [min(answers) - start, max(answers) - start] if answers else None
    return stats


def main(argv: list[str]) -> int:
    """``PORT HOSTNAME RATE SECONDS``: run the storm, print its figures as JSON."""
    port, hostname, rate, seconds = int(argv[0]), argv[1], float(argv[2]), float(argv[3])
    print(json.dumps(asyncio.run(storm(port, hostname, rate, seconds))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
