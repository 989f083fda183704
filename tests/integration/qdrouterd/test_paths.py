"""The main end-to-end paths through the proxy in front of a real qdrouterd with no policy of
its own: admission and connection counts, link limits and address rules, message limits
(maxMessageSize, user-id, relay targets) and the topic tree.

The oracle is the router: its management ``QUERY`` of connections and links over the
test-only admin listener, and receivers there that see which messages really arrive.
"""

from __future__ import annotations

import uuid

import pytest
from proton import ConnectionException, LinkException, Message
from proton.utils import BlockingConnection, SendException

from amqp_policy_proxy.core.events import ConnectionDenied, MessageDenied
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread

from .conftest import user

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "maxConnectionsPerUser": 2,
        "topicTree": {
            "model": "nearestAcl", "separator": ".",
            "nodes": {
                "": {"publish": ["*"], "subscribe": ["*"]},
                "hr": {"publish": [user("hr1")], "subscribe": [user("hr1")]},
            },
        },
        "groups": {
            "limited": {"users": f"{user('alice')}, {user('hr1')}", "remoteHosts": "*",
                        "maxSenders": 1, "maxReceivers": 2, "maxMessageSize": 2000,
                        "sources": "orders.*, hr.*", "targets": "orders.*, hr.*",
                        "allowAnonymousSender": True},
            "staff": {"users": user("bob"), "remoteHosts": "*",
                      "sources": "orders.*, hr.*", "targets": "orders.*, hr.*"},
        },
    }],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture(scope="module")
def proxy(router):
    with ProxyThread([router.address], policy=POLICY, kind="qdrouterd") as p:
        yield p


@pytest.fixture
def subscribe(router):
    """``subscribe(address)``: a :class:`~tests.support.qdrouterd.Subscriber` on the router's
    test-only admin listener, past the proxy; closed after the test."""
    made = []

    def make(address: str) -> qdr.Subscriber:
        made.append(qdr.Subscriber(router.admin_url, address))
        return made[-1]

    yield make
    for sub in made:
        sub.close()


def connect(port: int, name: str) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{port}", user=user(name), password="secret",
                              allowed_mechs="PLAIN", timeout=10)


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def router_users(router) -> list[str]:
    return [u for u in router.connection_users() if u]


def test_the_connection_limit_holds_at_the_router(proxy, router):
    before = router_users(router).count(user("bob"))
    held = [connect(proxy.port, "bob"), connect(proxy.port, "bob")]
    try:
        with pytest.raises(ConnectionException):
            connect(proxy.port, "bob").create_sender("orders.x")
        assert router_users(router).count(user("bob")) == before + 2
        assert any(e.reason == "user_limit" for e in proxy.events_of(ConnectionDenied))
    finally:
        for c in held:
            c.close()


def test_max_senders_and_address_rules_hold_at_the_router(proxy, router, subscribe):
    first = unique("orders")
    c = connect(proxy.port, "alice")
    try:
        c.create_sender(first)
        with pytest.raises(LinkException, match="resource-limit-exceeded|limit"):
            c.create_sender(unique("orders"))
        with pytest.raises(LinkException, match="link disallowed by local policy"):
            c.create_receiver("payroll.x")
        attached = [a[2:] for a in router.link_addresses("in")]  # M0orders.x -> orders.x
        assert attached.count(first) == 1 and "payroll.x" not in [
            a[2:] for a in router.link_addresses("out")]
    finally:
        c.close()


def test_an_oversize_message_never_reaches_the_router(proxy, subscribe):
    queue = unique("orders")
    rcv = subscribe(queue)
    c = connect(proxy.port, "alice")
    snd = c.create_sender(queue)
    snd.send(Message(body="before"))
    with pytest.raises((SendException, ConnectionException, LinkException)):
        snd.send(Message(body=b"x" * 5000))
        c.create_sender(unique("orders"))
    c.close()
    assert rcv.bodies() == ["before"]
    assert [e.reason for e in proxy.events_of(MessageDenied)][-1:] == ["message_size"]


def test_a_forged_user_id_never_reaches_the_router(proxy, subscribe):
    queue = unique("orders")
    rcv = subscribe(queue)
    c = connect(proxy.port, "alice")
    snd = c.create_sender(queue)
    snd.send(Message(body="mine", user_id=user("alice").encode()))
    with pytest.raises(SendException):
        snd.send(Message(body="forged", user_id=user("bob").encode()))
    snd.send(Message(body="after"))  # the link goes on
    c.close()
    assert rcv.bodies() == ["mine", "after"]


def test_relay_targets_are_checked_on_every_message(proxy, subscribe):
    allowed, secret = unique("orders"), unique("payroll")
    on_allowed = subscribe(allowed)
    on_secret = subscribe(secret)
    c = connect(proxy.port, "alice")
    snd = c.create_sender(None)
    snd.send(Message(address=allowed, body="ok"))
    with pytest.raises(SendException):
        snd.send(Message(address=secret, body="no"))
    c.close()
    assert on_allowed.bodies() == ["ok"]
    assert on_secret.bodies(quiet=0.2) == []


def test_the_topic_tree_decides_who_publishes_under_hr(proxy, router, subscribe):
    topic = unique("hr")
    rcv = subscribe(topic)
    record = qdr.RouterRecord(router)
    bob = connect(proxy.port, "bob")
    with pytest.raises(LinkException, match="unauthorized|disallowed"):
        bob.create_sender(topic)
    with pytest.raises(LinkException, match="unauthorized|disallowed"):
        bob.create_receiver(topic)
    bob.close()
    hr1 = connect(proxy.port, "hr1")
    hr1.create_sender(topic).send(Message(body="salary"))
    hr1.close()
    assert rcv.bodies() == ["salary"]
    try:
        # the router attached hr1's sender only: bob's two Attaches never reached it
        assert [x.address for x in record.attaches()].count(topic) == 1
    finally:
        record.close()
