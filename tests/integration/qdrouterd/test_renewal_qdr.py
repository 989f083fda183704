"""In-band token renewal in front of the real qdrouterd (``token_authority = "proxy"``,
docs/oauth2.md "Renewal"): a stock proton client renews its token on the live connection
with CBS ``put-token`` on ``$cbs`` and with RabbitMQ 4.1's ``PUT /auth/tokens`` on
``/management``; the proxy answers both itself and the router never sees those links (its
log and its management agent say so). A renewal keeps the connection open past the first
token's ``exp``; a narrower one detaches exactly the link it no longer allows while another
goes on sending; a token for another subject or with an earlier ``exp`` is refused (401) and
changes nothing.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from proton import ConnectionException, Endpoint, Message, Timeout, timestamp
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection, LinkDetached

from amqp_policy_proxy.core.events import ConnectionClosed, TokenRenewed
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, UpstreamConfig
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread

from . import test_tokens_qdr as base
from .test_tokens_qdr import SERVICE, SERVICE_PASSWORD, connect, token_config, wait_for

# the token tests' module fixtures: the router with the service user, the issuer, its JWKS
token_router = base.token_router
issuer = base.issuer
jwks = base.jwks

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "groups": {
            "wide": {"remoteHosts": "*", "sources": "ren.*", "targets": "ren.*"},
            "narrow": {"remoteHosts": "*", "sources": "ren.*", "targets": "ren.a"},
        },
    }],
])], PolicySettings(default_vhost="$default"))
GROUPS = [{"vhost": "$default", "group": "wide", "scopes": ["send"]},
          {"vhost": "$default", "group": "narrow", "scopes": ["narrow"]}]


@pytest.fixture
def proxy(token_router, jwks, tmp_path: Path):
    secret = tmp_path / "service-password"
    secret.write_text(SERVICE_PASSWORD + "\n")
    config = DaemonConfig(
        upstreams=(UpstreamConfig(Address(*token_router.address), kind="qdrouterd",
                                  token_authority="proxy",
                                  service_username=f"{SERVICE}@{qdr.REALM}",
                                  service_password_file=str(secret)),),
        token_auth=token_config(jwks.url, groups=GROUPS))
    with ProxyThread([], policy=POLICY, config=config, metrics=True) as p:
        yield p


class Renewer:
    """The client's side of a renewal link pair (attached first on the connection's one
    session, as the Azure clients attach ``$cbs``)."""

    def __init__(self, conn: BlockingConnection, node: str) -> None:
        self.node = node
        self.sender = conn.create_sender(node)
        self.receiver = conn.create_receiver(node)

    def renew(self, token: str) -> Message:
        """Send one renewal request with ``token``; the reply."""
        mid = str(uuid.uuid4())
        if self.node == "$cbs":
            request = Message(id=mid, reply_to="cbs", body=token, properties={
                "operation": "put-token", "type": "jwt", "name": "amqp://localhost/",
                "expiration": timestamp(int((time.time() + 3600) * 1000))})
        else:
            request = Message(id=mid, address="/auth/tokens", subject="PUT", reply_to="$me",
                              body=token.encode())
        self.sender.send(request, timeout=10)  # settled (accepted) by the proxy
        reply = self.receiver.receive(timeout=10)  # sent settled: nothing to accept
        assert reply.correlation_id == mid
        return reply


def status(reply: Message, node: str) -> int:
    if node == "$cbs":
        return int(reply.properties["status-code"])
    return int(reply.subject)


def assert_router_never_saw_them(router: qdr.Qdrouterd) -> None:
    log = router.log_text()
    assert "$cbs" not in log and "/management" not in log
    addresses = router.link_addresses()
    assert addresses and not [a for a in addresses if "cbs" in a or "management" in a]


@pytest.mark.parametrize(("node", "accepted"), [("$cbs", 202), ("/management", 204)])
def test_a_renewal_keeps_the_connection_open_past_the_first_exp(
        proxy, token_router, issuer, node, accepted):
    exp = int(time.time()) + 3
    conn = connect(proxy, issuer.token(exp=exp))
    try:
        renewer = Renewer(conn, node)
        receiver = conn.create_receiver("ren.a", credit=10)
        sender = conn.create_sender("ren.a", options=AtMostOnce())
        reply = renewer.renew(issuer.token(exp=exp + 60))
        assert status(reply, node) == accepted
        while time.time() < exp + 1.5:  # past the first token's exp (and within a second)
            time.sleep(0.1)
        sender.send(Message(body="after the first exp"), timeout=10)
        assert receiver.receive(timeout=10).body == "after the first exp"
        assert_router_never_saw_them(token_router)
    finally:
        conn.close()
    assert wait_for(lambda: [e.close_reason for e in proxy.events_of(ConnectionClosed)]
                    == ["client_close"])
    assert [(e.node, e.result) for e in proxy.events_of(TokenRenewed)] == [(node, "accepted")]
    from tests.integration.test_observability_e2e import scrape

    samples, _ = scrape(proxy)
    assert samples[("amqp_proxy_token_renewals_total",
                    (("reason", ""), ("result", "accepted")))] == 1


def test_a_narrower_renewal_detaches_exactly_the_links_it_no_longer_allows(
        proxy, token_router, issuer):
    conn = connect(proxy, issuer.token(exp=int(time.time()) + 60))
    try:
        renewer = Renewer(conn, "$cbs")
        receiver = conn.create_receiver("ren.a", credit=10)
        to_a = conn.create_sender("ren.a", options=AtMostOnce())
        to_b = conn.create_sender("ren.b", options=AtMostOnce())
        narrower = issuer.token(exp=int(time.time()) + 120, scope="amqp-proxy.narrow")
        reply = None
        detached = None
        try:  # the Detach may come in while the client waits for the reply
            reply = renewer.renew(narrower)
        except LinkDetached as exc:
            detached = exc
        if detached is None:
            # The Detach may have come in with the reply, in one read: the link's state says
            # so, but its event waits to be dispatched (that is when proton raises). Waiting
            # for the local close that the dispatch makes raises it here.
            try:
                conn.wait(lambda: not to_b.link.state & Endpoint.LOCAL_ACTIVE, timeout=5)
            except LinkDetached as exc:
                detached = exc
        if reply is None:
            reply = renewer.receiver.receive(timeout=10)
        assert status(reply, "$cbs") == 202
        assert detached is not None and "to ren.b" in str(detached)
        assert "amqp:unauthorized-access" in str(detached)
        assert not to_a.link.state & Endpoint.REMOTE_CLOSED
        for i in range(3):  # ren.a goes on
            to_a.send(Message(body=f"a{i}"), timeout=10)
            assert receiver.receive(timeout=10).body == f"a{i}"
    finally:
        conn.close()


@pytest.mark.parametrize("change", ["subject", "earlier"])
def test_a_worse_token_is_refused_and_changes_nothing(proxy, token_router, issuer, change):
    exp = int(time.time()) + 4
    conn = connect(proxy, issuer.token(exp=exp))
    try:
        renewer = Renewer(conn, "$cbs")
        worse = (issuer.token(sub="mallory", exp=exp + 60) if change == "subject"
                 else issuer.token(exp=exp - 2))
        reply = renewer.renew(worse)
        assert status(reply, "$cbs") == 401
        assert reply.properties["status-description"]
        receiver = conn.create_receiver("ren.a", credit=10)
        closed = False
        while time.time() < exp + 3 and not closed:
            try:
                receiver.receive(timeout=0.1)
            except Timeout:
                continue
            except (ConnectionException, LinkDetached):
                closed = True  # at the unchanged exp
        assert closed, "the connection outlived its unrenewed token"
    finally:
        try:
            conn.close()
        except Exception:
            pass
    assert wait_for(lambda: [e.close_reason for e in proxy.events_of(ConnectionClosed)]
                    == ["token_expired"])
    reasons = {"subject": "subject_changed", "earlier": "not_newer"}
    assert [(e.result, e.reason) for e in proxy.events_of(TokenRenewed)] == [
        ("refused", reasons[change])]
