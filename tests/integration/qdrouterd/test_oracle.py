"""The resolution oracle: the real qdrouterd decides whether the proxy's names are its names.

Hypothesis generates addresses (schemes, authorities, slashes, separators, ``_`` and ``$``
prefixes, unicode, case) and identities (whitespace, control characters, realms, case); the
real router says which node it attaches each address to (management ``QUERY`` of the link's
``owningAddr``) and which user it records for each identity; the proxy's
:class:`~amqp_policy_proxy.policy.naming.Naming` must give exactly that node and that user, or
refuse. ``AMQP_PROXY_ORACLE_EXAMPLES`` sets the number of examples (the suite's default is
small; the long run in the issue note used thousands).
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton.utils import BlockingConnection

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.policy.naming import Naming
from tests.support.rawpeer import Open, RawClient, frame

from .conftest import REALM

EXAMPLES = int(os.environ.get("AMQP_PROXY_ORACLE_EXAMPLES", "200"))
ORACLE = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))

PIECES = ["amqp:", "amqps:", "x:", ":", "/", "//", "//h/", "host:5672", ".", "..", "/.",
          "public", "secret", "a", "B", "é", "名", "$", "$management", "_local/", "_topo/",
          "_topo/0/QDR.test/", "_topo/0/other/", "_edge/", "_x", "#", "*", ":/", "://", "%2F"]
ADDRESSES = st.lists(st.sampled_from(PIECES) | st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x2FF, blacklist_characters="\x7f"),
    min_size=1, max_size=4), min_size=1, max_size=6).map("".join).filter(
    lambda a: len(a.encode()) <= 200)


@pytest.fixture(scope="module")
def admin(router):
    conn = BlockingConnection(router.admin_url, timeout=10)
    agent = router.management()
    yield conn, agent
    agent.close()
    conn.close()


@ORACLE
@given(address=ADDRESSES)
def test_the_proxy_resolves_every_address_to_the_routers_node(admin, address):
    conn, agent = admin
    name = f"oracle-{uuid.uuid4().hex}"
    sender = conn.create_sender(address, name=name)
    try:
        rows = [r for r in agent.query("org.apache.qpid.dispatch.router.link",
                                       ["linkName", "owningAddr"]) if r["linkName"] == name]
    finally:
        sender.close()
    owning = rows[0]["owningAddr"] if rows else None
    node = Naming("qdrouterd").resolve(address)
    if owning is not None and owning.startswith("M0"):
        # a mobile address: the proxy's node is the router's, or the proxy refuses
        assert node is None or node.name == owning[2:], (address, owning, node)
    else:
        # local, topological, edge or unroutable: never an ordinary node for the proxy
        assert node is None or node.internal, (address, owning, node)
    if node is not None and not node.internal:
        assert owning == "M0" + node.name


PADDING = st.text(st.sampled_from([" ", "\t", "\n", "\v", "\f", "\r", "\x01", "\x1f",
                                   "\u00a0", "\u2003", "\u3000"]), max_size=3)
BASES = st.sampled_from(["alice", "ALICE", "Alice", "bob"]).flatmap(
    lambda u: st.sampled_from([f"{u}@{REALM}", u, f"{u}@qdr.test", f"{u}@{REALM}@{REALM}",
                               f"{u} @{REALM}", f"{u}@ {REALM}"]))


def _router_user(router, agent, name: str) -> str | None:
    """Log in to the router itself as ``name`` (raw PLAIN); the user it records, or None."""
    with RawClient(router.port) as c:
        if c.sasl_plain(name) != 0:
            return None
        c.send(C.AMQP_HEADER, frame(0, Open(container_id=f"oracle-{uuid.uuid4().hex}")))
        c.read_until(lambda i: isinstance(i.perf, Open))
        users = [r["user"] for r in agent.query("org.apache.qpid.dispatch.connection",
                                                ["user", "container"])
                 if r["container"] and r["container"].startswith("oracle-")]
    assert len(users) == 1
    return users[0]


@ORACLE
@given(before=PADDING, base=BASES, after=PADDING)
def test_the_proxy_names_every_identity_as_the_router_records_it(router, admin, before, base,
                                                                 after):
    _, agent = admin
    name = before + base + after
    recorded = _router_user(router, agent, name)
    canonical = Naming("qdrouterd", identity_mode="canonical").identity(name)
    strict = Naming("qdrouterd").identity(name)
    if recorded is not None:
        assert canonical in (None, recorded), (name, recorded, canonical)
        assert strict in (None, recorded), (name, recorded, strict)
    if strict is not None:
        assert strict == name  # strict never changes a name: it takes it or refuses it

