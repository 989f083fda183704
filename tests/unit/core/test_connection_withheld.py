"""Transcripts of refused client deliveries: nothing of them reaches the router, and both ends
keep numbering consistently (decision 0002, core/numbering.py).

Every test runs with the C relay scanner and with the pure-Python loop (conftest.py).
"""

from __future__ import annotations

from proton import Message

from amqp_policy_proxy.amqp.performatives import Accepted, Disposition, Rejected
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import MessageDenied

from .helpers import (
    Attach,
    Flow,
    Script,
    Source,
    Target,
    Transfer,
    frame,
    make_policy,
    parse_frames,
)

#: bob: named links pass without a look (the fast path), the anonymous relay is checked.
POLICY = make_policy({
    "trusted": {"users": "bob", "remoteHosts": "*", "sources": "*", "targets": "public.*",
                "allowUserIdProxy": True, "allowAnonymousSender": True,
                "maxMessageSize": 3000},
    "checked": {"users": "alice", "remoteHosts": "*", "sources": "*", "targets": "public.*",
                "allowAnonymousSender": True, "maxMessageSize": 3000},
})
NAMED, RELAY = 0, 1
#: the router's handles for the client's 0 and 1
ROUTER_HANDLE = {NAMED: 10, RELAY: 11}


def session(user: str = "bob", *, channel: int = 0) -> Script:
    """A session on ``channel`` with a named sender (public.a) and an anonymous relay."""
    s = Script(POLICY)
    s.open(user=user)
    s.begin(channel, router_channel=channel)
    for handle, address in ((NAMED, "public.a"), (RELAY, None)):
        s.client(frame(channel, Attach(name=f"l{handle}", handle=handle, role=False,
                                       target=Target(address=address),
                                       initial_delivery_count=0)))
        s.router(frame(channel, Attach(name=f"l{handle}", handle=ROUTER_HANDLE[handle],
                                       role=True, target=Target(address=address))))
    s.take(Side.CLIENT), s.take(Side.ROUTER)
    return s


def payload(body: str, to: str | None = None, user_id: bytes | None = None) -> bytes:
    msg = Message(body=body, address=to)
    if user_id is not None:
        msg.user_id = user_id
    return msg.encode()


def transfer(handle: int, delivery_id: int | None, body: str, *, to: str | None = None,
             settled: bool = False, channel: int = 0, user_id: bytes | None = None) -> bytes:
    return frame(channel, Transfer(handle=handle, delivery_id=delivery_id,
                                   delivery_tag=body.encode(), message_format=0,
                                   settled=settled or None),
                 payload(body, to, user_id))


def refused(delivery_id: int, body: str, **kw) -> bytes:
    """A relay message to an address the policy refuses."""
    return transfer(RELAY, delivery_id, body, to="private.x", **kw)


def transfers(frames):
    return [(int(p.handle), p.delivery_id if p.delivery_id is None else int(p.delivery_id),
             p.delivery_tag, body) for _, p, body in frames if isinstance(p, Transfer)]


def dispositions(frames):
    return [(bool(p.role), int(p.first), None if p.last is None else int(p.last),
             bool(p.settled), type(p.state).__name__) for _, p, _ in frames
            if isinstance(p, Disposition)]


class TestSeveralWithheldInFlight:
    def test_router_sees_contiguous_ids_and_its_outcomes_reach_the_right_deliveries(self):
        s = session()
        s.client(transfer(NAMED, 0, "d0")
                 + refused(1, "d1")
                 + transfer(RELAY, 2, "d2", to="public.q")
                 + transfer(NAMED, 3, "d3", settled=True)
                 + refused(4, "d4")
                 + refused(5, "d5", settled=True)
                 + transfer(NAMED, 6, "d6"))
        sent = s.take(Side.ROUTER)
        assert [(h, i, tag) for h, i, tag, _ in transfers(sent)] == [
            (NAMED, 0, b"d0"), (RELAY, 1, b"d2"), (NAMED, 2, b"d3"), (NAMED, 3, b"d6")]
        assert [body for *_, body in transfers(sent)] == [
            payload("d0"), payload("d2", "public.q"), payload("d3"), payload("d6")]
        assert not any(p.aborted for _, p, _ in sent if isinstance(p, Transfer))
        # the client hears QDR's rejection of 1 and 4 (5 was sent settled: nothing to say)
        assert dispositions(s.take(Side.CLIENT)) == [
            (True, 1, None, True, "Rejected"), (True, 4, None, True, "Rejected")]
        assert [e.reason for e in s.events if isinstance(e, MessageDenied)] == [
            "relay_target"] * 3
        # the router settles its deliveries 0..3 at once (as RabbitMQ's confirms do)
        s.router(frame(0, Disposition(role=True, first=0, last=3, settled=True,
                                      state=Accepted())))
        assert dispositions(s.take(Side.CLIENT)) == [
            (True, 0, None, True, "Accepted"), (True, 2, 3, True, "Accepted"),
            (True, 6, None, True, "Accepted")]
        # settled everywhere: the map keeps nothing of those eras
        numbering = s.conn.sessions.sessions[0].numbering
        assert numbering.live == {} and len(numbering.eras) == 2

    def test_unsettled_deliveries_of_earlier_eras_still_map_later(self):
        s = session()
        s.client(transfer(NAMED, 0, "a") + refused(1, "x") + transfer(NAMED, 2, "b")
                 + refused(3, "y") + transfer(NAMED, 4, "c") + refused(5, "z"))
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        s.router(frame(0, Disposition(role=True, first=2, settled=True, state=Accepted())))
        s.router(frame(0, Disposition(role=True, first=1, settled=True, state=Accepted())))
        s.router(frame(0, Disposition(role=True, first=0, settled=True, state=Accepted())))
        assert dispositions(s.take(Side.CLIENT)) == [
            (True, 4, None, True, "Accepted"), (True, 2, None, True, "Accepted"),
            (True, 0, None, True, "Accepted")]

    def test_a_late_disposition_for_a_forgotten_delivery_is_dropped(self):
        s = session()
        s.client(refused(0, "x") + transfer(NAMED, 1, "a") + refused(2, "y")
                 + transfer(NAMED, 3, "b"))
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        # the client settles its delivery 1 first (router id 0): the router is told
        s.client(frame(0, Disposition(role=False, first=1, settled=True, state=Accepted())))
        assert dispositions(s.take(Side.ROUTER)) == [(False, 0, None, True, "Accepted")]
        # the router's answer for it comes later: nobody can use it, it is not passed on
        s.router(frame(0, Disposition(role=True, first=0, last=1, settled=True,
                                      state=Accepted())))
        assert dispositions(s.take(Side.CLIENT)) == [(True, 3, None, True, "Accepted")]


class TestRanges:
    def test_client_settling_a_range_over_withheld_ids_is_trimmed_and_split(self):
        s = session()
        s.client(transfer(NAMED, 0, "a") + refused(1, "x") + refused(2, "y")
                 + transfer(NAMED, 3, "b") + transfer(RELAY, 4, "c", to="public.z")
                 + refused(5, "w") + transfer(NAMED, 6, "d"))
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        s.client(frame(0, Disposition(role=False, first=0, last=6, settled=True,
                                      state=Accepted())))
        assert dispositions(s.take(Side.ROUTER)) == [
            (False, 0, None, True, "Accepted"), (False, 1, 2, True, "Accepted"),
            (False, 3, None, True, "Accepted")]
        s.client(frame(0, Disposition(role=False, first=1, last=2, settled=True,
                                      state=Accepted())))
        assert s.take(Side.ROUTER) == []  # only withheld ids: nothing for the router

    def test_dispositions_about_router_deliveries_are_not_renumbered(self):
        s = session()
        s.client(refused(0, "x"))
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        theirs = frame(0, Disposition(role=False, first=0, last=5, settled=True,
                                      state=Accepted()))
        s.router(theirs)  # the router settling deliveries it sent the client
        assert bytes(s.sent[Side.CLIENT]) == theirs
        ours = frame(0, Disposition(role=True, first=0, last=5, settled=True,
                                    state=Accepted()))
        s.client(ours)  # the client's outcome for the router's deliveries
        assert bytes(s.sent[Side.ROUTER]) == ours

    def test_wraparound_at_two_to_the_32(self):
        s = session()
        top = 0xFFFFFFFF
        s.client(transfer(NAMED, top - 1, "a") + refused(top, "x") + transfer(NAMED, 0, "b")
                 + transfer(NAMED, 1, "c"))
        assert [i for _, i, _, _ in transfers(s.take(Side.ROUTER))] == [top - 1, top, 0]
        s.take(Side.CLIENT)
        s.router(frame(0, Disposition(role=True, first=top - 1, last=0, settled=True,
                                      state=Accepted())))
        assert dispositions(s.take(Side.CLIENT)) == [
            (True, top - 1, None, True, "Accepted"), (True, 0, 1, True, "Accepted")]


class TestFrames:
    def test_multi_frame_deliveries_forwarded_and_withheld(self):
        s = session()
        big = payload("m" * 400, "public.q")
        withheld = payload("n" * 400, "private.x")

        def frames(handle, did, data, tag):
            parts = [data[i:i + 150] for i in range(0, len(data), 150)]
            return b"".join(frame(0, Transfer(handle=handle, delivery_id=did,
                                              delivery_tag=tag if k == 0 else None,
                                              message_format=0 if k == 0 else None,
                                              more=k < len(parts) - 1), part)
                            for k, part in enumerate(parts))

        s.client(frames(RELAY, 0, withheld, b"w"))
        assert s.take(Side.ROUTER) == []
        assert dispositions(s.take(Side.CLIENT)) == [(True, 0, None, True, "Rejected")]
        s.client(frames(RELAY, 1, big, b"f") + frames(NAMED, 2, big, b"g"))
        sent = transfers(s.take(Side.ROUTER))
        # every frame repeats the delivery-id (as proton does): each is renumbered
        assert {(h, i) for h, i, _, _ in sent} == {(RELAY, 0), (NAMED, 1)}
        assert b"".join(body for h, *_, body in sent if h == RELAY) == big
        dropped = len(range(0, len(withheld), 150))
        s.router(frame(0, Flow(next_incoming_id=2 * len(range(0, len(big), 150)),
                               incoming_window=100, next_outgoing_id=0, outgoing_window=100)))
        [(_, flow, _)] = s.take(Side.CLIENT)
        assert int(flow.next_incoming_id) == dropped + 2 * len(range(0, len(big), 150))

    def test_a_frame_whose_new_id_needs_a_wider_encoding(self):
        s = session()
        s.client(transfer(NAMED, 0xFFFFFFFF, "a") + refused(0, "x"))
        s.take(Side.ROUTER)
        original = transfer(NAMED, 1, "b")  # id 1: 0x52 01; becomes 0, then 256 - 1 ...
        s.client(original)
        [(_, t, body)] = s.take(Side.ROUTER)
        assert int(t.delivery_id) == 0 and body == payload("b")
        s.client(b"".join(transfer(NAMED, i, f"c{i}") for i in range(2, 300)))
        sent = transfers(s.take(Side.ROUTER))
        assert [i for _, i, _, _ in sent] == list(range(1, 299))
        assert [tag for _, _, tag, _ in sent] == [f"c{i}".encode() for i in range(2, 300)]

    def test_an_implicit_delivery_id_stays_implicit(self):
        s = session()
        s.client(refused(0, "x"))
        s.take(Side.CLIENT)
        s.client(transfer(NAMED, None, "a", settled=True) + transfer(NAMED, 2, "b"))
        assert [i for _, i, _, _ in transfers(s.take(Side.ROUTER))] == [None, 1]

    def test_no_delivery_id_on_the_first_refused_delivery_closes_the_connection(self):
        s = session()
        s.client(transfer(NAMED, 0, "a") + refused(None, "x"))
        closes = [p for _, p, _ in s.take(Side.CLIENT) if type(p).__name__ == "Close"]
        assert str(closes[0].error.condition) == "amqp:invalid-field"


class TestFastPath:
    def test_a_run_of_plain_transfers_after_a_withheld_delivery_is_renumbered(self):
        s = session()
        before = b"".join(transfer(NAMED, i, f"p{i}", settled=True) for i in range(5))
        s.client(before)
        assert bytes(s.sent[Side.ROUTER]) == before  # as it came, in one run
        s.take(Side.ROUTER)
        after = b"".join(transfer(NAMED, i, f"q{i}", settled=True) for i in range(6, 20))
        s.client(refused(5, "x") + after)
        sent = transfers(s.take(Side.ROUTER))
        assert [i for _, i, _, _ in sent] == list(range(5, 19))
        assert [tag for _, _, tag, _ in sent] == [f"q{i}".encode() for i in range(6, 20)]

    def test_other_sessions_keep_the_fast_path(self):
        s = session()
        s.begin(1, router_channel=1)
        s.client(frame(1, Attach(name="other", handle=0, role=False,
                                 target=Target(address="public.b"))))
        s.router(frame(1, Attach(name="other", handle=0, role=True,
                                 target=Target(address="public.b"))))
        s.client(refused(0, "x"))
        s.take(Side.ROUTER)
        run = b"".join(transfer(0, i, f"r{i}", channel=1, settled=True) for i in range(8))
        s.client(run)
        assert bytes(s.sent[Side.ROUTER]) == run
        assert s.conn.sessions.sessions[1].numbering is None


class TestCredit:
    def test_delivery_count_in_flows_counts_what_each_end_counted(self):
        s = session()
        s.client(transfer(RELAY, 0, "a", to="public.q") + refused(1, "x") + refused(2, "y"))
        s.take(Side.ROUTER), s.take(Side.CLIENT)
        # the router counted 1 delivery on the relay link, the client 3
        s.router(frame(0, Flow(next_incoming_id=1, incoming_window=100, next_outgoing_id=0,
                               outgoing_window=100, handle=ROUTER_HANDLE[RELAY],
                               delivery_count=1, link_credit=10)))
        [(_, flow, _)] = s.take(Side.CLIENT)
        assert int(flow.delivery_count) == 3 and int(flow.link_credit) == 10
        assert int(flow.next_incoming_id) == 3  # the two dropped frames
        s.router(frame(0, Flow(next_incoming_id=1, incoming_window=100, next_outgoing_id=0,
                               outgoing_window=100, handle=ROUTER_HANDLE[NAMED],
                               delivery_count=0, link_credit=10)))
        [(_, flow, _)] = s.take(Side.CLIENT)
        assert int(flow.delivery_count) == 0  # nothing withheld on that link
        # the client drains its relay link: its delivery-count in the router's terms
        s.client(frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=3,
                               outgoing_window=100, handle=RELAY, delivery_count=13,
                               link_credit=0, drain=True)))
        [(_, flow, _)] = s.take(Side.ROUTER)
        assert int(flow.delivery_count) == 11 and int(flow.next_outgoing_id) == 1


def router_grants(s: Script, handle: int, *, count: int | None, credit: int,
                  next_in: int = 0, next_out: int = 0) -> None:
    s.router(frame(0, Flow(next_incoming_id=next_in, incoming_window=1000,
                           next_outgoing_id=next_out, outgoing_window=500,
                           handle=ROUTER_HANDLE[handle], delivery_count=count,
                           link_credit=credit)))
    s.take(Side.CLIENT)


def flows(frames):
    return [p for _, p, _ in frames if isinstance(p, Flow)]


class TestCreditBack:
    """The proxy gives the client back the link credit a withheld delivery used, as the
    router would have after receiving and refusing it (numbering.credit_back)."""

    def test_the_client_gets_the_routers_link_state_after_a_refusal(self):
        s = session()
        router_grants(s, RELAY, count=0, credit=10)
        s.client(transfer(RELAY, 0, "a", to="public.q") + refused(1, "x"))
        [flow] = flows(s.take(Side.CLIENT))
        # the client counted 2 deliveries; with delivery-count 1 + credit 10 it has 9 left,
        # as the router, which received 1 of its 10, has
        assert (int(flow.handle), int(flow.delivery_count), int(flow.link_credit)) == (
            ROUTER_HANDLE[RELAY], 1, 10)
        # session state as the router stands: both client frames counted as received (one
        # dropped), its window end 0 + 1000 in its numbering, 1001 in the client's
        assert (int(flow.next_incoming_id), int(flow.incoming_window)) == (2, 999)
        assert (int(flow.next_outgoing_id), int(flow.outgoing_window)) == (0, 500)

    def test_next_outgoing_id_counts_the_routers_transfers_on_the_session(self):
        s = session()
        s.client(frame(0, Attach(name="rx", handle=2, role=True,
                                 source=Source(address="public.r"))))
        s.router(frame(0, Attach(name="rx", handle=12, role=False,
                                 source=Source(address="public.r"),
                                 initial_delivery_count=0)))
        router_grants(s, RELAY, count=0, credit=10)

        def router_sends(ids):
            for i in ids:
                s.router(frame(0, Transfer(handle=12, delivery_id=i, delivery_tag=b"r",
                                           message_format=0, settled=True), payload("r")))
            s.take(Side.CLIENT)

        router_sends(range(3))
        s.client(refused(0, "x"))
        [flow] = flows(s.take(Side.CLIENT))
        assert int(flow.next_outgoing_id) == 3  # its Flow's 0, and 3 Transfers since
        router_sends(range(3, 5))
        router_grants(s, RELAY, count=0, credit=10, next_out=5)
        router_sends(range(5, 7))
        s.client(refused(1, "y"))
        [flow] = flows(s.take(Side.CLIENT))
        assert int(flow.next_outgoing_id) == 7

    def test_a_flow_without_delivery_count_stands_for_the_initial_one(self):
        s = session()  # RabbitMQ grants credit at attach without a delivery-count
        router_grants(s, RELAY, count=None, credit=65536)
        s.client(refused(0, "x"))
        [flow] = flows(s.take(Side.CLIENT))
        assert (int(flow.delivery_count), int(flow.link_credit)) == (1, 65536)

    def test_no_flow_while_the_router_never_granted_credit(self):
        s = session()
        s.client(refused(0, "x"))
        assert flows(s.take(Side.CLIENT)) == []

    def test_with_max_session_window_the_window_is_the_proxys(self):
        policy = make_policy({"w": {"users": "bob", "remoteHosts": "*", "sources": "*",
                                    "targets": "public.*", "allowAnonymousSender": True,
                                    "maxSessionWindow": 10 * 65536}})
        s = Script(policy)
        s.open(user="bob")
        s.begin(0, router_channel=0)
        s.client(frame(0, Attach(name="l1", handle=RELAY, role=False, target=Target(),
                                 initial_delivery_count=0)))
        s.router(frame(0, Attach(name="l1", handle=ROUTER_HANDLE[RELAY], role=True,
                                 target=Target())))
        router_grants(s, RELAY, count=0, credit=10)
        s.client(refused(0, "x"))
        [flow] = flows(s.take(Side.CLIENT))
        session_ = s.conn.sessions.sessions[0]
        assert int(flow.incoming_window) == session_.client_window_end - 1 <= 10


class TestChecked:
    def test_user_id_violations_with_the_general_path_only(self):
        s = session("alice")
        s.client(transfer(NAMED, 0, "a", user_id=b"alice")
                 + transfer(NAMED, 1, "b", user_id=b"mallory")
                 + transfer(NAMED, 2, "c", user_id=b"alice"))
        assert [(i, tag) for _, i, tag, _ in transfers(s.take(Side.ROUTER))] == [
            (0, b"a"), (1, b"c")]
        frames = s.take(Side.CLIENT)
        [(_, disp, _)] = frames
        assert isinstance(disp.state, Rejected) and int(disp.first) == 1
        assert disp.state.error.description == "user_id proxy violation"


def test_many_refusals_keep_the_map_small():
    s = session()
    for i in range(0, 400, 2):
        s.client(refused(i, "x") + transfer(NAMED, i + 1, "a"))
        s.router(frame(0, Disposition(role=True, first=i // 2, settled=True,
                                      state=Accepted())))
    numbering = s.conn.sessions.sessions[0].numbering
    assert len(numbering.eras) <= 3 and not numbering.live
    assert [d[1] for d in dispositions(parse_frames(bytes(s.sent[Side.CLIENT])))
            if d[4] == "Accepted"] == list(range(1, 400, 2))


class TestShapedLink:
    """On a link under a message rate (core/shaping.py), the withheld delivery goes into
    shaping's own delivery-count offset: one translation, not two."""

    def test_delivery_counts_and_credit_of_a_shaped_link_after_a_refusal(self):
        from .test_shaping import client_flow, router_flow, shaped

        s = shaped()  # alice, 100 msgs/s: bursts of 10 credits; user-id checked
        s.router(router_flow(credit=1000))
        s.take(Side.CLIENT)
        ok = frame(0, Transfer(handle=0, delivery_id=0, delivery_tag=b"a", message_format=0,
                               settled=True), payload("a", user_id=b"alice"))
        bad = frame(0, Transfer(handle=0, delivery_id=1, delivery_tag=b"b", message_format=0,
                                settled=True), payload("b", user_id=b"mallory"))
        s.client(ok + bad)
        assert [i for _, i, _, _ in transfers(s.take(Side.ROUTER))] == [0]
        s.take(Side.CLIENT)
        # the router received 1 delivery: its Flow reaches the client in its numbering (2)
        s.router(router_flow(dc=1, credit=999, nid=1))
        [flow] = flows(s.take(Side.CLIENT))
        assert int(flow.delivery_count) == 2
        assert int(flow.delivery_count) + int(flow.link_credit) <= 1 + 999 + 1
        # and the client's Flow reaches the router in the router's (1)
        s.client(client_flow(dc=2, credit=int(flow.link_credit), nout=2))
        [to_router] = flows(s.take(Side.ROUTER))
        assert int(to_router.delivery_count) == 1
        assert int(to_router.delivery_count) + int(to_router.link_credit) == 1000
