"""fleet/bans.py against a real redis-server: one list for the fleet, its version, expiry on
the store's clock, and entries nobody should have written."""

from __future__ import annotations

import asyncio
import json

from amqp_policy_proxy.fleet.bans import LIST_KEY, VERSION_KEY, BanStore

BAN = {"kind": "user", "value": "alice", "reason": "leaked", "source": "operator",
       "by": "uid 0 pid 1", "vhost": None}


async def test_two_proxies_see_one_list_and_each_change_moves_the_version(
        redis_server, store) -> None:
    one, two = BanStore(redis_server.url), BanStore(redis_server.url)
    try:
        assert await two.version() == 0
        assert (await two.load()).bans == ()
        v1 = await one.put(BAN, None)
        v2 = await one.put({**BAN, "kind": "host", "value": "10.0.0.0/8"}, 60_000)
        assert v2 == v1 + 1 == await two.version()
        seen = await two.load()
        assert seen.version == v2
        by_key = {(b["kind"], b["value"]): b for b in seen.bans}
        assert by_key[("user", "alice")]["expires_ms"] is None
        host = by_key[("host", "10.0.0.0/8")]
        # the expiry is on the store's clock, 60 s after the store's now when it was put
        assert 59_000 <= host["expires_ms"] - seen.now_ms <= 60_000
        assert host["created_ms"] <= seen.now_ms
        assert await two.delete("user", "alice") == (True, v2 + 1)
        assert await two.delete("user", "alice") == (False, v2 + 1)  # gone: no change
        assert [(b["kind"], b["value"]) for b in (await one.load()).bans] == [
            ("host", "10.0.0.0/8")]
    finally:
        await one.close()
        await two.close()


async def test_expired_and_foreign_entries_are_dropped_on_load(redis_server, store) -> None:
    bans = BanStore(redis_server.url)
    try:
        await bans.put(BAN, 50)
        store.hset(LIST_KEY, "junk", "not json")
        store.hset(LIST_KEY, "list", json.dumps([1]))
        await asyncio.sleep(0.1)
        assert (await bans.load()).bans == ()
        assert store.hlen(LIST_KEY) == 0
        assert int(store.get(VERSION_KEY)) == 1  # a purge is no change of the list in force
    finally:
        await bans.close()


async def test_a_ban_survives_the_proxy_that_made_it(redis_server, store) -> None:
    first = BanStore(redis_server.url)
    await first.put(BAN, None)
    await first.close()  # the proxy is gone; the store keeps the list
    again = BanStore(redis_server.url)
    try:
        assert [b["value"] for b in (await again.load()).bans] == ["alice"]
    finally:
        await again.close()
