"""An incremental AMQP 1.0 frame decoder for tests, fuzzing and tools (Part 2 §2.2-2.3).

The proxy's core never uses it: it reads frames in place from its receive buffers
(``core/framebuf.py``) with :func:`amqp_policy_proxy.amqp.framing.frame_header_ok`, the rule
this decoder applies too (:func:`~amqp_policy_proxy.amqp.framing.check_frame_header`), so a
test that decodes what the proxy wrote checks it against the same rule independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct

from amqp_policy_proxy.amqp.constants import AMQP_HEADER, FRAME_HEADER_SIZE, SASL_HEADER, TLS_HEADER
from amqp_policy_proxy.amqp.framing import check_frame_header

__all__ = ["Frame", "FrameDecoder", "FrameHeader", "classify_protocol_header",
           "parse_frame_header"]

_HEADER = Struct(">IBBH")


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
    commit/rollback style). The proxy core reads frames in place from its receive buffers
    (``core/framebuf.py``) with the same header rule; this one is for tests, fuzzing and tools.
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
