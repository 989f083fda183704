"""End to end: DDS Security permissions documents (docs/dds-permissions.md, model 4) through a proxy.

A signed document (S/MIME, signed by a test permissions CA) governs the vhost ``dds``: grants
matched by user name over SASL PLAIN and by the TLS client certificate's subject on an amqps
listener with client authentication, rules in document order, a validity window, and a
tampered document refused by ``check`` and by a reload (the running policy stays).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from proton import Message
from proton.utils import LinkDetached

from amqp_policy_proxy.daemon.config import Address, DaemonConfig, ListenerConfig
from amqp_policy_proxy.policy.load import load_policy
from tests.integration.test_proxy_e2e import connect
from tests.integration.test_tls import Pki, amqps, domain
from tests.support.dds import make_ca, sign_permissions, tamper
from tests.support.proxy import ProxyThread

pytestmark = pytest.mark.integration

DOCUMENT = """<?xml version="1.0" encoding="UTF-8"?>
<dds>
  <permissions>
    <grant name="alice">
      <subject_name>CN=alice,O=Example</subject_name>
      <validity><not_before>2020-01-01T00:00:00</not_before>
                <not_after>2099-01-01T00:00:00</not_after></validity>
      <deny_rule>
        <domains><id>0</id></domains>
        <subscribe><topics><topic>sensors/secret</topic></topics></subscribe>
      </deny_rule>
      <allow_rule>
        <domains><id>0</id></domains>
        <publish><topics><topic>sensors/*</topic></topics></publish>
        <subscribe><topics><topic>sensors/*</topic></topics></subscribe>
      </allow_rule>
      <default>DENY</default>
    </grant>
    <grant name="bob-expired">
      <subject_name>CN=bob</subject_name>
      <validity><not_before>2000-01-01T00:00:00</not_before>
                <not_after>2001-01-01T00:00:00</not_after></validity>
      <default>ALLOW</default>
    </grant>
    <grant name="device">
      <subject_name>CN=client-one</subject_name>
      <validity><not_before>2020-01-01T00:00:00</not_before>
                <not_after>2099-01-01T00:00:00</not_after></validity>
      <allow_rule>
        <domains><id>0</id></domains>
        <publish><topics><topic>telemetry/*</topic></topics></publish>
      </allow_rule>
      <default>DENY</default>
    </grant>
  </permissions>
</dds>
"""


def write_policy(directory: Path, document: str) -> Path:
    """A policy whose vhost ``dds`` (alias ``localhost``) uses the document, relative paths."""
    policy = [["vhost", {
        "hostname": "dds", "aliases": "localhost", "allowUnknownUser": True,
        "permissionsDocument": document, "permissionsCa": "ca.pem",
        "groups": {"$default": {"remoteHosts": "*", "sources": "*", "targets": "*"}},
    }]]
    path = directory / "policy.json"
    path.write_text(json.dumps(policy))
    return path


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    """A directory with ca.pem, a signed permissions.p7s and a policy.json using them."""
    ca_cert, ca_key = make_ca(tmp_path)
    (tmp_path / "ca.pem").write_bytes(Path(ca_cert).read_bytes())
    sign_permissions(DOCUMENT, ca_cert, ca_key, tmp_path / "permissions.p7s")
    write_policy(tmp_path, "permissions.p7s")
    return tmp_path


def assert_link_denied(make) -> None:
    with pytest.raises(LinkDetached) as info:
        make()
    assert "amqp:unauthorized-access" in str(info.value)


def test_user_name_grants_rules_in_order_and_validity(broker_address, signed: Path) -> None:
    with ProxyThread([broker_address], policy_path=str(signed / "policy.json")) as proxy:
        c = connect(proxy.port, "alice", vhost="dds")
        c.create_sender("sensors/temp").send(Message(body="21.5"))
        c.create_receiver("sensors/temp")
        assert_link_denied(lambda: c.create_receiver("sensors/secret"))  # deny_rule first
        assert_link_denied(lambda: c.create_sender("actuators/valve"))  # default DENY
        c.close()
        bob = connect(proxy.port, "bob", vhost="dds")  # default ALLOW, but expired in 2001
        assert_link_denied(lambda: bob.create_sender("anything"))
        bob.close()
        carol = connect(proxy.port, "carol", vhost="dds")  # no grant at all
        assert_link_denied(lambda: carol.create_receiver("sensors/temp"))
        carol.close()


def test_tls_client_certificate_subject_selects_the_grant(broker_address, signed: Path,
                                                          tmp_path_factory) -> None:
    pki = Pki(tmp_path_factory.mktemp("dds-pki"))
    ca = pki.ca("ca-one")
    pki.leaf("ca-one", "proxy-one", server=True)
    pki.leaf("ca-one", "client-one", server=False)
    listener = ListenerConfig(Address("127.0.0.1", 0), tls_cert=str(pki.dir / "proxy-one.crt"),
                              tls_key=str(pki.dir / "proxy-one.key"), tls_ca=str(ca),
                              require_client_cert=True)
    with ProxyThread([broker_address], policy_path=str(signed / "policy.json"),
                     config=DaemonConfig(listeners=(listener,))) as proxy:
        # SASL ANONYMOUS: the user is "anonymous", the grant comes from the certificate
        conn = amqps(proxy.port, domain(ca, "client-one", pki))
        try:
            conn.create_sender("telemetry/engine").send(Message(body="ok"))
            assert_link_denied(lambda: conn.create_sender("sensors/temp"))  # alice's, not ours
        finally:
            conn.close()


def test_tampered_document_is_refused_by_check_and_by_reload(broker_address,
                                                             signed: Path) -> None:
    check = [sys.executable, "-m", "amqp_policy_proxy", "check", "--policy",
             str(signed / "policy.json")]
    assert subprocess.run(check, capture_output=True, text=True, timeout=60).returncode == 0
    with ProxyThread([broker_address], policy_path=str(signed / "policy.json")) as proxy:
        tamper(signed / "permissions.p7s")
        result = subprocess.run(check, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert "permissionsDocument" in result.stdout + result.stderr
        assert "tampered" in result.stdout + result.stderr
        with pytest.raises(Exception, match="tampered"):
            load_policy(str(signed / "policy.json"))
        assert proxy.reload() is False  # the running policy stays
        c = connect(proxy.port, "alice", vhost="dds")
        c.create_sender("sensors/temp")
        assert_link_denied(lambda: c.create_sender("actuators/valve"))
        c.close()
