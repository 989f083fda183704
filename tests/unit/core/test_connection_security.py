"""Transcript tests: what the router receives is exactly what the proxy decided on (issue 14),
and nobody is admitted when no upstream can authenticate (issue 15 point 1).

Every hostile frame comes from :mod:`tests.support.hostile`; the integration tests send the same
bytes through a real proxy to a real proton peer.
"""

from __future__ import annotations

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.performatives import SaslInit, SaslMechanisms, SaslOutcome
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionDenied,
    MessageDenied,
    ProtocolViolation,
)
from amqp_policy_proxy.core.state import ClientState
from tests.support import hostile

from .helpers import Open, Script, frame, make_policy

GROUPS = {
    "admins": {"users": "admin", "remoteHosts": "*", "sources": "*", "targets": "*",
               "allowAnonymousSender": True, "allowDynamicSource": True},
    "users": {"users": "alice, mallory", "remoteHosts": "*", "maxConnectionsPerUser": 2,
              "sources": "public.*", "targets": "public.*", "allowAnonymousSender": True,
              "maxMessageSize": 1000},
}
POLICY = make_policy(GROUPS)
MECHS = SaslMechanisms(sasl_server_mechanisms=symbol_array(["PLAIN", "ANONYMOUS"]))


def router_greets(s: Script) -> None:
    s.client(C.SASL_HEADER)
    s._run(s.conn.router_connected(s.now))
    s.router(C.SASL_HEADER + frame(0, MECHS, ftype=1))
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)


def outcomes(frames) -> list[int]:
    return [int(p.code) for _, p, _ in frames if isinstance(p, SaslOutcome)]


def violations(s: Script) -> list[tuple[str, str]]:
    return [(e.condition, e.description) for e in s.events if isinstance(e, ProtocolViolation)]


def admitted_as(user: str) -> Script:
    s = Script(POLICY)
    s.open(user=user)
    s.take(Side.CLIENT)
    s.take(Side.ROUTER)
    return s


class TestIdentity:
    """Finding 1: the policy identity is the authenticated one, never a client-chosen one."""

    def test_a_foreign_authzid_is_refused_with_auth_before_the_router_sees_it(self):
        s = Script(POLICY)
        router_greets(s)
        s.client(hostile.plain_init("mallory", "her-own-password", authzid="admin"))
        assert s.take(Side.ROUTER) == []  # the sasl-init never reaches the router
        assert outcomes(s.take(Side.CLIENT)) == [C.SaslCode.AUTH]
        assert s.closed == {Side.CLIENT, Side.ROUTER}
        denied = [e for e in s.events if isinstance(e, ConnectionDenied)]
        assert [(str(e.reason), e.user) for e in denied] == [("authzid", "mallory")]
        assert not any(isinstance(e, ConnectionApproved) for e in s.events)

    def test_an_authzid_equal_to_the_authcid_is_the_same_identity(self):
        s = Script(POLICY)
        router_greets(s)
        s.client(hostile.plain_init("alice", "pw", authzid="alice"))
        assert len(s.take(Side.ROUTER)) == 1
        s.router(frame(0, SaslOutcome(code=0), ftype=1))
        s.client(C.AMQP_HEADER)
        s.router(C.AMQP_HEADER)
        s.client(frame(0, Open(container_id="c", hostname="test")))
        assert s.conn.user == "alice" and s.conn.group.name == "users"

    def test_scram_a_equal_to_another_user_is_refused(self):
        s = Script(POLICY)
        router_greets(s)
        s.client(frame(0, SaslInit(mechanism="SCRAM-SHA-256",
                                   initial_response=b"n,a=admin,n=mallory,r=abc"), ftype=1))
        assert s.take(Side.ROUTER) == []
        assert outcomes(s.take(Side.CLIENT)) == [C.SaslCode.AUTH]

    def test_external_identity_is_the_certificate_the_proxy_verified(self):
        s = Script(POLICY)
        s.conn.tls_subject = "CN=alice"
        router_greets(s)
        s.client(frame(0, SaslInit(mechanism="EXTERNAL", initial_response=b"admin"), ftype=1))
        assert s.take(Side.ROUTER) == []
        assert outcomes(s.take(Side.CLIENT)) == [C.SaslCode.AUTH]

    def test_per_user_limits_count_the_authenticated_user(self):
        # six connections of one account: with authzids they are refused, without them the
        # second connection beyond maxConnectionsPerUser 2 is denied
        ledger = None
        results = []
        for n in range(3):
            s = Script(POLICY, ledger=ledger, conn_id=f"c{n}")
            ledger = s.ledger
            s.open(user="mallory")
            results.append(s.conn.view.client_state)
        assert results == [ClientState.OPENED, ClientState.OPENED, ClientState.DENIED]


class TestCanonicalSasl:
    def test_finding_2_sasl_init_count_beyond_size_is_a_decode_error(self):
        s = Script(POLICY)
        router_greets(s)
        s.client(hostile.sasl_init_count_exceeds_size("admin", "mallory", "pw"))
        assert s.take(Side.ROUTER) == []
        assert s.closed == {Side.CLIENT, Side.ROUTER}
        assert violations(s)[0][0] == "amqp:decode-error"
        assert s.conn.user is None

    def test_finding_10_deep_nesting_is_a_decode_error_not_a_recursion_error(self):
        s = Script(POLICY)
        router_greets(s)
        s.client(hostile.sasl_init_deeply_nested(2000))
        assert [c for c, _ in violations(s)] == ["amqp:decode-error"]
        assert s.take(Side.ROUTER) == []


class TestCanonicalAttach:
    def attach(self, data: bytes, user: str = "alice") -> Script:
        s = admitted_as(user)
        s.begin(0, router_channel=0)
        s.take(Side.ROUTER)
        s.client(data)
        return s

    def assert_refused(self, s: Script) -> None:
        assert s.take(Side.ROUTER)[-1:] != [] and all(
            type(p).__name__ != "Attach" for _, p, _ in s.take(Side.ROUTER))
        assert violations(s) and violations(s)[0][0] == "amqp:decode-error"

    def test_finding_3_shadow_attach(self):
        s = self.attach(hostile.shadow_attach(0, 0, shown="public.d", hidden="secret.f3d"))
        assert violations(s)[0][0] == "amqp:decode-error"
        assert "Attach" not in [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)]

    def test_finding_4_attach_count_beyond_size(self):
        s = self.attach(hostile.attach_count_exceeds_size(0, 0, shown="public.a"))
        assert violations(s)[0] == ("amqp:decode-error", "attach: list count and size disagree")
        assert "Attach" not in [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)]

    def test_finding_6_unknown_target_descriptor(self):
        s = self.attach(hostile.attach_unknown_target_descriptor(0, 0, "secret.x"))
        assert violations(s)[0][0] == "amqp:decode-error"
        assert "descriptor" in violations(s)[0][1]

    def test_finding_6_ubyte_dynamic(self):
        s = self.attach(hostile.attach_ubyte_dynamic(0, 0, "secret.x"))
        assert violations(s)[0] == ("amqp:decode-error",
                                    "source field 4 is not a boolean (constructor 0x50)")

    def test_finding_6_ubyte_role(self):
        s = self.attach(hostile.attach_ubyte_role(0, 0, "public.a"))
        assert violations(s)[0] == ("amqp:decode-error",
                                    "attach field 2 is not a boolean (constructor 0x50)")


class TestCanonicalTransfer:
    def sender(self) -> Script:
        s = admitted_as("alice")
        s.begin(0, router_channel=0)
        s.client(hostile.amqp_frame(0, hostile.described(0x12, hostile.list32(
            hostile.attach_fields("s", 0, role=b"\x42", source_=hostile.source(None),
                                  target_=hostile.target("public.a")), 7))))
        s.take(Side.ROUTER)
        return s

    def test_finding_7_hidden_more_is_a_decode_error(self):
        s = self.sender()
        s.client(hostile.transfer_hidden_more(0, 0, 0, b"\x00\x53\x75\xa0\x01x"))
        assert violations(s)[0][0] == "amqp:decode-error"
        assert "Transfer" not in [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)]

    def test_a_canonical_transfer_passes(self):
        s = self.sender()
        s.client(hostile.transfer(0, 0, 0, b"\x00\x53\x75\xa0\x01x"))
        assert [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)] == ["Transfer"]


class TestCanonicalMessages:
    def relay(self) -> Script:
        s = admitted_as("alice")
        s.begin(0, router_channel=0)
        s.client(hostile.amqp_frame(0, hostile.described(0x12, hostile.list32(
            hostile.attach_fields("relay", 0, role=b"\x42", source_=hostile.source(None),
                                  target_=hostile.target(None)), 7))))
        s.take(Side.ROUTER)
        return s

    def test_finding_5_described_message_id(self):
        s = self.relay()
        s.client(hostile.transfer(0, 0, 0, hostile.message_described_message_id(
            "public.ok", "secret.x")))
        assert violations(s)[0][0] == "amqp:decode-error"
        assert "Transfer" not in [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)]

    def test_finding_5_properties_count_beyond_size(self):
        s = self.relay()
        s.client(hostile.transfer(0, 0, 0, hostile.message_properties_count_exceeds_size(
            "secret.x")))
        assert violations(s)[0][0] == "amqp:decode-error"
        assert "Transfer" not in [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)]

    def test_finding_8_router_annotations_are_refused(self):
        s = self.relay()
        s.client(hostile.transfer(0, 0, 0, hostile.message_router_annotation(
            "public.ok", "secret.x")))
        denied = [e for e in s.events if isinstance(e, MessageDenied)]
        assert [str(e.reason) for e in denied] == ["router_annotations"]
        frames = s.take(Side.ROUTER)
        assert all(not getattr(p, "more", False) for _, p, _ in frames)
        # the router gets no payload of it (an aborted, payload-less stand-in at most)
        assert all(payload == b"" for _, _, payload in frames)

    def test_finding_8_allow_router_annotations_lets_them_through(self):
        """``allowRouterAnnotations: true`` (an extension) is the operator's explicit trust:
        the annotated relay message reaches the router whole."""
        groups = {**GROUPS, "users": {**GROUPS["users"], "allowRouterAnnotations": True}}
        s = Script(make_policy(groups))
        s.open(user="alice")
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        s.begin(0, router_channel=0)
        s.client(hostile.amqp_frame(0, hostile.described(0x12, hostile.list32(
            hostile.attach_fields("relay", 0, role=b"\x42", source_=hostile.source(None),
                                  target_=hostile.target(None)), 7))))
        s.take(Side.ROUTER)
        message = hostile.message_router_annotation("public.ok", "secret.x")
        s.client(hostile.transfer(0, 0, 0, message))
        assert not [e for e in s.events if isinstance(e, MessageDenied)]
        assert [payload for _, _, payload in s.take(Side.ROUTER)] == [message]

    def test_a_canonical_relay_message_passes(self):
        s = self.relay()
        s.client(hostile.transfer(0, 0, 0, hostile.message_to("public.ok")))
        frames = s.take(Side.ROUTER)
        assert [type(p).__name__ for _, p, _ in frames] == ["Transfer"]
        assert frames[0][2]


class TestRouterDown:
    """Issue 15 point 1: with no upstream, nobody is authenticated and nobody is admitted."""

    def test_sasl_client_gets_sys_temp_never_ok(self):
        s = Script(POLICY)
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connect_failed(s.now))
        greeting = s.take(Side.CLIENT)
        assert greeting[0] == (-1, C.SASL_HEADER, b"")
        assert isinstance(greeting[1][1], SaslMechanisms)
        s.client(hostile.plain_init("alice", "wrong password"))
        assert outcomes(s.take(Side.CLIENT)) == [C.SaslCode.SYS_TEMP]
        assert Side.CLIENT in s.closed
        assert s.conn.view.client_state is ClientState.STOPPED  # answered: nothing more is read
        reasons = [str(e.reason) for e in s.events if isinstance(e, ConnectionDenied)]
        assert reasons == ["upstream_unavailable"]
        assert not any(isinstance(e, ConnectionApproved) for e in s.events)
        assert s.ledger.active() == 0

    def test_router_greeting_already_relayed_is_not_repeated(self):
        s = Script(POLICY)
        router_greets(s)
        s._run(s.conn.connection_lost(Side.ROUTER, s.now))  # gone before any outcome
        assert s.take(Side.CLIENT) == []
        s.client(hostile.plain_init("alice", "pw"))
        assert outcomes(s.take(Side.CLIENT)) == [C.SaslCode.SYS_TEMP]

    def test_pipelined_sasl_init_is_answered_sys_temp(self):
        s = Script(POLICY)
        s.client(C.SASL_HEADER + hostile.plain_init("alice", "pw"))
        s._run(s.conn.router_connect_failed(s.now))
        frames = s.take(Side.CLIENT)
        assert outcomes(frames) == [C.SaslCode.SYS_TEMP]
        assert "Open" not in [type(p).__name__ for _, p, _ in frames]

    def test_client_without_sasl_gets_open_close_forced_without_admission(self):
        s = Script(POLICY)
        s.client(C.AMQP_HEADER)
        s._run(s.conn.router_connect_failed(s.now))
        s.client(frame(0, Open(container_id="c", hostname="test")))
        frames = s.take(Side.CLIENT)
        closes = [(str(p.error.condition), p.error.description) for _, p, _ in frames
                  if type(p).__name__ == "Close"]
        assert closes == [("amqp:connection:forced", "no upstream available")]
        assert s.ledger.active() == 0
        assert not any(isinstance(e, ConnectionApproved) for e in s.events)
