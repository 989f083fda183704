"""Connection limits read from QDR policy files, for the capacity reports. No Spark, no I/O
beyond reading the given files; imports only the standard library and PyYAML.

This is deliberately *not* the policy loader (``amqp_policy_proxy.policy``): the reports need
only the connection-count settings, and must run where the daemon's dependencies are not
installed (a Spark cluster). It reads exactly these keys and ignores everything else:

- vhost: ``hostname`` (or its deprecated synonym ``id``), ``aliases`` (comma-separated string
  or list), ``maxConnections``, ``maxConnectionsPerUser``, ``maxConnectionsPerHost`` (each
  defaulting to QDR's 65535), ``allowUnknownUser`` (default false) and ``groups``;
- group: ``users`` (comma-separated string or list; ``*`` = any user not listed elsewhere),
  ``maxConnectionsPerUser`` and ``maxConnectionsPerHost`` (absent = the vhost's value).

Formats (ARCHITECTURE decision 8): a file or a directory of ``*.json``, ``*.yaml``, ``*.yml``
files (not recursive, sorted by name); JSON files have lines whose first non-blank character is
``#`` removed before parsing (QDR ``policyDir`` files load unchanged). The document is a list
of ``["vhost", {attributes}]`` pairs (other entity types are skipped); a bare list of vhost
attribute objects is accepted too. Top-level vhost keys are converted from ``max-connections``
to ``maxConnections`` as QDR does; keys inside ``groups`` are not.

Validation is limited to what these reports need (the limits are integers 0..65535, a user is
in at most one group of a vhost, a vhost or alias is defined once); ``amqp-policy-proxy check``
is the full validator.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: QDR's default for the three vhost connection limits, and their maximum.
DEFAULT_LIMIT = 65535
#: The group name for unknown users when ``allowUnknownUser`` is true.
DEFAULT_GROUP = "$default"
#: The ``users`` item that catches every user not listed explicitly.
ANY_USER = "*"

_POLICY_SUFFIXES = (".json", ".yaml", ".yml")


class LimitsError(ValueError):
    """A policy file could not be read or has an invalid connection limit."""


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
        """Return the group a user belongs to, in QDR's order (QDR-POLICY 2.5).

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


def strip_comment_lines(text: str) -> str:
    """Remove the lines whose first non-blank character is ``#`` (QDR ``policyDir`` files).

    Args:
        text: the file contents.

    Returns:
        The text with those lines blanked (line numbers in JSON errors stay right).
    """
    return "\n".join("" if line.lstrip().startswith("#") else line
                     for line in text.split("\n"))


def _policy_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path)
                       if n.endswith(_POLICY_SUFFIXES)
                       and os.path.isfile(os.path.join(path, n)))
        if not files:
            raise LimitsError(f"{path}: no *.json, *.yaml or *.yml policy files")
        return files
    if os.path.isfile(path):
        return [path]
    raise LimitsError(f"{path}: no such policy file or directory")


def _parse_file(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LimitsError(f"{path}: {e.strerror or e}") from e
    if path.endswith((".yaml", ".yml")):
        import yaml  # PyYAML: a base dependency; imported lazily so JSON needs nothing

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise LimitsError(f"{path}: invalid YAML: {e}") from e
    try:
        return json.loads(strip_comment_lines(text))
    except json.JSONDecodeError as e:
        raise LimitsError(f"{path}: invalid JSON: {e}") from e


def _camel(key: str) -> str:
    head, *rest = key.split("-")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _limit(where: str, key: str, value: object) -> int:
    if isinstance(value, bool):
        raise LimitsError(f"{where} option '{key}' must be an integer, not {value!r}")
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise LimitsError(f"{where} option '{key}' must be an integer, not {value!r}") from None
    if not 0 <= n <= DEFAULT_LIMIT:
        raise LimitsError(f"{where} option '{key}' value {n} is outside 0..{DEFAULT_LIMIT}")
    return n


def _names(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [item.strip(" ") for item in value.split(",") if item.strip(" ")]
    if isinstance(value, list):
        return [str(item) for item in value]
    raise TypeError(type(value).__name__)


def _bool(value: object) -> bool:
    if isinstance(value, str):
        return value == "true"  # QDR converts only the exact lower-case string
    return bool(value)


def _vhost(where: str, attrs: Mapping[str, object]) -> VhostLimits:
    attrs = {_camel(k): v for k, v in attrs.items()}
    name = attrs.get("hostname", attrs.get("id"))
    if not isinstance(name, str):
        raise LimitsError(f"{where}: a vhost has no 'hostname'")
    where = f"{where}: vhost '{name}'"
    try:
        aliases = tuple(_names(attrs.get("aliases")))
    except TypeError:
        raise LimitsError(f"{where} option 'aliases' must be a string or a list") from None
    groups_in = attrs.get("groups") or {}
    if not isinstance(groups_in, Mapping):
        raise LimitsError(f"{where} option 'groups' must be an object")
    groups: dict[str, GroupLimits] = {}
    owner: dict[str, str] = {}
    for gname, gattrs in groups_in.items():
        gwhere = f"{where} group '{gname}'"
        if not isinstance(gattrs, Mapping):
            raise LimitsError(f"{gwhere} must be an object")
        try:
            users = frozenset(_names(gattrs.get("users")))
        except TypeError:
            raise LimitsError(f"{gwhere} option 'users' must be a string or a list") from None
        for u in users:
            if u in owner:
                raise LimitsError(f"{where} user '{u}' is in multiple user groups "
                                  f"'{owner[u]}' and '{gname}'")
            owner[u] = gname
        per_user = gattrs.get("maxConnectionsPerUser")
        per_host = gattrs.get("maxConnectionsPerHost")
        groups[str(gname)] = GroupLimits(
            name=str(gname), users=users,
            max_connections_per_user=None if per_user is None
            else _limit(gwhere, "maxConnectionsPerUser", per_user),
            max_connections_per_host=None if per_host is None
            else _limit(gwhere, "maxConnectionsPerHost", per_host))
    return VhostLimits(
        hostname=name,
        max_connections=_limit(where, "maxConnections",
                               attrs.get("maxConnections", DEFAULT_LIMIT)),
        max_connections_per_user=_limit(where, "maxConnectionsPerUser",
                                        attrs.get("maxConnectionsPerUser", DEFAULT_LIMIT)),
        max_connections_per_host=_limit(where, "maxConnectionsPerHost",
                                        attrs.get("maxConnectionsPerHost", DEFAULT_LIMIT)),
        allow_unknown_user=_bool(attrs.get("allowUnknownUser", False)),
        aliases=aliases,
        groups=groups,
    )


def _entries(path: str, doc: object) -> Iterable[Mapping[str, object]]:
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise LimitsError(f"{path}: expected a list of [\"vhost\", {{...}}] pairs")
    out = []
    for item in doc:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            if item[0] != "vhost":
                continue  # QDR validates and discards other entity types
            if not isinstance(item[1], Mapping):
                raise LimitsError(f"{path}: vhost attributes must be an object")
            out.append(item[1])
        elif isinstance(item, Mapping):
            out.append(item)
        else:
            raise LimitsError(f"{path}: expected [\"vhost\", {{...}}] pairs, got {item!r:.60}")
    return out


def load_limits(path: str | os.PathLike[str]) -> ConnectionLimits:
    """Read the connection limits of every vhost from a policy file or directory.

    Args:
        path: a policy file (JSON with ``#`` comment lines, or YAML) or a directory of them.

    Returns:
        The limits of every vhost found (possibly none).

    Raises:
        LimitsError: unreadable or unparsable file, a limit that is not an integer in
            0..65535, a user in two groups of one vhost, or a vhost/alias defined twice.
    """
    path = os.fspath(path)
    files = _policy_files(path)
    vhosts: dict[str, VhostLimits] = {}
    names: set[str] = set()
    for f in files:
        for attrs in _entries(f, _parse_file(f)):
            v = _vhost(f, attrs)
            for n in (v.hostname, *v.aliases):
                if n in names:
                    raise LimitsError(f"{f}: vhost or alias '{n}' is defined more than once")
                names.add(n)
            vhosts[v.hostname] = v
    return ConnectionLimits(vhosts=vhosts, sources=tuple(files))
