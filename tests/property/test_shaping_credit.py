"""Property: credit shaping keeps AMQP 1.0 link flow control (Part 2 §2.6.7, §2.7.4) correct
between a compliant client sender and a router receiver, whatever they do in between.

Hypothesis drives the router (grants of any size, with or without drain or echo), the client
(sends what its credit allows, answers drains and echoes as §2.6.7 says) and the clock. Both
peers keep their own view of the link from the frames they receive, as a real endpoint does,
and the invariants are checked after every step:

- the client is never granted beyond what the router granted (the proxy only holds back);
- the router never receives a delivery beyond its credit, nor a delivery-count that goes back
  or beyond its limit; a drain the router asked for always completes (its delivery-count
  reaches its limit with link-credit 0) once the client answered;
- the proxy never treats the compliant client as a protocol violator;
- the client never sends faster than ``burst + rate * t``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ProtocolViolation
from amqp_policy_proxy.limits.rates import RateLimits

from ..unit.core.helpers import Attach, Flow, Script, Target, Transfer, frame, make_policy

RATE = 100
BURST = 10  # a tenth of a second's worth
POLICY = make_policy({"g": {"users": "*", "remoteHosts": "*", "targets": "*", "sources": "*",
                            "maxMessageRatePerUser": RATE, "allowUserIdProxy": True}})
BODY = b"\x00\x53\x75\xa0\x01x"  # a data section of one byte
WIDE = 1 << 20

step = st.one_of(
    st.tuples(st.just("grant"), st.integers(0, 300), st.booleans(), st.booleans()),
    st.tuples(st.just("send"), st.integers(1, 30)),
    st.tuples(st.just("wait"), st.floats(0.0, 0.3)),
    st.tuples(st.just("echo")),
)


class Router:
    """The router's receiving end of the link, from what reaches it."""

    def __init__(self) -> None:
        self.dc = 0  # deliveries received (its delivery-count view)
        self.limit = 0  # dc + link-credit it granted
        self.draining = False

    def receive(self, frames: list[tuple[int, Any, bytes]]) -> None:
        for _, perf, _ in frames:
            if isinstance(perf, Transfer):
                self.dc += 1
                assert self.dc <= self.limit, "a delivery beyond the router's credit"
            elif isinstance(perf, Flow) and perf.handle is not None:
                dc = int(perf.delivery_count)
                assert self.dc <= dc <= self.limit, (self.dc, dc, self.limit)
                self.dc = dc
                if self.draining and dc == self.limit:
                    assert int(perf.link_credit) == 0
                    self.draining = False

    def grant(self, credit: int, drain: bool, echo: bool) -> bytes:
        self.limit = self.dc + credit
        self.draining = drain and credit > 0
        return frame(0, Flow(next_incoming_id=self.dc, incoming_window=WIDE, next_outgoing_id=0,
                             outgoing_window=WIDE, handle=0, delivery_count=self.dc,
                             link_credit=credit, drain=drain, echo=echo))


class Client:
    """The client's sending end of the link, from what reaches it (§2.6.7)."""

    def __init__(self) -> None:
        self.dc = 0
        self.limit = 0
        self.drain = False
        self.echo = False
        self.messages = 0  # deliveries actually sent (drained credit advances dc only)

    def receive(self, frames: list[tuple[int, Any, bytes]]) -> None:
        for _, perf, _ in frames:
            if isinstance(perf, Flow) and perf.handle is not None:
                self.limit = int(perf.delivery_count) + int(perf.link_credit)
                self.drain = bool(perf.drain)
                self.echo = self.echo or bool(perf.echo)

    def flow(self, drain: bool = False) -> bytes:
        return frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=self.dc,
                             outgoing_window=100, handle=0, delivery_count=self.dc,
                             link_credit=max(0, self.limit - self.dc), drain=drain or None))


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=40))
def test_shaped_credit_keeps_flow_control_correct(steps):
    s = Script(POLICY, rates=RateLimits())
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.client(frame(0, Attach(name="s", handle=0, role=False, target=Target(address="q"),
                             initial_delivery_count=0)))
    s.router(frame(0, Attach(name="s", handle=0, role=True, target=Target(address="q"))))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    router, client = Router(), Client()

    def exchange() -> None:
        for _ in range(4):  # let answers cross until nothing moves
            to_client, to_router = s.take(Side.CLIENT), s.take(Side.ROUTER)
            if not to_client and not to_router:
                return
            client.receive(to_client)
            router.receive(to_router)
            assert client.limit <= router.limit + (client.dc - router.dc), "granted beyond"
            if client.drain and client.limit > client.dc:
                # §2.6.7: nothing more to send: advance delivery-count to the limit and say so
                client.dc = client.limit
                s.client(client.flow(drain=True))
            elif client.echo:
                s.client(client.flow())
            client.echo = False

    for action in steps:
        if action[0] == "grant":
            s.router(router.grant(*action[1:]))
        elif action[0] == "send":
            for _ in range(min(action[1], client.limit - client.dc)):
                s.client(frame(0, Transfer(handle=0, delivery_id=client.dc,
                                           delivery_tag=b"%d" % client.dc, message_format=0,
                                           settled=True), BODY))
                client.dc += 1
                client.messages += 1
        elif action[0] == "wait":
            now = s.now + action[1]
            while (deadline := s.conn.get_timer()) is not None and deadline <= now:
                s.timer(deadline)
            s.now = now
        else:
            client.echo = True
        exchange()
        assert not [e for e in s.events if isinstance(e, ProtocolViolation)]
        assert client.messages <= BURST + RATE * s.now + 1e-9, "faster than the rate"
    # the router's last drain is answered once the client had its say
    exchange()
    assert not router.draining
