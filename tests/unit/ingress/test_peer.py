"""ingress/peer.py: one client, one rhost string."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.ingress.peer import normalise_peer


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("::FFFF:10.1.2.3", "10.1.2.3"),
        ("fe80::1%eth0", "fe80::1"),
        ("[::1]", "::1"),
        ("FE80:0000:0000:0000:0000:0000:0000:0001", "fe80::1"),
        (" 2001:DB8::1 ", "2001:db8::1"),
        ("::1", "::1"),
        ("not-an-ip", "not-an-ip"),
        ("", ""),
    ],
)
def test_normalise_peer(raw: str, expected: str) -> None:
    assert normalise_peer(raw) == expected
