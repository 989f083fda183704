"""Policy bypass attempts, end to end: raw socket client → real proxy → recording raw router.

Each attempt is sent as a hostile client would (hand-built frames from our encoder, often
pipelined in one write) and must be denied on the wire with QDR's answer **and** never reach
the router: the upstream records every frame it receives. The transcript tests in
``tests/unit/core/test_connection.py`` pin the exact frames the core emits; these prove the
same through the real relay, sockets and timing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.codec import ulong
from amqp_policy_proxy.core.events import ConnectionDenied, LinkDenied, ProtocolViolation
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import (
    Attach,
    Begin,
    Detach,
    Disposition,
    End,
    Flow,
    Item,
    Open,
    RawClient,
    RawUpstream,
    SaslInit,
    SaslOutcome,
    Transfer,
    attach_receiver,
    attach_sender,
    begin,
    data_message,
    frame,
    names,
    sasl_plain_init,
    transfer,
)

pytestmark = pytest.mark.integration

LIST_RULES = {"targets": "public.a, tmp-${user}*, ${user}.inbox", "sources": "public.a, ${user}.inbox"}
PATTERN_RULES = {"targetPattern": "queue.${user}, public.#", "sourcePattern": "${user}.#"}

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "test",
        "allowUnknownUser": True,
        "groups": {
            "owners": {"users": "alice, anonymous", "remoteHosts": "*", "maxSessions": 4,
                       "maxSenders": 2, "maxReceivers": 2, **LIST_RULES},
            "blocked": {"users": "eve", "remoteHosts": "10.0.0.1"},
            "$default": {"remoteHosts": "*", **PATTERN_RULES},
        },
    }],
    ["vhost", {
        "hostname": "listmode",
        "allowUnknownUser": True,
        "groups": {"$default": {"remoteHosts": "*", **LIST_RULES}},
    }],
])], PolicySettings())


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    with RawUpstream(sasl_reject={"liar"}) as up:
        yield up


@pytest.fixture
def proxy(upstream: RawUpstream) -> Iterator[ProxyThread]:
    with ProxyThread([("127.0.0.1", upstream.port)], policy=POLICY) as px:
        yield px
        assert px.daemon.internal_errors == 0, "a bypass attempt crashed a connection"


def closes(items: list[Item]) -> list[tuple[str | None, str | None]]:
    """(condition, description) of every Close among ``items``."""
    return [(i.condition, i.description) for i in items if i.name == "Close"]


def router_got(upstream: RawUpstream, *kinds: type) -> list[Item]:
    """Frames of the given performative classes the router received (after a short settle)."""
    time.sleep(0.1)
    return [i for i in upstream.items() if isinstance(i.perf, kinds)]


# ---------------------------------------------------------------------------------- admission


class TestDeniedOpen:
    def test_frames_pipelined_behind_a_denied_open_never_reach_the_router(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            assert c.sasl_plain("eve") == 0  # the router accepts eve; policy denies her host
            c.send(C.AMQP_HEADER,
                   frame(0, Open(container_id="x", hostname="test")),
                   begin(0), attach_sender(0, 0, "public.a"),
                   transfer(0, 0, 0, data_message(b"smuggled")),
                   frame(0, Flow(next_incoming_id=0, incoming_window=10, next_outgoing_id=0,
                                 outgoing_window=10)))
            got = c.read_until(lambda i: i.name == "Close")
        assert names(got)[-2:] == ["Open", "Close"]
        assert closes(got) == [("amqp:resource-limit-exceeded",
                                "connection disallowed by local policy")]
        assert router_got(upstream, Open, Begin, Attach, Transfer, Flow) == []
        assert b"smuggled" not in b"".join(i.payload for i in upstream.items())
        assert upstream.wait_for(lambda u: u.active == 0)
        assert [str(e.reason) for e in proxy.events_of(ConnectionDenied)] == ["remote_host"]

    def test_no_vhost_without_sasl_gets_nothing_through(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            got = c.open("nosuchvhost", then=begin(0) + attach_sender(0, 0, "public.a"))
        assert closes(got) == [("amqp:resource-limit-exceeded",
                                "connection disallowed by local policy")]
        assert router_got(upstream, Open, Begin, Attach) == []

    def test_second_open_is_illegal_state_and_the_router_sees_one_open(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.open(user="alice")
            c.send(frame(0, Open(container_id="again", hostname="listmode")))
            got = c.read_until_closed()
        assert closes(got) == [("amqp:illegal-state", "second Open")]
        assert len(router_got(upstream, Open)) == 1

    def test_second_open_pipelined_before_the_decision(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            got = c.open(user="alice", then=frame(0, Open(container_id="b", hostname="x")))
            got += c.read_until_closed()
        assert ("amqp:illegal-state", "second Open") in closes(got)
        opens = router_got(upstream, Open)
        assert len(opens) == 1 and str(opens[0].perf.hostname) == "test"


# ---------------------------------------------------------------------------------- SASL


class TestSasl:
    def test_amqp_frames_during_sasl_are_a_framing_error(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, frame(0, Open(container_id="x", hostname="test")), begin(0))
            c.read_until_closed()
        assert c.closed
        assert router_got(upstream, Open, Begin) == []
        assert [e.condition for e in proxy.events_of(ProtocolViolation)] == [
            "amqp:connection:framing-error"]

    def test_client_forged_sasl_outcome_is_refused(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, frame(0, SaslOutcome(code=0), ftype=1), C.AMQP_HEADER,
                   frame(0, Open(container_id="x", hostname="test")), begin(0))
            c.read_until_closed()
        assert c.closed
        assert router_got(upstream, SaslOutcome, SaslInit, Open, Begin) == []
        assert [e.condition for e in proxy.events_of(ProtocolViolation)] == ["amqp:illegal-state"]

    def test_forged_outcome_after_a_failed_authentication(self, proxy, upstream):
        # a real sasl-init the router will reject, then a forged ok and a pipelined Open
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, sasl_plain_init("liar", "wrong"),
                   frame(0, SaslOutcome(code=0), ftype=1), C.AMQP_HEADER,
                   frame(0, Open(container_id="x", hostname="test")))
            c.read_until_closed()
        assert c.closed
        assert router_got(upstream, SaslOutcome, Open) == []
        assert proxy.daemon.ledger.active() == 0

    def test_open_pipelined_before_the_routers_outcome_is_not_admitted(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, sasl_plain_init("liar", "wrong"), C.AMQP_HEADER,
                   frame(0, Open(container_id="x", hostname="test")),
                   begin(0), attach_sender(0, 0, "public.a"))
            got = c.read_until_closed()
        assert not any(i.name == "Open" and i.perf.container_id != "amqp-policy-proxy"
                       for i in got)
        assert router_got(upstream, Open, Begin, Attach) == []
        assert proxy.daemon.ledger.active() == 0

    @pytest.mark.parametrize("response", ["alice", ulong(2**40), ["a", "b"]],
                             ids=["string", "huge-ulong", "list"])
    def test_sasl_init_with_a_non_binary_response(self, proxy, upstream, response):
        # bytes(ulong(2**40)) would have allocated a terabyte (fixed; fuzz/regressions)
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, frame(0, SaslInit(mechanism="PLAIN",
                                                    initial_response=response), ftype=1))
            c.read_until_closed()
        assert c.closed
        assert router_got(upstream, SaslInit) == []
        assert [e.condition for e in proxy.events_of(ProtocolViolation)] == ["amqp:decode-error"]

    def test_tls_header_without_tls_is_refused_before_any_upstream_connection(self, proxy,
                                                                               upstream):
        with RawClient(proxy.port) as c:
            c.send(C.TLS_HEADER)
            got = c.read_until_closed()
        assert got[0].perf == C.AMQP_HEADER
        assert closes(got) == [("amqp:connection:framing-error", "Unknown protocol detected")]
        time.sleep(0.1)
        assert upstream.connections_made == 0


# ---------------------------------------------------------------------------------- sessions and links


class TestSessionsAndLinks:
    def test_attach_pipelined_in_the_same_packet_as_a_denied_begin(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.open(user="alice")  # maxSessions 4: channels 0..3
            c.send(begin(6), attach_sender(6, 0, "public.a"),
                   transfer(6, 0, 0, data_message(b"smuggled")), begin(0))
            got = c.read_until(lambda i: i.name == "Begin" and i.perf.remote_channel == 0)
            assert [(i.name, i.condition) for i in got if i.name in ("Begin", "End")][:2] == [
                ("Begin", None), ("End", "amqp:resource-limit-exceeded")]
            assert int(got[0].perf.remote_channel) == 6
            c.send(frame(6, End()), attach_sender(0, 0, "public.a"))  # still usable
            c.read_until(lambda i: i.name == "Attach")
        begins = router_got(upstream, Begin)
        assert len(begins) == 1
        attaches = router_got(upstream, Attach)
        assert len(attaches) == 1
        assert [i.channel for i in router_got(upstream, Begin, Attach, Transfer, End)] == [0, 0]

    def test_attach_reusing_an_attached_handle(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.open(user="alice")
            c.send(begin(0), attach_sender(0, 0, "public.a", name="first"))
            c.read_until(lambda i: i.name == "Attach")
            c.send(attach_receiver(0, 0, "public.a", name="second"))
            got = c.read_until_closed()
        assert closes(got) == [("amqp:session:handle-in-use", "handle 0 is already attached")]
        assert [str(i.perf.name) for i in router_got(upstream, Attach)] == ["first"]

    def test_attach_reusing_the_handle_of_a_denied_link(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.open(user="alice")
            c.send(begin(0), attach_sender(0, 1, "private.x", name="denied"))
            got = c.read_until(lambda i: i.name == "Detach")
            assert [i.condition for i in got if i.name == "Detach"] == [
                "amqp:unauthorized-access"]
            # without detaching, reuse handle 1 for an allowed address
            c.send(attach_sender(0, 1, "public.a", name="sneaky"))
            got = c.read_until_closed()
        assert closes(got)[0][0] == "amqp:session:handle-in-use"
        assert router_got(upstream, Attach) == []

    @pytest.mark.parametrize("perf", [
        attach_sender(7, 0, "public.a"),
        frame(7, Flow(next_incoming_id=0, incoming_window=10, next_outgoing_id=0,
                      outgoing_window=10, handle=0, delivery_count=0, link_credit=5)),
        transfer(7, 0, 0, data_message(b"smuggled")),
        frame(7, Disposition(role=True, first=0, settled=True)),
        frame(7, Detach(handle=0, closed=True)),
        frame(7, End()),
    ], ids=["attach", "flow", "transfer", "disposition", "detach", "end"])
    def test_frames_on_a_channel_never_begun(self, proxy, upstream, perf):
        with RawClient(proxy.port) as c:
            c.open(user="alice")
            c.send(begin(0), perf)
            got = c.read_until_closed()
        assert [cond for cond, _ in closes(got)] == ["amqp:not-allowed"]
        assert [i.channel for i in router_got(upstream, Attach, Flow, Transfer, Disposition,
                                              Detach, End)] == []

    def test_transfer_on_a_handle_never_attached(self, proxy, upstream):
        with RawClient(proxy.port) as c:
            c.open(user="alice")
            c.send(begin(0), transfer(0, 5, 0, data_message(b"smuggled")))
            got = c.read_until_closed()
        assert [cond for cond, _ in closes(got)] == ["amqp:session:unattached-handle"]
        assert router_got(upstream, Transfer) == []

    def test_sender_limit_holds_across_attach_detach_cycles(self, proxy, upstream):
        # Regression: a client-first Detach used to be counted down twice, so each cycle
        # raised the effective maxSenders by one (fuzz/regressions/connection).
        with RawClient(proxy.port) as c:
            c.open(user="alice")  # maxSenders 2
            c.send(begin(0))
            for n in range(3):
                c.send(attach_sender(0, n, "public.a", name=f"cycle{n}"))
                c.read_until(lambda i: i.name == "Attach")
                c.send(frame(0, Detach(handle=n, closed=True)))
                c.read_until(lambda i: i.name == "Detach")
            c.send(*[attach_sender(0, 10 + n, "public.a", name=f"now{n}") for n in range(3)])
            got = c.read_until(lambda i: i.name == "Detach")
        denied = [i for i in got if i.name == "Detach"]
        assert [i.condition for i in denied] == ["amqp:resource-limit-exceeded"]
        assert len(router_got(upstream, Attach)) == 3 + 2
        assert [str(e.reason) for e in proxy.events_of(LinkDenied)] == ["sender_limit"]


# ---------------------------------------------------------------------------------- addresses


def attach_outcome(port: int, upstream: RawUpstream, *, user: str, vhost: str, role: str,
                   address: str) -> str:
    """Attach one link as ``user``; return "allowed" (the router saw it) or the denial."""
    before = len(upstream.items(Attach))
    with RawClient(port) as c:
        c.open(vhost, user=user)
        link = (attach_sender(0, 0, address) if role == "sender"
                else attach_receiver(0, 0, address))
        c.send(begin(0), link)
        got = c.read_until(lambda i: i.name in ("Detach", "Close")
                           or (i.name == "Attach" and i.perf.handle is not None
                               and getattr(i.perf.target, "address", None) is not None))
    time.sleep(0.05)
    reached = len(upstream.items(Attach)) > before
    refused = [i for i in got if i.name == "Detach"] or [i for i in got if i.name == "Close"]
    if refused:
        assert not reached, f"{address!r} was refused to the client but reached the router"
        return str(refused[0].condition)
    assert reached, names(got)
    return "allowed"


DENIED = "amqp:unauthorized-access"


class TestAddresses:
    @pytest.mark.parametrize("address", [
        "Public.a", "PUBLIC.A", "public.A", "public.a.", "public.a/", "/public.a",
        "public.a ", " public.a", "public.ａ",
    ])
    def test_list_rule_is_exact_case_and_separator_sensitive(self, proxy, upstream, address):
        outcome = attach_outcome(proxy.port, upstream, user="alice", vhost="test",
                                 role="sender", address=address)
        assert outcome == DENIED

    def test_a_nul_in_an_address_is_a_decode_error(self, proxy, upstream):
        # proton's C engine hands the router the address up to the NUL ("public.a"), the
        # proxy would have checked the whole string: an ambiguity, so the connection closes
        outcome = attach_outcome(proxy.port, upstream, user="alice", vhost="test",
                                 role="sender", address="public.a\x00secret")
        assert outcome == "amqp:decode-error"

    def test_the_exact_address_is_allowed(self, proxy, upstream):
        assert attach_outcome(proxy.port, upstream, user="alice", vhost="test",
                              role="sender", address="public.a") == "allowed"

    @pytest.mark.parametrize("address", ["Queue.carol", "queue.Carol", "QUEUE.CAROL",
                                         "queue..carol", "queue.carol.x"])
    def test_pattern_rule_is_case_sensitive(self, proxy, upstream, address):
        # Pattern mode ignores one trailing separator by QDR's definition ("queue.carol." is
        # the same pattern match as "queue.carol", an address of carol's own); everything else
        # that differs is denied.
        assert attach_outcome(proxy.port, upstream, user="carol", vhost="test", role="sender",
                              address=address) == DENIED


# (vhost, user, role, address, expected): user names with wildcard and separator characters
# are substituted literally into ${user} rules, never as wildcards or separators.
USER_PROBES = [
    # pattern mode: targetPattern "queue.${user}, public.#", sourcePattern "${user}.#"
    ("test", "*", "sender", "queue.bob", DENIED),
    ("test", "*", "sender", "queue.*", "allowed"),
    ("test", "*", "receiver", "bob.inbox", DENIED),
    ("test", "*", "receiver", "*.inbox", "allowed"),
    ("test", "#", "sender", "queue.bob", DENIED),
    ("test", "#", "sender", "queue.a.b", DENIED),
    ("test", "#", "receiver", "bob.inbox", DENIED),
    ("test", "#", "receiver", "x", DENIED),
    ("test", "a.b", "sender", "queue.a", DENIED),
    ("test", "a.b", "receiver", "a.inbox", DENIED),
    ("test", "a.b", "receiver", "b.inbox", DENIED),
    ("test", "x/y", "sender", "queue.x", DENIED),
    ("test", "x/y", "receiver", "x.inbox", DENIED),
    ("test", "x/y", "receiver", "y.inbox", DENIED),
    ("test", "public", "sender", "queue.bob", DENIED),
    # list mode: targets "public.a, tmp-${user}*, ${user}.inbox", sources "public.a, ${user}.inbox"
    ("listmode", "a*", "sender", "tmp-abc", DENIED),
    ("listmode", "a*", "sender", "tmp-a", DENIED),
    ("listmode", "a*", "sender", "tmp-a*-mine", "allowed"),
    ("listmode", "*", "sender", "bob.inbox", DENIED),
    ("listmode", "*", "sender", "tmp-x", DENIED),
    ("listmode", "*", "receiver", "*.inbox", "allowed"),
    ("listmode", "#", "receiver", "bob.inbox", DENIED),
    ("listmode", "a.b", "receiver", "a.inbox", DENIED),
    ("listmode", "bob.inbox", "receiver", "bob.inbox.inbox", "allowed"),
    ("listmode", "bob.inbox", "receiver", "bob.inbox", DENIED),
    ("listmode", "x/y", "receiver", "x.inbox", DENIED),
]


@pytest.mark.parametrize(("vhost", "user", "role", "address", "expected"), USER_PROBES,
                         ids=[f"{v}-{u or 'empty'}-{r}-{a}" for v, u, r, a, _ in USER_PROBES])
def test_user_rule_probed_with_wildcard_user_names(proxy, upstream, vhost, user, role, address,
                                                   expected):
    assert attach_outcome(proxy.port, upstream, user=user, vhost=vhost, role=role,
                          address=address) == expected


def test_an_empty_plain_authcid_is_refused_before_the_router(proxy, upstream):
    # RFC 4616: the authcid is one or more characters; an empty one names nobody, so the
    # ${user} rules must never be evaluated for "" (it used to reach the link checks)
    with RawClient(proxy.port) as c:
        c.send(C.SASL_HEADER, sasl_plain_init(""))
        c.read_until_closed(timeout=3)
    assert not [i for i in upstream.items() if isinstance(i.perf, SaslInit)]
    assert [str(e.condition) for e in proxy.events_of(ProtocolViolation)] == [
        "amqp:decode-error"]


def test_every_denied_attach_is_counted(proxy, upstream):
    for address in ("Public.a", "public.a."):
        attach_outcome(proxy.port, upstream, user="alice", vhost="test", role="sender",
                       address=address)
    events: list[Any] = proxy.events_of(LinkDenied)
    assert [(e.role, e.address, str(e.reason)) for e in events] == [
        ("sender", "Public.a", "target"), ("sender", "public.a.", "target")]
