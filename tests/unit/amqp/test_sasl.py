"""User extraction from sasl-init (ARCHITECTURE decision 1)."""

import pytest

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.sasl import user_from_sasl_init


@pytest.mark.parametrize(
    ("mech", "response", "user"),
    [
        ("PLAIN", b"\0alice\0secret", "alice"),
        ("PLAIN", b"admin\0alice\0secret", "admin"),  # authzid wins
        ("plain", b"\0bob@REALM\0pw", "bob@REALM"),
        ("ANONYMOUS", b"trace", "anonymous"),
        ("ANONYMOUS", None, "anonymous"),
        ("SCRAM-SHA-256", b"n,,n=carol,r=abc", "carol"),
        ("SCRAM-SHA-1", b"n,,n=a=3Db=2Cc,r=x", "a=b,c"),
        ("SCRAM-SHA-256", b"n,a=dave,n=carol,r=abc", "dave"),
        ("EXTERNAL", b"", None),
        ("EXTERNAL", b"cn=svc", "cn=svc"),
        ("GSSAPI", b"\x60\x82", None),
    ],
)
def test_user_names(mech, response, user):
    assert user_from_sasl_init(mech, response) == user


@pytest.mark.parametrize("response", [None, b"", b"only-one-part", b"a\0b", b"\0\xff\xfe\0pw"])
def test_malformed_plain(response):
    with pytest.raises(DecodeError):
        user_from_sasl_init("PLAIN", response)


def test_password_never_returned():
    assert "secret" not in repr(user_from_sasl_init("PLAIN", b"\0alice\0secret"))
