"""The relay's remembered peer-address normalisation (``daemon/relay.py``)."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.daemon import relay
from amqp_policy_proxy.ingress.peer import normalise_peer


@pytest.mark.parametrize("raw", ["127.0.0.1", "::ffff:10.1.2.3", "FE80:0:0::1", "fe80::1%eth0",
                                 "::1", "not-an-ip"])
def test_peer_host_is_normalise_peer(raw):
    assert relay._peer_host(raw) == normalise_peer(raw)
    assert relay._peer_host(raw) == normalise_peer(raw)  # remembered answer is the same


def test_peer_host_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(relay, "_PEER_HOSTS", {})
    monkeypatch.setattr(relay, "_PEER_HOSTS_MAX", 4)
    for i in range(10):
        assert relay._peer_host(f"10.0.0.{i}") == f"10.0.0.{i}"
        assert len(relay._PEER_HOSTS) <= 4
    assert relay._peer_host("::ffff:10.0.0.1") == "10.0.0.1"
