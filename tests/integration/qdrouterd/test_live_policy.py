"""Live policy in front of the real qdrouterd: a reload takes decisions back on open
connections (``[policy] reevaluate_open``).

- A reload that removes alice from her group closes exactly alice's connections (QDR's Close
  for a denied connection) and no other: bob goes on sending.
- A reload that narrows ``targets`` detaches exactly the sender it no longer allows
  (``amqp:unauthorized-access``), while a message on an allowed sender of the same session
  still reaches the router's subscriber.
- In ``shadow`` nothing changes on the wire and the same set is reported.
- With ``reevaluate_close_rate`` the revoked connections close paced (one per 1/rate slot,
  spread over about n/rate seconds), each with QDR's denial Close, and bob is untouched.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from amqp_policy_proxy.core.events import ConnectionClosed, Revoked
from amqp_policy_proxy.daemon.config import DaemonConfig
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread

from .conftest import user


def policy(users: str, targets: str) -> list:
    return [["vhost", {"hostname": "$default", "allowUnknownUser": False, "groups": {
        "staff": {"users": users, "remoteHosts": "*", "sources": "public.*",
                  "targets": targets}}}]]


BOTH = f"{user('alice')}, {user('bob')}"


def connect(port: int, name: str) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{port}", user=user(name), password="secret",
                              allowed_mechs="PLAIN", timeout=10)


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def wait_for(pred, timeout: float = 5.0) -> bool:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy(BOTH, "public.*, orders.*")))
    return path


def proxy_for(router, path: Path, mode: str = "enforce",
              close_rate: float | None = None) -> ProxyThread:
    return ProxyThread([router.address], policy_path=str(path), kind="qdrouterd",
                       config=replace(DaemonConfig(), reevaluate_open=mode,
                                      reevaluate_close_rate=close_rate))


def test_removing_a_user_from_the_group_closes_exactly_her_connections(router, policy_file):
    queue = unique("public")
    with proxy_for(router, policy_file) as proxy, qdr.Subscriber(router.admin_url, queue) as sub:
        alice1, alice2, bob = connect(proxy.port, "alice"), connect(proxy.port, "alice"), \
            connect(proxy.port, "bob")
        bob_sender = bob.create_sender(queue)
        policy_file.write_text(json.dumps(policy(user("bob"), "public.*, orders.*")))
        assert proxy.reload()
        assert wait_for(lambda: len([e for e in proxy.events_of(ConnectionClosed)
                                     if e.close_reason == "revoked"]) == 2)
        closed = [e for e in proxy.events_of(ConnectionClosed) if e.close_reason == "revoked"]
        assert {e.user for e in closed} == {user("alice")}
        bob_sender.send(Message(body="still here"))
        assert sub.bodies() == ["still here"]
        revoked = proxy.events_of(Revoked)
        assert [(e.kind, e.reason, e.mode) for e in revoked] == [
            ("connection", "unknown_user", "enforce")] * 2
        for c in (alice1, alice2, bob):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - alice's were closed by the proxy
                pass


def test_a_narrowed_target_detaches_exactly_that_link_and_the_session_goes_on(router,
                                                                            policy_file):
    orders, public = unique("orders"), unique("public")
    with proxy_for(router, policy_file) as proxy, qdr.Subscriber(
            router.admin_url, public) as sub, qdr.Subscriber(router.admin_url, orders):
        alice = connect(proxy.port, "alice")
        to_orders = alice.create_sender(orders)
        to_public = alice.create_sender(public)
        policy_file.write_text(json.dumps(policy(BOTH, "public.*")))
        assert proxy.reload()
        assert wait_for(lambda: proxy.events_of(Revoked))
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            for _ in range(50):  # the Detach arrives after the router's answer
                to_orders.send(Message(body="no longer"), timeout=2)
                alice.container.process()
        to_public.send(Message(body="allowed"))
        assert sub.bodies() == ["allowed"]
        assert [(e.kind, e.reason, e.role, e.address) for e in proxy.events_of(Revoked)] == [
            ("link", "target", "sender", orders)]
        alice.close()


def test_shadow_changes_nothing_on_the_wire_and_reports_the_same_set(router, policy_file):
    orders = unique("orders")
    with proxy_for(router, policy_file, "shadow") as proxy, qdr.Subscriber(
            router.admin_url, orders) as sub:
        alice = connect(proxy.port, "alice")
        to_orders = alice.create_sender(orders)
        policy_file.write_text(json.dumps(policy(BOTH, "public.*")))
        assert proxy.reload()
        assert wait_for(lambda: proxy.events_of(Revoked))
        to_orders.send(Message(body="shadow"))
        assert sub.bodies() == ["shadow"]
        assert [(e.kind, e.reason, e.mode, e.address) for e in proxy.events_of(Revoked)] == [
            ("link", "target", "shadow", orders)]
        alice.close()


def test_revoked_connections_close_paced_at_the_configured_rate(router, policy_file):
    n, rate = 8, 4.0
    with proxy_for(router, policy_file, close_rate=rate) as proxy:
        alices = [connect(proxy.port, "alice") for _ in range(n)]
        bob = connect(proxy.port, "bob")
        policy_file.write_text(json.dumps(policy(user("bob"), "public.*, orders.*")))
        assert proxy.reload()
        reloaded = proxy.call(lambda: proxy.daemon.loop.time())
        assert len(proxy.events_of(Revoked)) == n  # decided at once, closed paced
        assert wait_for(lambda: len([e for e in proxy.events_of(ConnectionClosed)
                                     if e.close_reason == "revoked"]) == n, timeout=10)
        times = sorted(e.at - reloaded for e in proxy.events_of(ConnectionClosed)
                       if e.close_reason == "revoked")
        # one close in each 1/rate slot: not all at once, all within about n/rate seconds;
        # a blocking client answers no Close while the test does not call it, so each ends
        # the 2 s linger after its Close
        assert times[-1] - times[0] >= (n - 2) / rate, times
        assert times[-1] <= n / rate + 3.0, times
        pacer = proxy.daemon.revocation_closes
        assert pacer is not None and (pacer.closed, pacer.skipped) == (n, 0)
        bob.create_sender(unique("public"))  # bob is untouched
        for c in alices:
            with pytest.raises(Exception, match="resource-limit-exceeded|disallowed"):
                c.create_sender(unique("public"))
        for c in (*alices, bob):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - alice's were closed by the proxy
                pass
