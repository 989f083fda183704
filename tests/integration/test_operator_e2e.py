"""Operator control end to end: real proton clients through a real proxy to the in-tree broker,
driven through the admin socket by the real CLI.

Listing shows exactly the live connections with the right fields; closing by id, user, vhost
and host closes exactly those (the others keep delivering) and releases their counts (scraped
over HTTP); a vhost pause denies new connections and survives a reload; shadow mode admits
what enforce mode denies and counts it with the same reason; admin actions and Open decisions
land in the event log; the socket refuses a user without permission.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
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

POLICY = str(Path(__file__).parent / "policies" / "operator.json")
CLI = Path(sys.executable).with_name("amqp-policy-proxy")
FORCED = "amqp:connection:forced"
DISALLOWED = ("amqp:resource-limit-exceeded", "connection disallowed by local policy")


@pytest.fixture
def admin_dir() -> Iterator[Path]:
    """A directory others may traverse (pytest's tmp_path is private to root), so that only
    the socket's own mode and group decide who may connect."""
    path = Path(tempfile.mkdtemp(prefix="admin-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ops(broker_address, admin_dir, tmp_path) -> Iterator[ProxyThread]:
    """A proxy with the admin socket, metrics and the event log, on 127.0.0.1 and ::1."""
    config = DaemonConfig(admin=AdminConfig(socket=str(admin_dir / "admin.sock"),
                                            group="nogroup"))
    proxy = ProxyThread([broker_address], policy_path=POLICY, metrics=True,
                        event_log_dir=str(tmp_path / "events"), config=config,
                        listen=[("127.0.0.1", 0), ("::1", 0)])
    proxy.start()
    proxy.socket = str(admin_dir / "admin.sock")
    proxy.v6_port = proxy.daemon.listen_addresses[-1][1]
    proxy.events_dir = tmp_path / "events"
    yield proxy
    proxy.stop()


def connect(port: int, user: str, vhost: str = "ops", host: str = "127.0.0.1",
            ) -> BlockingConnection:
    url = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BlockingConnection(url, timeout=10, user=user, password="secret",
                              allowed_mechs="PLAIN", allow_insecure_mechs=True,
                              virtual_host=vhost)


def cli(proxy: ProxyThread, *args: str) -> tuple[int, str, str]:
    """Run ``amqp-policy-proxy ARGS --admin-socket S`` in this process: (code, out, err)."""
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


def round_trip(conn: BlockingConnection, address: str, body: str) -> None:
    """The client still delivers: send one message and receive it back."""
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


def conn_id_of(proxy: ProxyThread, user: str) -> set[str]:
    return {cid for cid, p in list(proxy.daemon.connections.items())
            if p.conn is not None and p.conn.view.user == user and p.conn.view.admitted
            and not p.conn.view.finished}


def test_list_shows_exactly_the_live_connections_with_their_fields(ops, broker_address):
    alice = connect(ops.port, "alice")
    sender = alice.create_sender("orders.list")
    for i in range(3):
        sender.send(Message(body=f"m{i}"))
    bob = connect(ops.port, "bob")
    receiver = bob.create_receiver("orders.list")
    for _ in range(3):
        receiver.receive(timeout=5)
        receiver.accept()
    carol = connect(ops.v6_port, "carol", host="::1")
    dave = connect(ops.port, "dave", vhost="other")
    try:
        rows = cli_json(ops, "connections", "list")
        admitted = set().union(*(conn_id_of(ops, u) for u in ("alice", "bob", "carol", "dave")))
        assert {r["id"] for r in rows} == admitted and len(rows) == 4
        by_user = {r["user"]: r for r in rows}
        upstream = f"{broker_address[0]}:{broker_address[1]}"
        for user, vhost, group, host in (
                ("alice", "ops", "traders", "127.0.0.1"),
                ("bob", "ops", "traders", "127.0.0.1"),
                ("carol", "ops", "readers", "::1"),
                ("dave", "other", "$default", "127.0.0.1")):
            row = by_user[user]
            assert (row["vhost"], row["group"], row["remote_host"]) == (vhost, group, host)
            # the listener as configured (as in the event log): port 0 here
            listener = "[::1]:0" if host == "::1" else "127.0.0.1:0"
            assert (row["listener"], row["upstream"]) == (listener, upstream)
            assert row["balancer"] is None and row["tls_subject"] is None
            assert row["enforcement"] == "enforce" and row["state"] == "opened"
            assert row["age_seconds"] >= 0 and row["idle_seconds"] >= 0
            assert row["bytes_in"] > 0 and row["bytes_out"] > 0
            assert row["opened_at"].endswith("Z") and row["last_activity"].endswith("Z")
        a, b = by_user["alice"], by_user["bob"]
        assert (a["sessions"], a["senders"], a["receivers"]) == (1, 1, 0)
        assert (b["sessions"], b["senders"], b["receivers"]) == (1, 0, 1)
        assert a["transfers_in"] == 3 and b["transfers_out"] == 3
        assert (by_user["carol"]["sessions"], by_user["dave"]["sessions"]) == (0, 0)
        # filters, alone and together
        assert [r["user"] for r in cli_json(ops, "connections", "list", "--user", "alice")
                ] == ["alice"]
        assert [r["user"] for r in cli_json(ops, "connections", "list", "--vhost", "other")
                ] == ["dave"]
        assert [r["user"] for r in cli_json(ops, "connections", "list", "--group", "readers")
                ] == ["carol"]
        assert [r["user"] for r in cli_json(ops, "connections", "list", "--host",
                                            "0:0:0:0:0:0:0:1")] == ["carol"]
        assert cli_json(ops, "connections", "list", "--vhost", "ops", "--user", "dave") == []
        # the table for people
        code, out, _ = cli(ops, "connections", "list")
        lines = out.splitlines()
        assert code == 0 and lines[0].split()[:5] == ["ID", "VHOST", "GROUP", "USER",
                                                     "REMOTE_HOST"]
        assert lines[-1] == "4 connections" and len(lines) == 6
        # a client that leaves is gone from the list
        dave.close()
        assert wait_for(lambda: len(cli_json(ops, "connections", "list")) == 3)
    finally:
        for c in (alice, bob, carol):
            c.close()


def test_close_by_id_user_vhost_and_host_closes_exactly_those(ops):
    a1, a2 = connect(ops.port, "alice"), connect(ops.port, "alice")
    bob = connect(ops.port, "bob")
    carol = connect(ops.v6_port, "carol", host="::1")
    dave = connect(ops.port, "dave", vhost="other")
    try:
        assert wait_for(lambda: ops.daemon.ledger.active() == 5)
        before = scrape(ops)
        assert metric(before, "amqp_proxy_connections_active", vhost="ops", group="traders") == 3
        first = sorted(conn_id_of(ops, "alice"))[0]

        code, out, _ = cli(ops, "connections", "close", "--id", first, "--reason", "rotate keys")
        assert (code, out.strip()) == (0, f"closed 1 connection: {first}")
        closed_first = a1 if conn_id_of(ops, "alice") != {first} else a2
        survivor = a2 if closed_first is a1 else a1
        assert close_condition(closed_first) == (FORCED, "rotate keys")
        round_trip(bob, "orders.after-id", "still here")
        round_trip(survivor, "orders.alice", "me too")

        result = cli_json(ops, "connections", "close", "--user", "alice")
        assert result["closed"] == 1 and result["ids"] != [first]
        assert close_condition(survivor) == (FORCED, "closed by an operator")
        result = cli_json(ops, "connections", "close", "--host", "::1", "--reason", "v6 off")
        assert result["closed"] == 1
        assert close_condition(carol) == (FORCED, "v6 off")
        result = cli_json(ops, "connections", "close", "--vhost", "other")
        assert result["closed"] == 1
        assert close_condition(dave)[0] == FORCED
        round_trip(bob, "orders.after-all", "last one standing")

        # counts released: only bob is left, in the ledger and in the scraped gauge
        assert wait_for(lambda: ops.daemon.ledger.active() == 1)
        after = scrape(ops)
        assert metric(after, "amqp_proxy_connections_active", vhost="ops", group="traders") == 1
        assert metric(after, "amqp_proxy_connections_active", vhost="other",
                      group="$default") == 0
        assert [r["user"] for r in cli_json(ops, "connections", "list")] == ["bob"]

        # nothing matches: 0 closed (a user), or exit 1 (an id)
        assert cli_json(ops, "connections", "close", "--user", "nobody")["closed"] == 0
        code, _, err = cli(ops, "connections", "close", "--id", "no-such-id")
        assert code == 1 and "no admitted connection with id 'no-such-id'" in err
        # a new connection of a closed user is admitted again
        connect(ops.port, "alice").close()
    finally:
        for c in (a1, a2, bob, carol, dave):
            with contextlib.suppress(Exception):
                c.close()
    ops.stop()
    closes = [r for r in records(ops, "connection_closed") if r["close_reason"] == "admin_close"]
    assert len(closes) == 4
    actions = records(ops, "admin_action")
    assert [(r["action"], r["selector"], r["count"], r["result"]) for r in actions] == [
        ("connections_close", f"id={first}", 1, "ok"),
        ("connections_close", "user=alice", 1, "ok"),
        ("connections_close", "host=::1", 1, "ok"),
        ("connections_close", "vhost=other", 1, "ok"),
        ("connections_close", "user=nobody", 0, "ok"),
        ("connections_close", "id=no-such-id", 0, "error"),
    ]
    assert {(r["uid"], r["pid"], r["peer"]) for r in actions} == {(os.getuid(), os.getpid(),
                                                                    "unix")}
    assert actions[0]["targets"] == [first] and actions[0]["description"] == "rotate keys"
    assert actions[3]["vhost"] == "other"


def test_pause_denies_new_connections_keeps_existing_and_survives_reload(ops):
    bob = connect(ops.port, "bob")
    try:
        code, out, _ = cli(ops, "vhost", "pause", "ops")
        assert code == 0 and out.startswith("vhost 'ops' paused: new connections are denied")
        with pytest.raises(ConnectionException) as info:
            connect(ops.port, "alice")
        assert DISALLOWED[1] in str(info.value) and DISALLOWED[0] in str(info.value)
        connect(ops.port, "dave", vhost="other").close()  # other vhosts are not paused
        round_trip(bob, "orders.paused", "existing connections stay")
        status = cli_json(ops, "status")
        assert status["paused_vhosts"] == ["ops"]
        assert ops.reload()  # a reload swaps the policy, not the pause
        with pytest.raises(ConnectionException):
            connect(ops.port, "alice")
        assert cli_json(ops, "vhost", "pause", "ops")["changed"] is False
        code, out, _ = cli(ops, "vhost", "resume", "ops")
        assert (code, out.strip()) == (0, "vhost 'ops' resumed")
        connect(ops.port, "alice").close()
        code, _, err = cli(ops, "vhost", "pause", "nope")
        assert code == 1 and "no vhost 'nope' in the running policy" in err
        samples = scrape(ops)
        assert metric(samples, "amqp_proxy_connections_denied_total", vhost="ops",
                      reason="vhost_paused") == 2
    finally:
        bob.close()
    ops.stop()
    assert [(r["action"], r["vhost"], r["result"]) for r in records(ops, "admin_action")] == [
        ("vhost_pause", "ops", "ok"), ("vhost_pause", "ops", "ok"),
        ("vhost_resume", "ops", "ok"), ("vhost_pause", "nope", "error")]
    paused = [r for r in records(ops, "auth_decision") if r["reason"] == "vhost_paused"]
    assert [(r["decision"], r["rule"]) for r in paused] == [
        ("deny", "vhost 'ops' paused by an operator")] * 2


def test_shadow_admits_what_enforce_denies_and_counts_it_with_the_same_reason(ops, caplog):
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy")
    held = {}
    for vhost in ("strict", "trial"):
        held[vhost] = connect(ops.port, "mallory", vhost=vhost)
    try:
        # connection: maxConnectionsPerUser 1
        with pytest.raises(ConnectionException):
            connect(ops.port, "mallory", vhost="strict")
        second = connect(ops.port, "mallory", vhost="trial")
        second.close()
        # link: target not in allowed.*
        with pytest.raises(LinkDetached):
            held["strict"].create_sender("forbidden.x")
        round_trip(held["trial"], "forbidden.x", "shadow lets it through")  # source + target
        # message: maxMessageSize 500, delivered in shadow, connection closed under enforce
        big = "x" * 2000
        round_trip(held["trial"], "allowed.big", big)
        with pytest.raises(LinkDetached):  # QDR's answer: reject, detach, Close forced
            held["strict"].create_sender("allowed.big").send(Message(body=big))
        assert close_condition(held["strict"]) == (FORCED, "Message size exceeded")
        samples = scrape(ops)
        for kind, reason, denied in (
                ("connection", "user_limit", ("amqp_proxy_connections_denied_total",
                                              {"reason": "user_limit"})),
                ("link", "target", ("amqp_proxy_links_denied_total",
                                    {"reason": "target", "role": "sender"})),
                ("message", "message_size", ("amqp_proxy_messages_denied_total",
                                             {"reason": "message_size"}))):
            assert metric(samples, denied[0], vhost="strict", **denied[1]) == 1, kind
            assert metric(samples, denied[0], vhost="trial", **denied[1]) == 0, kind
            assert metric(samples, "amqp_proxy_shadow_denials_total", vhost="trial",
                          kind=kind, reason=reason) == 1, kind
        assert metric(samples, "amqp_proxy_shadow_denials_total", vhost="trial", kind="link",
                      reason="source") == 1
        lines = [r.getMessage() for r in caplog.records if "SHADOW DENY" in r.getMessage()]
        assert any("SHADOW DENY AMQP Open for user 'mallory'" in x and "vhost 'trial'" in x
                   and x.endswith(": user_limit") for x in lines), lines
        assert any("SHADOW DENY AMQP Attach sender 'forbidden.x'" in x for x in lines), lines
        assert any("SHADOW DENY AMQP Transfer for user 'mallory'" in x
                   and "maxMessageSize 500 exceeded" in x for x in lines), lines
        rows = {r["vhost"]: r for r in cli_json(ops, "connections", "list", "--user",
                                                "mallory")}
        assert rows["trial"]["enforcement"] == "shadow"
        status = cli_json(ops, "status")
        assert status["policy"]["shadow"] == [{"vhost": "trial", "enforcement": "shadow",
                                               "groups": ["probation"]}]
    finally:
        for c in held.values():
            with contextlib.suppress(Exception):
                c.close()
    ops.stop()
    decisions = [(r["vhost"], r["decision"], r["reason"], r["enforcement"])
                 for r in records(ops, "auth_decision") if r["user"] == "mallory"]
    assert decisions == [
        ("strict", "allow", None, "enforce"), ("trial", "allow", None, "shadow"),
        ("strict", "deny", "user_limit", "enforce"), ("trial", "allow", "user_limit", "shadow")]
    shadowed = {(r["kind"], r["reason"]) for r in records(ops, "shadow_denied")}
    assert shadowed == {("connection", "user_limit"), ("link", "target"), ("link", "source"),
                        ("message", "message_size")}


PROBE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused"); sys.exit(0)
body = b'{"vhost": "ops"}'
s.sendall(b"POST /v1/vhosts/resume HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
          b"Content-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(body) + body)
print(s.makefile("rb").readline().decode().strip())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another user")
def test_the_socket_refuses_a_user_without_permission(ops):
    socket_file = Path(ops.socket)
    st = socket_file.stat()
    assert oct(st.st_mode & 0o777) == oct(0o660)
    assert st.st_gid == 65534  # [admin] group = "nogroup"

    def probe(group: str) -> str:
        result = subprocess.run(["/usr/bin/python3", "-c", PROBE, ops.socket],
                                user="nobody", group=group, extra_groups=[],
                                capture_output=True, text=True, timeout=20)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert probe("daemon") == "refused"  # neither the owner nor in the socket's group
    assert probe("nogroup") == "HTTP/1.1 200 OK"  # the socket's group may
    ops.stop()
    [action] = records(ops, "admin_action")
    assert (action["action"], action["uid"], action["peer"]) == ("vhost_resume", 65534, "unix")
    assert action["pid"] > 0 and action["pid"] != os.getpid()
    assert not socket_file.exists()  # removed at exit


def test_the_installed_command_talks_to_the_socket(ops):
    alice = connect(ops.port, "alice")
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        listed = subprocess.run([str(CLI), "connections", "list", "--json", "--admin-socket",
                                 ops.socket], capture_output=True, text=True, timeout=60,
                                env=env)
        assert listed.returncode == 0, listed.stderr
        assert [r["user"] for r in json.loads(listed.stdout)] == ["alice"]
        status = subprocess.run([str(CLI), "status", "--admin-socket", ops.socket],
                                capture_output=True, text=True, timeout=60, env=env)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("amqp-policy-proxy ")
        assert "connections per vhost: ops 1" in status.stdout
        missing = subprocess.run([str(CLI), "status", "--admin-socket",
                                  ops.socket + ".nope"], capture_output=True, text=True,
                                 timeout=60, env=env)
        assert missing.returncode == 1
        assert "no daemon answers here" in missing.stderr
    finally:
        alice.close()
