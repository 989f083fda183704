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
    "ConnectionApproved", "ConnectionClosed", "ConnectionDenied", "ConnectionDenyReason",
    "LinkDenied", "LinkDenyReason", "MessageDenied", "MessageDenyReason", "PolicyReloaded",
    "ProtocolViolation", "ProxyEvent", "SessionDenied", "UpstreamConnectFailed",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyEvent:
    """Base of every event: which connection, when, and who (as far as known)."""

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionApproved(ProxyEvent):
    """The client's Open passed every admission rule; the Open is on its way to the router."""

    hostname: str | None = None
    """The Open hostname the client asked for (may differ from the resolved vhost)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionDenied(ProxyEvent):
    """The connection was refused (at TCP accept, at Open, or by the handshake timeout)."""

    reason: ConnectionDenyReason
    condition: str = ""
    """AMQP condition sent to the client ("" when the socket was closed without a byte)."""
    description: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionDenied(ProxyEvent):
    """A Begin beyond maxSessions got Begin+End (QDR ``session disallowed by local policy``)."""

    channel: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkDenied(ProxyEvent):
    """An Attach got Attach+Detach(closed) (QDR ``link disallowed by local policy``)."""

    role: str
    """The client's side of the link: ``sender`` or ``receiver``."""
    address: str | None
    reason: LinkDenyReason


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageDenied(ProxyEvent):
    """A delivery was rejected by policy (relay target, user-id proxy, message size)."""

    address: str | None
    reason: MessageDenyReason
    size: int
    """Bytes of the delivery payload seen so far."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolViolation(ProxyEvent):
    """A side broke the protocol; the connection was closed with ``condition``."""

    side: str
    """``client`` or ``broker``."""
    condition: str
    description: str


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamConnectFailed(ProxyEvent):
    """Connecting to one upstream failed (the next one, if any, is tried)."""

    upstream: str
    """The upstream address ``HOST:PORT``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyReloaded:
    """A policy reload finished (``result`` ``ok`` or ``error``). Not tied to a connection."""

    at: float
    digest: str
    result: str
    issues: tuple[str, ...] = field(default=())
