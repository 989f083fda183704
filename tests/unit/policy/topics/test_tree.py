"""policy/topics/tree.py: the worked examples of IBM MQ and WebSphere Message Broker, on AMQP
addresses (issue 8, models 1 and 2)."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.policy.topics import TopicAuthorizer

from .helpers import OPEN, authorizer, policy, who

# ---------------------------------------------------------------------------- IBM MQ

MQ_NODES = {
    "SEC": {"publish": ["admin"]},
    "SEC/GOOD": {"subscribe": ["usr1"]},
    "SEC/COMB/GOOD": {"subscribe": ["usr2"]},
}


def mq(wildcards: str = "mqtt") -> TopicAuthorizer:
    pol = policy({"hostname": "mq", "topicTree": {
        "model": "anyAncestor", "wildcards": wildcards, "nodes": MQ_NODES},
        "groups": {"apps": {"users": "*", **OPEN}}})
    return authorizer(pol, "mq", "apps")


def sub(auth: TopicAuthorizer, user: str, address: str) -> bool:
    return auth.check_subscribe(who(user, "apps"), address, qos=1, wall_now=0.0).allowed


def test_mq_usr1_may_subscribe_to_sec_good_but_not_sec_comb_good() -> None:
    auth = mq()
    decision = auth.check_subscribe(who("usr1", "apps"), "SEC/GOOD", qos=1, wall_now=0.0)
    assert decision.allowed and decision.model == "topicTree"
    assert decision.decided_by == "topicTree(anyAncestor) node 'SEC/GOOD' grants subscribe to usr1"
    denied = auth.check_subscribe(who("usr1", "apps"), "SEC/COMB/GOOD", qos=1, wall_now=0.0)
    assert not denied.allowed and denied.model == "topicTree"
    assert denied.decided_by == (
        "topicTree(anyAncestor): no node from 'SEC/COMB/GOOD' up to the root grants subscribe "
        "to usr1 (nodes defining subscribe: 'SEC/COMB/GOOD')")


def test_mq_usr2_inherits_below_sec_comb_good() -> None:
    auth = mq()
    decision = auth.check_subscribe(who("usr2", "apps"), "SEC/COMB/GOOD/BAD", qos=1, wall_now=0)
    assert decision.allowed
    assert "node 'SEC/COMB/GOOD' grants subscribe to usr2" in decision.decided_by
    assert sub(auth, "usr2", "SEC/COMB/GOOD")
    assert not sub(auth, "usr2", "SEC/GOOD")


def test_mq_neither_user_may_subscribe_to_sec_comb_bad() -> None:
    auth = mq()
    assert not sub(auth, "usr1", "SEC/COMB/BAD")
    assert not sub(auth, "usr2", "SEC/COMB/BAD")
    assert auth.check_subscribe(who("usr1", "apps"), "SEC/COMB/BAD", qos=1,
                                wall_now=0).decided_by.endswith(
        "(no node on the path defines subscribe)")


def test_mq_a_new_node_inherits() -> None:
    auth = mq()
    assert sub(auth, "usr1", "SEC/GOOD/NEW")
    assert not sub(auth, "usr2", "SEC/GOOD/NEW")


@pytest.mark.parametrize(("wildcards", "subscription"), [
    ("amqp", "SEC/COMB/*/GOOD"), ("mqtt", "SEC/COMB/+/GOOD"), ("mqtt", "SEC/COMB/#")])
def test_mq_wildcard_subscription_is_checked_at_its_fully_qualified_prefix(
        wildcards: str, subscription: str) -> None:
    auth = mq(wildcards)
    # SEC/COMB grants nothing, so usr2 may not subscribe although SEC/COMB/GOOD grants usr2.
    decision = auth.check_subscribe(who("usr2", "apps"), subscription, qos=1, wall_now=0)
    assert not decision.allowed and not decision.per_delivery
    assert decision.decided_by.startswith(
        f"subscription '{subscription}' is checked at its fully qualified prefix 'SEC/COMB': ")
    # A wildcard below a node that grants is allowed.
    good = subscription.replace("SEC/COMB", "SEC/GOOD")
    assert sub(auth, "usr1", good)


def test_mq_persistent_is_not_an_authority_and_durable_is_never_stripped() -> None:
    auth = mq()
    decision = auth.check_subscribe(who("usr1", "apps"), "SEC/GOOD", qos=1, wall_now=0)
    assert decision.strip_durable is False and decision.per_delivery is False
    assert auth.check_delivery(who("usr1", "apps"), "SEC/GOOD", "SEC/GOOD", wall_now=0) == (
        type(auth.check_delivery(who("x", "apps"), "a", "a", wall_now=0))(
            True, False, "topicTree(anyAncestor) has no per-delivery check"))


def test_mq_publish_and_negative_entry_only_stops_its_own_node() -> None:
    pol = policy({"hostname": "mq", "topicTree": {"model": "anyAncestor", "nodes": {
        "": {"publish": ["@ops"]},
        "SEC": {"publish": ["*", "!mallory", "!trudy"]}}},
        "groups": {"ops": {"users": "mallory", **OPEN}, "apps": {"users": "*", **OPEN}}})
    apps, ops = authorizer(pol, "mq", "apps"), authorizer(pol, "mq", "ops")
    assert apps.check_publish(who("eve", "apps"), "SEC/X", qos=1, wall_now=0).allowed
    denied = apps.check_publish(who("trudy", "apps"), "SEC/X", qos=1, wall_now=0)
    assert not denied.allowed
    assert denied.decided_by == (
        "topicTree(anyAncestor): no node from 'SEC/X' up to the root grants publish to trudy "
        "(nodes defining publish: 'SEC', '' (root)); node 'SEC' excludes trudy ('!trudy')")
    # MQ authorities are cumulative: the root still grants mallory through @ops.
    decision = ops.check_publish(who("mallory", "ops"), "SEC/X", qos=1, wall_now=0)
    assert decision.allowed
    assert decision.decided_by == ("topicTree(anyAncestor) node '' (root) grants publish to "
                                   "mallory via '@ops'")
    # '@ops' also matches a user listed in ops' users, whatever group the principal names.
    assert apps.check_publish(who("mallory", "apps"), "SEC/X", qos=1, wall_now=0).allowed
    assert not apps.check_publish(who("eve", "apps"), "OTHER", qos=1, wall_now=0).allowed


# ---------------------------------------------------------------------------- WMB

WMB = {
    "hostname": "broker",
    "topicTree": {
        "model": "nearestAcl",
        "systemPrefixes": ["$SYS"],
        "nodes": {
            "A": {"publish": ["joe"], "subscribe": ["*"], "persistent": []},
            "A/K/M/N": {"publish": ["mary", "joe"], "persistent": ["*", "!nat"]},
            "A/B": {"publish": ["allen", "joe"], "subscribe": ["@HR"]},
        },
    },
    "groups": {"HR": {"users": "hank", **OPEN}, "staff": {"users": "*", **OPEN}},
}


@pytest.fixture(scope="module")
def wmb() -> dict[str, TopicAuthorizer]:
    pol = policy(WMB)
    return {g: authorizer(pol, "broker", g) for g in ("HR", "staff")}


def group_of(user: str) -> str:
    return "HR" if user == "hank" else "staff"


def publish(wmb: dict[str, TopicAuthorizer], user: str, address: str) -> bool:
    g = group_of(user)
    return wmb[g].check_publish(who(user, g), address, qos=1, wall_now=0).allowed


@pytest.mark.parametrize(("address", "allowed"), [
    ("A", {"joe"}),
    ("A/P", {"joe"}),
    ("A/K", {"joe"}),
    ("A/K/M/N", {"mary", "joe"}),
    ("A/K/M/N/deeper", {"mary", "joe"}),
    ("A/B", {"allen", "joe"}),
    ("A/B/C", {"allen", "joe"}),
    ("Z", {"joe", "mary", "allen", "nat", "hank", "bob"}),  # root default: everyone
    ("$SYS/broker/load", {"joe", "mary", "allen", "nat", "hank", "bob"}),  # exempt
])
def test_wmb_publish_table(wmb: dict[str, TopicAuthorizer], address: str, allowed: set[str]
                           ) -> None:
    for user in ("joe", "mary", "allen", "nat", "hank", "bob"):
        assert publish(wmb, user, address) is (user in allowed), (user, address)


def test_wmb_publish_texts(wmb: dict[str, TopicAuthorizer]) -> None:
    staff = wmb["staff"]
    assert staff.check_publish(who("mary", "staff"), "A/K", qos=1, wall_now=0).decided_by == (
        "topicTree(nearestAcl) node 'A' defines publish as ['joe']: not granted to mary")
    assert staff.check_publish(who("mary", "staff"), "A/K/M/N/x", qos=1,
                               wall_now=0).decided_by == (
        "topicTree(nearestAcl) node 'A/K/M/N' defines publish: granted to mary")
    assert staff.check_publish(who("bob", "staff"), "Z", qos=1, wall_now=0).decided_by == (
        "topicTree(nearestAcl) node '' (root) defines publish: granted to bob via '*'")
    assert staff.check_publish(who("bob", "staff"), "$SYS/x", qos=1, wall_now=0).decided_by == (
        "topicTree(nearestAcl): '$SYS/x' is under system prefix '$SYS' (exempt from topic checks)")
    # A system prefix is whole tokens.
    assert not staff.check_publish(who("bob", "staff"), "A", qos=1, wall_now=0).allowed
    assert staff.check_publish(who("bob", "staff"), "$SYSTEM", qos=1, wall_now=0).allowed  # root


def test_wmb_plain_subscriptions_and_persistent(wmb: dict[str, TopicAuthorizer]) -> None:
    staff, hr = wmb["staff"], wmb["HR"]
    # A: subscribe everyone, persistent no one -> durable stripped.
    decision = staff.check_subscribe(who("bob", "staff"), "A/P", qos=1, wall_now=0)
    assert decision.allowed and decision.strip_durable and not decision.per_delivery
    assert decision.decided_by == (
        "topicTree(nearestAcl) node 'A' defines subscribe: granted to bob via '*'; "
        "topicTree(nearestAcl) node 'A' defines persistent as []: not granted to bob -> durable "
        "messages on 'A/P' are delivered as non-durable")
    # A/K/M/N: persistent everyone except nat.
    assert not staff.check_subscribe(who("bob", "staff"), "A/K/M/N", qos=1,
                                     wall_now=0).strip_durable
    nat = staff.check_subscribe(who("nat", "staff"), "A/K/M/N", qos=1, wall_now=0)
    assert nat.allowed and nat.strip_durable
    assert "node 'A/K/M/N' defines persistent: nat is denied by '!nat'" in nat.decided_by
    # A/B: subscribe only group HR.
    denied = staff.check_subscribe(who("bob", "staff"), "A/B", qos=1, wall_now=0)
    assert not denied.allowed and denied.model == "topicTree"
    assert denied.decided_by == (
        "topicTree(nearestAcl) node 'A/B' defines subscribe as ['@HR']: not granted to bob")
    hank = hr.check_subscribe(who("hank", "HR"), "A/B", qos=1, wall_now=0)
    assert hank.allowed and hank.strip_durable  # persistent still from A
    assert "granted to hank via '@HR'" in hank.decided_by
    # Root defaults: everything allowed, durable kept.
    root = staff.check_subscribe(who("bob", "staff"), "Q", qos=1, wall_now=0)
    assert root.allowed and not root.strip_durable


def test_wmb_wildcard_subscription_is_checked_per_delivery(wmb: dict[str, TopicAuthorizer]
                                                           ) -> None:
    staff, hr = wmb["staff"], wmb["HR"]
    bob, hank = who("bob", "staff"), who("hank", "HR")
    decision = staff.check_subscribe(bob, "A/+", qos=1, wall_now=0)
    assert decision.allowed and decision.per_delivery and not decision.strip_durable
    assert decision.decided_by == (
        "topicTree(nearestAcl): wildcard subscription 'A/+' is accepted; each delivery is "
        "checked against the message's address")
    # bob receives A/P and A/K, not A/B.
    for address in ("A/P", "A/K"):
        delivery = staff.check_delivery(bob, "A/+", address, wall_now=0)
        assert delivery.visible and delivery.strip_durable  # persistent: no one at A
    withheld = staff.check_delivery(bob, "A/+", "A/B", wall_now=0)
    assert not withheld.visible
    assert withheld.decided_by == (
        "topicTree(nearestAcl) node 'A/B' defines subscribe as ['@HR']: not granted to bob")
    # hank is in HR.
    assert hr.check_subscribe(hank, "A/+", qos=1, wall_now=0).per_delivery
    assert hr.check_delivery(hank, "A/+", "A/B", wall_now=0).visible
    # Persistent per delivery: A/K/M/N keeps durable for bob, strips it for nat.
    assert not staff.check_delivery(bob, "A/#", "A/K/M/N", wall_now=0).strip_durable
    assert staff.check_delivery(who("nat", "staff"), "A/#", "A/K/M/N", wall_now=0).strip_durable
    # System addresses are exempt per delivery too.
    sys_delivery = staff.check_delivery(bob, "#", "$SYS/uptime", wall_now=0)
    assert sys_delivery.visible and not sys_delivery.strip_durable


def test_wmb_root_can_be_changed_but_not_removed() -> None:
    pol = policy({"hostname": "b", "topicTree": {"model": "nearestAcl", "nodes": {
        "": {"publish": []}, "open": {"publish": ["*"]}}},
        "groups": {"g": {"users": "*", **OPEN}}})
    auth = authorizer(pol, "b", "g")
    assert not auth.check_publish(who("u", "g"), "x", qos=1, wall_now=0).allowed
    assert auth.check_publish(who("u", "g"), "open/x", qos=1, wall_now=0).allowed
    # subscribe and persistent keep the root default.
    decision = auth.check_subscribe(who("u", "g"), "x", qos=1, wall_now=0)
    assert decision.allowed and not decision.strip_durable


def test_dot_separator_and_amqp_wildcards() -> None:
    pol = policy({"hostname": "d", "topicTree": {
        "model": "nearestAcl", "separator": ".", "wildcards": "amqp",
        "nodes": {"": {"subscribe": []}, "quotes": {"subscribe": ["*"]}}},
        "groups": {"g": {"users": "*", **OPEN}}})
    auth = authorizer(pol, "d", "g")
    u = who("u", "g")
    assert auth.check_subscribe(u, "quotes.nyse", qos=1, wall_now=0).allowed
    assert not auth.check_subscribe(u, "quotes/nyse", qos=1, wall_now=0).allowed  # one token
    wild = auth.check_subscribe(u, "*.nyse", qos=1, wall_now=0)
    assert wild.per_delivery
    assert auth.check_delivery(u, "*.nyse", "quotes.nyse", wall_now=0).visible
    assert not auth.check_delivery(u, "*.nyse", "orders.nyse", wall_now=0).visible
    # '+' is not a wildcard in amqp syntax: a literal token, decided at attach.
    assert not auth.check_subscribe(u, "+.nyse", qos=1, wall_now=0).per_delivery
