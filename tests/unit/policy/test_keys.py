"""policy/keys.py: the key table is the single source of truth."""

from __future__ import annotations

import dataclasses

import pytest

from amqp_policy_proxy.policy import keys
from amqp_policy_proxy.policy.model import GroupSettings, VhostPolicy


def test_not_enforced_keys() -> None:
    assert keys.NOT_ENFORCED_GROUP_KEYS == {
        "allowWaypointLinks", "allowFallbackLinks", "allowDynamicLinkRoutes",
        "allowAdminStatusUpdate",
    }
    assert "id" in keys.NOT_ENFORCED_VHOST_KEYS


def test_every_group_key_is_a_group_settings_field() -> None:
    fields = {f.name for f in dataclasses.fields(GroupSettings)}
    for spec in keys.GROUP_KEYS.values():
        if spec.kind in (keys.Kind.PATTERNS,):
            continue  # sourcePattern/targetPattern compile into sources/targets
        if spec.kind is keys.Kind.TOPICS:
            assert "topics" in fields  # permissions/defaultBehaviour compile into topics
            continue
        assert spec.snake in fields, spec.camel


def test_every_vhost_key_is_a_vhost_policy_field() -> None:
    fields = {f.name for f in dataclasses.fields(VhostPolicy)}
    for spec in keys.VHOST_KEYS.values():
        if spec.kind in (keys.Kind.METADATA, keys.Kind.TOPICS):
            continue  # topic keys compile into each group's topics
        assert spec.snake in fields, spec.camel


@pytest.mark.parametrize(
    ("camel", "snake"),
    [("maxConnectionsPerUser", "max_connections_per_user"), ("remoteHosts", "remote_hosts"),
     ("allowUserIdProxy", "allow_user_id_proxy"), ("sourcePattern", "source_pattern")],
)
def test_snake_and_camel_round_trip(camel: str, snake: str) -> None:
    assert keys.snake_case(camel) == snake
    assert keys.camel_case(snake) == camel


def test_unknown_key_raises() -> None:
    with pytest.raises(KeyError):
        keys.snake_case("maxConnection")


def test_hyphen_to_camel_and_suggest() -> None:
    assert keys.hyphen_to_camel("max-connections-per-user") == "maxConnectionsPerUser"
    assert keys.hyphen_to_camel("hostname") == "hostname"
    assert keys.suggest("maxSender", keys.GROUP_KEYS) == "maxSenders"
    assert keys.suggest("colour", keys.GROUP_KEYS) is None


def test_topic_keys_are_the_architecture_4_6_keys() -> None:
    topics = keys.Kind.TOPICS
    assert {k for k, s in keys.VHOST_KEYS.items() if s.kind is topics} == {
        "topicTree", "permissionsDocument", "permissionsCa"}
    assert {k for k, s in keys.GROUP_KEYS.items() if s.kind is topics} == {
        "permissions", "defaultBehaviour"}


def test_limit_names_are_qdr_keys() -> None:
    assert set(keys.LIMIT_NAMES) <= set(keys.VHOST_KEYS) | set(keys.GROUP_KEYS)
