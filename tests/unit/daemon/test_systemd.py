"""daemon/systemd.py: sd_notify datagrams and the watchdog interval, against a real
``AF_UNIX`` datagram socket standing in for the service manager."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from amqp_policy_proxy.daemon import systemd


def _manager(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    return sock, path


def test_notify_sends_one_datagram(tmp_path: Path) -> None:
    sock, path = _manager(tmp_path)
    with sock:
        assert systemd.notify("READY=1\nSTATUS=up", env={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_notify_without_a_socket_does_nothing() -> None:
    assert systemd.notify("READY=1", env={}) is False


def test_notify_never_blocks_on_a_manager_that_does_not_read(tmp_path: Path) -> None:
    """A full receive queue loses the datagram (False) instead of stalling the event loop:
    a workers' parent that is itself blocked must not block every worker."""
    sock, path = _manager(tmp_path)
    with sock:
        env = {"NOTIFY_SOCKET": path}
        started = time.monotonic()
        results = [systemd.notify("WATCHDOG=1", env=env) for _ in range(2000)]
        assert time.monotonic() - started < 5
        assert results[0] is True and results[-1] is False


def test_watchdog_interval_is_half_the_period() -> None:
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "400000"}) == 0.2
    assert systemd.watchdog_interval({}) is None
