"""Transcript tests of topic authorization in ProxyConnection (docs/topic-authorization.md, decision 0004).

Bytes in, exact frames out: link denials by the topic models, relay messages checked per
``to``, deliveries withheld from a wildcard subscriber (payload-less frames, the last one
aborted; the router's delivery settled with ``accepted``) and ``durable`` cleared in place.
"""

from __future__ import annotations

from proton import Message

from amqp_policy_proxy.amqp.performatives import Accepted, Disposition, Rejected
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import LinkDenied, MessageDenied

from .helpers import Attach, Detach, Script, Source, Target, Transfer, frame, make_policy

TREE = {
    "model": "nearestAcl",
    "separator": "/",
    "wildcards": "mqtt",
    "nodes": {
        "": {"publish": ["*"], "subscribe": ["*"], "persistent": ["*"]},
        "A": {"publish": ["joe"], "subscribe": ["*"], "persistent": []},
        "A/B": {"publish": ["joe"], "subscribe": ["@HR"]},
    },
}
GROUPS = {
    "HR": {"users": "hank", "remoteHosts": "*", "sources": "*", "targets": "*"},
    "everyone": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*",
                 "allowAnonymousSender": True},
}
POLICY = make_policy(GROUPS, topicTree=TREE)


def subscribed(user: str, address: str = "A/+") -> Script:
    """An admitted connection with one receiver on ``address``; router handle 5, channel 0."""
    s = Script(POLICY)
    s.open(user=user)
    s.begin(0, router_channel=0)
    s.client(frame(0, Attach(name="sub", handle=0, role=True, source=Source(address=address),
                             target=Target())))
    s.router(frame(0, Attach(name="sub", handle=5, role=False, source=Source(address=address),
                             target=Target(), initial_delivery_count=0)))
    s.take(Side.ROUTER), s.take(Side.CLIENT)
    return s


def message(to: str, body: str = "x", durable: bool = True) -> bytes:
    return Message(address=to, body=body, durable=durable).encode()


def delivery(delivery_id: int, payload: bytes, *, settled: bool = False, more: bool = False,
             first: bool = True) -> bytes:
    if first:
        t = Transfer(handle=5, delivery_id=delivery_id, delivery_tag=str(delivery_id).encode(),
                     message_format=0, settled=settled, more=more)
    else:
        t = Transfer(handle=5, more=more)
    return frame(0, t, payload)


def decode(payload: bytes) -> Message:
    m = Message()
    m.decode(payload)
    return m


class TestWithheldDeliveries:
    def test_single_frame_delivery_becomes_an_aborted_settled_transfer(self):
        s = subscribed("dave")
        s.router(delivery(0, message("A/B")))
        [(ch, t, payload)] = s.take(Side.CLIENT)
        assert (ch, payload) == (0, b"")
        assert (int(t.handle), int(t.delivery_id), bytes(t.delivery_tag)) == (5, 0, b"0")
        assert t.aborted is True and t.settled is True
        [(ch, disp, _)] = s.take(Side.ROUTER)
        assert isinstance(disp, Disposition) and ch == 0
        assert (disp.role, int(disp.first), disp.settled) == (True, 0, True)
        assert isinstance(disp.state, Accepted)
        [denied] = [e for e in s.events if isinstance(e, MessageDenied)]
        assert (str(denied.reason), denied.address) == ("topic_withheld", "A/B")

    def test_multi_frame_delivery_keeps_one_frame_per_frame(self):
        s = subscribed("dave")
        payload = message("A/B", body="y" * 3000)
        parts = [payload[:1000], payload[1000:2000], payload[2000:]]
        s.router(delivery(7, parts[0], more=True))
        s.router(delivery(7, parts[1], more=True, first=False))
        assert s.take(Side.ROUTER) == []  # settled only once the whole delivery went by
        s.router(delivery(7, parts[2], first=False))
        frames = s.take(Side.CLIENT)
        assert [(bool(t.more), bool(t.aborted), p) for _, t, p in frames] == [
            (True, False, b""), (True, False, b""), (False, True, b"")]
        assert int(frames[0][1].delivery_id) == 7 and frames[1][1].delivery_id is None
        [(_, disp, _)] = s.take(Side.ROUTER)
        assert int(disp.first) == 7 and disp.settled

    def test_presettled_delivery_needs_no_disposition(self):
        s = subscribed("dave")
        s.router(delivery(0, message("A/B"), settled=True))
        assert len(s.take(Side.CLIENT)) == 1
        assert s.take(Side.ROUTER) == []

    def test_visible_delivery_keeps_its_bytes_except_durable(self):
        s = subscribed("hank")  # HR may see A/B; nobody has persistent under A
        raw = delivery(3, message("A/B", body="for HR"))
        s.router(raw)
        out = bytes(s.sent[Side.CLIENT])
        assert len(out) == len(raw) and sum(a != b for a, b in zip(out, raw, strict=True)) == 1
        [(_, t, payload)] = s.take(Side.CLIENT)
        m = decode(payload)
        assert (m.body, m.address, m.durable) == ("for HR", "A/B", False)
        assert int(t.delivery_id) == 3 and not t.aborted
        assert s.take(Side.ROUTER) == []

    def test_withheld_then_visible_deliveries_in_one_read(self):
        s = subscribed("dave")
        data = b"".join(delivery(i, message(to, durable=False))
                        for i, to in enumerate(("A/B", "A/P", "A/B")))
        s.router(data)
        frames = s.take(Side.CLIENT)
        assert [(int(t.delivery_id), bool(t.aborted), bool(p)) for _, t, p in frames] == [
            (0, True, False), (1, False, True), (2, True, False)]
        assert decode(frames[1][2]).address == "A/P"
        assert [int(d.first) for _, d, _ in s.take(Side.ROUTER)] == [0, 2]


class TestAttachAndRelay:
    def test_subscribe_denied_by_the_nearest_acl(self):
        s = Script(POLICY)
        s.open(user="dave")
        s.begin(0, router_channel=0)
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        s.client(frame(0, Attach(name="b", handle=0, role=True, source=Source(address="A/B"),
                                 target=Target())))
        assert s.take(Side.ROUTER) == []
        frames = s.take(Side.CLIENT)
        assert [type(p).__name__ for _, p, _ in frames] == ["Attach", "Detach"]
        detach = frames[1][1]
        assert isinstance(detach, Detach)
        assert (str(detach.error.condition), detach.error.description) == (
            "amqp:unauthorized-access", "link disallowed by local policy")
        [denied] = [e for e in s.events if isinstance(e, LinkDenied)]
        assert (str(denied.reason), denied.role, denied.address) == ("topic", "receiver", "A/B")

    def test_publish_denied_for_a_named_sender_and_per_relay_message(self):
        s = Script(POLICY)
        s.open(user="dave")
        s.begin(0, router_channel=0)
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        s.client(frame(0, Attach(name="p", handle=0, role=False, source=Source(),
                                 target=Target(address="A/P"))))
        assert s.take(Side.ROUTER) == []
        assert any(isinstance(e, LinkDenied) and e.reason == "topic" for e in s.events)
        s.client(frame(0, Attach(name="relay", handle=1, role=False, source=Source(),
                                 target=Target())))
        s.router(frame(0, Attach(name="relay", handle=1, role=True, source=Source(),
                                 target=Target())))
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        ok = message("Z/1")  # the root allows everyone to publish
        s.client(frame(0, Transfer(handle=1, delivery_id=0, delivery_tag=b"a",
                                   message_format=0), ok))
        [(_, t, payload)] = s.take(Side.ROUTER)
        assert payload == ok and not t.aborted
        s.client(frame(0, Transfer(handle=1, delivery_id=1, delivery_tag=b"b",
                                   message_format=0), message("A/P")))
        assert s.take(Side.ROUTER) == []  # withheld whole
        [(_, disp, _)] = s.take(Side.CLIENT)
        assert isinstance(disp.state, Rejected)
        assert disp.state.error.description == "policy violation on target"
        assert any(isinstance(e, MessageDenied) and e.reason == "topic" for e in s.events)
