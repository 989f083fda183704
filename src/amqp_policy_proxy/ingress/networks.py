"""Sans-IO. Client address networks for bans: one IP address or a CIDR network, written in one
canonical text, and a set of them that says which ones contain a client's address.

A ban names an address (``10.1.2.3``, ``2001:db8::7``) or a network (``10.0.0.0/8``,
``2001:db8::/32``). The text is canonical so that one network has one name (the key a ban is
stored, listed and lifted under): IPv6 lower-case and compressed, an IPv4-mapped IPv6 address
as IPv4 (clients are normalised the same way, :func:`~.peer.normalise_peer`), and a network of
one address (``/32``, ``/128``) as the plain address. A network with host bits set
(``10.1.2.3/8``) is refused rather than widened: it is almost always a typo, and widening it
would ban sixteen million addresses. Host names are refused (a ban is an address decision,
made now; a name may resolve elsewhere later).

netaddr does the matching (as for ``remoteHosts``, :mod:`.remote_hosts`). No I/O.
"""

from __future__ import annotations

import ipaddress

import netaddr

from .peer import normalise_peer

__all__ = ["NetworkSet", "canonical_network"]


def canonical_network(text: str) -> str:
    """The canonical text of an IP address or CIDR network (see the module docstring).

    Args:
        text: ``ADDRESS`` or ``ADDRESS/PREFIX`` (IPv4 or IPv6; brackets and surrounding
            whitespace are accepted).

    Returns:
        ``10.1.2.3``, ``10.0.0.0/8``, ``2001:db8::/32``...

    Raises:
        ValueError: not an IP address or network, a prefix out of range, or host bits set
            (the message says which and suggests the network meant).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an IP address or a CIDR network is required")
    raw = text.strip()
    address, slash, prefix = raw.partition("/")
    address = address.strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"'{raw}' is not an IP address or a CIDR network (ADDRESS or "
                         "ADDRESS/PREFIX; host names are not accepted)") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        mapped = ip.ipv4_mapped
        if slash:
            if not prefix.strip().isdigit() or int(prefix) < 96:
                raise ValueError(f"'{raw}': an IPv4-mapped network needs a prefix of 96 to "
                                 "128 (it is written as IPv4)")
            prefix = str(int(prefix) - 96)
        ip = mapped
    width = ip.max_prefixlen
    if not slash:
        return str(ip)
    prefix = prefix.strip()
    if not prefix.isdigit() or not 0 <= int(prefix) <= width:
        raise ValueError(f"'{raw}': the prefix must be a number from 0 to {width}")
    length = int(prefix)
    network = ipaddress.ip_network(f"{ip}/{length}", strict=False)
    if network.network_address != ip:
        raise ValueError(f"'{raw}' has host bits set: write {network} for the network, or "
                         f"{ip} for the one address")
    return str(ip) if length == width else str(network)


class NetworkSet:
    """Canonical addresses and networks (:func:`canonical_network`), each matched against a
    client's address by netaddr.

    Single addresses are looked up in a dict (a quarantine bans one address at a time, so
    there may be many); networks are tried one by one (an operator bans few).
    """

    __slots__ = ("_addresses", "_networks")

    def __init__(self) -> None:
        """An empty set."""
        self._addresses: set[str] = set()
        self._networks: dict[str, netaddr.IPNetwork] = {}

    def __len__(self) -> int:
        """How many addresses and networks are in the set."""
        return len(self._addresses) + len(self._networks)

    def add(self, canonical: str) -> None:
        """Add an address or network already in canonical form (:func:`canonical_network`).

        Raises:
            ValueError: ``canonical`` is not canonical.
        """
        if canonical_network(canonical) != canonical:
            raise ValueError(f"'{canonical}' is not in canonical form")
        if "/" in canonical:
            self._networks[canonical] = netaddr.IPNetwork(canonical)
        else:
            self._addresses.add(canonical)

    def discard(self, canonical: str) -> None:
        """Remove an address or network (nothing when absent)."""
        self._addresses.discard(canonical)
        self._networks.pop(canonical, None)

    def matches(self, remote_host: str) -> list[str]:
        """The members that contain ``remote_host``, the address first, then the networks
        in the order they were added.

        Args:
            remote_host: the client's address in any textual form (normalised here); text
                that is not an IP address matches nothing.
        """
        host = normalise_peer(remote_host)
        found = [host] if host in self._addresses else []
        if self._networks:
            try:
                ip = netaddr.IPAddress(str(ipaddress.ip_address(host)))
            except ValueError:  # not an IP address: matches no network
                return found
            found += [name for name, net in self._networks.items()
                      if net.version == ip.version and ip in net]
        return found
