"""Connection limits of a policy, for the capacity reports. No Spark.

:func:`load_limits` loads a policy file or directory with the daemon's own loader
(:func:`amqp_policy_proxy.policy.load.load_policy`, what ``amqp-policy-proxy check`` runs), so
the report accepts exactly the policies ``check`` accepts and refuses the others with the same
messages. From the compiled policy it keeps the connection-count settings the reports need:

- vhost: name, aliases, ``maxConnections``, ``maxConnectionsPerUser``,
  ``maxConnectionsPerHost`` (QDR default 65535), ``allowUnknownUser`` and its groups;
- group: ``users`` (``*`` = any user not listed elsewhere), ``maxConnectionsPerUser`` and
  ``maxConnectionsPerHost`` (absent = the vhost's value).

The dataclasses below are plain Python (standard library only): Spark ships them to the
executors for the what-if replay, which never imports the policy loader (the loader, with
its netaddr and PyYAML dependencies, runs on the driver only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqp_policy_proxy.policy.model import Policy

#: QDR's default for the three vhost connection limits, and their maximum.
DEFAULT_LIMIT = 65535
#: The group name for unknown users when ``allowUnknownUser`` is true.
DEFAULT_GROUP = "$default"
#: The ``users`` item that catches every user not listed explicitly.
ANY_USER = "*"


class LimitsError(ValueError):
    """The policy does not load: ``str()`` is the text ``amqp-policy-proxy check`` prints.

    Attributes:
        issues: the :class:`~amqp_policy_proxy.policy.errors.ConfigIssue` list (errors and
            warnings), empty for an unreadable path.
    """

    def __init__(self, text: str, issues: Sequence[Any] = ()) -> None:
        super().__init__(text)
        self.issues = tuple(issues)


@dataclass(frozen=True)
class GroupLimits:
    """The connection settings of one user group of a vhost."""

    name: str
    """Group name as written in the policy (``$default`` included)."""
    users: frozenset[str]
    """Explicit members; may contain ``*``."""
    max_connections_per_user: int | None = None
    """Override of the vhost's per-user limit; ``None`` = use the vhost's."""
    max_connections_per_host: int | None = None
    """Override of the vhost's per-host limit; ``None`` = use the vhost's."""


@dataclass(frozen=True)
class VhostLimits:
    """The connection settings of one vhost."""

    hostname: str
    """The vhost name (``""`` is a legal vhost name)."""
    max_connections: int = DEFAULT_LIMIT
    """Concurrent connections to the vhost."""
    max_connections_per_user: int = DEFAULT_LIMIT
    """Concurrent connections per user name, unless the user's group overrides it."""
    max_connections_per_host: int = DEFAULT_LIMIT
    """Concurrent connections per remote IP, unless the connecting user's group overrides it."""
    allow_unknown_user: bool = False
    """Users in no group (and not caught by ``*``) go to group ``$default``."""
    aliases: tuple[str, ...] = ()
    """Alternative names of the vhost."""
    groups: Mapping[str, GroupLimits] = field(default_factory=dict)
    """Groups by name."""

    def lookup_group(self, user: str | None) -> str | None:
        """Return the group a user belongs to, in QDR's order (QDR ``lookup_user``).

        Args:
            user: the authenticated user name (exact, case-sensitive); ``None`` matches only
                ``*`` and ``$default``.

        Returns:
            The group listing the user; else the group listing ``*``; else ``$default`` when
            ``allowUnknownUser`` is true and that group exists; else ``None`` (QDR would deny
            the connection).
        """
        star = None
        for g in self.groups.values():
            if user is not None and user in g.users:
                return g.name
            if ANY_USER in g.users and star is None:
                star = g.name
        if star is not None:
            return star
        if self.allow_unknown_user and DEFAULT_GROUP in self.groups:
            return DEFAULT_GROUP
        return None

    def user_limit(self, group: str | None) -> int:
        """Return the per-user connection limit that applies to members of ``group``.

        Args:
            group: a group name, or ``None`` / a name not in this vhost for the vhost value.

        Returns:
            The group's ``maxConnectionsPerUser`` if it sets one, else the vhost's.
        """
        g = self.groups.get(group) if group is not None else None
        if g is not None and g.max_connections_per_user is not None:
            return g.max_connections_per_user
        return self.max_connections_per_user

    def host_limit(self, group: str | None) -> int:
        """Return the per-host connection limit checked when a member of ``group`` connects.

        Args:
            group: a group name, or ``None`` / a name not in this vhost for the vhost value.

        Returns:
            The group's ``maxConnectionsPerHost`` if it sets one, else the vhost's.
        """
        g = self.groups.get(group) if group is not None else None
        if g is not None and g.max_connections_per_host is not None:
            return g.max_connections_per_host
        return self.max_connections_per_host


@dataclass(frozen=True)
class ConnectionLimits:
    """The connection limits of every vhost of a policy."""

    vhosts: Mapping[str, VhostLimits]
    """Vhosts by hostname."""
    sources: tuple[str, ...] = ()
    """The files they were read from, in order."""

    def lookup_vhost(self, name: str | None) -> VhostLimits | None:
        """Return the vhost called ``name``, directly or through an alias (exact match).

        Args:
            name: a vhost name as recorded in the event log.

        Returns:
            The vhost, or ``None`` when neither a vhost nor an alias has that name.
        """
        if name is None:
            return None
        v = self.vhosts.get(name)
        if v is not None:
            return v
        for v in self.vhosts.values():
            if name in v.aliases:
                return v
        return None

    def vhost_rows(self) -> list[tuple[str, str, int, int, int, str | None, str | None]]:
        """Return one row per vhost name and alias, for a Spark lookup table.

        Returns:
            ``(name, vhost, max_connections, max_connections_per_user,
            max_connections_per_host, star_group, unknown_group)`` where ``name`` is the
            hostname or an alias, ``vhost`` the hostname, ``star_group`` the group listing
            ``*`` (or ``None``) and ``unknown_group`` ``$default`` when unknown users are
            allowed and it exists (or ``None``).
        """
        rows = []
        for v in self.vhosts.values():
            star = next((g.name for g in v.groups.values() if ANY_USER in g.users), None)
            unknown = DEFAULT_GROUP if v.allow_unknown_user and DEFAULT_GROUP in v.groups \
                else None
            for name in (v.hostname, *v.aliases):
                rows.append((name, v.hostname, v.max_connections, v.max_connections_per_user,
                             v.max_connections_per_host, star, unknown))
        return rows

    def group_rows(self) -> list[tuple[str, str, int, int, int | None, int | None]]:
        """Return one row per (vhost, group) with its effective limits.

        Returns:
            ``(vhost, group, per_user, per_host, per_user_override, per_host_override)``;
            ``per_user``/``per_host`` are what applies (override or vhost value), the
            ``*_override`` columns are the group's own setting or ``None``.
        """
        return [(v.hostname, g.name, v.user_limit(g.name), v.host_limit(g.name),
                 g.max_connections_per_user, g.max_connections_per_host)
                for v in self.vhosts.values() for g in v.groups.values()]

    def member_rows(self) -> list[tuple[str, str, str]]:
        """Return ``(vhost, user, group)`` for every explicitly listed member (not ``*``)."""
        return [(v.hostname, u, g.name) for v in self.vhosts.values()
                for g in v.groups.values() for u in sorted(g.users) if u != ANY_USER]


def limits_from_policy(policy: Policy) -> ConnectionLimits:
    """Keep the connection limits of a compiled policy.

    Args:
        policy: a policy from :func:`amqp_policy_proxy.policy.load.load_policy`.

    Returns:
        Its vhosts (in load order) with their connection limits, groups and members, and the
        files they came from.
    """
    vhosts = {}
    for name, v in policy.vhosts.items():
        groups = {g.name: GroupLimits(name=g.name, users=frozenset(g.users),
                                      max_connections_per_user=g.max_connections_per_user,
                                      max_connections_per_host=g.max_connections_per_host)
                  for g in v.groups.values()}
        vhosts[name] = VhostLimits(
            hostname=v.hostname, max_connections=v.max_connections,
            max_connections_per_user=v.max_connections_per_user,
            max_connections_per_host=v.max_connections_per_host,
            allow_unknown_user=v.allow_unknown_user, aliases=tuple(v.aliases), groups=groups)
    return ConnectionLimits(vhosts=vhosts, sources=tuple(policy.files))


def load_limits(path: str | os.PathLike[str]) -> ConnectionLimits:
    """Load a policy file or directory exactly as ``amqp-policy-proxy check --policy`` does.

    Args:
        path: a policy file (QDR JSON with ``#`` comment lines, plain JSON or YAML) or a
            directory of them.

    Returns:
        The connection limits of every vhost (:func:`limits_from_policy`).

    Raises:
        LimitsError: see :func:`load_checked_limits`.
    """
    return load_checked_limits(path)[0]


def load_checked_limits(path: str | os.PathLike[str]) -> tuple[ConnectionLimits, str]:
    """:func:`load_limits`, also returning the policy's warnings as ``check`` prints them.

    Host names in ``remoteHosts`` are resolved (as ``check`` does), so a name that does not
    resolve is an error here too.

    Returns:
        ``(limits, warnings)``: ``warnings`` is one ``warning: FILE: KEY PATH: message`` line
        per warning, ``""`` when there is none.

    Raises:
        LimitsError: the policy does not load; ``str()`` is what ``check`` prints, one issue
            per line (``error: FILE: KEY PATH: reason``, then any warnings), and ``issues``
            holds them.
    """
    policy, warnings = load_checked_policy(path)
    return limits_from_policy(policy), warnings


def load_checked_policy(path: str | os.PathLike[str]) -> tuple[Policy, str]:
    """Load the whole compiled policy exactly as ``check`` does (driver only).

    The exact what-if (:mod:`.replay`) needs more than the connection limits: the vhost
    resolution (aliases, patterns, ``defaultVhost``), the groups and their ``remoteHosts``.

    Returns:
        ``(policy, warnings)``, ``warnings`` as for :func:`load_checked_limits`.

    Raises:
        LimitsError: as :func:`load_checked_limits`.
    """
    from amqp_policy_proxy.policy.errors import PolicyError, format_issues
    from amqp_policy_proxy.policy.load import load_policy
    from amqp_policy_proxy.resolver import system_resolver

    path = os.fspath(path)
    try:
        policy = load_policy(path, resolver=system_resolver)
    except PolicyError as exc:
        raise LimitsError(format_issues(exc.issues), exc.issues) from None
    except OSError as exc:  # as check reports it
        raise LimitsError(f"error: {path}: {exc.strerror or exc}") from None
    return policy, format_issues(policy.warnings)
