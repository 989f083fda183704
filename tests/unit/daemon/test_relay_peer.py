"""The daemon's peer-address memo: one normalisation and parse per address, bounded."""

import pytest

from amqp_policy_proxy.daemon import app
from amqp_policy_proxy.daemon.app import Daemon
from amqp_policy_proxy.daemon.config import DaemonConfig
from amqp_policy_proxy.ingress.peer import normalise_peer


@pytest.mark.parametrize("raw", ["127.0.0.1", "::ffff:10.1.2.3", "FE80:0:0::1", "fe80::1%eth0",
                                 "::1", "not-an-ip"])
def test_peer_address_is_normalise_peer(raw):
    address = Daemon(DaemonConfig()).peer_address(raw)
    assert address.text == normalise_peer(raw)
    assert (address.ip is None) == (raw == "not-an-ip")


def test_peer_memo_is_bounded_and_reused(monkeypatch):
    monkeypatch.setattr(app, "PEER_MEMO_SIZE", 3)
    d = Daemon(DaemonConfig())
    first = d.peer_address("10.0.0.1")
    assert d.peer_address("10.0.0.1") is first
    for n in range(2, 6):
        d.peer_address(f"10.0.0.{n}")
    assert len(d._peers) <= 3
