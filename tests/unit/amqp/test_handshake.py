"""Byte-level handshake shortcuts (``amqp.handshake``) agree with proton's decoder: the
sasl-outcome code read from its bytes, and an Open with channel-max patched in place."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.errors import AmqpError
from amqp_policy_proxy.amqp.handshake import open_with_channel_max, sasl_outcome_code
from amqp_policy_proxy.amqp.performatives import (
    Open,
    SaslMechanisms,
    SaslOutcome,
    decode_performative,
)

# written by hand in the list8 form routers emit (proton-c / qdrouterd)
OUTCOME_OK_LIST8 = bytes.fromhex("005344c0030150" "00")
OUTCOME_AUTH_DATA_LIST8 = bytes.fromhex("005344c0070250" "01" "a0027879")
OUTCOME_NULL_DATA_LIST8 = bytes.fromhex("005344c004025000" "40")
# a python-qpid-proton 0.40 client's Open: list8 with container-id, hostname, channel-max
# as ushort 0x7fff after a null max-frame-size
OPEN_LIST8 = bytes.fromhex("005310c01304a106636c69656e74a104746573744060" "7fff")


def _code(body: bytes) -> int | None:
    return sasl_outcome_code(body, 0, len(body))


def test_outcome_code_from_router_and_proton_encodings():
    assert _code(OUTCOME_OK_LIST8) == 0
    assert _code(OUTCOME_AUTH_DATA_LIST8) == 1
    assert _code(OUTCOME_NULL_DATA_LIST8) == 0
    for code in range(5):
        assert _code(SaslOutcome(code=code).encode()) == code
        assert _code(SaslOutcome(code=code, additional_data=b"x" * 300).encode()) == code


def test_outcome_code_leaves_everything_else_to_the_decoder():
    others = [
        SaslMechanisms(sasl_server_mechanisms=symbol_array(["PLAIN"])).encode(),
        bytes.fromhex("00534445"),  # list0: no code
        OUTCOME_OK_LIST8 + b"\x00",  # bytes after the list
        OUTCOME_OK_LIST8[:-1],  # truncated
        bytes.fromhex("005344c0020143"),  # code as uint, not ubyte
        bytes.fromhex("005344c00402500071"),  # additional-data of the wrong type
        bytes.fromhex("005344c005035000" "4040"),  # three fields
        bytes.fromhex("00800000000000000044c0020150" "00"),  # ulong descriptor
    ]
    for body in others:
        assert _code(body) is None, body.hex()


@given(st.binary(max_size=24), st.integers(0, 3))
@settings(max_examples=500, deadline=None)
def test_outcome_code_is_what_proton_decodes(raw, prefix):
    body = (OUTCOME_AUTH_DATA_LIST8[:prefix * 3] + raw) if prefix else raw
    code = _code(body)
    if code is None:
        return
    perf, consumed = decode_performative(body)
    assert isinstance(perf, SaslOutcome) and consumed == len(body)
    assert int(perf.code) == code


def test_open_channel_max_patched_in_place():
    patched = open_with_channel_max(OPEN_LIST8, 32759)
    assert patched is not None and len(patched) == len(OPEN_LIST8)
    assert patched[:-2] == OPEN_LIST8[:-2] and patched[-2:] == (32759).to_bytes(2, "big")
    before, _ = decode_performative(OPEN_LIST8)
    after, _ = decode_performative(patched)
    assert after == dataclasses.replace(before, channel_max=32759)


def test_open_without_a_channel_max_to_patch_is_left_to_the_encoder():
    assert open_with_channel_max(Open(container_id="c").encode(), 5) is None  # absent
    assert open_with_channel_max(
        Open(container_id="c", hostname="h", max_frame_size=512).encode(), 5) is None
    null_cmax = bytes.fromhex("005310c00604a101634040" "40")
    assert open_with_channel_max(null_cmax, 5) is None
    assert open_with_channel_max(OPEN_LIST8 + b"\x40", 5) is None  # bytes after the list
    assert open_with_channel_max(b"\x00\x53\x11" + OPEN_LIST8[3:], 5) is None  # a Begin


opens = st.builds(
    Open,
    container_id=st.text(max_size=20),
    hostname=st.one_of(st.none(), st.text(max_size=30)),
    max_frame_size=st.one_of(st.none(), st.integers(512, 2**32 - 1)),
    channel_max=st.one_of(st.none(), st.integers(0, 0xFFFF)),
    idle_time_out=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    offered_capabilities=st.one_of(st.none(), st.just(symbol_array(["ANONYMOUS-RELAY"]))),
)


@given(opens, st.integers(0, 0xFFFF))
@settings(max_examples=300, deadline=None)
def test_patched_open_decodes_as_the_replaced_one(open_, new):
    body = open_.encode()
    decoded, _ = decode_performative(body)
    patched = open_with_channel_max(body, new)
    if decoded.channel_max is None:
        assert patched is None
        return
    assert patched is not None
    assert decode_performative(patched)[0] == dataclasses.replace(decoded, channel_max=new)


@given(st.binary(min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_patching_crafted_opens_never_goes_wrong(tail):
    body = OPEN_LIST8[:3] + tail
    try:
        decoded, consumed = decode_performative(body)
    except (AmqpError, Exception):  # noqa: B014  (proton raises several types)
        decoded = None
    patched = open_with_channel_max(body, 7)
    if patched is None:
        return
    # whatever it patched decodes to the same Open with only channel-max changed
    assert decoded is not None and consumed == len(body)
    assert decode_performative(patched)[0] == dataclasses.replace(decoded, channel_max=7)
