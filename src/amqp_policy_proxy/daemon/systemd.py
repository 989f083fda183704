"""systemd integration: ``sd_notify`` (one datagram to ``$NOTIFY_SOCKET``) and the watchdog.

Daemon shell. Our own helper, no libsystemd: the protocol is a single ``AF_UNIX`` datagram of
newline-separated ``KEY=VALUE`` assignments (``sd_notify(3)``); an ``@`` prefix on the socket
path means the abstract namespace. Without ``NOTIFY_SOCKET`` every call is a no-op, so the
daemon runs the same outside systemd. What the daemon sends, and when:

- ``READY=1`` + ``STATUS=`` once every listener is bound;
- ``RELOADING=1`` + ``MONOTONIC_USEC=`` at the start of a SIGHUP reload, ``READY=1`` +
  ``STATUS=`` at its end (also after a failed reload: the old policy is still serving);
- ``STATUS=`` with live counts whenever they change (at most once a second);
- ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` from the event loop (a stuck loop stops them);
- ``STOPPING=1`` when the drain starts.
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

    Never blocks: a receiver whose queue is full (a service manager, or a workers' parent,
    that is not reading) loses this datagram (EAGAIN, logged once) rather than stalling the
    event loop; the watchdog pings again within its period.

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
            sock.send(state.encode("utf-8"), socket.MSG_DONTWAIT)
        return True
    except OSError as exc:
        # warn once per distinct failure: the watchdog would otherwise log twice a period
        key = (path, exc.errno)
        level = logging.DEBUG if key in _reported else logging.WARNING
        _reported.add(key)
        logger.log(level, "sd_notify to %s failed: %s", path, exc)
        return False


_reported: set[tuple[str, int | None]] = set()


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Return the ``WATCHDOG=1`` ping interval: half the ``WATCHDOG_USEC`` period.

    Args:
        env: environment to read (default ``os.environ``).

    Returns:
        Seconds (at least 0.01), or None when no watchdog is set: ``WATCHDOG_USEC`` missing,
        not a positive integer, or ``WATCHDOG_PID`` set to another process.
    """
    e = env if env is not None else os.environ
    usec = e.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = e.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    if value <= 0:
        return None
    return max(0.01, value / 1_000_000 / 2)


def start_watchdog(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
    """Ping ``WATCHDOG=1`` from the event loop every half period (a stuck loop stops pings).

    Args:
        loop: the daemon's running event loop; the pings are a task on it.

    Returns:
        The task (cancel it at shutdown), or None when no watchdog is configured.
    """
    interval = watchdog_interval()
    if interval is None:
        return None

    async def ping() -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    return loop.create_task(ping())
