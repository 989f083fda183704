"""Sans-IO. Every reason a connection, link or message is refused: one home for the labels.

The values are the ``reason`` label of the denial metrics, the ``reason`` field of the event
log's denial records and the words in the denial log lines; QDR's own names where QDR has the
concept (QDR-style snake_case of its statistics and log texts). The policy decisions
(:mod:`.decisions`), the connection ledger (:mod:`amqp_policy_proxy.limits.connections`), the
core and the observers all use these enums, so a reason is spelled once.
"""

from __future__ import annotations

from enum import StrEnum


class ConnectionDenyReason(StrEnum):
    """Why a connection was denied (``amqp_proxy_connections_denied_total{reason}``)."""

    GLOBAL_LIMIT = "global_limit"
    NO_VHOST = "no_vhost"
    UNKNOWN_USER = "unknown_user"
    REMOTE_HOST = "remote_host"
    VHOST_LIMIT = "vhost_limit"
    USER_LIMIT = "user_limit"
    HOST_LIMIT = "host_limit"
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    AUTHZID = "authzid"
    """The client's SASL authorization identity differs from the identity it authenticates
    as (PLAIN authzid, SCRAM ``a=``, EXTERNAL): refused with the SASL outcome ``auth``."""
    IDENTITY = "identity"
    """The identity is not one the upstream's authenticator records as sent (e.g. padded
    with whitespace Cyrus SASL would trim, or a control character): refused with the SASL
    outcome ``auth`` under ``identity = "strict"`` (decision 0007)."""
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    """No upstream accepted the connection: the client got SASL ``sys-temp`` or
    ``amqp:connection:forced`` / ``no upstream available``; not a policy decision."""
    PREAUTH_MEMORY = "preauth_memory"
    """Refused at TCP accept: the bytes held for connections not yet admitted reached the
    pre-authentication memory budget."""
    PROXY_PROTOCOL = "proxy_protocol"
    """Refused on a listener with ``proxy_protocol`` before any byte was written: the peer is
    not in ``proxy_protocol_from``, or its PROXY header was missing, malformed, oversize or
    not complete within the handshake timeout."""
    VHOST_PAUSED = "vhost_paused"
    """An operator paused the vhost (``amqp-policy-proxy vhost pause``): new connections get
    QDR's connection denial until it is resumed; not a policy decision, never shadowed."""

    BANNED = "banned"
    """The user or the client address is banned (``amqp-policy-proxy ban``, or an automatic
    ``quarantine``): refused at the Open with QDR's connection denial until the ban expires or
    is lifted; not a policy decision, never shadowed (docs/operations.md, "Bans")."""

    GLOBAL_RATE = "global_rate"
    """Refused at TCP accept, before any byte: over ``[policy] max_connection_rate`` (an
    extension over QDR, docs/policy.md "Rate limits")."""
    VHOST_RATE = "vhost_rate"
    """Denied at the Open: over the vhost's ``maxConnectionRate`` (extension)."""
    USER_RATE = "user_rate"
    """Denied at the Open: over ``maxConnectionRatePerUser`` (group, else vhost; extension)."""
    HOST_RATE = "host_rate"
    """Denied at the Open: over ``maxConnectionRatePerHost`` (group, else vhost; extension)."""
    LEDGER_UNAVAILABLE = "ledger_unavailable"
    """The shared connection ledger (``[ledger]``, docs/fleet.md) is unreachable or slower than
    its ``timeout_ms`` and its ``failure_mode`` is ``closed``: denied with QDR's
    ``amqp:resource-limit-exceeded`` / ``connection disallowed by local policy``."""


class SessionDenyReason(StrEnum):
    """Why a session was denied (the ``reason`` of a shadowed session denial; the
    ``amqp_proxy_sessions_denied_total`` counter has one reason only and no label)."""

    SESSION_LIMIT = "session_limit"
    """A Begin beyond ``maxSessions``."""


class LinkDenyReason(StrEnum):
    """Why a link was denied (``amqp_proxy_links_denied_total{reason}``)."""

    SENDER_LIMIT = "sender_limit"
    RECEIVER_LIMIT = "receiver_limit"
    TARGET = "target"
    SOURCE = "source"
    ANONYMOUS_SENDER = "anonymous_sender"
    DYNAMIC_SOURCE = "dynamic_source"
    NO_SOURCE = "no_source"
    TOPIC = "topic"
    """Denied by the vhost's or group's topic authorization (docs/topic-authorization.md)."""


class MessageDenyReason(StrEnum):
    """Why a message was denied (``amqp_proxy_messages_denied_total{reason}``)."""

    MESSAGE_SIZE = "message_size"
    RELAY_TARGET = "relay_target"
    USER_ID = "user_id"
    TOPIC = "topic"
    """An anonymous-relay message's ``to`` denied publish by topic authorization."""
    TOPIC_WITHHELD = "topic_withheld"
    """A delivery to a wildcard subscriber withheld: no subscribe authority on its address,
    or its address is unknown and the subscriber may not see every topic the wildcard
    matches."""
    TOKEN_RENEWAL = "token_renewal"
    """A ``PUT /auth/tokens`` to RabbitMQ's own ``/management`` the proxy refused (the token
    is worse than the connection's, or the request is malformed): never forwarded."""
    ROUTER_ANNOTATIONS = "router_annotations"
    """An anonymous-relay message carrying the router's own ``x-opt-qd.*`` annotations (by
    which qdrouterd would route it past the ``to`` the proxy checked)."""


class DenialKind(StrEnum):
    """What a denial refuses: the ``kind`` label of ``amqp_proxy_shadow_denials_total``."""

    CONNECTION = "connection"
    SESSION = "session"
    LINK = "link"
    MESSAGE = "message"
