"""Token renewal through RabbitMQ's own ``/management`` (core/proxylinks.py "the broker's
pair", decision 0008), with raw frames: in front of RabbitMQ with ``token_authority =
"upstream"`` the proxy reads a ``PUT /auth/tokens`` instead of answering it; one it refuses
never reaches the broker (withheld, rejected), one it accepts is forwarded as it came, and
the connection takes the new identity only when the broker answers ``204``."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Disposition,
    Rejected,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import MessageDenied, TokenRenewed
from amqp_policy_proxy.core.proxylinks import is_token_put
from amqp_policy_proxy.policy.naming import Naming
from amqp_policy_proxy.tokens.sections import Properties, encode_message
from tests.support.issuer import Issuer

from .helpers import Open, frame, make_policy
from .test_renewal import CFG, auth_tokens
from .test_tokens import ROUTER_GREETING, WALL, issuer, login, plain, sasl, script

__all__ = ["issuer"]  # the fixture

EXP = int(WALL) + 300
#: RabbitMQ's /management is internal: a rule names it literally.
POLICY = make_policy({
    "senders": {"users": "nobody", "remoteHosts": "*", "targets": "*, /management",
                "sources": "*, /management"},
    "$default": {"remoteHosts": "*", "sources": "*", "targets": "*"},
}, allowUnknownUser=True)


def connected(issuer: Issuer, authority: str = "upstream", policy: Any = POLICY) -> Any:
    """A token connection in front of RabbitMQ with the /management pair attached both ways."""
    s = script(issuer, authority, cfg=CFG, policy=policy)
    s.conn.naming = Naming("rabbitmq")
    token = plain(issuer.token(now=WALL, exp=EXP))
    if authority == "upstream":
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connected(s.now))
        s.router(ROUTER_GREETING)
        s.client(token)
        s.router(sasl(SaslOutcome(code=0)))
        s.client(C.AMQP_HEADER)
        s.router(C.AMQP_HEADER)
    else:
        s.client(C.SASL_HEADER + token)
        login(s)
        s.client(C.AMQP_HEADER)
    s.client(frame(0, Open(container_id="client", hostname="test")))
    s.router(frame(0, Open(container_id="router")))
    s.client(frame(0, Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100,
                            handle_max=1023)))
    s.router(frame(5, Begin(remote_channel=0, next_outgoing_id=0, incoming_window=1000,
                            outgoing_window=1000, handle_max=1023)))
    s.client(frame(0, Attach(name="req", handle=0, role=False, source=Source(address="me"),
                             target=Target(address="/management"))))
    s.client(frame(0, Attach(name="rsp", handle=1, role=True,
                             source=Source(address="/management"), target=Target(address="$me"))))
    s.router(frame(5, Attach(name="req", handle=0, role=True, source=Source(address="me"),
                             target=Target(address="/management"))))
    s.router(frame(5, Attach(name="rsp", handle=1, role=False,
                             source=Source(address="/management"), target=Target(address="$me"),
                             initial_delivery_count=0)))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    return s


def send(s: Any, payload: bytes, delivery_id: int) -> None:
    s.client(frame(0, Transfer(handle=0, delivery_id=delivery_id,
                               delivery_tag=b"t%d" % delivery_id, message_format=0), payload))


def answer(s: Any, mid: Any, status: str, delivery_id: int = 0) -> None:
    reply = encode_message(Properties(correlation_id=mid, subject=status), body=None,
                           body_kind="value")
    s.router(frame(5, Transfer(handle=1, delivery_id=delivery_id, delivery_tag=b"r",
                               message_format=0, settled=True), reply))


def renewals(s: Any) -> list[tuple[str, str]]:
    return [(e.result, e.reason) for e in s.events if isinstance(e, TokenRenewed)]


def transfers(frames: list[Any]) -> list[Any]:
    return [p for _, p, _ in frames if isinstance(p, Transfer)]


def test_an_accepted_renewal_is_forwarded_and_takes_effect_on_the_brokers_204(issuer):
    s = connected(issuer)
    deadline = s.conn.expiry_deadline
    assert deadline is not None
    put = auth_tokens(issuer.token(now=WALL, exp=EXP + 3600), "m1")
    send(s, put, 0)
    forwarded = s.take(Side.ROUTER)
    assert [p.delivery_id for p in transfers(forwarded)] == [0]
    assert forwarded[0][2] == put  # the request as it came
    assert s.conn.expiry_deadline == deadline and renewals(s) == []  # not before the answer
    answer(s, "m1", "204")
    assert [p.handle for p in transfers(s.take(Side.CLIENT))] == [1]  # the answer is relayed
    assert renewals(s) == [("accepted", "")]
    assert s.conn.expiry_deadline is not None and s.conn.expiry_deadline > deadline + 3000


def test_a_renewal_the_broker_refuses_changes_nothing(issuer):
    s = connected(issuer)
    deadline = s.conn.expiry_deadline
    send(s, auth_tokens(issuer.token(now=WALL, exp=EXP + 3600), "m1"), 0)
    assert transfers(s.take(Side.ROUTER))
    answer(s, "m1", "401")
    assert renewals(s) == [("refused", "upstream_refused")]
    assert s.conn.expiry_deadline == deadline
    answer(s, "m1", "204", 1)  # a later 204 with that id answers another request
    assert renewals(s) == [("refused", "upstream_refused")]
    assert s.conn.expiry_deadline == deadline


@pytest.mark.parametrize("why, token", [
    ("subject_changed", lambda i: i.token(now=WALL, sub="mallory", exp=EXP + 3600)),
    ("not_newer", lambda i: i.token(now=WALL, exp=EXP - 100)),
    ("expired", lambda i: i.token(now=WALL - 7200, exp=int(WALL) - 3600)),
])
def test_a_worse_token_never_reaches_the_broker(issuer, why, token):
    s = connected(issuer)
    send(s, auth_tokens(token(issuer), "m1"), 0)
    assert transfers(s.take(Side.ROUTER)) == []
    [disp] = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Disposition)]
    assert disp.first == 0 and isinstance(disp.state, Rejected)
    assert disp.state.error.condition == C.Condition.UNAUTHORIZED_ACCESS
    assert renewals(s) == [("refused", why)]
    assert [e.reason for e in s.events if isinstance(e, MessageDenied)] == ["token_renewal"]
    # the next request goes on, renumbered past the withheld one
    send(s, encode_message(Properties(message_id="q", to="/queues/x", subject="GET"),
                           body=None, body_kind="value"), 1)
    assert [p.delivery_id for p in transfers(s.take(Side.ROUTER))] == [0]


def test_other_management_requests_pass_unread(issuer):
    s = connected(issuer)
    send(s, encode_message(Properties(message_id="q", to="/queues/x", subject="PUT"),
                           body=b"{}", body_kind="value"), 0)
    assert [p.delivery_id for p in transfers(s.take(Side.ROUTER))] == [0]
    answer(s, "q", "201")
    assert renewals(s) == []


def test_a_near_miss_of_the_path_is_a_renewal_and_must_be_exact(issuer):
    s = connected(issuer)
    put = encode_message(Properties(message_id="m1", to="//auth/%74okens/", subject="put",
                                    reply_to="$me"),
                         body=issuer.token(now=WALL, exp=EXP + 3600).encode(), body_kind="value")
    send(s, put, 0)
    assert transfers(s.take(Side.ROUTER)) == []
    assert renewals(s) == [("bad_request", "bad_request")]


def test_with_the_proxy_as_authority_the_broker_has_no_token_to_renew(issuer):
    s = connected(issuer, "proxy")
    send(s, auth_tokens(issuer.token(now=WALL, exp=EXP + 3600), "m1"), 0)
    assert transfers(s.take(Side.ROUTER)) == []
    assert renewals(s) == [("refused", "not_upstream_authority")]


def test_the_broker_pair_keeps_the_router_side_off_the_fast_path(issuer):
    s = connected(issuer)
    assert s.conn.sessions.reads_replies and not s.conn.sessions.router_fast


@pytest.mark.parametrize("to, method, expected", [
    ("/auth/tokens", "PUT", True),
    ("/AUTH/Tokens/", "put", True),
    ("/auth/%74okens", "PUT", True),
    ("/auth/tokens", "GET", False),
    ("/auth/tokens/x", "PUT", False),
    ("/queues/auth", "PUT", False),
    (None, "PUT", False),
])
def test_what_counts_as_a_renewal(to, method, expected):
    assert is_token_put(to, method) is expected


def test_a_request_whose_properties_do_not_fit_its_first_frame_is_a_refused_renewal(issuer):
    # no per-message rule on the link (allowUserIdProxy): only the renewal check reads it
    s = connected(issuer, policy=make_policy({
        "senders": {"users": "nobody", "remoteHosts": "*", "targets": "*, /management",
                    "sources": "*, /management", "allowUserIdProxy": True},
        "$default": {"remoteHosts": "*", "sources": "*", "targets": "*"},
    }, allowUnknownUser=True))
    assert not s.conn.sessions.rules.check_user_id
    put = auth_tokens(issuer.token(now=WALL, exp=EXP + 3600), "m1")
    s.client(frame(0, Transfer(handle=0, delivery_id=0, delivery_tag=b"t0", message_format=0,
                               more=True), put[:6]))
    s.client(frame(0, Transfer(handle=0, more=False), put[6:]))
    assert transfers(s.take(Side.ROUTER)) == []
    assert renewals(s) == [("bad_request", "bad_request")]
    assert [e.reason for e in s.events if isinstance(e, MessageDenied)] == ["token_renewal"]
