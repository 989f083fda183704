"""Sans-IO. Maps core events to event log records, schema v4 (docs/observability.md, "Event log").

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
from typing import Any, get_args, get_type_hints

from amqp_policy_proxy.core import events
from amqp_policy_proxy.eventlog import schema

__all__ = ["format_ts", "proxy_info_record", "to_record"]

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


def _finite(value: float) -> float | None:
    """Return ``value`` as a float, or None when NaN/infinite (JSON has no such numbers)."""
    number = float(value)
    return number if math.isfinite(number) else None


# Event type -> event name. UpstreamConnectFailed is deliberately absent: it is a metric only
# (amqp_proxy_upstream_connect_failures_total), not a connection fact. So is TokenRefused
# (amqp_proxy_token_rejections_total): the same refusal's record is its SaslFailed.
_EVENT_NAMES: dict[type, str] = {
    events.ConnectionApproved: schema.CONNECTION_OPENED,
    events.ConnectionDenied: schema.CONNECTION_DENIED,
    events.ConnectionClosed: schema.CONNECTION_CLOSED,
    events.SessionDenied: schema.SESSION_DENIED,
    events.LinkDenied: schema.LINK_DENIED,
    events.MessageDenied: schema.MESSAGE_DENIED,
    events.ProtocolViolation: schema.PROTOCOL_ERROR,
    events.PolicyReloaded: schema.POLICY_RELOADED,
    events.OpenDecided: schema.AUTH_DECISION,
    events.ShadowDenied: schema.SHADOW_DENIED,
    events.AdminAction: schema.ADMIN_ACTION,
    events.Revoked: schema.REVOKED,
    events.SaslFailed: schema.SASL_FAILED,
    events.ProxyInfo: schema.PROXY_INFO,
    events.TokenRenewed: schema.TOKEN_RENEWED,
}

#: How a value of each schema type becomes JSON, as an expression of the value ``{0}``. A
#: non-finite ``double`` is null.
_TO_JSON: dict[str, str] = {
    "string": "str({0})",
    "int": "int({0})",
    "long": "int({0})",
    "double": "_finite({0})",
    "array<string>": "[str(item) for item in {0}]",
}

#: Fields written as wall-clock ``ts`` strings, and the event attribute (loop-clock seconds)
#: each comes from. Every other field comes from the event attribute of its own name.
_WALL_CLOCK: dict[str, str] = {"ts": "at", "opened_ts": "opened_at"}

#: A common field the event does not carry (the event is not tied to a connection) is null,
#: but for ``conn_id``, which is ``""``.
_NOT_CARRIED: dict[str, str | None] = {"conn_id": ""}


def _value(event_type: type, hints: dict[str, Any], field_name: str, json_type: str) -> str:
    """Return the expression of one field's JSON value in a record of ``event_type``."""
    if field_name in _WALL_CLOCK:
        return f"format_ts(event.{_WALL_CLOCK[field_name]} + wall_offset)"
    if field_name not in hints:
        raise TypeError(f"{event_type.__name__} has no {field_name!r} for its record")
    attribute = f"event.{field_name}"
    converted = _TO_JSON[json_type].format(attribute)
    if type(None) in get_args(hints[field_name]):  # the event may leave it None: null
        return f"None if {attribute} is None else {converted}"
    return converted


def _builder(event_type: type, name: str) -> Callable[[Any, float], dict[str, Any]]:
    """Return the function that builds the records of ``event_type`` (named ``name``).

    Written from the schema (its fields in order, with their types) and the event's
    annotations (a field the event may leave None is null), then compiled, so that a record
    costs what one hand-written dict display would: for a ``link_denied``::

        def build(event, wall_offset):
            record = {"schema_version": 4, "event": "link_denied",
                      "ts": format_ts(event.at + wall_offset), "conn_id": str(event.conn_id),
                      "vhost": None if event.vhost is None else str(event.vhost), ...}
            if event.balancer_host is not None:
                record["balancer_host"] = str(event.balancer_host)
            record["role"] = str(event.role)
            ...
            return record
    """
    hints = get_type_hints(event_type)
    constants = {"schema_version": schema.SCHEMA_VERSION, "event": name}
    head = []
    for field_name, json_type in schema.COMMON_FIELDS.items():
        if field_name in constants:
            value = repr(constants[field_name])
        elif field_name in hints or field_name in _WALL_CLOCK:
            value = _value(event_type, hints, field_name, json_type)
        else:
            value = repr(_NOT_CARRIED.get(field_name))
        head.append(f"{field_name!r}: {value}")
    lines = ["def build(event, wall_offset):", f"    record = {{{', '.join(head)}}}"]
    for field_name, json_type in schema.OPTIONAL_FIELDS.items():
        if field_name in hints:
            lines.append(f"    if event.{field_name} is not None:")
            lines.append(f"        record[{field_name!r}] = "
                         f"{_TO_JSON[json_type].format(f'event.{field_name}')}")
    for field_name, json_type in schema.EVENT_FIELDS[name].items():
        lines.append(f"    record[{field_name!r}] = "
                     f"{_value(event_type, hints, field_name, json_type)}")
    lines.append("    return record")
    namespace: dict[str, Any] = {"format_ts": format_ts, "_finite": _finite}
    exec(compile("\n".join(lines), f"<{name} record builder>", "exec"), namespace)
    build: Callable[[Any, float], dict[str, Any]] = namespace["build"]
    return build


# Event type -> the builder of its records.
_BUILDERS: dict[type, Callable[[Any, float], dict[str, Any]]] = {
    event_type: _builder(event_type, name) for event_type, name in _EVENT_NAMES.items()
}


def to_record(event: object, *, wall_offset: float) -> dict[str, Any] | None:
    """Map one core event to a schema-v4 event log record, ready for ``json.dumps``.

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
    build = _BUILDERS.get(type(event))
    if build is None:
        return None
    return build(event, wall_offset)


def proxy_info_record(ts: str, *, ledger: str, proxy_id: str,
                      fleet: str | None = None) -> dict[str, Any]:
    """Return the ``proxy_info`` record that opens an event-log file (schema 4).

    Built by the same builder as every other record (:class:`~amqp_policy_proxy.core.events.ProxyInfo`),
    with ``ts`` given as written (the ``ts`` of the file's first record, so that the header
    falls in the file's own hour).

    Args:
        ts: a schema ``ts`` (``YYYY-MM-DDTHH:MM:SS.mmmZ``).
        ledger: ``local`` or ``fleet`` (:data:`~amqp_policy_proxy.eventlog.schema.LEDGER_LOCAL`,
            :data:`~amqp_policy_proxy.eventlog.schema.LEDGER_FLEET`).
        proxy_id: the proxy's name in its fleet (``""`` without a ledger).
        fleet: the fleet's name (None without a ledger).

    Returns:
        The record, ready for ``json.dumps``.

    Raises:
        ValueError: ``ledger`` is neither ``local`` nor ``fleet``.
    """
    if ledger not in (schema.LEDGER_LOCAL, schema.LEDGER_FLEET):
        raise ValueError(f"ledger must be local or fleet, got {ledger!r}")
    record = _BUILDERS[events.ProxyInfo](
        events.ProxyInfo(at=0.0, ledger=ledger, proxy_id=proxy_id, fleet=fleet), 0.0)
    record["ts"] = ts
    return record
