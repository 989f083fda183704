"""The fleet ledger against a real redis-server: pending answers, exact shared limits, the
failure modes, reconciliation after the store comes back, and a clean exit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amqp_policy_proxy.core.admission import LEDGER_PENDING
from amqp_policy_proxy.fleet import scripts
from amqp_policy_proxy.fleet.ledger import FleetLedger, LedgerSettings
from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "shop", "maxConnections": 5, "maxConnectionsPerUser": 2,
    "maxConnectionsPerHost": 4, "allowUnknownUser": True,
    "groups": {"$default": {"users": "*", "remoteHosts": "*"}},
}]])], PolicySettings())
VHOST = POLICY.vhosts["shop"]
GROUP = VHOST.groups["$default"]


class Proxy:
    """One fleet ledger and the answers it delivered."""

    def __init__(self, url: str, proxy_id: str, **kw: Any) -> None:
        self.answers: dict[str, Any] = {}
        self.errors: list[str] = []
        self.local = ConnectionLedger(100)
        settings = LedgerSettings(url=url, proxy_id=proxy_id, **kw)
        self.ledger = FleetLedger(self.local, settings, on_answer=self.answers.__setitem__,
                                  observer=self)
        self.n = 0

    def ledger_latency(self, seconds: float) -> None:
        pass

    def ledger_error(self, reason: str) -> None:
        self.errors.append(reason)

    async def admit(self, user: str = "u", host: str = "h", enforce: bool = True) -> Any:
        self.n += 1
        conn_id = f"{self.ledger.settings.proxy_id}-{self.n}"
        got = self.ledger.try_admit(conn_id, vhost=VHOST, group=GROUP, user=user,
                                    remote_host=host, enforce=enforce)
        if got is LEDGER_PENDING:
            for _ in range(200):
                if conn_id in self.answers:
                    break
                await asyncio.sleep(0.005)
            got = self.answers[conn_id]
        return conn_id, got


def user_fields(store, user: str = "u") -> dict[str, int]:
    key = scripts.scope_keys("shop", user, "h")[1]
    return {k.decode(): int(v) for k, v in store.hgetall(key).items()}


async def test_two_proxies_share_the_per_user_limit_exactly(redis_server, store) -> None:
    p1, p2 = Proxy(redis_server.url, "p1"), Proxy(redis_server.url, "p2")
    assert await p1.ledger.start() and await p2.ledger.start()
    try:
        assert p1.ledger.mode == "redis"
        results = await asyncio.gather(*(p.admit() for p in (p1, p2, p1, p2, p1, p2)))
        admitted = [cid for cid, reason in results if reason is None]
        assert len(admitted) == 2
        assert {str(r) for _, r in results if r is not None} == {"user_limit"}
        assert sum(user_fields(store).values()) == 2
        for cid in admitted:
            owner = p1 if cid.startswith("p1") else p2
            assert owner.ledger.release(cid)
        await asyncio.sleep(0.05)
        assert user_fields(store) == {}
        assert p1.local.active() == p2.local.active() == 0
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_a_pending_connection_that_leaves_is_uncounted(redis_server, store) -> None:
    p1 = Proxy(redis_server.url, "p1")
    await p1.ledger.start()
    try:
        assert p1.ledger.try_admit("gone", vhost=VHOST, group=GROUP, user="u",
                                   remote_host="h") is LEDGER_PENDING
        assert p1.ledger.release("gone")
        await asyncio.sleep(0.05)
        assert "gone" not in p1.answers
        assert user_fields(store) == {}
    finally:
        await p1.ledger.stop()


async def test_store_down_local_share_then_reconciled(redis_server, store) -> None:
    p1 = Proxy(redis_server.url, "p1", lease_seconds=0.6, timeout_ms=50)
    p2 = Proxy(redis_server.url, "p2", lease_seconds=0.6, timeout_ms=50)
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        await asyncio.sleep(0.3)  # p1's next lease renewal sees p2
        assert p1.ledger.proxies_alive == 2
        _, r = await p1.admit()
        assert r is None
        redis_server.stop()
        # the next admission finds the store gone: local-share, 2 per user over 2 proxies
        _, r = await p1.admit()
        assert p1.ledger.mode == "local-share"
        assert r is not None and str(r) == "user_limit"  # ceil(2 / 2) = 1 held already
        assert set(p1.errors) & {"unreachable", "timeout"}
        redis_server.start()  # empty: every count was lost
        for _ in range(100):
            if p1.ledger.mode == "redis" and p2.ledger.mode == "redis":
                break
            await asyncio.sleep(0.05)
        assert p1.ledger.mode == "redis"
        assert user_fields(store) == {"p1": 1}  # re-registered before leaving the fallback
        _, r = await p2.admit()
        assert r is None
        _, r = await p2.admit()
        assert str(r) == "user_limit"
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_shadow_mode_counts_over_the_limit_and_answers_the_would_be_denial(
        redis_server, store) -> None:
    """Shadow mode (``enforce=False``): the store counts the connection anyway and answers
    the limit it is over, so later connections see the true counts; in the fallback too."""
    p1 = Proxy(redis_server.url, "p1", timeout_ms=50, failure_mode="closed")
    await p1.ledger.start()
    try:
        results = [await p1.admit(enforce=False) for _ in range(3)]
        assert [None if r is None else str(r) for _, r in results] == [
            None, None, "user_limit"]
        assert user_fields(store) == {"p1": 3}
        assert p1.local.user_active("shop", "u") == 3
        _, r = await p1.admit()  # enforced: over the limit, not counted
        assert str(r) == "user_limit" and user_fields(store) == {"p1": 3}
        redis_server.pause()
        try:
            _, r = await p1.admit(enforce=False)  # the fallback: closed, yet counted
            assert p1.ledger.mode == "closed"
            assert str(r) == "ledger_unavailable"
            assert p1.local.user_active("shop", "u") == 4
        finally:
            redis_server.resume()
    finally:
        await p1.ledger.stop()


@pytest.mark.parametrize("mode, second", [("closed", "ledger_unavailable"), ("open", None)])
async def test_failure_modes(redis_server, store, mode: str, second: Any) -> None:
    p1 = Proxy(redis_server.url, "p1", failure_mode=mode, timeout_ms=50)
    p2 = Proxy(redis_server.url, "p2")
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        await p2.admit()
        redis_server.pause()  # slow, not gone: the timeout decides
        try:
            _, first = await p1.admit()
            assert p1.ledger.mode == mode
            assert "timeout" in p1.errors
            _, r = await p1.admit()
            assert (None if r is None else str(r)) == second
        finally:
            redis_server.resume()
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_a_lost_release_is_healed_by_the_lease_rewrite(redis_server, store) -> None:
    p1 = Proxy(redis_server.url, "p1", lease_seconds=0.3)
    await p1.ledger.start()
    try:
        cid, _ = await p1.admit()
        p1.local.release(cid)  # released locally, never sent
        assert user_fields(store) == {"p1": 1}
        await asyncio.sleep(0.25)
        assert user_fields(store) == {}
    finally:
        await p1.ledger.stop()


async def test_exit_removes_own_fields_and_a_restart_clears_a_crashed_runs(redis_server,
                                                                           store) -> None:
    p1 = Proxy(redis_server.url, "p1")
    await p1.ledger.start()
    await p1.admit()
    await p1.ledger.stop()
    assert user_fields(store) == {}
    assert not store.exists(scripts.vhosts_key("p1"))
    crashed = Proxy(redis_server.url, "p1")
    await crashed.ledger.start()
    await crashed.admit()
    crashed.ledger._refresh_task.cancel()  # noqa: SLF001 - as if killed: nothing cleaned
    crashed.ledger._task.cancel()  # noqa: SLF001
    again = Proxy(redis_server.url, "p1")
    await again.ledger.start()
    try:
        assert user_fields(store) == {}
    finally:
        await again.ledger.stop()


async def test_a_slow_answer_is_waited_for_not_a_reason_for_the_fallback(redis_server,
                                                                        store) -> None:
    """Issue 28, storms: one late answer (the store stalls 300 ms, as a storm or a busy host
    makes it) is waited for; the ledger stays exact instead of switching to its fallback."""
    p1, p2 = Proxy(redis_server.url, "p1"), Proxy(redis_server.url, "p2")
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        await p2.admit()
        await p2.admit()  # the user's limit of 2, held by the other proxy
        redis_server.pause()
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, redis_server.resume)
        _, r = await p1.admit()
        assert str(r) == "user_limit"  # the store's answer, 300 ms late
        assert p1.ledger.mode == "redis" and p1.errors == []
        assert sum(user_fields(store).values()) == 2
    finally:
        redis_server.resume()
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_local_share_never_admits_above_the_limit_with_what_the_store_granted(
        redis_server, store) -> None:
    """Issue 28, storms: p2 holds the user's limit of 2 (granted by the store); p1 learnt it
    from its last answer. When p1 falls back to local-share (its share: ceil(2 / 2) = 1, and
    it holds none), it must not admit a third."""
    p1 = Proxy(redis_server.url, "p1", timeout_ms=50)
    p2 = Proxy(redis_server.url, "p2")
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        await p1.ledger._reconcile()  # p1 sees p2 alive: proxies_alive 2
        assert p1.ledger.proxies_alive == 2
        assert [r for _, r in [await p2.admit(), await p2.admit()]] == [None, None]
        _, r = await p1.admit()
        assert str(r) == "user_limit"
        redis_server.pause()
        try:
            _, r = await p1.admit()
            assert p1.ledger.mode == "local-share"
            assert str(r) == "user_limit", "local-share admitted a third connection"
            _, r = await p1.admit(user="other")  # a user nobody else holds: its share
            assert r is None
        finally:
            redis_server.resume()
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


async def test_fallback_admissions_are_charged_to_the_store_before_it_decides_again(
        redis_server, store) -> None:
    """Issue 28, storms: what p1 admitted in its fallback is in the store before the store
    decides anything again, so p2 sees it at its next admission."""
    p1 = Proxy(redis_server.url, "p1", timeout_ms=50, failure_mode="open")
    p2 = Proxy(redis_server.url, "p2")
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        redis_server.pause()
        try:
            _, r = await p1.admit()
            assert p1.ledger.mode == "open" and r is None
            _, r = await p1.admit()
            assert r is None
        finally:
            redis_server.resume()
        for _ in range(100):
            if p1.ledger.mode == "redis":
                break
            await asyncio.sleep(0.05)
        assert p1.ledger.mode == "redis"
        assert user_fields(store) == {"p1": 2}
        _, r = await p2.admit()
        assert str(r) == "user_limit"
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()


RATED = compile_policy([(None, [["vhost", {
    "hostname": "shop", "maxConnections": 50, "maxConnectionsPerUser": 50,
    "maxConnectionsPerHost": 50, "allowUnknownUser": True, "maxConnectionRatePerUser": 1,
    "groups": {"$default": {"users": "*", "remoteHosts": "*"}},
}]])], PolicySettings()).vhosts["shop"]


async def rated_admit(proxy: Proxy, rates: Any, user: str = "u") -> Any:
    """An admission as the core makes it: the ledger, then the connection rates."""
    import time as _time

    proxy.n += 1
    cid = f"{proxy.ledger.settings.proxy_id}-r{proxy.n}"
    group = RATED.groups["$default"]
    got = proxy.ledger.try_admit(cid, vhost=RATED, group=group, user=user, remote_host="h")
    if got is LEDGER_PENDING:
        for _ in range(400):
            if cid in proxy.answers:
                break
            await asyncio.sleep(0.005)
        got = proxy.answers[cid]
    if got is None:
        got = rates.try_admit(vhost=RATED, group=group, user=user, remote_host="h",
                              now=_time.monotonic())
    return got


async def test_connection_rates_are_shared_through_the_store_and_charged_after_a_fallback(
        redis_server, store) -> None:
    """Issue 28, rates: maxConnectionRatePerUser 1 is one Open a second for the fleet, not
    per proxy; what a fallback admitted is charged to the store's bucket when it is back."""
    from amqp_policy_proxy.fleet.rates import FleetRates
    from amqp_policy_proxy.limits.rates import RateLimits

    p1 = Proxy(redis_server.url, "p1", timeout_ms=50, failure_mode="open")
    p2 = Proxy(redis_server.url, "p2")
    r1, r2 = FleetRates(RateLimits(), p1.ledger), FleetRates(RateLimits(), p2.ledger)
    await p1.ledger.start()
    await p2.ledger.start()
    try:
        got = [await rated_admit(p, r) for p, r in ((p1, r1), (p2, r2), (p1, r1), (p2, r2))]
        assert [None if g is None else str(g) for g in got] == [
            None, "user_rate", "user_rate", "user_rate"]
        await asyncio.sleep(1.05)
        redis_server.pause()
        try:
            got = await rated_admit(p1, r1, user="v")
            assert p1.ledger.mode == "open" and got is None  # its own bucket decides
        finally:
            redis_server.resume()
        for _ in range(100):
            if p1.ledger.mode == "redis":
                break
            await asyncio.sleep(0.05)
        assert p1.ledger.mode == "redis" and not p1.ledger.rate_charges
        assert str(await rated_admit(p2, r2, user="v")) == "user_rate"  # charged
    finally:
        await p1.ledger.stop()
        await p2.ledger.stop()
