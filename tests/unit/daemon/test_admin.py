"""daemon/admin.py: the admin API's handlers on a real daemon (no AMQP listener), over its real
unix socket and its TCP listener: status codes, JSON shapes, validation, the bearer token,
the socket's mode, and the ``admin_action`` record of every change (with peer credentials).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from amqp_policy_proxy.core.events import AdminAction
from amqp_policy_proxy.daemon.admin import SOCKET_MODE, bind_unix_socket
from amqp_policy_proxy.daemon.app import Daemon
from amqp_policy_proxy.daemon.settings import Address, AdminConfig, BindError, DaemonConfig
from amqp_policy_proxy.policy.compile import compile_policy

POLICY = compile_policy([(None, [
    {"hostname": "shop", "groups": {"g": {"users": "*", "remoteHosts": "*"}}},
    {"hostname": "lab", "enforcement": "shadow",
     "groups": {"g": {"users": "*", "remoteHosts": "*"}}},
])])
TOKEN = "s3cret-token"


class Admin:
    """A started daemon with an admin socket (and TCP), and HTTP clients for both."""

    def __init__(self, daemon: Daemon, events: list[Any], sock: str,
                 unix: aiohttp.ClientSession, tcp: aiohttp.ClientSession) -> None:
        self.daemon, self.events, self.sock, self.unix, self.tcp = daemon, events, sock, unix, tcp

    async def call(self, method: str, path: str, *, tcp: bool = False,
                   **kw: Any) -> tuple[int, Any]:
        session = self.tcp if tcp else self.unix
        base = f"http://{self.daemon.admin.tcp_address}" if tcp else "http://admin"
        async with session.request(method, base + path, **kw) as response:
            return response.status, await response.json()

    def actions(self) -> list[AdminAction]:
        return [e for e in self.events if isinstance(e, AdminAction)]


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    (tmp_path / "token").write_text(f"  {TOKEN}\n")
    sock = str(tmp_path / "admin.sock")
    config = DaemonConfig(admin=AdminConfig(socket=sock, address=Address("127.0.0.1", 0),
                                            token_file=str(tmp_path / "token")))
    events: list[Any] = []
    daemon = Daemon(config, policy=POLICY, event_sink=events.append)
    await daemon.start(announce=False)
    unix = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock))
    tcp = aiohttp.ClientSession()
    try:
        yield Admin(daemon, events, sock, unix, tcp)
    finally:
        await unix.close()
        await tcp.close()
        await daemon.shutdown()
    assert not os.path.exists(sock)  # removed at exit


async def test_status_says_what_runs(admin: Admin) -> None:
    status, body = await admin.call("GET", "/v1/status")
    assert status == 200
    assert set(body) == {"version", "pid", "started_at", "uptime_seconds", "draining", "workers",
                         "policy", "listeners", "upstreams", "ledger", "connections",
                         "paused_vhosts", "bans"}
    assert body["bans"] == {"user": 0, "host": 0}
    assert (body["pid"], body["workers"], body["draining"]) == (os.getpid(), 1, False)
    assert body["policy"]["digest"] == POLICY.digest
    assert body["policy"]["vhosts"] == ["lab", "shop"]
    assert body["policy"]["shadow"] == [{"vhost": "lab", "enforcement": "shadow",
                                         "groups": ["g"]}]
    assert body["ledger"]["mode"] == "in-process"
    assert body["connections"] == {"transports": 0, "admitted": 0, "per_vhost": {}}
    assert body["listeners"] == [] and body["paused_vhosts"] == []


async def test_connections_list_and_its_filters(admin: Admin) -> None:
    assert await admin.call("GET", "/v1/connections") == (200, {"connections": []})
    assert await admin.call("GET", "/v1/connections?user=alice&host=::1") == (
        200, {"connections": []})
    status, body = await admin.call("GET", "/v1/connections?colour=red")
    assert status == 400 and body["error"].startswith("unknown filter 'colour'")


@pytest.mark.parametrize(("payload", "message"), [
    ({}, "give exactly one of id, user, vhost, host"),
    ({"reason": "x"}, "give exactly one of id, user, vhost, host"),
    ({"user": "a", "vhost": "b"}, "give exactly one of id, user, vhost, host"),
    ({"name": "a"}, "unknown selector 'name'; give exactly one of id, user, vhost, host"),
    ({"user": 7}, "user must be a string"),
    ({"user": "a", "reason": ""}, "reason must be a non-empty string"),
    ({"user": "a", "reason": "x" * 1025}, "reason is longer than 1024 characters"),
])
async def test_close_refuses_a_bad_selector(admin: Admin, payload: dict, message: str) -> None:
    assert await admin.call("POST", "/v1/connections/close", json=payload) == (
        400, {"error": message})
    assert admin.actions() == []  # nothing was attempted


async def test_close_records_every_attempt_with_the_peer_credentials(admin: Admin) -> None:
    assert await admin.call("POST", "/v1/connections/close",
                            json={"user": "alice", "reason": "bye"}) == (
        200, {"closed": 0, "ids": []})
    status, body = await admin.call("POST", "/v1/connections/close", json={"id": "x-1"})
    assert (status, body) == (404, {"error": "no admitted connection with id 'x-1'"})
    [ok, missing] = admin.actions()
    assert (ok.action, ok.selector, ok.result, ok.count, ok.description) == (
        "connections_close", "user=alice", "ok", 0, "bye")
    assert (ok.uid, ok.pid, ok.peer) == (os.getuid(), os.getpid(), "unix")
    assert (missing.result, missing.description) == ("error", "no admitted connection with id x-1")


async def test_pause_and_resume(admin: Admin) -> None:
    assert await admin.call("POST", "/v1/vhosts/pause", json={"vhost": "shop"}) == (
        200, {"vhost": "shop", "paused": True, "changed": True})
    assert admin.daemon.paused_vhosts == {"shop"}
    assert (await admin.call("GET", "/v1/status"))[1]["paused_vhosts"] == ["shop"]
    assert (await admin.call("POST", "/v1/vhosts/pause", json={"vhost": "shop"}))[1][
        "changed"] is False
    assert await admin.call("POST", "/v1/vhosts/resume", json={"vhost": "shop"}) == (
        200, {"vhost": "shop", "paused": False, "changed": True})
    assert await admin.call("POST", "/v1/vhosts/resume", json={"vhost": "shop"}) == (
        200, {"vhost": "shop", "paused": False, "changed": False})
    assert await admin.call("POST", "/v1/vhosts/pause", json={"vhost": "nope"}) == (
        404, {"error": "no vhost 'nope' in the running policy"})
    assert [(a.action, a.vhost, a.result) for a in admin.actions()] == [
        ("vhost_pause", "shop", "ok"), ("vhost_pause", "shop", "ok"),
        ("vhost_resume", "shop", "ok"), ("vhost_resume", "shop", "ok"),
        ("vhost_pause", "nope", "error")]


@pytest.mark.parametrize(("body", "message"), [
    (b"", "missing field 'vhost'"),
    (b"{}", "missing field 'vhost'"),
    (b'{"vhost": "shop", "x": 1}', "unknown field 'x'; expected only 'vhost'"),
    (b'{"vhost": 5}', "vhost must be a string"),
    (b"[1]", "the body must be a JSON object"),
])
async def test_pause_refuses_a_bad_body(admin: Admin, body: bytes, message: str) -> None:
    assert await admin.call("POST", "/v1/vhosts/pause", data=body) == (400, {"error": message})


async def test_bad_json_unknown_paths_and_methods_answer_json(admin: Admin) -> None:
    status, body = await admin.call("POST", "/v1/vhosts/pause", data=b"{nope")
    assert status == 400 and body["error"].startswith("the body is not JSON")
    assert await admin.call("GET", "/v1/nothing") == (404, {"error": "Not Found"})
    assert await admin.call("DELETE", "/v1/status") == (405, {"error": "Method Not Allowed"})


async def test_tcp_needs_the_bearer_token(admin: Admin) -> None:
    assert (await admin.call("GET", "/v1/status", tcp=True))[0] == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (await admin.call("GET", "/v1/status", tcp=True, headers=wrong))[0] == 401
    basic = {"Authorization": f"Basic {TOKEN}"}
    assert (await admin.call("POST", "/v1/vhosts/pause", tcp=True, headers=basic,
                             json={"vhost": "shop"}))[0] == 401
    assert admin.daemon.paused_vhosts == set()
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert (await admin.call("POST", "/v1/vhosts/pause", tcp=True, headers=right,
                             json={"vhost": "shop"}))[0] == 200
    [action] = admin.actions()
    assert (action.uid, action.pid) == (None, None)
    assert action.peer.startswith("127.0.0.1:")


async def test_the_socket_has_mode_0660(admin: Admin) -> None:
    st = os.stat(admin.sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == SOCKET_MODE == 0o660


def test_a_stale_socket_is_replaced_a_live_one_or_a_file_is_not(tmp_path: Path) -> None:
    path = str(tmp_path / "a.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens
    live = bind_unix_socket(path, None)
    try:
        with pytest.raises(OSError, match="is in use"):
            bind_unix_socket(path, None)
    finally:
        live.close()
    regular = tmp_path / "file"
    regular.write_text("keep me")
    with pytest.raises(OSError, match="exists and is not a socket"):
        bind_unix_socket(str(regular), None)
    assert regular.read_text() == "keep me"


async def test_a_socket_that_cannot_be_made_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "deeper" / "a.sock"
    config = DaemonConfig(admin=AdminConfig(socket=str(path)), source="/etc/x.toml")
    daemon = Daemon(config, policy=POLICY)
    with pytest.raises(BindError) as info:
        await daemon.start(announce=False)
    assert info.value.issues == [
        f"/etc/x.toml: admin.socket: cannot use {path}: "
        f"{path.parent} does not exist (nor its parent)"]


async def test_a_missing_runtime_directory_is_made_as_the_unit_would(tmp_path: Path) -> None:
    # the guide's foreground run as root: no systemd RuntimeDirectory= made it
    path = tmp_path / "run" / "admin.sock"
    daemon = Daemon(DaemonConfig(admin=AdminConfig(socket=str(path))), policy=POLICY)
    await daemon.start(announce=False)
    try:
        assert path.is_socket()
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    finally:
        await daemon.shutdown()


async def test_an_empty_token_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    config = DaemonConfig(admin=AdminConfig(address=Address("127.0.0.1", 0),
                                            token_file=str(tmp_path / "token")))
    with pytest.raises(BindError) as info:
        await Daemon(config, policy=POLICY).start(announce=False)
    assert info.value.issues == [f"admin.token_file: {tmp_path / 'token'} is empty"]
