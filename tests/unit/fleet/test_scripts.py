"""The Lua scripts' logic against a real redis-server: admission sums live proxies only,
checks the scopes in QDR's order and counts all or nothing; release and rewrite keep each
proxy to its own fields."""

from __future__ import annotations

import time

from amqp_policy_proxy.fleet import scripts

V = "shop"
LEASE = 10_000


def admit_full(store, me: str, user: str = "u", host: str = "h", limits=(100, 2, 100),
               lease: int = LEASE) -> list[int]:
    keys = (scripts.leases_key(V), scripts.owned_key(V, me), *scripts.scope_keys(V, user, host))
    return [int(x) for x in store.eval(scripts.ADMIT, len(keys), *keys, me, lease, *limits)]


def admit(store, me: str, user: str = "u", host: str = "h", limits=(100, 2, 100),
          lease: int = LEASE) -> int:
    return admit_full(store, me, user, host, limits, lease)[0]


def fields(store, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in store.hgetall(key).items()}


def test_admission_counts_every_scope_until_a_limit_and_names_it(store) -> None:
    vhost, user, host = scripts.scope_keys(V, "u", "h")
    assert admit(store, "p1") == 0
    assert admit(store, "p2") == 0
    assert admit(store, "p1") == scripts.SCOPE_USER  # maxConnectionsPerUser 2, fleet-wide
    assert fields(store, user) == {"p1": 1, "p2": 1}
    assert fields(store, vhost) == {"p1": 1, "p2": 1}
    assert fields(store, host) == {"p1": 1, "p2": 1}
    # QDR's order: the vhost's limit is named first, then user, then host
    assert admit(store, "p1", user="other", limits=(2, 9, 9)) == scripts.SCOPE_VHOST
    assert admit(store, "p1", user="other", limits=(9, 9, 2)) == scripts.SCOPE_HOST
    assert admit(store, "p1", user="other", limits=(9, 9, 3)) == 0


def test_admission_answers_what_the_other_proxies_hold_in_each_scope(store) -> None:
    # the local-share fallback adds these to its own counts (issue 28, storms)
    assert admit_full(store, "p2") == [0, 0, 0, 0]
    assert admit_full(store, "p2", host="h2") == [0, 0, 0, 0]  # its own counts only
    assert admit_full(store, "p1") == [scripts.SCOPE_USER, 2, 2, 1]
    assert admit_full(store, "p1", user="v") == [0, 2, 0, 1]
    assert admit_full(store, "p2", user="v") == [0, 1, 1, 1]


def test_a_denied_admission_counts_nothing(store) -> None:
    admit(store, "p1", limits=(100, 1, 100))
    before = {k: store.hgetall(k) for k in scripts.scope_keys(V, "u", "h")}
    assert admit(store, "p2", limits=(100, 1, 100)) == scripts.SCOPE_USER
    assert {k: store.hgetall(k) for k in scripts.scope_keys(V, "u", "h")} == before


def test_a_dead_proxys_counts_stop_counting_and_are_removed(store) -> None:
    _, user, _ = scripts.scope_keys(V, "u", "h")
    assert admit(store, "dead", lease=50) == 0
    assert admit(store, "dead", lease=50) == 0
    assert admit(store, "p1") == scripts.SCOPE_USER
    time.sleep(0.1)  # the lease ran out
    assert admit(store, "p1") == 0
    assert fields(store, user) == {"p1": 1}
    assert store.zscore(scripts.leases_key(V), "dead") is None


def test_release_uncounts_own_field_only_and_removes_it_at_zero(store) -> None:
    admit(store, "p1")
    admit(store, "p2")
    keys = scripts.scope_keys(V, "u", "h")
    store.eval(scripts.RELEASE, 3, *keys, "p1")
    for key in keys:
        assert fields(store, key) == {"p2": 1}


def test_rewrite_sets_own_counts_and_clears_fields_no_longer_held(store) -> None:
    vhost, user, host = scripts.scope_keys(V, "u", "h")
    admit(store, "p1")
    admit(store, "p1", user="w", host="h2")
    admit(store, "p2")
    # p1 lost a release: it holds only one connection, of u from h
    keys = [scripts.leases_key(V), scripts.owned_key(V, "p1"), vhost, user, host]
    assert store.eval(scripts.REWRITE, len(keys), *keys, "p1", LEASE, 1, 1, 1) == 3
    assert fields(store, vhost) == {"p1": 1, "p2": 1}
    assert fields(store, scripts.scope_keys(V, "w", "h2")[1]) == {}
    assert fields(store, scripts.scope_keys(V, "w", "h2")[2]) == {}
    # idempotent
    store.eval(scripts.REWRITE, len(keys), *keys, "p1", LEASE, 1, 1, 1)
    assert fields(store, user) == {"p1": 1, "p2": 1}
    # leaving: no counts, no lease
    store.eval(scripts.REWRITE, 2, keys[0], keys[1], "p1", 0)
    assert fields(store, user) == {"p2": 1}
    assert store.zscore(scripts.leases_key(V), "p1") is None


def test_alive_counts_live_proxies(store) -> None:
    assert store.eval(scripts.ALIVE, 1, scripts.ALIVE_KEY, "p1", LEASE) == 1
    assert store.eval(scripts.ALIVE, 1, scripts.ALIVE_KEY, "p2", 50) == 2
    time.sleep(0.1)
    assert store.eval(scripts.ALIVE, 1, scripts.ALIVE_KEY, "p1", LEASE) == 1
    assert store.eval(scripts.ALIVE, 1, scripts.ALIVE_KEY, "p1", 0) == 0


def test_every_key_of_a_vhost_is_in_one_cluster_slot() -> None:
    from redis.crc import key_slot

    keys = [*scripts.scope_keys("a.b", "user}x", "::1"), scripts.leases_key("a.b"),
            scripts.owned_key("a.b", "host:5672")]
    assert len({key_slot(k.encode()) for k in keys}) == 1


def admit_rated(store, me: str, user: str = "u", host: str = "h", rates=(0, 1, 0, 0),
                enforce: int = 1) -> int:
    keys = (scripts.leases_key(V), scripts.owned_key(V, me), *scripts.scope_keys(V, user, host),
            *scripts.rate_keys(V, user, host))
    return int(store.eval(scripts.ADMIT, len(keys), *keys, me, LEASE, 100, 100, 100, enforce,
                          *rates)[0])


def test_connection_rates_are_one_bucket_for_the_fleet(store) -> None:
    # maxConnectionRatePerUser 1 (burst 1): one Open a second for the user, whichever proxy
    _, user, _ = scripts.scope_keys(V, "u", "h")
    assert admit_rated(store, "p1") == 0
    assert admit_rated(store, "p2") == scripts.SCOPE_USER_RATE
    assert admit_rated(store, "p1") == scripts.SCOPE_USER_RATE
    assert fields(store, user) == {"p1": 1}  # a denied attempt is not counted
    assert admit_rated(store, "p2", user="other") == 0  # another user's bucket
    time.sleep(1.05)
    assert admit_rated(store, "p2") == 0
    # every rate, in the counts' order: the vhost's first, the host's last
    assert admit_rated(store, "p1", user="x", rates=(1, 0, 0, 0)) == 0
    assert admit_rated(store, "p2", user="y", rates=(1, 0, 0, 0)) == scripts.SCOPE_VHOST_RATE
    assert admit_rated(store, "p1", user="z", host="h9", rates=(0, 0, 1, 0)) == 0
    assert admit_rated(store, "p2", user="w", host="h9",
                       rates=(0, 0, 1, 0)) == scripts.SCOPE_HOST_RATE


def test_a_rate_burst_admits_that_many_then_refills_at_the_rate(store) -> None:
    got = [admit_rated(store, f"p{i % 2}", rates=(0, 10, 0, 3)) for i in range(5)]
    assert got == [0, 0, 0, scripts.SCOPE_USER_RATE, scripts.SCOPE_USER_RATE]
    time.sleep(0.12)  # 10/s: one token back after 0.1 s
    assert admit_rated(store, "p1", rates=(0, 10, 0, 3)) == 0


def test_a_rate_in_shadow_mode_counts_and_takes_no_token(store) -> None:
    _, user, _ = scripts.scope_keys(V, "u", "h")
    assert admit_rated(store, "p1") == 0
    assert admit_rated(store, "p1", enforce=0) == -scripts.SCOPE_USER_RATE
    assert fields(store, user) == {"p1": 2}


def test_charge_puts_a_rate_bucket_into_debt(store) -> None:
    key = scripts.rate_keys(V, "u", "h")[1]
    store.eval(scripts.CHARGE, 1, key, 3, 1)  # three tokens taken in a fallback, 1/s
    assert admit_rated(store, "p1") == scripts.SCOPE_USER_RATE
    assert 0 < store.pttl(key) <= 3000
