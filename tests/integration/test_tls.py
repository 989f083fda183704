"""TLS at the proxy (docs/configuration.md, listener and upstream TLS keys): amqps listeners, client certificates, TLS to the
upstream, and certificate rotation on SIGHUP.

Certificates are generated per module with ``cryptography`` (EC P-256, one-day validity).
The upstream TLS endpoint is a small asyncio TLS terminator in front of the in-tree broker.
Clients are python-qpid-proton's ``BlockingConnection`` with an ``SSLDomain``; proton checks
DNS names only, so clients dial 127.0.0.1 and verify the name ``localhost`` (also their
Open hostname, which the test policy's ``$default`` vhost accepts).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import shutil
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from proton import ConnectionException, Message, SSLDomain
from proton.utils import BlockingConnection

from amqp_policy_proxy.core.events import ConnectionApproved, UpstreamConnectFailed
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, ListenerConfig, UpstreamConfig
from amqp_policy_proxy.demo.broker import Broker
from tests.support.proxy import ProxyThread

pytestmark = pytest.mark.integration

POLICY = [["vhost", {
    "hostname": "$default", "allowUnknownUser": True, "maxConnections": 100,
    "groups": {"$default": {"remoteHosts": "*", "sources": "*", "targets": "*"}},
}]]


# ------------------------------------------------------------------ certificates

class Pki:
    """Writes CAs and the certificates they sign (PEM) into a directory."""

    def __init__(self, directory: Path) -> None:
        """Use ``directory`` for every file."""
        self.dir = directory
        self._cas: dict[str, tuple[ec.EllipticCurvePrivateKey, x509.Certificate]] = {}

    @staticmethod
    def _name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    @staticmethod
    def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
                 ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def ca(self, name: str) -> Path:
        """Create CA ``name``; return its certificate file."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (self._builder(self._name(name), self._name(name), key)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        self._cas[name] = (key, cert)
        path = self.dir / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def leaf(self, ca: str, cn: str, *, server: bool) -> tuple[Path, Path]:
        """Create a certificate for ``cn`` signed by ``ca``; return (cert file, key file).

        Server certificates carry the names ``localhost`` and ``127.0.0.1``.
        """
        ca_key, ca_cert = self._cas[ca]
        key = ec.generate_private_key(ec.SECP256R1())
        builder = self._builder(self._name(cn), ca_cert.subject, key)
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{cn}.crt", self.dir / f"{cn}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        return cert_path, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Three CAs and the server/client certificates the tests use."""
    pki = Pki(tmp_path_factory.mktemp("pki"))
    for ca in ("ca-one", "ca-two", "ca-rogue"):
        pki.ca(ca)
    pki.leaf("ca-one", "proxy-one", server=True)
    pki.leaf("ca-two", "proxy-two", server=True)
    pki.leaf("ca-one", "client-one", server=False)
    pki.leaf("ca-two", "client-two", server=False)
    pki.leaf("ca-rogue", "client-rogue", server=False)
    pki.leaf("ca-one", "router", server=True)
    pki.leaf("ca-two", "proxy-as-client", server=False)
    return pki


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """An in-tree broker (ANONYMOUS) for this module."""
    # our own broker (ANONYMOUS only): these tests need no SASL users
    b = Broker().start()
    yield b
    b.stop()


@pytest.fixture
def policy_file(tmp_path: Path) -> str:
    """A policy admitting everyone to ``$default``; returns its path."""
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    return str(path)


# ------------------------------------------------------------------ helpers

def domain(ca: Path, client: str | None = None, pki: Pki | None = None) -> SSLDomain:
    """A proton client SSL domain trusting ``ca``, optionally presenting ``client``'s cert."""
    d = SSLDomain(SSLDomain.MODE_CLIENT)
    d.set_trusted_ca_db(str(ca))
    d.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, str(ca))
    if client is not None:
        assert pki is not None
        d.set_credentials(str(pki.dir / f"{client}.crt"), str(pki.dir / f"{client}.key"), None)
    return d


def amqps(port: int, ssl_domain: SSLDomain) -> BlockingConnection:
    """An amqps connection to the proxy on 127.0.0.1, verifying the name ``localhost``."""
    return BlockingConnection(f"amqps://127.0.0.1:{port}", ssl_domain=ssl_domain,
                              virtual_host="localhost", allowed_mechs="ANONYMOUS", timeout=10)


def round_trip(conn: BlockingConnection, address: str, body: str) -> str:
    """Send ``body`` to ``address`` and receive it back on the same connection."""
    tag = uuid.uuid4().hex[:8]
    sender = conn.create_sender(address, name=f"snd-{tag}")
    sender.send(Message(body=body))
    sender.close()
    receiver = conn.create_receiver(address, name=f"rcv-{tag}")
    msg = receiver.receive(timeout=10)
    receiver.accept()
    receiver.close()
    return str(msg.body)


def served_certificate_cn(port: int, ca: Path) -> str:
    """Handshake with the listener (stdlib ssl, no client cert) and return the server's CN."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def tls_proxy(broker_address: tuple[str, int], policy_file: str, listener: ListenerConfig,
              **kwargs: object) -> ProxyThread:
    """A proxy (not started) with one TLS ``listener`` in front of the broker."""
    config = DaemonConfig(listeners=(listener,))
    return ProxyThread([broker_address], policy_path=policy_file, config=config,
                       **kwargs)  # type: ignore[arg-type]


class TlsTerminator:
    """A TLS server on 127.0.0.1 relaying each connection to a plain TCP target.

    Stands in for a router with TLS enabled; requires a client certificate signed by
    ``client_ca`` and records the CN of each one.
    """

    def __init__(self, target: tuple[str, int], cert: Path, key: Path, client_ca: Path) -> None:
        """Configure; :meth:`start` binds."""
        self.target = target
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(cert), str(key))
        self.ctx.load_verify_locations(str(client_ca))
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.client_cns: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="tls-terminator", daemon=True)
        self._stop: asyncio.Event | None = None

    def start(self) -> TlsTerminator:
        """Start the thread and wait for the listening socket."""
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _main(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tasks.add(asyncio.current_task())  # type: ignore[arg-type]
            peer = writer.get_extra_info("peercert") or {}
            self.client_cns += [v for rdn in peer.get("subject", ()) for k, v in rdn
                                if k == "commonName"]
            up_reader, up_writer = await asyncio.open_connection(*self.target)

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, ssl.SSLError):
                    pass
                finally:
                    dst.close()

            try:
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            except asyncio.CancelledError:
                writer.close()
                up_writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=self.ctx)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ------------------------------------------------------------------ tests

def test_amqps_client_through_the_proxy(pki: Pki, broker, policy_file: str) -> None:
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(pki.dir / "proxy-one.crt"),
                              tls_key=str(pki.dir / "proxy-one.key"))
    with tls_proxy(broker.address, policy_file, listener) as proxy:
        conn = amqps(proxy.port, domain(pki.dir / "ca-one.pem"))
        try:
            assert round_trip(conn, "tls.amqps", "over TLS") == "over TLS"
        finally:
            conn.close()
        # TLS from the first byte: a plain AMQP client on the amqps port gets nowhere
        with pytest.raises(ConnectionException):
            BlockingConnection(f"127.0.0.1:{proxy.port}", allowed_mechs="ANONYMOUS",
                               timeout=5).close()
        # and a client that does not trust the proxy's CA refuses the proxy
        with pytest.raises(ConnectionException, match="certificate verify failed"):
            amqps(proxy.port, domain(pki.dir / "ca-two.pem")).close()
        assert len(proxy.events_of(ConnectionApproved)) == 1


def test_client_certificate_required(pki: Pki, broker, policy_file: str) -> None:
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(pki.dir / "proxy-one.crt"),
                              tls_key=str(pki.dir / "proxy-one.key"),
                              tls_ca=str(pki.dir / "ca-one.pem"), require_client_cert=True)
    ca = pki.dir / "ca-one.pem"
    with tls_proxy(broker.address, policy_file, listener) as proxy:
        opened_before = len(broker.open_hostnames)
        conn = amqps(proxy.port, domain(ca, "client-one", pki))
        try:
            assert round_trip(conn, "tls.mutual", "verified") == "verified"
        finally:
            conn.close()
        for client in (None, "client-rogue"):  # no certificate; one from an unknown CA
            with pytest.raises(ConnectionException, match="SSL Failure"):
                amqps(proxy.port, domain(ca, client, pki)).close()
        # the rejected clients never reached policy or the broker
        assert len(proxy.events_of(ConnectionApproved)) == 1
        assert len(broker.open_hostnames) == opened_before + 1


def test_tls_to_the_upstream(pki: Pki, broker, policy_file: str) -> None:
    terminator = TlsTerminator(broker.address, pki.dir / "router.crt", pki.dir / "router.key",
                               client_ca=pki.dir / "ca-two.pem").start()
    try:
        upstream = UpstreamConfig(Address("127.0.0.1", terminator.port), tls=True,
                                  tls_ca=str(pki.dir / "ca-one.pem"),
                                  tls_cert=str(pki.dir / "proxy-as-client.crt"),
                                  tls_key=str(pki.dir / "proxy-as-client.key"),
                                  tls_server_name="localhost")
        config = DaemonConfig(upstreams=(upstream,))
        with ProxyThread([], policy_path=policy_file, config=config) as proxy:
            for i in range(2):
                conn = BlockingConnection(f"127.0.0.1:{proxy.port}", allowed_mechs="ANONYMOUS",
                                          timeout=10)
                try:
                    assert round_trip(conn, "tls.upstream", f"m{i}") == f"m{i}"
                finally:
                    conn.close()
                if i == 0:  # new connections use the rebuilt client context after a reload
                    before = proxy.daemon.upstream_ssl_context(upstream)
                    assert proxy.reload()
                    assert proxy.daemon.upstream_ssl_context(upstream) is not before
        # every connection to it (the two clients' and the readiness probes') showed the
        # proxy's client certificate
        seen = len(terminator.client_cns)
        assert seen >= 2 and set(terminator.client_cns) == {"proxy-as-client"}

        # an upstream whose certificate does not verify is an upstream connect failure
        wrong = replace(upstream, tls_ca=str(pki.dir / "ca-rogue.pem"))
        with ProxyThread([], policy_path=policy_file,
                         config=DaemonConfig(upstreams=(wrong,))) as proxy:
            # nobody can authenticate the client: SASL fails (sys-temp), nothing is admitted
            with pytest.raises(ConnectionException, match="Authentication failed"):
                BlockingConnection(f"127.0.0.1:{proxy.port}", allowed_mechs="ANONYMOUS",
                                   timeout=10).close()
            # the readiness probe met the failing handshake first: the upstream is known down
            # (a client arriving then is answered at once), or the client's connect met it
            assert proxy.daemon.upstream_health.known(wrong) is False or [
                e.upstream for e in proxy.events_of(UpstreamConnectFailed)] == [
                f"127.0.0.1:{terminator.port}"]
        assert len(terminator.client_cns) == seen  # nothing got through with the wrong CA
    finally:
        terminator.stop()


def test_certificates_reload_on_sighup(pki: Pki, broker, policy_file: str,
                                       tmp_path: Path) -> None:
    live = tmp_path / "tls"
    live.mkdir()

    def install(server: str, client_ca: str) -> None:
        shutil.copy(pki.dir / f"{server}.crt", live / "server.crt")
        shutil.copy(pki.dir / f"{server}.key", live / "server.key")
        shutil.copy(pki.dir / f"{client_ca}.pem", live / "clients.pem")

    install("proxy-one", "ca-one")
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(live / "server.crt"),
                              tls_key=str(live / "server.key"),
                              tls_ca=str(live / "clients.pem"), require_client_cert=True)
    with tls_proxy(broker.address, policy_file, listener) as proxy:
        old = amqps(proxy.port, domain(pki.dir / "ca-one.pem", "client-one", pki))
        try:
            assert round_trip(old, "tls.rotate", "before") == "before"
            assert served_certificate_cn_with_client(proxy.port, pki, "one") == "proxy-one"

            install("proxy-two", "ca-two")  # rotate: new chain, key and client CA
            assert proxy.reload()
            assert served_certificate_cn_with_client(proxy.port, pki, "two") == "proxy-two"
            new = amqps(proxy.port, domain(pki.dir / "ca-two.pem", "client-two", pki))
            try:
                assert round_trip(new, "tls.rotate", "after") == "after"
            finally:
                new.close()
            # clients of the old CA are refused from now on ...
            with pytest.raises(ConnectionException, match="SSL Failure"):
                amqps(proxy.port, domain(pki.dir / "ca-two.pem", "client-one", pki)).close()
            # ... but the connection made before the rotation is untouched
            assert round_trip(old, "tls.rotate", "still here") == "still here"

            # a broken key: the reload keeps the current certificates and says so
            (live / "server.key").write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n")
            assert proxy.reload()  # the policy part still succeeds
            assert proxy.daemon.tls_reload_failures == 1
            assert served_certificate_cn_with_client(proxy.port, pki, "two") == "proxy-two"
        finally:
            old.close()


def served_certificate_cn_with_client(port: int, pki: Pki, which: str) -> str:
    """Like :func:`served_certificate_cn`, presenting ``client-<which>`` (signed by ca-<which>)."""
    ctx = ssl.create_default_context(cafile=str(pki.dir / f"ca-{which}.pem"))
    ctx.load_cert_chain(str(pki.dir / f"client-{which}.crt"), str(pki.dir / f"client-{which}.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_listener_without_client_ca_serves_any_client(pki: Pki, broker, policy_file: str) -> None:
    # no tls_ca: client certificates are neither requested nor checked
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(pki.dir / "proxy-one.crt"),
                              tls_key=str(pki.dir / "proxy-one.key"))
    with tls_proxy(broker.address, policy_file, listener) as proxy:
        assert served_certificate_cn(proxy.port, pki.dir / "ca-one.pem") == "proxy-one"
        conn = amqps(proxy.port, domain(pki.dir / "ca-one.pem", "client-rogue", pki))
        try:
            assert round_trip(conn, "tls.any", "ok") == "ok"
        finally:
            conn.close()
