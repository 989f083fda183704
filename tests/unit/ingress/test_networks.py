"""ingress/networks.py: the canonical text of a banned address or network, and matching."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.ingress.networks import NetworkSet, canonical_network


@pytest.mark.parametrize(("given", "canonical"), [
    ("10.1.2.3", "10.1.2.3"),
    (" 10.1.2.3 ", "10.1.2.3"),
    ("10.0.0.0/8", "10.0.0.0/8"),
    ("10.1.2.3/32", "10.1.2.3"),
    ("0.0.0.0/0", "0.0.0.0/0"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
    ("2001:DB8:0::/32", "2001:db8::/32"),
    ("[::1]", "::1"),
    ("fe80::1/128", "fe80::1"),
])
def test_one_network_has_one_name(given: str, canonical: str) -> None:
    assert canonical_network(given) == canonical


@pytest.mark.parametrize(("given", "words"), [
    ("10.1.2.3/8", "host bits set: write 10.0.0.0/8"),
    ("example.com", "host names are not accepted"),
    ("10.0.0.0/33", "from 0 to 32"),
    ("2001:db8::/129", "from 0 to 128"),
    ("10.0.0.0/x", "from 0 to 32"),
    ("::ffff:10.0.0.0/8", "96 to 128"),
    ("", "required"),
    ("10.1", "not an IP address"),
])
def test_what_is_refused_says_why(given: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        canonical_network(given)


def test_matches_addresses_and_networks_of_both_families() -> None:
    nets = NetworkSet()
    for name in ("10.0.0.0/8", "10.1.2.3", "2001:db8::/32", "192.0.2.7"):
        nets.add(name)
    assert len(nets) == 4
    assert nets.matches("10.1.2.3") == ["10.1.2.3", "10.0.0.0/8"]
    assert nets.matches("::ffff:10.9.9.9") == ["10.0.0.0/8"]  # a dual-stack socket's form
    assert nets.matches("2001:db8::5") == ["2001:db8::/32"]
    assert nets.matches("[2001:db8::5]") == ["2001:db8::/32"]
    assert nets.matches("192.0.2.7") == ["192.0.2.7"]
    assert nets.matches("11.0.0.1") == []
    assert nets.matches("not-an-address") == []
    nets.discard("10.0.0.0/8")
    nets.discard("10.0.0.0/8")  # absent: nothing
    assert nets.matches("10.9.9.9") == []
    assert nets.matches("10.1.2.3") == ["10.1.2.3"]


def test_only_canonical_members() -> None:
    with pytest.raises(ValueError, match="canonical"):
        NetworkSet().add("10.1.2.3/32")
