"""Property: for allowed traffic the router receives exactly the client's bytes, apart from the
documented rewrites (Open channel-max, Begin handle-max: docs/decisions/0003)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message

from amqp_policy_proxy.core.commands import Side

from ..unit.core.helpers import (
    Attach,
    Detach,
    End,
    Flow,
    Script,
    Source,
    Target,
    Transfer,
    frame,
    make_policy,
)

POLICY = make_policy({"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*",
                              "allowUserIdProxy": True}})

bodies = st.binary(max_size=3000)


@given(st.lists(st.tuples(st.sampled_from(["q.a", "q.b"]), bodies), min_size=1, max_size=6),
       st.integers(1, 200), st.integers(50, 1000))
@settings(max_examples=60, deadline=None)
def test_router_receives_the_client_bytes(messages, split, chunk):
    s = Script(POLICY)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.take(Side.ROUTER)
    client = bytearray()
    client += frame(0, Attach(name="qa", handle=0, role=False, target=Target(address="q.a")))
    client += frame(0, Attach(name="qb", handle=1, role=False, target=Target(address="q.b")))
    client += frame(0, Attach(name="r", handle=2, role=True, source=Source(address="q.a")))
    client += frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=0,
                            outgoing_window=100, handle=2, delivery_count=0, link_credit=50))
    for i, (address, body) in enumerate(messages):
        payload = Message(body=body).encode()
        parts = [payload[j : j + chunk] for j in range(0, len(payload), chunk)]
        for k, part in enumerate(parts):
            more = k < len(parts) - 1
            if k == 0:
                t = Transfer(handle=0 if address == "q.a" else 1, delivery_id=i,
                             delivery_tag=b"%d" % i, message_format=0, more=more)
            else:
                t = Transfer(handle=0 if address == "q.a" else 1, more=more)
            client += frame(0, t, part)
    client += frame(0, Detach(handle=0, closed=True)) + frame(0, End())
    data = bytes(client)
    for i in range(0, len(data), split):
        s.client(data[i : i + split])
    assert bytes(s.sent[Side.ROUTER]) == data
