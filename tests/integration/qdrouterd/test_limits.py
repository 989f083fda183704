"""Limits that hold under attack, through the proxy in front of the real qdrouterd (issue 28).

Rates at fleet scale: ``--workers 2 --ledger auto`` in front of the router hold
``maxConnectionRatePerUser: 1`` to one Open a second for the user (each worker admitted one of
its own before), and two proxies sharing one redis-server hold ``maxMessageRatePerUser: 100``
to 100 messages a second for the pair, counted by a subscriber on the router.

The session window: vhost ``maxFrameSize`` 512 and ``maxSessionWindow`` 1024 give the client
an incoming-window of 2 Transfer frames. A raw client that pipelines 60 Transfers without
waiting for a Flow is stopped at the end of its window with proton's answer
(``amqp:session:window-violation``), and a subscriber on the router's admin listener sees only
what was inside the window; a proton client, which waits for the Flows the proxy sends to
reopen the window, sends 200 messages through.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.core.events import ProtocolViolation
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import qdrouterd as qdr
from tests.support.fleet import ProxyProcess, close_all, connect_many
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import RawClient, attach_sender, begin, data_message, transfer
from tests.support.redis import RedisServer

from .conftest import user

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "groups": {
            "windowed": {"users": f"{user('alice')}, {user('bob')}", "remoteHosts": "*",
                         "maxFrameSize": 512, "maxSessionWindow": 1024,
                         "sources": "orders.*", "targets": "orders.*"},
        },
    }],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture(scope="module")
def proxy(router):
    with ProxyThread([router.address], policy=POLICY, kind="qdrouterd") as p:
        yield p


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def test_a_client_pipelining_past_its_session_window_is_stopped(proxy, router):
    queue = unique("orders")
    with qdr.Subscriber(router.admin_url, queue) as sub, RawClient(proxy.port) as c:
        c.open("test", user=user("alice"), max_frame_size=512)
        c.send(begin(0), attach_sender(0, 0, queue))
        got = c.read_until(lambda i: i.name == "Flow" and i.perf.handle is not None, timeout=5)
        begins = [i for i in got if i.name == "Begin"]
        assert int(begins[0].perf.incoming_window) == 2
        c.send(b"".join(transfer(0, 0, n, data_message(b"%d" % n), settled=True)
                        for n in range(60)))
        closes = [i for i in c.read_until(lambda i: i.name == "Close", timeout=5)
                  if i.name == "Close"]
        assert closes[0].condition == "amqp:session:window-violation"
        assert closes[0].description == "incoming session window exceeded"
        assert len(sub.bodies()) <= 2
    violations = [e for e in proxy.events_of(ProtocolViolation)
                  if e.condition == "amqp:session:window-violation"]
    assert violations and violations[-1].side == "client"


def test_a_client_that_keeps_to_the_window_sends_everything(proxy, router):
    queue = unique("orders")
    with qdr.Subscriber(router.admin_url, queue) as sub:
        c = BlockingConnection(f"amqp://127.0.0.1:{proxy.port}", user=user("bob"),
                               password="secret", allowed_mechs="PLAIN", timeout=10)
        snd = c.create_sender(queue)
        for n in range(200):
            snd.send(Message(body=f"m{n}"))
        c.close()
        assert sub.bodies() == [f"m{n}" for n in range(200)]


FLEET_POLICY = [
    ["vhost", {"hostname": "rated", "maxConnectionRatePerUser": 1, "allowUnknownUser": False,
               "groups": {"all": {"users": user("alice"), "remoteHosts": "*",
                                  "sources": "shaped.*", "targets": "shaped.*"}}}],
    ["vhost", {"hostname": "rates", "allowUnknownUser": False,
               "groups": {"shaped": {"users": user("alice"), "remoteHosts": "*",
                                     "maxMessageRatePerUser": 100,
                                     "sources": "shaped.*", "targets": "shaped.*"}}}],
]


@pytest.fixture
def fleet_dir():
    path = Path(tempfile.mkdtemp(prefix="ql", dir="/tmp"))  # short: unix socket paths
    (path / "policy.json").write_text(json.dumps(FLEET_POLICY))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_the_per_user_connection_rate_holds_across_workers(router, fleet_dir):
    proc = ProxyProcess(fleet_dir, router.address, fleet_dir / "policy.json", name="w",
                        ledger='url = "auto"\n', flags=["--workers", "2"], kind="qdrouterd")
    try:
        admitted, denied = connect_many([(proc.port, user("alice"), "rated")] * 12)
        close_all(admitted)
        assert len(admitted) == 1, (len(admitted), denied[:2])
        assert all("connection disallowed by local policy" in d for d in denied)
    finally:
        proc.stop()


@pytest.mark.slow
@pytest.mark.skipif(not RedisServer.available(), reason="redis-server missing")
def test_the_per_user_message_rate_holds_across_two_proxies(router, fleet_dir):
    from tests.integration.test_rate_limits import Burst, run

    redis = RedisServer().start()
    procs = []
    try:
        procs = [ProxyProcess(fleet_dir, router.address, fleet_dir / "policy.json", name=n,
                              ledger=f'url = "{redis.url}"\nproxy_id = "{n}"\n',
                              kind="qdrouterd") for n in ("pa", "pb")]
        queue = unique("shaped")
        with qdr.Subscriber(router.admin_url, queue, credit=500) as sub:
            bursts = [Burst(p.port, user("alice"), queue, 150) for p in procs]
            threads = [threading.Thread(target=run, args=(b,)) for b in bursts]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            span = max(b.finished for b in bursts) - start
            assert [b.accepted for b in bursts] == [150, 150], [
                (b.sent, b.rejected, b.released, p.problems())
                for b, p in zip(bursts, procs, strict=True)]
            assert len(sub.bodies()) == 300
        # a burst of a tenth of a second, then 100 a second for the pair: about 2.9 s
        assert span >= 2.5, span
    finally:
        for p in procs:
            p.stop()
        redis.close()
