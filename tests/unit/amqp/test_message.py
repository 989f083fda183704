"""amqp/message.py: finding and clearing ``header.durable`` in real encoded messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Message

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.message import cleared_durable_byte, durable_flag_offset


def _encoded(**kw) -> bytes:
    return Message(**kw).encode()


def _clear(data: bytes) -> bytes:
    off = durable_flag_offset(data, 0, len(data))
    assert off is not None
    out = bytearray(data)
    out[off] = cleared_durable_byte(data, off)
    return bytes(out)


def test_durable_message_is_found_and_cleared_in_place():
    data = _encoded(body="payload", durable=True, address="A/K", priority=7, ttl=5)
    cleared = _clear(data)
    assert len(cleared) == len(data)
    m = Message()
    m.decode(cleared)
    assert (m.durable, m.body, m.address, m.priority, m.ttl) == (False, "payload", "A/K", 7, 5)


@pytest.mark.parametrize("kw", [{}, {"durable": False}, {"priority": 9}])
def test_non_durable_message_needs_nothing(kw):
    data = _encoded(body="x", **kw)
    assert durable_flag_offset(data, 0, len(data)) is None


def test_boolean_with_value_byte_and_large_list_forms():
    # header as list32 with durable encoded as 0x56 0x01 (a legal, longer encoding)
    hdr = b"\x00\x53\x70\xd0" + (6).to_bytes(4, "big") + (1).to_bytes(4, "big") + b"\x56\x01"
    data = hdr + b"\x00\x53\x77\xa1\x01x"
    off = durable_flag_offset(data, 0, len(data))
    assert off == len(hdr) - 1 and cleared_durable_byte(data, off) == 0x00
    # ulong descriptor form of the header section
    hdr = b"\x00\x80" + (0x70).to_bytes(8, "big") + b"\xc0\x02\x01\x41"
    assert durable_flag_offset(hdr, 0, len(hdr)) == len(hdr) - 1


def test_no_header_section_or_truncated_header():
    body_only = b"\x00\x53\x77\xa1\x03abc"
    assert durable_flag_offset(body_only, 0, len(body_only)) is None
    data = _encoded(body="x", durable=True)
    assert durable_flag_offset(data, 0, 4) is None  # header not wholly available


def test_header_that_is_not_a_list_is_a_decode_error():
    with pytest.raises(DecodeError):
        durable_flag_offset(b"\x00\x53\x70\xa1\x01x", 0, 6)


@given(durable=st.booleans(), priority=st.integers(0, 255), body=st.binary(max_size=64),
       first_acquirer=st.booleans())
def test_property_clearing_changes_only_durable(durable, priority, body, first_acquirer):
    data = _encoded(body=body, durable=durable, priority=priority,
                    first_acquirer=first_acquirer)
    off = durable_flag_offset(data, 0, len(data))
    assert (off is not None) == durable
    if off is None:
        return
    m = Message()
    m.decode(_clear(data))
    assert (m.durable, m.priority, m.first_acquirer, m.body) == (
        False, priority, first_acquirer, body)
