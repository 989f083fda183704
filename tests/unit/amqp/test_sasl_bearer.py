"""The token in a sasl-init: PLAIN with the token as password, OAUTHBEARER (RFC 7628), and a
fuzz of both parsers (nothing but DecodeError escapes, and no error holds the token)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.sasl_bearer import (
    BearerResponse,
    parse_oauthbearer,
    parse_plain_token,
    parse_token_response,
)

TOKEN = b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"


def bearer(gs2: bytes = b"n,,", pairs: bytes = b"auth=Bearer " + TOKEN + b"\x01") -> bytes:
    return gs2 + b"\x01" + pairs + b"\x01"


class TestOauthbearer:
    def test_the_rfc_7628_example_shape(self):
        response = b"n,a=user@example.com,\x01host=server.example.com\x01port=143\x01" \
                   b"auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==\x01\x01"
        assert parse_oauthbearer(response) == BearerResponse(
            b"vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg==", "user@example.com", "OAUTHBEARER")

    def test_no_authzid_and_the_scheme_in_any_case(self):
        got = parse_oauthbearer(bearer(pairs=b"auth=bEaReR " + TOKEN + b"\x01"))
        assert got.token == TOKEN and got.username is None

    def test_saslname_escapes(self):
        got = parse_oauthbearer(bearer(gs2=b"y,a=a=2Cb=3Dc,"))
        assert got.username == "a,b=c"

    @pytest.mark.parametrize("response", [
        b"",
        b"n,,",  # no separator
        bearer(gs2=b"p=tls-unique,,"),  # channel binding
        bearer(gs2=b"x,,"),
        bearer(gs2=b"n,a=,"),
        bearer(gs2=b"n,b=x,"),
        bearer(gs2=b"n,a=bad=escape,"),
        bearer(pairs=b""),  # no auth
        bearer(pairs=b"auth=Basic abc\x01"),
        bearer(pairs=b"auth=Bearer\x01"),
        bearer(pairs=b"auth=Bearer " + TOKEN + b"\x01auth=Bearer x\x01"),  # repeated
        bearer(pairs=b"1x=y\x01auth=Bearer " + TOKEN + b"\x01"),  # key not ALPHA
        bearer(pairs=b"auth=Bearer " + TOKEN),  # pair without its %x01
        b"n,,\x01auth=Bearer " + TOKEN + b"\x01",  # no final %x01
        bearer(pairs=b"host=\x00\x01auth=Bearer " + TOKEN + b"\x01"),  # NUL in a value
    ])
    def test_malformed_responses_are_decode_errors(self, response):
        with pytest.raises(DecodeError):
            parse_oauthbearer(response)


class TestPlain:
    def test_the_password_is_the_token(self):
        assert parse_plain_token(b"\x00alice\x00" + TOKEN) == BearerResponse(
            TOKEN, "alice", "PLAIN")

    def test_the_user_name_may_be_empty(self):
        assert parse_plain_token(b"\x00\x00" + TOKEN).username is None

    def test_an_authzid_alone_is_the_user_name(self):
        assert parse_plain_token(b"alice\x00\x00" + TOKEN).username == "alice"

    @pytest.mark.parametrize("response", [
        b"\x00alice", b"\x00alice\x00", b"bob\x00alice\x00" + TOKEN, b"\x00\xff\x00" + TOKEN,
        b"a\x00b\x00c\x00d",
    ])
    def test_malformed_responses_are_decode_errors(self, response):
        with pytest.raises(DecodeError):
            parse_plain_token(response)


def test_other_mechanisms_carry_no_token():
    with pytest.raises(DecodeError, match="carries no token"):
        parse_token_response("SCRAM-SHA-256", b"n,,n=alice,r=x")
    with pytest.raises(DecodeError):
        parse_token_response("PLAIN", None)
    with pytest.raises(DecodeError):
        parse_token_response("PLAIN", 7)  # type: ignore[arg-type]


_PIECES = st.sampled_from([b"n", b"y", b"p=x", b",", b"a=", b"alice", b"=2C", b"=3D", b"=",
                           b"\x01", b"auth", b"=Bearer ", b"Bearer ", TOKEN, b"host",
                           b"\x00", b" ", b"\xff", b"\r\n"])


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.lists(_PIECES, max_size=24).map(b"".join)))
def test_fuzz_only_decode_errors_escape_and_none_holds_the_token(data):
    for mechanism in ("OAUTHBEARER", "PLAIN"):
        try:
            got = parse_token_response(mechanism, data)
        except DecodeError as exc:
            assert TOKEN.decode() not in exc.description
        else:
            assert got.token and got.token in data
            assert got.mechanism == mechanism


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
       st.binary(min_size=1, max_size=60).filter(lambda b: all(0x21 <= c <= 0x7e for c in b)))
def test_fuzz_well_formed_responses_round_trip(authzid, token):
    escaped = authzid.replace("=", "=3D").replace(",", "=2C").encode()
    gs2 = b"n," + (b"a=" + escaped if authzid else b"") + b","
    got = parse_oauthbearer(gs2 + b"\x01auth=Bearer " + token + b"\x01\x01")
    assert got.token == token and got.username == (authzid or None)
