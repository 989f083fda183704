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
