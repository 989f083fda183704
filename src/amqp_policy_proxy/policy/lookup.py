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

from collections.abc import Iterable
from dataclasses import dataclass

from amqp_policy_proxy.limits.addresses import (
    ANY_TOKENS,
    ONE_TOKEN,
    normalise_tokens,
    split_tokens,
)
from amqp_policy_proxy.policy.keys import ANY_USER, DEFAULT_GROUP
from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy


class _Node:
    __slots__ = ("children", "star", "glob", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.glob: _Node | None = None
        self.value: str | None = None

    def child(self, token: str) -> _Node:
        if token == ONE_TOKEN:
            if self.star is None:
                self.star = _Node()
            return self.star
        if token == ANY_TOKENS:
            if self.glob is None:
                self.glob = _Node()
            return self.glob
        node = self.children.get(token)
        if node is None:
            node = self.children[token] = _Node()
        return node


class HostnamePatterns:
    """The vhost hostname pattern tree (QDR ``parse_tree.c``, type ADDRESS).

    Tokens are separated by ``.`` or ``/``; leading separators and one trailing separator are
    ignored; ``*`` matches one token and ``#`` zero or more. When several patterns match, the
    winner is found depth-first with exact tokens before ``*`` before ``#``.
    Built once by :meth:`build`; read-only afterwards.
    """

    __slots__ = ("_root", "_patterns")

    def __init__(self) -> None:
        """An empty tree; use :meth:`build`."""
        self._root = _Node()
        self._patterns: dict[tuple[str, ...], str] = {}

    @classmethod
    def build(cls, patterns: Iterable[str]) -> tuple[HostnamePatterns, list[tuple[str, str]]]:
        """Insert patterns in order.

        Args:
            patterns: vhost names and aliases, in load order.

        Returns:
            The tree and a list of ``(pattern, problem)`` for patterns that were not added:
            ``"empty"`` (no tokens: ``""`` cannot be a pattern) or the text of the earlier
            pattern it normalises to (QDR: "optimized pattern conflicts with existing pattern").
        """
        tree = cls()
        problems: list[tuple[str, str]] = []
        for pattern in patterns:
            tokens = normalise_tokens(split_tokens(pattern))
            if not tokens:
                problems.append((pattern, "empty"))
                continue
            existing = tree._patterns.get(tokens)
            if existing is not None:
                problems.append((pattern, existing))
                continue
            tree._patterns[tokens] = pattern
            node = tree._root
            for token in tokens:
                node = node.child(token)
            node.value = pattern
        return tree, problems

    def find(self, hostname: str) -> str | None:
        """The best pattern matching ``hostname``, as written in the policy, or None."""
        return _find(self._root, split_tokens(hostname), 0)

    def __len__(self) -> int:
        """Number of patterns in the tree."""
        return len(self._patterns)


def _find(node: _Node, tokens: tuple[str, ...], i: int) -> str | None:
    if i == len(tokens):
        if node.value is not None:
            return node.value
        return _find_glob(node.glob, tokens, i) if node.glob is not None else None
    child = node.children.get(tokens[i])
    if child is not None:
        found = _find(child, tokens, i + 1)
        if found is not None:
            return found
    if node.star is not None:
        found = _find(node.star, tokens, i + 1)
        if found is not None:
            return found
    if node.glob is not None:
        return _find_glob(node.glob, tokens, i)
    return None


def _find_glob(glob: _Node, tokens: tuple[str, ...], i: int) -> str | None:
    # '#' consumes zero tokens first, then one more at a time.
    for j in range(i, len(tokens) + 1):
        found = _find(glob, tokens, j)
        if found is not None:
            return found
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class VhostMatch:
    """How a requested hostname resolved to a vhost (for decisions logs and ``explain``)."""

    vhost: VhostPolicy
    how: str
    """``"exact"``, ``"alias"``, ``"pattern"`` or ``"default"``."""
    via: str
    """The name, alias, pattern or default-vhost name that matched."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMatch:
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
        return VhostMatch(vhost=found, how="exact", via=name)
    owner = policy.aliases.get(name)
    if owner is not None and owner in vhosts:
        return VhostMatch(vhost=vhosts[owner], how="alias", via=name)
    if policy.settings.enable_vhost_name_patterns and policy.hostname_patterns is not None:
        pattern = policy.hostname_patterns.find(name)
        if pattern is not None:
            target = pattern if pattern in vhosts else policy.aliases.get(pattern)
            if target is not None and target in vhosts:
                return VhostMatch(vhost=vhosts[target], how="pattern", via=pattern)
    default = policy.settings.default_vhost
    if default and default in vhosts:
        return VhostMatch(vhost=vhosts[default], how="default", via=default)
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
        return GroupMatch(group=vhost.groups[name], how="user")
    name = vhost.user_groups.get(ANY_USER)
    if name is not None:
        return GroupMatch(group=vhost.groups[name], how="any_user")
    if vhost.allow_unknown_user and DEFAULT_GROUP in vhost.groups:
        return GroupMatch(group=vhost.groups[DEFAULT_GROUP], how="unknown_user")
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
