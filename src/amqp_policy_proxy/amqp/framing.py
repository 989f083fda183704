"""Sans-IO. AMQP 1.0 frame headers, protocol headers and frame encoding (Part 2 §2.2-2.3).

A frame is an 8-byte header (SIZE, DOFF, TYPE, channel), an extended header of
``DOFF * 4 - 8`` bytes (ignored), and a body. An empty body is a heartbeat. Limits are
checked before anything is buffered: a decoder never holds more than one maximum-size frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct

from .constants import (
    AMQP_FRAME,
    AMQP_HEADER,
    FRAME_HEADER_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    TLS_HEADER,
)
from .errors import FramingError

_HEADER = Struct(">IBBH")

#: An empty AMQP frame (heartbeat) on channel 0: SIZE 8, DOFF 2, TYPE 0.
EMPTY_FRAME = _HEADER.pack(8, 2, AMQP_FRAME, 0)


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A decoded frame header. ``size`` includes the 8 header bytes."""

    size: int
    doff: int
    type: int
    channel: int

    @property
    def body_offset(self) -> int:
        """Bytes from the frame start to the body (``doff * 4``)."""
        return self.doff * 4


#: A frame size from here up starts with the byte "A" (0x41): where a protocol header
#: (``AMQP...``) may come instead of a frame, such a "size" is read as a header, never a frame.
PROTOCOL_HEADER_MIN_SIZE = 0x41000000


def frame_header_ok(size: int, doff: int, ftype: int, max_frame_size: int,
                    frame_type: int = AMQP_FRAME) -> bool:
    """The frame-header rule (Part 2 §2.3.1), the one every loop of the proxy applies.

    SIZE from 8 (the header alone) up to ``max_frame_size``; DOFF at least 2 (the 8-byte header)
    and pointing inside the frame; TYPE ``frame_type``. The C scanner (``_relayscan.c``)
    applies the same rule to AMQP frames (a property test compares them).
    """
    return (8 <= size <= max_frame_size and doff >= 2 and doff * 4 <= size
            and ftype == frame_type)


def check_frame_header(size: int, doff: int, ftype: int, max_frame_size: int,
                       frame_type: int | None = None) -> None:
    """Apply :func:`frame_header_ok`, raising what is wrong.

    Args:
        size, doff, ftype: the header's fields.
        max_frame_size: the largest frame (bytes) the peer may send now.
        frame_type: the TYPE expected, or None for either AMQP (0) or SASL (1).

    Raises:
        FramingError: "malformed frame" with the reason: SIZE below 8 or above
            ``max_frame_size``, DOFF below 2 or pointing past the frame, an unexpected TYPE.
    """
    expected = ftype if frame_type is None and ftype in (AMQP_FRAME, SASL_FRAME) \
        else frame_type
    if expected is not None and frame_header_ok(size, doff, ftype, max_frame_size, expected):
        return
    if size < FRAME_HEADER_SIZE:
        raise FramingError(f"malformed frame: size {size} below 8")
    if size > max_frame_size:
        raise FramingError(f"malformed frame: size {size} above max-frame-size {max_frame_size}")
    if doff < 2 or doff * 4 > size:
        raise FramingError(f"malformed frame: doff {doff} invalid for size {size}")
    raise FramingError(f"malformed frame: unexpected frame type {ftype}")


def parse_frame_header(
    buf: bytes | bytearray | memoryview, pos: int, max_frame_size: int
) -> FrameHeader:
    """Decode and check the frame header at ``buf[pos:pos+8]`` (an AMQP or a SASL frame).

    Args:
        buf: the receive buffer; at least 8 bytes must be available from ``pos``.
        pos: offset of the frame.
        max_frame_size: the largest frame (bytes) this side may send.

    Returns:
        The header.

    Raises:
        FramingError: see :func:`check_frame_header`.
    """
    size, doff, ftype, channel = _HEADER.unpack_from(buf, pos)
    check_frame_header(size, doff, ftype, max_frame_size)
    return FrameHeader(size, doff, ftype, channel)


def encode_frame(channel: int, body: bytes, frame_type: int = AMQP_FRAME) -> bytes:
    """Return a whole frame (header + body) with DOFF 2.

    Args:
        channel: the channel (0 for SASL frames and connection-level performatives).
        body: the encoded performative followed by any payload.
        frame_type: ``FrameType.AMQP`` or ``FrameType.SASL``.
    """
    return _HEADER.pack(FRAME_HEADER_SIZE + len(body), 2, frame_type, channel) + body


def classify_protocol_header(header: bytes) -> int | None:
    """Return the protocol id (0 AMQP, 2 TLS, 3 SASL) of an 8-byte header, or None.

    Only version 1.0.0 is recognised (Part 2 §2.2).
    """
    if header == AMQP_HEADER:
        return 0
    if header == SASL_HEADER:
        return 3
    if header == TLS_HEADER:
        return 2
    return None


@dataclass(frozen=True, slots=True)
class Frame:
    """A whole frame as produced by :class:`FrameDecoder`."""

    header: FrameHeader
    raw: bytes
    """The frame's original bytes, header included."""

    @property
    def body(self) -> bytes:
        """The body (after the extended header); empty for a heartbeat."""
        return self.raw[self.header.body_offset :]


class FrameDecoder:
    """Incremental frame decoder: ``receive_data`` then ``next_frame`` until None.

    Holds at most one incomplete frame, bounded by ``max_frame_size`` (wsproto ``Buffer``
    commit/rollback style). Used by tests, fuzzing and tools; the proxy core reads frames in
    place from its receive buffers (``core/framebuf.py``) with the same header rule.
    """

    def __init__(self, max_frame_size: int) -> None:
        """Create a decoder.

        Args:
            max_frame_size: largest accepted frame in bytes.
        """
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    def receive_data(self, data: bytes) -> None:
        """Buffer ``data``; nothing is decoded until :meth:`next_frame`."""
        self._buf += data

    def next_frame(self) -> Frame | None:
        """Return the next whole frame, or None when more bytes are needed.

        Raises:
            FramingError: the next header violates the limits (nothing is consumed).
        """
        if len(self._buf) < FRAME_HEADER_SIZE:
            return None
        header = parse_frame_header(self._buf, 0, self.max_frame_size)
        if len(self._buf) < header.size:
            return None
        raw = bytes(self._buf[: header.size])
        del self._buf[: header.size]
        return Frame(header, raw)

    @property
    def buffered(self) -> int:
        """Bytes held, waiting for the rest of a frame."""
        return len(self._buf)
