"""Sans-IO. The QDR policy key table: the single place where camelCase meets snake_case.

Every key a policy file may use is listed here with its level (``vhost`` or ``group``), its
kind, its range, its QDR default, and whether the proxy enforces it. Keys that QDR accepts but
the proxy does not enforce load with a warning; keys missing from the table are errors
(docs/qdr-compatibility.md; QDR itself only warned about unknown group keys).

Sources: ``PolicyKeys`` and ``PolicyCompiler`` in QDR's ``policy_local.py`` and the ``vhost`` /
``vhostUserGroupSettings`` entities of ``qdrouter.json``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

USER_TOKEN: Final = "${user}"
"""The only substitution token in source and target items."""
DEFAULT_GROUP: Final = "$default"
"""Group for unknown users when ``allowUnknownUser`` is true."""
CONNECTOR_GROUP: Final = "$connector"
"""Group QDR applies to outgoing connector connections; accepted, unused by the proxy."""
ANY_USER: Final = "*"
"""The ``users`` item that catches every user not listed elsewhere (QDR ``lookup_user``)."""
LIST_SEPARATOR: Final = ","
"""Separator of items in CSV string values (QDR ``KC_CONFIG_LIST_SEP``)."""

CONNECTION_LIMIT_MAX: Final = 65535
"""Upper bound of ``maxConnections``, ``maxConnectionsPerUser``, ``maxConnectionsPerHost``."""
LINK_LIMIT_MAX: Final = 2147483647
"""Upper bound of ``maxSenders`` / ``maxReceivers`` (a C ``int`` in QDR)."""
UINT32_MAX: Final = 4294967295
UINT64_MAX: Final = 18446744073709551615
SESSIONS_MAX: Final = 65536
"""``maxSessions`` becomes ``channel-max = maxSessions - 1``, a ushort (QDR wraps above it)."""
QUARANTINE_KEYS: Final = ("denials", "withinSeconds", "banSeconds")
"""The keys of a ``quarantine`` object, all required."""
QUARANTINE_DENIALS_MAX: Final = 1_000_000
"""Upper bound of ``quarantine.denials``."""
QUARANTINE_SECONDS_MAX: Final = 31_536_000
"""Upper bound of ``quarantine.withinSeconds`` and ``quarantine.banSeconds`` (365 days)."""
CONNECTION_RATE_MAX: Final = 1_000_000
"""Upper bound of the connection-rate keys and ``connectionRateBurst`` (connections per
second, connections)."""
MIN_MAX_FRAME_SIZE: Final = 512
"""AMQP 1.0 Part 2 §2.7.1: "MIN-MAX-FRAME-SIZE ... 512"; proton raises smaller values to it."""


class Kind(StrEnum):
    """How a key's value is validated and converted."""

    NAME = "name"
    """A single string (``hostname``, ``id``)."""
    INT = "int"
    """An integer, or a string holding one (QDR converts with ``int()``)."""
    BOOL = "bool"
    """A JSON boolean, or exactly the string ``"true"`` / ``"false"``."""
    LIST = "list"
    """A comma-separated string or a list of strings (``users``, ``aliases``)."""
    HOSTS = "hosts"
    """``remoteHosts``: a list of host specs (docs/policy.md, "Remote hosts")."""
    ADDRESSES = "addresses"
    """``sources`` / ``targets`` items (list mode)."""
    PATTERNS = "patterns"
    """``sourcePattern`` / ``targetPattern`` items (pattern mode)."""
    GROUPS = "groups"
    """The map of group name to group settings."""
    METADATA = "metadata"
    """Management metadata (``name``, ``identity``, ``type``); any value, ignored."""
    TOPICS = "topics"
    """Topic authorization keys (docs/topic-authorization.md, an extension over QDR): compiled together
    into ``GroupSettings.topics`` by :mod:`amqp_policy_proxy.policy.topics.config`."""
    CHOICE = "choice"
    """One string of a fixed set (``KeySpec.choices``), e.g. ``enforcement``."""
    QUARANTINE = "quarantine"
    """``quarantine``: an object ``{"denials": N, "withinSeconds": S, "banSeconds": B}``
    (an extension over QDR, docs/policy.md "Quarantine")."""


class Enforcement(StrEnum):
    """The values of the ``enforcement`` key (an extension over QDR, docs/policy.md,
    "Shadow mode")."""

    ENFORCE = "enforce"
    """Denials are enforced (QDR's behaviour; the default)."""
    SHADOW = "shadow"
    """Every decision is computed as usual, but a would-be denial is allowed, logged at INFO
    as ``SHADOW DENY ...`` and counted in ``amqp_proxy_shadow_denials_total``."""


#: :attr:`Enforcement.SHADOW` as a plain module name: the core asks "in shadow?" at every
#: decision, and an Enum member read through its class costs ~75 ns on CPython 3.11 (~10 here).
SHADOW = Enforcement.SHADOW


class Level(StrEnum):
    """Where a key may appear."""

    VHOST = "vhost"
    GROUP = "group"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeySpec:
    """One accepted policy key."""

    camel: str
    """The QDR key, verbatim (camelCase)."""
    snake: str
    """The Python attribute name in :mod:`amqp_policy_proxy.policy.model`."""
    level: Level
    kind: Kind
    default: object = None
    """QDR's applied default (the compiler default, not the schema text)."""
    minimum: int | None = None
    maximum: int | None = None
    enforced: bool = True
    """False: accepted for QDR compatibility, warned about, not enforced by the proxy."""
    zero_means_unlimited: bool = False
    """QDR treats 0 as "no limit / use the listener value"; compiled to ``None``."""
    choices: tuple[str, ...] = ()
    """The accepted values of a :attr:`Kind.CHOICE` key."""
    doc: str = ""


def _spec(camel: str, level: Level, kind: Kind, *, snake: str | None = None,
          **kw: object) -> KeySpec:
    """The :class:`KeySpec` of the policy key ``camel`` (QDR's camelCase name); its Python
    field is ``snake``, by default ``camel`` in snake_case (``maxSessionWindow`` →
    ``max_session_window``)."""
    if snake is None:
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
    return KeySpec(camel=camel, snake=snake, level=level, kind=kind, **kw)  # type: ignore[arg-type]


_V, _G = Level.VHOST, Level.GROUP

_VHOST_SPECS: Final = (
    _spec("hostname", _V, Kind.NAME, doc="vhost name matched against Open hostname"),
    _spec("id", _V, Kind.NAME, snake="hostname", enforced=False,
          doc="deprecated synonym of hostname (QDR vhost entity)"),
    _spec("aliases", _V, Kind.LIST, default=(), doc="alternative vhost names"),
    _spec("maxConnections", _V, Kind.INT, default=65535, minimum=0,
          maximum=CONNECTION_LIMIT_MAX, doc="concurrent connections to the vhost; 0 denies all"),
    _spec("maxConnectionsPerUser", _V, Kind.INT, default=65535,
          minimum=0, maximum=CONNECTION_LIMIT_MAX, doc="per user name; 0 denies all"),
    _spec("maxConnectionsPerHost", _V, Kind.INT, default=65535,
          minimum=0, maximum=CONNECTION_LIMIT_MAX, doc="per remote IP; 0 denies all"),
    _spec("maxConnectionRate", _V, Kind.INT, default=None, minimum=0,
          maximum=CONNECTION_RATE_MAX, zero_means_unlimited=True,
          doc="new connections per second to the vhost; 0 = unlimited; extension"),
    _spec("maxConnectionRatePerUser", _V, Kind.INT,
          default=None, minimum=0, maximum=CONNECTION_RATE_MAX, zero_means_unlimited=True,
          doc="new connections per second per user name; 0 = unlimited; extension"),
    _spec("maxConnectionRatePerHost", _V, Kind.INT,
          default=None, minimum=0, maximum=CONNECTION_RATE_MAX, zero_means_unlimited=True,
          doc="new connections per second per remote IP; 0 = unlimited; extension"),
    _spec("connectionRateBurst", _V, Kind.INT, default=None,
          minimum=1, maximum=CONNECTION_RATE_MAX,
          doc="connections admitted back to back by each connection-rate bucket of the vhost; "
              "default: the bucket's rate (one second's worth); extension"),
    _spec("allowUnknownUser", _V, Kind.BOOL, default=False,
          doc="users in no group get group $default"),
    _spec("maxMessageSize", _V, Kind.INT, default=None, minimum=0,
          maximum=UINT64_MAX, zero_means_unlimited=True,
          doc="bytes; overrides the global value; 0 = unlimited"),
    _spec("groups", _V, Kind.GROUPS, default=None, doc="group name -> settings"),
    _spec("name", _V, Kind.METADATA, enforced=False, doc="management entity name"),
    _spec("identity", _V, Kind.METADATA, enforced=False,
          doc="management entity identity"),
    _spec("type", _V, Kind.METADATA, enforced=False, doc="management entity type"),
    _spec("topicTree", _V, Kind.TOPICS, default=None,
          doc="topic tree ACLs: model anyAncestor (IBM MQ) or nearestAcl (WMB); extension"),
    _spec("permissionsDocument", _V, Kind.TOPICS, default=None,
          doc="S/MIME-signed DDS Security permissions document; relative to the policy file"),
    _spec("permissionsCa", _V, Kind.TOPICS, default=None,
          doc="CA certificate (PEM) that signed permissionsDocument; relative to the file"),
    _spec("enforcement", _V, Kind.CHOICE, default=Enforcement.ENFORCE,
          choices=tuple(Enforcement),
          doc="enforce, or shadow: would-be denials are allowed, logged and counted; extension"),
    _spec("quarantine", _V, Kind.QUARANTINE, default=None,
          doc="{denials, withinSeconds, banSeconds}: a user (or a host, for denials without "
              "a user) denied N times within S seconds is banned for B seconds; extension"),
)

_GROUP_SPECS: Final = (
    _spec("users", _G, Kind.LIST, default=(), doc="member user names; '*' = any"),
    _spec("remoteHosts", _G, Kind.HOSTS, default=None,
          doc="hosts members may connect from; missing = deny all"),
    _spec("maxConnectionsPerUser", _G, Kind.INT, default=None,
          minimum=0, maximum=CONNECTION_LIMIT_MAX, doc="replaces the vhost per-user limit"),
    _spec("maxConnectionsPerHost", _G, Kind.INT, default=None,
          minimum=0, maximum=CONNECTION_LIMIT_MAX, doc="replaces the vhost per-host limit"),
    _spec("maxConnectionRatePerUser", _G, Kind.INT,
          default=None, minimum=0, maximum=CONNECTION_RATE_MAX,
          doc="replaces the vhost per-user connection rate; 0 = unlimited; extension"),
    _spec("maxConnectionRatePerHost", _G, Kind.INT,
          default=None, minimum=0, maximum=CONNECTION_RATE_MAX,
          doc="replaces the vhost per-host connection rate; 0 = unlimited; extension"),
    _spec("maxMessageRatePerUser", _G, Kind.INT, default=0,
          minimum=0, maximum=UINT32_MAX, zero_means_unlimited=True,
          doc="messages per second the user may send (credit shaping, the user's connections "
              "share it); 0 = unlimited; extension"),
    _spec("maxByteRatePerUser", _G, Kind.INT, default=0,
          minimum=0, maximum=UINT64_MAX, zero_means_unlimited=True,
          doc="message payload bytes per second the user may send (credit shaping); "
              "0 = unlimited; extension"),
    _spec("maxConnectionLifetimeSeconds", _G, Kind.INT, default=0, minimum=0,
          maximum=UINT32_MAX, zero_means_unlimited=True,
          doc="seconds a member's connection may stay open, then it is closed with "
              "amqp:connection:forced (up to a tenth earlier, spread per connection); "
              "0 = unlimited; extension"),
    _spec("maxFrameSize", _G, Kind.INT, default=0, minimum=0,
          maximum=UINT32_MAX, zero_means_unlimited=True,
          doc="bytes; replaces max-frame-size in the Open sent to the client; 0 = unchanged"),
    _spec("maxSessions", _G, Kind.INT, default=0, minimum=0,
          maximum=SESSIONS_MAX, zero_means_unlimited=True,
          doc="concurrent sessions; channel-max := maxSessions - 1; 0 = unchanged"),
    _spec("maxSessionWindow", _G, Kind.INT, default=0, minimum=0,
          maximum=UINT32_MAX, zero_means_unlimited=True,
          doc="bytes of incoming session window; 0 = unchanged"),
    _spec("maxMessageSize", _G, Kind.INT, default=None, minimum=0,
          maximum=UINT64_MAX, zero_means_unlimited=True,
          doc="bytes; overrides vhost and global values; 0 = unlimited"),
    _spec("maxSenders", _G, Kind.INT, default=LINK_LIMIT_MAX, minimum=0,
          maximum=LINK_LIMIT_MAX, zero_means_unlimited=True,
          doc="concurrent client sender links; 0 = unlimited (QDR C code)"),
    _spec("maxReceivers", _G, Kind.INT, default=LINK_LIMIT_MAX, minimum=0,
          maximum=LINK_LIMIT_MAX, zero_means_unlimited=True,
          doc="concurrent client receiver links; 0 = unlimited (QDR C code)"),
    _spec("allowDynamicSource", _G, Kind.BOOL, default=False,
          doc="receivers with dynamic sources"),
    _spec("allowAnonymousSender", _G, Kind.BOOL, default=False,
          doc="senders without a target address (anonymous relay)"),
    _spec("allowUserIdProxy", _G, Kind.BOOL, default=False,
          doc="messages whose properties.user-id differs from the user"),
    _spec("allowRouterAnnotations", _G, Kind.BOOL, default=False,
          doc="anonymous-relay messages carrying the router's x-opt-qd.* annotations (which "
              "qdrouterd may route by, past the checked to); extension"),
    _spec("allowWaypointLinks", _G, Kind.BOOL, default=True,
          enforced=False, doc="qd.waypoint terminus capability (router-internal)"),
    _spec("allowFallbackLinks", _G, Kind.BOOL, default=True,
          enforced=False, doc="qd.fallback terminus capability (router-internal)"),
    _spec("allowDynamicLinkRoutes", _G, Kind.BOOL, default=True,
          enforced=False, doc="management CREATE of connection-scoped link routes"),
    _spec("allowAdminStatusUpdate", _G, Kind.BOOL, default=True,
          enforced=False, doc="management UPDATE of connection adminStatus"),
    _spec("sources", _G, Kind.ADDRESSES, default=None,
          doc="allowed receiver source addresses; missing = deny all"),
    _spec("targets", _G, Kind.ADDRESSES, default=None,
          doc="allowed sender target / relay addresses; missing = deny all"),
    _spec("sourcePattern", _G, Kind.PATTERNS, default=None,
          doc="address patterns instead of sources"),
    _spec("targetPattern", _G, Kind.PATTERNS, default=None,
          doc="address patterns instead of targets"),
    _spec("permissions", _G, Kind.TOPICS, default=None,
          doc="ordered topic rules {topic, activity, qos, type}; first match decides; extension"),
    _spec("defaultBehaviour", _G, Kind.TOPICS, default=None,
          doc="allow or deny when no permissions rule matches; default allow only when empty"),
    _spec("enforcement", _G, Kind.CHOICE, default=None,
          choices=tuple(Enforcement),
          doc="enforce or shadow for this group; default: the vhost's; extension"),
)

VHOST_KEYS: Final = MappingProxyType({s.camel: s for s in _VHOST_SPECS})
"""Accepted vhost-level keys, by QDR camelCase name."""
GROUP_KEYS: Final = MappingProxyType({s.camel: s for s in _GROUP_SPECS})
"""Accepted group-level keys, by QDR camelCase name."""

NOT_ENFORCED_GROUP_KEYS: Final = frozenset(s.camel for s in _GROUP_SPECS if not s.enforced)
"""Group keys accepted for compatibility and reported as warnings."""
NOT_ENFORCED_VHOST_KEYS: Final = frozenset(s.camel for s in _VHOST_SPECS if not s.enforced)
"""Vhost keys accepted for compatibility and reported as warnings (``id``, metadata)."""

POLICY_SETTINGS_KEYS: Final = MappingProxyType({
    "maxConnections": "max_connections",
    "enableVhostPolicy": "enable_vhost_policy",
    "enableVhostNamePatterns": "enable_vhost_name_patterns",
    "defaultVhost": "default_vhost",
    "maxMessageSize": "max_message_size",
    "policyDir": "path",
})
"""Global QDR ``policy`` entity attributes -> daemon config ``[policy]`` keys."""

LIMIT_NAMES: Final = (
    "maxConnections", "maxConnectionsPerUser", "maxConnectionsPerHost", "maxSessions",
    "maxSenders", "maxReceivers", "maxFrameSize", "maxMessageSize", "maxSessionWindow",
)
"""Values of the ``limit`` label of the ``amqp_proxy_limit`` (counts) and
``amqp_proxy_limit_bytes`` (:data:`BYTE_LIMIT_NAMES`) gauges."""

BYTE_LIMIT_NAMES: Final = frozenset({"maxFrameSize", "maxMessageSize", "maxSessionWindow"})
"""The limits whose values are bytes (exported as ``amqp_proxy_limit_bytes``); the others
count connections, sessions or links."""

_SNAKE_BY_CAMEL: Final = MappingProxyType(
    {s.camel: s.snake for s in (*_GROUP_SPECS, *_VHOST_SPECS) if s.camel != "id"}
)
_CAMEL_BY_SNAKE: Final = MappingProxyType({v: k for k, v in _SNAKE_BY_CAMEL.items()})


def snake_case(camel: str) -> str:
    """Python attribute name of a QDR key.

    Args:
        camel: a key from :data:`VHOST_KEYS` or :data:`GROUP_KEYS`, e.g. ``maxConnectionsPerUser``.

    Returns:
        The snake_case name, e.g. ``max_connections_per_user``.

    Raises:
        KeyError: the key is not a QDR policy key.
    """
    return _SNAKE_BY_CAMEL[camel]


def camel_case(snake: str) -> str:
    """QDR key of a Python attribute name (inverse of :func:`snake_case`).

    Raises:
        KeyError: no QDR key has that attribute name.
    """
    return _CAMEL_BY_SNAKE[snake]


_HYPHEN_RE: Final = re.compile(r"-([a-zA-Z0-9])")


def hyphen_to_camel(key: str) -> str:
    """Convert a hyphenated attribute name to camelCase, as QDR's config loader does.

    As QDR's ``policyDir`` loader: top-level attribute keys of policyDir entities are converted
    (``max-connections`` -> ``maxConnections``); keys inside ``groups`` are not.

    Args:
        key: the key as written in the file.

    Returns:
        The camelCase key; keys without hyphens are returned unchanged.
    """
    return _HYPHEN_RE.sub(lambda m: m.group(1).upper(), key)


def suggest(key: str, known: Iterable[str]) -> str | None:
    """Closest known key to a misspelt one, for "did you mean" hints.

    Args:
        key: the unknown key.
        known: an iterable of valid keys.

    Returns:
        The best close match, or None when nothing is close.
    """
    matches = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return matches[0] if matches else None
