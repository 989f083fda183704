"""policy/model.py: immutable snapshot and the limits table for the amqp_proxy_limit gauge."""

from __future__ import annotations

import dataclasses

import pytest

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import GroupSettings, Policy, PolicySettings, VhostPolicy


def test_limits_table_rows() -> None:
    policy = compile_policy([(None, [{
        "hostname": "v",
        "maxConnections": 10,
        "maxConnectionsPerUser": 3,
        "groups": {
            "a": {"users": "u", "remoteHosts": "*", "maxConnectionsPerHost": 2, "maxSessions": 4,
                  "maxSenders": 0, "maxReceivers": 7, "maxFrameSize": 4096,
                  "maxSessionWindow": 8192, "maxMessageSize": 100},
            "b": {"users": "w", "remoteHosts": "*", "maxSenders": 1},
        },
    }])])
    assert policy.limits_table() == [
        ("v", "", "maxConnections", 10),
        ("v", "", "maxConnectionsPerHost", 65535),
        ("v", "", "maxConnectionsPerUser", 3),
        ("v", "a", "maxConnectionsPerHost", 2),
        ("v", "a", "maxConnectionsPerUser", 3),
        ("v", "a", "maxFrameSize", 4096),
        ("v", "a", "maxMessageSize", 100),
        ("v", "a", "maxReceivers", 7),
        ("v", "a", "maxSessionWindow", 8192),
        ("v", "a", "maxSessions", 4),
        ("v", "b", "maxConnectionsPerHost", 65535),
        ("v", "b", "maxConnectionsPerUser", 3),
        ("v", "b", "maxSenders", 1),
    ]  # a's maxSenders 0 and b's default maxReceivers 2147483647 are unlimited: no row


def test_model_is_frozen_and_read_only() -> None:
    policy = compile_policy([(None, [{"hostname": "v", "groups": {"g": {"users": "u"}}}])])
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.digest = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.vhosts["w"] = policy.vhosts["v"]  # type: ignore[index]
    with pytest.raises(TypeError):
        policy.vhosts["v"].groups["h"] = policy.vhosts["v"].groups["g"]  # type: ignore[index]
    group = policy.vhosts["v"].groups["g"]
    assert isinstance(group.users, frozenset)
    with pytest.raises(AttributeError):
        group.sources._items = ("*",)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        group.remote_hosts._wildcard = True  # type: ignore[misc]


def test_defaults_and_kw_only() -> None:
    assert PolicySettings() == PolicySettings(
        max_connections=65535, enable_vhost_policy=True, enable_vhost_name_patterns=False,
        default_vhost="$default", max_message_size=0)
    group = GroupSettings(name="g")
    assert group.remote_hosts.is_empty() and group.sources.is_empty()
    assert VhostPolicy(hostname="v").max_connections == 65535
    assert Policy().limits_table() == []
    with pytest.raises(TypeError):
        GroupSettings("g")  # type: ignore[misc]
