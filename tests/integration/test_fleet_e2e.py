"""Two proxy processes, one real redis-server, real proton clients.

Limits are exact across the fleet: 40 clients of one user connecting at once through both
proxies are admitted exactly ``maxConnectionsPerUser`` times; per host and per vhost alike;
counts go back to zero; a proxy killed with SIGKILL stops counting within one lease; with
Redis stopped each failure mode does what it says (and says so in its metric and /readyz);
Redis restarted empty gets every count back before the store decides again; a reload that
lowers a limit disconnects nobody.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.support.fleet import ProxyProcess, close_all, connect, connect_many, wait_for
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not RedisServer.available(), reason="redis-server missing")]

LEASE = 1.5
USERS = "alice, bob, carol, dave"


def policy(per_user: int = 2) -> list:
    def vhost(name: str, **limits: int) -> list:
        return ["vhost", {"hostname": name, "allowUnknownUser": False, **limits,
                          "groups": {"all": {"users": USERS, "remoteHosts": "*",
                                             "sources": "*", "targets": "*"}}}]
    return [vhost("fleet", maxConnections=100, maxConnectionsPerUser=per_user,
                  maxConnectionsPerHost=100),
            vhost("hosts", maxConnections=100, maxConnectionsPerUser=100,
                  maxConnectionsPerHost=3),
            vhost("cap", maxConnections=3, maxConnectionsPerUser=100,
                  maxConnectionsPerHost=100)]


def ledger(url: str, proxy_id: str, mode: str = "local-share") -> str:
    return (f'url = "{url}"\nproxy_id = "{proxy_id}"\nlease_seconds = {LEASE}\n'
            f'timeout_ms = 1000\nfailure_mode = "{mode}"\n')


def store_sum(redis: RedisServer, key: str) -> int:
    import redis as redis_py

    client = redis_py.Redis.from_url(redis.url)
    try:
        return sum(int(v) for v in client.hgetall(key).values())
    finally:
        client.close()


def user_key(vhost: str, user: str) -> str:
    return f"amqp-policy-proxy:{{{vhost}}}:user:{user}"


@pytest.fixture(scope="module")
def redis():
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fleet")
    (path / "policy.json").write_text(json.dumps(policy()))
    return path


@pytest.fixture(scope="module")
def pair(redis, workdir, broker_address):
    procs = [ProxyProcess(workdir, broker_address, workdir / "policy.json", name=name,
                          ledger=ledger(redis.url, name)) for name in ("pa", "pb")]
    yield procs
    for p in procs:
        p.stop()


def test_forty_clients_of_one_user_at_once_admit_exactly_two(pair, redis) -> None:
    pa, pb = pair
    targets = [((pa if i % 2 else pb).port, "alice", "fleet") for i in range(40)]
    admitted, denied = connect_many(targets)
    try:
        assert len(admitted) == 2, denied[:3]
        assert len(denied) == 38
        assert all("connection disallowed by local policy" in d for d in denied)
        assert store_sum(redis, user_key("fleet", "alice")) == 2
        denials = sum(p.metric("amqp_proxy_connections_denied_total", vhost="fleet",
                               reason="user_limit") for p in pair)
        assert denials == 38
    finally:
        close_all(admitted)
    # counts return to zero, in the store and in each proxy
    assert wait_for(lambda: store_sum(redis, user_key("fleet", "alice")) == 0)
    assert wait_for(lambda: sum(p.metric("amqp_proxy_connections_active") for p in pair) == 0)


@pytest.mark.parametrize("vhost, reason", [("hosts", "host_limit"), ("cap", "vhost_limit")])
def test_per_host_and_vhost_limits_are_fleet_wide(pair, redis, vhost: str, reason: str) -> None:
    pa, pb = pair
    users = ["alice", "bob", "carol", "dave"]
    targets = [((pa if i % 2 else pb).port, users[i % 4], vhost) for i in range(12)]
    admitted, denied = connect_many(targets)
    try:
        assert len(admitted) == 3, denied[:3]
        assert sum(p.metric("amqp_proxy_connections_denied_total", vhost=vhost, reason=reason)
                   for p in pair) == 9
    finally:
        close_all(admitted)
    assert wait_for(lambda: store_sum(redis, f"amqp-policy-proxy:{{{vhost}}}:vhost") == 0)


def test_healthz_and_readyz(pair) -> None:
    for p in pair:
        assert p.get("/healthz") == (200, "ok\n")
        status, text = p.get("/readyz")
        assert status == 200 and "ledger redis" in text
        assert p.metric("amqp_proxy_ledger_mode", mode="redis") == 1
        assert p.metric("amqp_proxy_ledger_proxies") >= 2


def test_a_killed_proxy_stops_counting_within_one_lease(redis, workdir, broker_address,
                                                        pair) -> None:
    _, pb = pair
    victim = ProxyProcess(workdir, broker_address, workdir / "policy.json", name="victim",
                          ledger=ledger(redis.url, "victim"))
    held = [connect(victim.port, "bob", vhost="fleet") for _ in range(2)]
    try:
        assert store_sum(redis, user_key("fleet", "bob")) == 2
        victim.kill()
        killed = time.monotonic()
        with pytest.raises(Exception, match="connection disallowed by local policy"):
            connect(pb.port, "bob", vhost="fleet")  # its counts are still alive
        # once the lease runs out, the other proxy admits again
        conn = None
        while conn is None and time.monotonic() - killed < LEASE + 2:
            try:
                conn = connect(pb.port, "bob", vhost="fleet")
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        assert conn is not None, "still denied a lease after the kill"
        assert time.monotonic() - killed < LEASE + 1.5
        conn.close()
    finally:
        for c in held:  # their proxy is gone: do not wait for its Close
            c.timeout = 0.5
        close_all(held)


def test_redis_down_each_failure_mode_then_reconciled(redis, workdir, broker_address,
                                                      pair) -> None:
    modes = {m: ProxyProcess(workdir, broker_address, workdir / "policy.json", name=f"m-{m}",
                             ledger=ledger(redis.url, f"m-{m}", m))
             for m in ("local-share", "closed", "open")}
    held = []
    try:
        # every proxy has seen the five proxies alive (two of the pair, three here)
        assert wait_for(lambda: all(p.metric("amqp_proxy_ledger_proxies") >= 5
                                    for p in modes.values()), timeout=LEASE + 2)
        redis.stop()
        # closed: every new connection denied, counted, /readyz 503
        closed = modes["closed"]
        with pytest.raises(Exception, match="connection disallowed by local policy"):
            connect(closed.port, "carol", vhost="fleet")
        # (the mode gauge and /readyz follow within the daemon's 1 s snapshot)
        assert wait_for(lambda: closed.metric("amqp_proxy_ledger_mode", mode="closed") == 1)
        assert closed.metric("amqp_proxy_connections_denied_total",
                             reason="ledger_unavailable") == 1
        assert wait_for(lambda: closed.get("/readyz")[0] == 503)
        # local-share: maxConnectionsPerUser 2 over 5 proxies: ceil(2 / 5) = 1 here
        share = modes["local-share"]
        held.append(connect(share.port, "carol", vhost="fleet"))
        with pytest.raises(Exception, match="connection disallowed by local policy"):
            connect(share.port, "carol", vhost="fleet")
        assert wait_for(lambda: share.metric("amqp_proxy_ledger_mode", mode="local-share") == 1)
        assert share.get("/readyz")[0] == 200
        # open: this proxy's own counts against the full limit
        opened = modes["open"]
        held += [connect(opened.port, "carol", vhost="fleet") for _ in range(2)]
        with pytest.raises(Exception, match="connection disallowed by local policy"):
            connect(opened.port, "carol", vhost="fleet")
        assert wait_for(lambda: opened.metric("amqp_proxy_ledger_mode", mode="open") == 1)
        for p in modes.values():
            assert p.metric("amqp_proxy_ledger_errors_total") >= 1
        # Redis back, empty: every proxy re-registers its counts before leaving the fallback
        redis.start()
        assert wait_for(lambda: all(p.metric("amqp_proxy_ledger_mode", mode="redis") == 1
                                    for p in (*modes.values(), *pair)), timeout=LEASE + 5)
        assert store_sum(redis, user_key("fleet", "carol")) == 3
        # exact again: 3 held >= 2, so carol is denied everywhere until two leave
        for p in (*modes.values(), *pair):
            with pytest.raises(Exception, match="connection disallowed by local policy"):
                connect(p.port, "carol", vhost="fleet")
        close_all(held[:2])
        held = held[2:]
        assert wait_for(lambda: store_sum(redis, user_key("fleet", "carol")) == 1)
        connect(pair[0].port, "carol", vhost="fleet").close()
    finally:
        if not redis.running:
            redis.start()
        close_all(held)
        for p in modes.values():
            p.stop()


def test_a_reload_lowering_a_limit_disconnects_nobody(pair, redis, workdir) -> None:
    pa, pb = pair
    held = [connect(pa.port, "dave", vhost="fleet"), connect(pb.port, "dave", vhost="fleet")]
    try:
        (workdir / "policy.json").write_text(json.dumps(policy(per_user=1)))
        for p in pair:
            p.signal(signal.SIGHUP)
        assert wait_for(lambda: all(p.log().count("policy reloaded") >= 1 for p in pair))
        for conn in held:  # still open and usable
            sender = conn.create_sender("orders.x")
            sender.close()
        with pytest.raises(Exception, match="connection disallowed by local policy"):
            connect(pa.port, "dave", vhost="fleet")
    finally:
        close_all(held)
        (workdir / "policy.json").write_text(json.dumps(policy()))
        for p in pair:
            p.signal(signal.SIGHUP)
