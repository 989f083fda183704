"""In-band token renewal in the core (core/proxylinks.py, docs/oauth2.md "Renewal"), with raw
frames: the proxy answers a token connection's ``$cbs`` and ``/management`` links itself on
reserved handles, the router never sees them, the numbers of the router's session stay
right on both legs, an accepted renewal moves the expiry and re-checks the links, a worse
token changes nothing (401)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp import codec
from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Detach,
    Disposition,
    Flow,
    Source,
    Target,
    Transfer,
)
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import TokenRenewed
from amqp_policy_proxy.core.proxylinks import REPLY_LINK_REFUSED
from amqp_policy_proxy.tokens.sections import Properties, decode_message, encode_message
from tests.support.issuer import Issuer

from .helpers import Open, frame, make_policy
from .test_tokens import WALL, config, issuer, login, plain, script

__all__ = ["issuer"]  # the fixture

POLICY = make_policy({
    "senders": {"users": "nobody", "remoteHosts": "*", "targets": "*", "sources": "*"},
    "narrow": {"users": "nobody2", "remoteHosts": "*", "targets": "a", "sources": "*"},
    "$default": {"remoteHosts": "*", "sources": "*", "targets": "*"},
}, allowUnknownUser=True)
CFG = config(groups=[{"vhost": "test", "group": "senders", "scopes": ["send"]},
                     {"vhost": "test", "group": "narrow", "scopes": ["narrow"]}])


def admitted(issuer: Issuer, exp: float = WALL + 300) -> Any:
    s = script(issuer, cfg=CFG, policy=POLICY)
    s.client(C.SASL_HEADER + plain(issuer.token(now=WALL, exp=int(exp))))
    login(s)
    s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
    s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
    s.client(frame(0, Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100,
                            handle_max=1023)))
    s.router(frame(5, Begin(remote_channel=0, next_outgoing_id=0, incoming_window=1000,
                            outgoing_window=1000, handle_max=1023)))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    return s


def attach_pair(s: Any, node: str = "$cbs", reply_to: str = "cbs-reply") -> None:
    s.client(frame(0, Attach(name="req", handle=0, role=False, source=Source(address="me"),
                             target=Target(address=node))))
    s.client(frame(0, Attach(name="rsp", handle=1, role=True, source=Source(address=node),
                             target=Target(address=reply_to))))
    s.client(frame(0, Flow(next_incoming_id=0, incoming_window=100, next_outgoing_id=0,
                           outgoing_window=100, handle=1, delivery_count=0, link_credit=10)))


def put_token(token: str, mid: str = "m1") -> bytes:
    return encode_message(
        Properties(message_id=mid, reply_to="cbs-reply"),
        [("operation", "put-token"), ("type", "jwt"), ("name", "amqp://test/"),
         ("expiration", codec.timestamp(int(WALL * 1000)))],
        body=token, body_kind="value")


def auth_tokens(token: str, mid: str = "m1") -> bytes:
    return encode_message(Properties(message_id=mid, to="/auth/tokens", subject="PUT",
                                     reply_to="$me"), body=token.encode(), body_kind="value")


def send(s: Any, payload: bytes, delivery_id: int, handle: int = 0) -> None:
    s.client(frame(0, Transfer(handle=handle, delivery_id=delivery_id,
                               delivery_tag=b"t%d" % delivery_id, message_format=0), payload))


def replies(frames: list[Any]) -> list[Any]:
    return [(perf, decode_message(payload)) for _, perf, payload in frames
            if isinstance(perf, Transfer)]


def status(message: Any) -> Any:
    return message.application_properties.get("status-code")


def test_cbs_put_token_is_answered_by_the_proxy_and_moves_the_expiry(issuer):
    s = admitted(issuer)
    first_deadline = s.conn.expiry_deadline
    attach_pair(s)
    out = s.take(Side.CLIENT)
    attaches = [p for ch, p, _ in out if isinstance(p, Attach)]
    assert [(a.name, a.role, str(a.target.address if a.role else a.source.address))
            for a in attaches] == [("req", True, "$cbs"), ("rsp", False, "$cbs")]
    assert all(a.handle > 1023 - 64 for a in attaches)  # handles the router never uses
    assert all(ch == 5 for ch, p, _ in out)  # on the router's channel of the session
    credit = [p for _, p, _ in out if isinstance(p, Flow)]
    assert credit and credit[0].link_credit > 0 and credit[0].handle == attaches[0].handle
    send(s, put_token(issuer.token(now=WALL, exp=int(WALL) + 3600)), 0)
    out = s.take(Side.CLIENT)
    disp = [p for _, p, _ in out if isinstance(p, Disposition)]
    assert [(d.role, d.first, d.settled) for d in disp] == [(True, 0, True)]
    [(transfer, reply)] = replies(out)
    assert transfer.handle == attaches[1].handle and transfer.delivery_id == 0
    assert status(reply) == 202 and reply.properties.correlation_id == "m1"
    assert reply.properties.to == "cbs-reply"
    assert s.take(Side.ROUTER) == []  # the router never sees the links, frames or requests
    assert s.conn.expiry_deadline is not None and first_deadline is not None
    assert s.conn.expiry_deadline > first_deadline + 3000
    assert [(e.node, e.result) for e in s.events if isinstance(e, TokenRenewed)] == [
        ("$cbs", "accepted")]


def test_auth_tokens_put_is_answered_204(issuer):
    s = admitted(issuer)
    attach_pair(s, "/management", "$me")
    s.take(Side.CLIENT)
    send(s, auth_tokens(issuer.token(now=WALL, exp=int(WALL) + 3600)), 0)
    [(_, reply)] = replies(s.take(Side.CLIENT))
    assert reply.properties.subject == "204"
    assert s.take(Side.ROUTER) == []


def test_another_subject_or_an_earlier_exp_is_refused_and_changes_nothing(issuer):
    s = admitted(issuer)
    deadline = s.conn.expiry_deadline
    attach_pair(s)
    s.take(Side.CLIENT)
    send(s, put_token(issuer.token(now=WALL, sub="mallory", exp=int(WALL) + 3600), "a"), 0)
    send(s, put_token(issuer.token(now=WALL, exp=int(WALL) + 100), "b"), 1)
    send(s, put_token(issuer.token(now=WALL - 9000, exp=int(WALL) - 3600), "c"), 2)
    got = [(m.properties.correlation_id, status(m)) for _, m in replies(s.take(Side.CLIENT))]
    assert got == [("a", 401), ("b", 401), ("c", 401)]
    assert s.conn.expiry_deadline == deadline and s.conn.user == "alice"
    assert [e.reason for e in s.events if isinstance(e, TokenRenewed)] == [
        "subject_changed", "not_newer", "expired"]


def test_a_narrower_token_detaches_exactly_the_links_it_no_longer_allows(issuer):
    s = admitted(issuer)
    s.client(frame(0, Attach(name="to-a", handle=2, role=False, target=Target(address="a"))))
    s.client(frame(0, Attach(name="to-b", handle=3, role=False, target=Target(address="b"))))
    s.router(frame(5, Attach(name="to-a", handle=0, role=True, target=Target(address="a"))))
    s.router(frame(5, Attach(name="to-b", handle=1, role=True, target=Target(address="b"))))
    attach_pair(s)
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    send(s, put_token(issuer.token(now=WALL, exp=int(WALL) + 3600,
                                   scope="amqp-proxy.narrow")), 0)
    [(_, reply)] = replies(s.take(Side.CLIENT))
    assert status(reply) == 202 and s.conn.group.name == "narrow"
    detached = [p.handle for _, p, _ in s.take(Side.ROUTER) if isinstance(p, Detach)]
    assert detached == [3]  # to-b; to-a goes on
    send(s, b"\x00\x53\x77\xa1\x02hi", 1, handle=2)  # to-a still sends (renumbered id)
    [(_, t, _)] = s.take(Side.ROUTER)
    assert isinstance(t, Transfer) and t.handle == 2 and t.delivery_id == 0


def test_router_deliveries_after_a_reply_are_renumbered_for_the_client(issuer):
    s = admitted(issuer)
    attach_pair(s)
    s.client(frame(0, Attach(name="in", handle=4, role=True, source=Source(address="q"))))
    s.router(frame(5, Attach(name="in", handle=7, role=False, source=Source(address="q"),
                             initial_delivery_count=0)))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    send(s, put_token(issuer.token(now=WALL, exp=int(WALL) + 3600)), 0)
    [(reply, _)] = replies(s.take(Side.CLIENT))
    assert reply.delivery_id == 0
    s.router(frame(5, Transfer(handle=7, delivery_id=0, delivery_tag=b"r", message_format=0),
                   b"\x00\x53\x77\xa1\x01x"))
    [(_, t, _)] = s.take(Side.CLIENT)
    assert t.delivery_id == 1  # after the proxy's own delivery
    s.client(frame(0, Disposition(role=True, first=0, last=1, settled=True)))
    [(_, d, _)] = s.take(Side.ROUTER)
    assert (d.first, d.last) == (0, None)  # the proxy's id left out, the router's mapped


def test_a_reply_link_after_router_receivers_on_its_session_is_refused(issuer):
    s = admitted(issuer)
    s.client(frame(0, Attach(name="in", handle=4, role=True, source=Source(address="q"))))
    s.take(Side.ROUTER)
    s.client(frame(0, Attach(name="rsp", handle=1, role=True, source=Source(address="$cbs"),
                             target=Target(address="r"))))
    out = s.take(Side.CLIENT)
    [detach] = [p for _, p, _ in out if isinstance(p, Detach)]
    assert detach.error.description == REPLY_LINK_REFUSED
    assert s.take(Side.ROUTER) == []


def test_connections_without_tokens_relay_cbs_links_to_the_router():
    from .helpers import Script
    s = Script(POLICY)
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.take(Side.ROUTER)
    s.client(frame(0, Attach(name="req", handle=0, role=False, target=Target(address="$cbs"))))
    assert s.conn.sessions.sessions[0].proxy_links is None  # the policy decides it as any


TOKENS = Issuer()
GOOD = TOKENS.token(now=WALL, exp=int(WALL) + 3600)
OTHER = TOKENS.token(now=WALL, sub="mallory", exp=int(WALL) + 3600)
EARLIER = TOKENS.token(now=WALL, exp=int(WALL) + 100)


def _cbs(token: str, op: str, typ: str) -> bytes:
    return encode_message(Properties(message_id="x", reply_to="r"),
                          [("operation", op), ("type", typ), ("name", "n")],
                          body=token, body_kind="value")


REQUESTS = st.one_of(
    st.binary(max_size=64),
    st.builds(_cbs, st.one_of(st.text(max_size=40), st.sampled_from([GOOD, OTHER, EARLIER])),
              st.sampled_from(["put-token", "delete-token", ""]),
              st.sampled_from(["jwt", "sas", ""])),
)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(REQUESTS, st.integers(1, 3), st.booleans(), st.booleans()),
                min_size=1, max_size=4))
def test_random_renewal_messages_are_answered_or_close_the_connection(issuer, messages):
    """Random requests, split over 1-3 frames, settled or not, some aborted: nothing escapes
    the core, nothing reaches the router, every reply is 202 (only for the good token), 400
    or 401, and a Close (if any) carries an AMQP condition."""
    s = script(TOKENS, cfg=CFG, policy=POLICY)
    s.client(C.SASL_HEADER + plain(TOKENS.token(now=WALL)))
    login(s)
    s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
    s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
    s.client(frame(0, Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100,
                            handle_max=1023)))
    s.router(frame(5, Begin(remote_channel=0, next_outgoing_id=0, incoming_window=1000,
                            outgoing_window=1000, handle_max=1023)))
    attach_pair(s)
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    expected_ok = 0
    for i, (payload, parts, settled, aborted) in enumerate(messages):
        cut = [len(payload) * k // parts for k in range(parts + 1)]
        for k in range(parts):
            last = k == parts - 1
            s.client(frame(0, Transfer(handle=0, delivery_id=i if k == 0 else None,
                                       delivery_tag=b"t%d" % i if k == 0 else None,
                                       message_format=0 if k == 0 else None,
                                       settled=settled or None, more=not last or None,
                                       aborted=(aborted and last) or None),
                           payload[cut[k]:cut[k + 1]]))
        expected_ok += payload == _cbs(GOOD, "put-token", "jwt") and not aborted
    out = s.take(Side.CLIENT)
    codes = [status(m) for _, m in replies(out)]
    assert all(c in (202, 400, 401) for c in codes), codes
    assert codes.count(202) <= expected_ok
    closes = [p for _, p, _ in out if type(p).__name__ == "Close"]
    assert not closes or str(closes[0].error.condition).startswith("amqp:")
    assert s.take(Side.ROUTER) == []


def test_management_is_rabbitmqs_own_node_in_front_of_rabbitmq(issuer):
    from amqp_policy_proxy.policy.naming import Naming

    s = script(issuer, cfg=CFG, policy=POLICY)
    s.conn.naming = Naming("rabbitmq")
    s.client(C.SASL_HEADER + plain(issuer.token(now=WALL)))
    login(s)
    s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
    s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
    s.client(frame(0, Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100,
                            handle_max=1023)))
    s.take(Side.ROUTER)
    s.client(frame(0, Attach(name="m", handle=0, role=False, target=Target(address="/management"))))
    s.client(frame(0, Attach(name="c", handle=1, role=False, target=Target(address="$cbs"))))
    session = s.conn.sessions.sessions[0]
    assert session.proxy_links is not None and list(session.proxy_links) == [1]
