"""Sans-IO. The immutable, compiled policy model.

A :class:`Policy` is a snapshot: built once by :func:`amqp_policy_proxy.policy.compile.compile_policy`,
never mutated, shared by every connection admitted under it, replaced as a whole on reload.
QDR's "0 means no limit / use the listener value" is turned into ``None`` at compile time, so
no field holds a magic zero; the connection limits are the exception (0 there really means
"deny every connection", as in QDR's C code).

Field names are the snake_case forms of QDR's keys (:mod:`amqp_policy_proxy.policy.keys`).
No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from amqp_policy_proxy.ingress.remote_hosts import RemoteHosts
from amqp_policy_proxy.policy.addresses import AddressRules
from amqp_policy_proxy.policy.keys import LINK_LIMIT_MAX, SHADOW, Enforcement

if TYPE_CHECKING:
    from amqp_policy_proxy.policy.errors import ConfigIssue
    from amqp_policy_proxy.policy.hostnames import HostnamePatterns
    from amqp_policy_proxy.policy.topics import TopicAuthorizer

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_LINK_LIMITS = frozenset({"maxSenders", "maxReceivers"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """The global QDR ``policy`` entity from the daemon's ``[policy]`` section.

    Unlike QDR (whose ``enableVhostPolicy`` defaults to false) the proxy enforces vhost policy
    by default: enforcing it is the proxy's purpose.
    """

    max_connections: int = 65535
    """Concurrent client transports accepted at TCP level, before any byte; 0 refuses all."""
    enable_vhost_policy: bool = True
    """False: only ``max_connections`` applies, no vhost/group/link/message checks."""
    enable_vhost_name_patterns: bool = False
    """True: vhost hostnames and aliases are address-style patterns (QDR ``enableVhostNamePatterns``)."""
    default_vhost: str = "$default"
    """Vhost used when the Open hostname matches nothing; ignored when empty or undefined."""
    max_message_size: int = 0
    """Global maximum message size in bytes; 0 = unlimited. Vhost and group values override."""
    max_connection_rate: int = 0
    """New client transports accepted per second at TCP level, before any byte (a token
    bucket whose burst is one second's worth); 0 = unlimited. An extension over QDR
    (``[policy] max_connection_rate``); refused transports count as ``global_rate``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSettings:
    """One user group of a vhost (QDR ``vhostUserGroupSettings``)."""

    name: str
    """Group name, e.g. ``admins`` or ``$default``."""
    users: frozenset[str] = frozenset()
    """Member user names (exact, case-sensitive); ``*`` catches every unlisted user."""
    remote_hosts: RemoteHosts = field(default_factory=RemoteHosts)
    """Where members may connect from; empty = nobody (missing ``remoteHosts``)."""
    max_connections_per_user: int | None = None
    """Replaces the vhost per-user limit; None = use the vhost's. 0 denies every connection."""
    max_connections_per_host: int | None = None
    """Replaces the vhost per-host limit; None = use the vhost's. 0 denies every connection."""
    max_connection_rate_per_user: int | None = None
    """New connections per second per user name, already resolved group -> vhost
    (``maxConnectionRatePerUser``); None = unlimited. An extension over QDR."""
    max_connection_rate_per_host: int | None = None
    """New connections per second per remote IP, already resolved group -> vhost
    (``maxConnectionRatePerHost``); None = unlimited. An extension over QDR."""
    max_message_rate_per_user: int | None = None
    """Messages per second the user may send, shared by the user's connections on this
    proxy (the proxy shapes the link-credit of the user's sender links); None = unlimited."""
    max_byte_rate_per_user: int | None = None
    """Message payload bytes per second the user may send, shaped like
    ``max_message_rate_per_user``; None = unlimited."""
    max_connection_lifetime_seconds: int | None = None
    """Seconds a member's connection may stay open (``maxConnectionLifetimeSeconds``), then
    it is closed with ``amqp:connection:forced``; None = unlimited. An extension over QDR."""
    max_frame_size: int | None = None
    """Bytes; replaces max-frame-size in the Open sent to the client; None = do not rewrite."""
    max_sessions: int | None = None
    """Concurrent sessions; channel-max := max_sessions - 1; None = unlimited / not rewritten."""
    max_session_window: int | None = None
    """Incoming session window in bytes; None = not rewritten."""
    max_message_size: int | None = None
    """Bytes, already resolved group -> vhost -> global (QDR ``lookup_settings``); None = unlimited."""
    max_senders: int | None = None
    """Concurrent client sender links; None = unlimited (QDR's 0)."""
    max_receivers: int | None = None
    """Concurrent client receiver links; None = unlimited (QDR's 0)."""
    allow_dynamic_source: bool = False
    """Receivers with a dynamic source are allowed (sources are not consulted for them)."""
    allow_anonymous_sender: bool = False
    """Senders with no target address (anonymous relay) are allowed."""
    allow_user_id_proxy: bool = False
    """Messages may carry a ``properties.user-id`` other than the authenticated user."""
    allow_router_annotations: bool = False
    """Anonymous-relay messages may carry the router's own ``x-opt-qd.*`` message
    annotations (``allowRouterAnnotations``, an extension): for trusted clients such as
    another router's or an edge's tooling. Off, such a message is refused, since qdrouterd
    may route it by ``x-opt-qd.to`` past the ``to`` the proxy checked."""
    sources: AddressRules = field(default_factory=AddressRules.deny_all)
    """Receiver source rules (``sourcePattern`` if configured, else ``sources``)."""
    targets: AddressRules = field(default_factory=AddressRules.deny_all)
    """Sender target and relay ``to`` rules (``targetPattern`` if configured, else ``targets``)."""
    declared_prefixes: tuple[str, ...] = ()
    """``$`` address trees the vhost's ``topicTree`` declares in ``systemPrefixes`` (``$SYS``):
    broker topics that ``sources``/``targets`` grant like any address, where other ``$`` names
    need a literal grant (decision 0007); never ``$management``."""
    allow_waypoint_links: bool = True
    """Accepted for QDR compatibility, not enforced (router-internal capability)."""
    allow_fallback_links: bool = True
    """Accepted for QDR compatibility, not enforced."""
    allow_dynamic_link_routes: bool = True
    """Accepted for QDR compatibility, not enforced (router management plane)."""
    allow_admin_status_update: bool = True
    """Accepted for QDR compatibility, not enforced (router management plane)."""
    topics: TopicAuthorizer | None = None
    """Topic authorization (docs/topic-authorization.md): the vhost's ``topicTree`` and DDS
    ``permissionsDocument`` and this group's ``permissions``, combined. None when none of
    them applies, so links and messages pay nothing."""
    enforcement: Enforcement = Enforcement.ENFORCE
    """Already resolved group -> vhost: ``shadow`` lets this group's would-be denials through
    (logged ``SHADOW DENY``, counted); docs/policy.md, "Shadow mode"."""

    @property
    def shadow(self) -> bool:
        """True when this group's denials are reported, not enforced (shadow mode)."""
        return self.enforcement is SHADOW


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A vhost's ``quarantine`` (an extension over QDR, docs/policy.md "Quarantine"): who
    collects :attr:`denials` denials of any kind within :attr:`within_seconds` is banned for
    :attr:`ban_seconds` (a user, or the client address for denials without a user)."""

    denials: int
    """N, at least 1."""
    within_seconds: float
    """S, seconds (more than 0)."""
    ban_seconds: float
    """B, seconds (more than 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VhostPolicy:
    """One vhost (QDR ``vhost`` entity)."""

    hostname: str
    """The vhost name (a pattern when name patterns are enabled); ``""`` is legal."""
    aliases: tuple[str, ...] = ()
    """Alternative names (patterns when name patterns are enabled)."""
    max_connections: int = 65535
    """Concurrent connections to this vhost; 0 denies all."""
    max_connections_per_user: int = 65535
    """Concurrent connections per user name, unless the group overrides it; 0 denies all."""
    max_connections_per_host: int = 65535
    """Concurrent connections per remote IP, unless the group overrides it; 0 denies all."""
    max_connection_rate: int | None = None
    """New connections per second admitted to this vhost (``maxConnectionRate``); None =
    unlimited. An extension over QDR: a token bucket checked at the Open after the counts."""
    max_connection_rate_per_user: int | None = None
    """New connections per second per user name unless the group overrides it; None =
    unlimited. Informative: each group carries its resolved value."""
    max_connection_rate_per_host: int | None = None
    """New connections per second per remote IP unless the group overrides it; None =
    unlimited. Informative: each group carries its resolved value."""
    connection_rate_burst: int | None = None
    """Capacity of each of the vhost's connection-rate buckets (connections admitted back to
    back); None = each bucket's own rate (one second's worth)."""
    allow_unknown_user: bool = False
    """Users in no group (and not caught by a ``*`` user) get group ``$default``."""
    max_message_size: int | None = None
    """Bytes: the vhost value if set, else the global one; None = unlimited. Informative:
    each group carries its own resolved value."""
    groups: Mapping[str, GroupSettings] = field(default_factory=lambda: _EMPTY)
    """Group name -> settings."""
    user_groups: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """User name (or ``*``) -> group name, built from the groups' ``users``."""
    source_file: str | None = None
    """The file the vhost came from (None for in-memory input)."""
    enforcement: Enforcement = Enforcement.ENFORCE
    """The vhost's ``enforcement``: the default of its groups, and what decides a denial made
    before a group is known (an unknown user)."""
    quarantine: Quarantine | None = None
    """The vhost's ``quarantine``; None: nobody is quarantined for denials here."""
    raw: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)
    """The attributes as loaded (camelCase keys), read-only, for explain and export."""
    rule_texts: dict[tuple[str, ...], str] = field(default_factory=dict, init=False,
                                                   compare=False, repr=False)
    """Memo of the audit trail's rule texts of this vhost's admissions (how the vhost and the
    group were found -> the words), filled by
    :func:`~amqp_policy_proxy.policy.decisions.approve_open`: a pure function of this
    immutable vhost, so at most one entry per alias, pattern and group."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """A complete, validated policy snapshot."""

    settings: PolicySettings = field(default_factory=PolicySettings)
    vhosts: Mapping[str, VhostPolicy] = field(default_factory=lambda: _EMPTY)
    """Vhost name -> vhost."""
    digest: str = ""
    """First 12 hex digits of the SHA-256 of the canonical loaded vhost content."""
    files: tuple[str, ...] = ()
    """The policy files that were loaded, in load order."""
    warnings: tuple[ConfigIssue, ...] = ()
    """Non-fatal issues found while loading."""
    aliases: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    """Alias -> vhost name."""
    hostname_patterns: HostnamePatterns | None = field(default=None, compare=False, repr=False)
    """Pattern tree of vhost names and aliases; set when name patterns are enabled."""

    def shadowed(self) -> list[tuple[str, Enforcement, tuple[str, ...]]]:
        """The vhosts with anything in shadow mode, for ``check`` and the start line.

        Returns:
            ``(vhost, vhost enforcement, groups in shadow)`` for every vhost that is in shadow
            itself or has a group in shadow, sorted by vhost; the groups sorted by name.
        """
        out = []
        for name in sorted(self.vhosts):
            vhost = self.vhosts[name]
            groups = tuple(sorted(g for g, s in vhost.groups.items() if s.shadow))
            if groups or vhost.enforcement is Enforcement.SHADOW:
                out.append((name, vhost.enforcement, groups))
        return out

    def limits_table(self) -> list[tuple[str, str, str, int]]:
        """Configured limits for the ``amqp_proxy_limit`` and ``amqp_proxy_limit_bytes`` gauges.

        Returns:
            ``(vhost, group, limit_name, value)`` rows, sorted; values are counts, or bytes for
            the names in :data:`~amqp_policy_proxy.policy.keys.BYTE_LIMIT_NAMES`. Vhost-level
            rows have group ``""``: ``maxConnections``, ``maxConnectionsPerUser``,
            ``maxConnectionsPerHost``. Each group has its *effective*
            ``maxConnectionsPerUser`` / ``maxConnectionsPerHost`` (group value, else the
            vhost's) and, only when limited, ``maxSessions``, ``maxSenders``, ``maxReceivers``,
            ``maxFrameSize``, ``maxMessageSize`` and ``maxSessionWindow``. Unlimited settings
            have no row: ``None`` (QDR's 0), and ``maxSenders`` / ``maxReceivers`` at QDR's
            default 2147483647 (the largest C ``int``: no limit in practice).
        """
        rows: list[tuple[str, str, str, int]] = []
        for vname, vhost in self.vhosts.items():
            rows.append((vname, "", "maxConnections", vhost.max_connections))
            rows.append((vname, "", "maxConnectionsPerUser", vhost.max_connections_per_user))
            rows.append((vname, "", "maxConnectionsPerHost", vhost.max_connections_per_host))
            for gname, group in vhost.groups.items():
                per_user = group.max_connections_per_user
                per_host = group.max_connections_per_host
                optional = (
                    ("maxConnectionsPerUser",
                     vhost.max_connections_per_user if per_user is None else per_user),
                    ("maxConnectionsPerHost",
                     vhost.max_connections_per_host if per_host is None else per_host),
                    ("maxSessions", group.max_sessions),
                    ("maxSenders", group.max_senders),
                    ("maxReceivers", group.max_receivers),
                    ("maxFrameSize", group.max_frame_size),
                    ("maxMessageSize", group.max_message_size),
                    ("maxSessionWindow", group.max_session_window),
                )
                rows.extend((vname, gname, n, v) for n, v in optional
                            if v is not None and not (n in _LINK_LIMITS and v >= LINK_LIMIT_MAX))
        rows.sort()
        return rows
