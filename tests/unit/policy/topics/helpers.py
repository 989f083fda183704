"""Build a one-vhost policy with topic keys and get a group's TopicAuthorizer."""

from __future__ import annotations

from typing import Any

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import Policy
from amqp_policy_proxy.policy.topics import Principal, TopicAuthorizer

OPEN = {"remoteHosts": "*", "sources": "*", "targets": "*"}
"""QDR keys that let the topic models decide alone."""


def policy(vhost: dict[str, Any], **kw: Any) -> Policy:
    """Compile ``vhost`` (QDR policyDir form) from the pretend file ``topics.json``."""
    return compile_policy([("topics.json", [["vhost", vhost]])], **kw)


def authorizer(pol: Policy, vhost: str, group: str) -> TopicAuthorizer:
    """The group's authorizer (asserting there is one)."""
    topics = pol.vhosts[vhost].groups[group].topics
    assert topics is not None
    return topics


def who(user: str, group: str, subject: str | None = None) -> Principal:
    """A principal."""
    return Principal(user=user, group=group, subject=subject)
