"""The delivery-id map of a session that withheld client deliveries (core/numbering.py).

Examples for each mapping, then a model check: random runs of forwarded and withheld
deliveries, settled and unsettled, and dispositions over random ranges from both ends, near
and across 2**32, against a reference that numbers every delivery by hand.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.errors import InvalidFieldError
from amqp_policy_proxy.amqp.performatives import Accepted, Disposition, Flow
from amqp_policy_proxy.core.numbering import (
    MASK,
    DeliveryNumbering,
    disposition_to_client,
    disposition_to_router,
    flow_to_client,
    flow_to_router,
    near,
)
from amqp_policy_proxy.core.wire import frame

from .helpers import parse_frames


def test_near_is_serial_arithmetic():
    assert near(5, 3) == 5
    assert near(0xFFFFFFFF, 3) == -1
    assert near(2, (1 << 32) + 10) == (1 << 32) + 2
    assert near(0, 0xFFFFFFF0) == 1 << 32


def _numbering(*script: str, start: int = 0) -> DeliveryNumbering:
    """Client deliveries from ``start``: "w" withheld, "u" forwarded unsettled, "s" settled;
    the first must be "w"."""
    assert script[0] == "w"
    n = DeliveryNumbering(start & MASK)
    for i, kind in enumerate(script[1:], start=start + 1):
        if kind == "w":
            n.withhold(i & MASK)
        else:
            n.forward_first(i & MASK, 0, complete=kind == "s")
    return n


class TestTransfers:
    def test_ids_after_withheld_ones_shift_down(self):
        n = DeliveryNumbering(3)  # client 3 withheld
        assert n.forward_first(4, 0, complete=False) == 3
        n.withhold(5)
        n.withhold(6)
        assert n.forward_first(7, 0, complete=False) == 4
        assert n.shift == 3

    def test_an_implicit_id_stays_implicit(self):
        n = DeliveryNumbering(0)
        assert n.forward_first(None, 0, complete=True) is None
        n.withhold(None)  # the implicit next one: client 2
        assert n.forward_first(3, 0, complete=True) == 1

    def test_continuations_keep_their_delivery_own_number(self):
        n = DeliveryNumbering(10)
        assert n.forward_first(11, 0, complete=False) == 10  # a multi-frame delivery
        n.withhold(12)  # on another link, while 11 is still streaming
        assert n.forward_more(11) == 10
        n.delivery_done(11, settled=True)
        assert n.forward_first(13, 0, complete=True) == 11

    def test_wraparound(self):
        n = DeliveryNumbering(0xFFFFFFFE)
        assert n.forward_first(0xFFFFFFFF, 0, complete=False) == 0xFFFFFFFE
        n.withhold(0)
        assert n.forward_first(1, 0, complete=False) == 0xFFFFFFFF
        assert n.forward_first(2, 0, complete=False) == 0


class TestDispositions:
    def test_router_range_over_withheld_ids_is_split(self):
        # client 0 .. 6: w u w w u u w  -> router ids: 1->0, 4->1, 5->2
        n = _numbering("w", "u", "w", "w", "u", "u", "w")
        assert n.router_to_client(0, 2) == [(1, 1), (4, 5)]
        assert n.router_to_client(1, None) == [(4, 4)]

    def test_client_range_over_withheld_ids_is_trimmed(self):
        n = _numbering("w", "u", "w", "w", "u", "u", "w")
        parts = n.client_to_router(0, 6)
        assert [(a - s, b - s) for a, b, s in parts] == [(0, 0), (1, 2)]
        assert n.client_to_router(2, 3) == []  # withheld only: nothing for the router

    def test_ids_not_sent_yet_are_left_out(self):
        n = _numbering("w", "u")  # router saw one delivery: id 0
        assert n.router_to_client(0, 9) == [(1, 1)]

    def test_frames_keep_everything_but_the_ids(self):
        n = _numbering("w", "u", "w", "u")
        disp = Disposition(role=True, first=0, last=1, settled=True, state=Accepted())
        out = parse_frames(disposition_to_client(n, disp, frame(5, disp), 5))
        assert [(c, int(p.first), p.last and int(p.last), p.settled, type(p.state).__name__)
                for c, p, _ in out] == [(5, 1, None, True, "Accepted"),
                                        (5, 3, None, True, "Accepted")]

    def test_dispositions_of_the_other_direction_pass_untouched(self):
        n = _numbering("w", "u")
        theirs = Disposition(role=False, first=0, settled=True)  # router settles its own
        assert disposition_to_client(n, theirs, b"raw", 0) == b"raw"
        ours = Disposition(role=True, first=0, settled=True)  # client settles the router's
        assert disposition_to_router(n, ours, b"raw", 0) == b"raw"

    def test_era_zero_passes_as_it_came(self):
        n = DeliveryNumbering(9)  # 0..8 were forwarded before: the same ids on both ends
        disp = Disposition(role=True, first=2, last=8, settled=True, state=Accepted())
        assert disposition_to_client(n, disp, b"raw", 0) == b"raw"

    def test_a_settled_era_is_forgotten(self):
        n = _numbering("w", "u", "w", "u", "w", "u")  # eras around 1, 3 and 5
        assert len(n.eras) == 4
        n.settle_range(*n.router_to_client(1, None)[0])  # client 3 settled by the router
        assert len(n.eras) == 3
        # a late disposition for client 3 has nowhere to go; its neighbours still map
        assert n.router_to_client(0, 2) == [(1, 1), (5, 5)]

    def test_a_detached_link_frees_its_deliveries(self):
        n = DeliveryNumbering(0)
        n.forward_first(1, 7, complete=False)
        n.withhold(2)
        n.forward_first(3, 8, complete=False)
        n.withhold(4)
        n.forget_handle(7)
        assert 1 not in n.live and 3 in n.live and len(n.eras) == 3


def test_a_delivery_id_out_of_sequence_is_refused_as_proton_does():
    """Once a session is renumbered the router cannot see the client's numbering: a first
    frame that reuses or skips a delivery-id is refused (found by the differential fuzzer: a
    reused unsettled id 0 got 'accepted' and 'rejected' both)."""
    n = DeliveryNumbering(4)  # 4 withheld: the client's next is 5
    for bad in (4, 0, 7):
        with pytest.raises(InvalidFieldError, match="sequencing error, expected delivery-id 5"):
            n.forward_first(bad, 0, complete=False)
        with pytest.raises(InvalidFieldError, match="sequencing error"):
            n.withhold(bad)
    assert n.forward_first(5, 0, complete=False) == 4
    n.withhold(None)  # the implicit next one (6)
    assert n.forward_first(7, 0, complete=True) == 5


def test_flows_of_a_sender_link_carry_its_withheld_count():
    flow = Flow(next_incoming_id=0, incoming_window=9, next_outgoing_id=0, outgoing_window=9,
                handle=0, delivery_count=0xFFFFFFFF, link_credit=5)
    assert flow_to_client(flow, 2) == {"delivery_count": 1}
    assert flow_to_router(Flow(handle=0, delivery_count=1), 2) == {
        "delivery_count": 0xFFFFFFFF}
    assert flow_to_client(flow, 0) == {}
    # no delivery-count (the router had not read the Attach): the sender's initial one
    assert flow_to_client(Flow(handle=0, link_credit=9), 3, initial=5) == {"delivery_count": 8}


# ---------------------------------------------------------------------- model check

operations = st.lists(st.one_of(
    st.tuples(st.just("send"), st.booleans(), st.booleans()),  # withheld?, settled at send?
    st.tuples(st.just("rdisp"), st.integers(0, 12), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("cdisp"), st.integers(0, 12), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("detach"), st.integers(0, 1)),
), min_size=1, max_size=60)


@given(st.sampled_from([0, 1000, 0xFFFFFFF0, 0xFFFFFFFF]), operations)
@settings(max_examples=400, deadline=None)
def test_the_map_agrees_with_hand_numbering(start, ops):
    n = DeliveryNumbering(start)
    client = [(start, True, None, 0)]  # (client id, withheld, router id, handle)
    live: set[int] = set()
    router_next = start
    for op in ops:
        nxt = client[-1][0] + 1
        if op[0] == "send":
            _, withheld, settled = op
            handle = len(client) % 2
            if withheld:
                n.withhold(nxt & MASK)
                client.append((nxt, True, None, handle))
            else:
                got = n.forward_first(nxt & MASK, handle, complete=settled)
                assert got == router_next & MASK
                client.append((nxt, False, router_next, handle))
                if not settled:
                    live.add(nxt)
                router_next += 1
        elif op[0] == "detach":
            n.forget_handle(op[1])
            live -= {c for c, w, _, h in client if h == op[1]}
        elif op[0] == "rdisp":
            _, back, length, settled = op
            first = router_next - 1 - back
            last = first + length
            got = n.router_to_client(first & MASK, last & MASK)
            ids = {c for a, b in got for c in range(a, b + 1)}
            named = {c for c, w, r, _ in client if not w and first <= r <= last}
            # nothing mapped to a delivery the router did not name (ids before the first
            # withheld one, which the model does not list, are the same on both ends)
            assert all(c < start and first <= c for c in ids - named)
            assert {c for c in named if c in live} <= ids  # nothing live lost
            assert [a for a, _ in got] == sorted(a for a, _ in got)
            if settled:
                for a, b in got:
                    n.settle_range(a, b)
                live -= named
        else:
            _, back, length, settled = op
            first = nxt - 1 - back
            last = first + length
            parts = n.client_to_router(first & MASK, last & MASK)
            ids = {c for a, b, _ in parts for c in range(a, b + 1)}
            named = {c for c, w, _, _ in client if not w and first <= c <= last}
            assert all(c < start and first <= c for c in ids - named)
            assert {c for c in named if c in live} <= ids
            routers = {c: r for c, w, r, _ in client if not w}
            for a, b, shift in parts:
                for c in range(a, b + 1):
                    assert c - shift == routers.get(c, c)
            if settled:
                for a, b, _ in parts:
                    n.settle_range(a, b)
                live -= named
        assert set(n.live) <= {c for c, w, _, _ in client if not w}
        assert live <= set(n.live)
        assert len(n.eras) <= len(n.live) + 2


# ------------------------------------------------------------ the proxy's own deliveries


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.sampled_from(["proxy", "router", "multi"]),
                                             min_size=1, max_size=40))
def test_inserted_numbering_keeps_the_clients_ids_consecutive_and_maps_back(r0, ops):
    """The proxy's replies and the router's deliveries reach the client with consecutive ids
    (proton's sequencing check); every id maps back: a router delivery's client id to its
    router id and back, the proxy's own ids to nothing; ranges split around the proxy's."""
    from amqp_policy_proxy.core.numbering import MASK, InsertedNumbering

    n = InsertedNumbering()
    router_id = r0
    seen: list[int] = []  # client ids, wire values, in order
    mine: set[int] = set()
    router_of: dict[int, int] = {}  # client id -> router id (wire)
    for op in ops:
        if op == "proxy":
            c = n.insert()
            mine.add(c)
        else:
            new = n.router_transfer(7, router_id, op == "multi", False)
            c = router_id if new is None else new
            if op == "multi":  # its continuation frame keeps the same client id
                more = n.router_transfer(7, router_id, False, False)
                assert (router_id if more is None else more) == c
            router_of[c] = router_id
            router_id = (router_id + 1) & MASK
        seen.append(c)
    for a, b in zip(seen, seen[1:], strict=False):
        assert b == (a + 1) & MASK
    for c in seen:
        if c in mine:
            assert n.client_to_router(c, None) == []
        else:
            assert [(x & MASK, y & MASK) for x, y in n.client_to_router(c, None)] == [
                (router_of[c], router_of[c])]
            assert [(x & MASK, y & MASK) for x, y in n.router_to_client(router_of[c], None)] == [
                (c, c)]
    ranges = n.client_to_router(seen[0], seen[-1])
    covered = [r & MASK for a, b in ranges for r in range(a, b + 1)]
    assert covered == [router_of[c] for c in seen if c not in mine]
