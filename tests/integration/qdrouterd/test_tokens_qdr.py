"""OAuth 2.0 tokens in front of the real qdrouterd (``token_authority = "proxy"``).

A local issuer (keys made here, tokens signed with PyJWT) publishes its JWKS on a local HTTP
server; the proxy fetches it, validates the token a stock proton client gives as its SASL
PLAIN password, completes SASL with the client itself and logs in to qdrouterd with its
service identity from the router's sasldb. The router sees the proxy's service user; the
proxy's policy decides on the token's identity. Refusals with their reasons, the close at the
token's ``exp`` and a JWKS rotation go through the real proxy and router.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from proton import ConnectionException, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection, LinkDetached

from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionClosed, TokenRefused
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, UpstreamConfig
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from amqp_policy_proxy.tokens.config import TokenAuthConfig
from tests.support import qdrouterd as qdr
from tests.support.issuer import AUDIENCE, ISSUER, Issuer, jwks_server
from tests.support.proxy import ProxyThread

SERVICE = "proxy-svc"
SERVICE_PASSWORD = "svc-secret-1"

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "groups": {
            "senders": {"remoteHosts": "*", "sources": "tok.*", "targets": "tok.*"},
            "readers": {"remoteHosts": "*", "sources": "tok.*"},
        },
    }],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture(scope="module")
def token_router():
    """A qdrouterd whose sasldb holds only the proxy's service user."""
    reason = qdr.unavailable_reason()
    if reason is not None:
        pytest.skip(f"real-router tier: {reason}")
    r = qdr.Qdrouterd({SERVICE: SERVICE_PASSWORD}, mechs=("PLAIN",)).start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def issuer():
    return Issuer()


@pytest.fixture(scope="module")
def jwks(issuer):
    with jwks_server(issuer) as server:
        yield server


def token_config(jwks_url: str, **changes) -> TokenAuthConfig:
    base = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": jwks_url,
            "jwks_min_refresh_seconds": 0.2, "jwks_retry_seconds": 0.2,
            "jwks_max_retry_seconds": 1.0, "clock_skew_seconds": 0,
            "scope_prefix": "amqp-proxy.", "token_authority": "proxy",
            "groups": [{"vhost": "$default", "group": "senders", "scopes": ["send"]},
                       {"vhost": "$default", "group": "readers", "scopes": ["receive"]}]}
    return TokenAuthConfig.model_validate(base | changes)


def make_proxy(router, jwks, tmp_path: Path, **changes) -> ProxyThread:
    """A proxy with token_authority "proxy" in front of ``router`` (``changes``: to
    [token_auth])."""
    secret = tmp_path / "service-password"
    secret.write_text(SERVICE_PASSWORD + "\n")
    config = DaemonConfig(
        upstreams=(UpstreamConfig(Address(*router.address), kind="qdrouterd",
                                  token_authority="proxy",
                                  service_username=f"{SERVICE}@{qdr.REALM}",
                                  service_password_file=str(secret)),),
        token_auth=token_config(jwks.url, **changes))
    return ProxyThread([], policy=POLICY, config=config, metrics=True)


@pytest.fixture
def proxy(token_router, jwks, tmp_path: Path):
    with make_proxy(token_router, jwks, tmp_path) as p:
        yield p


def connect(proxy, token: str, user: str = "alice") -> BlockingConnection:
    """A stock proton client: SASL PLAIN, the token as the password (proton needs a user
    name for PLAIN: the token's identity)."""
    return BlockingConnection(f"amqp://127.0.0.1:{proxy.port}", user=user, password=token,
                              allowed_mechs="PLAIN", allow_insecure_mechs=True, timeout=10)


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def test_a_token_client_reaches_the_router_under_the_proxys_service_identity(
        proxy, token_router, issuer):
    conn = connect(proxy, issuer.token())
    try:
        receiver = conn.create_receiver("tok.a")
        sender = conn.create_sender("tok.a", options=AtMostOnce())
        sender.send(Message(body="with a token"))
        assert receiver.receive(timeout=10).body == "with a token"
        # the router authenticated the proxy; the proxy decided on the token's identity
        assert f"{SERVICE}@{qdr.REALM}" in token_router.connection_users()
        approved = proxy.events_of(ConnectionApproved)
        assert [(e.user, e.group) for e in approved] == [("alice", "senders")]
    finally:
        conn.close()


def test_the_token_groups_apply_to_links(proxy, issuer):
    conn = connect(proxy, issuer.token(sub="reader", scope="amqp-proxy.receive"),
                   user="reader")
    try:
        conn.create_receiver("tok.b")
        with pytest.raises(LinkDetached) as info:
            conn.create_sender("tok.b")
        assert "amqp:unauthorized-access" in str(info.value)
    finally:
        conn.close()


@pytest.mark.parametrize(("make", "reason"), [
    (lambda i: i.token(exp=int(time.time()) - 60), "expired"),
    (lambda i: i.token(aud="another-service"), "bad_audience"),
    (lambda i: i.token(iss="https://evil.test"), "bad_issuer"),
    (lambda i: i.unsigned(), "algorithm_not_allowed"),
    (lambda i: i.hs256_with_public_key(), "algorithm_not_allowed"),
    (lambda i: i.token(headers={"kid": "nobody-has-this"}), "unknown_kid"),
    (lambda i: i.token()[:-8] + "AAAAAAAA", "bad_signature"),
])
def test_refused_tokens_get_sasl_auth_with_their_reason(proxy, issuer, make, reason):
    with pytest.raises(ConnectionException, match="Authentication failed|unauthorized"):
        connect(proxy, make(issuer)).close()
    assert wait_for(lambda: [e.reason for e in proxy.events_of(TokenRefused)] == [reason])
    assert not proxy.events_of(ConnectionApproved)


def test_a_user_name_other_than_the_identity_is_refused(proxy, issuer):
    with pytest.raises(ConnectionException):
        connect(proxy, issuer.token(), user="admin").close()
    assert wait_for(lambda: [e.reason for e in proxy.events_of(TokenRefused)]
                    == ["username_mismatch"])


def test_expiry_closes_a_live_connection_within_a_second(proxy, issuer):
    exp = int(time.time()) + 3
    conn = connect(proxy, issuer.token(exp=exp))
    receiver = conn.create_receiver("tok.expiry")
    closed_at = None
    try:
        while time.time() < exp + 5:
            try:
                receiver.receive(timeout=0.05)
            except ConnectionException as exc:
                closed_at = time.time()
                assert "token expired" in str(exc) or "unauthorized" in str(exc), exc
                break
            except Exception as exc:  # the receive timeout: still open
                if "Timeout" not in type(exc).__name__:
                    closed_at = time.time()
                    break
    finally:
        try:
            conn.close()
        except Exception:
            pass
    assert closed_at is not None, "the connection outlived its token"
    assert exp <= closed_at < exp + 1.0, closed_at - exp
    assert wait_for(lambda: [e.close_reason for e in proxy.events_of(ConnectionClosed)]
                    == ["token_expired"])


def test_a_rotated_key_is_fetched_on_its_first_token(proxy, issuer, jwks):
    time.sleep(0.3)  # past jwks_min_refresh_seconds since the proxy's first fetch
    before = jwks.fetches
    issuer.add_rsa("rsa-rotated")
    issuer.published.append("rsa-rotated")
    try:
        conn = connect(proxy, issuer.token("rsa-rotated"))
        conn.create_receiver("tok.rotated")
        conn.close()
        assert jwks.fetches > before
        assert [e.user for e in proxy.events_of(ConnectionApproved)] == ["alice"]
    finally:
        issuer.published.remove("rsa-rotated")


def test_an_unknown_kid_within_the_refresh_interval_is_refused_at_once(
        token_router, issuer, jwks, tmp_path):
    issuer.add_rsa("rsa-too-soon")
    try:
        with make_proxy(token_router, jwks, tmp_path, jwks_min_refresh_seconds=60) as proxy:
            issuer.published.append("rsa-too-soon")  # after the proxy's first fetch
            before = jwks.fetches
            with pytest.raises(ConnectionException):
                connect(proxy, issuer.token("rsa-too-soon")).close()
            assert wait_for(lambda: [e.reason for e in proxy.events_of(TokenRefused)]
                            == ["unknown_kid"])
            assert jwks.fetches == before  # no fetch for it within the minimum interval
    finally:
        issuer.published.remove("rsa-too-soon")


def test_cached_keys_serve_while_the_jwks_url_is_down(proxy, issuer, jwks):
    jwks.down = True
    try:
        time.sleep(0.3)
        conn = connect(proxy, issuer.token())
        conn.create_receiver("tok.down")
        conn.close()
    finally:
        jwks.down = False


def test_rejections_and_the_jwks_are_on_the_metrics_endpoint(proxy, issuer, jwks):
    from tests.integration.test_observability_e2e import scrape

    with pytest.raises(ConnectionException):
        connect(proxy, issuer.token(exp=int(time.time()) - 60)).close()
    assert wait_for(lambda: proxy.events_of(TokenRefused))
    samples, _ = scrape(proxy)
    assert samples[("amqp_proxy_token_rejections_total", (("reason", "expired"),))] == 1
    source = (("source", jwks.url),)
    assert samples[("amqp_proxy_jwks_usable", source)] == 1
    assert samples[("amqp_proxy_jwks_keys", source)] == 2
    assert 0 <= samples[("amqp_proxy_jwks_age_seconds", source)] < 60
    assert ("amqp_proxy_jwks_fetch_failures_total", source) in samples
