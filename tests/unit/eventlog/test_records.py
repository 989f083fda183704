"""to_record: every core event maps to a schema-v2 record with exactly the schema's fields."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_policy_proxy.core import events as ev
from amqp_policy_proxy.core.events import (
    AdminAction,
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    ConnectionDenyReason,
    LinkDenied,
    LinkDenyReason,
    MessageDenied,
    MessageDenyReason,
    OpenDecided,
    PolicyReloaded,
    ProtocolViolation,
    Revoked,
    SaslFailed,
    SessionDenied,
    ShadowDenied,
    TokenRenewed,
    UpstreamConnectFailed,
)
from amqp_policy_proxy.eventlog import records, schema
from amqp_policy_proxy.eventlog.records import format_ts, to_record

# 2026-11-21T11:42:00Z is 1795261320 POSIX seconds; the loop clock started 1000 s earlier.
WALL = 1795261320.0
OFFSET = WALL - 1000.0
TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
WHO: dict[str, Any] = {
    "vhost": "vh1", "group": "g1", "user": "alice", "remote_host": "10.0.0.7",
    "listener": "0.0.0.0:5672",
}  # fmt: skip

NULLABLE = {"vhost", "group", "user", "address", "reason", "hostname", "role", "uid", "pid",
            "fleet"}

EVENTS = {
    schema.CONNECTION_OPENED: ConnectionApproved(
        conn_id="c1", at=1000.0, hostname="vh1.example", **WHO
    ),
    schema.CONNECTION_DENIED: ConnectionDenied(
        conn_id="c2", at=1000.0, **WHO, reason=ConnectionDenyReason.USER_LIMIT,
        condition="amqp:resource-limit-exceeded",
        description="connection disallowed by local policy",
    ),
    schema.CONNECTION_CLOSED: ConnectionClosed(
        conn_id="c1", at=1061.5, **WHO, opened_at=1000.0, duration_seconds=61.5,
        bytes_in=2048, bytes_out=4096, transfers_in=3, transfers_out=4, max_sessions=2,
        max_senders=1, max_receivers=1, close_reason="client_close",
    ),
    schema.SESSION_DENIED: SessionDenied(conn_id="c1", at=1000.0, **WHO, channel=9),
    schema.LINK_DENIED: LinkDenied(
        conn_id="c1", at=1000.0, **WHO, role="sender", address="orders",
        reason=LinkDenyReason.TARGET,
    ),
    schema.MESSAGE_DENIED: MessageDenied(
        conn_id="c1", at=1000.0, **WHO, address=None, reason=MessageDenyReason.MESSAGE_SIZE,
        size=1_048_577,
    ),
    schema.PROTOCOL_ERROR: ProtocolViolation(
        conn_id="c1", at=1000.0, **WHO, side="client",
        condition="amqp:connection:framing-error", description="frame exceeds max-frame-size",
    ),
    schema.POLICY_RELOADED: PolicyReloaded(
        at=1000.0, digest="sha256:00ff", result="error", issues=("vhost 'a': unknown key 'x'",)
    ),
    schema.AUTH_DECISION: OpenDecided(
        conn_id="c1", at=1000.0, **WHO, decision="allow", reason="user_limit",
        enforcement="shadow", rule="maxConnectionsPerUser 2 (group 'g1') reached",
        hostname="vh1.example",
    ),
    schema.SHADOW_DENIED: ShadowDenied(
        conn_id="c1", at=1000.0, **WHO, kind="link", reason="target", role="sender",
        address="orders",
    ),
    schema.SASL_FAILED: SaslFailed(
        conn_id="c1", at=1000.0, **WHO, mechanism="PLAIN", reason="auth", code=1,
    ),
    schema.REVOKED: Revoked(
        conn_id="c1", at=1000.0, **WHO, kind="link", reason="target", mode="enforce",
        role="sender", address="orders.new",
    ),
    schema.PROXY_INFO: ev.ProxyInfo(at=1000.0, ledger="fleet", fleet="redis://10.0.0.5:6379/0",
                                    proxy_id="px-1"),
    schema.TOKEN_RENEWED: TokenRenewed(
        conn_id="c1", at=1000.0, **WHO, node="$cbs", result="refused", reason="not_newer",
    ),
    schema.ADMIN_ACTION: AdminAction(
        at=1000.0, action="connections_close", uid=0, pid=4242, peer="unix",
        selector="user=alice", targets=("c1", "c7"), result="ok", count=2,
        description="maintenance", vhost=None,
    ),
}  # fmt: skip


def check_record(record: dict[str, Any]) -> None:
    """Assert ``record`` is valid schema v2: exactly the fields, the JSON types, the formats."""
    name = record["event"]
    assert name in schema.EVENT_NAMES
    optional = [f for f in schema.OPTIONAL_FIELDS if f in record]
    expected = list(schema.COMMON_FIELDS) + optional + list(schema.EVENT_FIELDS[name])
    assert list(record) == expected  # exactly these fields, in schema order
    types = {**schema.COMMON_FIELDS, **{f: schema.OPTIONAL_FIELDS[f] for f in optional},
             **schema.EVENT_FIELDS[name]}
    reloaded = name in (schema.POLICY_RELOADED, schema.ADMIN_ACTION, schema.PROXY_INFO)
    for field_name, kind in types.items():
        value = record[field_name]
        if value is None:
            assert field_name in NULLABLE or (
                reloaded and field_name in ("remote_host", "listener")
            ), field_name
            continue
        if kind in ("int", "long"):
            assert type(value) is int, field_name
        elif kind == "double":
            assert type(value) is float and math.isfinite(value), field_name
        elif kind == "string":
            assert type(value) is str, field_name
        elif kind == "array<string>":
            assert type(value) is list and all(type(v) is str for v in value), field_name
        else:  # pragma: no cover - a new schema type needs a check here
            raise AssertionError(f"unknown schema type {kind}")
    assert record["schema_version"] == schema.SCHEMA_VERSION
    assert TS_RE.match(record["ts"])
    if name == schema.CONNECTION_CLOSED:
        assert TS_RE.match(record["opened_ts"])
        assert record["close_reason"] in schema.CLOSE_REASONS
    # JSON-ready: a round trip changes nothing.
    assert json.loads(json.dumps(record, allow_nan=False)) == record


@pytest.mark.parametrize("name", schema.EVENT_NAMES)
def test_every_schema_event_has_a_valid_record(name):
    record = to_record(EVENTS[name], wall_offset=OFFSET)
    assert record is not None
    assert record["event"] == name
    check_record(record)


def test_every_core_event_type_is_covered():
    event_types = {
        obj
        for obj in vars(ev).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj is not ev.ProxyEvent
    }
    # metric-only: a connect failure; a token refusal (its record is the sasl_failed)
    covered = {type(event) for event in EVENTS.values()} | {UpstreamConnectFailed,
                                                             ev.TokenRefused}
    assert event_types == covered


def test_connection_opened_exact():
    assert to_record(EVENTS[schema.CONNECTION_OPENED], wall_offset=OFFSET) == {
        "schema_version": 4,
        "event": "connection_opened",
        "ts": "2026-11-21T11:42:00.000Z",
        "conn_id": "c1",
        "vhost": "vh1",
        "group": "g1",
        "user": "alice",
        "remote_host": "10.0.0.7",
        "listener": "0.0.0.0:5672",
    }


def test_connection_closed_exact():
    record = to_record(EVENTS[schema.CONNECTION_CLOSED], wall_offset=OFFSET)
    assert record is not None
    assert record["ts"] == "2026-11-21T11:43:01.500Z"
    assert record["opened_ts"] == "2026-11-21T11:42:00.000Z"
    assert {k: record[k] for k in list(schema.EVENT_FIELDS["connection_closed"])[1:]} == {
        "duration_seconds": 61.5,
        "bytes_in": 2048,
        "bytes_out": 4096,
        "transfers_in": 3,
        "transfers_out": 4,
        "max_sessions": 2,
        "max_senders": 1,
        "max_receivers": 1,
        "close_reason": "client_close",
    }


def test_denials_carry_reason_values_as_plain_strings():
    denied = to_record(EVENTS[schema.CONNECTION_DENIED], wall_offset=OFFSET)
    link = to_record(EVENTS[schema.LINK_DENIED], wall_offset=OFFSET)
    message = to_record(EVENTS[schema.MESSAGE_DENIED], wall_offset=OFFSET)
    assert denied is not None and link is not None and message is not None
    assert type(denied["reason"]) is str and denied["reason"] == "user_limit"
    assert denied["condition"] == "amqp:resource-limit-exceeded"
    assert (link["role"], link["address"], link["reason"]) == ("sender", "orders", "target")
    assert (message["address"], message["reason"], message["size"]) == (
        None,
        "message_size",
        1_048_577,
    )


def test_policy_reloaded_has_no_connection_fields():
    record = to_record(EVENTS[schema.POLICY_RELOADED], wall_offset=OFFSET)
    assert record is not None
    assert record["conn_id"] == ""
    for name in ("vhost", "group", "user", "remote_host", "listener"):
        assert record[name] is None
    assert record["issues"] == ["vhost 'a': unknown key 'x'"]
    assert record["digest"] == "sha256:00ff" and record["result"] == "error"


def test_audit_records_exact():
    common = {"ts": "2026-11-21T11:42:00.000Z", "conn_id": "c1", **WHO}
    assert to_record(EVENTS[schema.AUTH_DECISION], wall_offset=OFFSET) == {
        "schema_version": 4, "event": "auth_decision", **common, "decision": "allow",
        "reason": "user_limit", "enforcement": "shadow",
        "rule": "maxConnectionsPerUser 2 (group 'g1') reached", "hostname": "vh1.example",
    }
    assert to_record(EVENTS[schema.SHADOW_DENIED], wall_offset=OFFSET) == {
        "schema_version": 4, "event": "shadow_denied", **common, "kind": "link",
        "reason": "target", "role": "sender", "address": "orders",
    }
    assert to_record(EVENTS[schema.ADMIN_ACTION], wall_offset=OFFSET) == {
        "schema_version": 4, "event": "admin_action", "ts": "2026-11-21T11:42:00.000Z",
        "conn_id": "", "vhost": None, "group": None, "user": None, "remote_host": None,
        "listener": None, "action": "connections_close", "uid": 0, "pid": 4242,
        "peer": "unix", "selector": "user=alice", "targets": ["c1", "c7"], "result": "ok",
        "count": 2, "description": "maintenance",
    }  # fmt: skip


def test_admin_action_on_a_vhost_names_it_and_tcp_has_no_credentials():
    event = AdminAction(at=1000.0, action="vhost_pause", uid=None, pid=None,
                        peer="127.0.0.1:40000", selector="vhost=shop", targets=("shop",),
                        result="ok", vhost="shop")  # fmt: skip
    record = to_record(event, wall_offset=OFFSET)
    assert record is not None
    check_record(record)
    assert (record["vhost"], record["uid"], record["pid"]) == ("shop", None, None)
    assert record["action"] in schema.ADMIN_ACTIONS


def test_version_2_only_adds_events_and_fields():
    # every v1 record stays valid: the v1 events keep exactly their fields
    assert [n for n, v in schema.EVENT_SINCE.items() if v == 1] == [
        "connection_opened", "connection_denied", "connection_closed", "session_denied",
        "link_denied", "message_denied", "protocol_error", "policy_reloaded"]
    assert list(schema.EVENT_FIELDS["connection_denied"]) == [
        "reason", "condition", "description"]
    assert set(schema.EVENT_SINCE) == set(schema.EVENT_NAMES)
    for name, fields in schema.EVENT_FIELDS.items():  # one type per field name, every event
        for field_name, kind in fields.items():
            assert schema.ALL_FIELDS[field_name] == kind, (name, field_name)


def test_denied_before_vhost_resolution_has_nulls():
    event = ConnectionDenied(conn_id="c9", at=1000.0, reason=ConnectionDenyReason.GLOBAL_LIMIT,
                             remote_host="192.0.2.1", listener="[::]:5672")  # fmt: skip
    record = to_record(event, wall_offset=OFFSET)
    assert record is not None
    check_record(record)
    assert (record["vhost"], record["group"], record["user"]) == (None, None, None)
    assert (record["condition"], record["description"]) == ("", "")


def test_upstream_connect_failed_is_not_a_record():
    event = UpstreamConnectFailed(conn_id="c1", at=1.0, upstream="127.0.0.1:25672")
    assert to_record(event, wall_offset=OFFSET) is None


@pytest.mark.parametrize("name", [n for n in schema.EVENT_NAMES
                                  if n not in (schema.POLICY_RELOADED, schema.ADMIN_ACTION,
                                               schema.PROXY_INFO)])
def test_a_proxied_connection_records_the_balancer_after_the_common_fields(name):
    event = dataclasses.replace(EVENTS[name], remote_host="192.0.2.7", balancer_host="10.0.0.2")
    record = to_record(event, wall_offset=OFFSET)
    assert record is not None
    check_record(record)
    assert (record["remote_host"], record["balancer_host"]) == ("192.0.2.7", "10.0.0.2")
    assert list(record)[len(schema.COMMON_FIELDS)] == "balancer_host"


def test_schema_versions_2_and_3_only_add():
    """A version-1 reader that ignores unknown fields reads version 2; version 3 adds values
    only (the ban actions and the close reason banned); Spark reads every one."""
    assert schema.SCHEMA_VERSION == 4
    assert {"ban", "unban", "ban_expired", "quarantine"} <= set(schema.ADMIN_ACTIONS)
    assert "banned" in schema.CLOSE_REASONS
    assert "balancer_host" not in schema.COMMON_FIELDS
    assert schema.ALL_FIELDS["balancer_host"] == "string"
    assert list(schema.ALL_FIELDS)[:len(schema.COMMON_FIELDS)] == list(schema.COMMON_FIELDS)


def test_unknown_objects_are_not_records():
    assert to_record(object(), wall_offset=0.0) is None


def test_records_follow_the_schema_and_the_event_annotations(monkeypatch):
    """The builders are derived from the schema: a field it declares that the event does not
    carry is refused when the builder is made, not filled in; a field the event may leave None
    is null."""
    fields = {**schema.EVENT_FIELDS[schema.LINK_DENIED], "password": "string"}
    monkeypatch.setitem(schema.EVENT_FIELDS, schema.LINK_DENIED, fields)
    with pytest.raises(TypeError, match="'password'"):
        records._builder(LinkDenied, schema.LINK_DENIED)
    monkeypatch.undo()
    build = records._builder(LinkDenied, schema.LINK_DENIED)
    event = LinkDenied(conn_id="c1", at=1000.0, **WHO, role="sender", address=None,
                       reason=LinkDenyReason.SENDER_LIMIT)
    assert build(event, OFFSET)["address"] is None
    assert build(event, OFFSET) == to_record(event, wall_offset=OFFSET)


def test_no_secret_or_foreign_fields_leak():
    """An event carrying extra attributes (a subclass with a password) logs schema fields only."""

    @dataclasses.dataclass(slots=True, kw_only=True)
    class ApprovedWithSecrets(ConnectionApproved):
        password: str = "hunter2"
        sasl_response: bytes = b"\x00alice\x00hunter2"

    event = ApprovedWithSecrets(conn_id="c1", at=1000.0, **WHO)
    # Not the mapped type: refused outright rather than guessed.
    assert to_record(event, wall_offset=OFFSET) is None
    # The mapped types' non-schema attributes (hostname, channel) are not logged either.
    for name, event in EVENTS.items():
        record = to_record(event, wall_offset=OFFSET)
        assert record is not None
        assert set(record) == set(schema.COMMON_FIELDS) | set(schema.EVENT_FIELDS[name])
        assert "hunter2" not in json.dumps(record)
    opened = to_record(EVENTS[schema.CONNECTION_OPENED], wall_offset=OFFSET)
    assert opened is not None and "vh1.example" not in json.dumps(opened)


def test_non_finite_duration_is_null():
    event = dataclasses.replace(EVENTS[schema.CONNECTION_CLOSED], duration_seconds=math.nan)
    record = to_record(event, wall_offset=OFFSET)
    assert record is not None and record["duration_seconds"] is None
    json.dumps(record, allow_nan=False)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0.0, "1970-01-01T00:00:00.000Z"),
        (WALL + 0.123, "2026-11-21T11:42:00.123Z"),
        (WALL + 0.1234, "2026-11-21T11:42:00.123Z"),
        (WALL + 0.9996, "2026-11-21T11:42:01.000Z"),
        (WALL + 3599.9999, "2026-11-21T12:42:00.000Z"),
        (1704067199.9996, "2024-01-01T00:00:00.000Z"),  # rounds across a year boundary
        (951782400.5, "2000-02-29T00:00:00.500Z"),
    ],
)
def test_format_ts(seconds, expected):
    assert format_ts(seconds) == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_format_ts_rejects_non_finite(bad):
    with pytest.raises(ValueError):
        format_ts(bad)


@given(st.floats(min_value=0, max_value=4_000_000_000), st.floats(min_value=0, max_value=1e6))
def test_format_ts_is_monotonic_and_valid(start, delta):
    first, second = format_ts(start), format_ts(start + delta)
    assert TS_RE.match(first) and TS_RE.match(second)
    assert first <= second  # fixed-width ISO strings sort like times


def test_documented_examples_are_valid_records():
    """docs/observability.md shows one valid example line per event, as to_record writes it."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "observability.md").read_text()
    examples = [json.loads(line) for line in re.findall(r"```json\n(.*)\n```", doc)]
    assert sorted(r["event"] for r in examples) == sorted(schema.EVENT_NAMES)
    for record in examples:
        check_record(record)


def test_records_module_reads_no_clock_and_does_no_io():
    tree = ast.parse(Path(records.__file__).read_text())
    forbidden_imports = {"asyncio", "socket", "time", "os", "io", "threading", "prometheus_client"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & forbidden_imports
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in forbidden_imports
        elif isinstance(node, ast.Attribute):
            assert node.attr not in {"now", "utcnow", "today", "time", "monotonic"}, node.attr
        elif isinstance(node, ast.Name):
            assert node.id not in {"open", "print"}, node.id


def test_version_4_adds_the_proxy_info_header_and_token_renewals_only():
    """Version 4 adds two records, ``proxy_info`` and ``token_renewed`` (no field of an older
    record changes)."""
    assert schema.EVENT_SINCE[schema.PROXY_INFO] == 4
    assert [n for n, v in schema.EVENT_SINCE.items() if v == 4] == [
        schema.PROXY_INFO, schema.TOKEN_RENEWED]
    record = records.proxy_info_record("2026-11-21T10:00:00.123Z", ledger="local", proxy_id="")
    check_record(record)
    assert record == {"schema_version": 4, "event": "proxy_info",
                      "ts": "2026-11-21T10:00:00.123Z", "conn_id": "", "vhost": None,
                      "group": None, "user": None, "remote_host": None, "listener": None,
                      "ledger": "local", "fleet": None, "proxy_id": ""}
    with pytest.raises(ValueError):
        records.proxy_info_record("2026-11-21T10:00:00.123Z", ledger="redis", proxy_id="")
