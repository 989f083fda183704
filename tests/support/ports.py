"""Free TCP ports for test servers."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now.

    The port is found by binding port 0 and closing the socket again, so another process may take
    it before the caller binds it; callers that can bind port 0 themselves should do that instead.

    Args:
        host: the local address to probe (IPv4 or IPv6 literal, or a name).

    Returns:
        A port number in the kernel's ephemeral range.

    Raises:
        OSError: when ``host`` cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
