"""limits/connections.py: ledger arithmetic (QDR's global, per-vhost, per-user and per-host counts)."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.limits.connections import ConnectionLedger, LedgerSnapshot
from amqp_policy_proxy.policy.model import GroupSettings, VhostPolicy

VHOST = VhostPolicy(hostname="v", max_connections=4, max_connections_per_user=2,
                    max_connections_per_host=3)
GROUP = GroupSettings(name="g")
OTHER = GroupSettings(name="h")


def _admit(ledger: ConnectionLedger, cid: str, user: str = "u", host: str = "10.0.0.1",
           vhost: VhostPolicy = VHOST, group: GroupSettings = GROUP) -> str | None:
    return ledger.try_admit(cid, vhost=vhost, group=group, user=user, remote_host=host)


def test_global_stage_zero() -> None:
    ledger = ConnectionLedger(2)
    assert ledger.try_accept() and ledger.try_accept()
    assert not ledger.try_accept()
    assert (ledger.global_current(), ledger.global_denied()) == (2, 1)
    ledger.release_accept()
    assert ledger.try_accept()
    ledger.max_connections = 1  # lowered on reload: counted transports stay
    assert not ledger.try_accept()
    for _ in range(5):
        ledger.release_accept()
    assert ledger.global_current() == 0  # never below zero
    assert not ConnectionLedger(0).try_accept()  # 0 refuses everything


def test_user_host_and_vhost_limits_in_qdr_order() -> None:
    ledger = ConnectionLedger(100)
    assert _admit(ledger, "c1", "u") is None
    assert _admit(ledger, "c2", "u") is None
    assert _admit(ledger, "c3", "u") == "user_limit"
    assert _admit(ledger, "c3", "w") is None
    assert _admit(ledger, "c4", "x") == "host_limit"  # 3 from 10.0.0.1
    assert _admit(ledger, "c4", "x", host="10.0.0.2") is None
    assert ledger.vhost_active("v") == 4
    # vhost limit is reported first even when user and host limits also fail
    assert _admit(ledger, "c5", "u") == "vhost_limit"
    assert (ledger.user_active("v", "u"), ledger.host_active("v", "10.0.0.1")) == (2, 3)


def test_shadow_mode_counts_over_the_limit_and_still_names_it() -> None:
    ledger = ConnectionLedger(100)
    for cid in ("c1", "c2"):
        assert _admit(ledger, cid, "u") is None
    # enforce=False (shadow): counted although over maxConnectionsPerUser, reason returned
    assert ledger.try_admit("c3", vhost=VHOST, group=GROUP, user="u", remote_host="10.0.0.1",
                            enforce=False) == "user_limit"
    assert ledger.is_admitted("c3") and ledger.user_active("v", "u") == 3
    # later connections see the true count: the vhost limit is next
    assert ledger.try_admit("c4", vhost=VHOST, group=GROUP, user="w", remote_host="10.0.0.2",
                            enforce=False) is None
    assert ledger.try_admit("c5", vhost=VHOST, group=GROUP, user="w", remote_host="10.0.0.2",
                            enforce=False) == "vhost_limit"
    assert ledger.vhost_active("v") == 5 and ledger.release("c5") and ledger.release("c3")
    assert ledger.user_active("v", "u") == 2


def test_user_count_spans_groups_and_group_limits_override() -> None:
    ledger = ConnectionLedger(100)
    generous = GroupSettings(name="h", max_connections_per_user=3, max_connections_per_host=10)
    assert _admit(ledger, "c1", "u", group=GROUP) is None
    assert _admit(ledger, "c2", "u", group=GROUP) is None
    assert _admit(ledger, "c3", "u", group=GROUP) == "user_limit"
    assert _admit(ledger, "c3", "u", host="10.0.0.9", group=generous) is None
    # n_user counts the user's connections in both groups: 3 >= 3
    assert _admit(ledger, "c4", "u", host="10.0.0.9", group=generous) == "user_limit"
    assert (ledger.group_active("v", "g"), ledger.group_active("v", "h")) == (2, 1)


def test_limit_zero_denies_all() -> None:
    ledger = ConnectionLedger(100)
    assert _admit(ledger, "c1", vhost=VhostPolicy(hostname="z", max_connections=0)) == "vhost_limit"
    assert _admit(ledger, "c1", group=GroupSettings(name="g", max_connections_per_user=0)) == (
        "user_limit")
    assert _admit(ledger, "c1", group=GroupSettings(name="g", max_connections_per_host=0)) == (
        "host_limit")
    assert ledger.active() == 0


def test_release_exactly_once_and_cleanup() -> None:
    ledger = ConnectionLedger(100)
    assert _admit(ledger, "c1") is None
    assert ledger.is_admitted("c1")
    assert ledger.release("c1") is True
    assert ledger.release("c1") is False
    assert ledger.release("never") is False
    assert ledger.active() == 0 and ledger.vhost_active("v") == 0
    assert ledger._user == {} and ledger._host == {} and ledger._vhost == {}  # no empty entries
    assert ledger.snapshot().active == ()
    assert _admit(ledger, "c1") is None  # the id may be reused after release


def test_duplicate_conn_id_is_a_bug() -> None:
    ledger = ConnectionLedger(100)
    _admit(ledger, "c1")
    with pytest.raises(ValueError, match="already admitted"):
        _admit(ledger, "c1")


def test_limits_come_from_the_objects_passed_in_and_counts_carry_over() -> None:
    # A reload compiles new objects for the same vhost name: counts carry over by name, and
    # each admission uses the limits it is given (per-user and per-host never swapped).
    ledger = ConnectionLedger(100)
    old = VhostPolicy(hostname="v", max_connections_per_user=1, max_connections_per_host=50)
    assert _admit(ledger, "c1", vhost=old) is None
    assert _admit(ledger, "c2", vhost=old) == "user_limit"
    new = VhostPolicy(hostname="v", max_connections_per_user=50, max_connections_per_host=2)
    assert _admit(ledger, "c2", "w", vhost=new) is None
    assert _admit(ledger, "c3", "x", vhost=new) == "host_limit"
    assert ledger.vhost_active("v") == 2


def test_snapshot_is_immutable_copy() -> None:
    ledger = ConnectionLedger(10)
    ledger.try_accept()
    _admit(ledger, "c1", group=OTHER)
    _admit(ledger, "c2", "w")
    snap = ledger.snapshot()
    assert snap == LedgerSnapshot(global_current=1, global_denied=0,
                                  active=((("v", "g"), 1), (("v", "h"), 1)))
    ledger.release("c1")
    assert snap.active == ((("v", "g"), 1), (("v", "h"), 1))
    assert ledger.snapshot().active == ((("v", "g"), 1),)


def test_many_connections_are_cheap() -> None:
    ledger = ConnectionLedger(20000)
    vhost = VhostPolicy(hostname="big", max_connections=20000)
    for i in range(10000):
        assert ledger.try_admit(f"c{i}", vhost=vhost, group=GROUP, user=f"u{i % 100}",
                                remote_host=f"10.0.{i % 250}.1") is None
    assert ledger.active() == 10000
    for i in range(10000):
        assert ledger.release(f"c{i}")
    assert ledger.active() == 0 and not ledger._user and not ledger._host


def test_record_counts_without_checking_and_scope_counts_lists_them() -> None:
    ledger = ConnectionLedger(1)
    ledger.record("a", vhost="v", group="g", user="u", remote_host="h1")
    ledger.record("b", vhost="v", group="g", user="u", remote_host="h2")
    assert ledger.scope_counts() == {"v": (2, {"u": 2}, {"h1": 1, "h2": 1})}
    assert ledger.record_of("a") == ("v", "g", "u", "h1")
    with pytest.raises(ValueError):
        ledger.record("a", vhost="v", group="g", user="u", remote_host="h1")
    ledger.release("a")
    assert ledger.scope_counts() == {"v": (1, {"u": 1}, {"h2": 1})}
