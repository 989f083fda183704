"""The previous security issue's bypass tests, through the proxy in front of the real router.

``tests/integration/test_canonical_bypass.py`` proves each bypass of the canonical-encoding
review against the in-tree broker; here the same test classes run against a real qdrouterd
with no policy of its own: the ``broker`` they ask is a :class:`RouterRecord` of the router
(its log of Opens and Attaches, its delivery counters), so "the peer never saw it" means the
router never did.
"""

from __future__ import annotations

import pytest

from amqp_policy_proxy.core.events import MessageDenied
from tests.integration import test_canonical_bypass as bypass
from tests.integration.test_canonical_bypass import (
    POLICY,
    TestAttachFindings,
    TestFinding1Identity,
    TestFinding2SaslCountBeyondSize,
)
from tests.support import hostile
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread

__all__ = ["TestAttachFindings", "TestFinding1Identity", "TestFinding2SaslCountBeyondSize"]


@pytest.fixture(scope="module")
def plain_router(router):
    """A second router whose users have plain names (alice, carol, mallory), as the in-tree
    broker's sasldb that the bypass policy was written for."""
    r = qdr.Qdrouterd({u: "secret" for u in ("alice", "carol", "mallory")}, realm=None).start()
    yield r
    r.stop()


@pytest.fixture
def proxy(plain_router):
    with ProxyThread([plain_router.address], policy=POLICY, kind="qdrouterd") as p:
        yield p


@pytest.fixture
def broker(plain_router, proxy):
    record = qdr.RouterRecord(plain_router)
    yield record
    record.close()


class TestMessageFindings(bypass.TestMessageFindings):
    """The message findings; finding 8 asks real subscribers what the router delivered."""

    def test_finding_8_router_annotations_are_refused(self, proxy, broker, plain_router):
        # the router keeps no per-address count for an address nobody subscribes to: subscribe
        # both first, on the test-only admin listener, and ask the subscribers
        from proton.utils import BlockingConnection

        secret, public = bypass.unique("secret"), bypass.unique("public")
        watcher = BlockingConnection(plain_router.admin_url, timeout=10)
        try:
            on_secret = watcher.create_receiver(secret, credit=10)
            on_public = watcher.create_receiver(public, credit=10)
            with bypass.session(proxy.port) as c:
                bypass.sender(c, 0, None)
                c.send(hostile.transfer(0, 0, 7, hostile.message_router_annotation(public,
                                                                                   secret)))
                got = c.read_until(lambda i: i.name == "Disposition", timeout=5)
                c.send(hostile.transfer(0, 0, 8, hostile.message_to(public)))
                c.read_until(lambda i: i.name == "Disposition" and i.perf.first == 8, timeout=5)
            rejected = [i for i in got if i.name == "Disposition"]
            assert str(rejected[0].perf.state.error.condition) == "amqp:unauthorized-access"
            assert [str(e.reason) for e in proxy.events_of(MessageDenied)] == [
                "router_annotations"]
            assert on_public.receive(timeout=5).address == public  # the session goes on
            assert not on_secret.fetcher.incoming and not on_public.fetcher.incoming
        finally:
            watcher.close()
