"""Limits that hold under attack, through the proxy in front of the real qdrouterd (issue 28).

The session window: vhost ``maxFrameSize`` 512 and ``maxSessionWindow`` 1024 give the client
an incoming-window of 2 Transfer frames. A raw client that pipelines 60 Transfers without
waiting for a Flow is stopped at the end of its window with proton's answer
(``amqp:session:window-violation``), and a subscriber on the router's admin listener sees only
what was inside the window; a proton client, which waits for the Flows the proxy sends to
reopen the window, sends 200 messages through.
"""

from __future__ import annotations

import uuid

import pytest
from proton import Message
from proton.utils import BlockingConnection

from amqp_policy_proxy.core.events import ProtocolViolation
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import RawClient, attach_sender, begin, data_message, transfer

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
