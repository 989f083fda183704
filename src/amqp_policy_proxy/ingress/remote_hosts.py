"""Sans-IO. QDR ``remoteHosts``: which client addresses a policy group may connect from.

QDR's ``policy_util.py`` (``HostStruct``, ``HostAddr``), with the fixes and the extension listed
in docs/qdr-compatibility.md:

* ``*`` matches every IPv4 and IPv6 address; it cannot be combined with other text.
* A single IPv4 or IPv6 address matches only itself.
* ``low-high`` is an inclusive range; both ends the same family and ``low <= high``
  (QDR's messages). Only a string that is exactly two IP addresses joined by ``-`` is a range:
  anything else containing ``-`` (``my-host``) is a host name (QDR split it and failed).
* ``10.0.0.0/8`` and ``fd00::/8`` are CIDR networks (our extension).
* A host name is resolved **once, at load time**, by the injected resolver and must resolve to
  exactly one address (QDR's ``did not resolve`` / ``resolves to multiple IP addresses``).
* Matching normalises the client address first, so ``::ffff:10.1.2.3`` matches IPv4 rules.
* An address that does not parse never matches, even ``*`` (QDR denies it too).

netaddr is imported here and nowhere else outside :mod:`amqp_policy_proxy.ingress`.
No I/O: name resolution is a callable passed in by the caller.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Final

import netaddr

from amqp_policy_proxy.ingress.peer import ClientAddress, client_address, normalise_peer

Resolver = Callable[[str], list[str]]
"""Host name -> list of IP address strings; raises LookupError when the name does not resolve."""

WILDCARD: Final = "*"
_RANGE_SEP: Final = "-"
_LIST_SEP: Final = ","

IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


class RemoteHostsError(ValueError):
    """One or more ``remoteHosts`` items are invalid.

    ``problems`` holds ``(item_index, message)`` pairs, every bad item, in order.
    """

    problems: tuple[tuple[int, str], ...]

    def __init__(self, problems: Iterable[tuple[int, str]]) -> None:
        """Build from ``(index, message)`` pairs."""
        self.problems = tuple(problems)
        super().__init__("; ".join(f"[{i}] {m}" for i, m in self.problems))


def _parse_ip(text: str) -> IPAddr | None:
    """A strict IP address; IPv4-mapped IPv6 becomes IPv4 (clients are normalised the same)."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def split_spec(spec: str | Iterable[str]) -> tuple[str, ...]:
    """Split a ``remoteHosts`` value into trimmed items (as QDR's ``PolicyCompiler``).

    Args:
        spec: a comma-separated string (items trimmed of spaces, as QDR does) or a list of
            strings (each trimmed too).

    Returns:
        The items in order, empty items included (they are configuration errors).
    """
    if isinstance(spec, str):
        return tuple(x.strip() for x in spec.split(_LIST_SEP))
    return tuple(str(x).strip() for x in spec)


class RemoteHosts:
    """An immutable, compiled ``remoteHosts`` list.

    ``RemoteHosts()`` (no items) denies every host: that is what a missing ``remoteHosts`` key
    means in QDR.
    """

    __slots__ = ("_items", "_wildcard", "_entries", "_all", "_resolved")

    _items: tuple[str, ...]
    _wildcard: bool
    _entries: tuple[tuple[str, netaddr.IPSet], ...]
    _all: netaddr.IPSet
    _resolved: MappingProxyType[str, str]

    def __init__(self) -> None:
        """The empty list: denies every host."""
        object.__setattr__(self, "_items", ())
        object.__setattr__(self, "_wildcard", False)
        object.__setattr__(self, "_entries", ())
        object.__setattr__(self, "_all", netaddr.IPSet())
        object.__setattr__(self, "_resolved", MappingProxyType({}))

    def __setattr__(self, name: str, value: object) -> None:
        """Refuse mutation: the object is shared by every connection of a policy snapshot."""
        raise AttributeError(f"{type(self).__name__} is immutable")

    @classmethod
    def parse(
        cls, spec: str | Iterable[str], *, resolver: Resolver | None = None
    ) -> RemoteHosts:
        """Compile a ``remoteHosts`` value.

        Args:
            spec: a comma-separated string or a list of host specs: ``*``, an IPv4 or IPv6
                address, ``low-high``, a CIDR network, or a host name.
            resolver: resolves host names (called once per name, at load time); None makes
                every host name an error.

        Returns:
            The compiled list.

        Raises:
            RemoteHostsError: (a ValueError) listing every bad item with its index; an
                explicit empty value (``""``) is one of them, as in QDR.
        """
        items = split_spec(spec)
        problems: list[tuple[int, str]] = []
        entries: list[tuple[str, netaddr.IPSet]] = []
        resolved: dict[str, str] = {}
        wildcard = False
        for index, item in enumerate(items):
            try:
                if item == WILDCARD:
                    wildcard = True
                    entries.append((item, netaddr.IPSet(["0.0.0.0/0", "::/0"])))
                    continue
                ipset, address = _compile_item(item, resolver)
            except ValueError as exc:
                problems.append((index, str(exc)))
                continue
            if address is not None:
                resolved[item] = address
            entries.append((item, ipset))
        if problems:
            raise RemoteHostsError(problems)
        union = netaddr.IPSet()
        for _, ipset in entries:
            union |= ipset
        hosts = cls()
        object.__setattr__(hosts, "_items", items)
        object.__setattr__(hosts, "_wildcard", wildcard)
        object.__setattr__(hosts, "_entries", tuple(entries))
        object.__setattr__(hosts, "_all", union)
        object.__setattr__(hosts, "_resolved", MappingProxyType(resolved))
        return hosts

    @property
    def items(self) -> tuple[str, ...]:
        """The configured items, trimmed, in order."""
        return self._items

    @property
    def resolved(self) -> MappingProxyType[str, str]:
        """Host-name items and the single address each resolved to at load time."""
        return self._resolved

    def is_empty(self) -> bool:
        """True when no item is configured (every host is denied)."""
        return not self._items

    def matches(self, remote_host: str | ClientAddress) -> bool:
        """Whether a client at ``remote_host`` may connect.

        Args:
            remote_host: the client's address, parsed once by the shell
                (:class:`~.peer.ClientAddress`), or its numeric IP in any textual form (it is
                normalised, so ``::ffff:10.1.2.3`` counts as ``10.1.2.3``).

        Returns:
            True when some item matches; False for an address that does not parse.
        """
        addr = _client_address(remote_host)
        if addr is None:
            return False
        if self._wildcard:
            return True
        return netaddr.IPAddress(int(addr), addr.version) in self._all

    def first_match(self, remote_host: str | ClientAddress) -> str | None:
        """The first item that matches ``remote_host`` (for ``explain``), or None."""
        addr = _client_address(remote_host)
        if addr is None:
            return None
        candidate = netaddr.IPAddress(int(addr), addr.version)
        for item, ipset in self._entries:
            if candidate in ipset:
                return item
        return None

    def __eq__(self, other: object) -> bool:
        """Equal when the items (and what host names resolved to) are equal."""
        if not isinstance(other, RemoteHosts):
            return NotImplemented
        return self._items == other._items and dict(self._resolved) == dict(other._resolved)

    def __hash__(self) -> int:
        """Hash of the items."""
        return hash(self._items)

    def __repr__(self) -> str:
        """``RemoteHosts.parse(['*'])`` style."""
        return f"RemoteHosts.parse({list(self._items)!r})"


def _client_address(remote_host: str | ClientAddress) -> IPAddr | None:
    if isinstance(remote_host, ClientAddress):
        return remote_host.ip
    return client_address(remote_host).ip


def _compile_item(item: str, resolver: Resolver | None) -> tuple[netaddr.IPSet, str | None]:
    """One host spec -> (set of addresses, resolved address for host names)."""
    if not item:
        raise ValueError(
            "empty host spec: an explicit empty remoteHosts is a configuration error in QDR; "
            "leave remoteHosts out to deny every host"
        )
    if WILDCARD in item:
        raise ValueError("'*' cannot be combined with other text")
    if "%" in item:
        raise ValueError("IPv6 zone ids are not supported in remoteHosts")
    if "/" in item:
        return _compile_cidr(item), None
    single = _parse_ip(item)
    if single is not None:
        return netaddr.IPSet([str(single)]), None
    if _RANGE_SEP in item:
        parts = [p.strip() for p in item.split(_RANGE_SEP)]
        ips = [_parse_ip(p) for p in parts]
        if all(ip is not None for ip in ips):
            if len(ips) != 2:
                raise ValueError("hostspec must contain 1 or 2 host names")
            return _compile_range(item, ips[0], ips[1]), None  # type: ignore[arg-type]
        looks_like_range = any(ip is not None for ip in ips)
        address = _resolve(item, resolver, range_hint=looks_like_range)
        return netaddr.IPSet([address]), address
    if _looks_numeric(item):
        raise ValueError(f"'{item}' is not a valid IP address")
    address = _resolve(item, resolver, range_hint=False)
    return netaddr.IPSet([address]), address


def _looks_numeric(item: str) -> bool:
    # "300.1.1.1" or "fe80::zz" is a mistyped address, not a host name (names have no ':'
    # and are not all digits and dots).
    return ":" in item or all(c.isdigit() or c == "." for c in item)


def _compile_cidr(item: str) -> netaddr.IPSet:
    try:
        network = ipaddress.ip_network(item, strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise ValueError(f"not a valid CIDR network: {exc}") from None
        raise ValueError(
            f"CIDR network has host bits set; did you mean '{loose.with_prefixlen}'?"
        ) from None
    return netaddr.IPSet([network.with_prefixlen])


def _compile_range(item: str, low: IPAddr, high: IPAddr) -> netaddr.IPSet:
    if low.version != high.version:
        raise ValueError("mixed IPv4 and IPv6 host specs in range not allowed")
    if int(low) > int(high):
        raise ValueError("host specs in range must have lower numeric address first")
    return netaddr.IPSet(netaddr.IPRange(str(low), str(high)))


def _resolve(name: str, resolver: Resolver | None, *, range_hint: bool) -> str:
    hint = (
        " (it contains '-' but is not two IP addresses, so it is treated as a host name)"
        if range_hint
        else ""
    )
    if resolver is None:
        raise ValueError(
            f"'{name}' is a host name: cannot resolve host names without a resolver{hint}"
        )
    try:
        answers = resolver(name)
    except LookupError as exc:
        detail = f": {exc}" if str(exc) else ""
        raise ValueError(f"'{name}' did not resolve to an IP address{detail}{hint}") from None
    addresses: list[str] = []
    for answer in answers:
        addr = _parse_ip(normalise_peer(answer))
        if addr is None:
            raise ValueError(f"'{name}' resolved to '{answer}', which is not an IP address")
        if str(addr) not in addresses:
            addresses.append(str(addr))
    if not addresses:
        raise ValueError(f"'{name}' did not resolve to an IP address{hint}")
    if len(addresses) > 1:
        raise ValueError(
            f"'{name}' resolves to multiple IP addresses ({', '.join(addresses)}); "
            "QDR requires exactly one"
        )
    return addresses[0]
