"""Fixtures for end-to-end tests: the in-tree broker with a sasldb, and real proxies."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_policy_proxy.demo.broker import Broker
from amqp_policy_proxy.demo.sasl import make_sasl_config
from tests.support.forward import SourceBoundForwarder
from tests.support.proxy import ProxyThread

POLICIES = Path(__file__).parent / "policies"
USERS = {u: "secret" for u in ("alice", "bob", "carol", "dave", "mallory",
                                # topic authorization examples (test_topics_e2e)
                                "usr1", "usr2", "joe", "mary", "allen", "nat", "hank")}


@pytest.fixture(scope="session")
def sasl_config(tmp_path_factory):
    return make_sasl_config(tmp_path_factory.mktemp("sasl"), USERS)


@pytest.fixture(scope="session")
def broker(sasl_config):
    b = Broker(sasl=sasl_config).start()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def broker_address(broker):
    return broker.address


@pytest.fixture
def policy_path():
    return str(POLICIES / "e2e.json")


@pytest.fixture
def proxy(broker_address, policy_path):
    p = ProxyThread([broker_address], policy_path=policy_path,
                    listen=[("127.0.0.1", 0), ("::1", 0)])
    p.start()
    p.v6_port = p.daemon.listen_addresses[-1][1]
    yield p
    p.stop()


@pytest.fixture
def forwarder():
    made = []

    def make(port: int, source: str) -> SourceBoundForwarder:
        target = ("::1", port) if ":" in source else ("127.0.0.1", port)
        f = SourceBoundForwarder(target, source).start()
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()
