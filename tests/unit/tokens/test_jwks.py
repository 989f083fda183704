"""The JWKS: which keys are usable, and the cache's fetch schedule (interval, unknown-kid
refreshes rate-limited, back-off, stale use)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.tokens.errors import RejectReason, TokenRejected
from amqp_policy_proxy.tokens.jwks import JwksCache, JwksError, parse_jwks, read_jwks_file
from amqp_policy_proxy.tokens.validate import validate_token

from .conftest import NOW, Issuer, make_config


def test_usable_keys_by_kid_and_the_algorithms_each_may_verify(issuer: Issuer) -> None:
    keys = parse_jwks(issuer.jwks(), algorithms=["RS256", "ES256", "ES384"])
    assert set(keys.keys) == {"rsa-1", "ec-1"} and len(keys) == 2
    assert keys.keys["rsa-1"].algorithms == {"RS256"}
    assert keys.keys["ec-1"].algorithms == {"ES256"}  # its curve's only
    assert keys.find("rsa-1") is keys.keys["rsa-1"] and keys.find("nope") is None
    assert keys.find(None) is None  # two keys: a token without kid does not say which


@pytest.mark.parametrize(("change", "why"), [
    ({"use": "enc"}, "use 'enc'"),
    ({"key_ops": ["sign"]}, "key_ops"),
    ({"d": "AAAA"}, "private key material"),
    ({"alg": "ES256"}, "does not fit"),
    ({"kty": "oct", "k": "c2VjcmV0"}, "symmetric"),
    ({"kty": "XYZ"}, "unsupported kty"),
    ({"n": "AQAB"}, "not a valid RSA key"),
    ({"n": "!!!"}, "not a valid RSA key"),
    ({"kid": 7}, "kid is not a string"),
])
def test_unusable_keys_are_skipped_with_a_reason(issuer: Issuer, change, why) -> None:
    bad = issuer.jwk("rsa-1") | change
    keys = parse_jwks(json.dumps({"keys": [bad, issuer.jwk("ec-1")]}))
    assert set(keys.keys) == {"ec-1"}
    assert len(keys.skipped) == 1 and why in keys.skipped[0], keys.skipped


def test_a_short_rsa_key_is_skipped() -> None:
    small = Issuer()
    small.add_rsa("tiny", bits=1024)
    with pytest.raises(JwksError, match="1024 bits"):
        parse_jwks(small.jwks("tiny"))


def test_a_key_no_configured_algorithm_fits_is_skipped(issuer: Issuer) -> None:
    keys = parse_jwks(issuer.jwks(), algorithms=["ES256"])
    assert set(keys.keys) == {"ec-1"} and "none of its algorithms" in keys.skipped[0]


def test_a_repeated_kid_keeps_the_first(issuer: Issuer) -> None:
    doc = json.dumps({"keys": [issuer.jwk("rsa-1"), issuer.jwk("ec-1") | {"kid": "rsa-1"}]})
    keys = parse_jwks(doc)
    assert keys.keys["rsa-1"].kty == "RSA" and "repeated" in keys.skipped[0]


@pytest.mark.parametrize("doc", [b"", b"{", b"[]", b'{"keys": 1}', b'{"keys": []}',
                                 b'{"keys": [{"kty": "oct", "k": "AA"}]}', b"NaN",
                                 b'{"keys": [NaN]}', b"\xff\xfe"])
def test_unusable_documents(doc) -> None:
    with pytest.raises(JwksError):
        parse_jwks(doc, source="https://idp.test/jwks")


def test_too_large_a_document(issuer: Issuer) -> None:
    with pytest.raises(JwksError, match="more than"):
        parse_jwks(issuer.jwks(), max_bytes=100)


def test_a_key_without_kid_serves_tokens_without_kid(issuer: Issuer) -> None:
    jwk = issuer.jwk("rsa-1")
    del jwk["kid"]
    keys = parse_jwks(json.dumps({"keys": [jwk]}))
    assert keys.find(None) is keys.unnamed[0] and keys.find("rsa-1") is None


def test_the_file_source(tmp_path, issuer: Issuer) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(issuer.jwks())
    assert set(read_jwks_file(path).keys) == {"rsa-1", "ec-1"}
    with pytest.raises(JwksError, match=str(tmp_path / "missing.json")):
        read_jwks_file(tmp_path / "missing.json")
    path.write_text("{}")
    with pytest.raises(JwksError, match=f"{path}: not a JWKS"):
        read_jwks_file(path)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["keys", "kty", "kid", "n", "e",
                                                             "crv", "x", "y", "alg", "use",
                                                             "d", "key_ops"]), inner,
                                            max_size=6)),
    max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_parse_jwks_raises_only_jwks_error(doc) -> None:
    try:
        keys = parse_jwks(doc)
    except JwksError:
        return
    assert len(keys) >= 1


# ------------------------------------------------------------------------------ the cache


def _cache(**kw) -> JwksCache:
    return JwksCache(**({"refresh_seconds": 3600, "min_refresh_seconds": 30,
                         "retry_seconds": 5, "max_retry_seconds": 60} | kw))


def test_first_fetch_is_due_at_once_then_after_the_interval(issuer: Issuer) -> None:
    cache = _cache()
    assert cache.due(0.0) and cache.keys(0.0) is None and cache.age(0.0) is None
    cache.fetch_started(0.0)
    assert not cache.due(0.0) and cache.next_fetch_at() is None and cache.in_flight
    cache.fetched(issuer.jwks(), 1.0)
    assert cache.keys(1.0) is not None and cache.next_fetch_at() == 3601.0
    assert not cache.due(3600.0) and cache.due(3601.0)
    assert cache.status(11.0).age_seconds == 10.0 and cache.status(11.0).keys == 2


def test_rotation_a_new_kid_after_refresh(issuer: Issuer) -> None:
    config = make_config()
    cache = _cache()
    cache.fetch_started(0.0)
    cache.fetched(issuer.jwks("rsa-1"), 0.0)
    issuer.add_rsa("rsa-2")
    token = issuer.token("rsa-2")
    with pytest.raises(TokenRejected) as info:
        validate_token(token, config, cache.keys(10.0), NOW)
    assert info.value.reason is RejectReason.UNKNOWN_KID
    # the first fetch started at 0: an unknown kid at 10 s is within min_refresh (30 s)
    assert cache.unknown_kid(info.value.kid, 10.0) is False and not cache.due(10.0)
    # at 31 s it may fetch early
    assert cache.unknown_kid("rsa-2", 31.0) is True and cache.due(31.0)
    cache.fetch_started(31.0)
    assert cache.unknown_kid("rsa-2", 31.5) is True  # under way: wait for it
    cache.fetched(issuer.jwks("rsa-2"), 32.0)  # the old key retired, the new one published
    assert validate_token(token, config, cache.keys(32.0), NOW).kid == "rsa-2"
    with pytest.raises(TokenRejected):
        validate_token(issuer.token("rsa-1"), config, cache.keys(32.0), NOW)


def test_random_kids_cannot_make_it_fetch_on_every_connection(issuer: Issuer) -> None:
    cache = _cache()
    cache.fetch_started(0.0)
    cache.fetched(issuer.jwks(), 0.0)
    fetches = 0
    t = 30.0
    while t < 330.0:  # ten connections a second for five minutes, each with a new kid
        if cache.unknown_kid(f"random-{t}", t) and cache.due(t):
            cache.fetch_started(t)
            cache.fetched(issuer.jwks(), t + 0.05)
            fetches += 1
        t += 0.1
    assert fetches == 10  # one per min_refresh_seconds


def test_back_off_on_failures_and_stale_keys_stay_in_use(issuer: Issuer) -> None:
    cache = _cache()
    cache.fetch_started(0.0)
    cache.fetched(issuer.jwks(), 0.0)
    t = 3600.0
    waits = []
    for _ in range(6):
        assert cache.due(t)
        cache.fetch_started(t)
        cache.fetch_failed("connection refused", t)
        nxt = cache.next_fetch_at()
        assert nxt is not None
        waits.append(nxt - t)
        t = nxt
    assert waits == [5, 10, 20, 40, 60, 60]
    status = cache.status(t)
    assert status.failures == 6 and status.last_error == "connection refused"
    assert status.usable and cache.keys(t) is not None and status.age_seconds == t
    # while failing, an unknown kid does not shorten the back-off
    assert cache.unknown_kid("new", t - 1) is False
    # a bad document counts as a failure too, and keeps the keys
    cache.fetch_started(t)
    with pytest.raises(JwksError):
        cache.fetched(b"<html>503</html>", t)
    assert cache.status(t).failures == 7 and cache.keys(t) is not None
    # success resets
    cache.fetch_started(t + 60)
    cache.fetched(issuer.jwks(), t + 60)
    assert cache.status(t + 60).failures == 0 and cache.status(t + 60).last_error is None
    assert cache.next_fetch_at() == t + 60 + 3600


def test_max_stale_stops_using_old_keys(issuer: Issuer) -> None:
    cache = _cache(max_stale_seconds=7200)
    cache.fetch_started(0.0)
    cache.fetched(issuer.jwks(), 0.0)
    cache.fetch_started(3600.0)
    cache.fetch_failed("timeout", 3600.0)
    assert cache.keys(7200.0) is not None and cache.keys(7201.0) is None
    assert not cache.status(7201.0).usable
    with pytest.raises(TokenRejected) as info:
        validate_token(issuer.token(), make_config(), cache.keys(7201.0), NOW)
    assert info.value.reason is RejectReason.JWKS_UNAVAILABLE


def test_failures_before_any_keys(issuer: Issuer) -> None:
    cache = _cache()
    cache.fetch_started(0.0)
    cache.fetch_failed("name does not resolve", 0.0)
    assert cache.keys(1.0) is None and cache.next_fetch_at() == 5.0
    assert cache.unknown_kid(None, 1.0) is False


def test_from_config() -> None:
    config = make_config(jwks_file=None, jwks_url="https://idp.test/certs",
                         jwks_refresh_seconds=600, jwks_min_refresh_seconds=10)
    cache = JwksCache.from_config(config)
    assert (cache.refresh_seconds, cache.min_refresh_seconds, cache.source) == (
        600, 10, "https://idp.test/certs")
    with pytest.raises(ValueError, match="refresh_seconds"):
        JwksCache(refresh_seconds=0)
