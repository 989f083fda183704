"""Data integrity under load: 50 connections stream through the proxy for a minute.

Each connection has a sender and a receiver. Its messages (sizes from 16 bytes to 120 KiB,
so many span several frames at the 16 KiB max-frame-size the policy imposes) go through the
proxy to a raw upstream that echoes every one back on the receiver, unsettled; the client
checks the echo byte for byte against what it generated, accepts it and settles it (settled
at the receiver), and only then does the upstream settle the original delivery with the
sender. At the end every message sent was echoed exactly once, byte-identical, and settled.
``INTEGRITY_SECONDS`` shortens the streaming phase (default 60).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from struct import Struct

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import (
    Accepted,
    AsyncClient,
    Disposition,
    Flow,
    Item,
    Open,
    RawUpstream,
    attach_receiver,
    attach_sender,
    begin,
    data_message,
    frame,
    transfer,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONNECTIONS = 50
SECONDS = float(os.environ.get("INTEGRITY_SECONDS", "60"))
WINDOW = 16
"""Unsettled messages in flight per connection."""
MAX_FRAME = 16384
CHUNK = MAX_FRAME - 64
RECEIVER_CREDIT = 64

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "test",
    "groups": {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*",
                       "maxFrameSize": MAX_FRAME, "maxSessions": 2}},
}]])], PolicySettings())

_ID = Struct(">II")


def body_for(conn: int, seq: int) -> bytes:
    """The deterministic body of message ``seq`` on connection ``conn``."""
    rng = random.Random(conn * 1_000_003 + seq)
    r = rng.random()
    size = (rng.randint(16, 2000) if r < 0.7 else rng.randint(2001, 30_000) if r < 0.95
            else rng.randint(30_001, 120_000))
    return _ID.pack(conn, seq) + rng.randbytes(size)


@dataclass
class Stats:
    """One connection's counts."""

    sent: int = 0
    echoed: int = 0
    settled: int = 0
    duplicates: int = 0
    corrupt: int = 0
    bytes_sent: int = 0
    multi_frame: int = 0
    seen: set[int] = field(default_factory=set)


class StreamingClient(AsyncClient):
    """A sender and a receiver on one connection, streaming until told to stop."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.stats = Stats()
        self.keep_items = False
        self.on_item = self._item
        self.credit = 0  # link credit the upstream gave our sender
        self.delivery_count = 0
        self.outstanding: dict[int, int] = {}  # delivery-id -> seq, until the upstream settles
        self.partial = bytearray()
        self.partial_id: int | None = None
        self.rx_credit_left = RECEIVER_CREDIT
        self.rx_delivery_count = 0
        self.wake = asyncio.Event()
        self.errors: list[str] = []

    def _item(self, item: Item) -> None:
        perf = item.perf
        if item.name == "Flow" and perf.handle is not None and int(perf.handle) == 0:
            self.credit = (int(perf.delivery_count or 0) + int(perf.link_credit or 0)
                           - self.delivery_count)
            self.wake.set()
        elif item.name == "Transfer" and int(perf.handle) == 1:
            self._echo_part(item)
        elif item.name == "Disposition" and perf.role:
            first = int(perf.first)
            last = first if perf.last is None else int(perf.last)
            for did in range(first, last + 1):
                if self.outstanding.pop(did, None) is not None:
                    self.stats.settled += 1
            self.wake.set()
        elif item.name in ("Close", "End", "Detach"):
            self.errors.append(f"{item.name} {item.condition} {item.description}")
            self.wake.set()

    def _echo_part(self, item: Item) -> None:
        perf = item.perf
        if self.partial_id is None:
            self.partial_id = int(perf.delivery_id)
        self.partial += item.payload
        if perf.more:
            return
        did, payload = self.partial_id, bytes(self.partial)
        self.partial, self.partial_id = bytearray(), None
        body = payload[8:]  # data section: 0x00 0x53 0x75 0xb0 + 4-byte length
        conn, seq = _ID.unpack_from(body)
        if conn != self.index or payload != data_message(body_for(conn, seq)):
            self.stats.corrupt += 1
        elif seq in self.stats.seen:
            self.stats.duplicates += 1
        else:
            self.stats.seen.add(seq)
            self.stats.echoed += 1
        out = [frame(0, Disposition(role=True, first=did, settled=True, state=Accepted()))]
        self.rx_delivery_count += 1
        self.rx_credit_left -= 1
        if self.rx_credit_left <= RECEIVER_CREDIT // 2:
            self.rx_credit_left = RECEIVER_CREDIT
            out.append(self._receiver_flow())
        self.send(*out)

    def _receiver_flow(self) -> bytes:
        return frame(0, Flow(next_incoming_id=None, incoming_window=100_000, next_outgoing_id=0,
                             outgoing_window=100_000, handle=1,
                             delivery_count=self.rx_delivery_count, link_credit=RECEIVER_CREDIT))

    async def start(self) -> None:
        """Handshake, session, links, receiver credit."""
        self.send(C.AMQP_HEADER, frame(0, Open(container_id=f"stream-{self.index}",
                                               hostname="test", max_frame_size=65536)))
        await self.wait_for(lambda i: i.name == "Open")
        self.send(begin(0, window=100_000), attach_receiver(0, 1, f"echo/{self.index}"),
                  attach_sender(0, 0, f"echo/{self.index}"), self._receiver_flow())

    async def stream(self, until: float) -> None:
        """Send while time remains, WINDOW unsettled at most, within the link credit."""
        seq = 0
        while time.monotonic() < until and not self.errors:
            if len(self.outstanding) >= WINDOW or self.credit <= 0:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 1.0)
                except TimeoutError:
                    pass
                continue
            payload = data_message(body_for(self.index, seq))
            did = self.delivery_count
            chunks = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)]
            self.send(*[transfer(0, 0, did, part, more=n < len(chunks) - 1, first=n == 0)
                        for n, part in enumerate(chunks)])
            self.outstanding[did] = seq
            self.delivery_count += 1
            self.credit -= 1
            self.stats.sent += 1
            self.stats.bytes_sent += len(payload)
            self.stats.multi_frame += len(chunks) > 1
            seq += 1
            if seq % 8 == 0:
                await asyncio.sleep(0)  # let the loop read between bursts

    async def drain(self, timeout: float) -> None:
        """Wait until every message sent was echoed and settled."""
        deadline = time.monotonic() + timeout
        while (self.outstanding or self.stats.echoed + self.stats.duplicates
               + self.stats.corrupt < self.stats.sent) and time.monotonic() < deadline:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), 0.5)
            except TimeoutError:
                pass


def test_fifty_connections_streaming_for_a_minute_lose_nothing():
    with RawUpstream(echo=True, credit=WINDOW * 4, send_frame_size=MAX_FRAME,
                     record=False) as upstream, ProxyThread(
            [("127.0.0.1", upstream.port)], policy=POLICY) as proxy:

        async def run() -> list[StreamingClient]:
            loop = asyncio.get_running_loop()
            clients = []
            for i in range(CONNECTIONS):
                _, c = await loop.create_connection(lambda i=i: StreamingClient(i),
                                                    "127.0.0.1", proxy.port)
                clients.append(c)
            await asyncio.gather(*[c.start() for c in clients])
            until = time.monotonic() + SECONDS
            await asyncio.gather(*[c.stream(until) for c in clients])
            await asyncio.gather(*[c.drain(60) for c in clients])
            for c in clients:
                assert c.transport is not None
                c.transport.close()
            return clients

        started = time.monotonic()
        clients = asyncio.run(run())
        elapsed = time.monotonic() - started
        errors = [e for c in clients for e in c.errors]
        assert errors == []
        total = Stats()
        for c in clients:
            s = c.stats
            assert s.sent > 0
            assert s.corrupt == 0 and s.duplicates == 0, (c.index, s)
            assert s.echoed == s.sent == s.settled, (c.index, s)
            assert s.seen == set(range(s.sent))
            total.sent += s.sent
            total.echoed += s.echoed
            total.settled += s.settled
            total.bytes_sent += s.bytes_sent
            total.multi_frame += s.multi_frame
        assert upstream.message_count == total.sent
        assert proxy.daemon.internal_errors == 0
        figures = {"connections": CONNECTIONS, "seconds": round(elapsed, 1),
                   "messages_sent": total.sent, "echoed_byte_identical": total.echoed,
                   "settled_at_receiver": total.settled, "duplicates": 0, "corrupt": 0,
                   "multi_frame_messages": total.multi_frame,
                   "mib_each_way": round(total.bytes_sent / 2**20, 1)}
        print(f"\nintegrity figures: {json.dumps(figures)}")
