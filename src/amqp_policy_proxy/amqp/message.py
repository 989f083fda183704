"""Sans-IO. In-place edits of a message's header section (AMQP 1.0 Part 3 §3.2.1).

The proxy forwards messages as their original bytes. The one edit it makes is clearing the
header's ``durable`` flag for a subscriber without the *persistent* authority (topic
authorization, ARCHITECTURE 4.6, model ``nearestAcl``): ``true`` and ``false`` have encodings of
the same length, so the edit never changes a frame's size or any offset after it.
"""

from __future__ import annotations

from .errors import DecodeError

_HEADER_CODE = 0x70
_HEADER_SYMBOL = b"amqp:header:list"
_TRUE = 0x41
_FALSE = 0x42
_BOOLEAN = 0x56


def durable_flag_offset(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int | None:
    """Find the byte that encodes ``header.durable = true`` at the start of a message.

    Args:
        buf: the bytes holding the start of the message (the first Transfer's payload).
        pos: offset of the message's first section.
        end: one past the last available byte.

    Returns:
        The offset of the byte to overwrite with :func:`cleared_durable_byte`, or None when the
        message has no header section first, its ``durable`` is absent, null or false, or the
        header is not wholly inside ``buf[pos:end]`` (then nothing can be rewritten in place).

    Raises:
        DecodeError: the header section is present but its list encoding is not a list.
    """
    if end - pos < 4 or buf[pos] != 0x00:
        return None
    kind = buf[pos + 1]
    if kind == 0x53:  # smallulong descriptor
        if buf[pos + 2] != _HEADER_CODE:
            return None
        vpos = pos + 3
    elif kind == 0x80:  # ulong descriptor
        if end - pos < 11 or int.from_bytes(buf[pos + 2 : pos + 10], "big") != _HEADER_CODE:
            return None
        vpos = pos + 10
    elif kind == 0xA3:  # sym8 descriptor
        n = buf[pos + 2]
        if bytes(buf[pos + 3 : pos + 3 + n]) != _HEADER_SYMBOL:
            return None
        vpos = pos + 3 + n
    else:
        return None
    if vpos >= end:
        return None
    ctor = buf[vpos]
    if ctor == 0x45:  # list0
        return None
    if ctor == 0xC0:
        if vpos + 3 > end:
            return None
        count = buf[vpos + 2]
        first = vpos + 3
    elif ctor == 0xD0:
        if vpos + 9 > end:
            return None
        count = int.from_bytes(buf[vpos + 5 : vpos + 9], "big")
        first = vpos + 9
    else:
        raise DecodeError(f"message header is not a list (constructor 0x{ctor:02x})")
    if count == 0 or first >= end:
        return None
    code = buf[first]
    if code == _TRUE:
        return first
    if code == _BOOLEAN and first + 1 < end and buf[first + 1] == 0x01:
        return first + 1
    return None


def cleared_durable_byte(buf: bytes | bytearray | memoryview, offset: int) -> int:
    """The byte that replaces ``buf[offset]`` (found by :func:`durable_flag_offset`).

    ``0x41`` (true) becomes ``0x42`` (false); the value byte ``0x01`` of a ``0x56`` boolean
    becomes ``0x00``. Same length either way.
    """
    return _FALSE if buf[offset] == _TRUE else 0x00
