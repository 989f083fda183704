"""Frame header checks (Part 2 §2.3) with hand-written byte tables."""

import pytest

from amqp_policy_proxy.amqp.errors import FramingError
from amqp_policy_proxy.amqp.framing import EMPTY_FRAME, encode_frame
from tests.support.frames import FrameDecoder, classify_protocol_header, parse_frame_header


def test_empty_frame_is_a_heartbeat():
    assert EMPTY_FRAME == bytes.fromhex("0000000802000000")
    d = FrameDecoder(512)
    d.receive_data(EMPTY_FRAME)
    f = d.next_frame()
    assert f is not None and f.body == b"" and f.header.channel == 0


@pytest.mark.parametrize(
    ("hexbytes", "message"),
    [
        ("0000000702000000", "size 7 below 8"),
        ("0000020102000000", "above max-frame-size 512"),
        ("0000000801000000", "doff 1"),
        ("0000000803000000", "doff 3 invalid for size 8"),
        ("0000000802070000", "unexpected frame type 7"),
    ],
)
def test_bad_headers(hexbytes, message):
    with pytest.raises(FramingError, match=message):
        parse_frame_header(bytes.fromhex(hexbytes), 0, 512)


def test_extended_header_is_skipped():
    raw = bytes.fromhex("0000000c03000005") + b"\xde\xad\xbe\xef"
    h = parse_frame_header(raw, 0, 512)
    assert (h.size, h.doff, h.type, h.channel, h.body_offset) == (12, 3, 0, 5, 12)


def test_encode_frame_layout():
    assert encode_frame(3, b"\x00\x53\x17\x45") == bytes.fromhex("0000000c020000030053174" + "5")


def test_decoder_never_buffers_past_the_limit():
    d = FrameDecoder(512)
    d.receive_data(bytes.fromhex("0000100002000000"))
    with pytest.raises(FramingError):
        d.next_frame()


@pytest.mark.parametrize(
    ("header", "protocol"),
    [(b"AMQP\x00\x01\x00\x00", 0), (b"AMQP\x02\x01\x00\x00", 2), (b"AMQP\x03\x01\x00\x00", 3),
     (b"AMQP\x00\x00\x09\x01", None), (b"GET / HT", None)],
)
def test_protocol_headers(header, protocol):
    assert classify_protocol_header(header) == protocol
