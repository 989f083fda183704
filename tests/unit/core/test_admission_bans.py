"""core/admission.py: a banned user or client address is refused at the Open, first."""

from __future__ import annotations

from dataclasses import replace

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionDenied, OpenDecided
from amqp_policy_proxy.limits.bans import HOST, USER, Ban, BanList
from amqp_policy_proxy.limits.connections import ConnectionLedger

from .helpers import Close, Open, Script, frame, make_policy

POLICY = make_policy({"g": {"users": "*", "remoteHosts": "*"}})


def decided(s: Script) -> tuple[str, str | None, str]:
    (event,) = [e for e in s.events if isinstance(e, OpenDecided)]
    return event.decision, event.reason, event.rule


def test_a_banned_user_gets_qdrs_denial_with_reason_banned_and_no_count() -> None:
    bans = BanList()
    bans.add(Ban(USER, "alice", "leaked password", created_at=0.0, expires_at=60.0))
    ledger = ConnectionLedger(100)
    s = Script(POLICY, bans=bans, ledger=ledger, now=1.0)
    s.open(user="alice")
    (denied,) = [e for e in s.events if isinstance(e, ConnectionDenied)]
    assert (denied.reason, denied.condition, denied.description, denied.vhost) == (
        "banned", "amqp:resource-limit-exceeded", "connection disallowed by local policy",
        "test")
    assert decided(s) == ("deny", "banned",
                          "user 'alice' banned by an operator: leaked password")
    frames = s.take(Side.CLIENT)
    assert isinstance(frames[-2][1], Open) and isinstance(frames[-1][1], Close)
    assert not any(isinstance(p, Open) for _, p, _ in s.take(Side.ROUTER))
    assert ledger.active() == 0
    # another user, and alice once the ban expired, are admitted
    other = Script(POLICY, bans=bans, conn_id="c2", now=1.0)
    other.open(user="bob")
    assert [e for e in other.events if isinstance(e, ConnectionApproved)]
    later = Script(POLICY, bans=bans, conn_id="c3", now=60.0)
    later.open(user="alice")
    assert [e for e in later.events if isinstance(e, ConnectionApproved)]


def test_a_host_ban_applies_with_no_user_and_with_vhost_policy_off() -> None:
    bans = BanList()
    bans.add(Ban(HOST, "10.0.0.0/8", "abuse", created_at=0.0))
    s = Script(POLICY, bans=bans, remote_host="10.9.8.7")
    s.open()  # no SASL: no user
    assert decided(s)[:2] == ("deny", "banned")
    off = replace(POLICY, settings=replace(POLICY.settings, enable_vhost_policy=False))
    s = Script(off, bans=bans, remote_host="10.9.8.7", conn_id="c2")
    s.open(user="carol")
    assert decided(s)[:2] == ("deny", "banned")


def test_the_list_is_read_at_the_decision_and_never_shadowed() -> None:
    bans = BanList()
    shadowed = make_policy({"g": {"users": "bob", "remoteHosts": "*"}}, enforcement="shadow")
    s = Script(shadowed, bans=bans)
    s.sasl_plain("alice")
    bans.add(Ban(USER, "alice", "now", created_at=0.0))  # between SASL and the Open
    s.client(b"AMQP\x00\x01\x00\x00")
    s.router(b"AMQP\x00\x01\x00\x00")
    s.client(frame(0, Open(container_id="c", hostname="test")))
    assert decided(s)[:2] == ("deny", "banned")
