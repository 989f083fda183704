"""Upstream back-off: a failed router is tried last for 1, 2, 4 ... 30 s (issue 15 point 6)."""

from amqp_policy_proxy.daemon.upstreams import BACKOFF_MAX, UpstreamHealth


def test_a_failed_upstream_is_tried_last_until_its_backoff_ends():
    h: UpstreamHealth[str] = UpstreamHealth()
    assert h.order(["a", "b", "c"], 0.0) == ["a", "b", "c"]
    assert h.failed("a", 10.0) == 1.0
    assert h.order(["a", "b", "c"], 10.5) == ["b", "c", "a"]
    assert not h.is_up("a", 10.5)
    assert h.order(["a", "b", "c"], 11.0) == ["a", "b", "c"]


def test_backoff_doubles_and_is_capped_and_success_forgets():
    h: UpstreamHealth[str] = UpstreamHealth()
    got = [h.failed("a", 0.0) for _ in range(8)]
    assert got == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX, BACKOFF_MAX, BACKOFF_MAX]
    assert h.failures("a") == 8
    h.succeeded("a")
    assert h.failures("a") == 0 and h.is_up("a", 0.0)


def test_when_every_upstream_rests_the_soonest_to_recover_comes_first():
    h: UpstreamHealth[str] = UpstreamHealth()
    h.failed("a", 0.0)
    h.failed("a", 0.0)  # 2 s
    h.failed("b", 0.0)  # 1 s
    assert h.order(["a", "b"], 0.5) == ["b", "a"]


def test_thousands_of_failures_in_a_row_keep_the_capped_backoff():
    health: UpstreamHealth[str] = UpstreamHealth()
    for _ in range(5000):  # 2**1024 would not fit a float
        backoff = health.failed("a", 0.0)
    assert backoff == BACKOFF_MAX
