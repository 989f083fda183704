"""Sans-IO. Validate parsed policy documents and compile them into a :class:`Policy`.

This is QDR's ``PolicyCompiler`` (``policy_local.py``) with three
differences: every issue is collected (QDR stopped at the first error of a vhost), unknown keys
are errors (QDR warned: a typo must not silently weaken policy), and the documented intent
wins over QDR's quirks (docs/qdr-compatibility.md; the module docstrings of :mod:`amqp_policy_proxy.policy.addresses` and
:mod:`amqp_policy_proxy.ingress.remote_hosts` list them). QDR's error texts are reproduced where
QDR has them.

Input is already parsed (see :mod:`amqp_policy_proxy.policy.load` for files). Host names in
``remoteHosts`` are resolved through the injected ``resolver``; nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from amqp_policy_proxy.ingress.remote_hosts import RemoteHosts, RemoteHostsError, split_spec
from amqp_policy_proxy.policy.addresses import (
    AddressRules,
    multiple_token_message,
    pattern_item_message,
    split_tokens,
)
from amqp_policy_proxy.policy.errors import ERROR, WARNING, ConfigIssue, PolicyError
from amqp_policy_proxy.policy.hostnames import HostnamePatterns
from amqp_policy_proxy.policy.keys import (
    ANY_USER,
    DEFAULT_GROUP,
    GROUP_KEYS,
    LIST_SEPARATOR,
    MIN_MAX_FRAME_SIZE,
    QUARANTINE_DENIALS_MAX,
    QUARANTINE_KEYS,
    QUARANTINE_SECONDS_MAX,
    VHOST_KEYS,
    Enforcement,
    KeySpec,
    Kind,
    hyphen_to_camel,
    suggest,
)
from amqp_policy_proxy.policy.model import (
    GroupSettings,
    Policy,
    PolicySettings,
    Quarantine,
    VhostPolicy,
)
from amqp_policy_proxy.policy.naming import is_management
from amqp_policy_proxy.policy.topics.authorizer import TopicAuthorizer
from amqp_policy_proxy.policy.topics.config import (
    DdsLoadError,
    compile_permissions,
    compile_topic_tree,
    syntax_of,
)

Resolver = Callable[[str], list[str]]
"""Host name -> IP address strings; raises LookupError when the name does not resolve."""

Document = tuple[str | None, Any]
"""``(file name or None, parsed content)``."""

DdsLoader = Callable[[str | None, str, str], tuple[Any, str]]
"""``(policy file or None, permissionsDocument, permissionsCa)`` -> ``(permissions,
fingerprint)``: loads and verifies a vhost's DDS permissions document (paths as written, relative
to the policy file's directory); the fingerprint (e.g. a SHA-256 of the files) joins the policy
digest. Raises :class:`~amqp_policy_proxy.policy.topics.config.DdsLoadError`. The real one is
:func:`amqp_policy_proxy.policy.load.load_dds_permissions` (file I/O)."""

_MISSING: Any = object()


@dataclass(slots=True)
class _Issues:
    """Collects issues for one compile run."""

    items: list[ConfigIssue] = field(default_factory=list)

    def error(self, file: str | None, path: str, message: str) -> None:
        self.items.append(ConfigIssue(file=file, path=path, message=message, severity=ERROR))

    def warning(self, file: str | None, path: str, message: str) -> None:
        self.items.append(ConfigIssue(file=file, path=path, message=message, severity=WARNING))

    def has_errors_since(self, mark: int) -> bool:
        return any(i.is_error for i in self.items[mark:])


@dataclass(slots=True)
class _RawVhost:
    file: str | None
    label: str
    attrs: dict[str, Any]
    fingerprint: str = ""
    """Content fingerprint of files the vhost refers to (DDS documents), for the digest."""


@dataclass(slots=True)
class _Named:
    """A vhost with a usable name, compiled or not (names and aliases are checked anyway)."""

    raw: _RawVhost
    hostname: str
    aliases: list[tuple[int, str]]
    """``(index in the file's aliases list, alias)`` pairs."""
    vhost: VhostPolicy | None


def compile_policy(
    documents: Sequence[Document],
    settings: PolicySettings | None = None,
    *,
    resolver: Resolver | None = None,
    dds_loader: DdsLoader | None = None,
) -> Policy:
    """Validate and compile parsed policy documents.

    Each document is ``(file, content)``; ``content`` is one of:

    * QDR policyDir form: a list of ``[entityType, {attributes}]`` pairs; only ``vhost``
      entries are used, other entity types are ignored with a warning (as QDR's ``policyDir`` loader);
    * a list of vhost attribute mappings;
    * a mapping ``{"vhosts": [ {attributes}, ... ]}``;
    * None (an empty YAML file): no vhosts, one warning.

    Top-level vhost keys written with hyphens are converted to camelCase (``max-connections``);
    keys inside ``groups`` are not (as QDR's loader).

    Args:
        documents: the parsed documents, in load order.
        settings: the global policy settings (defaults: :class:`PolicySettings`).
        resolver: resolves host names in ``remoteHosts`` (once per name per call); without one
            every host name is an error.
        dds_loader: loads DDS ``permissionsDocument`` files (:data:`DdsLoader`); without one a
            vhost with a ``permissionsDocument`` is an error.

    Returns:
        The compiled policy; its ``warnings`` holds the non-fatal issues.

    Raises:
        PolicyError: when there is at least one error; ``issues`` holds every error and
            warning found, each with its file and key path.
    """
    settings = settings if settings is not None else PolicySettings()
    issues = _Issues()
    _check_settings(settings, issues)
    cached = _caching(resolver) if resolver is not None else None

    raw_vhosts: list[_RawVhost] = []
    files: list[str] = []
    for file, content in documents:
        if file is not None and file not in files:
            files.append(file)
        raw_vhosts.extend(_extract_vhosts(file, content, issues))

    names: dict[str, _RawVhost] = {}
    named: list[_Named] = []
    for raw in raw_vhosts:
        hostname, alias_list, vhost = _compile_vhost(raw, settings, cached, issues, dds_loader)
        if hostname is None:
            continue
        first = names.get(hostname)
        if first is not None:
            where = f" (first defined in {first.file})" if first.file else ""
            issues.error(raw.file, raw.label, f"vhost '{hostname}' is defined more than once{where}")
            continue
        names[hostname] = raw
        named.append(_Named(raw=raw, hostname=hostname, aliases=alias_list, vhost=vhost))

    aliases = _check_aliases(named, issues)
    patterns = None
    if settings.enable_vhost_name_patterns:
        patterns = _build_patterns(named, issues)
    compiled = [(n.raw, n.vhost) for n in named if n.vhost is not None]

    if any(i.is_error for i in issues.items):
        raise PolicyError(issues.items)

    canonical = json.dumps(
        sorted(([v.hostname, raw.attrs, *([raw.fingerprint] if raw.fingerprint else [])]
                for raw, v in compiled), key=lambda x: x[0]),
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return Policy(
        settings=settings,
        vhosts=MappingProxyType({v.hostname: v for _, v in compiled}),
        digest=hashlib.sha256(canonical.encode()).hexdigest()[:12],
        files=tuple(files),
        warnings=tuple(issues.items),
        aliases=MappingProxyType(aliases),
        hostname_patterns=patterns,
    )


# ---------------------------------------------------------------------------- documents


def _extract_vhosts(file: str | None, content: Any, issues: _Issues) -> list[_RawVhost]:
    out: list[_RawVhost] = []
    if content is None:
        issues.warning(file, "", "the file defines no vhosts")
        return out
    if isinstance(content, Mapping):
        for key in content:
            if key != "vhosts":
                issues.error(file, str(key),
                             f"unknown top-level key '{key}' (expected 'vhosts')")
        entries = content.get("vhosts", _MISSING)
        if entries is _MISSING:
            if not content:
                issues.warning(file, "", "the file defines no vhosts")
            return out
        if not isinstance(entries, list):
            issues.error(file, "vhosts", "must be a list of vhost mappings")
            return out
        for i, attrs in enumerate(entries):
            if isinstance(attrs, Mapping):
                out.append(_raw_vhost(file, f"vhosts[{i}]", attrs))
            else:
                issues.error(file, f"vhosts[{i}]", "must be a mapping of vhost attributes")
        return out
    if not isinstance(content, list):
        issues.error(
            file, "",
            "expected a list of [\"vhost\", {...}] pairs, a list of vhost mappings "
            "or a mapping with a 'vhosts' list",
        )
        return out
    for i, entry in enumerate(content):
        if isinstance(entry, Mapping):
            out.append(_raw_vhost(file, f"[{i}]", entry))
        elif (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], Mapping)
        ):
            kind, attrs = entry
            if kind == "vhost":
                out.append(_raw_vhost(file, f"[{i}]", attrs))
            else:
                issues.warning(file, f"[{i}]",
                               f"entity type '{kind}' is ignored: only 'vhost' entries are used "
                               "(global settings come from the daemon configuration)")
        else:
            issues.error(file, f"[{i}]",
                         "expected a [\"vhost\", {...}] pair or a mapping of vhost attributes")
    return out


def _raw_vhost(file: str | None, position: str, attrs: Mapping[Any, Any]) -> _RawVhost:
    converted: dict[str, Any] = {}
    for key, value in attrs.items():
        converted[hyphen_to_camel(key) if isinstance(key, str) else key] = value
    name = converted.get("hostname", converted.get("id"))
    label = f"vhost[{name}]" if isinstance(name, str) else position
    return _RawVhost(file=file, label=label, attrs=converted)


# ---------------------------------------------------------------------------- vhosts


def _compile_vhost(
    raw: _RawVhost,
    settings: PolicySettings,
    resolver: Resolver | None,
    issues: _Issues,
    dds_loader: DdsLoader | None = None,
) -> tuple[str | None, list[tuple[int, str]], VhostPolicy | None]:
    """Returns ``(hostname, aliases, vhost)``; vhost is None when the vhost has errors."""
    file, label, attrs = raw.file, raw.label, raw.attrs
    mark = len(issues.items)

    hostname = attrs.get("hostname", _MISSING)
    old_id = attrs.get("id", _MISSING)
    if hostname is not _MISSING and old_id is not _MISSING:
        issues.error(file, f"{label}.id",
                     "giving both 'id' and 'hostname' is an error; use 'hostname'")
    elif hostname is _MISSING and old_id is not _MISSING:
        hostname = old_id
    if hostname is _MISSING:
        issues.error(file, f"{label}.hostname", "required attribute 'hostname' is missing")
        hostname = None
    elif not isinstance(hostname, str):
        issues.error(file, f"{label}.hostname", f"must be a string, not {_show(hostname)}")
        hostname = None
    v = hostname if hostname is not None else "?"

    values: dict[str, Any] = {}
    present: set[str] = set()
    for key, value in attrs.items():
        path = f"{label}.{key}"
        spec = VHOST_KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            issues.error(file, path, _unknown_key_message(str(key), VHOST_KEYS, GROUP_KEYS,
                                                          f"Policy vhost '{v}'"))
            continue
        present.add(spec.camel)
        if spec.kind is Kind.TOPICS:
            continue  # compiled with the groups, below
        if not spec.enforced:
            if spec.camel == "id":
                issues.warning(file, path, "'id' is a deprecated synonym of 'hostname'")
            else:
                issues.warning(file, path, f"'{key}' is management metadata and is ignored")
            continue
        if spec.kind is Kind.NAME:
            continue
        if spec.kind is Kind.INT:
            values[spec.snake] = _int_option(value, spec, f"Policy vhost '{v}' option '{key}'",
                                             file, path, issues)
        elif spec.kind is Kind.BOOL:
            values[spec.snake] = _bool_option(value, f"Policy vhost '{v}' option '{key}'",
                                              file, path, issues)
        elif spec.kind is Kind.LIST:
            values[spec.snake] = _aliases(value, v, file, path, issues)
        elif spec.kind is Kind.CHOICE:
            values[spec.snake] = _choice_option(value, spec, f"Policy vhost '{v}' option "
                                                f"'{key}'", file, path, issues)
        elif spec.kind is Kind.QUARANTINE:
            values[spec.snake] = _quarantine_option(value, v, file, path, issues)
        elif spec.kind is Kind.GROUPS and not isinstance(value, Mapping):
            issues.error(file, path, f"Policy vhost '{v}' option '{key}' must be of type 'dict' "
                                     f"but is '{_type_name(value)}'")

    vhost_mms = values.get("max_message_size", _MISSING)
    enforcement = Enforcement(values.get("enforcement") or Enforcement.ENFORCE)
    groups: dict[str, GroupSettings] = {}
    raw_groups = attrs.get("groups")
    if isinstance(raw_groups, Mapping):
        for gname, gattrs in raw_groups.items():
            gpath = f"{label}.groups.{gname}"
            if not isinstance(gname, str):
                issues.error(file, gpath, "group names must be strings")
                continue
            if not isinstance(gattrs, Mapping):
                issues.error(file, gpath, f"Policy vhost '{v}' user group '{gname}' settings "
                                          f"must be a mapping, not {_type_name(gattrs)}")
                continue
            group = _compile_group(v, gname, gattrs, file, gpath, settings, vhost_mms,
                                   resolver, issues, enforcement)
            if group is not None:
                groups[gname] = group

    user_groups = _user_groups(v, label, raw_groups, groups, file, issues)
    groups = _compile_topics(raw, v, raw_groups, groups, dds_loader, issues)
    groups = _resolve_connection_rates(raw, values, groups, issues)

    allow_unknown = values.get("allow_unknown_user")
    if allow_unknown and DEFAULT_GROUP not in (raw_groups or {}):
        issues.error(file, f"{label}.allowUnknownUser",
                     f"Policy vhost '{v}' allows connections by default but default settings "
                     "are not defined")

    alias_list: list[tuple[int, str]] = values.get("aliases") or []
    if hostname is None or issues.has_errors_since(mark):
        return hostname, alias_list, None
    if vhost_mms is _MISSING:
        vhost_mms = settings.max_message_size
    return hostname, alias_list, VhostPolicy(
        hostname=hostname,
        aliases=tuple(alias for _, alias in alias_list),
        max_connections=values.get("max_connections", VHOST_KEYS["maxConnections"].default),
        max_connections_per_user=values.get(
            "max_connections_per_user", VHOST_KEYS["maxConnectionsPerUser"].default),
        max_connections_per_host=values.get(
            "max_connections_per_host", VHOST_KEYS["maxConnectionsPerHost"].default),
        max_connection_rate=values.get("max_connection_rate") or None,
        max_connection_rate_per_user=values.get("max_connection_rate_per_user") or None,
        max_connection_rate_per_host=values.get("max_connection_rate_per_host") or None,
        connection_rate_burst=values.get("connection_rate_burst"),
        allow_unknown_user=bool(allow_unknown),
        max_message_size=vhost_mms or None,
        groups=MappingProxyType(groups),
        user_groups=MappingProxyType(user_groups),
        source_file=file,
        enforcement=enforcement,
        quarantine=values.get("quarantine"),
        raw=_freeze(attrs),
    )


def _resolve_connection_rates(
    raw: _RawVhost, values: Mapping[str, Any], groups: dict[str, GroupSettings], issues: _Issues
) -> dict[str, GroupSettings]:
    """Each group's per-user and per-host connection rates: the group's key if present (0 =
    unlimited), else the vhost's (docs/policy.md "Rate limits"), as for the count limits.

    Warns about a ``connectionRateBurst`` that no connection-rate key uses.
    """
    out = {}
    keys = ("max_connection_rate_per_user", "max_connection_rate_per_host")

    def rate(own: int | None, snake: str) -> int | None:
        return (values.get(snake) or None) if own is None else (own or None)

    for name, group in groups.items():
        out[name] = replace(
            group,
            max_connection_rate_per_user=rate(group.max_connection_rate_per_user, keys[0]),
            max_connection_rate_per_host=rate(group.max_connection_rate_per_host, keys[1]),
        )
    raw_groups = raw.attrs.get("groups")
    group_attrs = raw_groups.values() if isinstance(raw_groups, Mapping) else ()
    limited = values.get("max_connection_rate") or any(getattr(g, k) for g in out.values()
                                                       for k in keys) or any(
        a.get(k) not in (None, 0, "0") for a in group_attrs if isinstance(a, Mapping)
        for k in ("maxConnectionRatePerUser", "maxConnectionRatePerHost"))
    if values.get("connection_rate_burst") is not None and not limited:
        issues.warning(raw.file, f"{raw.label}.connectionRateBurst",
                       "connectionRateBurst has no effect: the vhost and its groups set no "
                       "maxConnectionRate, maxConnectionRatePerUser or maxConnectionRatePerHost")
    return out


def _aliases(
    value: Any, v: str, file: str | None, path: str, issues: _Issues
) -> list[tuple[int, str]]:
    items = _list_items(value, f"Policy vhost '{v}' option 'aliases'", file, path, issues)
    out: list[tuple[int, str]] = []
    seen: set[str] = set()
    for i, item in items:
        if not item:
            continue
        if item == v:
            issues.error(file, f"{path}[{i}]",
                         f"Policy vhost '{v}' option 'aliases' value '{item}' duplicates vhost name")
        elif item in seen:
            issues.error(file, f"{path}[{i}]",
                         f"Policy vhost '{v}' option 'aliases' value '{item}' is duplicated")
        else:
            seen.add(item)
            out.append((i, item))
    return out


def _user_groups(
    v: str,
    label: str,
    raw_groups: Any,
    groups: Mapping[str, GroupSettings],
    file: str | None,
    issues: _Issues,
) -> dict[str, str]:
    """user -> group; QDR: each user name may appear in only one group.

    Unlike QDR, a group without ``users`` has no members (QDR recorded the user ``""``, so two
    groups without users clashed: docs/qdr-compatibility.md).
    """
    owner: dict[str, str] = {}
    if not isinstance(raw_groups, Mapping):
        return owner
    for gname, gattrs in raw_groups.items():
        if not isinstance(gname, str) or not isinstance(gattrs, Mapping):
            continue
        users = gattrs.get("users", _MISSING)
        if users is _MISSING or not isinstance(users, str | list):
            continue
        path = f"{label}.groups.{gname}.users"
        for i, user in _list_items(users, "", file, path, None):
            if not user:
                continue
            first = owner.get(user)
            if first is None:
                owner[user] = gname
            elif first != gname:
                issues.error(file, f"{path}[{i}]",
                             f"Policy vhost '{v}' user '{user}' is in multiple user groups "
                             f"'{first}' and '{gname}'")
    return {u: g for u, g in owner.items() if g in groups}


# ---------------------------------------------------------------------------- groups


def _compile_group(
    v: str,
    g: str,
    attrs: Mapping[Any, Any],
    file: str | None,
    gpath: str,
    settings: PolicySettings,
    vhost_mms: Any,
    resolver: Resolver | None,
    issues: _Issues,
    vhost_enforcement: Enforcement = Enforcement.ENFORCE,
) -> GroupSettings | None:
    mark = len(issues.items)
    prefix = f"Policy vhost '{v}' user group '{g}'"
    values: dict[str, Any] = {}
    address_items: dict[str, list[tuple[int, str]]] = {}
    remote_hosts = RemoteHosts()
    has_remote_hosts = False

    for key, value in attrs.items():
        path = f"{gpath}.{key}"
        spec = GROUP_KEYS.get(key) if isinstance(key, str) else None
        if spec is None:
            issues.error(file, path, _unknown_key_message(str(key), GROUP_KEYS, VHOST_KEYS,
                                                          prefix))
            continue
        option = f"{prefix} option '{key}'"
        if spec.kind is Kind.TOPICS:
            continue  # compiled by _compile_topics, which needs the whole vhost
        if not spec.enforced:
            issues.warning(file, path, f"'{key}' is accepted for QDR compatibility but is not "
                                       "enforced by the proxy")
        if spec.kind is Kind.INT:
            values[spec.snake] = _int_option(value, spec, option, file, path, issues)
        elif spec.kind is Kind.BOOL:
            values[spec.snake] = _bool_option(value, option, file, path, issues, group=True)
        elif spec.kind is Kind.LIST:
            values[spec.snake] = frozenset(
                item for _, item in _list_items(value, option, file, path, issues) if item)
        elif spec.kind is Kind.CHOICE:
            values[spec.snake] = _choice_option(value, spec, option, file, path, issues)
        elif spec.kind is Kind.HOSTS:
            has_remote_hosts = True
            remote_hosts = _remote_hosts(value, prefix, file, path, resolver, issues)
        elif spec.kind in (Kind.ADDRESSES, Kind.PATTERNS):
            items = _list_items(value, option, file, path, issues)
            for i, item in items:
                problem = (pattern_item_message(item) if spec.kind is Kind.PATTERNS
                           else multiple_token_message(item))
                if problem:
                    issues.error(file, f"{path}[{i}]", f"{prefix} policy key '{key}' {problem}")
                if _covers_router_internals(item, spec.kind is Kind.PATTERNS):
                    issues.warning(file, f"{path}[{i}]",
                                   f"{prefix} policy key '{key}' item '{item}' would match "
                                   "router-internal addresses ($management and other $ "
                                   "names, _local/, _topo/, _edge/); the proxy allows those only by an "
                                   "item that names them literally (docs/qdr-compatibility.md)")
                for unknown in _UNKNOWN_PLACEHOLDER.findall(item):
                    issues.error(file, f"{path}[{i}]",
                                 f"{prefix} policy key '{key}' item '{item}' holds unknown "
                                 f"placeholder '{unknown}': only '${{user}}' is substituted "
                                 "(QDR would match it literally)")
            address_items[key] = items

    for plain, pattern in (("sources", "sourcePattern"), ("targets", "targetPattern")):
        if plain in attrs and pattern in attrs:
            issues.error(file, gpath,
                         f"{prefix} specifies conflicting '{plain}' and '{pattern}' attributes. "
                         "Use only one or the other.")

    frame = values.get("max_frame_size")
    window = values.get("max_session_window")
    if isinstance(frame, int) and 0 < frame < MIN_MAX_FRAME_SIZE:
        issues.warning(file, f"{gpath}.maxFrameSize",
                       f"maxFrameSize {frame} is below the AMQP minimum {MIN_MAX_FRAME_SIZE}; "
                       f"{MIN_MAX_FRAME_SIZE} is used")
        values["max_frame_size"] = frame = MIN_MAX_FRAME_SIZE
    if isinstance(frame, int) and isinstance(window, int) and 0 < window < frame:
        # QDR loads such a group (its own system tests use maxFrameSize 222222 with
        # maxSessionWindow 9999). The session window toward the client is
        # max(1, maxSessionWindow // max-frame-size) frames, computed per connection once the
        # router's max-frame-size is known: here that is 1 frame.
        issues.warning(file, f"{gpath}.maxSessionWindow",
                       f"maxSessionWindow {window} is smaller than maxFrameSize {frame}: "
                       "the session window becomes 1 frame")

    if not has_remote_hosts:
        issues.warning(file, gpath, "no remoteHosts: every connection in this group is denied "
                                    "(as in QDR; use '*' to allow any host)")

    if issues.has_errors_since(mark):
        return None

    # QDR's lookup_settings: group key if present (even 0), else vhost key, else global; 0 = none.
    mms = values.get("max_message_size", _MISSING)
    if mms is _MISSING:
        mms = vhost_mms if vhost_mms is not _MISSING else settings.max_message_size

    def limit(snake: str) -> int | None:
        return values.get(snake) or None

    return GroupSettings(
        name=g,
        users=values.get("users", frozenset()),
        remote_hosts=remote_hosts,
        max_connections_per_user=values.get("max_connections_per_user"),
        max_connections_per_host=values.get("max_connections_per_host"),
        # overrides, None when absent (0 = unlimited): resolved against the vhost afterwards
        max_connection_rate_per_user=values.get("max_connection_rate_per_user"),
        max_connection_rate_per_host=values.get("max_connection_rate_per_host"),
        max_message_rate_per_user=limit("max_message_rate_per_user"),
        max_byte_rate_per_user=limit("max_byte_rate_per_user"),
        max_connection_lifetime_seconds=limit("max_connection_lifetime_seconds"),
        max_frame_size=limit("max_frame_size"),
        max_sessions=limit("max_sessions"),
        max_session_window=limit("max_session_window"),
        max_message_size=mms or None,
        max_senders=values.get("max_senders", GROUP_KEYS["maxSenders"].default) or None,
        max_receivers=values.get("max_receivers", GROUP_KEYS["maxReceivers"].default) or None,
        allow_dynamic_source=values.get("allow_dynamic_source", False),
        allow_anonymous_sender=values.get("allow_anonymous_sender", False),
        allow_user_id_proxy=values.get("allow_user_id_proxy", False),
        allow_router_annotations=values.get("allow_router_annotations", False),
        sources=_rules(address_items, "sources", "sourcePattern"),
        targets=_rules(address_items, "targets", "targetPattern"),
        allow_waypoint_links=values.get("allow_waypoint_links", True),
        allow_fallback_links=values.get("allow_fallback_links", True),
        allow_dynamic_link_routes=values.get("allow_dynamic_link_routes", True),
        allow_admin_status_update=values.get("allow_admin_status_update", True),
        # the group's own key, else the vhost's (as maxMessageSize: group -> vhost)
        enforcement=Enforcement(values.get("enforcement") or vhost_enforcement),
    )


_UNKNOWN_PLACEHOLDER = re.compile(r"\$\{(?!user\})[^}]*\}")
"""A ``${...}`` other than ``${user}`` in a sources/targets item: a typo (``${usr}``) that
QDR would keep as literal text, so the rule would silently match nothing."""


_INTERNAL_PREFIXES = ("$", "_local/", "_topo/", "_edge/")


def _covers_router_internals(item: str, pattern: bool) -> bool:
    """Whether the wildcard ``item`` is aimed at router-internal addresses (``$*``, ``_*``,
    ``_local.#``: ``check``'s warning, since the proxy never lets a wildcard grant one,
    decision 0007). A bare ``*`` or ``#`` is not warned about: it is in most QDR files, and
    docs/qdr-compatibility.md says it grants no router-internal address."""
    if pattern:
        tokens = split_tokens(item)
        if not tokens or not any(t in ("*", "#") for t in tokens):
            return False
        first = tokens[0]
        return first in ("_local", "_topo", "_edge") or (first.startswith("$")
                                                         and not first.startswith("${"))
    if not item.endswith("*") or item == "*":
        return False
    stem = item[:-1]
    if stem.startswith("${"):
        return False  # ${user}...: the user's own names
    return any(p.startswith(stem) or stem.startswith(p) for p in _INTERNAL_PREFIXES)


def _rules(items: Mapping[str, list[tuple[int, str]]], plain: str, pattern: str) -> AddressRules:
    if pattern in items and any(item for _, item in items[pattern]):
        return AddressRules.from_patterns(item for _, item in items[pattern])
    if plain in items:
        return AddressRules.from_list(item for _, item in items[plain])
    return AddressRules.deny_all()


def _remote_hosts(
    value: Any,
    prefix: str,
    file: str | None,
    path: str,
    resolver: Resolver | None,
    issues: _Issues,
) -> RemoteHosts:
    option = f"{prefix} option 'remoteHosts'"
    if not isinstance(value, str | list):
        issues.error(file, path, f"{option} has illegal value '{_show(value)}'. Type must be "
                                 f"'str' or 'list' but is '{_type_name(value)}'")
        return RemoteHosts()
    if isinstance(value, list):
        bad = [i for i, item in enumerate(value) if not isinstance(item, str)]
        for i in bad:
            issues.error(file, f"{path}[{i}]", f"{option} item {_show(value[i])} must be a string")
        if bad:
            return RemoteHosts()
    items = split_spec(value)
    try:
        return RemoteHosts.parse(items, resolver=resolver)
    except RemoteHostsError as exc:
        for index, message in exc.problems:
            issues.error(file, f"{path}[{index}]",
                         f"{option} connectionOption '{items[index]}' failed to translate: "
                         f"'{message}'.")
    return RemoteHosts()


# ---------------------------------------------------------------------------- topics


def _compile_topics(
    raw: _RawVhost,
    v: str,
    raw_groups: Any,
    groups: dict[str, GroupSettings],
    dds_loader: DdsLoader | None,
    issues: _Issues,
) -> dict[str, GroupSettings]:
    """Topic authorization (docs/topic-authorization.md): ``topicTree``, DDS, per-group ``permissions``.

    Returns the groups, each with ``topics`` set when a model applies to it.
    """
    file, label, attrs = raw.file, raw.label, raw.attrs
    group_maps = raw_groups if isinstance(raw_groups, Mapping) else {}
    members = {
        name: (groups[name].users - {ANY_USER}) if name in groups else frozenset()
        for name in group_maps if isinstance(name, str)
    }

    def report(found: Iterable[tuple[str, str, str]], base: str) -> None:
        for severity, path, message in found:
            if severity == ERROR:
                issues.error(file, f"{base}{path}", message)
            else:
                issues.warning(file, f"{base}{path}", message)

    tree = None
    raw_tree = attrs.get("topicTree")
    if "topicTree" in attrs:
        tree, found = compile_topic_tree(raw_tree, groups=members)
        report(found, f"{label}.topicTree")
    syntax = syntax_of(raw_tree)

    dds = _load_dds(raw, dds_loader, issues)

    out = dict(groups)
    for name, gattrs in group_maps.items():
        if not isinstance(name, str) or not isinstance(gattrs, Mapping):
            continue  # reported by the group compiler
        permissions, found = compile_permissions(
            gattrs.get("permissions"), gattrs.get("defaultBehaviour"),
            has_rules="permissions" in gattrs, has_default="defaultBehaviour" in gattrs,
            syntax=syntax)
        report(found, f"{label}.groups.{name}")
        group = groups.get(name)
        if group is not None and (tree is not None or dds is not None or permissions is not None):
            out[name] = replace(group, topics=TopicAuthorizer(
                vhost=v, group=name, tree=tree, permissions=permissions, dds=dds))
    declared = _declared_prefixes(tree)
    if declared:
        out = {name: replace(group, declared_prefixes=declared) for name, group in out.items()}
    return out


def _declared_prefixes(tree: Any) -> tuple[str, ...]:
    """The ``$`` trees a vhost's topic tree declares in ``systemPrefixes`` (e.g. ``$SYS``),
    joined with its separator: broker topics, granted by ``sources``/``targets`` like any
    address (decision 0007). ``$management`` is never one."""
    if tree is None:
        return ()
    joined = (tree.syntax.join(prefix) for prefix in tree.system_prefixes)
    return tuple(p for p in joined if p.startswith("$") and not is_management(p))


def _load_dds(raw: _RawVhost, dds_loader: DdsLoader | None, issues: _Issues) -> Any:
    file, label, attrs = raw.file, raw.label, raw.attrs
    document = attrs.get("permissionsDocument", _MISSING)
    ca = attrs.get("permissionsCa", _MISSING)
    doc_path, ca_path = f"{label}.permissionsDocument", f"{label}.permissionsCa"
    usable = True
    for value, path, key in ((document, doc_path, "permissionsDocument"),
                             (ca, ca_path, "permissionsCa")):
        if value is not _MISSING and (not isinstance(value, str) or not value):
            issues.error(file, path, f"{key} must be a non-empty file path, not {_show(value)}")
            usable = False
    if document is _MISSING:
        if ca is not _MISSING:
            issues.error(file, ca_path, "permissionsCa without permissionsDocument has no effect")
        return None
    if ca is _MISSING:
        issues.error(file, doc_path, "permissionsDocument needs permissionsCa: the CA "
                                     "certificate (PEM) that signed the document")
        return None
    if not usable:
        return None
    if dds_loader is None:
        issues.error(file, doc_path, "cannot load DDS permissions documents here (no loader: "
                                     "load the policy from files)")
        return None
    try:
        permissions, fingerprint = dds_loader(file, document, ca)
    except DdsLoadError as exc:
        issues.error(file, doc_path, f"cannot load DDS permissions document '{document}': "
                                     f"{exc.reason}")
        return None
    raw.fingerprint = fingerprint
    return permissions


# ---------------------------------------------------------------------------- values


def _int_option(
    value: Any, spec: KeySpec, option: str, file: str | None, path: str, issues: _Issues
) -> int | None:
    error = None
    number: int | None = None
    if isinstance(value, bool) or value is None:
        error = f"Value '{_show(value)}' does not resolve to an integer."
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip(), 10)
        except ValueError:
            error = f"Value '{value}' does not resolve to an integer."
    else:
        error = f"Value '{_show(value)}' does not resolve to an integer."
    if number is not None:
        if spec.minimum is not None and number < spec.minimum:
            error = f"Value '{_show(value)}' is below minimum '{spec.minimum}'."
        elif spec.maximum is not None and number > spec.maximum:
            error = f"Value '{_show(value)}' is above maximum '{spec.maximum}'."
    if error is not None:
        issues.error(file, path, f"{option} has error '{error}'.")
        return None
    return number


def _quarantine_option(
    value: Any, v: str, file: str | None, path: str, issues: _Issues
) -> Quarantine | None:
    """A vhost's ``quarantine`` object; None (every problem reported at its key path)."""
    option = f"Policy vhost '{v}' option 'quarantine'"
    if not isinstance(value, Mapping):
        issues.error(file, path, f"{option} must be an object "
                                 '{"denials": N, "withinSeconds": S, "banSeconds": B}, not '
                                 f"{_type_name(value)}")
        return None
    ok = True
    for key in value:
        if key not in QUARANTINE_KEYS:
            guess = suggest(str(key), dict.fromkeys(QUARANTINE_KEYS))
            issues.error(file, f"{path}.{key}", f"{option} has no key '{key}'"
                         + (f"; did you mean '{guess}'?" if guess else
                            f" (keys: {', '.join(QUARANTINE_KEYS)})"))
            ok = False
    numbers: dict[str, float] = {}
    for key in QUARANTINE_KEYS:
        if key not in value:
            issues.error(file, path, f"{option} is missing '{key}' (keys: "
                                     f"{', '.join(QUARANTINE_KEYS)}, all required)")
            ok = False
            continue
        item = value[key]
        whole = key == "denials"
        top = QUARANTINE_DENIALS_MAX if whole else QUARANTINE_SECONDS_MAX
        kind_ok = (isinstance(item, int) if whole else isinstance(item, int | float)) \
            and not isinstance(item, bool)
        if not kind_ok:
            what = "an integer" if whole else "a number of seconds"
            issues.error(file, f"{path}.{key}", f"{option} '{key}' must be {what}, not "
                                                f"{_type_name(item)} '{_show(item)}'")
            ok = False
        elif whole and not 1 <= item <= top:
            issues.error(file, f"{path}.{key}", f"{option} 'denials' must be from 1 to {top}, "
                                                f"not {item}")
            ok = False
        elif not whole and not (0 < item <= top and math.isfinite(item)):
            issues.error(file, f"{path}.{key}", f"{option} '{key}' must be more than 0 and at "
                                                f"most {top} seconds, not {_show(item)}")
            ok = False
        else:
            numbers[key] = item
    if not ok:
        return None
    return Quarantine(int(numbers["denials"]), float(numbers["withinSeconds"]),
                      float(numbers["banSeconds"]))


def _choice_option(
    value: Any, spec: KeySpec, option: str, file: str | None, path: str, issues: _Issues
) -> str | None:
    """One of ``spec.choices`` (exact, lowercase); None (reported) otherwise."""
    if isinstance(value, str) and value in spec.choices:
        return value
    allowed = " or ".join(f"'{c}'" for c in spec.choices)
    hint = ""
    if isinstance(value, str) and value.strip().lower() in spec.choices:
        hint = f" (write '{value.strip().lower()}')"
    issues.error(file, path, f"{option} has illegal value '{_show(value)}': must be "
                             f"{allowed}{hint}")
    return None


def _bool_option(
    value: Any, option: str, file: str | None, path: str, issues: _Issues, *, group: bool = False
) -> bool | None:
    if isinstance(value, bool):
        return value
    if value == "true":
        return True
    if value == "false":
        return False
    hint = ""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        hint = (" Write true or false (JSON boolean or lowercase string);"
                f" QDR would silently read '{value}' as false.")
    if group:
        issues.error(file, path, f"{option} has illegal boolean value '{_show(value)}'.{hint}")
    else:
        issues.error(file, path,
                     f"{option} must be of type 'bool' but is '{_type_name(value)}'.{hint}")
    return None


def _list_items(
    value: Any, option: str, file: str | None, path: str, issues: _Issues | None
) -> list[tuple[int, str]]:
    """(index, trimmed item) pairs of a CSV string or list value; bad values reported."""
    if isinstance(value, str):
        return [(i, x.strip(" ")) for i, x in enumerate(value.split(LIST_SEPARATOR))]
    if isinstance(value, list):
        out: list[tuple[int, str]] = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append((i, item.strip(" ")))
            elif issues is not None:
                issues.error(file, f"{path}[{i}]", f"{option} item {_show(item)} must be a string")
        return out
    if issues is not None:
        issues.error(file, path, f"{option} has illegal value '{_show(value)}'. Type must be "
                                 f"'str' or 'list' but is '{_type_name(value)}'")
    return []


def _unknown_key_message(
    key: str, here: Mapping[str, KeySpec], elsewhere: Mapping[str, KeySpec], prefix: str
) -> str:
    message = (f"{prefix} option '{key}' is not a known option (QDR ignores unknown options; "
               "the proxy rejects them)")
    camel = hyphen_to_camel(key)
    if camel != key and camel in here:
        return f"{message}; did you mean '{camel}'?"
    if key in elsewhere:
        level = "group" if elsewhere is GROUP_KEYS else "vhost"
        return f"{message}; '{key}' is a {level}-level option"
    guess = suggest(key, here)
    return f"{message}; did you mean '{guess}'?" if guess else message


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _type_name(value: Any) -> str:
    return {dict: "dict", list: "list", str: "str", int: "int", float: "float", bool: "bool",
            type(None): "null"}.get(type(value), type(value).__name__)


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


# ---------------------------------------------------------------------------- cross-vhost


def _check_aliases(named: Sequence[_Named], issues: _Issues) -> dict[str, str]:
    """Alias -> vhost, with QDR's conflict errors (``PolicyLocal.create_ruleset``)."""
    names = {n.hostname for n in named}
    owner: dict[str, str] = {}
    for n in named:
        for i, alias in n.aliases:
            path = f"{n.raw.label}.aliases[{i}]"
            if alias in names:
                issues.error(n.raw.file, path,
                             f"Policy for vhost '{n.hostname}' defines alias '{alias}' which "
                             f"conflicts with an existing vhost named '{alias}'")
            elif alias in owner:
                issues.error(n.raw.file, path,
                             f"Policy for vhost '{n.hostname}' alias '{alias}' conflicts with "
                             f"existing alias for vhost '{owner[alias]}'")
            else:
                owner[alias] = n.hostname
    return owner


def _build_patterns(named: Sequence[_Named], issues: _Issues) -> HostnamePatterns:
    where: dict[str, tuple[_RawVhost, str, str]] = {}
    order: list[str] = []
    for n in named:
        for path, name in ((f"{n.raw.label}.hostname", n.hostname),
                           *((f"{n.raw.label}.aliases[{i}]", a) for i, a in n.aliases)):
            if name not in where:
                where[name] = (n.raw, path, n.hostname)
                order.append(name)
    tree, problems = HostnamePatterns.build(order)
    for name, problem in problems:
        raw, path, owner = where[name]
        if problem == "empty":
            issues.error(raw.file, path,
                         f"vhost name '{name}' cannot be a hostname pattern (no tokens); an empty "
                         "vhost name is not possible when enableVhostNamePatterns is true")
        else:
            issues.error(raw.file, path,
                         f"Policy for vhost '{owner}' alias '{name}' optimized pattern conflicts "
                         f"with existing pattern '{problem}'")
    return tree


def _check_settings(settings: PolicySettings, issues: _Issues) -> None:
    checks: Iterable[tuple[str, Any]] = (
        ("maxConnections", settings.max_connections),
        ("maxMessageSize", settings.max_message_size),
        ("max_connection_rate", settings.max_connection_rate),
    )
    for key, value in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            issues.error(None, f"policy.{key}", f"must be an integer >= 0, not {_show(value)}")
    if not isinstance(settings.default_vhost, str):
        issues.error(None, "policy.defaultVhost", "must be a string")


def _caching(resolver: Resolver) -> Resolver:
    memo: dict[str, list[str] | LookupError] = {}

    def resolve(name: str) -> list[str]:
        if name not in memo:
            try:
                memo[name] = list(resolver(name))
            except LookupError as exc:
                memo[name] = exc
        answer = memo[name]
        if isinstance(answer, LookupError):
            raise answer
        return answer

    return resolve
