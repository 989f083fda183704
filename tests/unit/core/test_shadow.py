"""core/shadow.py and its denial points: in shadow mode every decision is computed as usual,
a would-be denial is allowed, logged ``SHADOW DENY`` with the denial's own fields and reported
as ``ShadowDenied``; nothing on the wire changes."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from proton import Message

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import (
    ConnectionApproved,
    ConnectionDenied,
    LinkDenied,
    MessageDenied,
    OpenDecided,
    SessionDenied,
    ShadowDenied,
)
from amqp_policy_proxy.limits.connections import ConnectionLedger

from .helpers import Attach, Begin, Open, Script, Target, Transfer, frame, make_policy

LIMITS = {
    "remoteHosts": "127.0.0.1",
    "maxConnectionsPerUser": 1,
    "maxSessions": 1,
    "maxSenders": 1,
    "maxFrameSize": 4096,
    "maxSessionWindow": 40960,
    "maxMessageSize": 1000,
    "targets": "public.*",
    "allowAnonymousSender": True,
}


def policy(enforcement: str) -> Any:
    """One vhost ``test``: group ``g`` (alice) with limits, in ``enforcement``."""
    return make_policy({"g": {"users": "alice", **LIMITS}}, enforcement=enforcement)


def shadows(s: Script) -> list[tuple[str, str, str | None, str | None]]:
    return [(e.kind, e.reason, e.role, e.address) for e in s.events
            if isinstance(e, ShadowDenied)]


def denial_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The denial lines, without the connection id."""
    return [re.sub(r"^\[[^]]*\] ", "", r.getMessage()) for r in caplog.records
            if "DENY" in r.getMessage()]


def run_both(scenario: Any, caplog: pytest.LogCaptureFixture) -> tuple[Script, Script, list[str],
                                                                        list[str]]:
    """Run ``scenario(script)`` under enforce and under shadow; return both with their lines."""
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy")
    enforced = scenario(Script(policy("enforce")))
    lines_enforced = denial_lines(caplog)
    caplog.clear()
    shadowed = scenario(Script(policy("shadow")))
    return enforced, shadowed, lines_enforced, denial_lines(caplog)


def same_fields(enforced: list[str], shadowed: list[str]) -> None:
    assert enforced and [line.replace("DENY", "SHADOW DENY", 1) for line in enforced] == shadowed


def test_remote_host_denial_is_admitted_reported_and_counted(caplog) -> None:
    def scenario(s: Script) -> Script:
        s.conn = type(s.conn)("c1", remote_host="10.9.9.9", listener="l",
                              policy=s.conn.policy, ledger=s.ledger, now=0.0)
        s.open(user="alice")
        return s

    enforced, shadowed, lines_e, lines_s = run_both(scenario, caplog)
    assert any(isinstance(e, ConnectionDenied) for e in enforced.events)
    assert not any(isinstance(e, ConnectionDenied) for e in shadowed.events)
    assert any(isinstance(e, ConnectionApproved) for e in shadowed.events)
    assert shadows(shadowed) == [("connection", "remote_host", None, None)]
    decided = [e for e in shadowed.events if isinstance(e, OpenDecided)]
    assert [(d.decision, d.reason, d.enforcement) for d in decided] == [
        ("allow", "remote_host", "shadow")]
    assert "no remoteHosts item of the group matches" in decided[0].rule
    assert shadowed.ledger.user_active("test", "alice") == 1
    same_fields(lines_e, lines_s)


def test_connection_limit_in_shadow_counts_every_connection() -> None:
    ledger = ConnectionLedger(100)
    first, second = (Script(policy("shadow"), ledger=ledger, conn_id=c) for c in ("c1", "c2"))
    first.open(user="alice")
    second.open(user="alice")
    assert shadows(first) == []
    assert shadows(second) == [("connection", "user_limit", None, None)]
    rule = [e.rule for e in second.events if isinstance(e, OpenDecided)]
    assert rule == ["maxConnectionsPerUser 1 (group 'g') reached"]
    assert ledger.user_active("test", "alice") == 2  # the true count: both are connected
    enforced = Script(policy("enforce"), ledger=ConnectionLedger(100))
    enforced.ledger.try_admit("x", vhost=enforced.conn.policy.vhosts["test"],
                              group=enforced.conn.policy.vhosts["test"].groups["g"],
                              user="alice", remote_host="127.0.0.1")
    enforced.open(user="alice")
    assert [(e.reason, e.rule) for e in enforced.events if isinstance(e, OpenDecided)] == [
        ("user_limit", "maxConnectionsPerUser 1 (group 'g') reached")]


def test_unknown_user_in_a_shadow_vhost_is_admitted_without_a_group() -> None:
    s = Script(policy("shadow"))
    s.open(user="mallory")
    assert shadows(s) == [("connection", "unknown_user", None, None)]
    assert s.conn.view.admitted and s.conn.view.group is None
    assert s.ledger.group_active("test", "") == 1


def test_a_group_can_enforce_inside_a_vhost_in_shadow() -> None:
    strict = make_policy({"g": {"users": "alice", **LIMITS, "enforcement": "enforce"}},
                         enforcement="shadow")
    s = Script(strict, remote_host="10.9.9.9")
    s.open(user="alice")
    assert shadows(s) == [] and any(isinstance(e, ConnectionDenied) for e in s.events)


def test_open_is_not_rewritten_and_extra_sessions_are_reported(caplog) -> None:
    def scenario(s: Script) -> Script:
        s.open(user="alice", channel_max=100)
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        s.begin(0, router_channel=0)
        s.begin(1, router_channel=1)
        return s

    enforced, shadowed, lines_e, lines_s = run_both(scenario, caplog)
    # the router's Open: as sent (65536, 32767) in shadow, rewritten under enforce
    assert any(isinstance(e, SessionDenied) for e in enforced.events)
    assert shadows(shadowed) == [("session", "session_limit", None, None)]
    assert not any(isinstance(e, SessionDenied) for e in shadowed.events)
    begins = [p for _, p, _ in shadowed.take(Side.ROUTER) if isinstance(p, Begin)]
    assert len(begins) == 2  # both sessions reached the router
    same_fields(lines_e, lines_s)


def test_router_open_keeps_its_limits_in_shadow() -> None:
    for mode, expected in (("enforce", (4096, 0)), ("shadow", (65536, 32767))):
        s = Script(policy(mode))
        s.open(user="alice")
        opens = [p for _, p, _ in s.take(Side.CLIENT) if isinstance(p, Open)]
        assert (int(opens[0].max_frame_size), int(opens[0].channel_max)) == expected, mode


def test_link_denial_in_shadow_attaches_the_link(caplog) -> None:
    def scenario(s: Script) -> Script:
        s.open(user="alice")
        s.begin(0, router_channel=0)
        s.take(Side.CLIENT), s.take(Side.ROUTER)
        s.client(frame(0, Attach(name="s", handle=0, role=False,
                                 target=Target(address="private.x"))))
        return s

    enforced, shadowed, lines_e, lines_s = run_both(scenario, caplog)
    assert [type(p).__name__ for _, p, _ in enforced.take(Side.ROUTER)] == []
    assert any(isinstance(e, LinkDenied) for e in enforced.events)
    assert [type(p).__name__ for _, p, _ in shadowed.take(Side.ROUTER)] == ["Attach"]
    assert shadows(shadowed) == [("link", "target", "sender", "private.x")]
    assert shadowed.conn.view.figures.active_senders == 1
    same_fields(lines_e, lines_s)


def _sender(s: Script, address: str | None) -> None:
    s.open(user="alice")
    s.begin(0, router_channel=0)
    s.client(frame(0, Attach(name="s", handle=0, role=False, target=Target(address=address))))
    s.router(frame(0, Attach(name="s", handle=9, role=True, target=Target(address=address))))
    s.take(Side.CLIENT), s.take(Side.ROUTER)


def _frames(payload: bytes, chunk: int, delivery_id: int = 0) -> list[bytes]:
    parts = [payload[i:i + chunk] for i in range(0, len(payload), chunk)]
    out = []
    for i, part in enumerate(parts):
        more = i < len(parts) - 1
        t = (Transfer(handle=0, delivery_id=delivery_id, delivery_tag=b"t", message_format=0,
                      settled=False, more=more) if i == 0 else Transfer(handle=0, more=more))
        out.append(frame(0, t, part))
    return out


def test_oversize_message_in_shadow_is_forwarded_whole_and_reported_once(caplog) -> None:
    payload = Message(body=b"x" * 2500).encode()

    def scenario(s: Script) -> Script:
        _sender(s, "public.a")
        for f in _frames(payload, 700) + _frames(payload, 700, delivery_id=1):
            s.client(f)
        return s

    enforced, shadowed, lines_e, lines_s = run_both(scenario, caplog)
    assert [str(e.reason) for e in enforced.events if isinstance(e, MessageDenied)] == [
        "message_size"]
    sent = b"".join(_frames(payload, 700) + _frames(payload, 700, delivery_id=1))
    assert bytes(shadowed.sent[Side.ROUTER]) == sent  # byte-identical, nothing aborted
    assert shadowed.take(Side.CLIENT) == []  # no reject, no detach, no Close
    assert shadows(shadowed) == [("message", "message_size", None, "public.a")] * 2
    assert shadowed.conn.view.close_reason is None
    same_fields(lines_e, lines_s[:1])


def test_relay_target_in_shadow_is_forwarded(caplog) -> None:
    payload = Message(body=b"x", address="private.y").encode()

    def scenario(s: Script) -> Script:
        _sender(s, None)
        s.client(_frames(payload, 4000)[0])
        return s

    enforced, shadowed, lines_e, lines_s = run_both(scenario, caplog)
    assert [str(e.reason) for e in enforced.events if isinstance(e, MessageDenied)] == [
        "relay_target"]
    assert bytes(shadowed.sent[Side.ROUTER]) == _frames(payload, 4000)[0]
    assert shadows(shadowed) == [("message", "relay_target", None, "private.y")]
    same_fields(lines_e, lines_s)


def test_paused_vhost_is_denied_even_in_shadow(caplog) -> None:
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy")
    paused = {"test"}
    s = Script(policy("shadow"), paused=paused)
    s.open(user="alice")
    denied = [e for e in s.events if isinstance(e, ConnectionDenied)]
    assert [str(e.reason) for e in denied] == ["vhost_paused"]
    assert [(e.decision, e.enforcement, e.rule) for e in s.events
            if isinstance(e, OpenDecided)] == [
        ("deny", "enforce", "vhost 'test' paused by an operator")]
    assert shadows(s) == [] and s.ledger.active() == 0
    assert denial_lines(caplog) == [
        "DENY AMQP Open for user 'alice', rhost '127.0.0.1', vhost 'test': vhost paused by an "
        "operator"]
    paused.clear()  # resumed: the set is read at each decision
    again = Script(policy("shadow"), paused=paused)
    again.open(user="alice")
    assert again.conn.view.admitted


def test_enforced_allow_names_how_the_vhost_and_group_were_found() -> None:
    s = Script(policy("enforce"))
    s.open(user="alice")
    [decided] = [e for e in s.events if isinstance(e, OpenDecided)]
    assert (decided.decision, decided.reason, decided.enforcement, decided.hostname) == (
        "allow", None, "enforce", "test")
    assert decided.rule == ("vhost 'test' (exact name); group 'g' (user listed); remoteHosts "
                            "matches; counts within limits")
    assert s.conn.view.enforcement == "enforce"


def test_connection_rate_in_shadow_is_reported_and_the_connection_stays_counted() -> None:
    from amqp_policy_proxy.limits.rates import RateLimits

    rated = make_policy({"g": {"users": "alice", "remoteHosts": "*", "sources": "*",
                               "targets": "*", "maxConnectionRatePerUser": 1}},
                        enforcement="shadow")
    ledger, rates = ConnectionLedger(100), RateLimits()
    first, second = (Script(rated, ledger=ledger, rates=rates, conn_id=c) for c in ("c1", "c2"))
    first.open(user="alice")
    second.open(user="alice")  # the same instant: over 1 connection per second
    assert shadows(first) == []
    assert shadows(second) == [("connection", "user_rate", None, None)]
    assert [(e.decision, e.reason, e.rule) for e in second.events
            if isinstance(e, OpenDecided)] == [
        ("allow", "user_rate", "maxConnectionRatePerUser 1/s (group 'g') exceeded")]
    assert ledger.user_active("test", "alice") == 2  # admitted: both hold their count
