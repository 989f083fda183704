"""policy/topics/permissions.py: HiveMQ-style ordered rules (issue 8, model 3)."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.policy.topics import TopicAuthorizer

from .helpers import OPEN, authorizer, policy, who

RULES = [
    {"topic": "admin/#", "activity": "all", "type": "deny"},
    {"topic": "${user}/#", "activity": "all", "qos": [0, 1], "type": "allow"},
    {"topic": "public/+/status", "activity": "subscribe", "type": "allow"},
    {"topic": "public/#", "activity": "publish", "qos": [1], "type": "allow"},
]


def devices(rules: Any = RULES, tree: dict[str, Any] | None = None, **group: Any
            ) -> TopicAuthorizer:
    vhost: dict[str, Any] = {"hostname": "iot", "groups": {
        "devices": {"users": "*", **OPEN, "permissions": rules, **group}}}
    if tree is not None:
        vhost["topicTree"] = tree
    return authorizer(policy(vhost), "iot", "devices")


def pub(auth: TopicAuthorizer, user: str, address: str, qos: int = 1) -> bool:
    return auth.check_publish(who(user, "devices"), address, qos=qos, wall_now=0).allowed


def sub(auth: TopicAuthorizer, user: str, address: str, qos: int = 1) -> bool:
    return auth.check_subscribe(who(user, "devices"), address, qos=qos, wall_now=0).allowed


def test_first_matching_rule_decides() -> None:
    auth = devices()
    decision = auth.check_publish(who("alice", "devices"), "alice/temp", qos=1, wall_now=0)
    assert decision.allowed and decision.model == "permissions"
    assert decision.decided_by == (
        "permissions permissions[1] (topic '${user}/#' = 'alice/#', activity all, qos [0, 1], "
        "allow) allows publish 'alice/temp' at qos 1")
    # The user 'admin' matches rule 1 too, but rule 0 comes first.
    denied = auth.check_publish(who("admin", "devices"), "admin/x", qos=1, wall_now=0)
    assert not denied.allowed and denied.model == "permissions"
    assert denied.decided_by == (
        "permissions permissions[0] (topic 'admin/#', activity all, qos [0, 1, 2], deny) denies "
        "publish 'admin/x' at qos 1")
    assert not pub(auth, "admin", "admin")  # '#' matches the parent level


def test_qos_must_match() -> None:
    auth = devices()
    assert pub(auth, "alice", "alice/t", qos=0)
    assert not pub(auth, "alice", "alice/t", qos=2)  # no rule for qos 2: default deny
    assert pub(auth, "bob", "public/news", qos=1)
    assert not pub(auth, "bob", "public/news", qos=0)
    decision = devices().check_publish(who("bob", "devices"), "public/news", qos=2, wall_now=0)
    assert decision.decided_by == ("permissions: no rule matches publish 'public/news' at qos 2 "
                                   "for bob; default deny (rules exist)")


def test_activity_must_match() -> None:
    auth = devices()
    assert sub(auth, "bob", "public/dev1/status")
    assert not pub(auth, "bob", "public/dev1/status", qos=2)  # subscribe-only rule
    assert not sub(auth, "bob", "public/news")  # publish-only rule


def test_wildcard_subscription_must_be_covered_by_the_rule() -> None:
    auth = devices()
    assert sub(auth, "bob", "public/+/status")
    assert sub(auth, "alice", "alice/#")
    assert sub(auth, "alice", "alice/+/x")
    assert not sub(auth, "alice", "#")
    assert not sub(auth, "bob", "public/#")  # wider than public/+/status
    decision = auth.check_subscribe(who("bob", "devices"), "public/#", qos=1, wall_now=0)
    assert decision.decided_by == ("permissions: no rule covers subscribe 'public/#' at qos 1 "
                                   "for bob; default deny (rules exist)")
    # A deny rule matches a wildcard subscription it covers.
    assert not sub(auth, "admin", "admin/+")


def test_default_behaviour_both_ways() -> None:
    assert pub(devices([]), "u", "anything")
    empty = devices([]).check_publish(who("u", "devices"), "x", qos=1, wall_now=0)
    assert empty.decided_by == ("permissions: no rule matches publish 'x' at qos 1 for u; "
                                "default allow (no rules)")
    assert not pub(devices([], defaultBehaviour="deny"), "u", "anything")
    assert pub(devices(defaultBehaviour="allow"), "u", "elsewhere")
    assert not pub(devices(defaultBehaviour="allow"), "u", "admin/x")  # a rule still decides
    explicit = devices(defaultBehaviour="allow").check_publish(who("u", "devices"), "x", qos=1,
                                                               wall_now=0)
    assert explicit.decided_by.endswith("; defaultBehaviour allow")
    # defaultBehaviour alone is a permission model with no rules.
    only_default = authorizer(policy({"hostname": "iot", "groups": {"devices": {
        "users": "*", **OPEN, "defaultBehaviour": "deny"}}}), "iot", "devices")
    assert not pub(only_default, "u", "x")


@pytest.mark.parametrize("user", ["+", "#", "*", "a/b", "x+y", "ev#il", ""])
def test_user_substitution_gives_no_wildcard_power(user: str) -> None:
    auth = devices([{"topic": "${user}/#", "activity": "all", "type": "allow"}])
    for address in ("bob/x", "+/x", "#/x", "a/b/x", "a/x", f"{user}/x", user):
        assert not pub(auth, user, address), (user, address)
    for subscription in ("#", "+/#", "bob/#", f"{user}/#"):
        assert not sub(auth, user, subscription), (user, subscription)


def test_user_substitution_is_literal_for_normal_names() -> None:
    auth = devices([{"topic": "devices/${user}/+", "activity": "publish", "type": "allow"}])
    assert pub(auth, "d1", "devices/d1/temp")
    assert not pub(auth, "d1", "devices/d2/temp")
    assert not pub(auth, "d1", "devices/d1/temp/x")
    # A dot is an ordinary character with the '/' separator.
    assert pub(auth, "d.1", "devices/d.1/temp")


def test_unusable_user_name_makes_a_deny_rule_deny_more_never_less() -> None:
    rules = [{"topic": "${user}/secret", "activity": "all", "type": "deny"},
             {"topic": "#", "activity": "all", "type": "allow"}]
    auth = devices(rules)
    assert not pub(auth, "carl", "carl/secret")
    assert pub(auth, "carl", "dora/secret")
    # "a/b" cannot be one token: the deny rule widens ${user} to '#'.
    for address in ("a/b/secret", "x/secret", "secret", "a/+/secret"):
        assert not pub(auth, "a/b", address), address
    assert pub(auth, "a/b", "x/public")
    assert not sub(auth, "+", "x/secret") and not sub(auth, "+", "+/secret")
    assert sub(auth, "+", "x/public")
    # HiveMQ semantics: a deny rule stops only the subscriptions it covers; '#' is wider than
    # '#/secret', so the allow rule decides (for every user, as for carl).
    assert sub(auth, "+", "#") and sub(auth, "carl", "#")
    decision = auth.check_publish(who("a/b", "devices"), "x/secret", qos=1, wall_now=0)
    assert decision.decided_by == (
        "permissions permissions[0] (topic '${user}/secret' = '#/secret' (user name 'a/b' cannot "
        "be one token: a deny rule widens ${user} to '#'), activity all, qos [0, 1, 2], "
        "deny) denies publish 'x/secret' at qos 1")


def test_separator_and_wildcards_follow_the_vhost_topic_tree() -> None:
    tree = {"model": "anyAncestor", "separator": ".", "wildcards": "amqp",
            "nodes": {"": {"publish": ["*"], "subscribe": ["*"]}}}
    auth = devices([{"topic": "${user}.*", "activity": "all", "type": "allow"},
                    {"topic": "feeds.+.#", "activity": "subscribe", "type": "allow"}], tree)
    assert pub(auth, "d1", "d1.temp")
    assert not pub(auth, "d1", "d1/temp")  # '/' is an ordinary character here
    assert sub(auth, "d1", "d1.*")         # '*' is the subscription wildcard (amqp)
    assert sub(auth, "d1", "feeds.*.#")    # '+' in a rule is always a one-level wildcard
    assert not sub(auth, "d1", "feeds.#")
    decision = auth.check_publish(who("d1", "devices"), "d1.temp", qos=1, wall_now=0)
    assert decision.model == ""  # two models passed
    assert decision.decided_by == (
        "topicTree(anyAncestor) node '' (root) grants publish to d1 via '*'; permissions "
        "permissions[0] (topic '${user}.*' = 'd1.*', activity all, qos [0, 1, 2], allow) "
        "allows publish 'd1.temp' at qos 1")
