"""The proxy in front of a real qdrouterd: the main path works end to end.

A stock proton client logs in through the proxy with its realm name (SASL relayed to the
router's sasldb), is admitted by the proxy's policy, and a message sent to an allowed address
arrives at a receiver of the same address; the router records the same user the proxy decided
on.
"""

from __future__ import annotations

import pytest
from proton import ConnectionException, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.proxy import ProxyThread

from .conftest import user

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "groups": {
            "members": {"users": f"{user('alice')}, {user('bob')}", "remoteHosts": "*",
                        "sources": "smoke.*", "targets": "smoke.*"},
        },
    }],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture
def proxy(router):
    with ProxyThread([router.address], policy=POLICY) as p:
        yield p


def connect(proxy, name: str, password: str = "secret") -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{proxy.port}", user=user(name),
                              password=password, allowed_mechs="PLAIN", timeout=10)


def test_message_flows_through_the_proxy_to_the_real_router(proxy, router):
    conn = connect(proxy, "alice")
    try:
        receiver = conn.create_receiver("smoke.a")
        sender = conn.create_sender("smoke.a", options=AtMostOnce())
        sender.send(Message(body="hello"))
        assert receiver.receive(timeout=10).body == "hello"
        assert user("alice") in router.connection_users()
        assert sorted(router.link_addresses()) == ["M0smoke.a", "M0smoke.a"]
    finally:
        conn.close()


def test_unknown_user_is_denied_before_the_router_sees_an_open(proxy, router):
    with pytest.raises(ConnectionException, match="connection disallowed by local policy"):
        connect(proxy, "carol").create_sender("smoke.a")
