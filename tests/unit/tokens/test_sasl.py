"""The token in a SASL PLAIN or OAUTHBEARER initial response."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.tokens.errors import RejectReason, TokenRejected
from amqp_policy_proxy.tokens.sasl import (
    credentials_from_sasl,
    is_oauthbearer_abort,
    oauthbearer_error_challenge,
)

TOKEN = b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"


def test_plain_with_empty_username_or_a_name() -> None:
    c = credentials_from_sasl("plain", b"\x00\x00" + TOKEN)
    assert (c.mechanism, c.username, c.authzid, c.token) == ("PLAIN", None, None, TOKEN)
    c = credentials_from_sasl("PLAIN", b"\x00alice\x00" + TOKEN)
    assert c.username == "alice" and c.claimed_user == "alice"
    c = credentials_from_sasl("PLAIN", b"admin\x00alice\x00" + TOKEN)
    assert c.claimed_user == "admin"
    assert TOKEN.decode() not in repr(c)


def test_oauthbearer() -> None:
    c = credentials_from_sasl("OAUTHBEARER", b"n,,\x01host=proxy\x01port=5672\x01auth=Bearer "
                              + TOKEN + b"\x01\x01")
    assert (c.mechanism, c.username, c.authzid, c.token) == ("OAUTHBEARER", None, None, TOKEN)
    c = credentials_from_sasl("oauthbearer", b"y,a=al=2Cice=3D,\x01auth=bearer  " + TOKEN
                              + b"\x01\x01")
    assert c.authzid == "al,ice=" and c.claimed_user == "al,ice="


@pytest.mark.parametrize(("mech", "response"), [
    ("PLAIN", None), ("PLAIN", b""), ("PLAIN", b"alice\x00" + TOKEN),
    ("PLAIN", b"\x00alice\x00"), ("PLAIN", b"\x00\xff\x00" + TOKEN),
    ("SCRAM-SHA-256", b"n,,n=alice,r=abc"), ("ANONYMOUS", b"x"),
    ("OAUTHBEARER", b"n,,\x01auth=Bearer " + TOKEN + b"\x01"),
    ("OAUTHBEARER", b"p=tls-unique,,\x01auth=Bearer " + TOKEN + b"\x01\x01"),
    ("OAUTHBEARER", b"n,alice,\x01auth=Bearer " + TOKEN + b"\x01\x01"),
    ("OAUTHBEARER", b"n,a=al=ice,\x01auth=Bearer " + TOKEN + b"\x01\x01"),
    ("OAUTHBEARER", b"n,,\x01host=x\x01\x01"),
    ("OAUTHBEARER", b"n,,\x01auth=Basic abc\x01\x01"),
    ("OAUTHBEARER", b"n,,\x01auth=Bearer a\x01auth=Bearer b\x01\x01"),
    ("OAUTHBEARER", b"n,,\x01noequals\x01\x01"),
    ("OAUTHBEARER", b"\x01"),
])
def test_malformed_responses(mech, response) -> None:
    with pytest.raises(TokenRejected) as info:
        credentials_from_sasl(mech, response)
    assert info.value.reason is RejectReason.MALFORMED
    assert TOKEN.decode() not in str(info.value)


def test_error_challenge_and_abort() -> None:
    assert json.loads(oauthbearer_error_challenge()) == {"status": "invalid_token"}
    assert json.loads(oauthbearer_error_challenge(scope="amqp", openid_configuration="u")) == {
        "status": "invalid_token", "scope": "amqp", "openid-configuration": "u"}
    assert is_oauthbearer_abort(b"\x01") and not is_oauthbearer_abort(b"\x01\x01")


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["PLAIN", "OAUTHBEARER", "plain", "X"]),
       st.one_of(st.binary(max_size=80),
                 st.lists(st.sampled_from([b"n,,", b"y,a=x,", b"\x01", b"auth=", b"Bearer ",
                                           b"host=h", b"\x00", b"abc", b"=", b"\xff"]),
                          max_size=10).map(b"".join)))
def test_only_token_rejected_on_random_responses(mech, response) -> None:
    try:
        c = credentials_from_sasl(mech, response)
    except TokenRejected:
        return
    assert c.token
