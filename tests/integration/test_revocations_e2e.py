"""Bans, quarantine and paced closes end to end: real proton clients through a real proxy to
the in-tree broker, driven through the admin socket by the real CLI.

A ban closes exactly the banned user's (or address's) open connections with Close
``amqp:connection:forced`` and its reason, while the others keep delivering; a banned client
is refused at its Open with QDR's denial, counted as ``banned``; the ban expires on its own
or is lifted; every change is in the event log. A vhost's quarantine bans a user that
collects its denials; a paced close closes at the rate asked.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, ConnectionClosed, LinkDetached

from amqp_policy_proxy.cli import main
from amqp_policy_proxy.daemon.config import AdminConfig, DaemonConfig
from tests.support.proxy import ProxyThread

pytestmark = pytest.mark.integration

POLICY = str(Path(__file__).parent / "policies" / "revocations.json")
FORCED = "amqp:connection:forced"
DISALLOWED = ("amqp:resource-limit-exceeded", "connection disallowed by local policy")


@pytest.fixture
def ops(broker_address, tmp_path) -> Iterator[ProxyThread]:
    """A proxy with the admin socket, metrics and the event log, on 127.0.0.1 and ::1."""
    admin_dir = Path(tempfile.mkdtemp(prefix="admin-", dir="/tmp"))
    config = DaemonConfig(admin=AdminConfig(socket=str(admin_dir / "admin.sock")))
    proxy = ProxyThread([broker_address], policy_path=POLICY, metrics=True,
                        event_log_dir=str(tmp_path / "events"), config=config,
                        listen=[("127.0.0.1", 0), ("::1", 0)])
    proxy.start()
    proxy.socket = str(admin_dir / "admin.sock")
    proxy.v6_port = proxy.daemon.listen_addresses[-1][1]
    proxy.events_dir = tmp_path / "events"
    yield proxy
    proxy.stop()
    shutil.rmtree(admin_dir, ignore_errors=True)


def connect(port: int, user: str, vhost: str = "ops", host: str = "127.0.0.1",
            ) -> BlockingConnection:
    url = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BlockingConnection(url, timeout=10, user=user, password="secret",
                              allowed_mechs="PLAIN", allow_insecure_mechs=True,
                              virtual_host=vhost)


def cli(proxy: ProxyThread, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--admin-socket", proxy.socket])
    return code, out.getvalue(), err.getvalue()


def cli_json(proxy: ProxyThread, *args: str) -> Any:
    code, out, err = cli(proxy, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def wait_for(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def scrape(proxy: ProxyThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    proxy.call(proxy.daemon.publish_now)
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def close_condition(conn: BlockingConnection) -> tuple[str, str]:
    """Wait for the peer's Close and answer it; its (condition, description)."""
    with pytest.raises(ConnectionClosed):
        conn.wait(lambda: False, timeout=5)
    cond = conn.conn.remote_condition
    conn.close()
    return str(cond.name), str(cond.description)


def refused(port: int, user: str, **kw: Any) -> tuple[str, str]:
    """Connect and expect QDR's denial at the Open: (condition, description)."""
    with pytest.raises(ConnectionException) as info:
        connect(port, user, **kw)
    text = str(info.value)
    return DISALLOWED if all(part in text for part in DISALLOWED) else (text, "")


def round_trip(conn: BlockingConnection, address: str, body: str) -> None:
    receiver = conn.create_receiver(address)
    conn.create_sender(address).send(Message(body=body))
    assert receiver.receive(timeout=5).body == body
    receiver.accept()


def records(proxy: ProxyThread, event: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(proxy.events_dir.rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["event"] == event:
                out.append(record)
    return out


@pytest.mark.slow
def test_a_user_ban_closes_exactly_that_users_connections_and_refuses_it(ops):
    a1, a2 = connect(ops.port, "alice"), connect(ops.v6_port, "alice", host="::1")
    bob = connect(ops.port, "bob")
    try:
        round_trip(a1, "orders.a", "before")
        code, out, err = cli(ops, "ban", "user", " alice ", "--for", "1h",
                             "--reason", "password leaked")
        assert code == 0, err
        assert out.startswith("user alice banned until 20") and "2 connections closed" in out
        assert close_condition(a1) == (FORCED, "banned by an operator: password leaked")
        assert close_condition(a2) == (FORCED, "banned by an operator: password leaked")
        round_trip(bob, "orders.b", "bob goes on")
        # refused at the Open, on either listener, counted as banned
        assert refused(ops.port, "alice") == DISALLOWED
        assert refused(ops.v6_port, "alice", host="::1") == DISALLOWED
        samples = scrape(ops)
        assert metric(samples, "amqp_proxy_connections_denied_total", vhost="ops",
                      reason="banned") == 2
        assert metric(samples, "amqp_proxy_bans_active", kind="user") == 1
        assert metric(samples, "amqp_proxy_connections_closed_total", vhost="ops",
                      reason="banned") == 2
        [row] = cli_json(ops, "bans", "list")
        assert (row["kind"], row["value"], row["source"], row["reason"]) == (
            "user", "alice", "operator", "password leaked")
        code, out, _ = cli(ops, "bans", "list")
        assert out.splitlines()[0].split() == ["KIND", "VALUE", "SOURCE", "EXPIRES", "LEFT",
                                               "REASON"]
        assert out.splitlines()[-1] == "1 ban"
        # lifted: alice gets in again
        code, out, _ = cli(ops, "unban", "user", "alice")
        assert (code, out.strip()) == (0, "user alice unbanned")
        round_trip(connect(ops.port, "alice"), "orders.c", "back")
    finally:
        for c in (a1, a2, bob):
            with contextlib.suppress(Exception):
                c.close()
    ops.stop()
    decisions = [r for r in records(ops, "auth_decision") if r["reason"] == "banned"]
    assert len(decisions) == 2 and all(r["decision"] == "deny" for r in decisions)
    assert decisions[0]["rule"] == "user 'alice' banned by an operator: password leaked"
    assert len([r for r in records(ops, "connection_closed")
                if r["close_reason"] == "banned"]) == 2
    actions = [(r["action"], r["selector"], r["count"]) for r in records(ops, "admin_action")]
    assert actions == [("ban", "user=alice", 2), ("unban", "user=alice", 0)]


@pytest.mark.slow
def test_a_host_ban_covers_its_network_only_and_expires_on_its_own(ops):
    v4, v6 = connect(ops.port, "carol"), connect(ops.v6_port, "carol", host="::1")
    try:
        result = cli_json(ops, "ban", "host", "::1/128", "--for", "1.5")
        assert (result["value"], len(result["closed"])) == ("::1", 1)
        assert close_condition(v6)[0] == FORCED
        round_trip(v4, "orders.v4", "v4 goes on")
        assert refused(ops.v6_port, "carol", host="::1") == DISALLOWED
        connect(ops.port, "dave").close()  # another address: admitted
        # expires within a second of its time, on its own
        assert wait_for(lambda: cli_json(ops, "bans", "list") == [], timeout=3)
        connect(ops.v6_port, "carol", host="::1").close()
        # a bad address is refused by the daemon with the reason, exit 2
        code, _, err = cli(ops, "ban", "host", "10.1.2.3/8")
        assert code == 2 and "host bits set" in err
    finally:
        for c in (v4, v6):
            with contextlib.suppress(Exception):
                c.close()
    ops.stop()
    assert [r["action"] for r in records(ops, "admin_action")] == [
        "ban", "ban_expired", "ban"]


@pytest.mark.slow
def test_quarantine_bans_a_user_that_collects_its_denials_then_lets_it_back(ops):
    mallory = connect(ops.port, "mallory", vhost="guarded")
    trent = connect(ops.port, "usr2", vhost="guarded")
    try:
        for n in range(3):  # three denied links: the third triggers the quarantine
            with pytest.raises(LinkDetached):
                mallory.create_sender(f"forbidden.{n}")
        cond, text = close_condition(mallory)
        assert cond == FORCED and text.startswith("quarantined: 3 denials within 30 s")
        assert refused(ops.port, "mallory", vhost="guarded") == DISALLOWED
        round_trip(trent, "allowed.t", "trent goes on")
        [row] = cli_json(ops, "bans", "list")
        assert (row["kind"], row["value"], row["source"]) == ("user", "mallory", "quarantine")
        samples = scrape(ops)
        assert metric(samples, "amqp_proxy_quarantines_total", vhost="guarded",
                      kind="user") == 1
        # the denial of a banned user does not extend the ban: it ends after banSeconds
        assert wait_for(lambda: cli_json(ops, "bans", "list") == [], timeout=4)
        connect(ops.port, "mallory", vhost="guarded").close()
    finally:
        for c in (mallory, trent):
            with contextlib.suppress(Exception):
                c.close()
    ops.stop()
    [quarantine] = [r for r in records(ops, "admin_action") if r["action"] == "quarantine"]
    assert (quarantine["selector"], quarantine["vhost"], quarantine["count"]) == (
        "user=mallory", "guarded", 1)


@pytest.mark.slow
def test_connections_close_rate_paces_the_closes_with_progress(ops):
    n, rate = 40, 20.0
    conns = [connect(ops.port, "usr1") for _ in range(n)]
    closed_at: list[float] = []
    lock = threading.Lock()

    def watch(conn: BlockingConnection) -> None:
        with contextlib.suppress(Exception):
            conn.wait(lambda: conn.conn.state & conn.conn.REMOTE_CLOSED, timeout=10)
        with lock:
            closed_at.append(time.monotonic())

    try:
        keep = connect(ops.port, "bob")
        threads = [threading.Thread(target=watch, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        began = time.monotonic()
        code, out, err = cli(ops, "connections", "close", "--user", "usr1",
                             "--rate", str(rate))
        took = time.monotonic() - began
        for t in threads:
            t.join(15)
        assert code == 0, err
        assert f"closing {n} connections at 20/s" in err
        assert f"{n}/{n} closed" in err  # progress lines (not a terminal: one a second)
        assert out.startswith(f"closed {n} connections in ")
        assert len(closed_at) == n
        spread = max(closed_at) - min(closed_at)
        # 40 at 20/s: one per 50 ms slot, about 2 s in all; never all at once
        assert 1.6 <= spread <= 3.0, spread
        assert 1.6 <= took <= 4.0, took
        per_half_second = [sum(1 for t in closed_at if began + i / 2 <= t < began + (i + 1) / 2)
                           for i in range(4)]
        assert max(per_half_second) <= 16, per_half_second
        round_trip(keep, "orders.k", "not selected, not closed")
        keep.close()
    finally:
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()
