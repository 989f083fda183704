"""System DNS resolution for ``remoteHosts`` host names (daemon shell; does I/O).

The policy compiler never resolves names itself: the daemon passes :func:`system_resolver` to
:func:`amqp_policy_proxy.policy.load.load_policy`. QDR resolves with ``getaddrinfo`` at
configuration time only; so does the proxy, at every (re)load.
"""

from __future__ import annotations

import socket


def system_resolver(name: str) -> list[str]:
    """Resolve a host name to its IPv4 and IPv6 addresses with ``getaddrinfo``.

    Args:
        name: the host name from a ``remoteHosts`` item.

    Returns:
        The distinct numeric addresses, in the resolver's order (IPv6 without zone id).

    Raises:
        LookupError: the name does not resolve (or resolves to no IPv4/IPv6 address).
    """
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise LookupError(f"{name}: {exc}") from None
    addresses: list[str] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = str(sockaddr[0]).split("%", 1)[0]
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise LookupError(f"{name}: no IPv4 or IPv6 address")
    return addresses
