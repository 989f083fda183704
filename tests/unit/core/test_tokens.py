"""Token connections in the core (docs/oauth2.md): the proxy completing SASL with a token
client and logging in to the router with its service identity (``token_authority =
"proxy"``), the relayed exchange checked by the proxy too (``upstream``), every refusal, the
JWKS refresh an unknown kid waits for, and the close at the token's ``exp``."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.performatives import (
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    SaslResponse,
)
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    SaslFailed,
    TokenRefused,
)
from amqp_policy_proxy.core.state import R_LOGIN
from amqp_policy_proxy.core.tokenauth import ServiceLogin, TokenAuth
from amqp_policy_proxy.tokens.config import TokenAuthConfig
from amqp_policy_proxy.tokens.jwks import JwksCache
from tests.support.issuer import AUDIENCE, ISSUER, Issuer

from .helpers import Close, Open, Script, frame, make_policy

#: The wall clock at the loop clock's 0 (the token's times are wall-clock).
WALL = 1_796_083_200.0
POLICY = make_policy({
    "senders": {"users": "nobody", "remoteHosts": "*", "targets": "*"},
    "$default": {"remoteHosts": "*", "sources": "*", "targets": "*"},
}, allowUnknownUser=True)
SERVICE = ServiceLogin("PLAIN", "svc", b"service-secret")


def config(**changes: Any) -> TokenAuthConfig:
    """``[token_auth]`` for the local issuer: scopes ``amqp-proxy.*`` give groups of ``test``."""
    base: dict[str, Any] = {
        "issuer": ISSUER, "audience": AUDIENCE, "jwks_file": "jwks.json",
        "scope_prefix": "amqp-proxy.",
        "groups": [{"vhost": "test", "group": "senders", "scopes": ["send"]}]}
    return TokenAuthConfig.model_validate(base | changes)


@pytest.fixture
def issuer() -> Issuer:
    return Issuer()


def cache(issuer: Issuer, cfg: TokenAuthConfig | None = None, at: float = 0.0) -> JwksCache:
    """A JWKS cache that fetched the issuer's keys at loop time ``at``."""
    jwks = JwksCache.from_config(cfg or config())
    jwks.fetch_started(at)
    jwks.fetched(issuer.jwks(), at)
    return jwks


def script(issuer: Issuer, authority: str = "proxy", *, keys: JwksCache | None = None,
           cfg: TokenAuthConfig | None = None, policy: Any = POLICY) -> Script:
    cfg = cfg or config()
    auth = TokenAuth(cfg, authority, keys or cache(issuer, cfg))
    return Script(policy, tokens=auth, wall_offset=WALL)


def sasl(perf: Any) -> bytes:
    return frame(0, perf, ftype=1)


def plain(token: str, user: str = "") -> bytes:
    return sasl(SaslInit(mechanism="PLAIN",
                         initial_response=b"\0" + user.encode() + b"\0" + token.encode()))


def bearer(token: str, authzid: str = "") -> bytes:
    gs2 = f"n,{'a=' + authzid if authzid else ''},".encode()
    response = gs2 + b"\x01host=localhost\x01auth=Bearer " + token.encode() + b"\x01\x01"
    return sasl(SaslInit(mechanism="OAUTHBEARER", initial_response=response))


ROUTER_GREETING = C.SASL_HEADER + sasl(SaslMechanisms(
    sasl_server_mechanisms=symbol_array(["ANONYMOUS", "PLAIN"])))


def outcome(frames: list[Any]) -> int | None:
    codes = [perf.code for _, perf, _ in frames if isinstance(perf, SaslOutcome)]
    return codes[-1] if codes else None


def login(s: Script) -> None:
    """The router's side of the proxy's login: greeting, outcome ok, AMQP header."""
    s._run(s.conn.router_connected(s.now, login=SERVICE))
    s.router(ROUTER_GREETING)
    s.router(sasl(SaslOutcome(code=0)))


def refusals(s: Script) -> list[tuple[str, str]]:
    return [(e.mechanism, e.reason) for e in s.events if isinstance(e, TokenRefused)]


class TestProxyAuthority:
    def test_the_proxy_answers_the_client_and_logs_in_to_the_router_itself(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER)
        assert s.connect_requested
        greeting = s.take(Side.CLIENT)
        assert greeting[0] == (-1, C.SASL_HEADER, b"")
        mechs = greeting[1][1].sasl_server_mechanisms
        assert [str(m) for m in mechs] == ["OAUTHBEARER", "PLAIN"]
        s.client(plain(issuer.token(now=WALL)))
        assert outcome(s.take(Side.CLIENT)) == 0
        s._run(s.conn.router_connected(s.now, login=SERVICE))
        # the proxy's own login, pipelined: SASL header, its sasl-init, AMQP header
        sent = s.take(Side.ROUTER)
        assert [p if i < 0 else type(p).__name__ for i, p, _ in sent] == [
            C.SASL_HEADER, "SaslInit", C.AMQP_HEADER]
        assert str(sent[1][1].mechanism) == "PLAIN"
        assert sent[1][1].initial_response == b"\0svc\0service-secret"
        s.router(ROUTER_GREETING)
        assert s.conn.sides.router is R_LOGIN
        assert s.take(Side.ROUTER) == [] and s.take(Side.CLIENT) == []  # nothing relayed
        s.router(sasl(SaslOutcome(code=0)))
        assert s.take(Side.ROUTER) == []
        s.client(C.AMQP_HEADER)
        assert s.take(Side.CLIENT) == [(-1, C.AMQP_HEADER, b"")]  # the proxy's answer
        s.client(frame(0, Open(container_id="client", hostname="test")))
        opened = s.take(Side.ROUTER)
        assert [type(p).__name__ for _, p, _ in opened] == ["Open"]
        s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
        assert [type(p).__name__ for _, p, _ in s.take(Side.CLIENT)] == ["Open"]
        approved = [e for e in s.events if isinstance(e, ConnectionApproved)]
        assert [(e.user, e.group) for e in approved] == [("alice", "senders")]

    def test_an_open_waits_for_the_proxys_login(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL)) + C.AMQP_HEADER[:0])
        s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
        s._run(s.conn.router_connected(s.now, login=SERVICE))
        s.router(ROUTER_GREETING)
        s.take(Side.ROUTER)
        assert not s.conn.view.decided
        s.router(sasl(SaslOutcome(code=0)))
        names = [p if idx < 0 else type(p).__name__ for idx, p, _ in s.take(Side.ROUTER)]
        assert names == ["Open"]

    def test_groups_come_from_the_token_scopes_else_from_the_policy(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL, sub="bob", scope="openid")))
        login(s)
        s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
        approved = [e for e in s.events if isinstance(e, ConnectionApproved)]
        assert [(e.user, e.group) for e in approved] == [("bob", "$default")]

    def test_oauthbearer_is_accepted(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + bearer(issuer.token(now=WALL), authzid="alice"))
        assert outcome(s.take(Side.CLIENT)) == 0
        assert s.conn.sasl_user == "alice"

    @pytest.mark.parametrize(("changes", "reason"), [
        ({"exp": int(WALL) - 3600}, "expired"),
        ({"nbf": int(WALL) + 3600}, "not_yet_valid"),
        ({"aud": "someone-else"}, "bad_audience"),
        ({"iss": "https://evil.test"}, "bad_issuer"),
        ({"exp": None}, "missing_claim"),
    ])
    def test_a_refused_token_gets_outcome_auth_with_its_reason(self, issuer, changes, reason):
        s = script(issuer)
        s.client(C.SASL_HEADER)
        s.take(Side.CLIENT)
        s.client(plain(issuer.token(now=WALL, **changes)))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert {Side.CLIENT, Side.ROUTER} <= s.closed
        assert refusals(s) == [("PLAIN", reason)]
        failed = [e for e in s.events if isinstance(e, SaslFailed)]
        assert [(e.reason, e.code, e.user) for e in failed] == [(reason, 1, None)]
        assert not [e for e in s.events if isinstance(e, ConnectionDenied)]

    @pytest.mark.parametrize(("make", "reason"), [
        (lambda i: i.unsigned(now=WALL), "algorithm_not_allowed"),
        (lambda i: i.hs256_with_public_key(now=WALL), "algorithm_not_allowed"),
        (lambda i: i.token(now=WALL)[:-6] + "AAAAAA", "bad_signature"),
        (lambda i: "x" * 9000, "oversized"),
        (lambda i: "not-a-jwt", "malformed"),
    ])
    def test_forged_and_broken_tokens_are_refused(self, issuer, make, reason):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(make(issuer)))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert refusals(s) == [("PLAIN", reason)]

    def test_a_user_name_other_than_the_identity_is_refused(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL), user="admin"))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert refusals(s) == [("PLAIN", "username_mismatch")]

    def test_a_mechanism_without_a_token_is_refused(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + sasl(SaslInit(mechanism="ANONYMOUS")))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert refusals(s) == [("ANONYMOUS", "no_token")]

    def test_a_client_without_sasl_gets_the_sasl_header_and_is_closed(self, issuer):
        s = script(issuer)
        s.client(C.AMQP_HEADER)
        assert bytes(s.sent[Side.CLIENT]) == C.SASL_HEADER
        assert Side.CLIENT in s.closed and not s.connect_requested
        assert refusals(s) == [("", "no_token")]

    def test_a_refused_oauthbearer_token_gets_the_error_challenge_first(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER)
        s.take(Side.CLIENT)
        s.client(bearer(issuer.token(now=WALL, aud="other")))
        sent = s.take(Side.CLIENT)
        assert [type(p).__name__ for _, p, _ in sent] == ["SaslChallenge"]
        assert sent[0][1].challenge == b'{"status":"invalid_token"}'
        assert Side.CLIENT not in s.closed
        s.client(sasl(SaslResponse(response=b"\x01")))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert Side.CLIENT in s.closed
        assert refusals(s) == [("OAUTHBEARER", "bad_audience")]

    def test_an_unanswered_error_challenge_ends_after_the_linger(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + bearer(issuer.token(now=WALL, aud="other")))
        s.timer(5.0)
        assert Side.CLIENT in s.closed

    def test_an_unknown_kid_waits_for_the_jwks_refresh_it_asks_for(self, issuer):
        cfg = config(jwks_min_refresh_seconds=30)
        keys = cache(issuer, cfg, at=-100.0)
        s = script(issuer, keys=keys, cfg=cfg)
        issuer.add_rsa("rsa-2")
        s.client(C.SASL_HEADER)
        s.take(Side.CLIENT)
        s.client(plain(issuer.token("rsa-2", now=WALL)) + C.AMQP_HEADER)
        assert s.conn.view.token_waiting and keys.due(0.0)
        assert s.take(Side.CLIENT) == []
        issuer.published.append("rsa-2")  # the rotation reaches the JWKS
        keys.fetch_started(0.0)
        keys.fetched(issuer.jwks(), 0.1)
        s._run(s.conn.keys_changed(0.1))
        sent = s.take(Side.CLIENT)
        assert outcome(sent) == 0 and sent[-1] == (-1, C.AMQP_HEADER, b"")

    def test_an_unknown_kid_is_refused_once_the_refresh_did_not_bring_it(self, issuer):
        keys = cache(issuer, at=-100.0)
        s = script(issuer, keys=keys)
        issuer.add_rsa("rsa-3")
        s.client(C.SASL_HEADER + plain(issuer.token("rsa-3", now=WALL)))
        assert s.conn.view.token_waiting
        keys.fetch_started(0.0)
        keys.fetched(issuer.jwks(), 0.1)  # still without rsa-3
        s._run(s.conn.keys_changed(0.1))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert refusals(s) == [("PLAIN", "unknown_kid")]

    def test_unknown_kids_within_the_refresh_interval_are_refused_at_once(self, issuer):
        s = script(issuer)  # fetched at 0: no early refresh for 30 s
        issuer.add_rsa("rsa-4")
        s.client(C.SASL_HEADER + plain(issuer.token("rsa-4", now=WALL)))
        assert not s.conn.view.token_waiting
        assert refusals(s) == [("PLAIN", "unknown_kid")]

    def test_the_connection_closes_when_its_token_expires(self, issuer):
        s = script(issuer, cfg=config(expiry_grace_seconds=2))
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL, exp=int(WALL) + 60)))
        login(s)
        s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
        s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
        s.take(Side.CLIENT)
        assert s.conn.get_timer() == 62.0
        assert s.timer(61.9) == []
        s.timer(62.0)
        closes = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Close)]
        assert [(str(c.error.condition), c.error.description) for c in closes] == [
            ("amqp:unauthorized-access", "token expired")]
        s.client(frame(0, Close()))
        s._run(s.conn.connection_lost(Side.CLIENT, 62.1))
        closed = [e for e in s.events if isinstance(e, ConnectionClosed)]
        assert [(e.close_reason, e.user) for e in closed] == [("token_expired", "alice")]

    def test_a_router_refusing_the_service_identity_admits_nobody(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL)))
        s._run(s.conn.router_connected(s.now, login=SERVICE))
        s.router(ROUTER_GREETING)
        s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
        s.take(Side.CLIENT)
        s.router(sasl(SaslOutcome(code=1)))
        closes = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Close)]
        assert [str(c.error.condition) for c in closes] == ["amqp:connection:forced"]
        denied = [e.reason for e in s.events if isinstance(e, ConnectionDenied)]
        assert [str(r) for r in denied] == ["upstream_unavailable"]
        assert not [e for e in s.events if isinstance(e, ConnectionApproved)]

    def test_a_router_without_the_service_mechanism_admits_nobody(self, issuer):
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL)))
        s._run(s.conn.router_connected(s.now, login=ServiceLogin("EXTERNAL")))
        s.router(ROUTER_GREETING)
        assert Side.ROUTER in s.closed
        s.client(C.AMQP_HEADER)
        sent = [p if i < 0 else type(p).__name__ for i, p, _ in s.take(Side.CLIENT)]
        assert sent[-2:] == ["Open", "Close"]


class TestUpstreamAuthority:
    def test_the_exchange_is_relayed_and_the_token_identity_is_the_user(self, issuer):
        s = script(issuer, "upstream")
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connected(s.now))
        s.router(ROUTER_GREETING)
        assert s.take(Side.CLIENT)[0] == (-1, C.SASL_HEADER, b"")  # the router's, relayed
        init = plain(issuer.token(now=WALL))
        s.take(Side.ROUTER)
        s.client(init)
        assert bytes(s.sent[Side.ROUTER]) == init  # relayed as it came
        s.router(sasl(SaslOutcome(code=0)))
        s.client(C.AMQP_HEADER)
        s.router(C.AMQP_HEADER)
        s.client(frame(0, Open(container_id="client", hostname="test")))
        approved = [e for e in s.events if isinstance(e, ConnectionApproved)]
        assert [(e.user, e.group) for e in approved] == [("alice", "senders")]

    def test_a_token_the_proxy_refuses_never_reaches_the_router(self, issuer):
        s = script(issuer, "upstream")
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connected(s.now))
        s.router(ROUTER_GREETING)
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        s.client(plain(issuer.token(now=WALL, exp=int(WALL) - 100)))
        assert s.take(Side.ROUTER) == []
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        assert refusals(s) == [("PLAIN", "expired")]
        assert {Side.CLIENT, Side.ROUTER} <= s.closed

    def test_the_router_refusing_a_token_the_proxy_accepted_admits_nobody(self, issuer):
        s = script(issuer, "upstream")
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connected(s.now))
        s.router(ROUTER_GREETING)
        s.client(plain(issuer.token(now=WALL)))
        s.router(sasl(SaslOutcome(code=1)))
        assert outcome(s.take(Side.CLIENT)) == C.SaslCode.AUTH
        failed = [e.reason for e in s.events if isinstance(e, SaslFailed)]
        assert failed == ["auth"] and refusals(s) == []

    def test_the_routers_own_challenge_is_relayed(self, issuer):
        s = script(issuer, "upstream")
        s.client(C.SASL_HEADER)
        s._run(s.conn.router_connected(s.now))
        s.router(ROUTER_GREETING)
        s.client(bearer(issuer.token(now=WALL)))
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        s.router(sasl(SaslChallenge(challenge=b'{"status":"invalid_token"}')))
        assert [type(p).__name__ for _, p, _ in s.take(Side.CLIENT)] == ["SaslChallenge"]
        s.client(sasl(SaslResponse(response=b"\x01")))
        assert [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)] == ["SaslResponse"]


def test_connections_without_tokens_are_unchanged():
    """No ``tokens``: SASL is relayed as before (the existing suite covers the rest)."""
    s = Script(POLICY)
    s.open(user="alice")
    assert s.conn.user == "alice" and s.conn.token is None


class TestReload:
    """A reload re-checks a token connection under its token's groups, not its user name."""

    def admitted(self, issuer: Issuer) -> Script:
        s = script(issuer)
        s.client(C.SASL_HEADER + plain(issuer.token(now=WALL)))
        login(s)
        s.client(C.AMQP_HEADER + frame(0, Open(container_id="client", hostname="test")))
        s.router(C.AMQP_HEADER + frame(0, Open(container_id="router")))
        s.take(Side.CLIENT)
        return s

    def test_a_policy_that_keeps_the_tokens_group_keeps_the_connection(self, issuer):
        s = self.admitted(issuer)
        s._run(s.conn.reevaluate(POLICY, 10.0))
        assert s.take(Side.CLIENT) == []
        assert s.conn.group is not None and s.conn.group.name == "senders"

    def test_a_policy_without_the_tokens_group_revokes_it(self, issuer):
        s = self.admitted(issuer)
        narrower = make_policy({"$default": {"remoteHosts": "*"}}, allowUnknownUser=False)
        s._run(s.conn.reevaluate(narrower, 10.0))
        closes = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Close)]
        assert [c.error.description for c in closes] == ["connection disallowed by local policy"]
