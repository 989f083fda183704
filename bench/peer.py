#!/usr/bin/env python3
"""A fast, minimal AMQP 1.0 upstream peer for the proxy benchmarks (asyncio + uvloop).

Bench tooling, not part of the package, and not a broker: it stores nothing. It accepts
SASL (ANONYMOUS and PLAIN, always ``ok``) or a plain AMQP header, answers Open, Begin, Attach
(the same link with the roles flipped), Detach, End and Close, and for every link on which the
client sends it grants ``--credit`` and replenishes it once half of it is used. Incoming
Transfers are counted and discarded:

- on links attached with ``snd-settle-mode`` *settled* (what the load generator uses) only the
  frame header and the Transfer's handle are read, with ``struct``/indexing, per frame;
- on other links the Transfer header is read and unsettled deliveries are accepted and settled
  with one batched Disposition per read;
- when the client also attached a receiving link on the session, every message received is
  echoed on it (request/response latency), as long as the client gave credit.

Non-transfer frames are decoded with :func:`amqp_policy_proxy.amqp.performatives.
decode_performative`; replies are pre-encoded where they do not depend on the request.
The peer's own Transfer encoder (:func:`encode_transfer`) is shared with ``loadgen.py``.

Usage: ``.venv/bin/python bench/peer.py [--host 127.0.0.1] [--port 0] [--credit 4000]
[--cpus 0]``. It prints ``listening HOST:PORT`` on stdout once it accepts connections and runs
until SIGTERM/SIGINT (with ``--exit-on-stdin-eof``, also when its stdin closes, so that it
never outlives the harness).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
from struct import Struct
from typing import Any

from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.constants import AMQP_HEADER, SASL_HEADER, FrameType
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    decode_performative,
)
from amqp_policy_proxy.amqp.transfer import read_transfer

HDR = Struct(">IBBH")
U32 = Struct(">I")
#: The max-frame-size both bench peers advertise: a 16 KiB message always fits one frame.
MAX_FRAME = 1024 * 1024
#: Session windows (in frames) both bench peers advertise: never the limiting factor.
WINDOW = 0x7FFFFFFF
UINT_MASK = 0xFFFFFFFF

SASL_MECHANISMS_FRAME = encode_frame(
    0, SaslMechanisms(sasl_server_mechanisms=symbol_array(["ANONYMOUS", "PLAIN"])).encode(),
    FrameType.SASL,
)
SASL_OK_FRAME = encode_frame(0, SaslOutcome(code=0).encode(), FrameType.SASL)
OPEN_FRAME = encode_frame(
    0, Open(container_id="bench-peer", max_frame_size=MAX_FRAME, channel_max=0xFFFF).encode()
)
CLOSE_FRAME = encode_frame(0, Close().encode())


# --- a hand-written Transfer encoder (shared with loadgen.py) -------------------------------


def transfer_prefix(handle: int, delivery_id: int, tag: bytes, settled: bool) -> bytes:
    """Return the encoded Transfer performative (no frame header) with fixed-width fields.

    handle and delivery-id are always ``uint`` with the 4-byte encoding (0x70), so that a
    pre-encoded frame can have its delivery-id patched in place at :data:`DELIVERY_ID_OFFSET`.

    Args:
        handle: the link handle.
        delivery_id: the delivery-id (modulo 2**32).
        tag: the delivery-tag (at most 255 bytes).
        settled: pre-settled (True) or not.
    """
    fields = (
        b"\x70" + U32.pack(handle)
        + b"\x70" + U32.pack(delivery_id & UINT_MASK)
        + b"\xa0" + bytes([len(tag)]) + tag
        + b"\x43"  # message-format 0
        + (b"\x41" if settled else b"\x42")
    )
    return b"\x00\x53\x14\xc0" + bytes([len(fields) + 1, 5]) + fields


#: Offset of the delivery-id's 4 bytes in a frame built by :func:`encode_transfer`.
DELIVERY_ID_OFFSET = 8 + 3 + 3 + 5 + 1


def encode_transfer(channel: int, handle: int, delivery_id: int, tag: bytes, settled: bool,
                    payload: bytes) -> bytes:
    """Return a whole Transfer frame (header, performative, message payload).

    Args:
        channel: the sender's outgoing channel.
        handle, delivery_id, tag, settled: see :func:`transfer_prefix`.
        payload: the encoded message (sections).
    """
    body = transfer_prefix(handle, delivery_id, tag, settled)
    return HDR.pack(8 + len(body) + len(payload), 2, 0, channel) + body + payload


def flow_frame(channel: int, *, next_incoming_id: int, next_outgoing_id: int,
               handle: int | None = None, delivery_count: int | None = None,
               link_credit: int | None = None) -> bytes:
    """Return an encoded Flow frame with :data:`WINDOW` session windows."""
    return encode_frame(channel, Flow(
        next_incoming_id=next_incoming_id & UINT_MASK, incoming_window=WINDOW,
        next_outgoing_id=next_outgoing_id & UINT_MASK, outgoing_window=WINDOW,
        handle=handle, delivery_count=None if delivery_count is None else delivery_count
        & UINT_MASK, link_credit=link_credit,
    ).encode())


# --- the peer ------------------------------------------------------------------------------


class _Link:
    __slots__ = ("handle", "initial", "count", "flowed", "settled_mode", "credit", "sent")

    def __init__(self, handle: int, initial: int, settled_mode: bool) -> None:
        self.handle = handle
        self.initial = initial  # the sender's initial delivery-count
        self.count = 0  # transfers received (incoming) on this link
        self.flowed = 0  # self.count when credit was last granted
        self.settled_mode = settled_mode
        self.credit = 0  # outgoing links: credit the client gave us
        self.sent = 0  # outgoing links: deliveries sent


class _Session:
    __slots__ = ("channel", "next_incoming", "next_outgoing", "links_in", "link_out",
                 "disp_first", "disp_last")

    def __init__(self, channel: int, next_incoming: int) -> None:
        self.channel = channel
        self.next_incoming = next_incoming
        self.next_outgoing = 0
        self.links_in: dict[int, _Link] = {}
        self.link_out: _Link | None = None
        self.disp_first: int | None = None
        self.disp_last = 0


class PeerConnection(asyncio.Protocol):
    """One client (or proxy, or HAProxy) connection to the bench peer."""

    __slots__ = ("server", "transport", "buf", "mode", "sessions", "slow", "out", "closed")

    def __init__(self, server: PeerServer) -> None:
        """Create the protocol; ``server`` carries the settings and counters."""
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.mode = "header"  # header | sasl | amqp | closed
        self.sessions: dict[int, _Session] = {}
        self.slow = False  # some link needs the Transfer header read (unsettled or echo)
        self.out: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]
        self.server.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection."""
        self.closed = True
        self.server.connections -= 1

    def data_received(self, data: bytes) -> None:
        """Consume whole protocol headers and frames; answer with one write."""
        buf: Any
        if self.buf:
            self.buf += data
            buf = self.buf
        else:
            buf = data
        try:
            pos = self._process(buf, len(buf))
        except Exception as exc:  # a malformed peer: this is a bench tool, just hang up
            print(f"peer: closing a connection: {exc!r}", file=sys.stderr)
            self.mode = "closed"
            if self.transport is not None:
                self.transport.abort()
            return
        if self.buf:
            del self.buf[:pos]
        elif pos < len(data):
            self.buf += data[pos:]
        if self.out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self.out))
            self.out.clear()

    # --- parsing -----------------------------------------------------------------------------

    def _process(self, buf: Any, end: int) -> int:
        pos = 0
        while pos < end:
            mode = self.mode
            if mode == "amqp":
                return pos + self._amqp(memoryview(buf)[pos:end] if pos else buf, end - pos)
            if mode == "closed":
                return end
            if end - pos < 8:
                return pos
            if mode == "header":
                header = bytes(buf[pos : pos + 8])
                if header == SASL_HEADER:
                    self.out.append(SASL_HEADER + SASL_MECHANISMS_FRAME)
                    self.mode = "sasl"
                elif header == AMQP_HEADER:
                    self.out.append(AMQP_HEADER)
                    self.mode = "amqp"
                else:
                    raise ValueError(f"unexpected protocol header {header!r}")
                pos += 8
                continue
            # sasl
            size, doff, _ftype, _ch = HDR.unpack_from(buf, pos)
            if size < 8 or size > 65536:
                raise ValueError("bad SASL frame")
            if end - pos < size:
                return pos
            body = pos + doff * 4
            perf, _ = decode_performative(bytes(buf[body : pos + size]))
            if isinstance(perf, SaslInit):
                self.out.append(SASL_OK_FRAME)
                self.mode = "header"
            pos += size
        return pos

    def _amqp(self, buf: Any, end: int) -> int:
        """The hot loop: walk frame headers, count Transfers by (channel, handle)."""
        pos = 0
        counts: dict[int, int] = {}
        slow = self.slow
        unpack = HDR.unpack_from
        while end - pos >= 8:
            size, doff, _ftype, ch = unpack(buf, pos)
            if size < 8 or size > MAX_FRAME:
                raise ValueError(f"bad frame size {size}")
            fend = pos + size
            if fend > end:
                break
            body = pos + doff * 4
            if body < fend:
                if buf[body + 2] == 0x14 and buf[body + 1] == 0x53:
                    if slow:
                        self._transfer(buf, body, fend, ch, counts)
                    else:
                        p = body + 6 if buf[body + 3] == 0xC0 else body + 12
                        c = buf[p]
                        h = 0 if c == 0x43 else buf[p + 1] if c == 0x52 else U32.unpack_from(
                            buf, p + 1)[0]
                        key = (ch << 32) | h
                        counts[key] = counts.get(key, 0) + 1
                else:
                    perf, _ = decode_performative(bytes(buf[body:fend]))
                    self._perform(perf, ch)
                    slow = self.slow
                    if self.mode == "closed":
                        return end
            pos = fend
        if counts:
            self._credit(counts)
        if slow:
            self._dispositions()
        return pos

    def _transfer(self, buf: Any, body: int, fend: int, ch: int, counts: dict[int, int]) -> None:
        hdr = read_transfer(buf, body, fend)
        key = (ch << 32) | hdr.handle
        counts[key] = counts.get(key, 0) + 1
        session = self.sessions.get(ch)
        if session is None:
            return
        if not hdr.settled and hdr.delivery_id is not None:
            if session.disp_first is None:
                session.disp_first = hdr.delivery_id
            session.disp_last = hdr.delivery_id
        link = session.link_out
        if link is not None and link.credit > 0:
            link.credit -= 1
            did = session.next_outgoing
            session.next_outgoing += 1
            link.sent += 1
            self.out.append(encode_transfer(ch, link.handle, did, U32.pack(did & UINT_MASK),
                                            True, bytes(buf[hdr.payload_offset:fend])))

    def _credit(self, counts: dict[int, int]) -> None:
        credit = self.server.credit
        half = max(1, credit // 2)
        sessions = self.sessions
        for key, n in counts.items():
            session = sessions.get(key >> 32)
            if session is None:
                continue
            session.next_incoming += n
            link = session.links_in.get(key & UINT_MASK)
            if link is None:
                continue
            link.count += n
            self.server.transfers += n
            if link.count - link.flowed >= half:
                link.flowed = link.count
                self.out.append(flow_frame(
                    session.channel, next_incoming_id=session.next_incoming,
                    next_outgoing_id=session.next_outgoing, handle=link.handle,
                    delivery_count=link.initial + link.count, link_credit=credit,
                ))

    def _dispositions(self) -> None:
        for session in self.sessions.values():
            if session.disp_first is not None:
                self.out.append(encode_frame(session.channel, Disposition(
                    role=True, first=session.disp_first, last=session.disp_last, settled=True,
                    state=Accepted(),
                ).encode()))
                session.disp_first = None

    # --- performatives -----------------------------------------------------------------------

    def _perform(self, perf: Any, ch: int) -> None:
        out = self.out
        kind = type(perf)
        if kind is Open:
            out.append(OPEN_FRAME)
        elif kind is Begin:
            nxt = 0 if perf.next_outgoing_id is None else int(perf.next_outgoing_id)
            self.sessions[ch] = _Session(ch, nxt)
            out.append(encode_frame(ch, Begin(
                remote_channel=ch, next_outgoing_id=0, incoming_window=WINDOW,
                outgoing_window=WINDOW, handle_max=0xFFFF,
            ).encode()))
        elif kind is Attach:
            self._attach(perf, ch)
        elif kind is Flow:
            session = self.sessions.get(ch)
            if session is None or perf.handle is None:
                return
            link = session.link_out
            if link is not None and int(perf.handle) == link.handle:
                dc = 0 if perf.delivery_count is None else int(perf.delivery_count)
                lc = 0 if perf.link_credit is None else int(perf.link_credit)
                link.credit = (dc + lc - link.sent) & UINT_MASK
        elif kind is Detach:
            session = self.sessions.get(ch)
            if session is not None and perf.handle is not None:
                handle = int(perf.handle)
                session.links_in.pop(handle, None)
                if session.link_out is not None and session.link_out.handle == handle:
                    session.link_out = None
            out.append(encode_frame(ch, Detach(handle=perf.handle, closed=perf.closed).encode()))
        elif kind is End:
            self.sessions.pop(ch, None)
            out.append(encode_frame(ch, End().encode()))
        elif kind is Close:
            out.append(CLOSE_FRAME)
            self.mode = "closed"
        # Disposition (for echoed messages, which are pre-settled anyway): ignored

    def _attach(self, perf: Attach, ch: int) -> None:
        session = self.sessions.get(ch)
        if session is None or perf.handle is None:
            raise ValueError("attach outside a session")
        handle = int(perf.handle)
        client_sends = not perf.role
        settled_mode = perf.snd_settle_mode is not None and int(perf.snd_settle_mode) == 1
        self.out.append(encode_frame(ch, Attach(
            name=perf.name, handle=handle, role=client_sends,
            snd_settle_mode=perf.snd_settle_mode, rcv_settle_mode=perf.rcv_settle_mode,
            source=perf.source, target=perf.target,
            initial_delivery_count=None if client_sends else 0,
        ).encode()))
        if client_sends:
            initial = 0 if perf.initial_delivery_count is None else int(
                perf.initial_delivery_count)
            session.links_in[handle] = _Link(handle, initial, settled_mode)
            if not settled_mode:
                self.slow = True
            self.out.append(flow_frame(
                ch, next_incoming_id=session.next_incoming,
                next_outgoing_id=session.next_outgoing, handle=handle,
                delivery_count=initial, link_credit=self.server.credit,
            ))
        else:
            session.link_out = _Link(handle, 0, True)
            self.slow = True


class PeerServer:
    """Settings and counters shared by the peer's connections."""

    def __init__(self, credit: int) -> None:
        """Create the server state; ``credit`` is granted per incoming link."""
        self.credit = credit
        self.connections = 0
        self.transfers = 0


async def serve(host: str, port: int, credit: int, exit_on_stdin_eof: bool = False) -> None:
    """Listen on ``host:port`` and serve until SIGTERM/SIGINT (or stdin EOF if asked)."""
    loop = asyncio.get_running_loop()
    state = PeerServer(credit)
    server = await loop.create_server(lambda: PeerConnection(state), host, port,
                                      backlog=4096, reuse_address=True)
    addr = server.sockets[0].getsockname()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if exit_on_stdin_eof:
        fd = sys.stdin.fileno()
        with contextlib.suppress(OSError, ValueError):
            loop.add_reader(fd, lambda: None if os.read(fd, 4096) else stop.set())
    print(f"listening {addr[0]}:{addr[1]}", flush=True)
    gc.freeze()
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, pin to ``--cpus`` if given, and serve."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--credit", type=int, default=4000, help="link credit granted per link")
    ap.add_argument("--cpus", help="comma-separated CPUs to pin to (sched_setaffinity)")
    ap.add_argument("--exit-on-stdin-eof", action="store_true",
                    help="stop when stdin closes (the harness keeps a pipe open)")
    args = ap.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(serve(args.host, args.port, args.credit, args.exit_on_stdin_eof))
    else:
        uvloop.run(serve(args.host, args.port, args.credit, args.exit_on_stdin_eof))
    return 0


if __name__ == "__main__":
    sys.exit(main())
