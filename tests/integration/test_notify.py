"""The daemon speaks sd_notify as systemd expects: a real ``AF_UNIX`` datagram socket.

The daemon runs as a subprocess (``.venv/bin/amqp-policy-proxy run``) with ``NOTIFY_SOCKET``
and ``WATCHDOG_USEC`` set, exactly as systemd would start a ``Type=notify`` unit with
``WatchdogSec=``; the test plays the service manager and reads every datagram.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).with_name("amqp-policy-proxy")

POLICY_V1 = [["vhost", {
    "hostname": "$default", "allowUnknownUser": True, "maxConnections": 10,
    "groups": {"$default": {"remoteHosts": "*", "sources": "*", "targets": "*"}},
}]]
POLICY_V2 = [["vhost", {
    "hostname": "$default", "allowUnknownUser": True, "maxConnections": 20,
    "groups": {"$default": {"remoteHosts": "*", "sources": "*", "targets": "*"}},
}]]
BROKEN = '[["vhost", {"hostname": "$default", "maxConections": 5}]]'  # misspelt key


class ServiceManager:
    """The receiving end of ``NOTIFY_SOCKET``: collects and parses datagrams."""

    def __init__(self, address: str) -> None:
        """Bind a datagram socket at ``address`` (``@name`` = abstract namespace)."""
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        bind_to = "\0" + address[1:] if address.startswith("@") else address
        self.sock.bind(bind_to)
        self.messages: list[dict[str, str]] = []

    def close(self) -> None:
        """Close the socket (and remove its file)."""
        self.sock.close()
        if not self.address.startswith("@") and os.path.exists(self.address):
            os.unlink(self.address)

    def _receive(self, timeout: float) -> dict[str, str] | None:
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return None
        fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
        self.messages.append(fields)
        return fields

    def wait_for(self, key: str, timeout: float = 15.0) -> dict[str, str]:
        """Read datagrams until one sets ``key``; return it.

        Raises:
            AssertionError: nothing with ``key`` within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self._receive(left)
            if msg is not None and key in msg:
                return msg
        raise AssertionError(f"no {key} within {timeout}s; got {self.messages}")

    def drain(self, seconds: float) -> None:
        """Keep reading for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._receive(left)

    def states(self) -> list[str]:
        """The lifecycle states in order (READY/RELOADING/STOPPING), watchdog pings dropped."""
        out = []
        for msg in self.messages:
            for key in ("READY", "RELOADING", "STOPPING"):
                if msg.get(key) == "1":
                    out.append(key)
        return out


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short temporary directory (for the socket path), removed afterwards."""
    # short path: AF_UNIX socket paths are limited to 107 bytes
    path = Path(tempfile.mkdtemp(prefix="sdn", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_daemon(workdir: Path, notify_socket: str, *, watchdog_usec: int | None = 200_000,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Run the daemon like systemd would; the policy is ``workdir/policy.json``."""
    env = dict(os.environ, NOTIFY_SOCKET=notify_socket)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    env.update(extra_env or {})
    return subprocess.Popen(
        [str(CLI), "--log-level", "INFO", "run", "--listen", "127.0.0.1:0",
         "--upstream", f"127.0.0.1:{free_port()}", "--policy", str(workdir / "policy.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> tuple[int, str]:
    """Wait for the process (killing it on timeout); return (exit code, stderr)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"daemon did not exit; stderr:\n{err.decode()}") from None
    return proc.returncode, err.decode()


def test_ready_reload_watchdog_stopping_sequence(workdir: Path) -> None:
    (workdir / "policy.json").write_text(json.dumps(POLICY_V1))
    manager = ServiceManager(str(workdir / "notify.sock"))
    proc = start_daemon(workdir, manager.address)
    try:
        ready = manager.wait_for("READY")
        assert ready["READY"] == "1"
        assert "connections" in ready["STATUS"] and "policy" in ready["STATUS"]

        # the watchdog pings from the event loop every WATCHDOG_USEC / 2 = 0.1 s
        manager.wait_for("WATCHDOG", timeout=2)
        manager.wait_for("WATCHDOG", timeout=2)

        # a valid reload: RELOADING=1 with MONOTONIC_USEC, then READY=1
        (workdir / "policy.json").write_text(json.dumps(POLICY_V2))
        before = time.monotonic_ns() // 1000
        proc.send_signal(signal.SIGHUP)
        reloading = manager.wait_for("RELOADING")
        after = time.monotonic_ns() // 1000
        assert reloading["RELOADING"] == "1"
        # CLOCK_MONOTONIC is system-wide: the daemon's stamp lies between ours
        assert before <= int(reloading["MONOTONIC_USEC"]) <= after
        ready2 = manager.wait_for("READY")
        assert "failed" not in ready2["STATUS"]

        # a broken policy: still RELOADING/READY (the old policy keeps serving), STATUS says so
        (workdir / "policy.json").write_text(BROKEN)
        proc.send_signal(signal.SIGHUP)
        manager.wait_for("RELOADING")
        ready3 = manager.wait_for("READY")
        assert ready3["STATUS"].startswith("policy reload failed")

        manager.wait_for("WATCHDOG", timeout=2)
        proc.send_signal(signal.SIGTERM)
        stopping = manager.wait_for("STOPPING")
        assert stopping["STATUS"] == "draining 0 connections"
        code, err = finish(proc)
        manager.drain(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        manager.close()
    assert code == 0, err
    assert manager.states() == ["READY", "RELOADING", "READY", "RELOADING", "READY", "STOPPING"]
    first_ready = next(i for i, m in enumerate(manager.messages) if m.get("READY") == "1")
    pings = [i for i, m in enumerate(manager.messages) if m.get("WATCHDOG") == "1"]
    assert len(pings) >= 3 and min(pings) > first_ready
    assert "maxConections" in err  # every issue of the broken file is logged, with its path
    assert str(workdir / "policy.json") in err


def test_abstract_socket_and_no_watchdog_for_another_pid(workdir: Path) -> None:
    (workdir / "policy.json").write_text(json.dumps(POLICY_V1))
    manager = ServiceManager(f"@amqp-policy-proxy-test-{os.getpid()}-{time.monotonic_ns()}")
    # WATCHDOG_PID names another process: the watchdog is not ours to feed
    proc = start_daemon(workdir, manager.address, extra_env={"WATCHDOG_PID": "1"})
    try:
        manager.wait_for("READY")
        manager.drain(0.5)
        proc.send_signal(signal.SIGTERM)
        manager.wait_for("STOPPING")
        code, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        manager.close()
    assert code == 0, err
    assert not any("WATCHDOG" in m for m in manager.messages)


def test_bad_policy_at_start_exits_2_without_ready(workdir: Path) -> None:
    (workdir / "policy.json").write_text(BROKEN)
    manager = ServiceManager(str(workdir / "notify.sock"))
    proc = start_daemon(workdir, manager.address)
    try:
        code, err = finish(proc)
        manager.drain(0.2)
    finally:
        manager.close()
    assert code == 2
    assert "maxConections" in err
    assert manager.states() == []
