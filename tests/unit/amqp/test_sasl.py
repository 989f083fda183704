"""The identity a sasl-init asks the router to authenticate (decision 0001, issue 14 finding 1)."""

import pytest

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.sasl import SaslIdentity, identity_from_sasl_init


@pytest.mark.parametrize(
    ("mech", "response", "user", "authzid"),
    [
        ("PLAIN", b"\0alice\0secret", "alice", None),
        # the router authenticates the authcid: the authzid never becomes the policy identity
        ("PLAIN", b"admin\0alice\0secret", "alice", "admin"),
        ("PLAIN", b"alice\0alice\0secret", "alice", "alice"),
        ("plain", b"\0bob@REALM\0pw", "bob@REALM", None),
        ("ANONYMOUS", b"trace", "anonymous", None),
        ("ANONYMOUS", None, "anonymous", None),
        ("SCRAM-SHA-256", b"n,,n=carol,r=abc", "carol", None),
        ("SCRAM-SHA-1", b"n,,n=a=3Db=2Cc,r=x", "a=b,c", None),
        ("SCRAM-SHA-256", b"n,a=dave,n=carol,r=abc", "carol", "dave"),
        ("SCRAM-SHA-256", b"y,a=carol,n=carol,r=abc", "carol", "carol"),
        ("EXTERNAL", b"", None, None),  # no certificate verified by the proxy: no identity
        ("EXTERNAL", b"cn=svc", None, "cn=svc"),  # the client's message never names the user
        ("GSSAPI", b"\x60\x82", None, None),
    ],
)
def test_identity(mech, response, user, authzid):
    assert identity_from_sasl_init(mech, response)[:2] == SaslIdentity(user, authzid)[:2]


def test_external_identity_is_the_verified_certificate():
    subject = "CN=svc,O=Example"
    assert identity_from_sasl_init("EXTERNAL", b"", tls_identity=subject)[:2] == (subject, None)
    same = identity_from_sasl_init("EXTERNAL", subject.encode(), tls_identity=subject)
    assert not same.impersonates
    other = identity_from_sasl_init("EXTERNAL", b"CN=admin", tls_identity=subject)
    assert other.user == subject and other.impersonates


@pytest.mark.parametrize(("response", "impersonates"), [
    (b"\0alice\0pw", False), (b"alice\0alice\0pw", False), (b"admin\0alice\0pw", True),
])
def test_impersonation(response, impersonates):
    assert identity_from_sasl_init("PLAIN", response).impersonates is impersonates


@pytest.mark.parametrize("response", [None, b"", b"only-one-part", b"a\0b", b"\0\xff\xfe\0pw",
                                      b"admin\0\0pw"])
def test_malformed_plain(response):
    with pytest.raises(DecodeError):
        identity_from_sasl_init("PLAIN", response)


@pytest.mark.parametrize("response", [b"n,,r=abc,n=x", b"n,x=y,n=a,r=b", b"q,,n=a,r=b",
                                      b"n,,n=,r=b", b"n,,n=a=4x,r=b"])
def test_malformed_scram(response):
    with pytest.raises(DecodeError):
        identity_from_sasl_init("SCRAM-SHA-256", response)


def test_password_never_returned():
    assert "secret" not in repr(identity_from_sasl_init("PLAIN", b"\0alice\0secret"))
