"""Property: the steady-state fast path of ``ProxyConnection`` (``_client_relay``) behaves
exactly like the general per-frame handlers it short-cuts.

The same client byte stream, cut into the same reads, is fed to two connections: one as it
is, one with the fast path switched off (every admitted frame through ``_client_amqp_frame``).
The commands both produce (bytes to each side, events, transport closes, in order) and the
connection figures must be identical. The traffic mixes everything the fast path has to hand
back: multi-frame deliveries, messages over maxMessageSize (alone and across frames),
anonymous-relay messages with allowed and denied ``to``, ``user-id`` checks, aborted and
pre-settled deliveries, heartbeats, Flows and Dispositions, transfers on a denied link and,
optionally, a protocol error at the end. Refused deliveries are withheld: in both runs the
router reads delivery-ids 0, 1, 2... with no aborted stand-in, and its Disposition settling
everything at the end reaches the client renumbered the same way.

Every comparison runs twice: with the C scanner of ``amqp.accel`` (runs of plain Transfers
on one link skipped in C) and with the pure-Python loop alone; and under two policies, one
that checks ``user-id`` on every message (no run can be skipped) and one that does not.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

import amqp_policy_proxy.core.fastpath as fastpath
from amqp_policy_proxy.amqp import accel
from amqp_policy_proxy.amqp.performatives import Accepted, Disposition
from amqp_policy_proxy.core.commands import SendData, Side

from ..support.scanners import general_only, scanners
from ..unit.core.helpers import (
    Attach,
    Detach,
    Flow,
    Script,
    Source,
    Target,
    Transfer,
    frame,
    make_policy,
    merged_commands,
    parse_frames,
)

POLICY = make_policy({"all": {
    "users": "*", "remoteHosts": "*", "sources": "*", "targetPattern": "q.#, ${user}.#",
    "allowAnonymousSender": True, "allowUserIdProxy": False, "maxMessageSize": 700,
}})
#: The same groups, trusting the user-id: the steady state of named links needs no decision.
POLICY_TRUSTED = make_policy({"all": {
    "users": "*", "remoteHosts": "*", "sources": "*", "targetPattern": "q.#, ${user}.#",
    "allowAnonymousSender": True, "allowUserIdProxy": True, "maxMessageSize": 700,
}})
POLICIES = {"uid-checked": POLICY, "uid-trusted": POLICY_TRUSTED}
HEARTBEAT = bytes.fromhex("0000000802000000")
ACCEL = [pytest.param("c", marks=pytest.mark.skipif(
    accel.scan_c is None, reason="C extension not built")), "python"]


messages = st.tuples(
    st.sampled_from([0, 0, 0, 1, 1, 2]),  # handle: named q.a, anonymous relay, denied link
    st.one_of(st.binary(max_size=60),  # body; around 700 bytes with the sections: oversize
              st.integers(640, 720).map(lambda n: b"b" * n)),
    st.sampled_from([None, "q.x", "alice.in", "bad.y"]),  # to
    st.sampled_from([None, b"alice", b"mallory"]),  # user-id
    st.sampled_from([2000, 2000, 150, 40]),  # frame payload size (multi-frame when small)
    st.booleans(),  # pre-settled
    st.sampled_from([False, False, False, True]),  # abort after the first frame
    st.sampled_from(["", "", "hb", "flow", "disp"]),  # something between messages
)


def _stream(msgs: list[tuple[Any, ...]], tail: str) -> bytes:
    out = bytearray()
    out += frame(0, Attach(name="qa", handle=0, role=False, target=Target(address="q.a")))
    out += frame(0, Attach(name="relay", handle=1, role=False, target=Target()))
    out += frame(0, Attach(name="nope", handle=2, role=False, target=Target(address="z.z")))
    out += frame(0, Attach(name="rx", handle=3, role=True, source=Source(address="q.a")))
    did = 0
    for handle, body, to, user_id, chunk, settled, abort, extra in msgs:
        msg = Message(body=body, address=to)
        if user_id is not None:
            msg.user_id = user_id
        payload = msg.encode()
        parts = [payload[j:j + chunk] for j in range(0, len(payload), chunk)] or [b""]
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            if k == 0:
                t = Transfer(handle=handle, delivery_id=did, delivery_tag=b"t%d" % did,
                             message_format=0, settled=settled or None, more=not last)
            else:
                t = Transfer(handle=handle, more=not last)
            if abort and k == 1:
                out += frame(0, Transfer(handle=handle, more=False, aborted=True))
                break
            out += frame(0, t, part)
        did += 1
        if extra == "hb":
            out += HEARTBEAT
        elif extra == "flow":
            out += frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=did,
                                 outgoing_window=100, handle=3, delivery_count=0,
                                 link_credit=10))
        elif extra == "disp":
            out += frame(0, Disposition(role=False, first=0, settled=True))
    if tail == "detach":
        out += frame(0, Detach(handle=0, closed=True))
        out += frame(0, Transfer(handle=0, delivery_id=did, delivery_tag=b"x", more=False))
    elif tail == "bad-handle":
        out += frame(0, Transfer(handle=9, delivery_id=did, delivery_tag=b"x"))
    elif tail == "garbage":
        out += bytes.fromhex("0000000c02000000005314c0")
    return bytes(out)


def _run(stream: bytes, cuts: list[int], fast: bool, policy: Any = POLICY) -> tuple[Any, ...]:
    if fast:
        return _drive(stream, cuts, policy)
    with general_only():
        return _drive(stream, cuts, policy)


def _drive(stream: bytes, cuts: list[int], policy: Any) -> tuple[Any, ...]:
    s = Script(policy)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.router(frame(0, Attach(name="qa", handle=0, role=True, target=Target(address="q.a"))))
    commands = s.client_in_reads(stream, cuts)
    _router_numbering_is_contiguous(commands)
    # the router settles everything it got at once: its outcomes reach the client's ids
    commands.extend(s.router(frame(0, Disposition(role=True, first=0, last=1000, settled=True,
                                                  state=Accepted()))))
    c = s.conn
    figures = (c.figures.transfers_in, c.figures.bytes_in, c.view.client_state, c.close_reason,
               c.figures.active_senders)
    return merged_commands(commands), figures


def _router_numbering_is_contiguous(commands: list[Any]) -> None:
    """What the router reads numbers deliveries 0, 1, 2... (the client's ids minus the ones
    withheld, decision 0002), and no aborted Transfer stands in for a refused delivery (the
    client's own aborts, continuation frames without an id, pass)."""
    data = b"".join(bytes(c.data) for c in commands
                    if type(c) is SendData and c.side is Side.ROUTER)
    ids = []
    for _, perf, _ in parse_frames(data):
        if isinstance(perf, Transfer) and perf.delivery_id is not None:
            assert not perf.aborted
            if not ids or int(perf.delivery_id) != ids[-1]:  # a continuation repeats its id
                ids.append(int(perf.delivery_id))
    assert ids == list(range(len(ids)))


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("scanner", ACCEL)
@given(st.lists(messages, min_size=1, max_size=8),
       st.sampled_from(["", "", "detach", "bad-handle", "garbage"]), st.data())
@settings(max_examples=150, deadline=None)
def test_fast_path_matches_the_general_handlers(scanner, policy, msgs, tail, data):
    stream = _stream(msgs, tail)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    with scanners(scanner):
        fast = _run(stream, cuts, fast=True, policy=POLICIES[policy])
    assert fast == _run(stream, cuts, fast=False, policy=POLICIES[policy])


one_link = st.tuples(
    st.just(0),  # the named link only: the runs the C scanner skips
    st.one_of(st.binary(max_size=60), st.integers(690, 760).map(lambda n: b"b" * n)),
    st.sampled_from([None, "q.x"]),
    st.sampled_from([None, b"alice", b"mallory"]),
    st.sampled_from([2000, 2000, 2000, 150]),
    st.booleans(),
    st.sampled_from([False, False, False, False, True]),
    st.sampled_from(["", "", "", "hb", "flow", "disp"]),
)


@pytest.mark.parametrize("scanner", ACCEL)
@given(st.lists(one_link, min_size=2, max_size=10), st.sampled_from(["", "detach", "garbage"]),
       st.data())
@settings(max_examples=150, deadline=None)
def test_runs_on_one_link_match_the_general_handlers(scanner, msgs, tail, data):
    """Long runs on one link, where the scanner does most of the work, broken by every kind
    of frame it must hand back (oversize, multi-frame, aborted, Flow, Disposition)."""
    stream = _stream(msgs, tail)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    with scanners(scanner):
        fast = _run(stream, cuts, fast=True, policy=POLICY_TRUSTED)
    assert fast == _run(stream, cuts, fast=False, policy=POLICY_TRUSTED)


@pytest.mark.parametrize("scanner", ACCEL)
def test_fast_path_is_taken(scanner):
    """The comparison above is only meaningful if the fast path (and, with the C build,
    the scanner) runs at all."""
    calls = []
    scanned = []
    original = fastpath.FastPath.relay

    def spy(self, *args):
        calls.append(1)
        return original(self, *args)

    def scan_spy(*args):
        result = accel.scan_c(*args)
        scanned.append(result[1])
        return result

    fastpath.FastPath.relay = spy  # type: ignore[method-assign]
    try:
        with scanners(scanner):
            if scanner == "c":
                accel.scan = scan_spy  # reset when scanners() ends
            stream = _stream([(0, b"x", None, None, 2000, True, False, "")] * 5, "")
            fast = _run(stream, [], fast=True, policy=POLICY_TRUSTED)
    finally:
        fastpath.FastPath.relay = original  # type: ignore[method-assign]
    assert calls and any(not isinstance(m, str) and m[0] is Side.ROUTER
                         and m[1].endswith(stream[-60:]) for m in fast[0])
    assert fast == _run(stream, [], fast=False, policy=POLICY_TRUSTED)
    if scanner == "c":
        assert sum(scanned) == 5  # the first Transfer's fields read in Python, all five passed in C


@given(st.lists(st.tuples(st.binary(max_size=3000), st.sampled_from([3000, 500, 60])),
                min_size=1, max_size=6),
       st.lists(st.integers(1, 4000), min_size=1, max_size=12))
@settings(max_examples=100, deadline=None)
def test_router_bytes_reach_the_client_unchanged_in_any_reads(deliveries, reads):
    """Router to client: Transfers (single and multi-frame), Flows, Dispositions and
    heartbeats cut into arbitrary reads arrive byte for byte (frames that straddle reads are
    completed without re-buffering the read)."""
    s = Script(POLICY)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.client(frame(0, Attach(name="rx", handle=3, role=True, source=Source(address="q.a"))))
    s.router(frame(0, Attach(name="rx", handle=7, role=False, source=Source(address="q.a"),
                             initial_delivery_count=0)))
    s.take(Side.CLIENT)
    stream = bytearray()
    for i, (body, chunk) in enumerate(deliveries):
        payload = Message(body=body).encode()
        parts = [payload[j:j + chunk] for j in range(0, len(payload), chunk)]
        for k, part in enumerate(parts):
            t = (Transfer(handle=7, delivery_id=i, delivery_tag=b"%d" % i, message_format=0,
                          more=k < len(parts) - 1) if k == 0
                 else Transfer(handle=7, more=k < len(parts) - 1))
            stream += frame(0, t, part)
        stream += HEARTBEAT
        stream += frame(0, Disposition(role=False, first=i, settled=True))
        stream += frame(0, Flow(next_incoming_id=i, incoming_window=100, next_outgoing_id=i + 1,
                                outgoing_window=100, handle=7, delivery_count=i + 1,
                                link_credit=10))
    data = bytes(stream)
    pos = 0
    for n in reads * (len(data) // max(1, sum(reads)) + 1):
        if pos >= len(data):
            break
        s.router(data[pos:pos + n])
        pos += n
    if pos < len(data):
        s.router(data[pos:])
    assert bytes(s.sent[Side.CLIENT]) == data
    assert s.conn.figures.transfers_out == sum(
        len(range(0, len(Message(body=b).encode()), c)) or 1 for b, c in deliveries)


def _close_exchange(body: bytes, client_first: bool) -> list[Any]:
    s = Script(POLICY)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    frame_ = len(body).__add__(8).to_bytes(4, "big") + b"\x02\x00\x00\x00" + body
    steps = [("client", frame_), ("broker", frame_)]
    if not client_first:
        steps.reverse()
    seen = []
    for side, data in steps:
        cmds = s.client(data) if side == "client" else s.router(data)
        seen.append([(type(c).__name__, getattr(c, "side", None), bytes(getattr(c, "data", b"")))
                     for c in cmds])
    seen.append((s.conn.view.client_state, s.conn.close_reason, s.conn.close_received_from(Side.CLIENT),
                 s.conn.close_received_from(Side.ROUTER)))
    return seen


def test_empty_close_recognised_from_its_bytes_behaves_as_decoded(monkeypatch):
    import amqp_policy_proxy.core.client_side as core
    import amqp_policy_proxy.core.router_side as router_side

    bodies = sorted(core.EMPTY_CLOSE_BODIES) + [bytes.fromhex("005318c0020140")]
    for client_first in (True, False):
        fast = [_close_exchange(b, client_first) for b in bodies]
        monkeypatch.setattr(core, "EMPTY_CLOSE_BODIES", frozenset())
        monkeypatch.setattr(router_side, "EMPTY_CLOSE_BODIES", frozenset())
        decoded = [_close_exchange(b, client_first) for b in bodies]
        monkeypatch.undo()
        assert fast == decoded
