"""Issue 14, end to end: each bypass of the adversarial review, as raw frames from a client with
one valid account, through a real proxy to a real proton peer (the in-tree broker, whose engine
reads frames by their size as qdrouterd's does). The peer must never see the forbidden link,
identity or message; the client gets ``amqp:decode-error``, a SASL ``auth`` or a refused
message. Each test failed on main before the canonical-encoding change (decision 0005).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.events import ConnectionDenied, MessageDenied, ProtocolViolation
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import hostile
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import Item, RawClient, SaslOutcome

pytestmark = pytest.mark.integration

PASSWORD = "secret"  # tests/integration/conftest.py's sasldb

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "test",
    "allowUnknownUser": False,
    "groups": {
        # carol may use the secret addresses; alice only public ones; mallory nothing at all
        "admins": {"users": "carol", "remoteHosts": "*", "sources": "*", "targets": "*",
                   "allowAnonymousSender": True},
        "users": {"users": "alice", "remoteHosts": "*", "maxConnectionsPerUser": 2,
                  "sources": "public.*", "targets": "public.*",
                  "allowAnonymousSender": True, "maxMessageSize": 1000},
        "banned": {"users": "mallory"},  # no remoteHosts: denied from everywhere
    },
}]])], PolicySettings())


@pytest.fixture
def proxy(broker_address) -> Iterator[ProxyThread]:
    with ProxyThread([broker_address], policy=POLICY) as p:
        yield p


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def sasl(c: RawClient, init: bytes) -> list[Item]:
    c.send(C.SASL_HEADER, init)
    return c.read_until(lambda i: isinstance(i.perf, SaslOutcome) or i.name == "Close",
                        timeout=5)


def outcome(items: list[Item]) -> int | None:
    got = [int(i.perf.code) for i in items if isinstance(i.perf, SaslOutcome)]
    return got[0] if got else None


def session(port: int, user: str = "alice") -> RawClient:
    """A raw client through SASL PLAIN and the Open, with session 0 begun."""
    c = RawClient(port)
    c.open("test", user=user, password=PASSWORD)
    c.send(hostile.amqp_frame(0, hostile.described(0x11, hostile.list32(
        b"\x40\x43\x70\x00\x00\x03\xe8\x70\x00\x00\x03\xe8\x70\x00\x00\x03\xff", 5))))
    c.read_until(lambda i: i.name == "Begin")
    return c


def refused_with_decode_error(c: RawClient) -> None:
    got = c.read_until(lambda i: i.name == "Close", timeout=5)
    closes = [i for i in got if i.name == "Close"]
    assert closes and closes[0].condition == "amqp:decode-error", [i.name for i in got]


def sender(c: RawClient, handle: int, address: str | None) -> None:
    c.send(hostile.amqp_frame(0, hostile.described(0x12, hostile.list32(
        hostile.attach_fields(f"s{handle}", handle, role=b"\x42", source_=hostile.source(None),
                              target_=hostile.target(address)), 7))))
    got = c.read_until(lambda i: i.name in ("Attach", "Detach", "Close"))
    assert [i.name for i in got if i.name != "Flow"][:1] == ["Attach"]
    c.read_until(lambda i: i.name == "Flow", timeout=5)


def broker_attached(broker, address: str) -> bool:
    return any(address in (a.source, a.target, a.address) for a in broker.attaches())


class TestFinding1Identity:
    def test_banned_user_naming_an_admin_as_authzid_is_refused(self, proxy, broker):
        before = len(broker.opens())
        with RawClient(proxy.port) as c:
            got = sasl(c, hostile.plain_init("mallory", PASSWORD, authzid="carol"))
            c.read_until_closed(timeout=3)
        assert outcome(got) == C.SaslCode.AUTH
        time.sleep(0.1)
        assert len(broker.opens()) == before
        assert [str(e.reason) for e in proxy.events_of(ConnectionDenied)] == ["authzid"]

    def test_a_stock_proton_client_with_an_authorization_is_refused(self, proxy, broker):
        # python-qpid-proton sends an authzid with ``Connection.authorization``
        from proton.handlers import MessagingHandler
        from proton.reactor import Container

        class Client(MessagingHandler):
            def __init__(self) -> None:
                super().__init__()
                self.result = "none"

            def on_start(self, event):
                conn = event.container.connect(
                    f"127.0.0.1:{proxy.port}", user="mallory", password=PASSWORD,
                    allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="test",
                    reconnect=False)
                conn.authorization = "carol"
                event.container.schedule(5, self)

            def on_connection_opened(self, event):
                self.result = "opened"
                event.connection.close()

            def on_transport_error(self, event):
                self.result = str(event.transport.condition)

            def on_timer_task(self, event):
                event.container.stop()

            def on_transport_closed(self, event):
                event.container.stop()

        before = len(broker.opens())
        client = Client()
        Container(client).run()
        assert "Authentication failed" in client.result
        assert len(broker.opens()) == before

    def test_authzids_do_not_multiply_the_per_user_limit(self, proxy, broker):
        admitted = 0
        clients = []
        for n in range(6):
            c = RawClient(proxy.port)
            clients.append(c)
            got = sasl(c, hostile.plain_init("alice", PASSWORD, authzid=f"u{n}"))
            if outcome(got) == 0:
                admitted += 1
        for c in clients:
            c.close()
        assert admitted == 0
        # and without authzids, exactly maxConnectionsPerUser (2) are admitted
        clients = []
        opened = 0
        for _ in range(4):
            c = RawClient(proxy.port)
            clients.append(c)
            got = c.open("test", user="alice", password=PASSWORD)
            opened += 0 if any(i.name == "Close" for i in got) else 1
        for c in clients:
            c.close()
        assert opened == 2


class TestFinding2SaslCountBeyondSize:
    def test_claimed_user_after_the_list_is_refused(self, proxy, broker):
        before = len(broker.opens())
        with RawClient(proxy.port) as c:
            c.send(C.SASL_HEADER, hostile.sasl_init_count_exceeds_size("carol", "mallory",
                                                                      PASSWORD))
            got = c.read_until_closed(timeout=5)
        assert outcome(got) is None
        assert len(broker.opens()) == before
        assert [e.condition for e in proxy.events_of(ProtocolViolation)] == [
            "amqp:decode-error"]


class TestAttachFindings:
    @pytest.mark.parametrize("make", [
        pytest.param(lambda secret: hostile.shadow_attach(0, 0, shown="public.d",
                                                          hidden=secret), id="3-shadow-attach"),
        pytest.param(lambda secret: hostile.attach_unknown_target_descriptor(0, 0, secret),
                     id="6-unknown-target-descriptor"),
        pytest.param(lambda secret: hostile.attach_ubyte_dynamic(0, 0, secret),
                     id="6-ubyte-dynamic"),
        pytest.param(lambda secret: hostile.attach_ubyte_role(0, 0, secret),
                     id="6-ubyte-role"),
    ])
    def test_the_router_never_attaches_the_hidden_address(self, proxy, broker, make):
        secret = unique("secret")
        with session(proxy.port) as c:
            c.send(make(secret))
            refused_with_decode_error(c)
        time.sleep(0.1)
        assert not broker_attached(broker, secret)

    def test_finding_4_count_beyond_size_never_becomes_an_anonymous_sender(self, proxy, broker):
        before = [a for a in broker.attaches() if a.name == "count-gt-size"]
        with session(proxy.port) as c:
            c.send(hostile.attach_count_exceeds_size(0, 0, shown="public.a"))
            refused_with_decode_error(c)
        time.sleep(0.1)
        assert [a for a in broker.attaches() if a.name == "count-gt-size"] == before


class TestMessageFindings:
    def test_finding_7_hidden_more_cannot_join_frames_past_max_message_size(self, proxy, broker):
        queue = unique("public")
        with session(proxy.port) as c:
            sender(c, 0, queue)
            payload = b"\x00\x53\x75\xa0\xf0" + b"x" * 240
            frames = [hostile.transfer_hidden_more(0, 0, 0, payload) for _ in range(19)]
            c.send(*frames, hostile.transfer(0, 0, 0, payload))
            refused_with_decode_error(c)
        time.sleep(0.2)
        assert broker.received(queue) == 0

    @pytest.mark.parametrize("make", [
        pytest.param(lambda secret: hostile.message_described_message_id("public.ok", secret),
                     id="5-described-message-id"),
        pytest.param(lambda secret: hostile.message_properties_count_exceeds_size(secret),
                     id="5-properties-count-beyond-size"),
    ])
    def test_finding_5_relay_to_is_read_one_way_only(self, proxy, broker, make):
        secret = unique("secret")
        with session(proxy.port) as c:
            sender(c, 0, None)
            c.send(hostile.transfer(0, 0, 0, make(secret)))
            refused_with_decode_error(c)
        time.sleep(0.2)
        assert broker.received(secret) == 0
        assert broker.received("public.ok") == 0

    def test_finding_8_router_annotations_are_refused(self, proxy, broker):
        secret, public = unique("secret"), unique("public")
        with session(proxy.port) as c:
            sender(c, 0, None)
            c.send(hostile.transfer(0, 0, 7, hostile.message_router_annotation(public, secret)))
            got = c.read_until(lambda i: i.name == "Disposition", timeout=5)
            c.send(hostile.transfer(0, 0, 8, hostile.message_to(public)))
            c.read_until(lambda i: i.name == "Disposition" and i.perf.first == 8, timeout=5)
        rejected = [i for i in got if i.name == "Disposition"]
        assert str(rejected[0].perf.state.error.condition) == "amqp:unauthorized-access"
        assert [str(e.reason) for e in proxy.events_of(MessageDenied)] == [
            "router_annotations"]
        assert broker.received(secret) == 0
        assert broker.wait_until(lambda: broker.received(public) == 1)  # the session goes on
