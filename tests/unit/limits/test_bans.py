"""limits/bans.py: which Open a ban refuses, expiry on the caller's clock, listing."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.limits.bans import HOST, QUARANTINE, USER, Ban, BanList


def test_a_user_ban_refuses_that_user_from_anywhere_until_it_expires() -> None:
    bans = BanList()
    assert bans.banned("alice", "10.1.2.3", 0.0) is None
    bans.add(Ban(USER, "alice", "leaked password", created_at=0.0, expires_at=60.0))
    assert bans.banned("alice", "10.1.2.3", 1.0) == (
        "user 'alice' banned by an operator: leaked password")
    assert bans.banned("alice", "2001:db8::1", 59.9) is not None
    assert bans.banned("bob", "10.1.2.3", 1.0) is None
    assert bans.banned(None, "10.1.2.3", 1.0) is None
    assert bans.banned("alice", "10.1.2.3", 60.0) is None  # expired: before expire() runs
    assert [b.value for b in bans.expire(60.0)] == ["alice"]
    assert len(bans) == 0 and bans.expire(61.0) == []


def test_a_host_ban_refuses_everyone_from_the_network() -> None:
    bans = BanList()
    bans.add(Ban(HOST, "10.0.0.0/8", "abuse", created_at=0.0))
    bans.add(Ban(HOST, "10.1.2.3", "scanner", created_at=0.0, source=QUARANTINE))
    # the address's own ban comes first
    assert bans.match(None, "10.1.2.3", 5.0).reason == "scanner"  # type: ignore[union-attr]
    assert bans.banned("carol", "::ffff:10.4.4.4", 5.0) == "host 10.0.0.0/8 banned by an " \
        "operator: abuse"
    assert bans.banned("carol", "11.0.0.1", 5.0) is None
    assert bans.banned(None, "10.1.2.3", 5.0) == "host 10.1.2.3 banned by quarantine: scanner"
    assert bans.remove(HOST, "10.0.0.0/8") is not None
    assert bans.banned("carol", "10.4.4.4", 5.0) is None
    assert bans.remove(HOST, "10.0.0.0/8") is None


def test_a_ban_replaces_one_of_the_same_key() -> None:
    bans = BanList()
    first = Ban(USER, "alice", "one", created_at=0.0, expires_at=10.0)
    assert bans.add(first) is None
    assert bans.add(Ban(USER, "alice", "two", created_at=1.0)) == first
    assert bans.banned("alice", "10.0.0.1", 100.0) is not None  # no expiry now
    assert bans.get(USER, "alice").reason == "two"  # type: ignore[union-attr]


def test_listing_counts_and_next_expiry() -> None:
    bans = BanList()
    bans.add(Ban(HOST, "192.0.2.0/24", "x", created_at=0.0, expires_at=30.0))
    bans.add(Ban(USER, "zed", "x", created_at=0.0, expires_at=20.0))
    bans.add(Ban(USER, "amy", "x", created_at=0.0))
    assert [b.key for b in bans.active(0.0)] == [
        (USER, "amy"), (USER, "zed"), (HOST, "192.0.2.0/24")]
    assert bans.counts(0.0) == {USER: 2, HOST: 1}
    assert bans.counts(25.0) == {USER: 1, HOST: 1}
    assert bans.next_expiry() == 20.0
    bans.expire(25.0)
    assert bans.next_expiry() == 30.0


def test_host_values_must_be_canonical_and_kinds_known() -> None:
    bans = BanList()
    with pytest.raises(ValueError, match="canonical"):
        bans.add(Ban(HOST, "10.1.2.3/32", "x", created_at=0.0))
    with pytest.raises(ValueError, match="unknown ban kind"):
        bans.add(Ban("vhost", "v", "x", created_at=0.0))
    assert BanList.canonical(HOST, "10.1.2.3/32") == "10.1.2.3"
    assert BanList.canonical(USER, "alice") == "alice"
    with pytest.raises(ValueError):
        BanList.canonical("group", "g")
