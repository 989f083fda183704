"""OAuth 2.0 tokens with ``token_authority = "upstream"``: the SASL exchange is relayed to a
broker that checks the token itself, the proxy checks the same token first and admits only
when both accept it.

Two brokers stand in for "a broker that validates tokens":

* the in-tree broker (proton with Cyrus), which knows no tokens: its sasldb holds the one
  token it is to accept as the password of the token's identity, so it accepts exactly that
  token (and messages flow end to end);
* RabbitMQ 3.10 from Debian with its ``rabbitmq_auth_backend_oauth2`` plugin, which checks the
  signature and the audience at SASL time itself. Its AMQP 1.0 plugin (3.10) then fails every
  session of an OAuth 2.0 user (``auth_failure "Refused"`` when the session's internal
  connection is made), so only the SASL exchange and the Open are exercised there.

The proxy's verdict and the broker's differ on purpose in each refusal test, to show which of
the two refused.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.core.events import ConnectionApproved, SaslFailed, TokenRefused
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, UpstreamConfig
from amqp_policy_proxy.demo.broker import Broker
from amqp_policy_proxy.demo.sasl import make_sasl_config
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from amqp_policy_proxy.tokens.config import TokenAuthConfig
from tests.support.issuer import AUDIENCE, ISSUER, Issuer
from tests.support.proxy import ProxyThread

pytestmark = pytest.mark.integration

USER = "token-user"
POLICY = compile_policy([(None, [
    ["vhost", {"hostname": "$default", "allowUnknownUser": False,
               "groups": {"tokens": {"remoteHosts": "*", "sources": "*", "targets": "*"}}}],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture(scope="module")
def issuer():
    return Issuer()


def jwks_file(issuer: Issuer) -> str:
    directory = Path(tempfile.mkdtemp(prefix="jwks-"))
    os.chmod(directory, 0o755)
    path = directory / "jwks.json"
    path.write_bytes(issuer.jwks())
    os.chmod(path, 0o644)
    return str(path)


def token_config(path: str, **changes) -> TokenAuthConfig:
    base = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": path,
            "token_authority": "upstream",
            "groups": [{"vhost": "$default", "group": "tokens", "scopes": ["openid"]}]}
    return TokenAuthConfig.model_validate(base | changes)


def proxy_for(address: tuple[str, int], auth: TokenAuthConfig, kind: str = "other"):
    config = DaemonConfig(
        upstreams=(UpstreamConfig(Address(*address), kind=kind, token_authority="upstream"),),
        token_auth=auth)
    return ProxyThread([], policy=POLICY, config=config)


def connect(port: int, token: str, user: str = USER, **kwargs) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{port}", user=user, password=token,
                              allowed_mechs="PLAIN", allow_insecure_mechs=True, timeout=10,
                              **kwargs)


def wait_for(pred, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


class TestInTreeBroker:
    @pytest.fixture(scope="class")
    def accepted(self, issuer):
        """The token the broker's sasldb holds as the password of its identity."""
        return issuer.token(sub=USER, exp=int(time.time()) + 3600)

    @pytest.fixture(scope="class")
    def broker(self, accepted, tmp_path_factory):
        sasl = make_sasl_config(tmp_path_factory.mktemp("token-sasl"), {USER: accepted})
        b = Broker(sasl=sasl).start()
        yield b
        b.stop()

    @pytest.fixture
    def proxy(self, broker, issuer):
        with proxy_for(broker.address, token_config(jwks_file(issuer))) as p:
            yield p

    def test_a_token_both_accept_is_relayed_and_admitted(self, proxy, accepted):
        conn = connect(proxy.port, accepted)
        try:
            receiver = conn.create_receiver("orders")
            conn.create_sender("orders").send(Message(body="relayed token"))
            assert receiver.receive(timeout=10).body == "relayed token"
        finally:
            conn.close()
        assert [(e.user, e.group) for e in proxy.events_of(ConnectionApproved)] == [
            (USER, "tokens")]

    def test_a_token_only_the_proxy_accepts_is_refused_by_the_broker(self, proxy, issuer):
        other = issuer.token(sub=USER, jti="another")  # valid, but not the broker's
        with pytest.raises(ConnectionException, match="Authentication failed"):
            connect(proxy.port, other).close()
        assert wait_for(lambda: [e.reason for e in proxy.events_of(SaslFailed)] == ["auth"])
        assert proxy.events_of(TokenRefused) == []  # the broker refused it, not the proxy

    def test_a_token_the_proxy_refuses_never_reaches_the_broker(self, issuer, tmp_path):
        # another user: the process's brokers share one sasldb (demo/sasl.py)
        expired = issuer.token(sub="token-user-2", exp=int(time.time()) - 600)
        sasl = make_sasl_config(tmp_path / "sasl", {"token-user-2": expired})
        broker = Broker(sasl=sasl).start()  # this broker would accept it
        try:
            with proxy_for(broker.address, token_config(jwks_file(issuer))) as proxy:
                with pytest.raises(ConnectionException, match="Authentication failed"):
                    connect(proxy.port, expired, user="token-user-2").close()
                assert wait_for(lambda: [e.reason for e in proxy.events_of(TokenRefused)]
                                == ["expired"])
                assert [e.reason for e in proxy.events_of(SaslFailed)] == ["expired"]
        finally:
            broker.stop()


@pytest.fixture(scope="module")
def rabbitmq_oauth2(issuer):
    """RabbitMQ 3.10 (Debian) with rabbitmq_auth_backend_oauth2 trusting the issuer's rsa-1."""
    rabbit = pytest.importorskip("tests.support.rabbitmq")
    reason = rabbit.RabbitMQ.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    import glob

    if not glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/"
                     "rabbitmq_auth_backend_oauth2-*"):
        pytest.skip("the Debian RabbitMQ has no rabbitmq_auth_backend_oauth2 plugin")
    from tests.support.ports import free_port

    directory = Path(tempfile.mkdtemp(prefix="rabbit-keys-"))
    os.chmod(directory, 0o755)
    pem = directory / "rsa-1.pem"
    pem.write_bytes(issuer.keys["rsa-1"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    os.chmod(pem, 0o644)
    port = free_port("127.0.0.1")
    node = rabbit.RabbitMQ(port=port, plugins=("rabbitmq_amqp1_0",
                                               "rabbitmq_auth_backend_oauth2"), config=f"""\
listeners.tcp.1 = 127.0.0.1:{port}
auth_backends.1 = rabbit_auth_backend_oauth2
auth_oauth2.resource_server_id = {AUDIENCE}
auth_oauth2.default_key = rsa-1
auth_oauth2.signing_keys.rsa-1 = {pem}
amqp1_0.default_vhost = /
""")
    node.start(timeout=180)
    yield node
    node.stop()


@pytest.mark.rabbitmq
@pytest.mark.slow
class TestRabbitMQOAuth2:
    SCOPES = "amqp-proxy.configure:*/* amqp-proxy.write:*/* amqp-proxy.read:*/* openid"

    @pytest.fixture
    def proxy(self, rabbitmq_oauth2, issuer):
        # the proxy also accepts the audience "proxy-only", which RabbitMQ does not
        auth = token_config(jwks_file(issuer), audience=[AUDIENCE, "proxy-only"])
        with proxy_for((rabbitmq_oauth2.host, rabbitmq_oauth2.port), auth,
                       kind="rabbitmq") as p:
            yield p

    def test_a_token_both_accept_opens_the_connection(self, proxy, issuer):
        conn = connect(proxy.port, issuer.token(sub=USER, scope=self.SCOPES))
        conn.close()
        assert [(e.user, e.group) for e in proxy.events_of(ConnectionApproved)] == [
            (USER, "tokens")]

    def test_rabbitmq_refusing_a_token_the_proxy_accepts_admits_nobody(self, proxy, issuer):
        with pytest.raises(ConnectionException, match="Authentication failed"):
            connect(proxy.port, issuer.token(sub=USER, aud="proxy-only",
                                             scope=self.SCOPES)).close()
        assert wait_for(lambda: [e.reason for e in proxy.events_of(SaslFailed)] == ["auth"])
        assert proxy.events_of(TokenRefused) == [] and not proxy.events_of(ConnectionApproved)

    def test_the_proxy_refuses_a_token_rabbitmq_would_accept(self, proxy, issuer):
        # RabbitMQ 3.10 does not check iss; the proxy does, and the sasl-init stops there
        with pytest.raises(ConnectionException, match="Authentication failed"):
            connect(proxy.port, issuer.token(sub=USER, iss="https://elsewhere.test",
                                             scope=self.SCOPES)).close()
        assert wait_for(lambda: [e.reason for e in proxy.events_of(TokenRefused)]
                        == ["bad_issuer"])
