"""``--workers 2`` as systemd runs it: a private redis-server
(``--ledger auto``), one ``READY=1`` once both workers listen, limits shared by the workers,
their metrics merged on the one ``--metrics`` address, one event-log file per worker, one
``RELOADING=1``/``READY=1`` per SIGHUP, a killed worker started again and its counts freed,
``WATCHDOG=1`` only while every worker pings, and a drain of both on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import ME
from tests.support.fleet import CLI, close_all, connect_many, wait_for
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not RedisServer.available(), reason="redis-server missing")]

POLICY = [["vhost", {
    "hostname": "fleet", "allowUnknownUser": False, "maxConnectionsPerUser": 2,
    "groups": {"all": {"users": "alice, bob", "remoteHosts": "*", "sources": "*",
                       "targets": "*"}}}]]


class Notify:
    """The service manager's end of NOTIFY_SOCKET: a thread reads every datagram as it comes,
    as systemd does (senders never block, so a receiver that falls behind loses messages)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append(dict(line.split("=", 1) for line in data.decode().split("\n")
                                      if "=" in line))

    def read(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()

    def wait_for(self, key: str, value: str = "1", timeout: float = 30.0,
                 after: int = 0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, msg in enumerate(self.messages[after:], after):
                if msg.get(key) == value:
                    return i
            self.read(0.2)
        raise AssertionError(f"no {key}={value}; got {self.messages}")

    def states(self) -> list[str]:
        return [k for m in self.messages for k in ("READY", "RELOADING", "STOPPING")
                if m.get(k) == "1"]


def scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, v = line.rpartition(" ")
            if all(f'{k}="{x}"' in head for k, x in labels.items()):
                total += float(v)
    return total


def test_two_workers_under_a_service_manager(broker_address) -> None:
    work = Path(tempfile.mkdtemp(prefix="wk", dir="/tmp"))  # short: socket paths
    try:
        (work / "policy.json").write_text(json.dumps(POLICY))
        port, metrics = _free(), _free()
        (work / "config.toml").write_text(
            f'[[listener]]\naddress = "127.0.0.1:{port}"\n'
            f'[[upstream]]\naddress = "{broker_address[0]}:{broker_address[1]}"\n'
            f'[policy]\npath = "{work / "policy.json"}"\n'
            f'[metrics]\naddress = "127.0.0.1:{metrics}"\n'
            f'[event_log]\ndirectory = "{work / "events"}"\n'
            f'[daemon]\nruntime_directory = "{work / "run"}"\n'
            '[timeouts]\nshutdown_grace_seconds = 2\n'
            f'[admin]\nsocket = "{work / "admin.sock"}"\n'
            # ledger = "auto" with a generous timeout: on a loaded CI machine a worker's first
            # admissions may wait longer than 20 ms for its loop, which is the failure mode's
            # business (tested in test_fleet_e2e), not this test's
            '[ledger]\nurl = "auto"\ntimeout_ms = 2000\n')
        notify = Notify(str(work / "notify.sock"))
        env = dict(os.environ, NOTIFY_SOCKET=str(work / "notify.sock"), WATCHDOG_USEC="400000")
        env.pop("WATCHDOG_PID", None)
        proc = subprocess.Popen([str(CLI), "run", "--config", str(work / "config.toml"),
                                 "--workers", "2"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            notify.wait_for("READY")
            assert notify.states() == ["READY"]  # once, for both workers
            assert os.path.exists(work / "run" / "ledger-redis.sock")
            notify.wait_for("WATCHDOG", after=len(notify.messages))
            # limits are shared: 2 per user over both workers (the kernel spreads the 12)
            admitted, denied = connect_many([(port, "alice", "fleet")] * 12)
            try:
                assert len(admitted) == 2 and len(denied) == 10
                # (each worker publishes its gauges once a second)
                assert wait_for(lambda: value(scrape(metrics), "amqp_proxy_connections_active",
                                              vhost="fleet") == 2)
                text = scrape(metrics)
                assert value(text, "amqp_proxy_connections_denied_total",
                             reason="user_limit") == 10
                assert value(text, "amqp_proxy_ledger_mode", mode="redis") == 2  # per worker
                assert re.search(r'process_open_fds\{worker="1"\}', text)
                assert value(text, "amqp_proxy_limit", group="",
                             limit="maxConnectionsPerUser") == 2  # max, not the sum
                _admin_answers_for_both_workers(work / "admin.sock", port, admitted)
                # one RELOADING=1 / READY=1 for the reload of both
                mark = len(notify.messages)
                proc.send_signal(signal.SIGHUP)
                notify.wait_for("READY", after=notify.wait_for("RELOADING", after=mark))
                notify.read(0.5)
                assert [k for m in notify.messages[mark:] for k in ("READY", "RELOADING")
                        if m.get(k) == "1"] == ["RELOADING", "READY"]
            finally:
                close_all(admitted)
            # one event-log file per worker, in the same hour partition
            files = sorted((work / "events").rglob("events-*.jsonl"))
            assert wait_for(lambda: len({f.name for f in (work / "events").rglob(
                "events-*.jsonl")}) == 2, timeout=5), files
            # a killed worker is started again; the watchdog pauses meanwhile
            pids = _children(proc.pid)
            os.kill(pids[0], signal.SIGKILL)
            assert wait_for(lambda: len(_children(proc.pid)) == 2
                            and pids[0] not in _children(proc.pid), timeout=15)
            assert wait_for(lambda: value(scrape(metrics), "amqp_proxy_ledger_mode",
                                          mode="redis") == 2, timeout=15)
            # SIGTERM: both drain, the private redis-server goes, exit 0
            mark = len(notify.messages)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
            notify.read(0.2)
            assert "STOPPING" in [k for m in notify.messages[mark:] for k in ("STOPPING",)
                                  if m.get(k) == "1"]
            assert not os.path.exists(work / "run" / "ledger-redis.sock")
        finally:
            if proc.poll() is None:
                proc.kill()  # its workers get SIGTERM (PR_SET_PDEATHSIG) and drain
                proc.wait()
            err = proc.stderr.read() if proc.stderr else ""
            notify.close()
        assert "worker 0" in err and "exited with signal SIGKILL" in err, err
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _admin(socket: Path, *args: str) -> Any:
    """One admin command against the parent's socket, its JSON answer."""
    done = subprocess.run([str(CLI), *args, "--admin-socket", str(socket), "--json"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _admin_answers_for_both_workers(socket: Path, port: int, admitted: list[Any]) -> None:
    """The parent's admin socket answers for every worker: one status with the counts
    summed, every worker's connections, a pause that holds in both, a close by id that
    reaches the worker holding the connection."""
    status = _admin(socket, "status")
    assert status["workers"] == 2 and len(status["per_worker"]) == 2
    assert status["connections"]["admitted"] == 2
    assert status["ledger"]["mode"] == "redis"
    rows = _admin(socket, "connections", "list")
    assert sorted(r["user"] for r in rows) == ["alice", "alice"]
    _admin(socket, "vhost", "pause", "fleet")
    assert _admin(socket, "status")["paused_vhosts"] == ["fleet"]
    more, denied = connect_many([(port, "bob", "fleet")] * 4)  # both workers see the pause
    close_all(more)
    assert not more and len(denied) == 4
    _admin(socket, "vhost", "resume", "fleet")
    closed = _admin(socket, "connections", "close", "--id", rows[0]["id"])
    assert closed["ids"] == [rows[0]["id"]]
    assert wait_for(lambda: len(_admin(socket, "connections", "list")) == 1)


def test_check_refuses_workers_without_a_ledger(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text(json.dumps(POLICY))
    (tmp_path / "c.toml").write_text(
        '[[listener]]\naddress = "127.0.0.1:0"\n[[upstream]]\naddress = "127.0.0.1:1"\n'
        f'[policy]\npath = "{tmp_path / "policy.json"}"\n[daemon]\nworkers = 2\n')
    out = subprocess.run([str(CLI), "check", "--as-user", ME, "--config", str(tmp_path / "c.toml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "daemon.workers = 2 needs a [ledger]" in out.stdout


def _free() -> int:
    from tests.support.ports import free_port

    return free_port()


def _live_processes() -> list[tuple[int, int, bytes]]:
    """``(pid, parent pid, command line)`` of every live (not zombie) process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] != "Z":
            out.append((int(entry.name), int(fields[1]), cmd))
    return out


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` running the proxy (the workers)."""
    return sorted(p for p, parent, cmd in _live_processes()
                  if parent == pid and b"amqp_policy_proxy" in cmd)


def test_workers_that_refuse_the_policy_stop_the_parent_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text('[["vhost", {"hostname": "x", "maxConections": 1}]]')
    out = subprocess.run(
        [str(CLI), "run", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
         "--policy", str(tmp_path / "policy.json"), "--workers", "2", "--ledger", "auto"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
    assert out.returncode == 2, out.stderr
    assert "refused the configuration" in out.stderr


def _processes_running(needle: bytes) -> list[int]:
    """Live processes whose command line contains ``needle``."""
    return [p for p, _parent, cmd in _live_processes() if needle in cmd]


def test_nothing_outlives_a_parent_killed_with_sigkill(tmp_path: Path) -> None:
    """``kill -9`` of the workers' parent (no drain, no cleanup): its workers and the private
    redis-server of ``ledger = "auto"`` end with it (PR_SET_PDEATHSIG), nothing is left."""
    run = Path(tempfile.mkdtemp(prefix="wk", dir="/tmp"))  # short: the socket path
    try:
        (tmp_path / "policy.json").write_text(json.dumps(POLICY))
        proc = subprocess.Popen(
            [str(CLI), "run", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
             "--policy", str(tmp_path / "policy.json"), "--workers", "2", "--ledger", "auto"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
                 "RUNTIME_DIRECTORY": str(run)})
        try:
            assert wait_for(lambda: len(_children(proc.pid)) == 2, timeout=20)
            redis = _processes_running(str(run).encode())
            assert redis, "no private redis-server"
            workers = _children(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        assert wait_for(lambda: not _processes_running(str(run).encode()), timeout=10)
        assert wait_for(lambda: not {p for p, _, _ in _live_processes()} & set(workers),
                        timeout=15)
        # the workers' sockets were under the runtime directory, which the service manager
        # removes: nothing of the killed supervisor is left in the temporary directory
        assert [p.name for p in run.iterdir() if p.name.startswith("amqp-policy-proxy-")]
    finally:
        shutil.rmtree(run, ignore_errors=True)
