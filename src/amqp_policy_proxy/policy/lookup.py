"""Sans-IO. Vhost and user-group resolution (QDR's ``PolicyLocal.lookup_vhost_alias`` and
``PolicyLocal.lookup_user``).

* Vhost: exact name, then alias, then (``enable_vhost_name_patterns``) the hostname pattern
  tree, then ``settings.default_vhost`` when non-empty and defined. An absent Open hostname is
  ``""``. Every comparison is case-sensitive.
* Group: the group listing the user, then the group listing ``*``, then ``$default`` when the
  vhost has ``allowUnknownUser``.

No I/O, no clock.
"""

from __future__ import annotations

from typing import NamedTuple

from amqp_policy_proxy.policy.keys import ANY_USER, DEFAULT_GROUP
from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy


class VhostMatch(NamedTuple):
    """How a requested hostname resolved to a vhost (for decisions logs and ``explain``)."""

    vhost: VhostPolicy
    how: str
    """``"exact"``, ``"alias"``, ``"pattern"`` or ``"default"``."""
    via: str
    """The name, alias, pattern or default-vhost name that matched."""


class GroupMatch(NamedTuple):
    """How a user was assigned to a group."""

    group: GroupSettings
    how: str
    """``"user"`` (listed by name), ``"any_user"`` (the ``*`` item) or ``"unknown_user"``
    (``$default`` through ``allowUnknownUser``)."""


def resolve_vhost(policy: Policy, hostname: str | None) -> VhostMatch | None:
    """Resolve an Open hostname to a vhost, saying how (QDR ``lookup_vhost_alias``).

    Args:
        policy: the policy snapshot.
        hostname: the Open ``hostname`` (or the listener's ``policyVhost``); None means ``""``.

    Returns:
        The match, or None when no vhost applies (QDR: "No policy defined for vhost").
    """
    name = hostname or ""
    vhosts = policy.vhosts
    found = vhosts.get(name)
    if found is not None:
        return VhostMatch(found, "exact", name)
    owner = policy.aliases.get(name)
    if owner is not None and owner in vhosts:
        return VhostMatch(vhosts[owner], "alias", name)
    if policy.settings.enable_vhost_name_patterns and policy.hostname_patterns is not None:
        pattern = policy.hostname_patterns.find(name)
        if pattern is not None:
            target = pattern if pattern in vhosts else policy.aliases.get(pattern)
            if target is not None and target in vhosts:
                return VhostMatch(vhosts[target], "pattern", pattern)
    default = policy.settings.default_vhost
    if default and default in vhosts:
        return VhostMatch(vhosts[default], "default", default)
    return None


def lookup_vhost(policy: Policy, hostname: str | None) -> VhostPolicy | None:
    """The vhost that governs a connection asking for ``hostname`` (QDR ``lookup_vhost_alias``).

    Args:
        policy: the policy snapshot.
        hostname: the Open hostname; None is the same as ``""``.

    Returns:
        The vhost, or None when no vhost (and no usable default vhost) applies.
    """
    match = resolve_vhost(policy, hostname)
    return None if match is None else match.vhost


def resolve_group(vhost: VhostPolicy, user: str) -> GroupMatch | None:
    """Assign ``user`` to a group of ``vhost``, saying how (QDR ``lookup_user``).

    Args:
        vhost: the resolved vhost.
        user: the authenticated user name (case-sensitive).

    Returns:
        The match, or None when the user is in no group and unknown users are denied.
    """
    name = vhost.user_groups.get(user)
    if name is not None:
        return GroupMatch(vhost.groups[name], "user")
    name = vhost.user_groups.get(ANY_USER)
    if name is not None:
        return GroupMatch(vhost.groups[name], "any_user")
    if vhost.allow_unknown_user and DEFAULT_GROUP in vhost.groups:
        return GroupMatch(vhost.groups[DEFAULT_GROUP], "unknown_user")
    return None


def lookup_group(vhost: VhostPolicy, user: str) -> GroupSettings | None:
    """The group whose settings apply to ``user`` in ``vhost`` (QDR ``lookup_user``).

    Args:
        vhost: the resolved vhost.
        user: the authenticated user name.

    Returns:
        The listed user's group, else the ``*`` group, else ``$default`` when
        ``allowUnknownUser`` is true; None when the user is denied.
    """
    match = resolve_group(vhost, user)
    return None if match is None else match.group
