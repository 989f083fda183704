"""Transcript tests of re-evaluation after a reload (core/revocation.py): a connection the new
policy no longer admits is closed with QDR's denial Close, a link the new group no longer
allows is detached (the router first, the client with amqp:unauthorized-access) while the
session goes on, shadow mode changes nothing on the wire."""

from __future__ import annotations

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ConnectionClosed, Revoked

from .helpers import (
    Attach,
    Close,
    Detach,
    Flow,
    Script,
    Source,
    Target,
    Transfer,
    frame,
    make_policy,
)

BEFORE = make_policy({"staff": {"users": "alice, bob", "remoteHosts": "*",
                                "sources": "public.*", "targets": "public.*, orders.*"}})
NO_ALICE = make_policy({"staff": {"users": "bob", "remoteHosts": "*",
                                  "sources": "public.*", "targets": "public.*, orders.*"}})
NARROWER = make_policy({"staff": {"users": "alice, bob", "remoteHosts": "*",
                                  "sources": "public.*", "targets": "public.*"}})
NARROWER_SHADOW = make_policy({"staff": {"users": "alice, bob", "remoteHosts": "*",
                                         "sources": "public.*", "targets": "public.*",
                                         "enforcement": "shadow"}})


def names(frames):
    return [(type(p).__name__, getattr(getattr(p, "error", None), "condition", None))
            for _, p, _ in frames]


def with_links() -> Script:
    """alice, a session, a sender to orders.new (handle 0), a sender to public.a (handle 1)."""
    s = Script(BEFORE)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.client(frame(0, Attach(name="o", handle=0, role=False, source=Source(address="c"),
                             target=Target(address="orders.new"), initial_delivery_count=0)))
    s.client(frame(0, Attach(name="p", handle=1, role=False, source=Source(address="c"),
                             target=Target(address="public.a"), initial_delivery_count=0)))
    s.router(frame(0, Attach(name="o", handle=5, role=True, source=Source(address="c"),
                             target=Target(address="orders.new"))))
    s.router(frame(0, Attach(name="p", handle=6, role=True, source=Source(address="c"),
                             target=Target(address="public.a"))))
    s.take(Side.CLIENT), s.take(Side.ROUTER)
    return s


def test_a_connection_the_new_policy_does_not_admit_gets_qdrs_denial_close():
    s = with_links()
    s._run(s.conn.reevaluate(NO_ALICE, 10.0))
    assert names(s.take(Side.CLIENT)) == [("Close", "amqp:resource-limit-exceeded")]
    assert s.take(Side.ROUTER) == []
    s.client(frame(0, Close()))
    assert names(s.take(Side.ROUTER)) == [("Close", None)]
    s._run(s.conn.connection_lost(Side.CLIENT, 10.1))
    assert [e.close_reason for e in s.events if isinstance(e, ConnectionClosed)] == ["revoked"]
    assert [(e.kind, e.reason, e.mode) for e in s.events if isinstance(e, Revoked)] == [
        ("connection", "unknown_user", "enforce")]


def test_another_user_is_not_touched():
    s = Script(BEFORE)
    s.open(user="bob")
    s.take(Side.CLIENT), s.take(Side.ROUTER)
    s._run(s.conn.reevaluate(NO_ALICE, 10.0))
    assert s.take(Side.CLIENT) == [] and s.take(Side.ROUTER) == []
    assert not [e for e in s.events if isinstance(e, Revoked)]


def test_a_narrowed_target_detaches_that_link_only_and_the_session_goes_on():
    s = with_links()
    s._run(s.conn.reevaluate(NARROWER, 10.0))
    to_router = s.take(Side.ROUTER)
    assert [(type(p).__name__, p.handle, p.closed) for _, p, _ in to_router] == [
        ("Detach", 0, True)]
    assert s.take(Side.CLIENT) == []  # the client hears it from the router's answer
    assert s.conn.figures.active_senders == 1
    # a Transfer the client sent before it knew: dropped, its delivery-id withheld
    s.client(frame(0, Transfer(handle=0, delivery_id=0, delivery_tag=b"a", settled=True)))
    assert s.take(Side.ROUTER) == []
    # the allowed link's next delivery reaches the router, renumbered past the dropped one
    s.client(frame(0, Transfer(handle=1, delivery_id=1, delivery_tag=b"b", settled=True)))
    got = s.take(Side.ROUTER)
    assert [(type(p).__name__, p.handle, p.delivery_id) for _, p, _ in got] == [
        ("Transfer", 1, 0)]
    # the client's Flow on the revoked handle keeps its session part only
    s.client(frame(0, Flow(handle=0, delivery_count=0, link_credit=5, next_incoming_id=0,
                           incoming_window=100, next_outgoing_id=2, outgoing_window=100)))
    flows = [p for _, p, _ in s.take(Side.ROUTER)]
    assert len(flows) == 1 and flows[0].handle is None and flows[0].link_credit is None
    # the router answers: the client gets the Detach with QDR's condition for a policy denial
    s.router(frame(0, Detach(handle=5, closed=True)))
    client = s.take(Side.CLIENT)
    assert [(type(p).__name__, p.handle, str(p.error.condition)) for _, p, _ in client] == [
        ("Detach", 5, "amqp:unauthorized-access")]
    s.client(frame(0, Detach(handle=0, closed=True)))  # its answer: consumed
    assert s.take(Side.ROUTER) == []
    # the handle is free again for a new link the new policy allows
    s.client(frame(0, Attach(name="q", handle=0, role=False, source=Source(address="c"),
                             target=Target(address="public.b"), initial_delivery_count=0)))
    assert [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)] == ["Attach"]
    assert [(e.kind, e.reason, e.role, e.address) for e in s.events
            if isinstance(e, Revoked)] == [("link", "target", "sender", "orders.new")]


def test_a_client_that_detaches_meanwhile_gets_the_routers_answer_without_an_error():
    s = with_links()
    s._run(s.conn.reevaluate(NARROWER, 10.0))
    s.take(Side.ROUTER)
    s.client(frame(0, Detach(handle=0, closed=True)))  # crossing the proxy's
    assert s.take(Side.ROUTER) == []
    s.router(frame(0, Detach(handle=5, closed=True)))
    client = s.take(Side.CLIENT)
    assert [(type(p).__name__, p.handle, p.error) for _, p, _ in client] == [
        ("Detach", 5, None)]


def test_shadow_reports_the_same_set_and_changes_nothing_on_the_wire():
    s = with_links()
    s._run(s.conn.reevaluate(NARROWER, 10.0, "shadow"))
    assert s.take(Side.CLIENT) == [] and s.take(Side.ROUTER) == []
    assert [(e.kind, e.reason, e.mode) for e in s.events if isinstance(e, Revoked)] == [
        ("link", "target", "shadow")]
    s2 = with_links()
    s2._run(s2.conn.reevaluate(NARROWER_SHADOW, 10.0))  # the group's own shadow
    assert s2.take(Side.CLIENT) == [] and s2.take(Side.ROUTER) == []
    s3 = with_links()
    s3._run(s3.conn.reevaluate(NO_ALICE, 10.0, "shadow"))
    assert s3.take(Side.CLIENT) == [] and s3.take(Side.ROUTER) == []
    assert [(e.kind, e.mode) for e in s3.events if isinstance(e, Revoked)] == [
        ("connection", "shadow")]


def test_off_keeps_qdrs_behaviour():
    s = with_links()
    s._run(s.conn.reevaluate(NO_ALICE, 10.0, "off"))
    assert s.take(Side.CLIENT) == [] and s.take(Side.ROUTER) == []
    assert not [e for e in s.events if isinstance(e, Revoked)]
