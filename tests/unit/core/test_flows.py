"""core/flows.py: the session window the client is given (``maxSessionWindow``) holds.

alice's group: maxFrameSize 4096, maxSessionWindow 40960, so the client's incoming-window is
10 Transfer frames, reopened by the proxy's own session Flows once half is used. A Transfer
past it ends the connection as proton does (``amqp:session:window-violation``, "incoming
session window exceeded"), whether the frames come one per read or all in one read (the C
scanner's runs), and the router never gets the frame past the window.
"""

from __future__ import annotations

from proton import Message

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ProtocolViolation

from .helpers import Attach, Close, Flow, Script, Target, Transfer, frame, make_policy
from .test_connection import GROUPS

POLICY = make_policy(GROUPS)
WINDOW = 40960 // 4096
PAYLOAD = Message(body="x").encode()


def sender_session() -> Script:
    s = Script(POLICY)
    s.open(user="alice")
    s.begin(0, router_channel=4)
    s.client(frame(0, Attach(name="s", handle=0, role=False, target=Target(address="public.a"))))
    s.router(frame(4, Attach(name="s", handle=0, role=True, target=Target(address="public.a"),
                             initial_delivery_count=None)))
    s.router(frame(4, Flow(next_incoming_id=0, incoming_window=2147483647, next_outgoing_id=0,
                           outgoing_window=2147483647, handle=0, delivery_count=0,
                           link_credit=1000)))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    return s


def transfers(first: int, n: int) -> bytes:
    return b"".join(frame(0, Transfer(handle=0, delivery_id=first + i, delivery_tag=b"%d" % i,
                                      settled=True), PAYLOAD) for i in range(n))


def relayed(s: Script) -> int:
    return sum(isinstance(p, Transfer) for _, p, _ in s.take(Side.ROUTER))


def closed_with_window_violation(s: Script) -> bool:
    closes = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Close)]
    return bool(closes) and (str(closes[0].error.condition) == C.Condition.SESSION_WINDOW_VIOLATION
                             and closes[0].error.description == "incoming session window exceeded")


def test_transfers_pipelined_past_the_window_end_the_connection():
    s = sender_session()
    s.client(transfers(0, WINDOW + 1))  # one write: the client saw no Flow in between
    assert relayed(s) == WINDOW
    assert closed_with_window_violation(s)
    violations = [e for e in s.events if isinstance(e, ProtocolViolation)]
    assert [(v.side, v.condition) for v in violations] == [
        ("client", C.Condition.SESSION_WINDOW_VIOLATION)]


def test_every_frame_of_a_multi_frame_delivery_counts():
    s = sender_session()
    message = Message(body=b"m" * 200).encode()
    step = len(message) // (WINDOW + 1) + 1
    parts = [message[i:i + step] for i in range(0, len(message), step)]
    assert len(parts) == WINDOW + 1
    frames = [frame(0, Transfer(handle=0, delivery_id=0 if i == 0 else None,
                                delivery_tag=b"t" if i == 0 else None,
                                more=i < len(parts) - 1), part) for i, part in enumerate(parts)]
    s.client(b"".join(frames))
    assert relayed(s) <= WINDOW  # (the proxy may hold a delivery's first frames for its head)
    assert closed_with_window_violation(s)


def test_the_proxy_reopens_the_window_between_reads():
    s = sender_session()
    total = 0
    chunk = WINDOW // 2 + 1  # more than half of the window each time: reopened after each read
    for first in range(0, 6 * chunk, chunk):
        s.client(transfers(first, chunk))
        total += relayed(s)
        client = s.take(Side.CLIENT)
        assert not [p for _, p, _ in client if isinstance(p, Close)]
        flows = [p for _, p, _ in client if isinstance(p, Flow) and p.handle is None]
        assert flows and int(flows[-1].next_incoming_id) == first + chunk
        assert int(flows[-1].incoming_window) == WINDOW
    assert total == 6 * chunk


def test_a_frame_at_a_time_within_the_window_never_violates():
    s = sender_session()
    for i in range(3 * WINDOW):
        s.client(transfers(i, 1))
    assert relayed(s) == 3 * WINDOW
    assert not [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Close)]
