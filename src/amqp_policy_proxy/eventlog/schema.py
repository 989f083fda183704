"""Event log schema, version 4 (docs/observability.md, "Event log"). Dependency-free.

This module is the single source of truth for event names and field names. It is imported by
the daemon's writer and by ``spark_reports`` (which builds its explicit Spark schemas from it),
so it must import nothing but the standard library.

File layout: ``DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl`` (UTC), one JSON object per
line. ``ts`` is UTC RFC 3339 with milliseconds, e.g. ``2026-11-21T11:42:00.123Z``.
"""

from __future__ import annotations

SCHEMA_VERSION = 4
"""The ``schema_version`` of every record written. History (each version reads the ones before
it; a field is never removed or retyped, only added):

* 1: the first schema.
* 2: adds the optional common field ``balancer_host`` (:data:`OPTIONAL_FIELDS`) and the audit
  trail: ``admin_action``, ``auth_decision`` and ``shadow_denied`` records and the
  ``close_reason`` ``admin_close``. Every version-1 record is a valid version-2 record.
* 3: adds the ``sasl_failed`` record (a failed authentication), the ``revoked`` record
  (a reload's policy took a connection or link back), the ``admin_action`` actions
  ``ban``, ``unban``, ``ban_expired`` and ``quarantine``, the ``close_reason`` values
  ``credential_expired``, ``lifetime``, ``revoked`` and ``banned``, and the
  ``connection_denied`` / ``auth_decision`` reason ``banned``. Every version-2 record is
  a valid version-3 record. Token connections (docs/oauth2.md) add values, no field: the
  ``close_reason`` ``token_expired`` and, as ``sasl_failed`` ``reason``, the reasons the
  proxy refuses a token for (``expired``, ``bad_audience``, ``unknown_kid``...).
* 4: adds the ``proxy_info`` record, the first line of every file: whether the writing
  process enforces its limits alone (``ledger`` ``local``) or with a fleet (``fleet``: the
  Redis ledger; ``fleet`` names the fleet, ``proxy_id`` the proxy in it). The capacity
  report sums the proxies of a fleet before comparing with a limit; and the
  ``token_renewed`` record (an in-band token renewal, accepted or refused). Every version-3
  record is a valid version-4 record; files without ``proxy_info`` (older logs) are read as
  ``local``.
"""

# Event names (the ``event`` field).
CONNECTION_OPENED = "connection_opened"
CONNECTION_DENIED = "connection_denied"
CONNECTION_CLOSED = "connection_closed"
SESSION_DENIED = "session_denied"
LINK_DENIED = "link_denied"
MESSAGE_DENIED = "message_denied"
PROTOCOL_ERROR = "protocol_error"
POLICY_RELOADED = "policy_reloaded"
AUTH_DECISION = "auth_decision"
"""Every Open decision, allowed or denied, with the rule that decided (since version 2)."""
SHADOW_DENIED = "shadow_denied"
"""A denial shadow mode let through (since version 2)."""
ADMIN_ACTION = "admin_action"
"""An operator's change through the admin interface (since version 2)."""
SASL_FAILED = "sasl_failed"
"""A failed authentication attempt (since version 3)."""
REVOKED = "revoked"
"""A reload's policy no longer admits an open connection or allows a link (since version 3)."""
PROXY_INFO = "proxy_info"
"""The first record of every file: the writing proxy and its ledger mode (since version 4)."""
TOKEN_RENEWED = "token_renewed"
"""A token connection's in-band renewal, accepted or refused (since version 4)."""

EVENT_NAMES: tuple[str, ...] = (
    CONNECTION_OPENED,
    CONNECTION_DENIED,
    CONNECTION_CLOSED,
    SESSION_DENIED,
    LINK_DENIED,
    MESSAGE_DENIED,
    PROTOCOL_ERROR,
    POLICY_RELOADED,
    AUTH_DECISION,
    SHADOW_DENIED,
    ADMIN_ACTION,
    REVOKED,
    SASL_FAILED,
    PROXY_INFO,
    TOKEN_RENEWED,
)

#: The schema version that introduced each event (readers of older logs expect none of the
#: newer ones).
EVENT_SINCE: dict[str, int] = {name: 1 for name in EVENT_NAMES} | {
    AUTH_DECISION: 2, SHADOW_DENIED: 2, ADMIN_ACTION: 2, REVOKED: 3, SASL_FAILED: 3,
    PROXY_INFO: 4, TOKEN_RENEWED: 4,
}

#: Fields present in every record, with their JSON type. ``vhost``, ``group``, ``user`` may be
#: null when not known yet (e.g. a connection denied before its vhost was resolved).
COMMON_FIELDS: dict[str, str] = {
    "schema_version": "int",
    "event": "string",
    "ts": "string",
    "conn_id": "string",
    "vhost": "string",
    "group": "string",
    "user": "string",
    "remote_host": "string",
    "listener": "string",
}

#: Fields present only in some records, with their JSON type, placed after the common fields:
#: ``balancer_host`` (since version 2) is the load balancer's address on records of
#: connections whose ``remote_host`` came from a PROXY protocol header; absent otherwise.
OPTIONAL_FIELDS: dict[str, str] = {
    "balancer_host": "string",
}

#: Extra fields per event, with their JSON type ("int", "double", "string", "array<string>").
EVENT_FIELDS: dict[str, dict[str, str]] = {
    CONNECTION_OPENED: {},
    CONNECTION_DENIED: {"reason": "string", "condition": "string", "description": "string"},
    CONNECTION_CLOSED: {
        "opened_ts": "string",
        "duration_seconds": "double",
        "bytes_in": "long",
        "bytes_out": "long",
        "transfers_in": "long",
        "transfers_out": "long",
        "max_sessions": "int",
        "max_senders": "int",
        "max_receivers": "int",
        "close_reason": "string",
    },
    SESSION_DENIED: {},
    LINK_DENIED: {"role": "string", "address": "string", "reason": "string"},
    MESSAGE_DENIED: {"address": "string", "reason": "string", "size": "long"},
    PROTOCOL_ERROR: {"side": "string", "condition": "string", "description": "string"},
    POLICY_RELOADED: {"digest": "string", "result": "string", "issues": "array<string>"},
    AUTH_DECISION: {"decision": "string", "reason": "string", "enforcement": "string",
                    "rule": "string", "hostname": "string"},
    SHADOW_DENIED: {"kind": "string", "reason": "string", "role": "string", "address": "string"},
    SASL_FAILED: {"mechanism": "string", "reason": "string", "code": "int"},
    TOKEN_RENEWED: {"node": "string", "result": "string", "reason": "string"},
    REVOKED: {"kind": "string", "reason": "string", "mode": "string", "role": "string",
              "address": "string"},
    ADMIN_ACTION: {"action": "string", "uid": "long", "pid": "long", "peer": "string",
                   "selector": "string", "targets": "array<string>", "result": "string",
                   "count": "long", "description": "string"},
    PROXY_INFO: {"ledger": "string", "fleet": "string", "proxy_id": "string"},
}

#: ``ledger`` values of ``proxy_info``: limits enforced by the process alone, or by the fleet.
LEDGER_LOCAL = "local"
LEDGER_FLEET = "fleet"

#: ``decision`` values of ``auth_decision``.
DECISIONS: tuple[str, ...] = ("allow", "deny")
#: ``action`` values of ``admin_action``.
ADMIN_ACTIONS: tuple[str, ...] = ("connections_close", "vhost_pause", "vhost_resume", "ban",
                                  "unban", "ban_expired", "quarantine")

#: Every field that may appear in a record, in a stable order (common fields first, then the
#: optional ones).
ALL_FIELDS: dict[str, str] = {**COMMON_FIELDS, **OPTIONAL_FIELDS}
for _fields in EVENT_FIELDS.values():
    for _name, _type in _fields.items():
        ALL_FIELDS.setdefault(_name, _type)
del _fields, _name, _type

#: ``bytes_in``/``transfers_in`` count what the proxy received from the client (client to
#: broker); ``bytes_out``/``transfers_out`` what it sent to the client (broker to client).
DIRECTION_IN = "client_to_broker"
DIRECTION_OUT = "broker_to_client"

#: ``close_reason`` values of ``connection_closed``.
CLOSE_REASONS: tuple[str, ...] = (
    "client_close",  # the client sent Close or closed its transport
    "broker_close",  # the router/broker sent Close or closed its transport
    "protocol_error",  # a framing/decode/state violation by either side
    "message_size",  # QDR oversize handling closed the connection
    "timeout",  # handshake timeout or idle-time-out
    "shutdown",  # the proxy is draining
    "upstream_unavailable",  # no upstream accepted the connection
    "internal_error",  # a proxy bug contained to this connection
    "admin_close",  # an operator closed it (connections close; since version 2)
    "credential_expired",  # the client certificate it authenticated with expired
    "lifetime",  # its group's maxConnectionLifetimeSeconds was reached
    "revoked",  # a reload's new policy no longer admits it ([policy] reevaluate_open)
    "banned",  # a ban (an operator's or a quarantine's) ended it (since version 3)
    "token_expired",  # the OAuth 2.0 token it authenticated with expired (docs/oauth2.md)
)


def partition_path(dt: str, hour: int, host: str, pid: int) -> str:
    """Return the relative path of one writer's hourly file.

    Args:
        dt: UTC date ``YYYY-MM-DD``.
        hour: UTC hour 0..23.
        host: the writing host's name (no ``/``).
        pid: the writing process id.

    Returns:
        ``dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl``.
    """
    return f"dt={dt}/hour={hour:02d}/events-{host}-{pid}.jsonl"
