"""The hand-written Transfer and message-properties readers (Part 2 §2.7.5, Part 3 §3.2.4).

Byte tables are written by hand (and one captured from a python-qpid-proton client) so that the
readers are not only checked against the project's own encoder.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.transfer import (
    delivery_tag_at,
    read_flow_fields,
    read_transfer,
    read_transfer_fields,
    skip_value,
    transfer_with_delivery_id,
)

# proton-c client, first frame of a two-frame message: list8, 6 fields, settled null, more true
PROTON_C_FIRST = bytes.fromhex("005314c00a06520143a00131434041") + b"payload"


def _fields(buf: bytes) -> tuple:
    return read_transfer_fields(buf, 0, len(buf))


def test_proton_c_transfer_read_inline():
    handle, delivery_id, settled, more, aborted, payload, tag = _fields(PROTON_C_FIRST)
    assert (handle, delivery_id, settled, more, aborted) == (1, 0, False, True, False)
    assert PROTON_C_FIRST[payload:] == b"payload"
    assert delivery_tag_at(PROTON_C_FIRST, tag) == b"1"


def test_loadgen_transfer_read_inline():
    # bench load generator: list8, uint handle/delivery-id as 0x70, settled true, count 5
    buf = bytes.fromhex("005314c0170570000000007000003039a008") + b"bench-tg" + b"\x43\x41m"
    handle, delivery_id, settled, more, aborted, payload, tag = _fields(buf)
    assert (handle, delivery_id, settled, more, aborted) == (0, 12345, True, False, False)
    assert buf[payload:] == b"m"
    assert delivery_tag_at(buf, tag) == b"bench-tg"


def test_fields_without_tag_give_offset_minus_one():
    buf = bytes.fromhex("005314c00302434340")  # handle 0, delivery-id 0, then payload 0x40
    assert _fields(buf) == (0, 0, False, False, False, 8, -1)
    assert delivery_tag_at(buf, -1) is None


def test_aborted_transfer_goes_through_the_reference_reader():
    # 10 fields: ..., rcv-settle-mode null, state null, resume false, aborted true
    buf = bytes.fromhex("005314c00d0a4343a00131434042404042 41".replace(" ", ""))
    assert _fields(buf)[:5] == (0, 0, False, False, True)
    assert read_transfer(buf, 0, len(buf)).aborted is True


def test_ulong_descriptor_form_is_accepted():
    buf = bytes.fromhex("00800000000000000014c0070443 43a0013143".replace(" ", ""))
    assert _fields(buf)[:2] == (0, 0)
    assert delivery_tag_at(buf, _fields(buf)[6]) == b"1"


@pytest.mark.parametrize(
    ("hexbytes", "message"),
    [
        ("005314c0030343 43a0", "count and size disagree"),
        ("005314c0040343 43a0", "truncated value"),  # binary8 tag: its length byte missing
        ("005314c0040343 43b000", "truncated value"),  # binary32 tag cut inside its length
        ("005314c0050343 43b0000000", "truncated value"),
        ("005314c00100", "transfer without its mandatory field 0"),
        ("005314c0020140", "transfer without its mandatory field 0"),
        ("005314c00302 43a1", "field 1 is not a uint"),
        ("005314c00403 4343 a1", "field 2 is not a binary"),
        # canonical form only (issue 14 finding 7): a sixth field, `more`, hidden inside the
        # size of a list whose count says five
        ("005314c00805 4343a000 4342 41", "count and size disagree"),
    ],
)
def test_malformed_transfer_raises_decode_error_only(hexbytes, message):
    buf = bytes.fromhex(hexbytes.replace(" ", ""))
    for reader in (read_transfer, read_transfer_fields):
        with pytest.raises(DecodeError, match=message):
            reader(buf, 0, len(buf))


def test_deeply_nested_described_state_is_a_decode_error_not_a_recursion_error():
    # regression: skip_value recursed once per 0x00 and a frame of them raised RecursionError
    body = b"\x43\x43\x40\x40\x40\x40\x40" + b"\x00" * 5000 + b"\x43\x43"
    buf = b"\x00\x53\x14\xd0" + (len(body) + 4).to_bytes(4, "big") + (8).to_bytes(4, "big") + body
    for reader in (read_transfer, read_transfer_fields):
        with pytest.raises(DecodeError, match="descriptor is not a ulong or a symbol"):
            reader(buf, 0, len(buf))


def test_nested_described_value_is_skipped_whole():
    # described(described(0x53 01, 0x53 02), str8 "x")
    assert skip_value(bytes.fromhex("0000530153 02a10178"), 0, 9) == 9
    with pytest.raises(DecodeError):
        skip_value(bytes.fromhex("0000530153 02a101".replace(" ", "")), 0, 8)


def _framed(body: bytes, channel: int = 3, doff: int = 2) -> bytes:
    head = (8 + (doff - 2) * 4 + len(body)).to_bytes(4, "big") + bytes([doff, 0])
    return head + channel.to_bytes(2, "big") + b"\0" * ((doff - 2) * 4) + body


@pytest.mark.parametrize(("new", "field"), [
    (0, "43"),  # fits the 0x43 it had: same bytes
    (7, "5207"),  # wider: list and frame grow by one byte
    (300, "700000012c"),
])
def test_renumbered_transfer_changes_only_the_delivery_id(new, field):
    buf = _framed(PROTON_C_FIRST)  # delivery-id 0 as 0x43
    out = transfer_with_delivery_id(buf, 8, len(buf), 3, new)
    expected = bytes.fromhex("005314c0") + bytes([0x0A + len(field) // 2 - 1, 6])
    expected += bytes.fromhex("5201" + field + "a00131434041") + b"payload"
    assert out == _framed(expected)
    assert _fields(out[8:])[:5] == (1, new, False, True, False)


def test_renumbered_transfer_keeps_the_width_it_had():
    buf = _framed(bytes.fromhex("005314c00a06520152ffa00131434041"))
    out = transfer_with_delivery_id(buf, 8, len(buf), 3, 0)
    assert out == _framed(bytes.fromhex("005314c00a06520152 00a00131434041".replace(" ", "")))


def test_renumbered_transfer_keeps_a_uint_encoding_and_drops_an_extended_header():
    buf = _framed(bytes.fromhex("005314c0170570000000007000003039a008") + b"bench-tg"
                  + b"\x43\x41m", doff=4)
    out = transfer_with_delivery_id(buf, 16, len(buf), 3, 1)
    assert out[4] == 2 and _fields(out[8:])[:3] == (0, 1, True)
    assert len(out) == len(buf) - 8  # 0x70 keeps its width; the 8 header bytes are gone


def test_renumbered_transfer_whose_list8_would_overflow_becomes_a_list32():
    tag = b"t" * 250  # list8 size 255: one more byte does not fit
    body = bytes.fromhex("005314c0") + bytes([255, 3]) + bytes.fromhex("4343a0fa") + tag
    out = transfer_with_delivery_id(_framed(body), 8, 8 + len(body), 0, 9)
    assert out[8:12] == bytes.fromhex("005314d0")
    assert _fields(out[8:])[:2] == (0, 9) and delivery_tag_at(out[8:], _fields(out[8:])[6]) == tag


@pytest.mark.parametrize("hexbytes", ["005314c0020143", "005314c003024340"])
def test_renumbering_needs_a_delivery_id(hexbytes):
    buf = _framed(bytes.fromhex(hexbytes))
    with pytest.raises(DecodeError):
        transfer_with_delivery_id(buf, 8, len(buf), 0, 1)


flow_values = st.one_of(st.none(), st.integers(0, 0xFFFFFFFF))


@given(st.tuples(*[flow_values] * 7), st.one_of(st.none(), st.booleans()),
       st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)))
@settings(max_examples=300, deadline=None)
def test_flow_fields_read_without_decoding_match_the_codec(values, drain, available):
    from amqp_policy_proxy.amqp.performatives import Flow, decode_performative
    from amqp_policy_proxy.core.numbering import flow_fields

    names = ("next_incoming_id", "incoming_window", "next_outgoing_id", "outgoing_window",
             "handle", "delivery_count", "link_credit")
    body = Flow(**dict(zip(names, values, strict=True)), available=available,
                drain=drain).encode()
    decoded, _ = decode_performative(body)
    assert read_flow_fields(body, 0, len(body)) == flow_fields(decoded)


@given(st.binary(max_size=40))
@settings(max_examples=300, deadline=None)
def test_flow_reader_raises_only_decode_error(tail):
    buf = bytes.fromhex("005313") + tail
    try:
        read_flow_fields(buf, 0, len(buf))
    except DecodeError:
        pass
