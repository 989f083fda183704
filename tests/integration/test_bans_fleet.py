"""Bans across a fleet: one real redis-server, a proxy with ``--workers 2`` and a second
proxy, real proton clients through both to the in-tree broker.

A ban made through either proxy's admin socket reaches every process (both workers of one, the
other proxy) within a second: their connections of the banned user are closed and new ones
refused at the Open; a proxy started again refuses what the fleet bans from its first Open;
an unban through any of them lets the user back everywhere."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.admin_client import AdminClient
from tests.support.fleet import ProxyProcess, close_all, connect, wait_for
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not RedisServer.available(), reason="redis-server missing")]

POLICY = [["vhost", {
    "hostname": "fleet",
    "groups": {"all": {"users": "alice, bob", "remoteHosts": "*", "sources": "*",
                       "targets": "*"}}}]]
#: What "within a second" allows for: the 0.2 s poll, the Close's way to the client, and a
#: loaded 2-core machine.
WITHIN = 1.0


class Watch:
    """When each connection saw the proxy's Close (monotonic seconds), one thread each."""

    def __init__(self, conns: list[BlockingConnection]) -> None:
        self.closed: dict[int, float] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._one, args=(i, c), daemon=True)
                         for i, c in enumerate(conns)]
        for t in self._threads:
            t.start()

    def _one(self, i: int, conn: BlockingConnection) -> None:
        try:
            conn.wait(lambda: bool(conn.conn.state & conn.conn.REMOTE_CLOSED), timeout=15)
        except Exception:  # noqa: BLE001 - a Close is an exception in proton
            pass
        with self._lock:
            self.closed[i] = time.monotonic()

    def join(self) -> dict[int, float]:
        for t in self._threads:
            t.join(20)
        return dict(self.closed)


def refused(port: int, user: str) -> bool:
    try:
        connect(port, user, vhost="fleet", timeout=5).close()
    except Exception as exc:  # noqa: BLE001
        return "connection disallowed by local policy" in str(exc)
    return False


def spread_over_workers(port: int, admin: AdminClient, user: str, n: int = 8
                        ) -> list[BlockingConnection]:
    """Connect ``user`` until both workers hold some of its connections."""
    conns: list[BlockingConnection] = []
    for _ in range(6):
        conns += [connect(port, user, vhost="fleet") for _ in range(n)]
        workers = {r["worker"] for r in admin.connections(user=user)}
        if workers == {0, 1}:
            return conns
    raise AssertionError(f"the kernel put every connection on worker(s) {workers}")


def test_a_ban_reaches_every_worker_and_proxy_within_a_second_and_outlives_a_restart(
        broker_address) -> None:
    work = Path(tempfile.mkdtemp(prefix="bf", dir="/tmp"))  # short: socket paths
    redis = RedisServer().start()
    procs: list[ProxyProcess] = []
    conns: list[BlockingConnection] = []
    try:
        (work / "policy.json").write_text(json.dumps(POLICY))
        ledger = f'url = "{redis.url}"\ntimeout_ms = 2000\n'
        multi = ProxyProcess(work, broker_address, work / "policy.json", name="multi",
                             ledger=ledger, admin=str(work / "multi.sock"),
                             flags=["--workers", "2"])
        procs.append(multi)
        single = ProxyProcess(work, broker_address, work / "policy.json", name="single",
                              ledger=ledger, admin=str(work / "single.sock"))
        procs.append(single)
        to_multi, to_single = AdminClient(str(work / "multi.sock")), AdminClient(
            str(work / "single.sock"))

        # alice on both workers of one proxy and on the other; bob everywhere too
        conns = spread_over_workers(multi.port, to_multi, "alice")
        conns += [connect(single.port, "alice", vhost="fleet") for _ in range(2)]
        bobs = [connect(multi.port, "bob", vhost="fleet"), connect(single.port, "bob",
                                                                   vhost="fleet")]
        watch = Watch(conns)
        began = time.monotonic()
        answer = to_single.ban("user", "alice", reason="password leaked")
        assert answer["stored"] is True and len(answer["closed"]) == 2
        closed = watch.join()
        assert len(closed) == len(conns)
        latest = max(closed.values()) - began
        assert latest <= WITHIN, f"the last alice connection closed {latest:.3f} s after"
        print(f"\nban through one proxy: {len(conns)} connections over 3 processes closed "
              f"within {latest * 1000:.0f} ms")
        assert refused(multi.port, "alice") and refused(single.port, "alice")
        for bob in bobs:  # nobody else is touched
            bob.create_sender("any").send(Message(body="still here"))
        rows = to_multi.bans()
        assert [(b["kind"], b["value"], b["reason"]) for b in rows] == [
            ("user", "alice", "password leaked")]
        assert wait_for(lambda: multi.metric("amqp_proxy_bans_active", kind="user") == 1)

        # a ban through the workers' parent reaches the other proxy within a second
        v6 = connect(single.port, "bob", vhost="fleet")
        watch = Watch([v6])
        began = time.monotonic()
        to_multi.ban("host", "127.0.0.0/8", seconds=30, reason="cut the tenant off")
        closed = watch.join()
        assert closed and closed[0] - began <= WITHIN, closed
        close_all([v6, *bobs])
        assert refused(single.port, "bob")
        to_single.unban("host", "127.0.0.0/8")
        assert wait_for(lambda: not refused(multi.port, "bob"), timeout=WITHIN + 0.5)

        # the other proxy starts again: alice is refused from its first Open
        single.stop()
        procs.remove(single)
        single = ProxyProcess(work, broker_address, work / "policy.json", name="single",
                              ledger=ledger, admin=str(work / "single.sock"))
        procs.append(single)
        assert refused(single.port, "alice")
        assert [b["value"] for b in AdminClient(str(work / "single.sock")).bans()] == ["alice"]

        # lifted through one, alice is back everywhere within a second
        to_multi.unban("user", "alice")
        assert wait_for(lambda: not refused(single.port, "alice"), timeout=WITHIN + 0.5)
        assert not refused(multi.port, "alice")
    finally:
        close_all(conns)
        for proc in procs:
            proc.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
