"""Byte-level handshake shortcuts (``amqp.handshake``) agree with proton's decoder: the
sasl-mechanisms recognised, the sasl-init and sasl-outcome and the Open's first fields read
from their bytes, and an Open with max-frame-size/channel-max patched."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.errors import AmqpError
from amqp_policy_proxy.amqp.handshake import (
    OpenHead,
    is_sasl_mechanisms,
    patch_open,
    read_open_head,
    read_sasl_init,
    sasl_outcome_code,
)
from amqp_policy_proxy.amqp.performatives import (
    Open,
    SaslInit,
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



def _decode_or_none(body: bytes):
    try:
        perf, consumed = decode_performative(body)
    except (AmqpError, Exception):  # noqa: B014  (proton raises several types)
        return None
    return perf if consumed == len(body) else None


def _head_of(perf: Open) -> tuple:
    """The four values of an Open that :class:`OpenHead` holds."""
    def num(v):
        return None if v is None else int(v)

    return (perf.container_id, perf.hostname, num(perf.max_frame_size), num(perf.channel_max))


def _values(head: OpenHead | None) -> tuple | None:
    """The values read (without the field offsets the head carries for ``patch_open``)."""
    return None if head is None else tuple(head[:4])


# --- sasl-mechanisms


def test_mechanisms_from_routers_and_proton():
    for mechs in (["ANONYMOUS", "PLAIN"], ["PLAIN"], ["SCRAM-SHA-256", "EXTERNAL"] * 20):
        body = SaslMechanisms(sasl_server_mechanisms=symbol_array(mechs)).encode()
        assert is_sasl_mechanisms(body, 0, len(body))
    # qdrouterd/proton-c: list8 holding an array8 of sym8
    items = b"\x05PLAIN\x09ANONYMOUS"
    array = bytes((0xE0, 2 + len(items), 2, 0xA3)) + items
    router = bytes((0x00, 0x53, 0x40, 0xC0, 1 + len(array), 1)) + array
    assert isinstance(_decode_or_none(router), SaslMechanisms)
    assert is_sasl_mechanisms(router, 0, len(router))
    # an array whose size disagrees with its elements is left to the decoder
    bad = router[:7] + bytes((router[7] - 1,)) + router[8:]
    assert not is_sasl_mechanisms(bad, 0, len(bad))
    single = bytes.fromhex("005340c00801a305504c41494e")
    assert isinstance(_decode_or_none(single), SaslMechanisms)
    assert is_sasl_mechanisms(single, 0, len(single))


def test_mechanisms_never_taken_for_anything_else():
    for body in (OUTCOME_OK_LIST8, SaslInit(mechanism="PLAIN").encode(),
                 bytes.fromhex("005340c00701a305504c41c94e"),  # not ASCII
                 bytes.fromhex("005340c00701a305504c41494e40"),  # bytes after the list
                 bytes.fromhex("00534045")):  # no field
        assert not is_sasl_mechanisms(body, 0, len(body)), body.hex()


@given(st.binary(max_size=40), st.integers(0, 5))
@settings(max_examples=500, deadline=None)
def test_mechanisms_answer_is_what_proton_decodes(raw, prefix):
    good = SaslMechanisms(sasl_server_mechanisms=symbol_array(["ANONYMOUS", "PLAIN"])).encode()
    body = good[:prefix] + raw if prefix else raw
    if is_sasl_mechanisms(body, 0, len(body)):
        assert isinstance(_decode_or_none(body), SaslMechanisms)


# --- sasl-init


inits = st.builds(
    SaslInit,
    mechanism=st.sampled_from(["PLAIN", "ANONYMOUS", "SCRAM-SHA-1", "EXTERNAL", ""]),
    initial_response=st.one_of(st.none(), st.binary(max_size=300)),
    hostname=st.one_of(st.none(), st.text(max_size=20)),
)


@given(inits)
@settings(max_examples=300, deadline=None)
def test_sasl_init_read_as_proton_decodes_it(init):
    body = init.encode()
    decoded = _decode_or_none(body)
    got = read_sasl_init(body, 0, len(body))
    assert got is not None
    assert got == (str(decoded.mechanism), decoded.initial_response)


def test_sasl_init_from_proton_c_bytes():
    # list8, sym8 PLAIN, vbin8 "\0u\0p", str8 hostname
    body = bytes.fromhex("005341c01003a305504c41494ea004007500" "70" "a1026868")
    body = body[:4] + bytes((len(body) - 5,)) + body[5:]
    assert read_sasl_init(body, 0, len(body)) == ("PLAIN", b"\x00u\x00p")
    assert read_sasl_init(body, 2, len(body)) is None


@given(st.binary(min_size=1, max_size=40))
@settings(max_examples=500, deadline=None)
def test_sasl_init_answer_is_what_proton_decodes(tail):
    body = bytes.fromhex("005341") + tail
    got = read_sasl_init(body, 0, len(body))
    if got is None:
        return
    decoded = _decode_or_none(body)
    assert isinstance(decoded, SaslInit)
    assert got == (str(decoded.mechanism), decoded.initial_response)


# --- Open


opens = st.builds(
    Open,
    container_id=st.text(max_size=20),
    hostname=st.one_of(st.none(), st.text(max_size=30), st.text(min_size=250, max_size=300)),
    max_frame_size=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    channel_max=st.one_of(st.none(), st.integers(0, 0xFFFF)),
    idle_time_out=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    offered_capabilities=st.one_of(st.none(), st.just(symbol_array(["ANONYMOUS-RELAY"]))),
    properties=st.one_of(st.none(), st.just({"product": "x"})),
)


def test_open_head_of_a_proton_client():
    assert _values(read_open_head(OPEN_LIST8)) == ("client", "test", None, 0x7FFF)


@given(opens)
@settings(max_examples=300, deadline=None)
def test_open_head_is_what_proton_decodes(open_):
    body = open_.encode()
    decoded = _decode_or_none(body)
    strict = read_open_head(body)
    relaxed = read_open_head(body, strict=False)
    assert _values(relaxed) == _head_of(decoded)
    later = decoded.offered_capabilities is not None or decoded.properties is not None
    # a NUL in container-id or hostname is left to the strict (canonical) check, which refuses it
    nul = "\x00" in decoded.container_id or "\x00" in (decoded.hostname or "")
    assert _values(strict) == (None if later or nul else _head_of(decoded))


@given(st.binary(min_size=1, max_size=48), st.integers(0, 16))
@settings(max_examples=500, deadline=None)
def test_strict_open_head_only_where_proton_agrees(tail, prefix):
    body = OPEN_LIST8[:3] + (OPEN_LIST8[3:3 + prefix] + tail if prefix else tail)
    head = read_open_head(body)
    if head is None:
        return
    decoded = _decode_or_none(body)
    assert isinstance(decoded, Open) and _head_of(decoded) == _values(head)


@given(opens, st.one_of(st.none(), st.integers(0, 2**32 - 1)),
       st.one_of(st.none(), st.integers(0, 0xFFFF)))
@settings(max_examples=300, deadline=None)
def test_patched_open_decodes_as_the_replaced_one(open_, mfs, cmax):
    body = open_.encode()
    decoded = _decode_or_none(body)
    patched = patch_open(body, max_frame_size=mfs, channel_max=cmax)
    assert patched is not None
    changes = {k: v for k, v in (("max_frame_size", mfs), ("channel_max", cmax))
               if v is not None}
    assert _decode_or_none(patched) == dataclasses.replace(decoded, **changes)
    head = read_open_head(body, strict=False)
    if head is not None:  # the offsets the head carries patch the same bytes
        assert patch_open(body, max_frame_size=mfs, channel_max=cmax,
                          fields=head.fields) == patched


def test_patch_keeps_every_other_byte():
    patched = patch_open(OPEN_LIST8, channel_max=32759)
    assert patched is not None and len(patched) == len(OPEN_LIST8)
    assert patched[:-2] == OPEN_LIST8[:-2] and patched[-2:] == (32759).to_bytes(2, "big")
    # channel-max absent: added after a null max-frame-size, list8 kept
    short = bytes.fromhex("005310c00902a101" "63" "a1026868")
    short = short[:4] + bytes((len(short) - 5,)) + short[5:]
    grown = patch_open(short, channel_max=9)
    assert grown is not None and grown[3] == 0xC0
    assert _decode_or_none(grown) == Open(container_id="c", hostname="hh", channel_max=9)


def test_patch_leaves_other_shapes_to_the_encoder():
    assert patch_open(OPEN_LIST8 + b"\x40", channel_max=5) is None  # bytes after the list
    assert patch_open(b"\x00\x53\x11" + OPEN_LIST8[3:], channel_max=5) is None  # a Begin
    assert patch_open(bytes.fromhex("00800000000000000010") + OPEN_LIST8[3:],
                      channel_max=5) is None  # ulong descriptor


@given(st.binary(min_size=1, max_size=40))
@settings(max_examples=300, deadline=None)
def test_patching_crafted_opens_never_goes_wrong(tail):
    body = OPEN_LIST8[:3] + tail
    decoded = _decode_or_none(body)
    patched = patch_open(body, channel_max=7)
    if patched is None or decoded is None:
        return
    # whatever it patched decodes to the same Open with only channel-max changed
    assert _decode_or_none(patched) == dataclasses.replace(decoded, channel_max=7)
