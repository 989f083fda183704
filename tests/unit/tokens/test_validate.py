"""validate_token: a good token passes; each kind of bad one is refused with its reason, and the
refusal's text never holds the token."""

from __future__ import annotations

import base64
import json

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.tokens.errors import RejectReason, TokenRejected
from amqp_policy_proxy.tokens.validate import unverified_header, validate_token

from .conftest import AUDIENCE, ISSUER, NOW, Issuer, make_config

R = RejectReason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segments(token: str) -> tuple[dict, dict, str]:
    h, p, s = token.split(".")
    pad = lambda x: x + "=" * (-len(x) % 4)  # noqa: E731
    return (json.loads(base64.urlsafe_b64decode(pad(h))),
            json.loads(base64.urlsafe_b64decode(pad(p))), s)


def _forge(header: dict, payload: dict, signature: str = "") -> str:
    return ".".join((_b64(json.dumps(header).encode()), _b64(json.dumps(payload).encode()),
                     signature))


def _refused(token, config, keys, reason: RejectReason, now: float = NOW) -> TokenRejected:
    with pytest.raises(TokenRejected) as info:
        validate_token(token, config, keys, now)
    assert info.value.reason is reason, str(info.value)
    if isinstance(token, str) and len(token) > 20:
        for part in token.split("."):
            if len(part) > 8:
                assert part not in str(info.value)
    return info.value


def test_a_good_rsa_token_gives_its_identity_and_times(issuer: Issuer, config) -> None:
    token = issuer.token()
    v = validate_token(token, config, issuer.keyset(), NOW)
    assert (v.subject, v.issuer, v.algorithm, v.kid) == ("alice", ISSUER, "RS256", "rsa-1")
    assert v.expires_at == NOW + 300 and v.issued_at == NOW - 10 and v.not_before == NOW - 10
    assert v.size == len(token) and v.claims["scope"].startswith("amqp-proxy.send")
    assert token not in repr(v)


def test_a_good_ec_token_and_bytes_input(issuer: Issuer, config) -> None:
    token = issuer.token("ec-1").encode()
    assert validate_token(token, config, issuer.keyset(), NOW).algorithm == "ES256"


def test_ps256_with_an_rsa_key_whose_jwk_names_no_alg(issuer: Issuer, config) -> None:
    token = issuer.token(alg="PS256")
    assert validate_token(token, config, issuer.keyset(), NOW).algorithm == "PS256"


def test_expired_and_the_clock_skew(issuer: Issuer, config) -> None:
    token = issuer.token(exp=NOW - 10)
    # within the 30 s skew: still valid
    assert validate_token(token, config, issuer.keyset(), NOW).subject == "alice"
    _refused(token, config, issuer.keyset(), R.EXPIRED, now=NOW + 20)
    _refused(token, make_config(clock_skew_seconds=0), issuer.keyset(), R.EXPIRED)


def test_not_yet_valid_by_nbf_and_by_iat(issuer: Issuer, config) -> None:
    _refused(issuer.token(nbf=NOW + 120), config, issuer.keyset(), R.NOT_YET_VALID)
    _refused(issuer.token(iat=NOW + 120), config, issuer.keyset(), R.NOT_YET_VALID)
    # 20 s early is within the skew
    assert validate_token(issuer.token(nbf=NOW + 20), config, issuer.keyset(), NOW)


def test_wrong_audience_and_a_list_that_names_ours(issuer: Issuer, config) -> None:
    _refused(issuer.token(aud="someone-else"), config, issuer.keyset(), R.BAD_AUDIENCE)
    _refused(issuer.token(aud=["a", "b"]), config, issuer.keyset(), R.BAD_AUDIENCE)
    assert validate_token(issuer.token(aud=["a", AUDIENCE]), config, issuer.keyset(), NOW)
    _refused(issuer.token(aud=[AUDIENCE, 3]), config, issuer.keyset(), R.MALFORMED)


def test_wrong_issuer(issuer: Issuer, config) -> None:
    _refused(issuer.token(iss="https://evil.test"), config, issuer.keyset(), R.BAD_ISSUER)


def test_missing_claims(issuer: Issuer, config) -> None:
    for claim in ("exp", "iss", "aud", "sub"):
        _refused(issuer.token(**{claim: None}), config, issuer.keyset(), R.MISSING_CLAIM)
    _refused(issuer.token(sub=""), config, issuer.keyset(), R.MISSING_CLAIM)
    _refused(issuer.token(), make_config(required_claims=["jti"]), issuer.keyset(),
             R.MISSING_CLAIM)
    assert validate_token(issuer.token(jti="j1"), make_config(required_claims=["jti"]),
                          issuer.keyset(), NOW)


def test_another_identity_claim(issuer: Issuer) -> None:
    config = make_config(identity_claim="preferred_username")
    _refused(issuer.token(), config, issuer.keyset(), R.MISSING_CLAIM)
    token = issuer.token(preferred_username="alice.smith")
    assert validate_token(token, config, issuer.keyset(), NOW).subject == "alice.smith"


def test_claim_of_the_wrong_type_is_malformed(issuer: Issuer, config) -> None:
    for claims in ({"exp": "tomorrow"}, {"exp": True}, {"nbf": [1]}):
        _refused(_payload_token(issuer, claims), config, issuer.keyset(), R.MALFORMED)


def _payload_token(issuer: Issuer, changes: dict) -> str:
    """A correctly signed token whose payload PyJWT would not produce (raw JSON)."""
    payload = json.dumps(issuer.claims(**changes)).encode()
    return jwt.api_jws.PyJWS().encode(payload, issuer.keys["rsa-1"], algorithm="RS256",
                                      headers={"kid": "rsa-1"})


def test_repeated_claim_names_are_malformed(issuer: Issuer, config) -> None:
    payload = json.dumps(issuer.claims())[:-1] + ', "sub": "admin"}'
    token = jwt.api_jws.PyJWS().encode(payload.encode(), issuer.keys["rsa-1"], algorithm="RS256",
                                       headers={"kid": "rsa-1"})
    _refused(token, config, issuer.keyset(), R.MALFORMED)


def test_alg_none_is_refused(issuer: Issuer, config) -> None:
    token = _forge({"alg": "none", "kid": "rsa-1"}, issuer.claims())
    _refused(token, config, issuer.keyset(), R.ALGORITHM_NOT_ALLOWED)
    _refused(_forge({"alg": "None", "kid": "rsa-1"}, issuer.claims(), "x"), config,
             issuer.keyset(), R.ALGORITHM_NOT_ALLOWED)


def test_hs256_signed_with_the_rsa_public_key_is_refused(issuer: Issuer, config) -> None:
    """The classic algorithm confusion: HMAC keyed with the public key's PEM."""
    from cryptography.hazmat.primitives import serialization

    pem = issuer.keys["rsa-1"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    import hashlib
    import hmac

    header = _b64(json.dumps({"alg": "HS256", "kid": "rsa-1", "typ": "JWT"}).encode())
    body = _b64(json.dumps(issuer.claims()).encode())
    sig = _b64(hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest())
    token = f"{header}.{body}.{sig}"
    _refused(token, config, issuer.keyset(), R.ALGORITHM_NOT_ALLOWED)


def test_an_algorithm_the_key_may_not_verify(issuer: Issuer, config) -> None:
    # an RS256 token whose kid is the EC key
    token = issuer.token(headers={"kid": "ec-1"})
    _refused(token, config, issuer.keyset(), R.ALGORITHM_NOT_ALLOWED)
    # a JWK that names its alg binds it
    jwk = issuer.jwk("rsa-1") | {"alg": "RS256"}
    from amqp_policy_proxy.tokens.jwks import parse_jwks

    keys = parse_jwks(json.dumps({"keys": [jwk]}))
    _refused(issuer.token(alg="PS256"), config, keys, R.ALGORITHM_NOT_ALLOWED)
    # an allowed algorithm not in the configured list
    _refused(issuer.token(alg="RS512"), config, issuer.keyset(), R.ALGORITHM_NOT_ALLOWED)


def test_unknown_kid_carries_the_kid(issuer: Issuer, config) -> None:
    err = _refused(issuer.token(headers={"kid": "rotated-2"}), config, issuer.keyset(),
                   R.UNKNOWN_KID)
    assert err.kid == "rotated-2"
    # no kid and several keys: which one is not said
    token = _forge({"alg": "RS256"}, issuer.claims(), "c2ln")
    assert _refused(token, config, issuer.keyset(), R.UNKNOWN_KID).kid is None


def test_no_kid_with_a_single_key_uses_it(issuer: Issuer, config) -> None:
    token = jwt.encode(issuer.claims(), issuer.keys["rsa-1"], algorithm="RS256")
    assert validate_token(token, config, issuer.keyset("rsa-1"), NOW).kid is None


def test_tampered_payload_and_header(issuer: Issuer, config) -> None:
    token = issuer.token()
    header, payload, sig = _segments(token)
    _refused(_forge(header, payload | {"sub": "admin"}, sig), config, issuer.keyset(),
             R.BAD_SIGNATURE)
    _refused(_forge(header | {"typ": "at+jwt"}, payload, sig), config, issuer.keyset(),
             R.BAD_SIGNATURE)
    # another key's signature under this kid
    other = Issuer()
    other.add_rsa("rsa-1")
    _refused(other.token(), config, issuer.keyset(), R.BAD_SIGNATURE)
    _refused(_forge(header, payload), config, issuer.keyset(), R.BAD_SIGNATURE)


def test_oversized_is_refused_before_decoding(issuer: Issuer) -> None:
    config = make_config(max_token_bytes=600)
    token = issuer.token(pad="x" * 600)
    _refused(token, config, issuer.keyset(), R.OVERSIZED)
    _refused(token.encode(), config, issuer.keyset(), R.OVERSIZED)
    _refused("a" * 10_000_000, config, issuer.keyset(), R.OVERSIZED)


@pytest.mark.parametrize("param", ["jwk", "jku", "x5u", "x5c", "crit"])
def test_a_key_or_extension_in_the_header_is_refused(issuer: Issuer, config, param) -> None:
    value = {"jwk": issuer.jwk("rsa-1"), "jku": "https://evil.test/jwks",
             "x5u": "https://evil.test/cert", "x5c": ["MIIB"], "crit": ["exp"]}[param]
    token = issuer.token(headers={param: value})
    _refused(token, config, issuer.keyset(), R.FORBIDDEN_HEADER)


def test_malformed_shapes(issuer: Issuer, config) -> None:
    keys = issuer.keyset()
    for bad in ("", "abc", "a.b", "a.b.c.d", "a.b.c.d.e", "a b.c.d", "!!.??.**",
                _b64(b"[1]") + ".e30.", _b64(b'{"alg": 1}') + ".e30.", "é.b.c"):
        _refused(bad, config, keys, R.MALFORMED)
    _refused(12, config, keys, R.MALFORMED)
    _refused(issuer.token(headers={"kid": "k" * 300}), config, keys, R.MALFORMED)


def test_jwe_is_named_as_such(issuer: Issuer, config) -> None:
    err = _refused("aaa.bbb.ccc.ddd.eee", config, issuer.keyset(), R.MALFORMED)
    assert "JWE" in str(err)


def test_no_keys_is_jwks_unavailable(issuer: Issuer, config) -> None:
    _refused(issuer.token(), config, None, R.JWKS_UNAVAILABLE)


def test_the_error_text_never_holds_the_token(issuer: Issuer, config) -> None:
    token = issuer.token(exp=NOW - 3600)
    err = _refused(token, config, issuer.keyset(), R.EXPIRED)
    assert token not in str(err) and token not in repr(err)
    assert str(err).startswith("expired: ")


def test_unverified_header_for_explain(issuer: Issuer) -> None:
    assert unverified_header(issuer.token())["kid"] == "rsa-1"
    with pytest.raises(TokenRejected):
        unverified_header("nope")


_KEYS = Issuer().keyset()
_CONFIG = make_config()


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400),
                 st.lists(st.text(alphabet="AZaz09-_{}\":,", max_size=60), min_size=1,
                          max_size=5).map(".".join)))
def test_validate_raises_only_token_rejected_on_random_input(data) -> None:
    with pytest.raises(TokenRejected):
        validate_token(data, _CONFIG, _KEYS, NOW)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(header=st.dictionaries(st.sampled_from(["alg", "kid", "typ", "b64", "x5t", "cty"]),
                              st.one_of(st.none(), st.booleans(), st.integers(),
                                        st.sampled_from(["RS256", "ES256", "none", "rsa-1",
                                                         "ec-1", "HS256"]),
                                        st.lists(st.integers(), max_size=2))),
       payload=st.dictionaries(st.sampled_from(["exp", "nbf", "iat", "iss", "aud", "sub"]),
                               st.one_of(st.none(), st.booleans(), st.integers(),
                                         st.floats(allow_nan=False), st.text(max_size=5),
                                         st.lists(st.text(max_size=3), max_size=2))),
       sig=st.text(alphabet="AZaz09-_", max_size=40))
def test_validate_raises_only_token_rejected_on_random_jws(header, payload, sig) -> None:
    token = _forge(header, payload, sig)
    with pytest.raises(TokenRejected):
        validate_token(token, _CONFIG, _KEYS, NOW)
