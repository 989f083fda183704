"""limits/quarantine.py: N denials within S seconds, on the caller's clock."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.limits.quarantine import DenialCounter

KEY = ("v", "user", "mallory")


def test_the_nth_denial_within_the_window_triggers_once() -> None:
    counter = DenialCounter()
    assert [counter.record(KEY, 3, 10.0, t) for t in (0.0, 1.0)] == [False, False]
    assert counter.count(KEY, 1.0) == 2
    assert counter.record(KEY, 3, 10.0, 2.0) is True
    # started over: the next two do not trigger, the third does
    assert counter.count(KEY, 2.0) == 0
    assert [counter.record(KEY, 3, 10.0, t) for t in (3.0, 4.0, 5.0)] == [False, False, True]


def test_denials_spread_wider_than_the_window_never_trigger() -> None:
    counter = DenialCounter()
    hits = [counter.record(KEY, 3, 10.0, t) for t in range(0, 100, 6)]  # 3 per 12 s
    assert not any(hits)
    assert counter.count(KEY, 96.0) == 2


def test_keys_are_counted_apart_and_bounded() -> None:
    counter = DenialCounter(max_keys=2)
    other = ("v", "host", "10.0.0.1")
    counter.record(KEY, 2, 10.0, 0.0)
    counter.record(other, 2, 10.0, 0.5)
    counter.record(("w", "user", "x"), 2, 10.0, 1.0)  # evicts KEY, the least recent
    assert len(counter) == 2
    assert counter.record(KEY, 2, 10.0, 1.5) is False  # it counts from zero again
    assert counter.record(other, 2, 10.0, 2.0) is False  # evicted by KEY in turn


def test_prune_and_forget() -> None:
    counter = DenialCounter()
    counter.record(KEY, 5, 10.0, 0.0)
    counter.record(("v", "user", "b"), 5, 100.0, 0.0)
    assert counter.prune(50.0) == 1 and len(counter) == 1
    counter.forget(("v", "user", "b"))
    counter.forget(("nobody",))
    assert len(counter) == 0


def test_a_threshold_of_one_bans_at_the_first_denial() -> None:
    assert DenialCounter().record(KEY, 1, 0.0, 7.0) is True


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        DenialCounter(max_keys=0)
    with pytest.raises(ValueError):
        DenialCounter().record(KEY, 0, 1.0, 0.0)
