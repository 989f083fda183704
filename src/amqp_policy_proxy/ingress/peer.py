"""Sans-IO. Normalisation of the client's address into the ``rhost`` string policy uses.

QDR uses ``getnameinfo(NI_NUMERICHOST)`` of the peer: a numeric IP without a
port. On a dual-stack socket an IPv4 client shows up as ``::ffff:a.b.c.d``; the proxy reports
and matches it as the IPv4 address (docs/qdr-compatibility.md). The same string keys the
per-host connection counts, so one client must always produce one string.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


def normalise_peer(host: str) -> str:
    """Canonical numeric form of a peer address.

    * IPv4-mapped IPv6 (``::ffff:10.1.2.3``) becomes ``10.1.2.3``;
    * an IPv6 zone id (``fe80::1%eth0``) is dropped, as are surrounding brackets (``[::1]``);
    * IPv6 is lower-case and compressed (``FE80:0:0::1`` -> ``fe80::1``).

    Args:
        host: the peer address as the socket layer reported it (no port).

    Returns:
        The normalised string; input that is not an IP address is returned stripped of
        whitespace, brackets and zone id, unchanged otherwise (it will match no rule).
    """
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


@dataclass(frozen=True, slots=True)
class ClientAddress:
    """A client's address, normalised once (the shell remembers these per peer address)."""

    text: str
    """The normalised numeric form (:func:`normalise_peer`): logs, events, per-host counts."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    """The parsed address, or None for text that is not an IP address (it matches no rule)."""

    def __str__(self) -> str:
        """The normalised text."""
        return self.text


def client_address(raw: str) -> ClientAddress:
    """Normalise and parse a peer address as the socket layer reported it (no port)."""
    text = normalise_peer(raw)
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(text)
    except ValueError:
        ip = None
    return ClientAddress(text, ip)
