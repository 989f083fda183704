"""Credit shaping drawn from the store (``fleet/rates.py``) against a real redis-server: two
proxies' buckets of one user together stay within the user's rate, a debt is charged to the
store, and the fallback decides with the process's own buckets."""

from __future__ import annotations

import asyncio
import time

from amqp_policy_proxy.fleet.rates import FleetRates
from amqp_policy_proxy.limits.rates import RateLimits
from tests.unit.fleet.test_ledger import Proxy


async def shaped(url: str, name: str, message_rate: int | None = 100,
                 byte_rate: int | None = None, **kw) -> tuple[Proxy, object]:
    proxy = Proxy(url, name, **kw)
    await proxy.ledger.start()
    rates = FleetRates(RateLimits(), proxy.ledger)
    bucket = rates.acquire(vhost="shop", group="g", user="u", message_rate=message_rate,
                           byte_rate=byte_rate, now=time.monotonic())
    return proxy, bucket


async def test_two_proxies_together_stay_within_the_users_message_rate(redis_server,
                                                                       store) -> None:
    p1, b1 = await shaped(redis_server.url, "p1")
    p2, b2 = await shaped(redis_server.url, "p2")
    try:
        used = 0
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            for bucket in (b1, b2):
                now = time.monotonic()
                n = bucket.credit(0, now)
                for _ in range(max(0, n)):
                    bucket.used(1, 10, now)
                used += max(0, n)
            await asyncio.sleep(0.002)
        # 100 a second for the user, plus one burst (10): not 100 per proxy
        assert 80 <= used <= 100 * 1.0 + 10 + 5, used
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_a_message_beyond_the_allotment_is_a_debt_charged_to_the_store(redis_server,
                                                                            store) -> None:
    p1, b1 = await shaped(redis_server.url, "p1", message_rate=None, byte_rate=1000)
    p2, b2 = await shaped(redis_server.url, "p2", message_rate=None, byte_rate=1000)
    try:
        b1.credit(0, time.monotonic())
        await asyncio.sleep(0.02)
        assert b1.credit(0, time.monotonic()) >= 1
        b1.used(1, 3000, time.monotonic())  # 3 s worth of bytes in one message
        await asyncio.sleep(0.02)
        assert not b1.m_debt and not b1.b_debt  # charged
        b2.credit(0, time.monotonic())
        await asyncio.sleep(0.02)
        assert b2.credit(0, time.monotonic()) == 0  # the user's bucket is in debt
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_without_the_store_the_process_buckets_decide_at_their_share(redis_server,
                                                                          store) -> None:
    p1, b1 = await shaped(redis_server.url, "p1", timeout_ms=50, failure_mode="open")
    try:
        p1.ledger.mode = "open"  # as after a failure
        now = time.monotonic()
        assert b1.credit(0, now) == 10  # the process's own burst of the full rate
        assert not b1.asking
        b1.used(1, 0, now)
        assert b1.m_debt == 1  # charged to the store once it is back
    finally:
        p1.ledger.mode = "redis"
        await p1.ledger.stop()
