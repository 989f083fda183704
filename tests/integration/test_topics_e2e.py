"""End to end: topic authorization (docs/topic-authorization.md) with real proton clients through a proxy.

One vhost per model (tests/integration/policies/topics.json): ``mq`` (IBM MQ topic tree,
``anyAncestor``), ``wmb`` (WebSphere Message Broker topic ACLs, ``nearestAcl``: per-delivery
filtering of wildcard subscriptions and the durable rewrite) and ``hive`` (HiveMQ ordered
permissions with QoS from settle modes). DDS permissions documents: see ``test_dds_e2e``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Disposition, Link, Message, Timeout
from proton.reactor import AtMostOnce, LinkOption
from proton.utils import LinkDetached, SendException

from amqp_policy_proxy.core.events import LinkDenied, MessageDenied
from tests.integration.test_proxy_e2e import connect, outcome, wait_for
from tests.support.proxy import ProxyThread

pytestmark = pytest.mark.integration

POLICY = Path(__file__).parent / "policies" / "topics.json"
LINK_DENIED = ("amqp:unauthorized-access", "link disallowed by local policy")


class ExactlyOnce(LinkOption):
    """snd-settle-mode unsettled, rcv-settle-mode second: QoS 2 (docs/topic-authorization.md)."""

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND


@pytest.fixture
def proxy(broker_address):
    p = ProxyThread([broker_address], policy_path=str(POLICY))
    p.start()
    yield p
    p.stop()


def assert_link_denied(make) -> None:
    with pytest.raises(LinkDetached) as info:
        make()
    for part in LINK_DENIED:
        assert part in str(info.value)


def drain(receiver, n: int) -> list[Message]:
    got = [receiver.receive(timeout=5) for _ in range(n)]
    receiver.accept()
    return got


def nothing_more(receiver, timeout: float = 0.5) -> bool:
    try:
        receiver.receive(timeout=timeout)
    except Timeout:
        return True
    return False


class TestTopicTreeAnyAncestor:
    """IBM MQ's worked example: SEC, SEC/GOOD (usr1 subscribe), SEC/COMB/GOOD (usr2)."""

    def test_usr1_subscribes_to_its_node_and_inherits_below_it(self, proxy):
        c = connect(proxy.port, "usr1", vhost="mq")
        c.create_receiver("SEC/GOOD")
        c.create_receiver("SEC/GOOD/NEW")  # a node that does not exist inherits SEC/GOOD
        assert_link_denied(lambda: c.create_receiver("SEC/COMB/GOOD"))
        assert_link_denied(lambda: c.create_receiver("SEC/COMB/BAD"))
        c.create_receiver("SEC/GOOD/#")  # checked at its fully qualified prefix SEC/GOOD
        c.close()

    def test_usr2_inherits_from_sec_comb_good_only(self, proxy):
        c = connect(proxy.port, "usr2", vhost="mq")
        c.create_receiver("SEC/COMB/GOOD/BAD")
        assert_link_denied(lambda: c.create_receiver("SEC/COMB/BAD"))
        assert_link_denied(lambda: c.create_receiver("SEC/GOOD"))
        # SEC/COMB/*/GOOD is checked at SEC/COMB, where usr2 has nothing
        assert_link_denied(lambda: c.create_receiver("SEC/COMB/+/GOOD"))
        # nobody was granted publish anywhere; the connection survives every denial
        assert_link_denied(lambda: c.create_sender("SEC/COMB/GOOD"))
        c.create_receiver("SEC/COMB/GOOD")
        c.close()
        denials = proxy.events_of(LinkDenied)
        assert denials and {e.reason for e in denials} == {"topic"}


class TestTopicAclsNearestAcl:
    """The WMB broker topic table: A, A/K/M/N and A/B with publish, subscribe, persistent."""

    def test_publish_rights_from_the_nearest_node(self, proxy):
        joe, mary = connect(proxy.port, "joe", vhost="wmb"), connect(proxy.port, "mary", vhost="wmb")
        for address in ("A", "A/P", "A/B", "A/K/M/N/X"):
            joe.create_sender(address)
        mary.create_sender("A/K/M/N")
        mary.create_sender("A/K/M/N/deeper")
        assert_link_denied(lambda: mary.create_sender("A/P"))
        assert_link_denied(lambda: mary.create_sender("A/B"))
        mary.create_sender("$SYS/broker/uptime")  # system prefix: exempt from topic checks
        mary.create_sender("Z")  # the root's default allows everyone
        joe.close()
        mary.close()

    def test_relay_messages_checked_per_to(self, proxy):
        assert outcome_in(proxy, "mary", Message(address="A/K/M/N", body="ok"))[0] == "accepted"
        assert outcome_in(proxy, "mary", Message(address="A/P", body="no")) == (
            "rejected", "amqp:unauthorized-access", "policy violation on target")
        assert any(e.reason == "topic" for e in proxy.events_of(MessageDenied))

    def test_wildcard_subscriber_sees_only_what_it_may(self, proxy):
        dave = connect(proxy.port, "dave", vhost="wmb")  # everyone-group: not in HR
        hank = connect(proxy.port, "hank", vhost="wmb")  # HR
        # a credit window, as MessagingHandler's prefetch keeps: a withheld delivery uses one
        # credit (decision 0004), and BlockingReceiver's credit=1 tops up only on a message
        d_sub, h_sub = dave.create_receiver("A/+", credit=10), hank.create_receiver("A/+")
        joe = connect(proxy.port, "joe", vhost="wmb")
        sender = joe.create_sender(None)
        for address in ("A/P", "A/B", "A/K", "A/B"):
            sender.send(Message(address=address, body=address, durable=True))
        assert [m.body for m in drain(h_sub, 4)] == ["A/P", "A/B", "A/K", "A/B"]
        got = drain(d_sub, 2)
        assert [m.body for m in got] == ["A/P", "A/K"]
        assert nothing_more(d_sub)
        # the withheld deliveries did not upset the session: later ones still arrive
        sender.send(Message(address="A/P", body="after", durable=True))
        assert [m.body for m in drain(d_sub, 1)] == ["after"]
        assert [m.body for m in drain(h_sub, 1)] == ["after"]
        withheld = [e for e in proxy.events_of(MessageDenied) if e.reason == "topic_withheld"]
        assert [e.address for e in withheld] == ["A/B", "A/B"]
        for c in (dave, hank, joe):
            c.close()

    def test_durable_rewritten_without_the_persistent_authority(self, proxy):
        # A: persistent no one; A/K/M/N: persistent everyone except nat
        dave, nat = connect(proxy.port, "dave", vhost="wmb"), connect(proxy.port, "nat", vhost="wmb")
        d_any = dave.create_receiver("A/+", credit=10)
        # one queue below A/K/M/N (inherits it), one credit each: one message each
        d_n, n_n = dave.create_receiver("A/K/M/N/d"), nat.create_receiver("A/K/M/N/d")
        joe = connect(proxy.port, "joe", vhost="wmb")
        to_n = joe.create_sender("A/K/M/N/d")
        for i in range(2):
            to_n.send(Message(body=f"n{i}", durable=True, priority=7))
        joe.create_sender("A/P").send(Message(address="A/P", body="p", durable=True))
        assert [(m.body, m.durable) for m in drain(d_any, 1)] == [("p", False)]
        got_dave, got_nat = drain(d_n, 1)[0], drain(n_n, 1)[0]
        assert (got_dave.durable, got_dave.priority) == (True, 7)  # dave keeps persistence
        assert (got_nat.durable, got_nat.priority) == (False, 7)  # nat: delivered non-durable
        assert {got_dave.body, got_nat.body} == {"n0", "n1"}
        for c in (dave, nat, joe):
            c.close()


def outcome_in(proxy, user, message, vhost="wmb"):
    return outcome(proxy.port, user, None, message, vhost=vhost)


class TestOrderedPermissions:
    """HiveMQ-style rules of group $default in vhost ``hive``: deny admin/#, allow ${user}/#
    at QoS 0 and 1, allow subscribing to shared/+/status, otherwise deny."""

    def test_first_matching_rule_decides(self, proxy):
        c = connect(proxy.port, "alice", vhost="hive")
        c.create_receiver("alice/inbox")
        c.create_sender("alice/outbox")
        assert_link_denied(lambda: c.create_sender("admin/alice"))  # rule 1 before rule 2
        assert_link_denied(lambda: c.create_receiver("bob/inbox"))  # default behaviour: deny
        c.create_receiver("shared/x/status")
        c.create_receiver("shared/+/status")  # covered by the rule's filter
        assert_link_denied(lambda: c.create_receiver("shared/#"))  # wider than any rule
        assert_link_denied(lambda: c.create_sender("shared/x/status"))  # subscribe-only rule
        c.close()

    def test_qos_from_settle_modes(self, proxy):
        c = connect(proxy.port, "alice", vhost="hive")
        c.create_receiver("alice/q0", options=AtMostOnce())
        assert_link_denied(lambda: c.create_receiver("alice/q2", options=ExactlyOnce()))
        c.close()

    def test_user_substitution_gives_no_wildcard_power(self, proxy):
        # anonymous clients are user "anonymous": ${user}/# covers anonymous/... only
        c = connect(proxy.port, None, vhost="hive")
        c.create_receiver("anonymous/x")
        assert_link_denied(lambda: c.create_receiver("alice/x"))
        c.close()

    def test_relay_publish_checked_per_message(self, proxy):
        assert outcome_in(proxy, "alice", Message(address="alice/x", body="ok"),
                          vhost="hive")[0] == "accepted"
        assert outcome_in(proxy, "alice", Message(address="admin/x", body="no"),
                          vhost="hive") == (
            "rejected", "amqp:unauthorized-access", "policy violation on target")
        assert wait_for(lambda: any(e.reason == "topic" for e in proxy.events_of(MessageDenied)))


class TestForgedTo:
    """Issue 14 finding 9: subscribers are filtered by a delivery's ``to``; a publisher must
    not be able to relabel a message for a topic it may not publish to."""

    def test_a_to_other_than_the_link_target_must_be_publishable_too(self, proxy):
        dave = connect(proxy.port, "dave", vhost="wmb")  # not HR: A/+ shows A/P, never A/B
        d_sub = dave.create_receiver("A/+", credit=10)
        allen = connect(proxy.port, "allen", vhost="wmb")  # may publish on A/B only
        on_b = allen.create_sender("A/B")
        with pytest.raises(SendException) as info:  # rejected: allen may not publish to A/P
            on_b.send(Message(address="A/P", body="relabelled HR data"))
        assert info.value.state == Disposition.REJECTED
        assert nothing_more(d_sub, timeout=1.0)
        topic = [e for e in proxy.events_of(MessageDenied) if e.reason == "topic"]
        assert [e.address for e in topic] == ["A/P"]
        # the same link still publishes A/B messages (to absent or equal to the target)
        on_b.send(Message(body="hr only"))
        on_b.send(Message(address="A/B", body="hr only, labelled"))
        assert nothing_more(d_sub, timeout=1.0)
        for c in (dave, allen):
            c.close()
