"""admin_client.py and the CLI's admin commands: where the socket is looked for, what an
operator is told when it cannot be reached, and the tables the commands print."""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path

import pytest

from amqp_policy_proxy import admin_client
from amqp_policy_proxy.admin_client import AdminClient, AdminClientError, socket_path
from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_FAILURE, main, render_connections, render_status
from amqp_policy_proxy.daemon.settings import DEFAULT_ADMIN_SOCKET

ROW = {
    "id": "1f-12", "vhost": "shop", "group": "buyers", "user": "alice",
    "remote_host": "10.0.0.7", "balancer": None, "listener": "0.0.0.0:5672",
    "upstream": "127.0.0.1:25672", "tls_subject": "CN=alice", "enforcement": "enforce",
    "state": "opened", "opened_at": "2026-11-21T11:42:00.123Z", "age_seconds": 3723.5,
    "bytes_in": 2048, "bytes_out": 4096, "transfers_in": 3, "transfers_out": 4, "sessions": 1,
    "senders": 1, "receivers": 0, "last_activity": "2026-11-21T12:44:00.000Z",
    "idle_seconds": 4.25,
}  # fmt: skip


def test_the_socket_comes_from_the_flag_then_the_config_then_the_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[admin]\nsocket = "run/admin.sock"\n')
    assert socket_path("/x.sock", str(config)) == "/x.sock"
    assert socket_path(None, str(config)) == str(tmp_path / "run" / "admin.sock")
    config.write_text("[logging]\nlevel = 'info'\n")
    assert socket_path(None, str(config)) == DEFAULT_ADMIN_SOCKET
    monkeypatch.setattr(admin_client, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))
    assert socket_path(None, None) == DEFAULT_ADMIN_SOCKET
    # the default file is read when it is there, and skipped when it does not parse
    default = tmp_path / "default.toml"
    monkeypatch.setattr(admin_client, "DEFAULT_CONFIG", str(default))
    default.write_text('[admin]\nsocket = "/srv/a.sock"\n')
    assert socket_path(None, None) == "/srv/a.sock"
    default.write_text("[admin\n")
    assert socket_path(None, None) == DEFAULT_ADMIN_SOCKET


def test_an_unreachable_socket_is_explained(tmp_path: Path) -> None:
    client = AdminClient(str(tmp_path / "none.sock"))
    with pytest.raises(AdminClientError) as info:
        client.status()
    assert info.value.status is None
    assert "no daemon answers here" in str(info.value)
    assert "--admin-socket PATH" in str(info.value)
    denied = client._explain(PermissionError(errno.EACCES, "Permission denied"))
    assert "permission denied: run as root or as a member of the socket's group" in denied


def test_a_daemon_error_is_shown_with_its_text_and_status(tmp_path: Path) -> None:
    # a one-shot HTTP server on a unix socket answering like the daemon refuses a request
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        # read the whole request (headers and body may come in two writes): answering
        # before the body is in would make the client's second write fail with EPIPE
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            rest += conn.recv(65536)
        body = b'{"error": "no vhost \'x\' in the running policy"}'
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        conn.close()

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        with pytest.raises(AdminClientError) as info:
            AdminClient(path).pause("x")
    finally:
        thread.join(5)
        server.close()
    assert (str(info.value), info.value.status) == ("no vhost 'x' in the running policy", 404)


def test_cli_exit_codes_without_a_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         ) -> None:
    sock = str(tmp_path / "none.sock")
    assert main(["status", "--admin-socket", sock]) == EXIT_FAILURE
    assert "no daemon answers here" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[admin]\nsocket = 1\n")
    assert main(["connections", "list", "--config", str(bad)]) == EXIT_CONFIG
    assert "admin.socket: expected a string" in capsys.readouterr().err
    # exactly one selector: argparse refuses the rest before anything is sent
    assert main(["connections", "close", "--admin-socket", sock]) == EXIT_CONFIG
    assert main(["connections", "close", "--user", "a", "--vhost", "b",
                 "--admin-socket", sock]) == EXIT_CONFIG


def test_the_connections_table() -> None:
    other = {**ROW, "id": "1f-3", "user": "bob", "tls_subject": None, "age_seconds": 5.0,
             "idle_seconds": 90061.0}
    lines = render_connections([ROW, other]).splitlines()
    assert lines[0].split() == [
        "ID", "VHOST", "GROUP", "USER", "REMOTE_HOST", "BALANCER", "LISTENER", "UPSTREAM",
        "AGE", "BYTES_IN", "BYTES_OUT", "XFERS_IN", "XFERS_OUT", "SESS", "SND", "RCV", "IDLE",
        "TLS_SUBJECT"]
    assert lines[1].split() == [
        "1f-12", "shop", "buyers", "alice", "10.0.0.7", "-", "0.0.0.0:5672", "127.0.0.1:25672",
        "1h02m", "2048", "4096", "3", "4", "1", "1", "0", "4.2s", "CN=alice"]
    assert lines[2].split()[8] == "5.0s" and lines[2].split()[-2:] == ["1d01h", "-"]
    assert lines[-1] == "2 connections"
    assert render_connections([]).splitlines()[-1] == "0 connections"


def test_the_status_summary() -> None:
    status = {
        "version": "0.1.0", "pid": 42, "started_at": "2026-11-21T11:00:00.000Z",
        "uptime_seconds": 7300.0, "draining": False, "workers": 1,
        "policy": {"digest": "abc123", "loaded_at": "2026-11-21T12:00:00.000Z",
                   "files": [], "vhosts": ["lab", "shop"],
                   "shadow": [{"vhost": "lab", "enforcement": "shadow", "groups": ["g"]}],
                   "last_reload": {"at": "2026-11-21T12:30:00.000Z", "result": "error",
                                   "digest": "abc123",
                                   "issues": ["/etc/p/a.json: vhosts[0].groups: bad"]}},
        "listeners": [{"address": "0.0.0.0:5672", "configured": "0.0.0.0:5672", "tls": False},
                      {"address": "[::]:5671", "configured": "[::]:5671", "tls": True}],
        "upstreams": [{"address": "10.0.0.1:5672", "tls": False, "healthy": True,
                       "consecutive_failures": 0},
                      {"address": "10.0.0.2:5672", "tls": True, "healthy": False,
                       "consecutive_failures": 3}],
        "ledger": {"mode": "in-process", "max_connections": 65535, "transports": 5},
        "connections": {"transports": 5, "admitted": 4, "per_vhost": {"shop": 3, "lab": 1}},
        "paused_vhosts": ["lab"],
    }  # fmt: skip
    assert render_status(status).splitlines() == [
        "amqp-policy-proxy 0.1.0 (pid 42), up 2h01m since 2026-11-21T11:00:00.000Z; workers 1",
        "policy abc123: 2 vhost(s), loaded 2026-11-21T12:00:00.000Z",
        "last reload: FAILED at 2026-11-21T12:30:00.000Z, the policy above still runs: "
        "/etc/p/a.json: vhosts[0].groups: bad",
        "shadow mode: vhost 'lab' (shadow), groups in shadow: g",
        "listeners: 0.0.0.0:5672, [::]:5671 (amqps)",
        "upstreams: 10.0.0.1:5672 up; 10.0.0.2:5672 (tls) DOWN (3 failed probes or connects)",
        "ledger: in-process; 4 admitted, 5 transports of max 65535",
        "connections per vhost: lab 1, shop 3",
        "paused vhosts: lab",
    ]
    status["policy"]["last_reload"] = None
    assert "last reload: none since the start" in render_status(status)
