"""In-band renewal: CBS put-token and RabbitMQ's PUT /auth/tokens, parsed from messages a stock
proton client builds and answered in messages proton reads back; the renewal rule; the parsers
fuzzed (they read bytes from the network)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message as ProtonMessage
from proton import int32, symbol, timestamp, ulong

from amqp_policy_proxy.tokens.claims import identity_from_token
from amqp_policy_proxy.tokens.errors import RejectReason
from amqp_policy_proxy.tokens.renewal import (
    RenewalRequestError,
    answer_auth_tokens,
    answer_cbs,
    auth_tokens_response,
    cbs_response,
    parse_auth_tokens_put,
    parse_cbs_put_token,
    renew,
)
from amqp_policy_proxy.tokens.sections import (
    Int32,
    MessageError,
    Properties,
    decode_message,
    encode_message,
)
from amqp_policy_proxy.tokens.validate import validate_token

from .conftest import NOW, Issuer, make_config

GROUPS = [{"vhost": "orders", "group": "writers", "scopes": ["orders.write"]},
          {"vhost": "orders", "group": "readers", "scopes": ["orders.read"]}]


_MID = ulong(7)


def _cbs_request(token="a.b.c", *, mid=_MID, reply_to="cbs-reply", **app) -> bytes:
    props = {"operation": "put-token", "type": "jwt", "name": "amqp://proxy/orders",
             "expiration": timestamp(int((NOW + 300) * 1000))} | app
    msg = ProtonMessage(body=token, properties={k: v for k, v in props.items() if v is not None})
    msg.id = mid
    msg.reply_to = reply_to
    return msg.encode()


def _put_request(token=b"a.b.c", *, mid="req-1", to="/auth/tokens", subject="PUT",
                 reply_to="$me") -> bytes:
    msg = ProtonMessage(body=token)
    msg.id, msg.address, msg.subject, msg.reply_to = mid, to, subject, reply_to
    return msg.encode()


def _read(data: bytes) -> ProtonMessage:
    msg = ProtonMessage()
    msg.decode(data)
    return msg


# ----------------------------------------------------------------------------- CBS


def test_cbs_put_token_round_trip() -> None:
    req = parse_cbs_put_token(_cbs_request("x.y.z"))
    assert (req.message_id, req.reply_to, req.token_type, req.audience) == (
        7, "cbs-reply", "jwt", "amqp://proxy/orders")
    assert req.expiration == NOW + 300 and req.token == "x.y.z"
    assert "x.y.z" not in repr(req)
    raw = cbs_response(req.message_id, req.reply_to, 202, "Accepted")
    reply = _read(raw)
    assert reply.correlation_id == 7
    props = decode_message(raw).properties
    assert props is not None and isinstance(props.correlation_id, ulong)  # on the wire
    assert reply.address == "cbs-reply" and reply.body is None
    assert reply.properties == {"status-code": 202, "status-description": "Accepted"}
    assert isinstance(reply.properties["status-code"], int32)


@pytest.mark.parametrize("mid", [ulong(1), uuid.UUID(int=5), b"\x01\x02", "id-1"])
def test_cbs_correlation_id_keeps_the_message_ids_type(mid) -> None:
    req = parse_cbs_put_token(_cbs_request(mid=mid))
    raw = cbs_response(req.message_id, None, 401, "expired")
    reply = _read(raw)
    props = decode_message(raw).properties
    assert props is not None and props.correlation_id == mid
    assert type(props.correlation_id) is type(mid)
    assert reply.address is None and reply.properties["status-code"] == 401


def test_cbs_accepts_the_servicebus_jwt_type_and_no_expiration() -> None:
    req = parse_cbs_put_token(_cbs_request(type="servicebus.windows.net:jwt", expiration=None))
    assert req.token_type == "servicebus.windows.net:jwt" and req.expiration is None


@pytest.mark.parametrize(("request_bytes", "why"), [
    (_cbs_request(operation="delete-token"), "only put-token"),
    (_cbs_request(operation=None), "only put-token"),
    (_cbs_request(type="servicebus.windows.net:sastoken"), "only jwt"),
    (_cbs_request(type=None), "type and name"),
    (_cbs_request(name=None), "type and name"),
    (_cbs_request(name=int32(3)), "type and name"),
    (_cbs_request(expiration=int32(3)), "not a timestamp"),
    (_cbs_request(token=b"a.b.c"), "amqp-value string"),
    (_cbs_request(token=""), "amqp-value string"),
    (_cbs_request(token=None), "amqp-value string"),
])
def test_malformed_cbs_requests_are_400_with_their_ids(request_bytes, why) -> None:
    with pytest.raises(RenewalRequestError) as info:
        parse_cbs_put_token(request_bytes)
    err = info.value
    assert err.status_code == 400 and why in err.description, err.description
    assert err.message_id == 7 and err.reply_to == "cbs-reply"


def test_cbs_request_without_message_id() -> None:
    with pytest.raises(RenewalRequestError) as info:
        parse_cbs_put_token(_cbs_request(mid=None))
    assert info.value.status_code == 400 and info.value.message_id is None


# ----------------------------------------------------------------- HTTP over AMQP


def test_put_auth_tokens_round_trip() -> None:
    req = parse_auth_tokens_put(_put_request(b"t.o.k"))
    assert (req.message_id, req.reply_to, req.token) == ("req-1", "$me", b"t.o.k")
    assert "t.o.k" not in repr(req)
    ok = _read(auth_tokens_response(req.message_id, 204))
    assert (ok.subject, ok.correlation_id, ok.body) == ("204", "req-1", None)
    assert ok.properties == {"http:response": "1.1"}
    no = _read(auth_tokens_response(req.message_id, 401, "expired: exp is 5 s past"))
    assert (no.subject, no.body) == ("401", "expired: exp is 5 s past")


def test_put_auth_tokens_body_as_string_or_data() -> None:
    assert parse_auth_tokens_put(_put_request("t.o.k")).token == b"t.o.k"
    data = encode_message(Properties(message_id="m", to="/auth/tokens", subject="PUT"),
                          body=b"t.o.k", body_kind="data")
    assert parse_auth_tokens_put(data).token == b"t.o.k"


@pytest.mark.parametrize(("request_bytes", "status"), [
    (_put_request(to="/queues/q1", subject="GET"), 404),
    (_put_request(to=None), 404),
    (_put_request(subject="DELETE"), 405),
    (_put_request(subject=None), 405),
    (_put_request(token=None), 400),
    (_put_request(token=b""), 400),
    (_put_request(token=[1, 2]), 400),
])
def test_other_or_malformed_http_requests(request_bytes, status) -> None:
    with pytest.raises(RenewalRequestError) as info:
        parse_auth_tokens_put(request_bytes)
    assert info.value.status_code == status and info.value.message_id == "req-1"


def test_http_request_without_message_id() -> None:
    with pytest.raises(RenewalRequestError) as info:
        parse_auth_tokens_put(_put_request(mid=None))
    assert info.value.status_code == 400 and info.value.message_id is None


# ---------------------------------------------------------------------- sections


def test_sections_order_kinds_and_limits() -> None:
    props = encode_message(Properties(message_id="m"))
    value = encode_message(body="x", body_kind="value")
    app = encode_message(application_properties=[("a", 1)])
    data = encode_message(body=b"x", body_kind="data")
    for bad in (props + props, value + props, app + props, value + value, data + value,
                b"\x00\x53\x99\x40", b"\x40", b"\x00\xa3\x03abc\x40", b"\x00\x53\x75\x45",
                b"\x00\x53\x74\xc1\x03\x02\x54\x01", b"\x00\x53\x73\xc0\x02\x01\xa3\x01"):
        with pytest.raises(MessageError):
            decode_message(bad)
    assert decode_message(data + data).body == b"xx"
    with pytest.raises(MessageError, match="more than"):
        decode_message(b"\x40" * 100, max_bytes=10)
    assert decode_message(b"").body_kind is None


def test_symbolic_section_descriptors_are_read() -> None:
    raw = b"\x00\xa3\x14amqp:properties:list\xc0\x03\x01\xa1\x00"
    assert decode_message(raw).properties == Properties(message_id="")


def test_large_application_properties_use_map32() -> None:
    pairs = [(f"k{i}", "v" * 20) for i in range(20)]
    got = decode_message(encode_message(application_properties=pairs))
    assert dict(got.application_properties) == dict(pairs)
    assert decode_message(encode_message(
        application_properties=[("c", Int32(-5))])).application_properties["c"] == -5


# ------------------------------------------------------------------------ the rule


def _identity(issuer: Issuer, config, **claims):
    return identity_from_token(validate_token(issuer.token(**claims), config, issuer.keyset(),
                                              NOW), config)


def test_renewal_same_subject_later_exp_replaces_identity_and_groups(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS)
    current = _identity(issuer, config, scope="amqp-proxy.orders.write")
    token = issuer.token(exp=NOW + 900, scope="amqp-proxy.orders.read")
    out = renew(current, token, config=config, keys=issuer.keyset(), now=NOW + 200)
    assert out.accepted and out.reason is None and out.groups_changed
    assert out.identity.expires_at == NOW + 900 and dict(out.identity.groups) == {
        "orders": "readers"}
    assert out.token is not None and out.token.subject == "alice"
    req = parse_cbs_put_token(_cbs_request(token))
    reply = _read(answer_cbs(req, out))
    assert reply.properties["status-code"] == 202 and reply.correlation_id == 7
    put = parse_auth_tokens_put(_put_request(token.encode()))
    assert _read(answer_auth_tokens(put, out)).subject == "204"


def test_renewal_with_the_same_groups(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS)
    current = _identity(issuer, config, scope="amqp-proxy.orders.write")
    out = renew(current, issuer.token(exp=NOW + 600, scope="amqp-proxy.orders.write"),
                config=config, keys=issuer.keyset(), now=NOW)
    assert out.accepted and not out.groups_changed


@pytest.mark.parametrize(("claims", "reason"), [
    ({"sub": "mallory", "exp": NOW + 900}, RejectReason.SUBJECT_CHANGED),
    ({"exp": NOW + 100}, RejectReason.NOT_NEWER),
    ({"exp": NOW - 100}, RejectReason.EXPIRED),
    ({"exp": NOW + 900, "aud": "other"}, RejectReason.BAD_AUDIENCE),
])
def test_a_worse_token_changes_nothing_and_is_refused(issuer: Issuer, claims, reason) -> None:
    config = make_config(groups=GROUPS)
    current = _identity(issuer, config, scope="amqp-proxy.orders.write")
    token = issuer.token(scope="amqp-proxy.orders.read", **claims)
    out = renew(current, token, config=config, keys=issuer.keyset(), now=NOW)
    assert not out.accepted and out.reason is reason and out.identity is current
    assert token not in out.detail
    reply = _read(answer_cbs(parse_cbs_put_token(_cbs_request(token)), out))
    assert reply.properties["status-code"] == 401
    assert reply.properties["status-description"].startswith(reason.value)
    put = _read(answer_auth_tokens(parse_auth_tokens_put(_put_request(token)), out))
    assert put.subject == "401" and put.body.startswith(reason.value)


def test_a_tampered_renewal_is_refused(issuer: Issuer) -> None:
    config = make_config()
    current = _identity(issuer, config)
    head, body, sig = issuer.token(exp=NOW + 900).split(".")
    out = renew(current, f"{head}.{body}x.{sig}", config=config, keys=issuer.keyset(), now=NOW)
    assert not out.accepted and out.reason in (RejectReason.BAD_SIGNATURE,
                                               RejectReason.MALFORMED)


# ------------------------------------------------------------------------ fuzzing

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**31, 2**31 - 1).map(int32),
                    st.text(max_size=12), st.binary(max_size=12),
                    st.integers(0, 2**63 - 1).map(timestamp), st.sampled_from(
                        ["put-token", "jwt", "PUT", "/auth/tokens", symbol("jwt")]))


@st.composite
def _messages(draw) -> bytes:
    msg = ProtonMessage(body=draw(_VALUES), properties=draw(st.dictionaries(
        st.sampled_from(["operation", "type", "name", "expiration", "other"]), _VALUES,
        max_size=5)))
    msg.id = draw(st.one_of(st.none(), st.text(max_size=5), st.integers(0, 2**64 - 1).map(ulong),
                            st.uuids()))
    msg.address = draw(st.one_of(st.none(), st.sampled_from(["/auth/tokens", "$cbs", "/x"])))
    msg.subject = draw(st.one_of(st.none(), st.sampled_from(["PUT", "GET", ""])))
    msg.reply_to = draw(st.one_of(st.none(), st.just("$me")))
    return msg.encode()


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=300), _messages(),
                 st.tuples(_messages(), st.binary(max_size=20)).map(lambda t: t[0] + t[1]),
                 _messages().flatmap(lambda m: st.integers(0, len(m)).map(lambda n: m[:n]))))
def test_renewal_parsers_raise_only_renewal_request_error(data: bytes) -> None:
    for parse in (parse_cbs_put_token, parse_auth_tokens_put):
        try:
            req = parse(data)
        except RenewalRequestError as err:
            assert err.status_code in (400, 404, 405)
            continue
        assert req.token
        assert req.message_id is not None


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(mid=st.one_of(st.integers(0, 2**64 - 1).map(ulong), st.uuids(), st.binary(max_size=8),
                     st.text(max_size=8)),
       code=st.sampled_from([202, 400, 401]), text=st.text(max_size=300))
def test_responses_read_back_by_proton(mid, code, text) -> None:
    cbs = _read(cbs_response(mid, "r", code, text))
    assert cbs.correlation_id == mid and cbs.properties == {"status-code": code,
                                                            "status-description": text}
    http = _read(auth_tokens_response(mid, code, text or None))
    assert http.correlation_id == mid and http.subject == str(code)
    assert http.body == (text or None)
