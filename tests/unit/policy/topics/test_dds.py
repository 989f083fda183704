"""DDS Security permissions documents (issue 8, model 4): rules in document order, fnmatch
topics, defaults, validity windows, subject matching, and signature verification."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from amqp_policy_proxy.policy.topics.dds import (
    NOT_BY_CA,
    NOT_SIGNED,
    TAMPERED,
    DdsError,
    DdsPermissions,
    DdsVerdict,
    load_permissions,
    parse_dn,
    parse_permissions,
    parse_time,
)
from tests.support.dds import issue_signer, make_ca, sign_permissions, tamper

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


def ts(text: str) -> float:
    """POSIX seconds of an ISO date-time (UTC when no zone)."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


NOW = ts("2026-06-01T12:00:00")

DOCUMENT = """<?xml version="1.0" encoding="UTF-8"?>
<dds xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
     xsi:noNamespaceSchemaLocation="omg_shared_ca_permissions.xsd">
  <permissions>
    <grant name="alice">
      <subject_name>CN=alice,O=Example Markets,C=NL</subject_name>
      <validity>
        <not_before>2025-01-01T00:00:00</not_before>
        <not_after>2027-01-01T00:00:00Z</not_after>
      </validity>
      <deny_rule>
        <domains><id>0</id></domains>
        <publish><topics><topic>sensors/secret</topic></topics></publish>
      </deny_rule>
      <allow_rule>
        <domains><id_range><min>0</min><max>230</max></id_range></domains>
        <publish>
          <topics><topic>sensors/*</topic><topic>alerts/?</topic></topics>
        </publish>
        <subscribe><topics><topic>sensors/*</topic></topics></subscribe>
      </allow_rule>
      <deny_rule>
        <domains><id>0</id><id_range><min>5</min></id_range></domains>
        <publish><topics><topic>*</topic></topics></publish>
        <subscribe><topics><topic>sensors/*</topic></topics></subscribe>
      </deny_rule>
      <default>ALLOW</default>
    </grant>
    <grant name="bob">
      <subject_name>bob</subject_name>
      <validity>
        <not_before>2025-01-01T00:00:00Z</not_before>
        <not_after>2030-01-01T00:00:00Z</not_after>
      </validity>
      <allow_rule>
        <domains><id>1</id></domains>
        <publish><topics><topic>orders/[abc]*</topic></topics></publish>
        <subscribe>
          <topics><topic>orders/*</topic></topics>
          <partitions><partition>eu</partition></partitions>
        </subscribe>
        <subscribe>
          <topics><topic>fills/*</topic></topics>
          <partitions><partition>eu</partition><partition/></partitions>
        </subscribe>
        <subscribe>
          <topics><topic>prices/*</topic></topics>
          <partitions><partition>*</partition></partitions>
          <data_tags><tag><name>level</name><value>public</value></tag></data_tags>
        </subscribe>
        <relay><topics><topic>*</topic></topics></relay>
      </allow_rule>
      <default>DENY</default>
    </grant>
    <grant name="carol-2026-01">
      <subject_name>CN=carol,O=Example Markets,C=NL</subject_name>
      <validity>
        <not_before>2026-01-01T02:00:00+02:00</not_before>
        <not_after>2026-02-01T00:00:00</not_after>
      </validity>
      <allow_rule>
        <domains><id>0</id></domains>
        <publish><topics><topic>january/*</topic></topics></publish>
      </allow_rule>
      <default>DENY</default>
    </grant>
    <grant name="carol-2026-02">
      <subject_name>C=NL, O=Example Markets, CN=carol</subject_name>
      <validity>
        <not_before>2026-02-01T00:00:00.5</not_before>
        <not_after>2026-03-01T00:00:00</not_after>
      </validity>
      <allow_rule>
        <domains><id>0</id></domains>
        <publish><topics><topic>february/*</topic></topics></publish>
      </allow_rule>
      <default>DENY</default>
    </grant>
  </permissions>
</dds>
"""

ALICE_DN = "CN=alice,O=Example Markets,C=NL"


@pytest.fixture(scope="module")
def perms() -> DdsPermissions:
    return parse_permissions(DOCUMENT)


# ------------------------------------------------------------------ rules in document order

def test_deny_rule_before_allow_rule_wins_for_its_topic(perms: DdsPermissions) -> None:
    verdict = perms.check(ALICE_DN, "alice", "publish", "sensors/secret", NOW)
    assert verdict == DdsVerdict(
        False, "dds grant 'alice' deny_rule[1] publish topic 'sensors/secret'")


def test_allow_rule_before_deny_rule_wins_for_another_topic(perms: DdsPermissions) -> None:
    # deny_rule[2] also names sensors/* for subscribe, but allow_rule[1] comes first
    verdict = perms.check(ALICE_DN, "alice", "subscribe", "sensors/temp", NOW)
    assert verdict == DdsVerdict(
        True, "dds grant 'alice' allow_rule[1] subscribe topic 'sensors/*'")
    assert perms.check(ALICE_DN, "alice", "publish", "sensors/temp", NOW).allowed


def test_later_rule_decides_what_earlier_rules_do_not_match(perms: DdsPermissions) -> None:
    verdict = perms.check(ALICE_DN, "alice", "publish", "weather", NOW)
    assert verdict == DdsVerdict(False, "dds grant 'alice' deny_rule[2] publish topic '*'")


def test_fnmatch_patterns(perms: DdsPermissions) -> None:
    def pub(topic: str, user: str = "alice") -> DdsVerdict:
        subject = ALICE_DN if user == "alice" else None
        return perms.check(subject, user, "publish", topic, NOW)

    assert pub("alerts/1").decided_by.endswith("allow_rule[1] publish topic 'alerts/?'")
    assert not pub("alerts/12").allowed  # '?' is one character: falls to deny_rule[2] '*'
    assert pub("sensors/a/b").allowed  # fnmatch '*' crosses '/'
    assert not pub("Sensors/a").allowed  # case-sensitive (fnmatchcase)
    assert pub("orders/b-1", "bob").allowed  # [abc]
    assert pub("orders/d-1", "bob") == DdsVerdict(False, "dds grant 'bob' default DENY")


def test_default_allow_and_default_deny(perms: DdsPermissions) -> None:
    # alice has no subscribe rule for 'news': default ALLOW
    assert perms.check(ALICE_DN, "alice", "subscribe", "news", NOW) == DdsVerdict(
        True, "dds grant 'alice' default ALLOW")
    assert perms.check(None, "bob", "subscribe", "news", NOW) == DdsVerdict(
        False, "dds grant 'bob' default DENY")


def test_partitions_and_relay_and_data_tags(perms: DdsPermissions) -> None:
    # an AMQP link is in the default partition: <partition>eu</partition> does not apply
    assert not perms.check(None, "bob", "subscribe", "orders/a", NOW).allowed
    # <partition>*</partition> matches the default partition; data tags do not restrict
    verdict = perms.check(None, "bob", "subscribe", "prices/x", NOW)
    assert verdict == DdsVerdict(True, "dds grant 'bob' allow_rule[1] subscribe topic 'prices/*'")
    # an empty <partition/> is the default partition
    assert perms.check(None, "bob", "subscribe", "fills/1", NOW).allowed
    # <relay> never grants publish or subscribe
    assert not perms.check(None, "bob", "publish", "anything", NOW).allowed


def test_activity_must_be_publish_or_subscribe(perms: DdsPermissions) -> None:
    with pytest.raises(ValueError, match="activity"):
        perms.check(ALICE_DN, "alice", "relay", "x", NOW)


# ------------------------------------------------------------------ validity

def test_validity_window_before_inside_after(perms: DdsPermissions) -> None:
    dn = "CN=carol,O=Example Markets,C=NL"
    # not_before 2026-01-01T02:00:00+02:00 is midnight UTC, inclusive
    before = perms.check(dn, "carol", "publish", "january/x", ts("2025-12-31T23:59:59"))
    assert before == DdsVerdict(
        False, "dds grant 'carol-2026-01' outside validity (not_before 2026-01-01T00:00:00Z)")
    assert perms.check(dn, "carol", "publish", "january/x", ts("2026-01-01T00:00:00")).allowed
    inside = perms.check(dn, "carol", "publish", "january/x", ts("2026-01-15T00:00:00"))
    assert inside.decided_by == "dds grant 'carol-2026-01' allow_rule[1] publish topic 'january/*'"
    # the second grant for the same subject takes over (the first valid one in document order)
    feb = perms.check(dn, "carol", "publish", "february/x", ts("2026-02-10T00:00:00"))
    assert feb.allowed and "carol-2026-02" in feb.decided_by
    assert not perms.check(dn, "carol", "publish", "january/x", ts("2026-02-10T00:00:00")).allowed
    # between the two windows (00:00:00.0 .. 00:00:00.5) and after both
    gap = perms.check(dn, "carol", "publish", "january/x", ts("2026-02-01T00:00:00.25"))
    assert gap == DdsVerdict(
        False, "dds grant 'carol-2026-01' outside validity (not_after 2026-02-01T00:00:00Z)")
    after = perms.check(dn, "carol", "publish", "february/x", ts("2026-03-01T00:00:01"))
    assert not after.allowed and "outside validity (not_after" in after.decided_by


def test_parse_time_zones_and_forms() -> None:
    assert parse_time("2026-01-01T00:00:00") == ts("2026-01-01T00:00:00+00:00")
    assert parse_time("2026-01-01T00:00:00Z") == ts("2026-01-01T00:00:00+00:00")
    assert parse_time("2026-01-01T05:30:00+05:30") == ts("2026-01-01T00:00:00+00:00")
    assert parse_time(" 2025-12-31T24:00:00 ") == ts("2026-01-01T00:00:00+00:00")
    assert parse_time("2026-01-01T00:00:00.25Z") == ts("2026-01-01T00:00:00.25+00:00")
    for bad in ("2026-01-01", "2026-01-01 00:00:00", "2026-02-30T00:00:00", "tomorrow",
                "2026-01-01T00:00:00+2:00"):
        with pytest.raises(ValueError):
            parse_time(bad)


# ------------------------------------------------------------------ subjects

def test_subject_matches_distinguished_name_in_any_order_and_type_case(
        perms: DdsPermissions) -> None:
    for subject in ("C=NL,O=Example Markets,CN=alice",
                    "cn=alice,o=Example Markets,c=NL",
                    "commonName=alice, O=Example Markets, 2.5.4.6=NL"):
        verdict = perms.check(subject, "someone-else", "subscribe", "sensors/t", NOW)
        assert verdict.allowed, subject
    # values are exact: case differs -> no grant
    assert perms.check("CN=Alice,O=Example Markets,C=NL", "alice", "subscribe", "sensors/t",
                       NOW) == DdsVerdict(
        False, "dds: no grant for subject 'CN=Alice,O=Example Markets,C=NL'")
    # an extra or missing attribute is another name
    assert not perms.check("CN=alice,O=Example Markets", "alice", "subscribe", "x", NOW).allowed


def test_subject_from_cryptography_rfc4514_string(perms: DdsPermissions) -> None:
    name = x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "NL"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example Markets"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "alice")])
    subject = name.rfc4514_string()  # "CN=alice,O=Example Markets,C=NL" (reversed order)
    assert perms.check(subject, "x", "subscribe", "sensors/t", NOW).allowed


def test_with_a_tls_subject_the_user_name_is_not_used(perms: DdsPermissions) -> None:
    verdict = perms.check("CN=mallory", "alice", "subscribe", "sensors/t", NOW)
    assert verdict == DdsVerdict(False, "dds: no grant for subject 'CN=mallory'")
    assert not perms.check("not a dn", "alice", "subscribe", "sensors/t", NOW).allowed


def test_user_name_matches_whole_subject_name_or_its_cn(perms: DdsPermissions) -> None:
    assert perms.check(None, "alice", "subscribe", "sensors/t", NOW).decided_by.startswith(
        "dds grant 'alice' allow_rule[1]")  # CN=alice
    assert perms.check(None, "bob", "publish", "orders/a", NOW).allowed  # subject_name "bob"
    assert perms.check(None, ALICE_DN, "subscribe", "sensors/t", NOW).allowed  # whole name
    assert perms.check(None, "eve", "subscribe", "sensors/t", NOW) == DdsVerdict(
        False, "dds: no grant for user 'eve'")
    assert not perms.check(None, "Example Markets", "subscribe", "sensors/t", NOW).allowed


def test_parse_dn_escapes_and_forms() -> None:
    assert parse_dn(r"CN=a\, b,O=x\2Cy") == parse_dn('O="x,y", CN = a\\, b')
    assert dict(parse_dn(r"CN=caf\C3\A9")) == {"2.5.4.3": "café"}
    assert parse_dn("/C=NL/O=Example/CN=alice") == parse_dn("CN=alice,O=Example,C=NL")
    assert parse_dn("emailAddress=a@example.org,CN=x") == parse_dn(
        "CN=x+1.2.840.113549.1.9.1=a@example.org")
    assert parse_dn("OID.2.5.4.3=x") == parse_dn("CN=x")
    assert dict(parse_dn("CN=trailing\\ \n")) == {"2.5.4.3": "trailing "}
    assert dict(parse_dn("UID=u1;DC=example")) == {
        "0.9.2342.19200300.100.1.1": "u1", "0.9.2342.19200300.100.1.25": "example"}
    for bad in ("", "CN", "CN=a,,O=b", "CN=a\\", "C N=a", "CN=a\\q", 'CN="a'):
        with pytest.raises(ValueError):
            parse_dn(bad)


# ------------------------------------------------------------------ XML errors

def _grant(body: str, name: str = "g") -> str:
    return f"""<dds><permissions><grant name="{name}">
      <subject_name>CN=g</subject_name>
      <validity><not_before>2025-01-01T00:00:00</not_before>
                <not_after>2027-01-01T00:00:00</not_after></validity>
      {body}
    </grant></permissions></dds>"""


ALLOW_ALL = ("<allow_rule><domains><id>0</id></domains>"
             "<publish><topics><topic>*</topic></topics></publish></allow_rule>")


@pytest.mark.parametrize(("xml", "reason"), [
    (_grant(ALLOW_ALL + "<default>MAYBE</default>"),
     "XML: dds/permissions/grant[1]/default: expected ALLOW or DENY, got 'MAYBE'"),
    (_grant(ALLOW_ALL),
     "XML: dds/permissions/grant[1]: missing <default>"),
    (_grant(ALLOW_ALL + "<allow_rules/><default>DENY</default>"),
     "XML: dds/permissions/grant[1]/allow_rules: unexpected element <allow_rules> (expected "
     "<subject_name>, <validity>, <allow_rule>, <deny_rule>, <default>)"),
    (_grant(ALLOW_ALL + "<deny_rule><domains><id>0</id></domains><publish><topics>"
            "<topic>a</topic><topic> </topic></topics></publish></deny_rule>"
            "<default>DENY</default>"),
     "XML: dds/permissions/grant[1]/deny_rule[1]/publish[1]/topics/topic[2]: <topic> is empty"),
    (_grant("<allow_rule><publish><topics><topic>a</topic></topics></publish></allow_rule>"
            "<default>DENY</default>"),
     "XML: dds/permissions/grant[1]/allow_rule[1]: missing <domains>"),
    (_grant("<allow_rule><domains><id>-1</id></domains></allow_rule><default>DENY</default>"),
     "XML: dds/permissions/grant[1]/allow_rule[1]/domains/id[1]: domain id must be a "
     "non-negative integer, got '-1'"),
    (_grant("<allow_rule><domains><id_range><min>9</min><max>3</max></id_range></domains>"
            "</allow_rule><default>DENY</default>"),
     "XML: dds/permissions/grant[1]/allow_rule[1]/domains/id_range[1]: <min> is greater than "
     "<max>"),
    (_grant("<default>DENY</default><default>ALLOW</default>"),
     "XML: dds/permissions/grant[1]/default: <default> may appear only once in <grant>"),
    (_grant("<default>DENY</default>").replace("<not_before>2025-01-01T00:00:00",
                                               "<not_before>soon"),
     "XML: dds/permissions/grant[1]/validity/not_before: not an xs:dateTime "
     "(CCYY-MM-DDThh:mm:ss[Z|+hh:mm]): 'soon'"),
    (_grant("<default>DENY</default>", name="late").replace("2027-01-01", "2024-01-01"),
     "grant 'late': not_after before not_before"),
    (_grant("<default>DENY</default>").replace("CN=g", "CN=g,=x"),
     "XML: dds/permissions/grant[1]/subject_name: not a distinguished name: bad attribute "
     "type ''"),
    (_grant("<default>DENY</default>").replace(' name="g"', ""),
     "XML: dds/permissions/grant[1]: <grant> needs a non-empty name attribute"),
    ("<dds><permissions/></dds>", "XML: dds/permissions: <permissions> needs at least one <grant>"),
    ("<governance/>", "XML: governance: the root element must be <dds>"),
    ("<dds><permissions><grant name='x'></permissions></dds>",
     "XML: line 1, column 37: mismatched tag"),
])
def test_invalid_documents_are_refused_with_the_element_path(xml: str, reason: str) -> None:
    with pytest.raises(DdsError) as info:
        parse_permissions(xml)
    assert info.value.reason == reason


def test_dtd_and_entities_are_refused() -> None:
    bomb = ('<?xml version="1.0"?><!DOCTYPE dds [<!ENTITY a "aaaa">]>'
            "<dds><permissions>&a;</permissions></dds>")
    with pytest.raises(DdsError, match="XML: forbidden construct"):
        parse_permissions(bomb)


def test_grant_without_rules_uses_its_default_and_namespaces_are_ignored() -> None:
    xml = _grant("<default>ALLOW</default>").replace("<dds>", '<dds xmlns="urn:x">')
    perms = parse_permissions(xml)
    assert perms.check("CN=g", "g", "publish", "t", NOW) == DdsVerdict(
        True, "dds grant 'g' default ALLOW")


# ------------------------------------------------------------------ signed documents

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl")
    directory = tmp_path_factory.mktemp("dds-pki")
    ca_cert, ca_key = make_ca(directory)
    other_cert, other_key = make_ca(directory, "Other CA")
    signer_cert, signer_key = issue_signer(directory, ca_cert, ca_key)
    return {"dir": directory, "ca": ca_cert, "ca_key": ca_key, "other": other_cert,
            "other_key": other_key, "signer": signer_cert, "signer_key": signer_key}


@needs_openssl
def test_signed_document_is_verified_and_loaded(pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["ca"], pki["ca_key"], tmp_path / "p.p7s")
    perms = load_permissions(signed, pki["ca"])
    assert perms.source == str(signed)
    assert [g.name for g in perms.grants] == ["alice", "bob", "carol-2026-01", "carol-2026-02"]
    assert perms.check(ALICE_DN, "alice", "publish", "sensors/secret", NOW).decided_by == (
        "dds grant 'alice' deny_rule[1] publish topic 'sensors/secret'")


@needs_openssl
def test_document_signed_by_a_certificate_the_ca_issued_is_accepted(
        pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["signer"], pki["signer_key"], tmp_path / "p.p7s")
    assert len(load_permissions(signed, pki["ca"]).grants) == 4


@needs_openssl
def test_unsigned_document_is_refused(pki: dict[str, Path], tmp_path: Path) -> None:
    plain = tmp_path / "permissions.xml"
    plain.write_text(DOCUMENT)
    with pytest.raises(DdsError) as info:
        load_permissions(plain, pki["ca"])
    assert info.value.reason == NOT_SIGNED
    assert info.value.document == str(plain)
    assert str(info.value).startswith(f"{plain}: not signed (plain XML")


@needs_openssl
def test_tampered_document_is_refused(pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["ca"], pki["ca_key"], tmp_path / "p.p7s")
    tamper(signed)
    assert b'<grant name="Alice">' in signed.read_bytes()
    with pytest.raises(DdsError) as info:
        load_permissions(signed, pki["ca"])
    assert info.value.reason == TAMPERED
    assert "digest failure" in info.value.detail


@needs_openssl
def test_damaged_signature_block_is_refused_as_tampered(
        pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["ca"], pki["ca_key"], tmp_path / "p.p7s")
    data = signed.read_bytes()
    cut = data.index(b"Content-Disposition: attachment")
    signed.write_bytes(data[:cut] + b"\n\nAAAA\n")
    with pytest.raises(DdsError) as info:
        load_permissions(signed, pki["ca"])
    assert info.value.reason == TAMPERED


@needs_openssl
def test_document_signed_by_another_ca_is_refused(pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["other"], pki["other_key"], tmp_path / "p.p7s")
    with pytest.raises(DdsError) as info:
        load_permissions(signed, pki["ca"])
    assert info.value.reason == NOT_BY_CA
    assert "self-signed certificate" in info.value.detail


@needs_openssl
def test_signed_but_invalid_xml_names_the_element(pki: dict[str, Path], tmp_path: Path) -> None:
    bad = DOCUMENT.replace("<default>DENY</default>", "<default>deny</default>", 1)
    signed = sign_permissions(bad, pki["ca"], pki["ca_key"], tmp_path / "p.p7s")
    with pytest.raises(DdsError) as info:
        load_permissions(signed, pki["ca"])
    assert info.value.reason == (
        "XML: dds/permissions/grant[2]/default: expected ALLOW or DENY, got 'deny'")


@needs_openssl
def test_unusable_ca_and_missing_document(pki: dict[str, Path], tmp_path: Path) -> None:
    signed = sign_permissions(DOCUMENT, pki["ca"], pki["ca_key"], tmp_path / "p.p7s")
    with pytest.raises(DdsError) as info:
        load_permissions(signed, pki["ca_key"])  # a key is not a certificate
    assert info.value.reason == "permissionsCa: not a PEM certificate file"
    with pytest.raises(DdsError) as info:
        load_permissions(tmp_path / "missing.p7s", pki["ca"])
    assert info.value.reason.startswith("cannot read permissionsDocument: ")


def test_shipped_example_document_parses_and_decides() -> None:
    example = Path(__file__).resolve().parents[4] / "examples" / "dds" / "permissions.xml"
    perms = parse_permissions(example.read_bytes())
    now = ts("2026-06-01T00:00:00")
    pricer = "CN=pricer.markets.example,OU=Pricing,O=Example Markets,C=NL"
    assert not perms.check(pricer, "x", "publish", "prices/audit", now).allowed
    assert perms.check(pricer, "x", "publish", "quotes/EUR", now).allowed
    assert perms.check(None, "ana", "subscribe", "prices/eur", now).allowed
    assert not perms.check(None, "ana", "subscribe", "orders/x", now).allowed
