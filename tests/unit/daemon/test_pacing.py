"""daemon/pacing.py: closes at N per second with jitter, on a real event loop."""

from __future__ import annotations

import asyncio
import random

import pytest

from amqp_policy_proxy.daemon.pacing import PacedCloser, schedule


def test_schedule_one_close_per_slot_at_a_random_moment_of_it() -> None:
    offsets = schedule(1000, 100.0, rng=random.Random(7))
    assert len(offsets) == 1000
    for i, t in enumerate(offsets):
        assert i / 100 <= t < (i + 1) / 100
    assert offsets == sorted(offsets)
    # jittered: not all at the start of their slot
    fractions = [t * 100 - i for i, t in enumerate(offsets)]
    assert 0.45 < sum(fractions) / len(fractions) < 0.55
    assert min(fractions) < 0.01 and max(fractions) > 0.99
    assert schedule(3, 2.0, jitter=0.0) == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(("rate", "jitter"), [(0, 1.0), (-1, 1.0), (2e6, 1.0), (1, 1.5)])
def test_schedule_refuses_bad_rates_and_jitter(rate: float, jitter: float) -> None:
    with pytest.raises(ValueError):
        schedule(1, rate, jitter)


async def test_a_paced_close_takes_n_over_rate_seconds_and_counts_what_was_gone() -> None:
    loop = asyncio.get_running_loop()
    seen: list[tuple[int, float]] = []

    def close(target: int) -> bool:
        seen.append((target, loop.time()))
        if target == 3:
            raise RuntimeError("a bug in one close")
        return target != 5  # 5 went away meanwhile

    pacer = PacedCloser(loop, list(range(40)), close, 200.0, rng=random.Random(1)).start()
    assert pacer.progress()["remaining"] == 40
    await asyncio.wait_for(pacer.done, 5)
    assert [t for t, _ in seen] == list(range(40))
    elapsed = seen[-1][1] - pacer.started_at  # type: ignore[operator]
    assert 0.18 <= elapsed <= 0.4  # 40 at 200/s: about 0.2 s
    progress = pacer.progress()
    assert (progress["closed"], progress["skipped"], progress["remaining"],
            progress["done"]) == (38, 2, 0, True)


async def test_cancel_leaves_the_rest_and_an_empty_list_is_done_at_once() -> None:
    loop = asyncio.get_running_loop()
    closed: list[int] = []
    pacer = PacedCloser(loop, list(range(100)), lambda t: closed.append(t) is None, 50.0)
    pacer.start()
    await asyncio.sleep(0.1)
    pacer.cancel()
    await pacer.done
    n = len(closed)
    assert 1 <= n <= 10 and pacer.progress()["cancelled"]
    await asyncio.sleep(0.1)
    assert len(closed) == n
    empty = PacedCloser(loop, [], lambda t: True, 10.0).start()
    assert empty.done.done() and empty.progress()["total"] == 0
