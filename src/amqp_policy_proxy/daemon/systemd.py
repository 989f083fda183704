"""systemd integration: ``sd_notify`` (one datagram to ``$NOTIFY_SOCKET``) and the watchdog.

Our own helper: the protocol is a single ``AF_UNIX`` datagram of ``KEY=VALUE`` lines; an
``@`` prefix means the abstract namespace. Without ``NOTIFY_SOCKET`` every call is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(state: str, *, env: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=..."``) to the service manager.

    Args:
        state: newline-separated assignments.
        env: environment to read ``NOTIFY_SOCKET`` from (default ``os.environ``).

    Returns:
        True when a datagram was sent; False without ``NOTIFY_SOCKET`` or on error (logged).
    """
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode("utf-8"))
        return True
    except OSError as exc:
        logger.warning("sd_notify to %s failed: %s", path, exc)
        return False


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Return half the ``WATCHDOG_USEC`` period in seconds, or None when no watchdog is set.

    ``WATCHDOG_PID``, when set, must be this process.
    """
    e = env if env is not None else os.environ
    usec = e.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = e.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        return max(0.01, int(usec) / 1_000_000 / 2)
    except ValueError:
        return None


def start_watchdog(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
    """Ping ``WATCHDOG=1`` from the event loop every half period (a stuck loop stops pings)."""
    interval = watchdog_interval()
    if interval is None:
        return None

    async def ping() -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    return loop.create_task(ping())
