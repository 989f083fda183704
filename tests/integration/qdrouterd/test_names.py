"""Names as the real qdrouterd resolves them: addresses and identities (decision 0007).

Each test is an attack by a client holding one valid account, through the proxy in front of a
real qdrouterd 1.19 with no policy of its own; the oracle is the router itself (management
``QUERY`` of its links and connections over the test-only admin listener, and receivers there
that see where a message really arrives). Every test here failed on the proxy that matched the
raw address text and the raw PLAIN authcid.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid

import pytest
from proton import LinkException, Message
from proton.reactor import AtMostOnce
from proton.utils import BlockingConnection

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import qdrouterd as qdr
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import RawClient

from .conftest import user

POLICY = compile_policy([(None, [
    ["vhost", {
        "hostname": "$default",
        "allowUnknownUser": False,
        "maxConnectionsPerUser": 2,
        "groups": {
            "banned": {"users": user("eve"), "remoteHosts": "10.9.9.9"},
            "everyone": {"users": "*", "remoteHosts": "*", "sources": "open.*",
                         "targets": "open.*"},
            "public": {"users": f"{user('alice')}, {user('bob')}", "remoteHosts": "*",
                       "sources": "public.*", "targets": "public.*",
                       "allowAnonymousSender": True, "allowDynamicSource": True},
            "owners": {"users": user("mallory"), "remoteHosts": "*",
                       "sourcePattern": "${user}.#", "targetPattern": "${user}.#, #"},
            "admins": {"users": user("admin"), "remoteHosts": "*", "allowDynamicSource": True,
                       "sources": "$management", "targets": "$management"},
        },
    }],
])], PolicySettings(default_vhost="$default"))


@pytest.fixture(scope="module")
def proxy(router):
    with ProxyThread([router.address], policy=POLICY, kind="qdrouterd") as p:
        yield p


def connect(port: int, name: str, *, password: str = "secret",
            mechs: str = "PLAIN") -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{port}", user=name, password=password,
                              allowed_mechs=mechs, timeout=10)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def assert_link_denied(make_link) -> None:
    with pytest.raises(LinkException, match="link disallowed by local policy|unauthorized"):
        make_link()


# -- addresses: checked as resolved ---------------------------------------------------------

def test_sender_to_a_prefixed_address_is_decided_on_the_node_the_router_routes_to(proxy, router):
    secret = unique("secret.a")
    conn = connect(proxy.port, user("alice"))
    try:
        assert_link_denied(lambda: conn.create_sender(f"public.x:/{secret}"))
        assert f"M0{secret}" not in router.link_addresses()
        # the router's own spelling of an allowed node still works
        ok = unique("public.")
        conn.create_sender(f"{ok}/")
        assert f"M0{ok}" in router.link_addresses("in")
    finally:
        conn.close()


@pytest.mark.parametrize("spelling", ["public.x:/{}", "public.x://host/{}", "//host/{}",
                                      "/{}", "amqp://127.0.0.1/{}"])
def test_receiver_on_any_spelling_of_a_secret_address_is_denied(proxy, router, spelling):
    secret = unique("secret.b")
    conn = connect(proxy.port, user("alice"))
    try:
        assert_link_denied(lambda: conn.create_receiver(spelling.format(secret)))
        assert f"M0{secret}" not in router.link_addresses()
    finally:
        conn.close()


def test_anonymous_relay_to_is_decided_on_the_resolved_node(proxy, router):
    secret = unique("secret.c")
    spy = BlockingConnection(router.admin_url, timeout=10)
    conn = connect(proxy.port, user("alice"))
    try:
        watcher = spy.create_receiver(secret)
        sender = conn.create_sender(None)
        delivery = sender.send(Message(body="leak", address=f"public.x://h/{secret}"),
                               timeout=10, error_states=[])
        assert delivery.remote_state == delivery.REJECTED
        with pytest.raises(Exception, match="[Tt]imed out"):
            watcher.receive(timeout=1)
    finally:
        conn.close()
        spy.close()


def test_user_pattern_is_matched_on_the_resolved_node(proxy, router):
    victim = unique("alice.d")
    conn = connect(proxy.port, user("mallory"))
    try:
        # ${user}.# written before a ":/" that the router strips: another user's namespace
        assert_link_denied(lambda: conn.create_receiver(f"{user('mallory')}.x:/{victim}"))
        own = f"{user('mallory')}.{unique('inbox')}"
        conn.create_receiver(f"{own}/")
        assert f"M0{own}" in router.link_addresses("out")
    finally:
        conn.close()


@pytest.mark.parametrize("address", ["public.x:/$management", "$management",
                                     "_topo/0/QDR.test/$management", "_local/$management",
                                     "public.x:/_local/anything", "_edge/x"])
def test_router_internal_addresses_need_a_literal_grant(proxy, router, address):
    # mallory's targetPattern "#" matches everything, yet no wildcard grants router internals
    conn = connect(proxy.port, user("mallory"))
    try:
        assert_link_denied(lambda: conn.create_sender(address))
        assert not [a for a in router.link_addresses("in") if "$management" in a]
    finally:
        conn.close()


def test_no_management_create_through_a_pattern_grant(proxy, router):
    """The review's exploit: a CREATE of an unauthenticated listener via a stripped prefix."""
    conn = connect(proxy.port, user("mallory"))
    try:
        assert_link_denied(lambda: conn.create_sender("public.x:/$management"))
    finally:
        conn.close()
    names = [r["name"] for r in router.query("org.apache.qpid.dispatch.listener", ["name"])]
    assert len(names) == 2  # the client listener and the test's admin listener only


def _qdr_tool(router, tool: str, proxy_port: int, *args: str) -> subprocess.CompletedProcess:
    env_vars = qdr.qdr_env()
    assert env_vars is not None
    exe = shutil.which(tool, path=f"{env_vars['QDR_HOME']}/bin")
    assert exe is not None
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": env_vars["QDR_PYTHONPATH"],
           "LD_LIBRARY_PATH": env_vars["QDR_LD_LIBRARY_PATH"]}
    return subprocess.run(
        ["/usr/bin/python3", exe, "-b", f"127.0.0.1:{proxy_port}",
         "--sasl-username", user("admin"), "--sasl-password", "secret", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False)


def test_an_admin_group_naming_management_literally_runs_qdstat_and_qdmanage(proxy, router):
    stat = _qdr_tool(router, "qdstat", proxy.port, "-c")
    assert stat.returncode == 0, stat.stderr
    assert user("admin") in stat.stdout
    manage = _qdr_tool(router, "qdmanage", proxy.port, "query", "--type=listener")
    assert manage.returncode == 0, manage.stderr
    assert str(router.port) in manage.stdout


def test_a_user_without_the_literal_grant_cannot_run_qdstat(proxy, router):
    env_vars = qdr.qdr_env()
    assert env_vars is not None
    stat = subprocess.run(
        ["/usr/bin/python3", f"{env_vars['QDR_HOME']}/bin/qdstat", "-b",
         f"127.0.0.1:{proxy.port}", "--sasl-username", user("mallory"),
         "--sasl-password", "secret", "-c"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": env_vars["QDR_PYTHONPATH"],
             "LD_LIBRARY_PATH": env_vars["QDR_LD_LIBRARY_PATH"]},
        capture_output=True, text=True, timeout=60, check=False)
    assert stat.returncode != 0
    assert "disallowed" in (stat.stderr + stat.stdout)


# -- identities: one identity, one name -----------------------------------------------------

PADDINGS = [" {}", "{}\t", "\v{}\f", "{} \r\n"]


def closes(items) -> list[tuple[str | None, str | None]]:
    return [(i.condition, i.description) for i in items if i.name == "Close"]


@pytest.mark.parametrize("padded", PADDINGS)
def test_the_router_trims_a_padded_plain_authcid(router, padded):
    """The finding itself, straight to the router: Cyrus SASL trims the authcid."""
    with RawClient(router.port) as c:
        assert c.sasl_plain(padded.format(user("mallory"))) == 0


@pytest.mark.parametrize("padded", PADDINGS)
def test_a_padded_plain_authcid_is_refused_under_strict_identity(proxy, router, padded):
    before = router.connection_users()
    with RawClient(proxy.port) as c:
        assert c.sasl_plain(padded.format(user("mallory"))) == 1  # sasl-outcome auth
    assert router.connection_users() == before  # the router never authenticated it


def test_canonical_identity_counts_every_spelling_as_one_user(router):
    with ProxyThread([router.address], policy=POLICY, kind="qdrouterd",
                     identity="canonical") as px:
        name = user("mallory")
        clients = [RawClient(px.port), RawClient(px.port), RawClient(px.port)]
        try:
            got = [c.open("any", user=spelling) for c, spelling in
                   zip(clients, (name, f" {name}", f"{name}\t"), strict=True)]
            # maxConnectionsPerUser 2: the third spelling of the same user is her third
            assert [closes(g) for g in got] == [[], [], [(
                "amqp:resource-limit-exceeded", "connection disallowed by local policy")]]
            users = px.call(lambda: sorted(
                p.conn.view.user for p in px.daemon.connections.values()
                if p.conn and p.conn.view.user and not p.conn.view.finished))
            assert users == [name, name]
            assert router.connection_users().count(name) == 2
        finally:
            for c in clients:
                c.close()


def test_a_padded_name_does_not_escape_its_banned_group(router):
    with ProxyThread([router.address], policy=POLICY, kind="qdrouterd",
                     identity="canonical") as px:
        for name in (user("eve"), f" {user('eve')}", f"{user('eve')}\t"):
            with RawClient(px.port) as c:
                assert closes(c.open("any", user=name)) == [(
                    "amqp:resource-limit-exceeded", "connection disallowed by local policy")]


def test_the_router_records_the_user_the_proxy_decided_on(proxy, router):
    conn = connect(proxy.port, user("bob"))
    try:
        conn.create_receiver(unique("public."))
        deadline = time.monotonic() + 5
        while user("bob") not in router.connection_users():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        seen = proxy.call(lambda: [p.conn.view.user for p in proxy.daemon.connections.values()
                                   if p.conn and p.conn.view.user])
        assert user("bob") in seen
    finally:
        conn.close()


def test_relayed_message_to_a_plain_allowed_address_arrives(proxy, router):
    ok = unique("public.")
    conn = connect(proxy.port, user("alice"))
    try:
        receiver = conn.create_receiver(ok)
        sender = conn.create_sender(None, options=AtMostOnce())
        sender.send(Message(body="fine", address=f"{ok}."))  # the router drops the "."
        assert receiver.receive(timeout=10).body == "fine"
    finally:
        conn.close()
