"""A real redis-server for the fleet ledger's tests (one per module; flushed per test)."""

from __future__ import annotations

import pytest

from tests.support.redis import RedisServer


@pytest.fixture(scope="module")
def redis_server():
    if not RedisServer.available():
        pytest.skip("redis-server is not installed (scripts/install-system-deps.sh)")
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def store(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()
