"""policy/naming: addresses and identities as each upstream resolves them (decision 0007).

The qdrouterd cases are pinned against the real router by
``tests/integration/qdrouterd/test_oracle.py``; RabbitMQ's by ``test_rabbitmq_e2e.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_policy_proxy.policy.addresses import AddressRules
from amqp_policy_proxy.policy.decisions import node_allowed
from amqp_policy_proxy.policy.naming import Naming, Node, qdr_view, rabbit_node, strict_node


@pytest.mark.parametrize(("address", "view"), [
    ("public.x:/secret.a", "secret.a"),
    ("public.x://h/secret.c", "secret.c"),
    ("amqp://127.0.0.1:5672/q", "q"),
    ("//host/q", "q"),
    ("/q", "q"),
    ("/a:/b", "a:/b"),      # one step only
    ("a::/b", "a::/b"),     # the character after ':' is not looked at again
    (":/x", ":/x"),         # the first character is never a colon trigger
    ("q.", "q"), ("q/", "q"), ("q..", "q."),  # one trailing separator
    ("//h", "//h"), ("a:/", "a:"), ("", ""),
])
def test_qdr_view(address, view):
    assert qdr_view(address) == view


@pytest.mark.parametrize("address", ["$management", "public.x:/$management", "_local/x",
                                     "_topo/0/R/$management", "_edge/x", "/_local/x"])
def test_router_internal_nodes(address):
    node = Naming("qdrouterd").resolve(address)
    assert node is not None and node.internal


@pytest.mark.parametrize("kind", ["qdrouterd", "other"])
@pytest.mark.parametrize("address", ["$SYS/broker/uptime", "$cbs", "$management.x"])
def test_every_dollar_name_is_internal(kind, address):
    node = Naming(kind).resolve(address)
    assert node is not None and node.internal
    assert not node_allowed(AddressRules.from_list(["*"]), node, "u")


@pytest.mark.parametrize(("address", "allowed"), [
    ("$SYS", True), ("$SYS/broker/uptime", True), ("$SYS.x", True),
    ("$SYSTEM", False), ("$management", False), ("$other/x", False),
])
def test_a_declared_dollar_tree_is_granted_like_any_address(address, allowed):
    node = Naming("qdrouterd").resolve(address)
    assert node_allowed(AddressRules.from_list(["*"]), node, "u", ("$SYS",)) is allowed


def test_a_topic_trees_system_prefixes_are_declared_but_never_management():
    from amqp_policy_proxy.policy.compile import compile_policy
    from amqp_policy_proxy.policy.model import PolicySettings

    tree = {"model": "nearestAcl", "separator": "/", "systemPrefixes": ["$SYS", "$management"],
            "nodes": {"": {"publish": ["*"], "subscribe": ["*"]}}}
    policy = compile_policy([("p.json", [["vhost", {
        "hostname": "v", "topicTree": tree,
        "groups": {"g": {"users": "u", "remoteHosts": "*", "targets": "*"}}}]])],
        PolicySettings())
    assert policy.vhosts["v"].groups["g"].declared_prefixes == ("$SYS",)


def test_internal_nodes_need_a_literal_grant():
    node = Naming("qdrouterd").resolve("$management")
    assert not node_allowed(AddressRules.from_list(["*"]), node, "u")
    assert not node_allowed(AddressRules.from_list(["$*"]), node, "u")
    assert not node_allowed(AddressRules.from_patterns(["#"]), node, "u")
    assert node_allowed(AddressRules.from_list(["$management"]), node, "u")
    assert node_allowed(AddressRules.from_patterns(["$management"]), node, "u")
    assert not node_allowed(AddressRules.from_list(["*"]), None, "u")


@pytest.mark.parametrize(("address", "node"), [
    ("orders", Node("/queue/orders")),
    ("/queue/orders", Node("/queue/orders")),
    ("/amq/queue/orders", Node("/queue/orders")),
    ("/reply-queue/a/b", Node("/queue/a/b")),
    ("/queue/a%2Fb", Node("/queue/a/b")),
    ("/topic/hr.*", Node("/topic/hr.*", False, "hr.*")),
    ("/exchange/amq.topic/hr.salary", Node("/topic/hr.salary", False, "hr.salary")),
    ("/exchange/x/key", Node("/exchange/x/key")),
    ("/exchange/x", Node("/exchange/x/", by_subject=True)),
    ("/exchange/x/", Node("/exchange/x/", by_subject=True)),
    ("/queue", Node("/queue", by_subject=True)),
    ("/queues/a%2Eb", Node("/queue/a.b")),
    ("/exchanges/amq.topic/k", Node("/topic/k", False, "k")),
    ("/queue//x", None), ("/temp-queue/x", None), ("/queues/a%2Fb", None),
    ("/queues/%zz", None), ("/exchange/x/k/more", None), ("", None), ("a\nb", None),
    ("/management", Node("/management", internal=True)),
    ("/management/", None), ("/Management", None),
])
def test_rabbit_node(address, node):
    assert rabbit_node(address) == node


def test_rabbitmqs_management_node_needs_a_literal_grant():
    node = Naming("rabbitmq").resolve("/management")
    assert not node_allowed(AddressRules.from_list(["*"]), node, "u")
    assert node_allowed(AddressRules.from_list(["*", "/management"]), node, "u")


def test_subject_routing():
    naming = Naming("rabbitmq")
    topic = naming.resolve("/exchange/amq.topic/")
    assert naming.with_subject(topic, "hr.salary") == Node("/topic/hr.salary", False, "hr.salary")
    assert naming.with_subject(naming.resolve("/queue"), "q") == Node("/queue/q")
    assert naming.with_subject(naming.resolve("/queue"), None) is None


@pytest.mark.parametrize("address", ["a:/b", "/a", "_a", "a//b", "a.", "a/", "", "a\x01"])
def test_strict_refuses_what_is_not_its_own_canonical_form(address):
    assert strict_node(address) is None


@given(st.text(max_size=40))
def test_resolution_is_total_and_strict_is_the_identity(address):
    for kind in ("qdrouterd", "rabbitmq", "other"):
        Naming(kind).resolve(address)  # never raises
    node = strict_node(address)
    assert node is None or node.name == address


@pytest.mark.parametrize(("name", "strict", "canonical"), [
    ("alice@R", "alice@R", "alice@R"),
    (" alice@R", None, "alice@R"),
    ("alice@R\t", None, "alice@R"),
    ("\v alice@R\f\r\n", None, "alice@R"),
    ("al\x01ice", None, None),
    ("   ", None, None),
    ("alice\u00a0", "alice\u00a0", "alice\u00a0"),  # not C whitespace: Cyrus keeps it
])
def test_cyrus_identities(name, strict, canonical):
    assert Naming("qdrouterd").identity(name) == strict
    assert Naming("qdrouterd", identity_mode="canonical").identity(name) == canonical


def test_realm_and_rabbitmq_identities():
    assert Naming("qdrouterd", realm="R").identity("alice") == "alice@R"
    assert Naming("qdrouterd", realm="R").identity("alice@X") == "alice@X"
    assert Naming("rabbitmq").identity(" guest") == " guest"  # compared exactly there
    assert Naming("rabbitmq").identity("guest\n") is None


@given(st.text(max_size=30))
def test_strict_identity_takes_the_name_or_refuses_it(name):
    got = Naming("qdrouterd").identity(name)
    assert got is None or got == name
