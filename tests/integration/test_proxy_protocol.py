"""PROXY protocol on listeners (issue 18, part 3): the client's address from a load balancer's
header, everywhere the proxy uses a client address.

Two halves:

* the real HAProxy from Debian in front of the proxy, ``send-proxy`` (v1) and
  ``send-proxy-v2``, with health checks (``check-send-proxy``: v2 sends the ``LOCAL``
  command), plain and TLS listeners. proton clients cannot bind a source address (their IO
  layer creates its sockets unbound), so each client reaches HAProxy through
  :class:`~tests.support.forward.SourceBoundForwarder` from 127.0.0.2 or 127.0.0.3: HAProxy
  sees those addresses and puts them in the header, and ``remoteHosts``,
  ``maxConnectionsPerHost``, the events, the event log and the ledger must see them, never
  HAProxy's 127.0.0.1;
* raw sockets playing the balancer, for what HAProxy never sends: a peer outside
  ``proxy_protocol_from``, no header, malformed, oversize, cut and late headers (each closed
  with nothing written and counted ``reason="proxy_protocol"``), a header split across
  writes, a header and the TLS ClientHello in one segment, IPv6 and ``LOCAL`` headers.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import ConnectionException, Message, SSLDomain
from proton.utils import BlockingConnection

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.performatives import Close, Open
from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionDenied
from amqp_policy_proxy.daemon import proxy_listener
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, ListenerConfig
from amqp_policy_proxy.daemon.snapshots import start_line
from amqp_policy_proxy.eventlog.schema import SCHEMA_VERSION
from amqp_policy_proxy.ingress.proxy_protocol import V2_MAX_LENGTH
from tests.integration.test_tls import Pki
from tests.support import proxy_header as pp
from tests.support.forward import SourceBoundForwarder
from tests.support.haproxy import HAProxy
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import RawClient

pytestmark = pytest.mark.integration
needs_haproxy = pytest.mark.skipif(not HAProxy.available(), reason="haproxy is not installed "
                                   "(scripts/install-system-deps.sh installs it)")

DISALLOWED = ("amqp:resource-limit-exceeded", "connection disallowed by local policy")
BALANCERS = (ipaddress.ip_network("127.0.0.1/32"),)
#: alice may come only from 127.0.0.2, bob only from 127.0.0.3 (or 2001:db8::3), carol only
#: from 127.0.0.1 (the balancer itself); one connection per client address.
POLICY = [["vhost", {
    "hostname": "lb", "aliases": "localhost", "maxConnectionsPerHost": 1,
    "allowUnknownUser": False,
    "groups": {
        "second": {"users": "alice", "remoteHosts": "127.0.0.2", "sources": "*",
                   "targets": "*"},
        "third": {"users": "bob", "remoteHosts": "127.0.0.3, 2001:db8::3", "sources": "*",
                  "targets": "*"},
        "balancer": {"users": "carol", "remoteHosts": "127.0.0.1", "sources": "*",
                     "targets": "*"},
    },
}]]


# ---------------------------------------------------------------------------------- helpers


@pytest.fixture
def policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    pki = Pki(tmp_path_factory.mktemp("pki"))
    pki.ca("ca")
    pki.leaf("ca", "proxy", server=True)
    return pki


def start_proxy(broker_address: tuple[str, int], policy_file: str, tmp_path: Path, *,
                tls: Pki | None = None, handshake_seconds: float = 10.0) -> ProxyThread:
    listener = ListenerConfig(Address("127.0.0.1", 0), proxy_protocol=True,
                              proxy_protocol_from=BALANCERS)
    if tls is not None:
        listener = replace(listener, tls_cert=str(tls.dir / "proxy.crt"),
                           tls_key=str(tls.dir / "proxy.key"))
    proxy = ProxyThread([broker_address], policy_path=policy_file, metrics=True,
                        event_log_dir=str(tmp_path / "events"),
                        handshake_seconds=handshake_seconds,
                        config=DaemonConfig(listeners=(listener,)))
    return proxy.start()


@pytest.fixture
def proxy(broker_address: tuple[str, int], policy_file: str,
          tmp_path: Path) -> Iterator[ProxyThread]:
    p = start_proxy(broker_address, policy_file, tmp_path)
    yield p
    p.stop()


@pytest.fixture
def via() -> Iterator:
    made: list[SourceBoundForwarder] = []

    def make(port: int, source: str) -> SourceBoundForwarder:
        f = SourceBoundForwarder(("127.0.0.1", port), source).start()
        made.append(f)
        return f

    yield make
    for f in made:
        f.stop()


def connect(port: int, user: str, *, ssl_domain: SSLDomain | None = None,
            timeout: float = 10) -> BlockingConnection:
    scheme = "amqps" if ssl_domain is not None else "amqp"
    return BlockingConnection(f"{scheme}://127.0.0.1:{port}", timeout=timeout,
                              virtual_host="localhost" if ssl_domain else "lb",
                              user=user, password="secret", allowed_mechs="PLAIN",
                              allow_insecure_mechs=True, ssl_domain=ssl_domain)


def denied_condition(port: int, user: str, **kwargs) -> tuple[str, str]:
    with pytest.raises(ConnectionException) as info:
        connect(port, user, **kwargs).close()
    match = re.fullmatch(r"Connection \S+ closed due to: Condition\('([^']*)', '([^']*)'\)",
                         str(info.value))
    assert match, str(info.value)
    return match.group(1), match.group(2)


def wait_for(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def denials(proxy: ProxyThread) -> list[ConnectionDenied]:
    return [e for e in proxy.events_of(ConnectionDenied) if e.reason == "proxy_protocol"]


def denied_metric(proxy: ProxyThread) -> float:
    proxy.call(proxy.daemon.publish_now)
    text = urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics",
                                  timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if (s.name == "amqp_proxy_connections_denied_total"
                    and s.labels == {"vhost": "", "reason": "proxy_protocol"}):
                return s.value
    return 0.0


def event_log(proxy: ProxyThread) -> list[dict]:
    root = Path(proxy.config.event_log_dir or "")
    return [json.loads(line) for f in sorted(root.rglob("*.jsonl"))
            for line in f.read_text().splitlines()]


def event_log_when(proxy: ProxyThread, opened: int) -> list[dict]:
    """The event log once it holds ``opened`` connection_opened records (the writer thread
    writes within about 20 ms)."""
    records: list[dict] = []

    def enough() -> bool:
        records[:] = event_log(proxy)
        return sum(r["event"] == "connection_opened" for r in records) >= opened

    assert wait_for(enough), records
    return records


def refused_with_nothing_written(client: RawClient, timeout: float = 5.0) -> bool:
    """The proxy closed the socket without writing a byte (EOF or reset)."""
    client.read_until_closed(timeout)
    return client.closed and not client.raw


# ---------------------------------------------------------------------------------- HAProxy


@needs_haproxy
@pytest.mark.parametrize("send_proxy", ["send-proxy", "send-proxy-v2"])
def test_remote_hosts_and_per_host_limits_see_the_clients_behind_haproxy(
        proxy: ProxyThread, via, send_proxy: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy")
    with HAProxy(("127.0.0.1", proxy.port), send_proxy=send_proxy, health_check=True) as lb:
        from2, from3 = via(lb.port, "127.0.0.2"), via(lb.port, "127.0.0.3")
        alice = connect(from2.port, "alice")  # remoteHosts 127.0.0.2: admitted
        alice.create_sender("q").send(Message(body="through the balancer"))
        # bob is allowed from 127.0.0.3 only; carol (allowed from the balancer's own
        # 127.0.0.1) is refused from 127.0.0.2: the proxy judges the header's address
        assert denied_condition(from2.port, "bob") == DISALLOWED
        assert denied_condition(from2.port, "carol") == DISALLOWED
        # maxConnectionsPerHost 1 counts per client: 127.0.0.3 still has room, 127.0.0.2 not
        bob = connect(from3.port, "bob")
        assert denied_condition(from2.port, "alice") == DISALLOWED
        ledger = proxy.daemon.ledger
        assert (ledger.host_active("lb", "127.0.0.2"), ledger.host_active("lb", "127.0.0.3"),
                ledger.host_active("lb", "127.0.0.1")) == (1, 1, 0)
        # HAProxy's own health checks (the header included) kept the server up
        state = lb.server_state()
        assert state["status"] == "UP" and state["chkfail"] == "0", state
        alice.close()
        bob.close()

    approved = proxy.events_of(ConnectionApproved)
    assert sorted((e.user, e.remote_host, e.balancer_host) for e in approved) == [
        ("alice", "127.0.0.2", "127.0.0.1"), ("bob", "127.0.0.3", "127.0.0.1")]
    refused = sorted((e.user, e.remote_host, e.reason)
                     for e in proxy.events_of(ConnectionDenied))
    assert refused == [("alice", "127.0.0.2", "host_limit"), ("bob", "127.0.0.2", "remote_host"),
                       ("carol", "127.0.0.2", "remote_host")]
    assert not denials(proxy) and denied_metric(proxy) == 0
    # the log lines name the client, not HAProxy
    denied_lines = [r.getMessage() for r in caplog.records if "DENY AMQP Open" in r.getMessage()]
    assert sorted(re.sub(r"^\[\S+\] ", "", m) for m in denied_lines) == [
        "DENY AMQP Open for user 'alice', rhost '127.0.0.2', vhost 'lb': host_limit",
        "DENY AMQP Open for user 'bob', rhost '127.0.0.2', vhost 'lb': User is not allowed to "
        "connect from this network host",
        "DENY AMQP Open for user 'carol', rhost '127.0.0.2', vhost 'lb': User is not allowed to "
        "connect from this network host",
    ], denied_lines
    assert wait_for(lambda: proxy.daemon.ledger.host_active("lb", "127.0.0.2") == 0)
    opened = [r for r in event_log_when(proxy, 2) if r["event"] == "connection_opened"]
    assert sorted((r["user"], r["remote_host"], r["balancer_host"], r["schema_version"])
                  for r in opened) == [("alice", "127.0.0.2", "127.0.0.1", SCHEMA_VERSION),
                                       ("bob", "127.0.0.3", "127.0.0.1", SCHEMA_VERSION)]


@needs_haproxy
def test_health_checks_send_local_and_proceed_with_the_balancers_address(
        proxy: ProxyThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=proxy_listener.__name__)
    with HAProxy(("127.0.0.1", proxy.port), send_proxy="send-proxy-v2",
                 health_check=True) as lb:
        assert wait_for(lambda: int(lb.server_state()["chkfail"] or 0) == 0
                        and "PROXY v2 LOCAL" in caplog.text, timeout=5)
        time.sleep(0.5)  # a few more checks, every 200 ms
        state = lb.server_state()
    assert state["status"] == "UP" and state["chkfail"] == "0", state
    local = [r.getMessage() for r in caplog.records if "PROXY v2 LOCAL" in r.getMessage()]
    assert len(local) >= 2 and all(m.endswith("client 127.0.0.1") for m in local), local
    assert not denials(proxy)


@needs_haproxy
def test_tls_listener_reads_the_header_before_the_handshake(
        broker_address: tuple[str, int], policy_file: str, tmp_path: Path, pki: Pki,
        via) -> None:
    proxy = start_proxy(broker_address, policy_file, tmp_path, tls=pki)
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.dir / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(pki.dir / "ca.pem"))
    try:
        with HAProxy(("127.0.0.1", proxy.port), send_proxy="send-proxy-v2") as lb:
            from2 = via(lb.port, "127.0.0.2")
            conn = connect(from2.port, "alice", ssl_domain=domain)
            receiver = conn.create_receiver("tls.q")
            conn.create_sender("tls.q").send(Message(body="over TLS, behind HAProxy"))
            assert receiver.receive(timeout=10).body == "over TLS, behind HAProxy"
            receiver.accept()
            assert denied_condition(from2.port, "bob", ssl_domain=domain) == DISALLOWED
            conn.close()
        approved = proxy.events_of(ConnectionApproved)
        assert [(e.user, e.remote_host, e.balancer_host) for e in approved] == [
            ("alice", "127.0.0.2", "127.0.0.1")]
    finally:
        proxy.stop()


# ---------------------------------------------------------------------------------- refusals


@needs_haproxy
def test_a_header_from_a_peer_outside_proxy_protocol_from_is_refused(
        proxy: ProxyThread) -> None:
    # a valid header, and a whole client behind it, from 127.0.0.9: not a balancer
    with RawClient(proxy.port, source="127.0.0.9") as client:
        client.send(pp.v2("127.0.0.2", "127.0.0.1", 40000, proxy.port), C.SASL_HEADER)
        assert refused_with_nothing_written(client)
    # ... also when HAProxy itself connects from there
    with HAProxy(("127.0.0.1", proxy.port), send_proxy="send-proxy-v2",
                 source="127.0.0.9") as lb, pytest.raises(ConnectionException):
        connect(lb.port, "alice", timeout=5)
    assert wait_for(lambda: len(denials(proxy)) >= 2)
    assert {(e.remote_host, e.description) for e in denials(proxy)} == {
        ("127.0.0.9", "the peer is not in proxy_protocol_from")}
    assert all(e.balancer_host is None and e.condition == "" for e in denials(proxy))
    assert denied_metric(proxy) == len(denials(proxy))
    assert not proxy.events_of(ConnectionApproved)


def test_a_client_without_a_header_is_refused_with_nothing_written(
        proxy: ProxyThread) -> None:
    with RawClient(proxy.port) as client:  # from 127.0.0.1, a balancer's address
        client.send(C.SASL_HEADER)
        assert refused_with_nothing_written(client)
    with pytest.raises(ConnectionException):  # a real client, straight to the proxy
        connect(proxy.port, "carol", timeout=5)
    assert wait_for(lambda: len(denials(proxy)) == 2)
    assert all(e.description.startswith("no PROXY header: the stream begins with b'AMQP")
               and e.remote_host == "127.0.0.1" for e in denials(proxy)), denials(proxy)
    assert denied_metric(proxy) == 2


@pytest.mark.parametrize(("data", "why"), [
    (b"PROXY TCP4 127.0.0.2 127.0.0.1 40000 5672\n", "LF without CR"),
    (b"PROXY TCP4 127.0.0.02 127.0.0.1 40000 5672\r\n", "not a canonical IPv4 address"),
    (b"PROXY TCP4 127.0.0.2 127.0.0.1 40000 5672" + b" " * 70 + b"\r\n", "without CRLF"),
    (pp.v2("127.0.0.2")[:12] + b"\x31\x11\x00\x0c" + b"\x00" * 12, "version 3"),
    (pp.v2(family=0x11, block=b"\x00" * V2_MAX_LENGTH), "over the 4096 accepted"),
    (pp.v2(family=0x11, block=b"\x00" * 8), "8-byte address block, 12 needed"),
])
def test_a_malformed_or_oversize_header_is_refused(proxy: ProxyThread, data: bytes,
                                                   why: str) -> None:
    with RawClient(proxy.port) as client:
        client.send(data, C.SASL_HEADER)
        assert refused_with_nothing_written(client)
    assert wait_for(lambda: len(denials(proxy)) == 1)
    assert why in denials(proxy)[0].description
    assert denied_metric(proxy) == 1


def test_a_header_cut_short_or_late_is_refused(broker_address: tuple[str, int],
                                               policy_file: str, tmp_path: Path) -> None:
    proxy = start_proxy(broker_address, policy_file, tmp_path, handshake_seconds=0.5)
    try:
        with RawClient(proxy.port) as cut:
            cut.send(pp.v2("127.0.0.2")[:20])
            cut.sock.shutdown(socket.SHUT_WR)
            assert refused_with_nothing_written(cut)
        with RawClient(proxy.port) as silent, RawClient(proxy.port) as slow:
            slow.send(b"PROXY TCP4 127.0.0.2")
            started = time.monotonic()
            assert refused_with_nothing_written(silent) and refused_with_nothing_written(slow)
            assert 0.3 < time.monotonic() - started < 3
        assert wait_for(lambda: len(denials(proxy)) == 3)
        assert sorted(e.description for e in denials(proxy)) == [
            "closed before a complete PROXY header", "no complete PROXY header within 0.5 s",
            "no complete PROXY header within 0.5 s"]
        assert denied_metric(proxy) == 3
    finally:
        proxy.stop()


# ---------------------------------------------------------------------------------- accepted


def admitted_as(client: RawClient, user: str) -> tuple[str, str] | None:
    """Run SASL and Open as ``user`` on vhost lb; None when admitted, else the Close's
    condition and description."""
    items = client.open("lb", user=user)
    closes = [i for i in items if isinstance(i.perf, Close)]
    assert any(isinstance(i.perf, Open) for i in items), items
    return (closes[0].condition, closes[0].description) if closes else None


@pytest.mark.parametrize("header", [
    pp.v1("127.0.0.2", "127.0.0.1", 40000, 5672),
    pp.v2("127.0.0.2", "127.0.0.1", 40000, 5672, tlvs=pp.tlv(0x05, b"id-1")),
    pp.v1("::ffff:127.0.0.2", "::1", 40000, 5672),  # a dual-stack balancer's IPv4 client
], ids=["v1", "v2", "v1-mapped"])
def test_the_header_address_is_the_client_address(proxy: ProxyThread, header: bytes) -> None:
    with RawClient(proxy.port) as client:
        client.send(header)
        assert admitted_as(client, "alice") is None
    (approved,) = proxy.events_of(ConnectionApproved)
    assert (approved.remote_host, approved.balancer_host) == ("127.0.0.2", "127.0.0.1")


def test_an_ipv6_client_behind_an_ipv4_balancer(proxy: ProxyThread) -> None:
    with RawClient(proxy.port) as client:
        client.send(pp.v2("2001:db8::3", "2001:db8::1", 40000, 5671))
        assert admitted_as(client, "bob") is None
    with RawClient(proxy.port) as client:
        client.send(pp.v1("2001:db8::4", "2001:db8::1", 40000, 5671))
        assert admitted_as(client, "bob") == DISALLOWED
    assert [e.remote_host for e in proxy.events_of(ConnectionApproved)] == ["2001:db8::3"]


@pytest.mark.parametrize("header", [pp.v2(command=0), pp.v1_unknown(),
                                    pp.v2(family=0x31, block=b"/run/lb.sock".ljust(216, b"\0"))],
                         ids=["v2-local", "v1-unknown", "v2-unix"])
def test_local_and_unknown_headers_use_the_balancers_address(proxy: ProxyThread,
                                                             header: bytes) -> None:
    with RawClient(proxy.port) as client:
        client.send(header)
        assert admitted_as(client, "carol") is None  # carol: from 127.0.0.1 only
    with RawClient(proxy.port) as client:
        client.send(header)
        assert admitted_as(client, "alice") == DISALLOWED
    approved = proxy.events_of(ConnectionApproved)
    assert [(e.remote_host, e.balancer_host) for e in approved] == [("127.0.0.1", "127.0.0.1")]


def test_a_header_split_across_writes_and_one_sent_with_the_amqp_header(
        proxy: ProxyThread) -> None:
    header = pp.v2("127.0.0.2", "127.0.0.1", 1, 2, tlvs=pp.tlv(0x02, b"broker.example"))
    with RawClient(proxy.port) as split:
        for piece in (header[:5], header[5:16], header[16:30], header[30:]):
            split.send(piece)
            time.sleep(0.05)
        assert admitted_as(split, "alice") is None
    assert wait_for(lambda: proxy.daemon.ledger.host_active("lb", "127.0.0.2") == 0)
    with RawClient(proxy.port) as together:
        together.send(pp.v1("127.0.0.2", "127.0.0.1", 1, 2), C.SASL_HEADER)
        got = together.read_until(lambda i: i.name == "header")
        assert got and together.raw.startswith(C.SASL_HEADER)  # the core had the header
    assert not denials(proxy)


def test_tls_after_a_header_in_the_same_segment(broker_address: tuple[str, int],
                                                policy_file: str, tmp_path: Path,
                                                pki: Pki) -> None:
    """The ClientHello sent in the same write as the header reaches TLS whole."""
    proxy = start_proxy(broker_address, policy_file, tmp_path, tls=pki)
    try:
        ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        sock.sendall(pp.v1("127.0.0.2", "127.0.0.1", 1, 2) + outgoing.read())
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if data := outgoing.read():
                    sock.sendall(data)
                chunk = sock.recv(65536)
                assert chunk, "the proxy closed during the TLS handshake"
                incoming.write(chunk)
        if data := outgoing.read():
            sock.sendall(data)
        tls.write(C.SASL_HEADER)
        sock.sendall(outgoing.read())
        received = b""
        while len(received) < 8:
            try:
                received += tls.read(8)
            except ssl.SSLWantReadError:
                incoming.write(sock.recv(65536))
        assert received[:8] == C.SASL_HEADER  # the router's answer, through TLS
        sock.close()
        assert not denials(proxy)
    finally:
        proxy.stop()


def test_sockets_waiting_for_their_header_are_bounded(proxy: ProxyThread,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_PENDING sockets without a complete header the listener stops accepting; it
    accepts again when one of them ends."""
    monkeypatch.setattr(proxy_listener, "MAX_PENDING", 1)
    with RawClient(proxy.port) as silent:
        time.sleep(0.2)  # accepted, waiting for its header
        with RawClient(proxy.port) as next_one:  # completes in the kernel's backlog
            next_one.send(pp.v1("127.0.0.2", "127.0.0.1", 1, 2), C.SASL_HEADER)
            assert next_one.read_for(0.5) == [] and not next_one.raw  # not accepted yet
            silent.sock.shutdown(socket.SHUT_WR)  # the waiting one ends (refused)
            next_one.read_until(lambda i: i.name == "header")
            assert next_one.raw.startswith(C.SASL_HEADER)
    assert [e.description for e in denials(proxy)] == ["closed without sending a PROXY header"]


# ---------------------------------------------------------------------------------- the guide


@needs_haproxy
def test_the_guides_haproxy_example_runs_in_front_of_the_proxy(proxy: ProxyThread,
                                                               via) -> None:
    """docs/deploy.md 10.2, the HAProxy configuration as printed, with its two proxies and its
    port replaced by this test's proxy and a free port, ``maxconn`` within this machine's
    file descriptor limit, checks every 200 ms, and an admin socket added."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    (example,) = re.findall(r"<!-- haproxy-example -->\n```haproxy\n(.*?)```", doc, re.S)

    class Documented(HAProxy):
        def config_text(self) -> str:
            text = example.replace("bind :5672", f"bind 127.0.0.1:{self.port}")
            text = text.replace("10.0.1.5:5672", f"127.0.0.1:{proxy.port}")
            text = text.replace("10.0.1.6:5672", f"127.0.0.1:{proxy.port}")
            text = text.replace("inter 2s", "inter 200ms")  # the same checks, sooner
            text = text.replace("maxconn 20000", f"maxconn {self.maxconn}")
            return text.replace("global\n", f"global\n    stats socket {self._workdir}/"
                                            "admin.sock mode 600 level admin\n", 1)

    with Documented(("127.0.0.1", proxy.port)) as lb:
        from3 = via(lb.port, "127.0.0.3")
        connect(from3.port, "bob").close()  # admitted: bob may come only from 127.0.0.3
        time.sleep(0.5)  # a few health checks
        states = [lb.server_state("amqp_proxies", name) for name in ("proxy-1", "proxy-2")]
    assert all(s["status"] == "UP" and s["chkfail"] == "0" for s in states), states
    assert [(e.user, e.remote_host) for e in proxy.events_of(ConnectionApproved)] == [
        ("bob", "127.0.0.3")]
    assert not denials(proxy)


def test_the_guides_listener_example_is_valid() -> None:
    """docs/deploy.md 10.1: the [[listener]] table as printed."""
    import tomllib

    from amqp_policy_proxy.daemon.config import config_from_mapping

    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    section = doc.split("### 10.1 The listener", 1)[1]
    (toml,) = re.findall(r"```toml\n(.*?)```", section.split("###", 1)[0], re.S)
    raw = tomllib.loads(toml) | {"upstream": [{"address": "127.0.0.1:5673"}],
                                 "policy": {"path": "/nonexistent"}}
    (listener,) = config_from_mapping(raw, check_files=False).listeners
    assert listener.proxy_protocol and [str(n) for n in listener.proxy_protocol_from] == [
        "10.0.0.2/32", "10.0.0.3/32"]


def test_the_start_line_marks_the_listener(proxy: ProxyThread) -> None:
    line, fields = start_line(proxy.daemon)
    assert f"listening on 127.0.0.1:{proxy.port} (PROXY protocol);" in line
    assert fields["listeners"] == [f"127.0.0.1:{proxy.port} (PROXY protocol)"]
