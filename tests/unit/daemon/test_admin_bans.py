"""daemon/admin.py and daemon/bans.py on a real daemon (no AMQP listener), over its real unix
socket: ban, unban and list, their validation and audit records, expiry on its own, the
quarantine of a vhost from the denials the daemon fans out, and a paced close's job."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from amqp_policy_proxy.core.events import AdminAction, ConnectionDenied, LinkDenied
from amqp_policy_proxy.daemon.app import Daemon
from amqp_policy_proxy.daemon.bans import BanError, parse_duration
from amqp_policy_proxy.daemon.config import (
    Address,
    AdminConfig,
    DaemonConfig,
    UpstreamConfig,
)
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.reasons import ConnectionDenyReason, LinkDenyReason

GROUPS = {"g": {"users": "*", "remoteHosts": "*"}}
POLICY = compile_policy([(None, [
    {"hostname": "shop", "groups": GROUPS,
     "quarantine": {"denials": 3, "withinSeconds": 10, "banSeconds": 0.3}},
    {"hostname": "lab", "groups": GROUPS},
])])


class Admin:
    def __init__(self, daemon: Daemon, events: list[Any], unix: aiohttp.ClientSession) -> None:
        self.daemon, self.events, self.unix = daemon, events, unix

    async def call(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        async with self.unix.request(method, "http://admin" + path, **kw) as response:
            return response.status, await response.json()

    def actions(self) -> list[AdminAction]:
        return [e for e in self.events if isinstance(e, AdminAction)]


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[Admin]:
    sock = str(tmp_path / "admin.sock")
    config = DaemonConfig(admin=AdminConfig(socket=sock),
                          upstreams=(UpstreamConfig(Address("127.0.0.1", 1)),))
    events: list[Any] = []
    daemon = Daemon(config, policy=POLICY, event_sink=events.append)
    await daemon.start(announce=False)
    unix = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock))
    try:
        yield Admin(daemon, events, unix)
    finally:
        await unix.close()
        await daemon.shutdown()


async def test_ban_list_unban_with_canonical_names_and_audit(admin: Admin) -> None:
    status, body = await admin.call("POST", "/v1/bans/add", json={
        "user": "  alice\t", "seconds": 3600, "reason": "leaked password"})
    assert status == 200, body
    assert (body["kind"], body["value"], body["reason"], body["source"], body["closed"],
            body["replaced"], body["stored"]) == (
        "user", "alice", "leaked password", "operator", [], False, None)
    assert 3599 < body["expires_in_seconds"] <= 3600 and body["expires_at"].endswith("Z")
    assert admin.daemon.bans.table.banned("alice", "10.0.0.1", admin.daemon.loop.time())
    status, body = await admin.call("POST", "/v1/bans/add", json={"host": "10.1.2.0/24"})
    assert status == 200 and body["value"] == "10.1.2.0/24" and body["expires_at"] is None
    assert body["reason"] == "no reason given"
    status, body = await admin.call("GET", "/v1/bans")
    assert [(b["kind"], b["value"]) for b in body["bans"]] == [
        ("user", "alice"), ("host", "10.1.2.0/24")]
    assert (await admin.call("GET", "/v1/status"))[1]["bans"] == {"user": 1, "host": 1}
    assert await admin.call("POST", "/v1/bans/remove", json={"user": "alice "}) == (
        200, {"kind": "user", "value": "alice", "lifted": True, "stored": None})
    assert (await admin.call("POST", "/v1/bans/remove", json={"user": "alice"}))[1][
        "lifted"] is False
    acts = [(a.action, a.selector, a.result, a.uid) for a in admin.actions()]
    assert acts == [("ban", "user=alice", "ok", os.getuid()),
                    ("ban", "host=10.1.2.0/24", "ok", os.getuid()),
                    ("unban", "user=alice", "ok", os.getuid()),
                    ("unban", "user=alice", "ok", os.getuid())]
    assert admin.actions()[0].description.startswith("leaked password (until 20")


@pytest.mark.parametrize(("payload", "words"), [
    ({}, "give exactly one of user, host"),
    ({"user": "a", "host": "10.0.0.1"}, "give exactly one of user, host"),
    ({"user": "a", "colour": 1}, "unknown field 'colour'"),
    ({"user": "   "}, "not a user name the upstream would accept"),
    ({"user": "a\x01b"}, "not a user name the upstream would accept"),
    ({"host": "example.com"}, "host names are not accepted"),
    ({"host": "10.1.2.3/8"}, "host bits set"),
    ({"user": "a", "seconds": 0}, "more than 0 s"),
    ({"user": "a", "seconds": "soon"}, "is not a duration"),
    ({"user": "a", "reason": ""}, "reason must be a non-empty string"),
])
async def test_a_bad_ban_is_refused_and_says_why(admin: Admin, payload: dict,
                                                 words: str) -> None:
    status, body = await admin.call("POST", "/v1/bans/add", json=payload)
    assert status == 400 and words in body["error"], body
    assert admin.daemon.bans.bans() == []


def test_durations() -> None:
    assert parse_duration("90") == 90 and parse_duration(1.5) == 1.5
    assert parse_duration("90s") == 90 and parse_duration("15m") == 900
    assert parse_duration("1h30m") == 5400 and parse_duration("7d") == 604800
    assert parse_duration("2w") == 1209600
    for bad in ("", "1x", "h", "1h30", "-5", True, None, "99999d"):
        with pytest.raises(BanError):
            parse_duration(bad)


async def test_a_ban_expires_on_its_own(admin: Admin) -> None:
    status, _ = await admin.call("POST", "/v1/bans/add", json={"user": "bob", "seconds": 0.2})
    assert status == 200
    await asyncio.sleep(0.35)
    assert (await admin.call("GET", "/v1/bans"))[1] == {"bans": []}
    assert [a.action for a in admin.actions()] == ["ban", "ban_expired"]


def denied(daemon: Daemon, user: str | None, host: str, vhost: str | None = "shop",
           reason: ConnectionDenyReason = ConnectionDenyReason.USER_LIMIT) -> None:
    daemon.emit(ConnectionDenied(conn_id="c", at=daemon.loop.time(), vhost=vhost, user=user,
                                 remote_host=host, reason=reason))


async def test_quarantine_bans_a_user_then_a_host_for_ban_seconds(admin: Admin) -> None:
    daemon = admin.daemon
    for _ in range(2):
        denied(daemon, "mallory", "10.0.0.9")
    daemon.emit(LinkDenied(conn_id="c", at=daemon.loop.time(), vhost="shop", user="mallory",
                           remote_host="10.0.0.9", role="sender", address="x",
                           reason=LinkDenyReason.TARGET))  # any kind counts
    await asyncio.sleep(0)
    [ban] = daemon.bans.bans()
    assert (ban["kind"], ban["value"], ban["source"]) == ("user", "mallory", "quarantine")
    assert ban["reason"] == "quarantined: 3 denials within 10 s in vhost 'shop'"
    [action] = admin.actions()
    assert (action.action, action.selector, action.vhost, action.peer) == (
        "quarantine", "user=mallory", "shop", "quarantine")
    # no user: the client address; no vhost: the default vhost's quarantine (none here)
    for _ in range(3):
        denied(daemon, None, "::ffff:192.0.2.7", reason=ConnectionDenyReason.UNKNOWN_USER)
    for _ in range(5):
        denied(daemon, "trent", "192.0.2.8", vhost="lab")  # no quarantine in lab
        denied(daemon, "trent", "192.0.2.8", reason=ConnectionDenyReason.UPSTREAM_UNAVAILABLE)
    await asyncio.sleep(0)
    assert [(b["kind"], b["value"]) for b in daemon.bans.bans()] == [
        ("user", "mallory"), ("host", "192.0.2.7")]
    for kind in ("user", "host"):
        assert daemon.registry.get_sample_value(
            "amqp_proxy_quarantines_total", {"vhost": "shop", "kind": kind}) == 1
    await asyncio.sleep(0.4)  # banSeconds 0.3
    assert daemon.bans.bans() == []


async def test_a_quarantine_is_lifted_by_unban(admin: Admin) -> None:
    for _ in range(3):
        denied(admin.daemon, "eve", "10.0.0.1")
    await asyncio.sleep(0)
    assert len(admin.daemon.bans.bans()) == 1
    assert (await admin.call("POST", "/v1/bans/remove", json={"user": "eve"}))[1]["lifted"]
    assert admin.daemon.bans.bans() == []


async def test_a_paced_close_answers_a_job_to_follow(admin: Admin) -> None:
    status, body = await admin.call("POST", "/v1/connections/close",
                                    json={"vhost": "shop", "rate": 100})
    assert status == 200, body
    assert (body["closing"], body["ids"], body["rate"]) == (0, [], 100)
    status, progress = await admin.call("GET", f"/v1/connections/close/{body['job']}")
    assert status == 200 and progress["done"] and progress["total"] == 0
    assert (await admin.call("GET", "/v1/connections/close/nope"))[0] == 404
    for rate in (0, -1, "fast", True):
        status, body = await admin.call("POST", "/v1/connections/close",
                                        json={"vhost": "shop", "rate": rate})
        assert status == 400 and "rate must be" in body["error"]
