"""Sans-IO. Maps core events to event log records, schema v2 (docs/observability.md, "Event log").

No I/O and no clock reads: the wall-clock offset comes in as an argument (the daemon computes
``time.time() - loop.time()``), so the same event always gives the same record.

Redaction lives here: a record is assembled field by field from the schema's
allow-list (:data:`~amqp_policy_proxy.eventlog.schema.COMMON_FIELDS`, the
:data:`~amqp_policy_proxy.eventlog.schema.OPTIONAL_FIELDS` an event has, plus the event's
:data:`~amqp_policy_proxy.eventlog.schema.EVENT_FIELDS`), so nothing else an event may carry
(SASL responses, passwords, channel numbers, future fields) can reach the log.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from amqp_policy_proxy.core.events import (
    AdminAction,
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    LinkDenied,
    MessageDenied,
    OpenDecided,
    PolicyReloaded,
    ProtocolViolation,
    ProxyEvent,
    SessionDenied,
    ShadowDenied,
)
from amqp_policy_proxy.eventlog import schema

__all__ = ["format_ts", "to_record"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def format_ts(seconds: float) -> str:
    """Format a wall-clock time as the schema's ``ts``: UTC RFC 3339 with milliseconds.

    Rounds to the nearest millisecond (monotonic: a later time never formats earlier).

    Args:
        seconds: POSIX seconds (``event.at + wall_offset``).

    Returns:
        e.g. ``2026-11-21T11:42:00.123Z``.

    Raises:
        ValueError: ``seconds`` is not finite.
        OverflowError: ``seconds`` is outside the years 1..9999.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"timestamp is not finite: {seconds!r}")
    # Integer millisecond arithmetic: no float rounding in the fraction.
    whole, millis = divmod(round(seconds * 1000.0), 1000)
    return f"{_second_prefix(whole)}.{millis:03d}Z"


@functools.lru_cache(maxsize=1024)
def _second_prefix(whole_seconds: int) -> str:
    """Return ``YYYY-MM-DDTHH:MM:SS`` (UTC) of a POSIX second.

    Cached: records arrive in time order, so consecutive records mostly share their second,
    and this is the costly part of formatting a ``ts``.
    """
    return f"{_EPOCH + timedelta(seconds=whole_seconds):%Y-%m-%dT%H:%M:%S}"


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _finite(value: float) -> float | None:
    """Return ``value`` as a float, or None when NaN/infinite (JSON has no such numbers)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _connection_opened(event: ConnectionApproved, wall_offset: float) -> dict[str, Any]:
    return {}


def _connection_denied(event: ConnectionDenied, wall_offset: float) -> dict[str, Any]:
    return {
        "reason": str(event.reason),
        "condition": str(event.condition),
        "description": str(event.description),
    }


def _connection_closed(event: ConnectionClosed, wall_offset: float) -> dict[str, Any]:
    return {
        "opened_ts": format_ts(event.opened_at + wall_offset),
        "duration_seconds": _finite(event.duration_seconds),
        "bytes_in": int(event.bytes_in),
        "bytes_out": int(event.bytes_out),
        "transfers_in": int(event.transfers_in),
        "transfers_out": int(event.transfers_out),
        "max_sessions": int(event.max_sessions),
        "max_senders": int(event.max_senders),
        "max_receivers": int(event.max_receivers),
        "close_reason": str(event.close_reason),
    }


def _session_denied(event: SessionDenied, wall_offset: float) -> dict[str, Any]:
    return {}


def _link_denied(event: LinkDenied, wall_offset: float) -> dict[str, Any]:
    return {
        "role": str(event.role),
        "address": _opt_str(event.address),
        "reason": str(event.reason),
    }


def _message_denied(event: MessageDenied, wall_offset: float) -> dict[str, Any]:
    return {
        "address": _opt_str(event.address),
        "reason": str(event.reason),
        "size": int(event.size),
    }


def _protocol_error(event: ProtocolViolation, wall_offset: float) -> dict[str, Any]:
    return {
        "side": str(event.side),
        "condition": str(event.condition),
        "description": str(event.description),
    }


def _policy_reloaded(event: PolicyReloaded, wall_offset: float) -> dict[str, Any]:
    return {
        "digest": str(event.digest),
        "result": str(event.result),
        "issues": [str(issue) for issue in event.issues],
    }


def _auth_decision(event: OpenDecided, wall_offset: float) -> dict[str, Any]:
    return {
        "decision": str(event.decision),
        "reason": _opt_str(event.reason),
        "enforcement": str(event.enforcement),
        "rule": str(event.rule),
        "hostname": _opt_str(event.hostname),
    }


def _shadow_denied(event: ShadowDenied, wall_offset: float) -> dict[str, Any]:
    return {
        "kind": str(event.kind),
        "reason": str(event.reason),
        "role": _opt_str(event.role),
        "address": _opt_str(event.address),
    }


def _admin_action(event: AdminAction, wall_offset: float) -> dict[str, Any]:
    return {
        "action": str(event.action),
        "uid": None if event.uid is None else int(event.uid),
        "pid": None if event.pid is None else int(event.pid),
        "peer": str(event.peer),
        "selector": str(event.selector),
        "targets": [str(t) for t in event.targets],
        "result": str(event.result),
        "count": int(event.count),
        "description": str(event.description),
    }


# Event type -> (event name, extra-field builder). UpstreamConnectFailed is deliberately absent:
# it is a metric only (amqp_proxy_upstream_connect_failures_total), not a connection fact.
_MAPPING: dict[type, tuple[str, Callable[[Any, float], dict[str, Any]]]] = {
    ConnectionApproved: (schema.CONNECTION_OPENED, _connection_opened),
    ConnectionDenied: (schema.CONNECTION_DENIED, _connection_denied),
    ConnectionClosed: (schema.CONNECTION_CLOSED, _connection_closed),
    SessionDenied: (schema.SESSION_DENIED, _session_denied),
    LinkDenied: (schema.LINK_DENIED, _link_denied),
    MessageDenied: (schema.MESSAGE_DENIED, _message_denied),
    ProtocolViolation: (schema.PROTOCOL_ERROR, _protocol_error),
    PolicyReloaded: (schema.POLICY_RELOADED, _policy_reloaded),
    OpenDecided: (schema.AUTH_DECISION, _auth_decision),
    ShadowDenied: (schema.SHADOW_DENIED, _shadow_denied),
    AdminAction: (schema.ADMIN_ACTION, _admin_action),
}


def to_record(event: object, *, wall_offset: float) -> dict[str, Any] | None:
    """Map one core event to a schema-v2 event log record, ready for ``json.dumps``.

    The record has exactly the schema's common fields (in
    :data:`~amqp_policy_proxy.eventlog.schema.COMMON_FIELDS` order), then ``balancer_host``
    when the event has one (a connection whose address came from a PROXY protocol header),
    then the event's own fields (:data:`~amqp_policy_proxy.eventlog.schema.EVENT_FIELDS`
    order), and nothing else. ``vhost``, ``group``, ``user`` and ``address`` are null when unknown. A
    ``policy_reloaded`` record has ``conn_id`` ``""`` and null ``vhost``, ``group``, ``user``,
    ``remote_host`` and ``listener``; an ``admin_action`` record the same, except ``vhost``
    for a vhost pause, resume or close by vhost. A non-finite ``duration_seconds`` is written
    as null.

    Args:
        event: an event of :mod:`amqp_policy_proxy.core.events`.
        wall_offset: seconds to add to the event's loop-clock times (``at``, ``opened_at``) to
            get POSIX wall-clock time: ``time.time() - loop.time()``, taken by the daemon.

    Returns:
        The record, or None for events that are not event log records
        (``UpstreamConnectFailed``, and any type unknown to this schema version).

    Raises:
        ValueError: an event time is not finite.
    """
    mapped = _MAPPING.get(type(event))
    if mapped is None:
        return None
    name, build_extra = mapped
    record: dict[str, Any] = {
        "schema_version": schema.SCHEMA_VERSION,
        "event": name,
        "ts": format_ts(event.at + wall_offset),  # type: ignore[attr-defined]
    }
    if isinstance(event, ProxyEvent):
        record["conn_id"] = str(event.conn_id)
        record["vhost"] = _opt_str(event.vhost)
        record["group"] = _opt_str(event.group)
        record["user"] = _opt_str(event.user)
        record["remote_host"] = str(event.remote_host)
        record["listener"] = str(event.listener)
        if event.balancer_host is not None:
            record["balancer_host"] = str(event.balancer_host)
    else:  # PolicyReloaded, AdminAction: not tied to a connection.
        record["conn_id"] = ""
        for field_name in ("vhost", "group", "user", "remote_host", "listener"):
            record[field_name] = None
        if isinstance(event, AdminAction):
            record["vhost"] = _opt_str(event.vhost)
    extra = build_extra(event, wall_offset)
    # The allow-list: only schema fields, each exactly once, in schema order.
    for field_name in schema.EVENT_FIELDS[name]:
        record[field_name] = extra[field_name]
    return record
