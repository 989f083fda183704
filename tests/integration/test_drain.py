"""Graceful drain on SIGTERM: a subprocess daemon under live traffic, as systemd stops it.

Every client gets ``Close(amqp:connection:forced, "proxy shutting down")``, the daemon exits
0, and every message a receiver settled before the shutdown was delivered exactly once (the
broker does not hold it any more and nobody received it twice); nothing a sender had
confirmed is lost. A second signal skips the wait.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection, ConnectionClosed

from amqp_policy_proxy.core.connection import LINGER_SECONDS
from amqp_policy_proxy.demo.broker import Broker

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).with_name("amqp-policy-proxy")
POLICY = [["vhost", {
    "hostname": "$default", "allowUnknownUser": True, "maxConnections": 100,
    "groups": {"$default": {"remoteHosts": "*", "sources": "*", "targets": "*"}},
}]]
FORCED = ("amqp:connection:forced", "proxy shutting down")
PAIRS = 5


class DaemonProcess:
    """``amqp-policy-proxy run --config`` as a subprocess; stderr is collected by a thread."""

    def __init__(self, workdir: Path, upstream: tuple[str, int], grace: float) -> None:
        """Write the config and policy into ``workdir`` and start the daemon."""
        (workdir / "policy.json").write_text(json.dumps(POLICY))
        (workdir / "config.toml").write_text(
            '[[listener]]\naddress = "127.0.0.1:0"\n'
            f'[[upstream]]\naddress = "{upstream[0]}:{upstream[1]}"\n'
            '[policy]\npath = "policy.json"\n'
            f"[timeouts]\nshutdown_grace_seconds = {grace}\n")
        self.proc = subprocess.Popen([str(CLI), "run", "--config", str(workdir / "config.toml")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = self._wait_port()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def _wait_port(self) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                    return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.kill()
        raise AssertionError("daemon did not listen:\n" + "".join(self.lines))

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the daemon."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait for the exit code."""
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        """Kill the daemon if it is still running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """An in-tree broker (ANONYMOUS) for this module."""
    b = Broker().start()
    yield b
    b.stop()


def connect(port: int) -> BlockingConnection:
    """An ANONYMOUS client connection to the proxy on 127.0.0.1:``port``."""
    return BlockingConnection(f"127.0.0.1:{port}", allowed_mechs="ANONYMOUS", timeout=15)


def close_condition(conn: BlockingConnection) -> tuple[str, str] | None:
    """The (condition, description) of the peer's Close, or None."""
    if conn.conn is None:
        return None
    cond = conn.conn.remote_condition
    return (str(cond.name), str(cond.description)) if cond is not None else None


class Client:
    """One sender and one receiver connection on queue ``<prefix>.<n>``."""

    def __init__(self, port: int, address: str) -> None:
        """Open both connections to the proxy on ``port`` and start the threads."""
        self.address = address
        self.confirmed: list[str] = []  # the broker accepted them (send() returned)
        self.attempted: list[str] = []  # sent, confirmation not seen (at most one)
        self.settled: list[str] = []    # the receiver accepted them before the pause
        self.seen: list[str] = []       # every delivery the receiver got
        self.outcomes: dict[str, BaseException | None] = {}
        self.conditions: dict[str, tuple[str, str] | None] = {}
        self.pause = threading.Event()
        self.paused = threading.Event()
        self.snd_conn = connect(port)
        self.rcv_conn = connect(port)
        self.sender = self.snd_conn.create_sender(address)
        self.receiver = self.rcv_conn.create_receiver(address, credit=5)
        self.threads = [threading.Thread(target=self._send, daemon=True),
                        threading.Thread(target=self._receive, daemon=True)]
        for t in self.threads:
            t.start()

    def _send(self) -> None:
        n = 0
        try:
            while True:
                body = f"{self.address}#{n}"
                self.attempted.append(body)
                self.sender.send(Message(body=body))
                self.attempted.remove(body)
                self.confirmed.append(body)
                n += 1
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - the forced close ends the loop
            self.outcomes["sender"] = exc
            self.conditions["sender"] = close_condition(self.snd_conn)

    def _receive(self) -> None:
        try:
            while not self.pause.is_set():
                try:
                    msg = self.receiver.receive(timeout=0.1)
                except Timeout:
                    continue
                self.seen.append(str(msg.body))
                self.receiver.accept()
                self.settled.append(str(msg.body))
            # Barrier: the broker answers this Attach only after it has processed every frame
            # sent before it on this connection, the dispositions above included.
            self.rcv_conn.create_sender(f"{self.address}.barrier")
            self.paused.set()
            conn = self.rcv_conn
            try:
                conn.wait(lambda: False, timeout=30)
            except ConnectionClosed as exc:  # the Close was read: what this test waits for
                self.outcomes["receiver"] = exc
            self.conditions["receiver"] = close_condition(conn)
        except BaseException as exc:  # noqa: BLE001
            self.outcomes["receiver"] = exc
            self.paused.set()

    def join(self) -> None:
        """Wait for both threads (30 s at most each)."""
        for t in self.threads:
            t.join(30)

    def close(self) -> None:
        """Close both connections, ignoring errors."""
        for conn in (self.snd_conn, self.rcv_conn):
            try:
                conn.close()
            except Exception:
                pass


def drain_broker(broker: Broker, addresses: list[str]) -> dict[str, list[str]]:
    """Consume what is left on ``addresses`` directly from the broker (0.5 s of quiet ends it)."""
    conn = BlockingConnection(f"{broker.host}:{broker.port}", allowed_mechs="ANONYMOUS",
                              timeout=10)
    out: dict[str, list[str]] = {a: [] for a in addresses}
    try:
        receivers = {a: conn.create_receiver(a, credit=100) for a in addresses}
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 0.5:
            for address, receiver in receivers.items():
                try:
                    msg = receiver.receive(timeout=0.02)
                except Timeout:
                    continue
                out[address].append(str(msg.body))
                receiver.accept()
                quiet_since = time.monotonic()
    finally:
        conn.close()
    assert all(broker.queue_depth(a) == 0 for a in addresses)
    return out


def test_sigterm_drains_live_traffic(broker: Broker, tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, broker.address, grace=4)
    clients: list[Client] = []
    try:
        clients = [Client(daemon.port, f"drain.{n}") for n in range(PAIRS)]
        deadline = time.monotonic() + 20
        while any(len(c.settled) < 20 for c in clients):
            assert time.monotonic() < deadline, "no traffic"
            time.sleep(0.02)
        for c in clients:  # receivers stop settling; senders keep sending through the drain
            c.pause.set()
        for c in clients:
            assert c.paused.wait(10)
        # let the senders fill the queues and the paused receivers' credit (prefetched,
        # unsettled deliveries) before the signal
        time.sleep(0.3)
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        code = daemon.wait(15)
        elapsed = time.monotonic() - started
        for c in clients:
            c.join()
    finally:
        daemon.kill()
        for c in clients:
            c.close()
    assert code == 0, "".join(daemon.lines)
    assert elapsed < 4 + 3  # paused clients never answer: the grace period bounds the drain

    left = drain_broker(broker, [c.address for c in clients])
    for c in clients:
        # every client saw the forced close
        assert isinstance(c.outcomes.get("sender"), ConnectionClosed), c.outcomes
        assert isinstance(c.outcomes.get("receiver"), ConnectionClosed), c.outcomes
        assert c.conditions == {"sender": FORCED, "receiver": FORCED}

        remaining = left[c.address]
        # settled before the shutdown: delivered exactly once
        assert len(set(c.settled)) == len(c.settled)
        assert set(c.settled).isdisjoint(remaining)
        assert c.seen.count(c.settled[-1]) == 1
        # nothing confirmed is lost; nothing is duplicated; nothing unknown appears
        assert set(c.confirmed) <= set(c.settled) | set(remaining)
        assert len(set(remaining)) == len(remaining)
        assert set(remaining) <= set(c.confirmed) | set(c.attempted)
        # delivered to the paused receiver but never settled: back on the queue
        assert set(c.seen) - set(c.settled) <= set(remaining)


class FreezableRelay:
    """A TCP relay to ``target`` on 127.0.0.1 that can stop passing the upstream's replies.

    Frozen, it still carries bytes toward the broker but holds everything coming back, so
    the proxy's Close reaches the broker and the broker's Close never returns: a router that
    does not answer.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        """Bind and start accepting."""
        self.target = target
        self.frozen = threading.Event()
        self._lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self._lsock.getsockname()[1]
        self._socks: list[socket.socket] = [self._lsock]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._lsock.accept()
            except OSError:
                return
            up = socket.create_connection(self.target)
            self._socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                while replies and self.frozen.is_set():
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        """Close every socket; shutdown() first wakes the threads blocked in accept/recv."""
        self.frozen.clear()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_second_signal_exits_at_once(broker: Broker, tmp_path: Path) -> None:
    """A router that never answers the Close holds the drain; a second SIGTERM ends it."""
    for second_signal in (False, True):
        workdir = tmp_path / f"second-{second_signal}"
        workdir.mkdir()
        relay = FreezableRelay(broker.address)
        daemon = DaemonProcess(workdir, ("127.0.0.1", relay.port), grace=10)
        client = connect(daemon.port)
        try:
            relay.frozen.set()
            started = time.monotonic()
            daemon.signal(signal.SIGTERM)
            if second_signal:
                time.sleep(0.3)
                daemon.signal(signal.SIGTERM)
                code = daemon.wait(5)
                assert time.monotonic() - started < LINGER_SECONDS * 0.75
            else:
                # still draining: the proxy waits for the router's Close reply (up to its
                # linger time, within the grace period)
                with pytest.raises(subprocess.TimeoutExpired):
                    daemon.wait(LINGER_SECONDS / 2)
                code = daemon.wait(15)
            assert code == 0, "".join(daemon.lines)
            # the client was sent the forced Close before the exit
            with pytest.raises(ConnectionClosed):
                client.wait(lambda: False, timeout=5)
            assert close_condition(client) == FORCED
        finally:
            daemon.kill()
            relay.close()
            try:
                client.close()
            except Exception:
                pass


def test_a_client_that_never_answers_the_close_is_dropped_after_the_linger(broker: Broker,
                                                                         tmp_path: Path) -> None:
    """Issue 15 point 6: a client that never answers the forced Close is dropped after the
    documented linger (LINGER_SECONDS), not after the whole shutdown grace (seen: 28.9 s)."""
    from tests.support.rawpeer import RawClient

    daemon = DaemonProcess(tmp_path, broker.address, grace=30)
    try:
        with RawClient(daemon.port) as silent:
            silent.open("$default")  # then reads nothing and answers nothing
            started = time.monotonic()
            daemon.signal(signal.SIGTERM)
            code = daemon.wait(15)
            elapsed = time.monotonic() - started
    finally:
        daemon.kill()
    assert code == 0, "".join(daemon.lines)
    assert LINGER_SECONDS * 0.9 <= elapsed < LINGER_SECONDS + 1.5, elapsed
