"""The token in a sasl-init (:mod:`amqp_policy_proxy.tokens.sasl`), beyond test_sasl.py: the
RFC 7628 example, saslname escapes, each malformed OAUTHBEARER shape refused, and a fuzz of both
mechanisms over RFC 7628's building blocks: nothing but TokenRejected escapes, no error text
holds the token, and a well-formed response gives back its token and authzid."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.tokens.errors import TokenRejected
from amqp_policy_proxy.tokens.sasl import credentials_from_sasl

TOKEN = b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"


def bearer(gs2: bytes = b"n,,", pairs: bytes = b"auth=Bearer " + TOKEN + b"\x01") -> bytes:
    return gs2 + b"\x01" + pairs + b"\x01"


def test_the_rfc_7628_example_shape():
    response = b"n,a=user@example.com,\x01host=server.example.com\x01port=143\x01" \
               b"auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01"
    got = credentials_from_sasl("OAUTHBEARER", response)
    assert got.token == b"vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg=="
    assert got.claimed_user == "user@example.com"


def test_saslname_escapes_and_the_scheme_in_any_case():
    got = credentials_from_sasl("OAUTHBEARER", bearer(
        gs2=b"y,a=a=2Cb=3Dc,", pairs=b"auth=bEaReR " + TOKEN + b"\x01"))
    assert got.authzid == "a,b=c" and got.token == TOKEN


@pytest.mark.parametrize("response", [
    b"n,,",  # no separator
    bearer(gs2=b"p=tls-unique,,"),  # channel binding
    bearer(gs2=b"x,,"),
    bearer(gs2=b"n,b=x,"),
    bearer(gs2=b"n,a=bad=escape,"),
    bearer(pairs=b""),  # no auth
    bearer(pairs=b"auth=Basic abc\x01"),
    bearer(pairs=b"auth=Bearer\x01"),
    bearer(pairs=b"auth=Bearer " + TOKEN + b"\x01auth=Bearer x\x01"),  # repeated
    bearer(pairs=b"1x=y\x01auth=Bearer " + TOKEN + b"\x01"),  # key not ALPHA
    b"n,,\x01auth=Bearer " + TOKEN + b"\x01",  # no final %x01
])
def test_malformed_oauthbearer_responses_are_refused(response):
    with pytest.raises(TokenRejected) as info:
        credentials_from_sasl("OAUTHBEARER", response)
    assert info.value.reason.value == "malformed"


_PIECES = st.sampled_from([b"n", b"y", b"p=x", b",", b"a=", b"alice", b"=2C", b"=3D", b"=",
                           b"\x01", b"auth", b"=Bearer ", b"Bearer ", TOKEN, b"host",
                           b"\x00", b" ", b"\xff", b"\r\n"])


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.lists(_PIECES, max_size=24).map(b"".join)))
def test_fuzz_only_token_rejected_escapes_and_none_holds_the_token(data):
    for mechanism in ("OAUTHBEARER", "PLAIN"):
        try:
            got = credentials_from_sasl(mechanism, data)
        except TokenRejected as exc:
            assert TOKEN.decode() not in str(exc)
        else:
            assert got.token and got.token in data
            assert got.mechanism == mechanism


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20),
       st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/",
               min_size=1, max_size=60))
def test_fuzz_well_formed_oauthbearer_responses_round_trip(authzid, token):
    escaped = authzid.replace("=", "=3D").replace(",", "=2C").encode()
    gs2 = b"n," + (b"a=" + escaped if authzid else b"") + b","
    got = credentials_from_sasl("OAUTHBEARER",
                                gs2 + b"\x01auth=Bearer " + token.encode() + b"\x01\x01")
    assert got.token == token.encode() and got.authzid == (authzid or None)
