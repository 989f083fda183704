"""Hot reload under live traffic (SIGHUP, docs/deploy.md).

50 proxied connections (25 senders, 25 receivers, one queue per pair on the in-tree broker)
keep messages flowing while the policy directory is reloaded twice: once with a valid policy
(lower per-user limit, smaller frames, fewer sessions) and once with a broken file. Nothing
may be lost or dropped; the new limits apply to new connections only; the broken file is
reported with its path and counted in ``amqp_proxy_policy_reloads_total{result="error"}``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.core.events import ConnectionClosed, ConnectionDenied, PolicyReloaded
from amqp_policy_proxy.demo.broker import Broker
from tests.support.proxy import ProxyThread

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PAIRS = 25
VHOST = "traffic"


def policy(*, per_user: int, frame: int, sessions: int) -> list[object]:
    """The test vhost: everyone (ANONYMOUS) lands in ``$default``."""
    return [["vhost", {
        "hostname": VHOST, "allowUnknownUser": True, "maxConnections": 200,
        "maxConnectionsPerUser": per_user, "maxConnectionsPerHost": 200,
        "groups": {"$default": {
            "remoteHosts": "*", "sources": "*", "targets": "*",
            "maxFrameSize": frame, "maxSessions": sessions,
        }},
    }]]


V1 = policy(per_user=100, frame=16384, sessions=4)
V2 = policy(per_user=2 * PAIRS, frame=8192, sessions=2)
BROKEN = """[["vhost", {"hostname": "traffic", "allowUnknownUser": true,
  "maxConnectionsPerUser": "fifty",
  "groups": {"$default": {"remoteHosts": "*", "maxSesions": 3}}}]]"""


def connect(port: int) -> BlockingConnection:
    """An ANONYMOUS connection to the test vhost through the proxy on ``port``."""
    return BlockingConnection(f"127.0.0.1:{port}", virtual_host=VHOST,
                              allowed_mechs="ANONYMOUS", timeout=15)


def wait_for(pred: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Poll ``pred`` every 20 ms until true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or pred}")
        time.sleep(0.02)


class Pair:
    """One sender connection and one receiver connection on queue ``reload.<n>``."""

    def __init__(self, port: int, n: int, stop_sending: threading.Event) -> None:
        """Open both connections and links; the threads start with :meth:`start`."""
        self.address = f"reload.{n}"
        self.sent: list[str] = []
        self.received: list[str] = []
        self.errors: list[BaseException] = []
        self.stop_sending = stop_sending
        self.sender_conn = connect(port)
        self.receiver_conn = connect(port)
        self.sender = self.sender_conn.create_sender(self.address)
        self.receiver = self.receiver_conn.create_receiver(self.address, credit=20)
        self.threads = [threading.Thread(target=self._send, daemon=True),
                        threading.Thread(target=self._receive, daemon=True)]

    def start(self) -> None:
        """Start the sender and receiver threads."""
        for t in self.threads:
            t.start()

    def _send(self) -> None:
        n = 0
        try:
            while not self.stop_sending.is_set():
                body = f"{self.address}#{n}"
                self.sender.send(Message(body=body))  # returns once the broker settled it
                self.sent.append(body)
                n += 1
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def _receive(self) -> None:
        try:
            while True:
                done = not self.threads[0].is_alive()
                if done and len(self.received) >= len(self.sent):
                    return
                try:
                    msg = self.receiver.receive(timeout=0.2)
                except Exception as exc:
                    if type(exc).__name__ == "Timeout":
                        continue
                    raise
                self.received.append(str(msg.body))
                self.receiver.accept()
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def join(self) -> None:
        """Wait for both threads (30 s at most each)."""
        for t in self.threads:
            t.join(30)

    @property
    def connections(self) -> list[BlockingConnection]:
        """The sender's and the receiver's connection."""
        return [self.sender_conn, self.receiver_conn]


def scrape(proxy: ProxyThread) -> dict[str, float]:
    """``metric{labels}`` -> value from the proxy's /metrics endpoint."""
    proxy.call(proxy.daemon.publish_now)
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """An in-tree broker (ANONYMOUS) for this module."""
    b = Broker().start()
    yield b
    b.stop()


def test_reload_under_live_traffic(broker: Broker, tmp_path: Path,
                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy")
    policy_dir = tmp_path / "policy.d"
    policy_dir.mkdir()
    policy_file = policy_dir / "traffic.json"
    policy_file.write_text(json.dumps(V1))

    stop_sending = threading.Event()
    pairs: list[Pair] = []
    extra: list[BlockingConnection] = []
    with ProxyThread([broker.address], policy_path=str(policy_dir), metrics=True) as proxy:
        try:
            pairs = [Pair(proxy.port, n, stop_sending) for n in range(PAIRS)]
            for pair in pairs:
                pair.start()
            ledger = proxy.daemon.ledger

            def progress(at_least: int) -> Callable[[], bool]:
                marks = [len(p.received) for p in pairs]
                return lambda: all(len(p.received) >= m + at_least
                                   for p, m in zip(pairs, marks, strict=True))

            wait_for(progress(5), what="traffic on every pair")
            assert proxy.call(lambda: ledger.user_active(VHOST, "anonymous")) == 2 * PAIRS
            old_digest = proxy.daemon.policy.digest
            old = pairs[0].sender_conn.conn.transport

            # 1. a valid policy: swapped while messages flow
            flowing = progress(5)
            policy_file.write_text(json.dumps(V2))
            assert proxy.reload() is True
            new_digest = proxy.daemon.policy.digest
            assert new_digest != old_digest
            wait_for(flowing, what="traffic after the valid reload")
            # the counts carried over exactly; the new per-user limit (50) applies to them
            assert proxy.call(lambda: ledger.user_active(VHOST, "anonymous")) == 2 * PAIRS
            with pytest.raises(ConnectionException, match="resource-limit-exceeded"):
                connect(proxy.port).close()
            wait_for(lambda: [e.reason for e in proxy.events_of(ConnectionDenied)]
                     == ["user_limit"], what="the user_limit denial")

            # 2. a broken policy: rejected, the running one stays, traffic unaffected
            flowing = progress(5)
            policy_file.write_text(BROKEN)
            assert proxy.reload() is False
            assert proxy.daemon.policy.digest == new_digest
            wait_for(flowing, what="traffic after the broken reload")

            # existing connections kept the settings they were admitted with (policy v1) ...
            assert old.remote_max_frame_size == 16384
            assert old.remote_channel_max == 3
            # ... and no connection was dropped
            assert proxy.events_of(ConnectionClosed) == []
            assert len(proxy.daemon.connections) == 2 * PAIRS

            # a freed slot is reused at once (exact counts); the newcomer gets policy v2
            stop_sending.set()
            for pair in pairs:
                pair.join()
            pairs[0].sender_conn.close()
            wait_for(lambda: proxy.call(lambda: ledger.user_active(VHOST, "anonymous"))
                     == 2 * PAIRS - 1, what="the closed connection released")
            newcomer = connect(proxy.port)
            extra.append(newcomer)
            assert newcomer.conn.transport.remote_max_frame_size == 8192
            assert newcomer.conn.transport.remote_channel_max == 1
            assert proxy.call(lambda: ledger.user_active(VHOST, "anonymous")) == 2 * PAIRS

            metrics = scrape(proxy)
        finally:
            stop_sending.set()
            for pair in pairs:
                pair.join()
                for conn in pair.connections:
                    try:
                        conn.close()
                    except Exception:
                        pass
            for conn in extra:
                conn.close()
        wait_for(lambda: proxy.call(ledger.active) == 0, what="every connection released")

    # no message lost, none duplicated, in order, on every pair
    for pair in pairs:
        assert pair.errors == []
        assert pair.received == pair.sent
        assert len(pair.sent) >= 15
    assert sum(len(p.sent) for p in pairs) == sum(len(p.received) for p in pairs)

    reloads = [e for e in proxy.events if isinstance(e, PolicyReloaded)]
    assert [e.result for e in reloads] == ["ok", "error"]
    assert metrics['amqp_proxy_policy_reloads_total{result="ok"}'] == 1.0
    assert metrics['amqp_proxy_policy_reloads_total{result="error"}'] == 1.0
    assert metrics[f'amqp_proxy_policy_info{{digest="{new_digest}"}}'] == 1.0

    # every issue of the broken file was logged, with the file's path
    rejected = [r.getMessage() for r in caplog.records if "policy reload rejected" in r.message]
    assert len(rejected) >= 2
    assert all(str(policy_file) in m for m in rejected)
    assert any("maxConnectionsPerUser" in m for m in rejected)
    assert any("maxSesions" in m for m in rejected)
