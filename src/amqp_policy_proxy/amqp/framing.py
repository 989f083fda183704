"""Sans-IO. AMQP 1.0 frame headers, protocol headers and frame encoding (Part 2 §2.2-2.3).

A frame is an 8-byte header (SIZE, DOFF, TYPE, channel), an extended header of
``DOFF * 4 - 8`` bytes (ignored), and a body. An empty body is a heartbeat. Limits are
checked before anything is buffered: a decoder never holds more than one maximum-size frame.
The core reads frames in place from its receive buffers (``core/framebuf.py``) with
:func:`frame_header_ok`; the tests' incremental decoder is ``tests/support/frames.py``.
"""

from __future__ import annotations

from struct import Struct

from .constants import (
    AMQP_FRAME,
    FRAME_HEADER_SIZE,
    SASL_FRAME,
)
from .errors import FramingError

_HEADER = Struct(">IBBH")

#: An empty AMQP frame (heartbeat) on channel 0: SIZE 8, DOFF 2, TYPE 0.
EMPTY_FRAME = _HEADER.pack(8, 2, AMQP_FRAME, 0)


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


def encode_frame(channel: int, body: bytes, frame_type: int = AMQP_FRAME) -> bytes:
    """Return a whole frame (header + body) with DOFF 2.

    Args:
        channel: the channel (0 for SASL frames and connection-level performatives).
        body: the encoded performative followed by any payload.
        frame_type: ``FrameType.AMQP`` or ``FrameType.SASL``.
    """
    return _HEADER.pack(FRAME_HEADER_SIZE + len(body), 2, frame_type, channel) + body
