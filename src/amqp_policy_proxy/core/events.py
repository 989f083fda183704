"""Sans-IO. Observability events the core emits (the observer contract).

Events are past-tense facts. The core emits them inside ``Emit`` commands; the daemon fans them
out to the metrics observer and the event log writer. Times are loop-clock seconds (``at``),
never wall-clock: the daemon converts them when it writes the event log.

Label discipline: metrics may use ``vhost``, ``group``, ``reason``, ``role``, ``side``,
``condition``; the per-client fields (``user``, ``remote_host``, ``address``) go only to the
event log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policy.reasons import ConnectionDenyReason, LinkDenyReason, MessageDenyReason

__all__ = [
    "AdminAction", "ConnectionApproved", "ConnectionClosed", "ConnectionDenied",
    "ConnectionDenyReason", "LinkDenied", "LinkDenyReason", "MessageDenied",
    "MessageDenyReason", "OpenDecided", "PolicyReloaded", "ProtocolViolation", "ProxyEvent",
    "Revoked", "SaslFailed", "SessionDenied", "ShadowDenied", "TokenRefused",
    "TokenRenewed", "UpstreamConnectFailed",
]


@dataclass(slots=True)
class ProxyEvent:
    """Base of every event: which connection, when, and who (as far as known).

    These fields may be given by position, in this order (the core passes them as one tuple,
    :meth:`~.context.Context.who`: keyword arguments cost a connection ~0.4 µs per event);
    the fields of the subclasses are keyword-only.
    """

    conn_id: str
    """Proxy-assigned connection id, unique within the process."""
    at: float
    """Loop-clock time in seconds when the event happened."""
    vhost: str | None = None
    """Resolved vhost name (None before resolution or when none matched)."""
    group: str | None = None
    """Policy user group (None before assignment)."""
    user: str | None = None
    """Authenticated user name (None before the SASL outcome)."""
    remote_host: str = ""
    """The client's IP address, normalised (IPv4-mapped IPv6 shown as IPv4)."""
    listener: str = ""
    """The listener address the client connected to, ``HOST:PORT``."""
    balancer_host: str | None = None
    """The load balancer's address when the client's came from its PROXY protocol header
    (``remote_host`` is then the client's); None on listeners without ``proxy_protocol``."""


@dataclass(slots=True, kw_only=True)
class ConnectionApproved(ProxyEvent):
    """The client's Open passed every admission rule; the Open is on its way to the router."""

    hostname: str | None = None
    """The Open hostname the client asked for (may differ from the resolved vhost)."""


@dataclass(slots=True, kw_only=True)
class ConnectionDenied(ProxyEvent):
    """The connection was refused (at TCP accept, at Open, or by the handshake timeout)."""

    reason: ConnectionDenyReason
    condition: str = ""
    """AMQP condition sent to the client ("" when the socket was closed without a byte)."""
    description: str = ""


@dataclass(slots=True, kw_only=True)
class ConnectionClosed(ProxyEvent):
    """An approved connection ended, with the figures a capacity planner needs."""

    opened_at: float
    """Loop-clock time of approval."""
    duration_seconds: float
    bytes_in: int
    """Bytes received from the client (client to broker), frames included."""
    bytes_out: int
    """Bytes sent to the client (broker to client)."""
    transfers_in: int
    """Transfer frames received from the client."""
    transfers_out: int
    """Transfer frames sent to the client."""
    max_sessions: int
    """Peak number of concurrently open sessions."""
    max_senders: int
    """Peak number of concurrently attached client sender links."""
    max_receivers: int
    """Peak number of concurrently attached client receiver links."""
    close_reason: str
    """One of :data:`amqp_policy_proxy.eventlog.schema.CLOSE_REASONS`."""


@dataclass(slots=True, kw_only=True)
class SessionDenied(ProxyEvent):
    """A Begin beyond maxSessions got Begin+End (QDR ``session disallowed by local policy``)."""

    channel: int = 0


@dataclass(slots=True, kw_only=True)
class LinkDenied(ProxyEvent):
    """An Attach got Attach+Detach(closed) (QDR ``link disallowed by local policy``)."""

    role: str
    """The client's side of the link: ``sender`` or ``receiver``."""
    address: str | None
    reason: LinkDenyReason


@dataclass(slots=True, kw_only=True)
class MessageDenied(ProxyEvent):
    """A delivery was rejected by policy (relay target, user-id proxy, message size)."""

    address: str | None
    reason: MessageDenyReason
    size: int
    """Bytes of the delivery payload seen so far."""


@dataclass(slots=True, kw_only=True)
class OpenDecided(ProxyEvent):
    """The client's Open was decided (the audit trail's ``auth_decision``): every admission
    decision, allowed or denied, with the rule that decided it.

    Emitted just before :class:`ConnectionApproved` or :class:`ConnectionDenied`. Refusals
    before an Open decision (global limit, memory budget, handshake timeout, authzid, no
    upstream) are ``ConnectionDenied`` only.
    """

    decision: str
    """``allow`` or ``deny``: what happened to the connection."""
    reason: str | None = None
    """The denial reason (:class:`ConnectionDenyReason`); for an ``allow`` in shadow mode the
    reason it would have been denied for; None otherwise."""
    enforcement: str = "enforce"
    """``enforce`` or ``shadow``: the enforcement of the group (else the vhost) that decided."""
    rule: str = ""
    """The rule that decided, in words: how the vhost and group were found, or the limit or
    ``remoteHosts`` that denied."""
    hostname: str | None = None
    """The Open hostname the client asked for."""


@dataclass(slots=True, kw_only=True)
class ShadowDenied(ProxyEvent):
    """A denial that shadow mode let through (``enforcement: shadow``): the connection, session,
    link or message was allowed; logged ``SHADOW DENY ...`` with the denial's own fields."""

    kind: str
    """``connection``, ``session``, ``link`` or ``message``
    (:class:`~amqp_policy_proxy.policy.reasons.DenialKind`)."""
    reason: str
    """The reason the real denial would have had (the same ``reason`` label)."""
    role: str | None = None
    """For a link: the client's side, ``sender`` or ``receiver``."""
    address: str | None = None
    """For a link or a message: the address, when it has one."""


@dataclass(slots=True, kw_only=True)
class SaslFailed(ProxyEvent):
    """An authentication attempt that failed: the router's sasl-outcome was not ``ok``, or
    the client left in the middle of the SASL exchange. ``user`` is the canonical name the
    sasl-init claimed (None when there was none or it could not be read); never the password
    or token."""

    mechanism: str
    """The sasl-init's mechanism (``PLAIN``, ``SCRAM-SHA-256``...), ``""`` before one."""
    reason: str
    """``auth``, ``sys``, ``sys-perm``, ``sys-temp`` (the outcome code's name, Part 5
    §5.3.3.6), or ``dropped`` (the client left before the outcome)."""
    code: int | None = None
    """The sasl-outcome code (None for ``dropped``)."""


@dataclass(slots=True, kw_only=True)
class TokenRefused(ProxyEvent):
    """The proxy refused a token connection's token (sasl-outcome ``auth``): the metric
    ``amqp_proxy_token_rejections_total{reason}``; the event log has the ``sasl_failed``
    record of the same refusal. ``user`` is None (nobody was authenticated)."""

    mechanism: str
    """``PLAIN``, ``OAUTHBEARER``, another mechanism (reason ``no_token``), or ``""`` (the
    client skipped SASL)."""
    reason: str
    """A :data:`~.tokenauth.REJECTION_REASONS` value (``expired``, ``bad_audience``...)."""


@dataclass(slots=True, kw_only=True)
class TokenRenewed(ProxyEvent):
    """A live token connection asked to renew its token in-band (CBS ``put-token`` on
    ``$cbs``, ``PUT /auth/tokens`` on ``/management``): the metric
    ``amqp_proxy_token_renewals_total{result,reason}`` and the event log's
    ``token_renewed``. ``user`` is the connection's (unchanged either way: a renewal keeps
    the subject)."""

    node: str
    """``$cbs`` or ``/management``."""
    result: str
    """``accepted``, ``refused`` (401: the token is worse, or its groups would not admit the
    connection) or ``bad_request`` (400/404/405: a request the proxy cannot act on)."""
    reason: str = ""
    """Why not: a :class:`~..tokens.errors.RejectReason` value (``expired``,
    ``subject_changed``, ``not_newer``...), ``groups_denied`` or ``bad_request``; ``""`` when
    accepted."""


@dataclass(slots=True, kw_only=True)
class Revoked(ProxyEvent):
    """A reload's policy no longer admits an open connection or allows an attached link
    (``[policy] reevaluate_open``): closed or detached (``mode`` ``enforce``), or only
    reported (``shadow``)."""

    kind: str
    """``connection`` or ``link``."""
    reason: str
    """Why: a connection denial reason (``unknown_user``, ``remote_host``, ``no_vhost``), or a
    link denial reason (``target``, ``source``, ``anonymous_sender``, ``dynamic_source``,
    ``topic``)."""
    mode: str
    """``enforce`` (closed or detached) or ``shadow`` (reported only)."""
    role: str | None = None
    """For a link: the client's side, ``sender`` or ``receiver``."""
    address: str | None = None
    """For a link: its address, when it has one."""


@dataclass(slots=True, kw_only=True)
class ProtocolViolation(ProxyEvent):
    """A side broke the protocol; the connection was closed with ``condition``."""

    side: str
    """``client`` or ``broker``."""
    condition: str
    description: str


@dataclass(slots=True, kw_only=True)
class UpstreamConnectFailed(ProxyEvent):
    """Connecting to one upstream failed (the next one, if any, is tried)."""

    upstream: str
    """The upstream address ``HOST:PORT``."""


@dataclass(slots=True, kw_only=True)
class PolicyReloaded:
    """A policy reload finished (``result`` ``ok`` or ``error``). Not tied to a connection."""

    at: float
    digest: str
    result: str
    issues: tuple[str, ...] = field(default=())


@dataclass(slots=True, kw_only=True)
class AdminAction:
    """An operator changed something through the admin interface (``admin_action`` in the
    event log). Emitted by the daemon; not tied to a connection."""

    at: float
    """Loop-clock seconds."""
    action: str
    """``connections_close``, ``vhost_pause`` or ``vhost_resume``."""
    uid: int | None
    """The admin client's user id (``SO_PEERCRED`` of the unix socket); None over TCP."""
    pid: int | None
    """The admin client's process id (``SO_PEERCRED``); None over TCP."""
    peer: str
    """``unix`` for the socket, else the TCP client's ``HOST:PORT``."""
    selector: str
    """What the action applied to, as given: ``id=...``, ``user=...``, ``vhost=...``,
    ``host=...``."""
    targets: tuple[str, ...]
    """What it acted on: connection ids closed, or the vhost paused or resumed."""
    result: str
    """``ok`` or ``error``."""
    count: int = 0
    """Connections closed (0 for a pause or resume)."""
    description: str = ""
    """The operator's reason (sent to closed clients), or the error."""
    vhost: str | None = None
    """The vhost of a pause, resume or close by vhost."""


@dataclass(slots=True, kw_only=True)
class ProxyInfo:
    """Which proxy process writes an event-log file and how it enforces its limits
    (``proxy_info``, the first record of every event-log file since schema 4). Written by the
    daemon's event-log sink; not tied to a connection."""

    at: float
    """Loop-clock seconds."""
    ledger: str
    """``local``: this process counts its own connections (no ``[ledger]``); ``fleet``: the
    counts are shared by every proxy of ``fleet`` (``[ledger]``), so limits are fleet-wide."""
    proxy_id: str
    """The proxy's name in the fleet (``[ledger] proxy_id``, workers add ``/wN``); ``""``
    without a ledger."""
    fleet: str | None = None
    """The fleet's name: the ledger's store without credentials (``redis://HOST:PORT/DB``,
    ``unix:///path``, ``auto@HOST`` for a private store); None without a ledger."""
