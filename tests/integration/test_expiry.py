"""Connections that end on their own: a group's ``maxConnectionLifetimeSeconds`` and the
client certificate a connection authenticated with (SASL EXTERNAL) expiring.

A proton client in a group with a lifetime of 2 s is closed with ``amqp:connection:forced``
between 1.8 and 2 s after it opened; a raw TLS client authenticated by SASL EXTERNAL with a
certificate valid for 3 more seconds is closed with ``amqp:unauthorized-access`` within a
second of the certificate's notAfter, while its TLS session and AMQP connection are healthy.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from proton import ConnectionException
from proton.utils import BlockingConnection

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.events import ConnectionClosed
from amqp_policy_proxy.daemon.config import Address, DaemonConfig, ListenerConfig
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import FrameParser, Open, RawUpstream, SaslInit, frame

pytestmark = pytest.mark.integration


def wait_closed(proxy: ProxyThread, timeout: float = 5.0) -> list[ConnectionClosed]:
    """The proxy's ConnectionClosed events, once there is one (the close lingers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not proxy.events_of(ConnectionClosed):
        time.sleep(0.05)
    return proxy.events_of(ConnectionClosed)


def test_a_connection_ends_at_its_groups_lifetime(broker_address, tmp_path: Path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps([["vhost", {
        "hostname": "life", "groups": {"all": {
            "users": "alice", "remoteHosts": "*", "sources": "*", "targets": "*",
            "maxConnectionLifetimeSeconds": 2}}}]]))
    with ProxyThread([broker_address], policy_path=str(policy)) as proxy:
        conn = BlockingConnection(f"127.0.0.1:{proxy.port}", user="alice", password="secret",
                                  allowed_mechs="PLAIN", allow_insecure_mechs=True,
                                  virtual_host="life", timeout=10)
        opened = time.monotonic()
        with pytest.raises(ConnectionException, match="maximum connection lifetime reached"):
            receiver = conn.create_receiver("life.q")
            receiver.receive(timeout=6)
        lived = time.monotonic() - opened
        assert 1.7 <= lived <= 3.0, lived
        conn.close()
        closed = wait_closed(proxy)
        assert closed and closed[-1].close_reason == "lifetime"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None,
          not_after: datetime.datetime, *, ca: bool = False, server: bool = False):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(_name(subject) if issuer is None else issuer[1].subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after))
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                        critical=True)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost")]), critical=False)
    cert = builder.sign(key if issuer is None else issuer[0], hashes.SHA256())
    return key, cert


def _write(directory: Path, name: str, key, cert) -> tuple[Path, Path]:
    crt, k = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return crt, k


def test_an_expiring_client_certificate_ends_an_external_connection(tmp_path: Path):
    day = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    ca = _cert("test-ca", None, day, ca=True)
    ca_crt, _ = _write(tmp_path, "ca", *ca)
    server_crt, server_key = _write(tmp_path, "server", *_cert("localhost", ca, day,
                                                                server=True))
    expires = datetime.datetime.now(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
        seconds=4)
    client_crt, client_key = _write(tmp_path, "client", *_cert("alice", ca, expires))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps([["vhost", {
        "hostname": "certs", "groups": {"all": {
            "users": "CN=alice", "remoteHosts": "*", "sources": "*", "targets": "*"}}}]]))
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(server_crt),
                              tls_key=str(server_key), tls_ca=str(ca_crt),
                              require_client_cert=True)
    with RawUpstream() as upstream, ProxyThread(
            [("127.0.0.1", upstream.port)], policy_path=str(policy),
            config=DaemonConfig(listeners=(listener,))) as proxy:
        ctx = ssl.create_default_context(cafile=str(ca_crt))
        ctx.load_cert_chain(str(client_crt), str(client_key))
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(C.SASL_HEADER + frame(0, SaslInit(mechanism="EXTERNAL",
                                                          initial_response=b""), ftype=1))
            parser = FrameParser()
            items = []
            while not any(i.name == "SaslOutcome" for i in items):
                items.extend(parser.feed(tls.recv(65536)))
            assert [i.perf.code for i in items if i.name == "SaslOutcome"] == [0]
            tls.sendall(C.AMQP_HEADER + frame(0, Open(container_id="c", hostname="certs")))
            closed_at = None
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and closed_at is None:
                tls.settimeout(max(0.1, deadline - time.monotonic()))
                data = tls.recv(65536)
                if not data:
                    break
                items.extend(parser.feed(data))
                if any(i.name == "Close" for i in items):
                    closed_at = datetime.datetime.now(datetime.UTC)
            names = [i.name for i in items]
            assert "Open" in names and "Close" in names, names
            close = [i for i in items if i.name == "Close"][0]
            assert close.condition == "amqp:unauthorized-access", close.description
            assert close.description == "credential expired"
            late = (closed_at - expires).total_seconds()
            assert -0.05 <= late <= 1.0, late
        closed = wait_closed(proxy)
        assert closed and closed[-1].close_reason == "credential_expired"
        assert closed[-1].user == "CN=alice"
