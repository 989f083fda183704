"""Fuzz harness shared by the atheris targets and the test suite (no atheris import here).

Two entry points take one fuzz input (arbitrary bytes) and raise only on a finding:

- :func:`run_framing`: the frame decoder and the wire readers (``amqp/framing.py``,
  ``amqp/transfer.py``, ``amqp/performatives.py``). Allowed exception: ``AmqpError``.
- :func:`run_connection`: one :class:`ProxyConnection` driven by a script decoded from the
  input (client bytes, router bytes, upstream up/failed/lost, timers, shutdown). Nothing may
  escape the core, and after every step the invariants below must hold.

Invariants (a violation raises :class:`Finding`):

- *Exceptions*: the codec's own errors (``AmqpError`` subclasses) only, and none at all from
  ``ProxyConnection`` methods (it turns violations into a Close).
- *Memory*: the client receive buffer never holds more than one frame of the size limit in
  force (``max-frame-size`` the proxy advertised, 64 KiB before the Open); the router buffer
  likewise (the client's max-frame-size capped at 64 MiB); frames held behind an Open before
  the decision stay under 4 MiB plus one frame.
- *Policy*: nothing but protocol headers and SASL frames reaches the router before the Open is
  approved, nothing at all after a denial; every Attach the router receives passes the group's
  address rules for the authenticated user; a frame on a channel the client never begun, or
  on a handle it never attached, never reaches the router.
- *Counts*: live session/sender/receiver counts never go negative; once both transports are
  lost the connection is finished, the ledger is back to zero and ``ConnectionClosed`` was
  emitted exactly once if (and only if) the connection was admitted.

Input format for :func:`run_connection` (every byte string is valid): byte 0 picks the policy
(:data:`POLICY_NAMES`), byte 1 bit 0 picks the remote host (allowed/denied), bit 1 whether
the upstream connects at once; then records ``op`` [``len_hi len_lo`` ``data``]: op % 8 =
0/7 client bytes, 1 router bytes, 2 upstream connected, 3 upstream connect failed,
4 router transport lost, 5 advance the clock by ``len_lo`` tenths of a second and run the
timer, 6 begin shutdown. :func:`encode_script` builds such inputs from a transcript.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import cache
from struct import Struct
from typing import Any

from amqp_policy_proxy.amqp.errors import AmqpError
from amqp_policy_proxy.amqp.message import read_message_head
from amqp_policy_proxy.amqp.performatives import Attach, Flow, decode_performative
from amqp_policy_proxy.amqp.transfer import (
    is_transfer_descriptor,
    read_flow_fields,
    read_transfer,
)
from amqp_policy_proxy.core.commands import CloseTransport, ConnectRouter, Emit, SendData, Side
from amqp_policy_proxy.core.connection import ProxyConnection
from amqp_policy_proxy.core.context import PRE_OPEN_FRAME_LIMIT
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
)
from amqp_policy_proxy.core.numbering import flow_fields
from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.policy import decisions
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from amqp_policy_proxy.policy.topics import Principal, qos_of
from tests.support.frames import FrameDecoder

# The core logs every denial; at thousands of inputs a second that is pure overhead.
logging.getLogger("amqp_policy_proxy").setLevel(logging.CRITICAL)

_HDR = Struct(">IBBH")
HELD_LIMIT = 4 * 1024 * 1024

OP_CLIENT, OP_BROKER, OP_UP, OP_FAILED, OP_BROKER_LOST, OP_TIMER, OP_SHUTDOWN = range(7)


class Finding(AssertionError):
    """An invariant violation: a bug found by the fuzzer."""


# ---------------------------------------------------------------------------------- policies

_LIMITED = {
    "users": "alice, anonymous", "remoteHosts": "127.0.0.1", "maxSessions": 3,
    "maxSenders": 2, "maxReceivers": 2, "maxFrameSize": 4096, "maxSessionWindow": 40960,
    "maxMessageSize": 2000, "sources": "public.*, ${user}.inbox",
    "targets": "public.*, tmp-${user}", "allowAnonymousSender": True,
    "allowDynamicSource": True,
}
_OPEN = {"users": "bob", "remoteHosts": "*", "sources": "*", "targets": "*",
         "allowUserIdProxy": True, "allowAnonymousSender": True}
_PATTERNS = {
    "users": "*", "remoteHosts": "*", "maxSessions": 10, "maxMessageSize": 0,
    "sourcePattern": "public.#, ${user}.#", "targetPattern": "public.*, queue.${user}",
    "allowAnonymousSender": True,
}
_TOPICS = {
    "model": "nearestAcl", "separator": ".", "wildcards": "amqp",
    "nodes": {"": {"publish": ["*"], "subscribe": ["*"], "persistent": []},
              "public": {"publish": ["alice"], "subscribe": ["*"]},
              "public.hidden": {"subscribe": ["bob"], "persistent": ["*"]}},
}
POLICY_NAMES = ("limited", "patterns", "passthrough", "nolimits")


@cache
def policy(index: int) -> Any:
    """Return the compiled policy number ``index % len(POLICY_NAMES)``."""
    name = POLICY_NAMES[index % len(POLICY_NAMES)]
    if name == "limited":
        groups: dict[str, Any] = {"limited": _LIMITED, "open": _OPEN}
        settings = PolicySettings()
    elif name == "patterns":
        groups = {"everyone": _PATTERNS}
        settings = PolicySettings()
    elif name == "passthrough":
        groups = {"limited": _LIMITED}
        settings = PolicySettings(enable_vhost_policy=False)
    else:
        groups = {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*",
                          "allowAnonymousSender": True}}
        settings = PolicySettings()
    attrs: dict[str, Any] = {"hostname": "test", "groups": groups, "allowUnknownUser": False}
    if name == "nolimits":
        # topic authorization with per-delivery filtering and durable rewrites
        # (docs/topic-authorization.md): the router->client transfer path the other policies never take
        attrs["topicTree"] = _TOPICS
    return compile_policy([(None, [["vhost", attrs]])], settings)


# ---------------------------------------------------------------------------------- framing


def run_framing(data: bytes) -> None:
    """Decode ``data`` as a frame stream with every reader; raise :class:`Finding` on a bug.

    Byte 0 picks the max-frame-size (512, 4096 or 65536), byte 1 the chunk size the stream is
    fed in; the rest is the stream.
    """
    if len(data) < 2:
        return
    limit = (512, 4096, 65536)[data[0] % 3]
    chunk = 1 + data[1] % 64
    stream = data[2:]
    decoder = FrameDecoder(limit)
    try:
        for i in range(0, len(stream), chunk):
            decoder.receive_data(stream[i : i + chunk])
            while True:
                f = decoder.next_frame()
                if f is None:
                    break
                _check_frame(f.raw, f.header.body_offset, f.header.size)
            if decoder.buffered > max(limit, 8):
                raise Finding(f"decoder holds {decoder.buffered} bytes, limit {limit}")
    except AmqpError:
        return


def _check_frame(raw: bytes, body: int, size: int) -> None:
    if body == size:
        return  # heartbeat
    code = is_transfer_descriptor(raw, body, size)
    if code == 0x14:
        hdr = read_transfer(raw, body, size)
        if not body < hdr.payload_offset <= size:
            raise Finding(f"transfer payload offset {hdr.payload_offset} outside ({body}, {size}]")
        read_message_head(raw, hdr.payload_offset, size, last=not hdr.more)
    flow = None
    if code == 0x13:  # the router's Flows are read without decoding on some sessions
        try:
            flow = read_flow_fields(raw, body, size)
        except AmqpError:
            flow = None
    perf, consumed = decode_performative(raw[body:size])
    if not 0 < consumed <= size - body:
        raise Finding(f"performative consumed {consumed} of {size - body} bytes")
    if flow is not None and isinstance(perf, Flow) and flow != flow_fields(perf):
        raise Finding(f"fast Flow read {flow}, the codec {flow_fields(perf)}")
    if code is not None and code != perf.DESCRIPTOR and code in (0x10, 0x11, 0x12, 0x13, 0x14):
        raise Finding(f"fast descriptor read 0x{code:x} but codec says 0x{perf.DESCRIPTOR:x}")
    # re-encoding what we decoded (the proxy rewrites Open/Begin/Flow/Attach) must work or be
    # refused as a decode error, and be stable
    once = perf.encode()
    again, _ = decode_performative(once)
    if again.encode() != once:
        raise Finding(f"{type(perf).__name__} re-encoding is not stable")


# ---------------------------------------------------------------------------------- connection


def parse_script(data: bytes) -> tuple[int, int, list[tuple[int, bytes]]]:
    """Split a fuzz input into ``(policy index, flags, [(op, data), ...])``."""
    if len(data) < 2:
        return 0, 0, []
    pol, flags = data[0], data[1]
    ops: list[tuple[int, bytes]] = []
    pos = 2
    n = len(data)
    while pos < n:
        op = data[pos] % 8
        pos += 1
        if op == 7:
            op = OP_CLIENT
        if op in (OP_CLIENT, OP_BROKER, OP_TIMER):
            if pos + 2 > n:
                length = n - pos
                ln_lo = data[pos] if pos < n else 0
                pos_data = pos + min(2, n - pos)
            else:
                length = (data[pos] << 8) | data[pos + 1]
                ln_lo = data[pos + 1]
                pos_data = pos + 2
            if op == OP_TIMER:
                ops.append((op, bytes([ln_lo])))
                pos = pos_data
                continue
            chunk = data[pos_data : pos_data + length]
            pos = pos_data + len(chunk)
            ops.append((op, chunk))
        else:
            ops.append((op, b""))
    return pol, flags, ops


def encode_script(policy_index: int, flags: int, ops: Iterable[tuple[int, bytes]]) -> bytes:
    """Inverse of :func:`parse_script` (data longer than 65535 bytes is split)."""
    out = bytearray([policy_index & 0xFF, flags & 0xFF])
    for op, data in ops:
        if op in (OP_CLIENT, OP_BROKER):
            for i in range(0, max(len(data), 1), 65535):
                part = data[i : i + 65535]
                out += bytes([op]) + len(part).to_bytes(2, "big") + part
        elif op == OP_TIMER:
            out += bytes([op, 0, data[0] if data else 100])
        else:
            out += bytes([op])
    return bytes(out)


class _Observer:
    """Executes commands like the relay would and checks the policy invariants."""

    def __init__(self, conn: ProxyConnection, pol: Any) -> None:
        self.conn = conn
        self.policy = pol
        self.to_broker = bytearray()
        self.broker_pos = 0
        self.approved = False
        self.denied = False
        self.closed_events = 0
        self.connect_requested = False
        self.broker_up = False
        self.channels: dict[int, set[int]] = {}
        """Channels the router saw begun -> handles it saw attached on them."""

    def run(self, cmds: list[Any]) -> None:
        for cmd in cmds:
            t = type(cmd)
            if t is SendData:
                if cmd.side is Side.ROUTER:
                    if not self.broker_up:
                        raise Finding("SendData to the router before it connected")
                    self.to_broker += bytes(cmd.data)
                    self._scan_broker()
            elif t is Emit:
                ev = cmd.event
                if isinstance(ev, ConnectionApproved):
                    if self.approved:
                        raise Finding("approved twice")
                    self.approved = True
                elif isinstance(ev, ConnectionDenied):
                    self.denied = True
                elif isinstance(ev, ConnectionClosed):
                    self.closed_events += 1
            elif t is ConnectRouter:
                if self.connect_requested:
                    raise Finding("ConnectRouter issued twice")
                self.connect_requested = True
            elif t is not CloseTransport:
                raise Finding(f"unknown command {cmd!r}")

    def _scan_broker(self) -> None:
        """Parse what the router received so far; check each new frame against policy."""
        buf = self.to_broker
        pos = self.broker_pos
        while len(buf) - pos >= 8:
            if buf[pos : pos + 4] == b"AMQP":
                pos += 8
                continue
            size, doff, ftype, channel = _HDR.unpack_from(buf, pos)
            if size < 8 or doff < 2 or doff * 4 > size:
                raise Finding(f"the router was sent a malformed frame header at {pos}")
            if len(buf) - pos < size:
                break
            if ftype == 0 and _descriptor(buf, pos, doff, size) == 0x18:
                pass  # the proxy may Close the router's connection at any time
            elif ftype == 0:
                if not self.approved:
                    raise Finding("an AMQP frame reached the router before the Open decision")
                if self.denied:
                    raise Finding("an AMQP frame reached the router after a denial")
                self._check_amqp(bytes(buf[pos : pos + size]), doff, channel)
            pos += size
        self.broker_pos = pos

    def _check_amqp(self, raw: bytes, doff: int, channel: int) -> None:
        body = doff * 4
        if body == len(raw):
            return
        code = is_transfer_descriptor(raw, body, len(raw))
        if code is None:  # a symbolic or unusual descriptor: the codec decides, as the proxy
            code = decode_performative(raw[body:])[0].DESCRIPTOR
        if code in (0x10, 0x18):  # open, close
            return
        if code == 0x11:  # begin
            self.channels[channel] = set()
            return
        handles = self.channels.get(channel)
        if handles is None:
            raise Finding(f"the router received 0x{code:x} on channel {channel} never begun")
        if code == 0x17:  # end
            del self.channels[channel]
            return
        if code == 0x14:
            perf, _ = decode_performative(raw[body:])
            handle = int(perf.handle)
            if handle not in handles:
                raise Finding(f"the router received a transfer on unattached handle {handle}")
            return
        if code == 0x16:  # detach
            perf, _ = decode_performative(raw[body:])
            handles.discard(int(perf.handle))
            return
        if code != 0x12:
            return
        perf, _ = decode_performative(raw[body:])
        assert isinstance(perf, Attach)
        handles.add(int(perf.handle))
        conn = self.conn
        group = conn.group
        if group is None:
            return  # not governed (vhost policy disabled)
        is_sender = perf.role is False or perf.role == 0
        terminus = perf.target if is_sender else perf.source
        address = getattr(terminus, "address", None)
        address = None if address is None else str(address)
        user = conn.user or ""
        if is_sender:
            reason = decisions.approve_sender(group, user=user, target_address=address or None,
                                              open_senders=0)
        else:
            reason = decisions.approve_receiver(
                group, user=user, source_address=address or None,
                dynamic=bool(getattr(terminus, "dynamic", False)), open_receivers=0)
        topics = getattr(group, "topics", None)
        if reason is None and topics is not None and address and not bool(
                getattr(terminus, "dynamic", False)):
            qos = qos_of(None if perf.snd_settle_mode is None else int(perf.snd_settle_mode),
                         None if perf.rcv_settle_mode is None else int(perf.rcv_settle_mode))
            check = topics.check_publish if is_sender else topics.check_subscribe
            if not check(Principal(user, group.name), address, qos=qos, wall_now=0.0).allowed:
                reason = "topic"
        if reason is not None and reason not in ("sender_limit", "receiver_limit"):
            raise Finding(f"the router received a {'sender' if is_sender else 'receiver'} "
                          f"Attach to {address!r} for user {user!r} that policy denies "
                          f"({reason})")


def _descriptor(buf: bytearray, pos: int, doff: int, size: int) -> int | None:
    body = pos + doff * 4
    return is_transfer_descriptor(buf, body, pos + size)


def _check_buffers(conn: ProxyConnection) -> None:
    client, router, figures = conn.client, conn.router, conn.figures
    cl = conn.client_frame_limit
    if len(client.buf) >= max(cl, 8):
        raise Finding(f"client buffer {len(client.buf)} bytes, frame limit {cl}")
    bl = max(conn.router_frame_limit, PRE_OPEN_FRAME_LIMIT)
    if len(router.buf) >= max(bl, 8):
        raise Finding(f"router buffer {len(router.buf)} bytes, frame limit {bl}")
    if len(client.held) > HELD_LIMIT + cl:
        raise Finding(f"{len(client.held)} bytes held before the Open decision")
    if sum(len(f) for f in router.held) > HELD_LIMIT + bl:
        raise Finding("router frames held before the decision exceed the bound")
    for name in ("active_sessions", "active_senders", "active_receivers"):
        if getattr(figures, name) < 0:
            raise Finding(f"{name} went negative: {getattr(figures, name)}")


def run_connection(data: bytes) -> None:
    """Drive one ProxyConnection with the script in ``data``; raise :class:`Finding` on a bug."""
    pol_index, flags, ops = parse_script(data)
    pol = policy(pol_index)
    ledger = ConnectionLedger(10)
    remote = "10.9.9.9" if flags & 1 else "127.0.0.1"
    now = 0.0
    conn = ProxyConnection("fuzz", remote_host=remote, listener="l", policy=pol, ledger=ledger,
                           now=now, handshake_timeout=10.0)
    obs = _Observer(conn, pol)
    connect_at_once = not flags & 2
    try:
        for op, chunk in ops:
            if op == OP_CLIENT:
                obs.run(conn.receive_data(Side.CLIENT, chunk, now))
                if connect_at_once and obs.connect_requested and not obs.broker_up:
                    obs.broker_up = True
                    obs.run(conn.router_connected(now))
            elif op == OP_BROKER:
                if obs.broker_up:
                    obs.run(conn.receive_data(Side.ROUTER, chunk, now))
            elif op == OP_UP:
                if obs.connect_requested and not obs.broker_up:
                    obs.broker_up = True
                    obs.run(conn.router_connected(now))
            elif op == OP_FAILED:
                if obs.connect_requested and not obs.broker_up:
                    obs.run(conn.router_connect_failed(now))
                    obs.connect_requested = False  # no more attempts
                    obs.broker_up = False
            elif op == OP_BROKER_LOST:
                if obs.broker_up:
                    obs.run(conn.connection_lost(Side.ROUTER, now))
            elif op == OP_TIMER:
                now += chunk[0] / 10 if chunk else 0.1
                deadline = conn.get_timer()
                if deadline is not None and now >= deadline:
                    obs.run(conn.handle_timer(now))
            elif op == OP_SHUTDOWN:
                obs.run(conn.begin_shutdown(now))
            _check_buffers(conn)
        # the end: both transports gone, in the order the relay sees them
        if obs.broker_up:
            obs.run(conn.connection_lost(Side.ROUTER, now))
        obs.run(conn.connection_lost(Side.CLIENT, now))
        obs.run(conn.connection_lost(Side.CLIENT, now + 1))
    except Finding:
        raise
    except Exception as exc:  # anything escaping the core is a bug
        raise Finding(f"{type(exc).__name__} escaped ProxyConnection: {exc}") from exc
    if not conn.finished:
        raise Finding("connection not finished after both transports were lost")
    if ledger.active() != 0:
        raise Finding(f"ledger still counts {ledger.active()} admitted connection(s)")
    expected = 1 if conn.view.admitted else 0
    if obs.closed_events != expected:
        raise Finding(f"{obs.closed_events} ConnectionClosed events, expected {expected}")
