"""Property: multi-frame deliveries cut up and interleaved the way a hostile client may send
them (two sessions, several sender links, continuation frames with or without a delivery-id,
``settled`` switched mid-delivery, aborted frames, frames of other links between the frames
of one delivery, hand-written Transfer encodings the C scanner does or does not read) give
exactly the same commands with the C parts, without them, and through the general handlers
alone; and what the router receives never holds a whole delivery over ``maxMessageSize`` or,
under QDR's user-id check, a delivery whose ``user-id`` is not the user's.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

from amqp_policy_proxy.amqp import accel
from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.message import read_message_head
from amqp_policy_proxy.amqp.transfer import read_transfer_fields
from amqp_policy_proxy.core.commands import Side

from ..support.encodings import transfer_body
from ..support.scanners import general_only, scanners
from ..unit.core.helpers import (
    Attach,
    Script,
    Target,
    Transfer,
    frame,
    make_policy,
    merged_commands,
)

MAX = 300


def _policy(trusted: bool) -> Any:
    return make_policy({"all": {
        "users": "*", "remoteHosts": "*", "sources": "*", "targetPattern": "q.#",
        "allowAnonymousSender": True, "allowUserIdProxy": trusted, "maxMessageSize": MAX,
    }})


POLICIES = {"uid-checked": _policy(False), "uid-trusted": _policy(True)}
HEARTBEAT = bytes.fromhex("0000000802000000")
ACCEL = [pytest.param("c", marks=pytest.mark.skipif(
    accel.scan_c is None, reason="C extension not built")), "python"]

#: (channel, handle): named q.a and anonymous on channel 0, named q.b on channel 1.
LINKS = [(0, 0), (0, 1), (1, 0)]


def _message(user_id: bytes | None, to: str | None, size: int) -> bytes:
    msg = Message(body=b"b" * size, address=to)
    if user_id is not None:
        msg.user_id = user_id
    return msg.encode()


#: One client Transfer frame (or a heartbeat).
ops = st.one_of(
    st.tuples(
        st.sampled_from(range(len(LINKS))),
        st.sampled_from(["next", "next", "none", "same", "other"]),  # delivery-id
        st.sampled_from([None, False, True]),  # settled
        st.sampled_from([True, True, False, None]),  # more
        st.sampled_from([6, 6, 6, 5, 3, 2]),  # field count (more absent below 6)
        st.booleans(),  # wide uints
        st.sampled_from([False, False, True]),  # list32
        st.sampled_from([False, False, False, True]),  # 0x56 booleans (C stops, Python reads)
        st.sampled_from(["head", "head", "rest", "rest", "empty", "big"]),  # payload
        st.sampled_from([None, b"alice", b"mallory", b""]),  # user-id of a head
        st.sampled_from([None, "q.x", "z.bad"]),  # to of a head
        st.sampled_from([0, 30, 150, 400]),  # body size of a head
        st.sampled_from([False, False, False, False, True]),  # aborted (proton-encoded)
    ),
    st.just("hb"),
)


def _stream(items: list[Any]) -> bytes:
    out = bytearray()
    next_id = {0: 0, 1: 0}
    last_id: dict[int, int] = {0: 0, 1: 0}
    for item in items:
        if item == "hb":
            out += HEARTBEAT
            continue
        (link, idk, settled, more, count, wide, list32, long_bool, kind, uid, to, size,
         aborted) = item
        channel, handle = LINKS[link]
        if idk == "next":
            did: int | None = next_id[channel]
            next_id[channel] += 1
            last_id[channel] = did
        elif idk == "same":
            did = last_id[channel]
        elif idk == "other":
            did = 7
        else:
            did = None
        if aborted:
            out += frame(channel, Transfer(handle=handle, delivery_id=did, more=False,
                                           aborted=True))
            continue
        if kind == "head":
            payload = _message(uid, to, size)
            if more:
                payload = payload[:len(payload) // 2 or 1]
        elif kind == "rest":
            payload = b"r" * (size // 3)
        elif kind == "big":
            payload = b"B" * (MAX - 20)
        else:
            payload = b""
        out += encode_frame(channel, transfer_body(
            handle, did, b"t", count=count, settled=settled, more=more, wide=wide, list32=list32,
            long_bool=long_bool, payload=payload))
    return bytes(out)


def _drive(stream: bytes, cuts: list[int], policy: Any) -> tuple[Any, ...]:
    s = Script(policy)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.begin(1, router_channel=1)
    s.client(frame(0, Attach(name="qa", handle=0, role=False, target=Target(address="q.a"))))
    s.client(frame(0, Attach(name="relay", handle=1, role=False, target=Target())))
    s.client(frame(1, Attach(name="qb", handle=0, role=False, target=Target(address="q.b"))))
    s.router(frame(0, Attach(name="qa", handle=0, role=True, target=Target(address="q.a"))))
    s.router(frame(0, Attach(name="relay", handle=1, role=True, target=Target())))
    s.router(frame(1, Attach(name="qb", handle=0, role=True, target=Target(address="q.b"))))
    start = len(s.sent[Side.ROUTER])
    commands = s.client_in_reads(stream, cuts)
    c = s.conn
    figures = (c.figures.transfers_in, c.figures.bytes_in, c.view.client_state, c.close_reason)
    return merged_commands(commands), figures, bytes(s.sent[Side.ROUTER][start:])


def _router_reads(data: bytes, check_uid: bool) -> None:
    """The router's view (proton: a link's delivery runs until a frame without ``more`` or an
    aborted one): every whole delivery it receives is within maxMessageSize and, under the
    user-id check, carries no other user's user-id; no relay message goes to z.bad."""
    pos = 0
    pending: dict[tuple[int, int], bytearray] = {}
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        if size < 8 or data[pos:pos + 4] == b"AMQP":
            return
        channel = int.from_bytes(data[pos + 6:pos + 8], "big")
        body, fend = pos + data[pos + 4] * 4, pos + size
        pos = fend
        if fend - body < 3 or data[body:body + 3] != b"\x00\x53\x14":
            continue
        handle, _, _, more, aborted, payload, _ = read_transfer_fields(data, body, fend)
        key = (channel, handle)
        msg = pending.setdefault(key, bytearray())
        msg += data[payload:fend]
        if aborted:
            del pending[key]
        elif not more:
            whole = bytes(pending.pop(key))
            assert len(whole) <= MAX, ("oversize delivery reached the router", key, len(whole))
            try:
                head = read_message_head(whole, 0, len(whole), last=True)
            except DecodeError:
                continue
            if check_uid:
                assert head.user_id in (None, b"", b"alice"), ("user-id", key, head)
            if key == (0, 1):
                assert head.to != "z.bad", ("relay to", key, head)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@given(st.lists(ops, min_size=1, max_size=14), st.data())
@settings(max_examples=120, deadline=None)
def test_interleaved_multi_frame_deliveries(policy, items, data):
    stream = _stream(items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    runs = {}
    for scanner in ("c", "python") if accel.scan_c is not None else ("python",):
        with scanners(scanner):
            runs[scanner] = _drive(stream, cuts, POLICIES[policy])
    with scanners("python"), general_only():
        reference = _drive(stream, cuts, POLICIES[policy])
    for scanner, got in runs.items():
        assert got[:2] == reference[:2], scanner
    _router_reads(reference[2], policy == "uid-checked")
