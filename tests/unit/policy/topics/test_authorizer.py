"""policy/topics/authorizer.py: the models combined, QoS from settle modes, the memo, DDS."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from amqp_policy_proxy.policy.topics import (
    DeliveryDecision,
    Principal,
    TopicAuthorizer,
    TopicDecision,
    qos_of,
)
from amqp_policy_proxy.policy.topics import authorizer as authorizer_module

from .helpers import OPEN, authorizer, policy, who


@pytest.mark.parametrize(("snd", "rcv", "qos"), [
    (1, 0, 0), (1, 1, 0), (1, None, 0),      # settled: at most once
    (0, 0, 1), (0, None, 1),                 # unsettled + first: at least once
    (0, 1, 2), (2, 1, 2), (None, 1, 2),      # rcv-settle-mode second: exactly once
    (2, 0, 1), (None, None, 1), (2, None, 1),  # mixed (the default): at least once
    (7, 9, 1),                               # out of range: read as the defaults
])
def test_qos_of_settle_modes(snd: int | None, rcv: int | None, qos: int) -> None:
    assert qos_of(snd, rcv) == qos


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    decided_by: str


@dataclass
class FakeDds:
    """Stand-in with the shape of ``policy.topics.dds.DdsPermissions``: one grant for alice
    valid in [100, 200], allowing publish under ``sensors/`` and denying the rest."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def check(self, subject: str | None, user: str, activity: str, topic: str,
              wall_now: float) -> Verdict:
        self.calls.append((subject, user, activity, topic, wall_now))
        if user != "alice":
            return Verdict(False, f"dds: no grant for user '{user}'")
        if not 100 <= wall_now <= 200:
            return Verdict(False, "dds grant 'alice' outside validity (not_after 200)")
        if activity == "publish" and topic.startswith("sensors/"):
            return Verdict(True, "dds grant 'alice' allow_rule[1] publish topic 'sensors/*'")
        return Verdict(False, "dds grant 'alice' default DENY")


TREE = {"model": "nearestAcl", "nodes": {"": {"publish": ["*"]}, "locked": {"publish": []}}}
PERMS = [{"topic": "sensors/private/#", "activity": "all", "type": "deny"},
         {"topic": "#", "activity": "all", "type": "allow"}]


def combined(dds: FakeDds | None = None, *, tree: bool = True, perms: bool = True
             ) -> TopicAuthorizer:
    vhost: dict[str, Any] = {"hostname": "v", "groups": {"g": {"users": "*", **OPEN}}}
    if tree:
        vhost["topicTree"] = TREE
    if perms:
        vhost["groups"]["g"]["permissions"] = PERMS
    base = authorizer(policy(vhost), "v", "g") if tree or perms else None
    return TopicAuthorizer(vhost="v", group="g", tree=base.tree if base else None,
                           permissions=base.permissions if base else None, dds=dds)


def test_every_model_must_allow_and_the_first_denial_names_its_model() -> None:
    dds = FakeDds()
    auth = combined(dds)
    alice = who("alice", "g")
    tree_denial = auth.check_publish(alice, "locked/x", qos=1, wall_now=150)
    assert (tree_denial.allowed, tree_denial.model) == (False, "topicTree")
    perm_denial = auth.check_publish(alice, "sensors/private/x", qos=1, wall_now=150)
    assert (perm_denial.allowed, perm_denial.model) == (False, "permissions")
    assert dds.calls == []  # DDS is not consulted once an earlier model denied
    dds_denial = auth.check_publish(alice, "other/x", qos=1, wall_now=150)
    assert dds_denial == TopicDecision(False, "dds grant 'alice' default DENY", "dds")
    allowed = auth.check_publish(alice, "sensors/t1", qos=1, wall_now=150)
    assert allowed.allowed and allowed.model == ""
    assert allowed.decided_by == (
        "topicTree(nearestAcl) node '' (root) defines publish: granted to alice via '*'; "
        "permissions permissions[1] (topic '#', activity all, qos [0, 1, 2], allow) allows "
        "publish 'sensors/t1' at qos 1; dds grant 'alice' allow_rule[1] publish topic "
        "'sensors/*'")


def test_dds_alone_and_its_validity_is_evaluated_at_every_call() -> None:
    dds = FakeDds()
    auth = combined(dds, tree=False, perms=False)
    alice = Principal("alice", "g", "CN=alice")
    assert auth.models == ("dds",)
    inside = auth.check_publish(alice, "sensors/t", qos=1, wall_now=150)
    assert inside.allowed and inside.model == "dds"
    assert inside.decided_by == "dds grant 'alice' allow_rule[1] publish topic 'sensors/*'"
    after = auth.check_publish(alice, "sensors/t", qos=1, wall_now=250)
    assert after == TopicDecision(False, "dds grant 'alice' outside validity (not_after 200)",
                                  "dds")
    assert auth.check_publish(alice, "sensors/t", qos=1, wall_now=150).allowed
    assert dds.calls[0] == ("CN=alice", "alice", "publish", "sensors/t", 150)
    assert len(dds.calls) == 3
    no_grant = auth.check_subscribe(who("bob", "g"), "sensors/t", qos=1, wall_now=150)
    assert no_grant == TopicDecision(False, "dds: no grant for user 'bob'", "dds")


def test_dds_verdict_text_without_prefix_gets_one() -> None:
    class Bare:
        def check(self, *args: Any) -> Verdict:
            return Verdict(False, "outside validity")

    auth = TopicAuthorizer(vhost="v", group="g", dds=Bare())
    assert auth.check_publish(who("u", "g"), "t", qos=1, wall_now=0).decided_by == (
        "dds: outside validity")


def test_single_model_is_named_when_allowed_and_subscribe_flags_pass_through() -> None:
    auth = combined(tree=True, perms=False)
    decision = auth.check_subscribe(who("u", "g"), "a/+", qos=1, wall_now=0)
    assert decision.model == "topicTree" and decision.per_delivery
    auth2 = combined(FakeDds(), tree=True, perms=False)
    # With DDS allowing too, the flags survive.
    dds_ok = TopicAuthorizer(vhost="v", group="g", tree=auth2.tree, dds=type(
        "AllowAll", (), {"check": lambda self, *a: Verdict(True, "dds grant 'x' default ALLOW")})())
    decision = dds_ok.check_subscribe(who("u", "g"), "a/+", qos=1, wall_now=0)
    assert decision.allowed and decision.per_delivery and decision.model == ""


def test_delivery_without_a_tree_is_visible() -> None:
    auth = combined(tree=False, perms=True)
    assert auth.check_delivery(who("u", "g"), "a/#", "a/b", wall_now=0) == DeliveryDecision(
        True, False, "no per-delivery topic model")


def test_memo_is_bounded_and_answers_stay_equal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authorizer_module, "MEMO_SIZE", 8)
    auth = combined()
    u = who("u", "g")
    first = auth.check_publish(u, "x/1", qos=1, wall_now=0)
    assert auth.check_publish(u, "x/1", qos=1, wall_now=0) is first  # memoised
    for i in range(50):
        auth.check_publish(u, f"x/{i}", qos=1, wall_now=0)
        auth.check_delivery(u, "x/#", f"x/{i}", wall_now=0)
    assert len(auth._memo) <= 8
    assert auth.check_publish(u, "x/1", qos=1, wall_now=0) == first
    # The memo is per principal: another user gets their own answer.
    assert not auth.check_publish(who("v", "g"), "locked", qos=1, wall_now=0).allowed


def test_explain_check_returns_each_step() -> None:
    auth = combined()
    decision, steps = auth.explain_check(who("u", "g"), "publish", "sensors/private/x", qos=1,
                                         wall_now=0)
    assert not decision.allowed
    assert [(m, ok) for m, ok, _ in steps] == [("topicTree", True), ("permissions", False)]
    with pytest.raises(ValueError, match="activity"):
        auth.explain_check(who("u", "g"), "persistent", "x", qos=1, wall_now=0)
