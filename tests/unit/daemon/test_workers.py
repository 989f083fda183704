"""A worker's configuration from the variables its parent sets (daemon/workers.py)."""

from __future__ import annotations

from amqp_policy_proxy.daemon.config import Address, DaemonConfig, ListenerConfig
from amqp_policy_proxy.daemon.workers import worker_config
from amqp_policy_proxy.fleet.ledger import LedgerSettings

CONFIG = DaemonConfig(
    listeners=(ListenerConfig(Address("0.0.0.0", 0)), ListenerConfig(Address("::", 5671),
                                                                     tls_cert="c", tls_key="k")),
    metrics_address=Address("127.0.0.1", 9464), workers=4,
    ledger=LedgerSettings(url="auto", proxy_id=""))


def test_not_a_worker_without_the_variables() -> None:
    assert worker_config(CONFIG, {}) is None


def test_a_worker_gets_the_resolved_ports_a_private_metrics_port_and_its_proxy_id() -> None:
    config = worker_config(CONFIG, {
        "AMQP_POLICY_PROXY_WORKER": "3", "AMQP_POLICY_PROXY_WORKER_PORTS": "41000,5671",
        "AMQP_POLICY_PROXY_WORKER_LEDGER": "unix:///run/x/ledger-redis.sock",
        "AMQP_POLICY_PROXY_WORKER_PROXY_ID": "edge-1:41000"})
    assert config is not None
    assert [lc.address for lc in config.listeners] == [Address("0.0.0.0", 41000),
                                                      Address("::", 5671)]
    assert config.listeners[1].tls_cert == "c"  # TLS settings stay
    assert (config.workers, config.reuse_port, config.worker) == (1, True, 3)
    assert config.metrics_address == Address("127.0.0.1", 0)
    assert config.ledger is not None
    assert config.ledger.url == "unix:///run/x/ledger-redis.sock"
    assert config.ledger.proxy_id == "edge-1:41000/w3"
