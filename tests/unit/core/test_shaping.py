"""Transcript tests of credit shaping (core/shaping.py): the link-credit arithmetic of AMQP 1.0
Part 2 §2.6.7 and §2.7.4 between a client sender and the router, through the proxy."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ProtocolViolation
from amqp_policy_proxy.limits.rates import RateLimits

from .helpers import Attach, Flow, Script, Target, Transfer, frame, make_policy

WIDE = 2147483647
POLICY = make_policy({
    "shaped": {"users": "alice", "remoteHosts": "*", "targets": "*", "sources": "*",
               "maxMessageRatePerUser": 100},
    "bytes": {"users": "bob", "remoteHosts": "*", "targets": "*", "sources": "*",
              "maxByteRatePerUser": 1000},
    "free": {"users": "carol", "remoteHosts": "*", "targets": "*", "sources": "*"},
})


def router_flow(handle: int = 0, *, dc: int = 0, credit: int = 1000, nid: int = 0,
                **kw: Any) -> bytes:
    """The router's Flow for its receiving end of the client's link (channel 0)."""
    return frame(0, Flow(next_incoming_id=nid, incoming_window=WIDE, next_outgoing_id=0,
                         outgoing_window=WIDE, handle=handle, delivery_count=dc,
                         link_credit=credit, **kw))


def client_flow(handle: int = 0, *, dc: int, credit: int, nout: int, **kw: Any) -> bytes:
    """The client's Flow for its sending end of the link."""
    return frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=nout,
                         outgoing_window=100, handle=handle, delivery_count=dc,
                         link_credit=credit, **kw))


def body(n: int) -> bytes:
    """A message of one data section: ``n`` payload bytes in all (section header included)."""
    return b"\x00\x53\x75\xb0" + (n - 8).to_bytes(4, "big") + b"x" * (n - 8)


def transfer(delivery_id: int, handle: int = 0, payload: bytes = body(10)) -> bytes:
    """A whole, pre-settled single-frame delivery."""
    return frame(0, Transfer(handle=handle, delivery_id=delivery_id,
                             delivery_tag=b"%d" % delivery_id, message_format=0, settled=True),
                 payload)


def sender(s: Script, handle: int = 0, name: str = "s") -> None:
    """Attach a client sender on channel 0 and the router's answer (router handle = handle)."""
    s.client(frame(0, Attach(name=name, handle=handle, role=False, target=Target(address="q"),
                             initial_delivery_count=0)))
    s.router(frame(0, Attach(name=name, handle=handle, role=True, target=Target(address="q"))))


def shaped(user: str = "alice", rates: RateLimits | None = None, now: float = 0.0) -> Script:
    s = Script(POLICY, rates=rates or RateLimits(), now=now)
    s.open(user=user)
    s.begin(0, router_channel=0)
    sender(s)
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    return s


def flows(frames: list[tuple[int, Any, bytes]]) -> list[Flow]:
    return [perf for _, perf, _ in frames if isinstance(perf, Flow)]


def test_the_router_grant_is_lowered_to_the_burst_and_nothing_else_changes():
    s = shaped()
    s.router(router_flow(credit=1000))
    (flow,) = flows(s.take(Side.CLIENT))
    # 100 msgs/s: a burst of a tenth of a second, 10 messages; delivery-count untouched
    assert (flow.delivery_count, flow.link_credit) == (0, 10)
    assert (flow.next_incoming_id, flow.incoming_window, flow.next_outgoing_id) == (0, WIDE, 0)
    assert not flow.drain and not flow.echo


def test_a_smaller_router_grant_passes_unchanged():
    s = shaped()
    data = router_flow(credit=3)
    s.router(data)
    assert bytes(s.sent[Side.CLIENT]) == data  # relayed as it came


def test_more_credit_at_half_use_then_refills_on_the_timer():
    s = shaped()
    s.router(router_flow())
    s.take(Side.CLIENT)
    for i in range(5):
        s.client(transfer(i))
    # half used, but the 5 tokens left back the 5 credits the client holds: nothing yet
    assert flows(s.take(Side.CLIENT)) == []
    for i in range(5, 10):
        s.client(transfer(i))
    assert len(s.take(Side.ROUTER)) == 10  # every Transfer reached the router
    assert flows(s.take(Side.CLIENT)) == []
    assert s.conn.get_timer() == pytest.approx(0.01)  # one token: 10 ms at 100/s
    s.timer(0.01)
    (flow,) = flows(s.take(Side.CLIENT))
    # a Flow of the proxy's: the client's delivery-count and one more credit; the router's
    # session state as the client knows it (ten Transfers received from it)
    assert (flow.handle, flow.delivery_count, flow.link_credit) == (0, 10, 1)
    assert (flow.next_incoming_id, flow.incoming_window) == (10, WIDE - 10)
    assert (flow.next_outgoing_id, flow.outgoing_window) == (0, WIDE)
    assert s.take(Side.ROUTER) == []  # the router's view is unchanged


def test_a_transfer_beyond_the_credit_granted_is_a_protocol_violation():
    s = shaped()
    s.router(router_flow())
    for i in range(10):
        s.client(transfer(i))
    s.client(transfer(10))  # the router granted 1000, the proxy 10
    close = [p for _, p, _ in s.take(Side.CLIENT) if p is not None and type(p).__name__ == "Close"]
    assert close and close[0].error.condition == "amqp:link:transfer-limit-exceeded"
    assert [e for e in s.events if isinstance(e, ProtocolViolation)]


def test_a_sender_at_full_speed_gets_the_rate_over_time():
    s = shaped()
    s.router(router_flow(credit=100000))
    credit = flows(s.take(Side.CLIENT))[0].link_credit
    sent = 0
    now = 0.0
    while now < 2.0:
        for _ in range(credit):  # the client sends everything it may
            s.client(transfer(sent))
            sent += 1
        credit = 0
        deadline = s.conn.get_timer()
        now = deadline if deadline is not None else now
        s.timer(now)
        for flow in flows(s.take(Side.CLIENT)):
            credit = flow.delivery_count + flow.link_credit - sent
    # a burst of 10, then 100 per second, never more
    assert 10 + 100 * 2.0 - 2 <= sent <= 10 + 100 * 2.0


def test_two_links_of_a_user_share_the_bucket():
    s = shaped()
    sender(s, handle=1, name="t")
    s.router(router_flow(0) + router_flow(1))
    a, b = flows(s.take(Side.CLIENT))
    # each link is granted what the bucket holds (no link exceeds the rate alone) ...
    assert (a.link_credit, b.link_credit) == (10, 10)
    for i in range(10):
        s.client(transfer(i, handle=0))
    # ... and what one link sent, the other cannot be granted any more: the bucket is empty
    for i in range(10, 20):
        s.client(transfer(i, handle=1))
    assert flows(s.take(Side.CLIENT)) == []
    # the debt (the second link's burst) is paid back before either link gets credit again:
    # -10 tokens, so the first credit comes when one token is back, at 0.11 s
    granted: list[Flow] = []
    while not granted:
        s.timer(s.conn.get_timer())
        granted = flows(s.take(Side.CLIENT))
    assert s.now == pytest.approx(0.11, abs=0.002)
    assert [f.link_credit for f in granted] == [1]


def test_connections_of_a_user_share_the_bucket_and_credit_outstanding_stays_usable():
    rates = RateLimits()
    a = shaped(rates=rates)
    b = shaped(rates=rates)
    a.router(router_flow())
    b.router(router_flow())
    assert flows(a.take(Side.CLIENT))[0].link_credit == 10
    assert flows(b.take(Side.CLIENT))[0].link_credit == 10
    for i in range(10):  # B empties the bucket ...
        b.client(transfer(i))
    for i in range(10):  # ... and A still may use what it was granted: no violation
        a.client(transfer(i))
    assert len(a.take(Side.ROUTER)) == 10
    assert not [e for e in a.events if isinstance(e, ProtocolViolation)]
    # in debt by one burst: no credit for 0.1 s (10 tokens owed) plus 10 ms for one token
    a.timer(0.1)
    assert flows(a.take(Side.CLIENT)) == []
    a.timer(0.11 + 1e-6)
    assert flows(a.take(Side.CLIENT))[0].link_credit == 1


def test_drain_relayed_and_completed_for_the_held_back_credit():
    s = shaped()
    s.router(router_flow(credit=1000))
    s.take(Side.CLIENT)
    for i in range(4):
        s.client(transfer(i))
    s.take(Side.ROUTER)
    s.router(router_flow(dc=4, credit=996, nid=4, drain=True))
    (flow,) = flows(s.take(Side.CLIENT))
    assert (flow.delivery_count, flow.link_credit, flow.drain) == (4, 6, True)
    # the client has nothing to send: it advances its delivery-count to its limit (§2.6.7)
    s.client(client_flow(dc=10, credit=0, nout=4, drain=True))
    (answer,) = flows(s.take(Side.ROUTER))
    # the router sees every credit it granted consumed: its drain is complete
    assert (answer.delivery_count, answer.link_credit, answer.drain) == (1000, 0, True)
    # from now on delivery-counts are translated between the two views
    s.router(router_flow(dc=1000, credit=50, nid=4))
    (flow,) = flows(s.take(Side.CLIENT))
    # 4 messages were charged: 6 tokens left for the client's next credit
    assert (flow.delivery_count, flow.link_credit) == (10, 6)
    s.client(transfer(4))
    s.client(client_flow(dc=11, credit=0, nout=5, echo=True))
    (fwd,) = flows(s.take(Side.ROUTER))
    assert (fwd.delivery_count, fwd.link_credit) == (1001, 49)  # the router's view


def test_drain_with_no_credit_left_is_answered_for_the_client():
    s = shaped()
    s.router(router_flow(credit=1000))
    s.take(Side.CLIENT)
    for i in range(10):
        s.client(transfer(i))
    s.take(Side.ROUTER)
    s.router(router_flow(dc=10, credit=990, nid=10, drain=True))
    (flow,) = flows(s.take(Side.CLIENT))
    assert (flow.delivery_count, flow.link_credit, flow.drain) == (10, 0, True)
    # the client has no credit and will not answer: the proxy answers in its name
    (answer,) = flows(s.take(Side.ROUTER))
    assert (answer.handle, answer.delivery_count, answer.link_credit) == (0, 1000, 0)
    assert answer.drain is True
    assert (answer.next_outgoing_id, answer.incoming_window, answer.outgoing_window) == (
        10, 100, 100)  # the client's session state (its Begin's windows)
    assert s.conn.get_timer() is None  # nothing to wait for until the router grants again


def test_drain_completed_when_the_client_uses_its_last_credit():
    s = shaped()
    s.router(router_flow(credit=1000, drain=True))
    assert flows(s.take(Side.CLIENT))[0].link_credit == 10
    for i in range(10):
        s.client(transfer(i))
    assert len(s.take(Side.ROUTER)) == 10
    # answered after the last Transfer was written (the timer is due at once)
    assert s.conn.get_timer() == 0.0
    s.timer(0.0)
    (answer,) = flows(s.take(Side.ROUTER))
    assert (answer.delivery_count, answer.link_credit, answer.drain) == (1000, 0, True)


def test_echo_is_relayed_and_the_answer_carries_the_routers_view():
    s = shaped()
    s.router(router_flow(credit=1000, echo=True))
    (flow,) = flows(s.take(Side.CLIENT))
    assert flow.echo is True and flow.link_credit == 10
    s.client(client_flow(dc=0, credit=10, nout=0))
    (fwd,) = flows(s.take(Side.ROUTER))
    assert (fwd.delivery_count, fwd.link_credit) == (0, 1000)


def test_the_router_lowering_its_credit_lowers_the_clients():
    s = shaped()
    s.router(router_flow(credit=1000))
    s.take(Side.CLIENT)
    s.router(router_flow(credit=2))
    (flow,) = flows(s.take(Side.CLIENT))
    assert flow.link_credit == 2


def test_byte_rate_lets_a_large_message_through_into_debt():
    s = shaped("bob")
    s.router(router_flow(credit=1000))
    (flow,) = flows(s.take(Side.CLIENT))
    assert flow.link_credit == 1  # message size unknown yet: one at a time
    s.client(transfer(0, payload=body(400)))  # 100 bytes of burst: 300 bytes of debt
    assert flows(s.take(Side.CLIENT)) == []
    # 100 bytes of burst, 400 sent: the 300 bytes of debt take 0.3 s at 1000 B/s
    assert s.conn.get_timer() == pytest.approx(0.3)
    s.timer(s.conn.get_timer())
    assert flows(s.take(Side.CLIENT))[0].link_credit == 1
    assert len(s.take(Side.ROUTER)) == 1  # nothing dropped


def test_an_unlimited_group_is_not_shaped():
    s = shaped("carol")
    data = router_flow(credit=1000)
    s.router(data)
    assert bytes(s.sent[Side.CLIENT]) == data
    for i in range(50):
        s.client(transfer(i))
    assert len(s.take(Side.ROUTER)) == 50
    assert s.conn.get_timer() is None
    assert s.conn.sessions.shaping is None


def test_throttled_time_and_shaped_traffic_are_totalled_per_vhost_and_group():
    rates = RateLimits()
    s = shaped(rates=rates)
    s.router(router_flow())
    for i in range(10):
        s.client(transfer(i))
    s.timer(0.005)  # throttled since 0 (no credit, no token)
    assert rates.totals(0.005)[("test", "shaped")] == (pytest.approx(0.005), 10, 100)
    s.timer(0.01)
    s.take(Side.CLIENT)
    assert rates.totals(0.5)[("test", "shaped")][0] == pytest.approx(0.01)
    s.conn.connection_lost(Side.CLIENT, 0.05)
    assert rates.shaping_buckets() == 1  # kept until full again (reconnects do not refill)
    rates.acquire(vhost="test", group="shaped", user="other", message_rate=1, byte_rate=None,
                  now=0.5)
    assert rates.shaping_buckets() == 1  # alice's, full since 0.1, was dropped


def test_no_credit_once_the_connection_closes():
    s = shaped()
    s.router(router_flow())
    for i in range(10):
        s.client(transfer(i))
    assert s.conn.get_timer() is not None
    s._run(s.conn.begin_shutdown(0.0))
    s.take(Side.CLIENT)
    s.timer(s.conn.get_timer())
    assert flows(s.take(Side.CLIENT)) == []
    assert s.conn.rate_deadline is None  # no timer left spinning
