"""policy/decisions.py: table-driven approve_* cases in QDR's order."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.policy.addresses import AddressRules
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.decisions import (
    OpenAllowed,
    OpenDenied,
    approve_open,
    approve_receiver,
    approve_relay_target,
    approve_sender,
)
from amqp_policy_proxy.policy.model import GroupSettings, PolicySettings

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "photoserver",
    "allowUnknownUser": False,
    "groups": {
        "admin": {"users": "alice", "remoteHosts": "10.48.0.0-10.48.255.255, ::1"},
        "nohosts": {"users": "nobody"},
    },
}]])], PolicySettings(default_vhost=""))


@pytest.mark.parametrize(
    ("hostname", "user", "rhost", "reason", "log"),
    [
        ("nope", "alice", "10.48.0.1", "no_vhost",
         "DENY AMQP Open for user 'alice', rhost '10.48.0.1', vhost 'nope': "
         "No policy defined for vhost"),
        (None, "alice", "10.48.0.1", "no_vhost",
         "DENY AMQP Open for user 'alice', rhost '10.48.0.1', vhost '': "
         "No policy defined for vhost"),
        ("photoserver", "mallory", "10.48.0.1", "unknown_user",
         "DENY AMQP Open for user 'mallory', rhost '10.48.0.1', vhost 'photoserver': "
         "User is not in a user group and unknown users are denied"),
        ("photoserver", "alice", "10.49.0.1", "remote_host",
         "DENY AMQP Open for user 'alice', rhost '10.49.0.1', vhost 'photoserver': "
         "User is not allowed to connect from this network host"),
        ("photoserver", "nobody", "10.48.0.1", "remote_host",
         "DENY AMQP Open for user 'nobody', rhost '10.48.0.1', vhost 'photoserver': "
         "User is not allowed to connect from this network host"),
        ("photoserver", "alice", "not-an-ip", "remote_host",
         "DENY AMQP Open for user 'alice', rhost 'not-an-ip', vhost 'photoserver': "
         "User is not allowed to connect from this network host"),
    ],
)
def test_open_denials(hostname: str | None, user: str, rhost: str, reason: str, log: str) -> None:
    decision = approve_open(POLICY, hostname=hostname, user=user, remote_host=rhost)
    assert isinstance(decision, OpenDenied)
    assert (decision.reason, decision.log) == (reason, log)
    if reason == "remote_host":
        assert decision.vhost is POLICY.vhosts["photoserver"]
        assert decision.group is not None
    if reason == "no_vhost":
        assert decision.vhost is None and decision.group is None


@pytest.mark.parametrize("rhost", ["10.48.0.1", "::ffff:10.48.255.255", "::1"])
def test_open_allowed(rhost: str) -> None:
    decision = approve_open(POLICY, hostname="photoserver", user="alice", remote_host=rhost)
    assert isinstance(decision, OpenAllowed)
    assert decision.vhost.hostname == "photoserver"
    assert decision.group.name == "admin"


def _group(**kw: Any) -> GroupSettings:
    return GroupSettings(name="g", **kw)


@pytest.mark.parametrize(
    ("group", "target", "open_senders", "expected"),
    [
        (_group(max_senders=2, targets=AddressRules.from_list(["*"])), "q", 1, None),
        (_group(max_senders=2, targets=AddressRules.from_list(["*"])), "q", 2, "sender_limit"),
        # the limit is checked before anything else
        (_group(max_senders=1, allow_anonymous_sender=True), None, 1, "sender_limit"),
        (_group(max_senders=None, targets=AddressRules.from_list(["*"])), "q", 10**6, None),
        (_group(targets=AddressRules.from_list(["public"])), "private", 0, "target"),
        (_group(targets=AddressRules.from_list(["${user}.in"])), "alice.in", 0, None),
        (_group(targets=AddressRules.from_list(["${user}.in"])), "bob.in", 0, "target"),
        (_group(allow_anonymous_sender=False), None, 0, "anonymous_sender"),
        (_group(allow_anonymous_sender=False), "", 0, "anonymous_sender"),
        (_group(allow_anonymous_sender=True), "", 0, None),
        # a target address is never "anonymous", whatever allowAnonymousSender says
        (_group(allow_anonymous_sender=True), "q", 0, "target"),
    ],
)
def test_approve_sender(group: GroupSettings, target: str | None, open_senders: int,
                        expected: str | None) -> None:
    assert approve_sender(group, user="alice", target_address=target,
                          open_senders=open_senders) == expected


@pytest.mark.parametrize(
    ("group", "source", "dynamic", "open_receivers", "expected"),
    [
        (_group(max_receivers=4, sources=AddressRules.from_list(["*"])), "q", False, 3, None),
        (_group(max_receivers=4, sources=AddressRules.from_list(["*"])), "q", False, 4,
         "receiver_limit"),
        (_group(max_receivers=1, allow_dynamic_source=True), None, True, 1, "receiver_limit"),
        # a dynamic source is decided by allowDynamicSource alone, sources not consulted
        (_group(allow_dynamic_source=True), None, True, 0, None),
        (_group(allow_dynamic_source=False, sources=AddressRules.from_list(["*"])), None, True, 0,
         "dynamic_source"),
        (_group(allow_dynamic_source=True), "ignored", True, 0, None),
        (_group(sources=AddressRules.from_patterns(["public.#"])), "public.a.b", False, 0, None),
        (_group(sources=AddressRules.from_patterns(["public.#"])), "private", False, 0, "source"),
        (_group(sources=AddressRules.from_list(["*"])), None, False, 0, "no_source"),
        (_group(sources=AddressRules.from_list(["*"])), "", False, 0, "no_source"),
    ],
)
def test_approve_receiver(group: GroupSettings, source: str | None, dynamic: bool,
                          open_receivers: int, expected: str | None) -> None:
    assert approve_receiver(group, user="alice", source_address=source, dynamic=dynamic,
                            open_receivers=open_receivers) == expected


def test_approve_relay_target() -> None:
    group = _group(targets=AddressRules.from_patterns(["${user}.#", "public"]))
    assert approve_relay_target(group, user="alice", to="alice.x.y") is True
    assert approve_relay_target(group, user="alice", to="public") is True
    assert approve_relay_target(group, user="alice", to="bob.x") is False
    assert approve_relay_target(group, user="alice", to="") is False
    # nothing configured: every relay message is denied (QDR: no targets and no targetPattern means no relay target)
    assert approve_relay_target(_group(allow_anonymous_sender=True), user="a", to="q") is False
