"""End to end through the proxy to a third-party broker: RabbitMQ 3.10 (Debian) with AMQP 1.0."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from proton import ConnectionException, Message, Timeout
from proton.utils import BlockingConnection, LinkDetached

from tests.support.proxy import ProxyThread

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.slow]

POLICY = str(Path(__file__).parent / "policies" / "rabbitmq.json")


@pytest.fixture(scope="module")
def rabbitmq():
    rabbit = pytest.importorskip("tests.support.rabbitmq")
    reason = rabbit.RabbitMQ.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    node = rabbit.RabbitMQ()
    node.start(timeout=120)
    yield node
    node.stop()


@pytest.fixture
def proxy(rabbitmq):
    with ProxyThread([("127.0.0.1", rabbitmq.port)], policy_path=POLICY) as p:
        yield p


def connect(port: int, *, anonymous: bool = False, vhost: str = "rabbit") -> BlockingConnection:
    kwargs = {"virtual_host": vhost, "allow_insecure_mechs": True, "timeout": 15}
    if anonymous:
        kwargs["allowed_mechs"] = "ANONYMOUS"
    else:
        kwargs.update(user="guest", password="guest", allowed_mechs="PLAIN")
    return BlockingConnection(f"127.0.0.1:{port}", **kwargs)


@pytest.mark.parametrize("anonymous", [False, True])
def test_messages_flow_byte_identical(proxy, anonymous):
    queue = f"/queue/allowed-{uuid.uuid4().hex[:8]}"
    body = bytes(range(256)) * 16
    c = connect(proxy.port, anonymous=anonymous)
    snd = c.create_sender(queue)
    rcv = c.create_receiver(queue)
    for i in range(3):
        snd.send(Message(body=body + bytes([i])))
    got = []
    for _ in range(3):
        msg = rcv.receive(timeout=10)  # keep the Message alive: its body is a view into it
        got.append(bytes(msg.body))
        rcv.accept()
    c.close()
    assert got == [body + bytes([i]) for i in range(3)]


def test_link_denied_and_connection_usable(proxy):
    c = connect(proxy.port)
    with pytest.raises(LinkDetached) as info:
        c.create_receiver("/queue/secret")
    assert "Condition('amqp:unauthorized-access', 'link disallowed by local policy')" in str(
        info.value)
    queue = f"/queue/allowed-{uuid.uuid4().hex[:8]}"
    c.create_sender(queue).send(Message(body="after"))
    c.close()


def test_connection_denied_with_qdr_condition(proxy):
    with pytest.raises(ConnectionException) as info:
        connect(proxy.port, vhost="elsewhere")
    assert re.search(r"Condition\('amqp:resource-limit-exceeded', "
                     r"'connection disallowed by local policy'\)", str(info.value))


def test_wildcard_subscriber_never_sees_a_restricted_topic_without_to(proxy):
    """Issue 14 finding 9: RabbitMQ delivers topic copies without ``to``. The proxy cannot
    tell which topic such a message was published to, so a wildcard subscriber outside
    ``@HR`` must not get it (it used to be checked at the wildcard's own node, and pass)."""
    from amqp_policy_proxy.core.events import MessageDenied

    c = connect(proxy.port, vhost="rabbit-topics")
    sub = c.create_receiver("/topic/hr.*", credit=10)
    pub = c.create_sender("/topic/hr.salary")
    pub.send(Message(body="secret salary"))  # no 'to': RabbitMQ's copy has none either
    with pytest.raises(Timeout):
        sub.receive(timeout=2)
    withheld = [e for e in proxy.events_of(MessageDenied) if e.reason == "topic_withheld"]
    assert len(withheld) == 1 and withheld[0].address is None
    # the session is still usable: a topic the subscriber may see is delivered
    public = c.create_receiver("/topic/news.today")
    c.create_sender("/topic/news.today").send(Message(body="headline"))
    assert public.receive(timeout=10).body == "headline"
    public.accept()
    c.close()
