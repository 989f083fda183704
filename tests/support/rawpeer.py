"""Raw AMQP 1.0 peers for hostile-client, fault and load tests, built on the project's encoder.

Real client libraries never send what a hostile client sends (an Attach pipelined behind a
denied Begin, a forged sasl-outcome, a second Open), and a real broker cannot be killed, made to
refuse, flooded or watched frame by frame on demand. These peers can:

- :class:`RawClient`: a blocking socket client; frames are built with :func:`frame` from the
  project's own performative dataclasses and sent as the test says, byte for byte.
- :class:`RawUpstream`: a minimal "router" on its own asyncio loop thread. It relays nothing: it
  answers SASL (PLAIN and ANONYMOUS, every user accepted unless listed in ``sasl_reject``),
  Open, Begin, Attach (role flipped), Detach, End and Close; grants credit to client senders;
  optionally echoes every message back on a receiver link of the same address (``echo``),
  floods receivers as fast as the socket takes it (``flood_bytes``), sends heartbeats and
  enforces its own idle-time-out (``idle_time_out``). Every frame it receives is recorded, so a
  test can assert that a denied frame never reached it.
- :func:`open_async_client`: a small asyncio client for tests that hold thousands of
  connections at once (floods) or stream for a minute (integrity).

No proton client or reactor is involved: the only proton use is the codec behind
``amqp.performatives`` (as in the proxy itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from struct import Struct
from typing import Any

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.framing import EMPTY_FRAME, encode_frame
from amqp_policy_proxy.amqp.performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
    decode_performative,
)
from amqp_policy_proxy.amqp.sasl import identity_from_sasl_init

__all__ = [
    "Attach", "Begin", "Close", "Detach", "Disposition", "End", "Error", "Flow", "Open",
    "SaslInit", "SaslOutcome", "Source", "Target", "Transfer",
    "AsyncClient", "FrameParser", "Item", "RawClient", "RawUpstream", "attach_receiver",
    "attach_sender", "begin", "data_message", "frame", "names", "open_async_client", "sasl_plain_init",
    "transfer",
]

_HDR = Struct(">IBBH")


# ---------------------------------------------------------------------------------- frames


def frame(channel: int, perf: Any, payload: bytes = b"", ftype: int = 0) -> bytes:
    """Encode one frame (DOFF 2) holding ``perf`` followed by ``payload``.

    Args:
        channel: the frame's channel.
        perf: a performative or SASL frame dataclass from ``amqp.performatives``.
        payload: bytes after the performative (a Transfer's message bytes).
        ftype: 0 for AMQP frames, 1 for SASL frames.
    """
    return encode_frame(channel, perf.encode() + payload, ftype)


def sasl_plain_init(user: str, password: str = "secret") -> bytes:
    """Return a SASL frame holding a PLAIN sasl-init for ``user``."""
    response = b"\0" + user.encode() + b"\0" + password.encode()
    return frame(0, SaslInit(mechanism="PLAIN", initial_response=response), ftype=1)


def begin(channel: int, *, handle_max: int | None = 1023, window: int = 1000) -> bytes:
    """Return a client Begin on ``channel``."""
    return frame(channel, Begin(next_outgoing_id=0, incoming_window=window,
                                outgoing_window=window, handle_max=handle_max))


def attach_sender(channel: int, handle: int, address: str | None, *, name: str | None = None,
                  settled: bool = False) -> bytes:
    """Return an Attach for a client sender (role False) to target ``address``."""
    return frame(channel, Attach(
        name=name or f"snd-{channel}-{handle}", handle=handle, role=False,
        snd_settle_mode=1 if settled else 0, rcv_settle_mode=0,
        source=Source(address="client"), target=Target(address=address),
        initial_delivery_count=0,
    ))


def attach_receiver(channel: int, handle: int, address: str | None, *,
                    name: str | None = None, dynamic: bool = False) -> bytes:
    """Return an Attach for a client receiver (role True) from source ``address``."""
    return frame(channel, Attach(
        name=name or f"rcv-{channel}-{handle}", handle=handle, role=True,
        snd_settle_mode=0, rcv_settle_mode=0,
        source=Source(address=address, dynamic=dynamic or None), target=Target(address="client"),
    ))


def transfer(channel: int, handle: int, delivery_id: int, payload: bytes, *,
             settled: bool = False, more: bool = False, first: bool = True) -> bytes:
    """Return one Transfer frame (the first of a delivery unless ``first`` is False)."""
    if first:
        t = Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=b"%d" % delivery_id,
                     message_format=0, settled=settled, more=more)
    else:
        t = Transfer(handle=handle, more=more)
    return frame(channel, t, payload)


def data_message(body: bytes) -> bytes:
    """Return an AMQP message made of one ``data`` section (Part 3 §3.2.6) holding ``body``."""
    return b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body


@dataclass(frozen=True, slots=True)
class Item:
    """One unit read from the wire: a protocol header (``channel == -1``) or a frame."""

    channel: int
    perf: Any
    """The decoded performative (None for a heartbeat), or the 8 header bytes."""
    payload: bytes = b""
    ftype: int = 0

    @property
    def name(self) -> str:
        """``"header"``, ``"heartbeat"`` or the performative's class name."""
        if self.channel == -1:
            return "header"
        if self.perf is None:
            return "heartbeat"
        return type(self.perf).__name__

    @property
    def condition(self) -> str | None:
        """The error condition of a Close, End or Detach, else None."""
        err = getattr(self.perf, "error", None)
        return None if err is None else str(err.condition)

    @property
    def description(self) -> str | None:
        """The error description of a Close, End or Detach, else None."""
        err = getattr(self.perf, "error", None)
        return None if err is None else str(err.description)


class FrameParser:
    """Incremental parser: bytes in, :class:`Item` list out (headers and whole frames)."""

    def __init__(self) -> None:
        """Create an empty parser."""
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Item]:
        """Buffer ``data`` and return every whole item it completes."""
        self.buf += data
        out: list[Item] = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 8:
            if buf[pos : pos + 4] == b"AMQP":
                out.append(Item(-1, bytes(buf[pos : pos + 8])))
                pos += 8
                continue
            size, doff, ftype, channel = _HDR.unpack_from(buf, pos)
            if size < 8:
                raise ValueError(f"bad frame size {size}")
            if len(buf) - pos < size:
                break
            body = bytes(buf[pos + doff * 4 : pos + size])
            if body:
                perf, n = decode_performative(body)
                out.append(Item(channel, perf, body[n:], ftype))
            else:
                out.append(Item(channel, None, b"", ftype))
            pos += size
        del buf[:pos]
        return out


def names(items: Iterable[Item]) -> list[str]:
    """Return the :attr:`Item.name` of each item."""
    return [i.name for i in items]


# ---------------------------------------------------------------------------------- blocking client


class RawClient:
    """A blocking TCP client that sends exactly the bytes a test gives it."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 rcvbuf: int | None = None, source: str | None = None) -> None:
        """Connect to ``host:port``.

        Args:
            port: the proxy's port.
            host: the proxy's address.
            timeout: default seconds to wait in the read helpers.
            rcvbuf: SO_RCVBUF to set before connecting (a small window for stall tests).
            source: the local address to connect from (e.g. ``127.0.0.2``); None: any.
        """
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        if source is not None:
            self.sock.bind((source, 0))
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.parser = FrameParser()
        self.items: list[Item] = []
        """Every item received so far, in order."""
        self.closed = False
        """True once the proxy closed (EOF or reset)."""
        self.raw = bytearray()
        """Every byte received so far."""

    def send(self, *chunks: bytes) -> None:
        """Send the concatenation of ``chunks`` in one write (one TCP segment when small)."""
        self.sock.sendall(b"".join(chunks))

    def try_send(self, *chunks: bytes) -> bool:
        """Like :meth:`send` but return False instead of raising when the proxy has gone."""
        try:
            self.send(*chunks)
        except OSError:
            return False
        return True

    def _recv_once(self, deadline: float) -> list[Item]:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or self.closed:
            return []
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return []
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return []
        self.raw += data
        new = self.parser.feed(data)
        self.items.extend(new)
        return new

    def read_until(self, pred: Callable[[Item], bool], timeout: float | None = None) -> list[Item]:
        """Read until an item satisfies ``pred``, the proxy closes, or ``timeout`` passes.

        Returns:
            The items read by this call.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        got: list[Item] = []
        while not self.closed and time.monotonic() < deadline:
            new = self._recv_once(deadline)
            got.extend(new)
            if any(pred(i) for i in new):
                break
        return got

    def read_for(self, seconds: float) -> list[Item]:
        """Read whatever arrives during ``seconds`` (or until the proxy closes)."""
        deadline = time.monotonic() + seconds
        got: list[Item] = []
        while not self.closed and time.monotonic() < deadline:
            got.extend(self._recv_once(deadline))
        return got

    def read_until_closed(self, timeout: float | None = None) -> list[Item]:
        """Read until the proxy closes the connection (or ``timeout`` passes)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        got: list[Item] = []
        while not self.closed and time.monotonic() < deadline:
            got.extend(self._recv_once(deadline))
        return got

    def sasl_plain(self, user: str, password: str = "secret") -> int:
        """Run SASL PLAIN: header, (mechanisms), init, outcome. Returns the outcome code."""
        self.send(C.SASL_HEADER, sasl_plain_init(user, password))
        got = self.read_until(lambda i: isinstance(i.perf, SaslOutcome))
        outcome = [i for i in got if isinstance(i.perf, SaslOutcome)]
        if not outcome:
            raise AssertionError(f"no sasl-outcome (closed={self.closed}): {names(got)}")
        return int(outcome[0].perf.code)

    def open(self, hostname: str | None = "test", *, user: str | None = None,
             password: str = "secret", channel_max: int = 255, max_frame_size: int = 65536,
             idle_time_out: int | None = None, then: bytes = b"") -> list[Item]:
        """SASL PLAIN (when ``user`` is given, else no SASL), AMQP header and Open.

        Args:
            hostname: the Open's hostname (selects the vhost).
            user: SASL PLAIN user; None skips SASL (user ``anonymous``).
            password: SASL PLAIN password.
            channel_max: the Open's channel-max.
            max_frame_size: the Open's max-frame-size.
            idle_time_out: the Open's idle-time-out (milliseconds).
            then: bytes sent in the same write right after the Open (pipelined frames).

        Returns:
            The items read up to the proxy's Open (and a Close right behind it, if any).
        """
        if user is not None:
            code = self.sasl_plain(user, password)
            if code != 0:
                raise AssertionError(f"sasl-outcome {code}")
        self.send(C.AMQP_HEADER, frame(0, Open(
            container_id="raw-client", hostname=hostname, channel_max=channel_max,
            max_frame_size=max_frame_size, idle_time_out=idle_time_out)), then)
        got = self.read_until(lambda i: isinstance(i.perf, Open))
        # a denial's Close travels with its Open; give it a moment to arrive
        got += self.read_for(0.05)
        return got

    def close(self) -> None:
        """Close the socket (no AMQP Close)."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------- upstream


@dataclass
class _Link:
    handle: int
    client_is_sender: bool
    address: str | None
    credit: int = 0
    """Credit the client granted (client receivers) or we granted (client senders)."""
    delivery_count: int = 0
    granted_used: int = 0
    partial: bytearray = field(default_factory=bytearray)
    partial_id: int | None = None
    partial_settled: bool = False


@dataclass
class _Session:
    channel: int
    links: dict[int, _Link] = field(default_factory=dict)
    next_outgoing_id: int = 0
    # echo: queued (payload, original_delivery_id or None) waiting for receiver credit
    queue: list[tuple[bytes, int | None]] = field(default_factory=list)
    # outgoing echo delivery id -> original incoming delivery id (to settle after accept)
    echo_of: dict[int, int] = field(default_factory=dict)


class _UpstreamConn(asyncio.Protocol):
    """One connection accepted by :class:`RawUpstream`."""

    def __init__(self, server: RawUpstream, number: int) -> None:
        self.server = server
        self.number = number
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser()
        self.sasl_done = False
        self.user: str | None = None
        self.sessions: dict[int, _Session] = {}
        self.paused = False
        self.flooding: tuple[int, int] | None = None
        self.flood_sent = 0
        self.last_rx = 0.0
        self.idle_task: asyncio.Task[None] | None = None
        self.closed = False
        self.counted = False
        """Counted in ``connections_made``/``active``: from its first byte past a protocol
        header. The proxy's readiness probes (a protocol header, then close) never are."""

    # -- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_rx = time.monotonic()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_task is not None:
            self.idle_task.cancel()
        self.server._seen.pop(id(self), None)
        if self.counted:
            self.server._lost(self)
        else:
            self.server.probes += 1

    def pause_writing(self) -> None:
        self.paused = True
        self.server.pauses += 1

    def resume_writing(self) -> None:
        self.paused = False
        self._flood()

    def data_received(self, data: bytes) -> None:
        self.last_rx = time.monotonic()
        self.server.bytes_received += len(data)
        if not self.counted and self.server.bytes_received_by(self, len(data)) > 8:
            self.counted = True
            self.server._made(self)
        if self.server.silent:
            return
        try:
            items = self.parser.feed(data)
        except Exception:  # the proxy sent garbage: record and hang up
            self.server._record(self.number, Item(-2, "unparseable"))
            self._abort()
            return
        for item in items:
            self.server._record(self.number, item)
            if self.closed:
                return
            self._handle(item)

    # -- helpers
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _handle(self, item: Item) -> None:
        srv = self.server
        if item.channel == -1:
            header = item.perf
            if header == C.SASL_HEADER and not self.sasl_done:
                self.write(C.SASL_HEADER + frame(0, SaslMechanisms(
                    sasl_server_mechanisms=symbol_array(["PLAIN", "ANONYMOUS"])), ftype=1))
            elif header == C.AMQP_HEADER:
                self.write(C.AMQP_HEADER)
            else:
                self._abort()
            return
        perf = item.perf
        ch = item.channel
        if perf is None:
            return  # heartbeat
        if isinstance(perf, SaslInit):
            # like proton with Cyrus: the authcid is authenticated, whatever authzid is named
            self.user = identity_from_sasl_init(str(perf.mechanism or ""),
                                                perf.initial_response).user
            ok = self.user not in srv.sasl_reject
            self.sasl_done = ok
            self.write(frame(0, SaslOutcome(code=0 if ok else 1), ftype=1))
            return
        if isinstance(perf, Open):
            timeout = srv.idle_time_out
            self.write(frame(0, Open(container_id="raw-upstream", channel_max=srv.channel_max,
                                     max_frame_size=srv.max_frame_size,
                                     idle_time_out=timeout)))
            peer_timeout = None if perf.idle_time_out is None else int(perf.idle_time_out)
            if timeout or peer_timeout:
                loop = asyncio.get_running_loop()
                self.idle_task = loop.create_task(self._idle(timeout, peer_timeout))
            return
        if isinstance(perf, Begin):
            self.sessions[ch] = _Session(ch)
            self.write(frame(ch, Begin(remote_channel=ch, next_outgoing_id=0,
                                       incoming_window=2**31 - 1, outgoing_window=2**31 - 1,
                                       handle_max=perf.handle_max)))
            return
        session = self.sessions.get(ch)
        if isinstance(perf, Attach) and session is not None:
            client_is_sender = not perf.role
            terminus = perf.target if client_is_sender else perf.source
            address = getattr(terminus, "address", None)
            link = _Link(int(perf.handle), client_is_sender,
                         None if address is None else str(address))
            session.links[link.handle] = link
            self.write(frame(ch, Attach(
                name=perf.name, handle=link.handle, role=client_is_sender,
                snd_settle_mode=perf.snd_settle_mode, rcv_settle_mode=perf.rcv_settle_mode,
                source=perf.source, target=perf.target,
                initial_delivery_count=None if client_is_sender else 0)))
            if client_is_sender and srv.credit:
                link.credit = srv.credit
                self._grant(session, link)
            if not client_is_sender and srv.flood_bytes:
                self.flooding = (ch, link.handle)
                self._flood()
            return
        if isinstance(perf, Flow) and session is not None:
            if perf.handle is not None:
                link = session.links.get(int(perf.handle))
                if link is not None and not link.client_is_sender:
                    dc = 0 if perf.delivery_count is None else int(perf.delivery_count)
                    credit = 0 if perf.link_credit is None else int(perf.link_credit)
                    link.credit = dc + credit - link.delivery_count
                    self._pump(session)
            return
        if isinstance(perf, Transfer) and session is not None:
            self._transfer(session, item)
            return
        if isinstance(perf, Disposition) and session is not None:
            if perf.role and srv.echo:  # the client (receiver) settled echoed deliveries
                first = int(perf.first)
                last = first if perf.last is None else int(perf.last)
                originals = [session.echo_of.pop(d) for d in range(first, last + 1)
                             if d in session.echo_of]
                for original in originals:
                    self.write(frame(ch, Disposition(role=True, first=original, settled=True,
                                                     state=Accepted())))
            return
        if isinstance(perf, Detach) and session is not None:
            session.links.pop(int(perf.handle), None)
            self.write(frame(ch, Detach(handle=perf.handle, closed=perf.closed)))
            return
        if isinstance(perf, End):
            self.sessions.pop(ch, None)
            self.write(frame(ch, End()))
            return
        if isinstance(perf, Close):
            self.write(frame(0, Close()))
            if self.transport is not None:
                self.transport.close()

    def _grant(self, session: _Session, link: _Link) -> None:
        self.write(frame(session.channel, Flow(
            next_incoming_id=None, incoming_window=2**31 - 1,
            next_outgoing_id=session.next_outgoing_id, outgoing_window=2**31 - 1,
            handle=link.handle, delivery_count=link.delivery_count, link_credit=link.credit)))

    def _transfer(self, session: _Session, item: Item) -> None:
        srv = self.server
        perf = item.perf
        link = session.links.get(int(perf.handle))
        if link is None:
            return
        if link.partial_id is None:
            link.partial_id = None if perf.delivery_id is None else int(perf.delivery_id)
            link.partial_settled = bool(perf.settled)
        link.partial += item.payload
        if perf.more and not perf.aborted:
            return
        payload = bytes(link.partial)
        delivery_id = link.partial_id
        settled = link.partial_settled or bool(perf.settled)
        link.partial = bytearray()
        link.partial_id = None
        if perf.aborted:
            srv.aborted += 1
            return
        srv.message_count += 1
        if srv.record:
            srv.messages.append((self.number, link.address, payload))
        link.delivery_count += 1
        link.granted_used += 1
        settle_later = srv.echo and srv.echo_settle_at_receiver and not settled
        if srv.echo:
            session.queue.append((payload, delivery_id if settle_later else None))
            self._pump(session)
        if not settled and not settle_later and delivery_id is not None:
            self.write(frame(session.channel, Disposition(role=True, first=delivery_id,
                                                          settled=True, state=Accepted())))
        if srv.credit and link.granted_used >= max(1, srv.credit // 2):
            link.granted_used = 0
            link.credit = srv.credit
            self._grant(session, link)

    def _pump(self, session: _Session) -> None:
        """Send queued echoes on the session's first client receiver that has credit."""
        if not session.queue:
            return
        receivers = [lk for lk in session.links.values() if not lk.client_is_sender]
        if not receivers:
            return
        link = receivers[0]
        max_payload = max(256, self.server.send_frame_size - 64)
        out = []
        while session.queue and link.credit > 0:
            payload, original = session.queue.pop(0)
            did = session.next_outgoing_id
            session.next_outgoing_id = (did + 1) & 0xFFFFFFFF
            link.credit -= 1
            link.delivery_count += 1
            if original is not None:
                session.echo_of[did] = original
            chunks = [payload[i : i + max_payload]
                      for i in range(0, len(payload), max_payload)] or [b""]
            for n, chunk in enumerate(chunks):
                more = n < len(chunks) - 1
                out.append(transfer(session.channel, link.handle, did, chunk,
                                    settled=original is None, more=more, first=n == 0))
        if out:
            self.write(b"".join(out))

    def _flood(self) -> None:
        """Write large transfers while the transport accepts them (backpressure tests)."""
        srv = self.server
        if self.flooding is None or self.closed:
            return
        ch, handle = self.flooding
        session = self.sessions.get(ch)
        if session is None:
            return
        chunk = b"F" * (srv.send_frame_size - 64)
        while not self.paused and self.flood_sent < srv.flood_bytes:
            did = session.next_outgoing_id
            session.next_outgoing_id += 1
            data = transfer(ch, handle, did, chunk, settled=True)
            self.write(data)
            self.flood_sent += len(data)
            srv.flood_sent += len(data)
            srv.flood_frames += 1

    async def _idle(self, own_ms: int | None, peer_ms: int | None) -> None:
        """Heartbeat at half the peer's idle-time-out; Close when ours expires (Part 2 §2.4.5)."""
        tick = min(x for x in (own_ms, peer_ms, 10_000) if x) / 4000
        last_tx = time.monotonic()
        while not self.closed:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if own_ms and now - self.last_rx > own_ms / 1000:
                self.server.idle_expired += 1
                self.write(frame(0, Close(error=Error(
                    condition=str(C.Condition.RESOURCE_LIMIT_EXCEEDED),
                    description="local-idle-timeout expired"))))
                if self.transport is not None:
                    self.transport.close()
                return
            if peer_ms and now - last_tx > peer_ms / 2000:
                self.write(EMPTY_FRAME)
                self.server.heartbeats_sent += 1
                last_tx = now


class RawUpstream:
    """A minimal AMQP 1.0 "router" on a background asyncio loop, recording what it receives."""

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        channel_max: int = 32767,
        max_frame_size: int = 65536,
        send_frame_size: int = 16384,
        idle_time_out: int | None = None,
        credit: int = 100,
        echo: bool = False,
        echo_settle_at_receiver: bool = True,
        flood_bytes: int = 0,
        sasl_reject: Iterable[str] = (),
        silent: bool = False,
        record: bool = True,
    ) -> None:
        """Configure; nothing listens until :meth:`start`.

        Args:
            port: TCP port (0: any free port; give the old one to "restart" a killed router).
            host: address to bind.
            channel_max: the channel-max of our Open.
            max_frame_size: the max-frame-size of our Open.
            send_frame_size: largest frame we send (echo and flood transfers are cut to it).
            idle_time_out: our Open's idle-time-out (ms); we Close a peer silent for that long.
            credit: credit granted to each client sender (replenished at half); 0 grants none.
            echo: send each message received back on the session's first client receiver.
            echo_settle_at_receiver: with ``echo``, settle an unsettled incoming delivery only
                once the client accepted its echo (True), or at once, echoing it pre-settled.
            flood_bytes: on a client receiver's Attach, send this many bytes of transfers as
                fast as the transport takes them (ignoring credit; the proxy does not police it).
            sasl_reject: users whose SASL exchange fails (outcome ``auth``).
            silent: accept connections and read, but never answer (a dead router).
            record: keep every received item in :attr:`received` (off for floods).
        """
        self.host = host
        self.port = port
        self.channel_max = channel_max
        self.max_frame_size = max_frame_size
        self.send_frame_size = send_frame_size
        self.idle_time_out = idle_time_out
        self.credit = credit
        self.echo = echo
        self.echo_settle_at_receiver = echo_settle_at_receiver
        self.flood_bytes = flood_bytes
        self.sasl_reject = frozenset(sasl_reject)
        self.silent = silent
        self.record = record
        self.received: list[tuple[int, Item]] = []
        """``(connection number, item)`` for everything received, in order."""
        self.messages: list[tuple[int, str | None, bytes]] = []
        """``(connection number, link address, message bytes)`` of each complete delivery
        (when ``record``)."""
        self.message_count = 0
        """Complete deliveries received (counted even when not recorded)."""
        self.connections_made = 0
        """Connections that sent more than a protocol header (client legs, not probes)."""
        self.active = 0
        self.probes = 0
        """Connections that closed after a protocol header only (readiness probes)."""
        self._seen: dict[int, int] = {}
        self.bytes_received = 0
        self.pauses = 0
        self.flood_sent = 0
        self.flood_frames = 0
        self.aborted = 0
        self.idle_expired = 0
        self.heartbeats_sent = 0
        self.conns: list[_UpstreamConn] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- bookkeeping (loop thread)
    def bytes_received_by(self, conn: _UpstreamConn, n: int) -> int:
        """Bytes received so far on ``conn``, these ``n`` included."""
        total = self._seen.get(id(conn), 0) + n
        self._seen[id(conn)] = total
        return total

    def _made(self, conn: _UpstreamConn) -> None:
        with self._lock:
            self.connections_made += 1
            self.active += 1
            self.conns.append(conn)

    def _lost(self, conn: _UpstreamConn) -> None:
        with self._lock:
            self.active -= 1
            with contextlib.suppress(ValueError):
                self.conns.remove(conn)

    def _record(self, number: int, item: Item) -> None:
        if self.record:
            with self._lock:
                self.received.append((number, item))

    # -- control (test thread)
    def start(self) -> RawUpstream:
        """Bind and serve on a background thread; returns self once listening."""
        self._thread = threading.Thread(target=self._main, name="raw-upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("raw upstream did not start")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            counter = iter(range(1, 1 << 62))
            try:
                self._server = await loop.create_server(
                    lambda: _UpstreamConn(self, next(counter)), self.host, self.port,
                    reuse_address=True, backlog=4096)
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self.port = self._server.sockets[0].getsockname()[1]
            self._ready.set()
            await asyncio.Event().wait()  # until the loop is stopped

        task = loop.create_task(serve())
        try:
            loop.run_forever()
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
            loop.close()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn`` on the upstream's loop and return its result."""
        assert self._loop is not None

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout)

    def kill(self) -> None:
        """Die like a killed router: stop listening and reset every connection. Idempotent."""
        if self._loop is None or self._thread is None:
            return

        def _kill() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self.conns):
                conn._abort()

        with contextlib.suppress(RuntimeError):
            self.call(_kill)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    stop = kill

    def pause_reading(self) -> None:
        """Stop reading from every current connection (a router that stops reading)."""
        self.call(lambda: [c.transport.pause_reading() for c in self.conns
                           if c.transport is not None])

    def resume_reading(self) -> None:
        """Undo :meth:`pause_reading`."""
        self.call(lambda: [c.transport.resume_reading() for c in self.conns
                           if c.transport is not None])

    def items(self, cls: type | None = None, conn: int | None = None) -> list[Item]:
        """Received items (optionally of performative class ``cls`` / on connection ``conn``)."""
        with self._lock:
            got = list(self.received)
        return [i for n, i in got
                if (conn is None or n == conn) and (cls is None or isinstance(i.perf, cls))]

    def wait_for(self, pred: Callable[[RawUpstream], bool], timeout: float = 10.0) -> bool:
        """Poll ``pred(self)`` until true or ``timeout``; return its last value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self):
                return True
            time.sleep(0.02)
        return bool(pred(self))

    def __enter__(self) -> RawUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


# ---------------------------------------------------------------------------------- asyncio client


class AsyncClient(asyncio.Protocol):
    """A minimal asyncio AMQP client protocol: collects items, exposes waiters."""

    def __init__(self) -> None:
        """Create an unconnected protocol (use :func:`open_async_client`)."""
        self.transport: asyncio.Transport | None = None
        self.parser = FrameParser()
        self.items: list[Item] = []
        self.bytes_received = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: tuple[Callable[[Item], bool], asyncio.Future[Item]] | None = None
        self.on_item: Callable[[Item], None] | None = None
        self.keep_items = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Record the transport."""
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Parse; hand items to :attr:`on_item` and to a pending :meth:`wait_for`."""
        self.bytes_received += len(data)
        for item in self.parser.feed(data):
            if self.keep_items:
                self.items.append(item)
            if self.on_item is not None:
                self.on_item(item)
            waiter = self._waiter
            if waiter is not None and not waiter[1].done() and waiter[0](item):
                waiter[1].set_result(item)
                self._waiter = None

    def connection_lost(self, exc: Exception | None) -> None:
        """Resolve :attr:`closed` and fail a pending waiter."""
        if not self.closed.done():
            self.closed.set_result(None)
        if self._waiter is not None and not self._waiter[1].done():
            self._waiter[1].set_exception(ConnectionError("closed"))

    def send(self, *chunks: bytes) -> None:
        """Write the concatenation of ``chunks``."""
        assert self.transport is not None
        self.transport.write(b"".join(chunks))

    async def wait_for(self, pred: Callable[[Item], bool], timeout: float = 10.0) -> Item:
        """Wait for the next item satisfying ``pred`` (items already received are checked)."""
        for item in self.items:
            if pred(item):
                return item
        fut: asyncio.Future[Item] = asyncio.get_running_loop().create_future()
        self._waiter = (pred, fut)
        return await asyncio.wait_for(fut, timeout)


async def open_async_client(port: int, *, host: str = "127.0.0.1", hostname: str = "test",
                            handshake: bool = True, timeout: float = 30.0,
                            protocol: Callable[[], AsyncClient] = AsyncClient) -> AsyncClient:
    """Connect; with ``handshake``, send the AMQP header and Open and wait for the Open back."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(protocol, host, port)
    if handshake:
        proto.send(C.AMQP_HEADER, frame(0, Open(container_id="async-client", hostname=hostname,
                                                channel_max=255, max_frame_size=65536)))
        await proto.wait_for(lambda i: isinstance(i.perf, Open), timeout)
    return proto


# ---------------------------------------------------------------------------------- subprocess


def main(argv: list[str] | None = None) -> int:
    """Run a :class:`RawUpstream` as its own process (floods: file descriptors per process).

    Prints ``listening PORT`` once bound. Each line on stdin is a command: ``stats`` prints a
    JSON object with ``connections_made``, ``active`` and ``bytes_received``; EOF stops it.
    """
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--credit", type=int, default=0)
    args = parser.parse_args(argv)
    with RawUpstream(port=args.port, record=False, credit=args.credit) as up:
        print(f"listening {up.port}", flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                print(json.dumps({"connections_made": up.connections_made,
                                  "active": up.active,
                                  "bytes_received": up.bytes_received}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
