"""limits/rates.py: token buckets for connection rates and credit shaping."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from amqp_policy_proxy.limits.rates import (
    BucketTable,
    RateLimits,
    UserRate,
    charged,
    conforms,
    tokens_at,
)
from amqp_policy_proxy.policy.model import GroupSettings, VhostPolicy

VHOST = VhostPolicy(hostname="v")
GROUP = GroupSettings(name="g")


def admit(rates: RateLimits, now: float, *, vhost: VhostPolicy = VHOST,
          group: GroupSettings = GROUP, user: str = "u", host: str = "10.0.0.1") -> str | None:
    return rates.try_admit(vhost=vhost, group=group, user=user, remote_host=host, now=now)


def test_bucket_arithmetic() -> None:
    tat = -1.0  # full
    assert tokens_at(tat, 10, 5, 0.0) == 5
    for _ in range(5):
        assert conforms(tat, 10, 5, 0.0)
        tat = charged(tat, 10, 0.0)
    assert tokens_at(tat, 10, 5, 0.0) == pytest.approx(0)
    assert not conforms(tat, 10, 5, 0.0)
    assert conforms(tat, 10, 5, 0.1)  # one token back after 1/rate
    tat = charged(tat, 10, 0.0, 20)  # debt: 20 tokens taken from an empty bucket
    assert tokens_at(tat, 10, 5, 0.0) == pytest.approx(-20)
    assert tokens_at(tat, 10, 5, 2.5) == pytest.approx(5)  # full again


def test_global_rate_at_accept_has_a_burst_of_one_second() -> None:
    rates = RateLimits(10)
    assert sum(rates.try_accept(0.0) for _ in range(30)) == 10
    assert rates.global_denied == 20
    assert sum(rates.try_accept(0.5) for _ in range(30)) == 5
    # 5 tokens back by 1.0 s, then one every 0.1 s until 2.999 s
    assert sum(rates.try_accept(t / 1000) for t in range(1000, 3000)) == 5 + 19
    assert all(RateLimits(0).try_accept(0.0) for _ in range(1000))  # 0 = unlimited


def test_rates_in_order_and_all_or_nothing() -> None:
    rates = RateLimits()
    vhost = VhostPolicy(hostname="v", max_connection_rate=3)
    group = GroupSettings(name="g", max_connection_rate_per_user=2,
                          max_connection_rate_per_host=1)
    assert admit(rates, 0.0, vhost=vhost, group=group) is None
    assert admit(rates, 0.0, vhost=vhost, group=group, host="10.0.0.2") is None
    # the user's rate is spent; its denial takes no token from the vhost or the host
    assert admit(rates, 0.0, vhost=vhost, group=group, host="10.0.0.3") == "user_rate"
    assert admit(rates, 0.0, vhost=vhost, group=group, user="w", host="10.0.0.3") is None
    assert admit(rates, 0.0, vhost=vhost, group=group, user="x", host="10.0.0.4") == "vhost_rate"
    assert admit(rates, 0.4, vhost=vhost, group=group, user="x", host="10.0.0.1") == "host_rate"
    assert admit(rates, 1.0, vhost=vhost, group=group, user="x", host="10.0.0.1") is None


def test_burst_from_connection_rate_burst() -> None:
    rates = RateLimits()
    vhost = VhostPolicy(hostname="v", connection_rate_burst=2)
    group = GroupSettings(name="g", max_connection_rate_per_host=50)
    results = [admit(rates, 0.0, vhost=vhost, group=group) for _ in range(5)]
    assert results == [None, None, "host_rate", "host_rate", "host_rate"]
    assert admit(rates, 0.02, vhost=vhost, group=group) is None  # one more every 20 ms


def test_a_storm_from_one_host_is_admitted_at_the_rate() -> None:
    rates = RateLimits()
    group = GroupSettings(name="g", max_connection_rate_per_host=50)
    admitted = sum(admit(rates, i / 1000, group=group) is None for i in range(10_000))
    assert admitted == 50 + 499  # a burst of 50, then one every 20 ms until 9.999 s


def test_per_host_buckets_expire_when_full_a_storm_of_distinct_hosts() -> None:
    """100,000 distinct hosts at 1,000 attempts/s against 50/s per host: a bucket is full
    again 20 ms after its host's attempt, so about 20 are kept at any time."""
    rates = RateLimits()
    group = GroupSettings(name="g", max_connection_rate_per_host=50)
    peak = 0
    for i in range(100_000):
        assert admit(rates, i / 1000, group=group, host=f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}",
                     user=f"u{i}") is None
        peak = max(peak, len(rates.hosts))
    assert peak <= 25
    assert rates.hosts.expired >= 100_000 - 25 and rates.hosts.evicted == 0


@pytest.mark.slow
def test_per_host_buckets_are_capped_in_memory_a_storm_at_one_instant() -> None:
    """100,000 distinct hosts at the same instant (no bucket refills): at most ``max_buckets``
    are kept, the least recently used dropped first; measured with tracemalloc."""
    group = GroupSettings(name="g", max_connection_rate_per_host=50)
    hosts = [f"10.{i >> 16}.{i >> 8 & 255}.{i & 255}" for i in range(100_000)]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rates = RateLimits(max_buckets=10_000)
    for host in hosts:
        assert admit(rates, 0.0, group=group, host=host) is None
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert len(rates.hosts) == 10_000 and rates.hosts.evicted == 90_000
    assert used < 10_000 * 300  # the host strings are the callers'; ~ key tuple + float
    # the default cap: 65,536 buckets, about 15 MiB at most per table


def test_table_moves_a_charged_key_to_the_back() -> None:
    table = BucketTable(max_buckets=2)
    table.take("a", 1, 0.0)
    table.take("b", 1, 0.0)
    table.take("a", 1, 0.0)  # a is now the most recent
    table.take("c", 1, 0.0)  # over the cap: b goes, not a
    assert not table.conforms("a", 1, 2, 0.0) and table.conforms("b", 1, 2, 0.0)


def test_shaping_bucket_is_shared_and_kept_until_full() -> None:
    rates = RateLimits()
    a = rates.acquire(vhost="v", group="g", user="u", message_rate=100, byte_rate=None, now=0.0)
    b = rates.acquire(vhost="v", group="g", user="u", message_rate=100, byte_rate=None, now=0.0)
    assert a is b and a.refs == 2
    a.used(1, 10, 0.0)
    rates.release(a, 0.0)
    rates.release(b, 0.0)
    assert rates.shaping_buckets() == 1  # not full yet: a reconnect finds it as it was
    c = rates.acquire(vhost="v", group="g", user="u", message_rate=100, byte_rate=None, now=0.0)
    assert c is a
    rates.release(c, 0.0)
    rates.acquire(vhost="v", group="g", user="w", message_rate=100, byte_rate=None, now=1.0)
    assert rates.shaping_buckets() == 1  # u's bucket was full again at 1.0: dropped


def test_user_rate_credit_wait_and_debt() -> None:
    rate = UserRate(RateLimits(), "v", "g", "u")
    rate.set_rates(1000, None)
    assert (rate.cap(), rate.chunk()) == (100, 10)  # 0.1 s burst, 10 ms chunks
    assert rate.credit(0, 0.0) == 100
    assert rate.credit(40, 0.0) == 60  # what the link holds counts against it
    for _ in range(100):
        rate.used(1, 0, 0.0)
    assert rate.credit(0, 0.0) == 0
    assert rate.wait(10, 0.0) == pytest.approx(0.01)
    rate.set_rates(None, 1000)  # bytes only: 100 bytes of burst
    assert rate.credit(0, 0.0) == 1  # size unknown: one at a time
    rate.used(1, 500, 0.0)
    rate.sized(500)
    assert rate.credit(0, 0.0) == 0  # 400 bytes of debt
    assert rate.wait(1, 0.0) == pytest.approx(0.4)
    assert rate.credit(0, 0.41) == 1


def test_throttled_time_and_traffic_totals() -> None:
    rates = RateLimits()
    rate = rates.acquire(vhost="v", group="g", user="u", message_rate=10, byte_rate=None,
                         now=0.0)
    rate.used(1, 100, 0.0)
    rate.throttled(True, 1.0)
    rate.throttled(True, 1.5)  # a second link: the user is throttled once
    assert rates.totals(2.0) == {("v", "g"): (pytest.approx(1.0), 1, 100)}
    rate.throttled(False, 2.0)
    rate.throttled(False, 3.0)
    assert rates.totals(5.0) == {("v", "g"): (pytest.approx(2.0), 1, 100)}
