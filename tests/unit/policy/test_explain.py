"""policy/explain.py: the step-by-step account names the deciding rule."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.explain import explain
from amqp_policy_proxy.policy.model import PolicySettings

POLICY = compile_policy([("policy.d/photo.json", [["vhost", {
    "hostname": "photoserver",
    "aliases": "antialias",
    "maxConnections": 50,
    "maxConnectionsPerUser": 5,
    "allowUnknownUser": True,
    "groups": {
        "admin": {
            "users": "alice",
            "remoteHosts": "10.48.0.0/16, db.example",
            "maxConnectionsPerUser": 2,
            "maxFrameSize": 65536,
            "sourcePattern": "public.#, ${user}.#",
            "targets": "public, tmp-${user}*",
        },
        "everyone": {"users": "*", "remoteHosts": "*", "allowDynamicSource": True},
        "$default": {"remoteHosts": "*"},
    },
}], ["vhost", {"hostname": "$default", "groups": {}}]])],
    PolicySettings(), resolver=lambda name: ["192.0.2.7"])


def test_full_allow_with_link_explanation() -> None:
    result = explain(POLICY, user="alice", host="::ffff:10.48.1.2", vhost="antialias",
                     address="tmp-alice-7", role="sender")
    assert result.allowed is True and result.reason is None
    assert result.lines == (
        "vhost: Open hostname 'antialias' -> vhost 'photoserver' (alias 'antialias') from "
        "policy.d/photo.json",
        "group: user 'alice' is listed in the users of group 'admin'",
        "remoteHosts: 10.48.1.2 (from '::ffff:10.48.1.2') matches item '10.48.0.0/16'",
        "counts: not considered (explain is static); at Open the proxy also checks "
        "maxConnections 50 (vhost), maxConnectionsPerUser 2 (group), maxConnectionsPerHost 65535 "
        "(vhost)",
        "settings: maxFrameSize 65536, maxSessions not set, maxSessionWindow not set, "
        "maxMessageSize unlimited, maxSenders 2147483647, maxReceivers 2147483647",
        "link: sender target 'tmp-alice-7' is allowed by targets item 'tmp-${user}*' with "
        "${user} = 'alice'",
        "RESULT: ALLOW",
    )
    assert result.render() == "\n".join(result.lines)


def test_host_name_item_and_pattern_source() -> None:
    result = explain(POLICY, user="alice", host="192.0.2.7", vhost="photoserver",
                     address="alice.inbox", role="receiver")
    assert result.allowed
    assert result.lines[2] == ("remoteHosts: 192.0.2.7 matches item 'db.example' (host name "
                               "resolved at load time to 192.0.2.7)")
    assert result.lines[5] == ("link: receiver source 'alice.inbox' is allowed by sourcePattern "
                               "item '${user}.#' with ${user} = 'alice'")


def test_denied_link_names_the_rules() -> None:
    result = explain(POLICY, user="alice", host="10.48.0.1", vhost="photoserver",
                     address="bob.inbox", role="receiver")
    assert (result.allowed, result.reason) == (False, "source")
    assert result.lines[-2:] == (
        "link: receiver source 'bob.inbox' is denied: no sourcePattern item matches "
        "['public.#', '${user}.#'] for user 'alice'",
        "RESULT: DENY (source)",
    )


def test_star_user_group_and_remote_host_denial() -> None:
    ok = explain(POLICY, user="zed", host="8.8.8.8", vhost="photoserver")
    assert ok.lines[1] == "group: user 'zed' is not listed by name; group 'everyone' lists '*'"
    denied = explain(POLICY, user="alice", host="8.8.8.8", vhost="photoserver")
    assert denied.reason == "remote_host"
    assert denied.lines[-2] == ("remoteHosts: 8.8.8.8 matches none of ['10.48.0.0/16', "
                                "'db.example'] (group 'admin')")


def test_default_vhost_then_unknown_user() -> None:
    result = explain(POLICY, user="zed", host="10.0.0.1", vhost="elsewhere")
    assert result.lines == (
        "vhost: Open hostname 'elsewhere' -> vhost '$default' (no vhost, alias or pattern "
        "matched; defaultVhost '$default') from policy.d/photo.json",
        "group: user 'zed' is in no group's users, no group lists '*', and allowUnknownUser is "
        "false",
        "RESULT: DENY (unknown_user)",
    )


def test_no_vhost() -> None:
    policy = compile_policy([(None, [{"hostname": "a"}])],
                            PolicySettings(enable_vhost_name_patterns=True))
    result = explain(policy, user="u", host="10.0.0.1", vhost="b")
    assert result.lines == (
        "vhost: Open hostname 'b': no vhost of that name, no alias, no hostname pattern, "
        "defaultVhost '$default' is not defined",
        "RESULT: DENY (no_vhost)",
    )


def test_anonymous_sender_no_source_and_empty_remote_hosts() -> None:
    anon = explain(POLICY, user="zed", host="10.0.0.1", vhost="photoserver", address="",
                   role="sender")
    assert anon.reason == "anonymous_sender"
    no_source = explain(POLICY, user="zed", host="10.0.0.1", vhost="photoserver", address="",
                        role="receiver")
    assert no_source.reason == "no_source"
    assert "a dynamic source would be allowed (allowDynamicSource)" in no_source.lines[-2]
    policy = compile_policy([(None, [{"hostname": "v", "groups": {"g": {"users": "u"}}}])])
    empty = explain(policy, user="u", host="10.0.0.1", vhost="v")
    assert empty.lines[-2] == "remoteHosts: group 'g' has no remoteHosts: every host is denied"


def test_vhost_policy_disabled() -> None:
    policy = compile_policy([], PolicySettings(enable_vhost_policy=False, max_connections=7))
    result = explain(policy, user="u", host="1.2.3.4")
    assert result.allowed
    assert result.lines[0] == ("vhost policy is disabled (enableVhostPolicy false): only the "
                               "global maxConnections (7) applies")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="role must be"):
        explain(POLICY, user="u", host="1.2.3.4", role="both")
    with pytest.raises(ValueError, match="needs a role"):
        explain(POLICY, user="u", host="1.2.3.4", address="q")
    with pytest.raises(ValueError, match="delivery address needs"):
        explain(POLICY, user="u", host="1.2.3.4", address="q", role="sender",
                delivery_address="q")
    with pytest.raises(ValueError, match="qos must be"):
        explain(POLICY, user="u", host="1.2.3.4", qos=3)


# ---------------------------------------------------------------------------- topic models

OPEN = {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*"}
TOPICS = compile_policy([("topics.json", [["vhost", {
    "hostname": "broker",
    "topicTree": {"model": "nearestAcl", "nodes": {
        "A": {"publish": ["joe"], "subscribe": ["*"], "persistent": []},
        "A/K/M/N": {"publish": ["mary", "joe"], "persistent": ["*", "!nat"]},
        "A/B": {"publish": ["allen", "joe"], "subscribe": ["@HR"]}}},
    "groups": {
        "HR": {**OPEN, "users": "hank"},
        "staff": {**OPEN, "allowAnonymousSender": True, "permissions": [
            {"topic": "A/K/#", "activity": "publish", "qos": [0], "type": "deny"},
            {"topic": "#", "activity": "all", "type": "allow"}]},
    },
}]])])


def topic_lines(**kw: object) -> tuple[str, ...]:
    result = explain(TOPICS, host="10.0.0.1", vhost="broker", **kw)  # type: ignore[arg-type]
    return tuple(line for line in result.lines if line.startswith(("topic:", "delivery:",
                                                                   "RESULT:")))


def test_topic_tree_node_that_denied_is_named() -> None:
    assert topic_lines(user="mary", address="A/K", role="sender") == (
        "topic: publish 'A/K' at qos 1 by user 'mary' (group 'staff'); models: topicTree, "
        "permissions",
        "topic: topicTree(nearestAcl) node 'A' defines publish as ['joe']: not granted to mary",
        "RESULT: DENY (topic)",
    )


def test_permission_rule_that_decided_is_named_with_the_qos() -> None:
    assert topic_lines(user="joe", address="A/K/x", role="sender", qos=0) == (
        "topic: publish 'A/K/x' at qos 0 by user 'joe' (group 'staff'); models: topicTree, "
        "permissions",
        "topic: topicTree(nearestAcl) node 'A' defines publish: granted to joe",
        "topic: permissions permissions[0] (topic 'A/K/#', activity publish, qos [0], deny) "
        "denies publish 'A/K/x' at qos 0",
        "RESULT: DENY (topic)",
    )
    assert topic_lines(user="joe", address="A/K/x", role="sender")[-1] == "RESULT: ALLOW"


def test_wildcard_subscription_and_one_delivery() -> None:
    assert topic_lines(user="bob", address="A/+", role="receiver",
                       delivery_address="A/B") == (
        "topic: subscribe 'A/+' at qos 1 by user 'bob' (group 'staff'); models: topicTree, "
        "permissions",
        "topic: topicTree(nearestAcl): wildcard subscription 'A/+' is accepted; each delivery "
        "is checked against the message's address",
        "topic: permissions permissions[1] (topic '#', activity all, qos [0, 1, 2], allow) "
        "allows subscribe 'A/+' at qos 1",
        "delivery: message to 'A/B' is withheld from the client (settled toward the router): "
        "topicTree(nearestAcl) node 'A/B' defines subscribe as ['@HR']: not granted to bob",
        "RESULT: ALLOW",
    )
    assert topic_lines(user="bob", address="A/+", role="receiver",
                       delivery_address="A/P")[-2] == (
        "delivery: message to 'A/P' is delivered, durable rewritten to false: "
        "topicTree(nearestAcl) node 'A' defines subscribe: granted to bob via '*'; "
        "topicTree(nearestAcl) node 'A' defines persistent as []: not granted to bob -> "
        "durable messages on 'A/P' are delivered as non-durable")
    assert topic_lines(user="hank", address="A/+", role="receiver",
                       delivery_address="Q")[-2] == (
        "delivery: message to 'Q' is delivered unchanged: topicTree(nearestAcl) node '' (root) "
        "defines subscribe: granted to hank via '*'; topicTree(nearestAcl) node '' (root) "
        "defines persistent: granted to hank via '*'")


def test_plain_subscription_durable_rewrite_and_anonymous_relay() -> None:
    lines = topic_lines(user="nat", address="A/K/M/N", role="receiver", delivery_address="x")
    assert lines[-2] == ("delivery: not checked per delivery (decided at attach); durable "
                         "messages are delivered as non-durable")
    assert "nat is denied by '!nat'" in lines[1]
    assert topic_lines(user="bob", address="", role="sender") == (
        "topic: each relay message's 'to' is also checked by the topic models (topicTree, "
        "permissions)",
        "RESULT: ALLOW",
    )
    # Without topic models nothing changes, except a delivery question gets an answer.
    assert explain(POLICY, user="alice", host="10.48.0.1", vhost="photoserver",
                   address="public.x", role="receiver", delivery_address="x").lines[-2] == (
        "delivery: no topic model: every delivery is visible and keeps its durability")


def test_dds_needs_a_time() -> None:
    class Dds:
        def check(self, subject: object, user: str, activity: str, topic: str,
                  wall_now: float) -> object:
            return type("V", (), {"allowed": wall_now < 10,
                                  "decided_by": f"dds grant 'g' at {wall_now:g}"})()

    policy = compile_policy([("t.json", [["vhost", {
        "hostname": "v", "permissionsDocument": "d.p7s", "permissionsCa": "ca.pem",
        "groups": {"g": OPEN}}]])], dds_loader=lambda *a: (Dds(), "x"))
    with pytest.raises(ValueError, match="wall_now"):
        explain(policy, user="u", host="10.0.0.1", vhost="v", address="t", role="sender")
    early = explain(policy, user="u", host="10.0.0.1", vhost="v", address="t", role="sender",
                    subject="CN=u", wall_now=5)
    assert early.lines[-3:] == (
        "topic: publish 't' at qos 1 by user 'u' (group 'g', subject 'CN=u'); models: dds",
        "topic: dds grant 'g' at 5",
        "RESULT: ALLOW",
    )
    late = explain(policy, user="u", host="10.0.0.1", vhost="v", address="t", role="sender",
                   wall_now=50)
    assert late.reason == "topic"


def test_rates_are_named_with_the_reason_each_would_give() -> None:
    policy = compile_policy([(None, [["vhost", {
        "hostname": "v", "maxConnectionRate": 100, "maxConnectionRatePerHost": 50,
        "connectionRateBurst": 20,
        "groups": {"g": {"users": "*", "remoteHosts": "*", "maxConnectionRatePerUser": 5,
                         "maxMessageRatePerUser": 100}}}]])],
        PolicySettings(max_connection_rate=1000))
    result = explain(policy, user="u", host="10.0.0.1", vhost="v")
    assert result.allowed
    assert result.lines[-3:-1] == (
        "rates: not considered (explain is static); after the counts the proxy also checks "
        "maxConnectionRate 100/s burst 20 (vhost; over it: vhost_rate), "
        "maxConnectionRatePerUser 5/s burst 20 (group; over it: user_rate), "
        "maxConnectionRatePerHost 50/s burst 20 (vhost; over it: host_rate), "
        "[policy] max_connection_rate 1000/s at TCP accept (over it: global_rate)",
        "shaping: maxMessageRatePerUser 100/s, maxByteRatePerUser unlimited: the user's sending "
        "links get link-credit as the user's buckets allow (shared by the user's connections on "
        "this proxy); a faster sender waits, nothing is refused",
    )


def test_no_rate_line_without_rates() -> None:
    result = explain(POLICY, user="zed", host="8.8.8.8", vhost="photoserver")
    assert not any(line.startswith(("rates:", "shaping:")) for line in result.lines)
