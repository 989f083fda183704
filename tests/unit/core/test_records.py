"""ReservedPool: the reply channels and handles the proxy keeps back from the router."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from amqp_policy_proxy.core.records import ReservedPool


def test_top_down_then_none():
    pool = ReservedPool(0xFFFF, 3)
    assert [pool.take(), pool.take(), pool.take(), pool.take()] == [0xFFFF, 0xFFFE, 0xFFFD, None]


def test_nothing_reserved():
    assert ReservedPool(1, 0).take() is None


def test_given_back_is_taken_first():
    pool = ReservedPool(2**32 - 1, 64)
    a, b = pool.take(), pool.take()
    pool.give_back(a)
    assert pool.take() == a
    pool.give_back(b)
    pool.give_back(a)
    assert (pool.take(), pool.take(), pool.take()) == (a, b, 2**32 - 3)


@given(high=st.integers(0, 2**32 - 1), count=st.integers(0, 70),
       ops=st.lists(st.booleans(), max_size=200))
def test_same_order_as_the_list_it_replaces(high, count, ops):
    """Take (True) / give back the oldest taken (False): the same numbers as list.pop/append."""
    count = min(count, high // 2)
    model = list(range(high - count + 1, high + 1))
    pool = ReservedPool(high, count)
    held_model: list[int] = []
    held_pool: list[int] = []
    for take in ops:
        if take:
            expected = model.pop() if model else None
            got = pool.take()
            assert got == expected
            if got is not None:
                held_model.append(expected)
                held_pool.append(got)
        elif held_model:
            model.append(held_model.pop(0))
            pool.give_back(held_pool.pop(0))
