"""Sans-IO. Fast hand-written readers for the hot path: Transfer headers and message properties.

Only the fields the proxy needs are read: handle, delivery-id, more, aborted, settled and
where the payload starts (Part 2 §2.7.5). Everything is done with index arithmetic on the
original bytes; nothing is copied or re-encoded. A Transfer is accepted only in canonical form
(:mod:`.canonical`): a list whose count fills its size, each field of the spec's type. The
message sections are read by :mod:`.message`.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct
from struct import error as struct_error
from typing import NamedTuple

from .canonical import check_performative
from .errors import DecodeError

_U32 = Struct(">I")
_U16 = Struct(">H")
_U32X2 = Struct(">II")
#: Bytes a uint (null, uint0, smalluint, uint) takes with its constructor (Part 1 §1.6).
_UINT_SIZE = {0x40: 1, 0x43: 1, 0x52: 2, 0x70: 5}
#: The value of a one-byte boolean (true, false) or null (false), by constructor.
_FLAG = {0x41: True, 0x42: False, 0x40: False}
#: Bytes a fixed-width value takes with its constructor, by the constructor's high nibble
#: (Part 1 §1.6: 0x4 no data, 0x5 one byte, 0x6 two, 0x7 four, 0x8 eight, 0x9 sixteen); 0 for
#: the variable-width nibbles and the invalid ones.
_FIXED_SIZE = (0, 0, 0, 0, 1, 2, 3, 5, 9, 17, 0, 0, 0, 0, 0, 0)


def skip_value(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """Return the offset just past the AMQP value encoded at ``buf[pos]``.

    A described value (``0x00``, descriptor, value) is walked iteratively, so nesting depth
    costs no stack (a frame of ``0x00`` bytes cannot exhaust the recursion limit).

    Args:
        buf: the bytes; ``end`` bounds the readable region.
        pos: offset of the value's constructor byte.
        end: offset one past the last readable byte.

    Raises:
        DecodeError: truncated value or an invalid constructor.
    """
    pending = 1  # values still to skip: a described value replaces itself by two
    while True:
        if pos >= end:
            raise DecodeError("truncated value")
        code = buf[pos]
        if code == 0x00:  # described: descriptor then value
            pos += 1
            pending += 1
            continue
        width = code >> 4
        size = _FIXED_SIZE[width]
        if size:
            nxt = pos + size
        elif width in (0xA, 0xC, 0xE):
            if pos + 2 > end:
                raise DecodeError("truncated value")
            nxt = pos + 2 + buf[pos + 1]
        elif width in (0xB, 0xD, 0xF):
            if pos + 5 > end:
                raise DecodeError("truncated value")
            nxt = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
        else:
            raise DecodeError(f"invalid constructor 0x{code:02x}")
        if nxt > end:
            raise DecodeError("truncated value")
        pending -= 1
        if not pending:
            return nxt
        pos = nxt


def read_uint(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int | None, int]:
    """Read the uint (or null) at ``buf[pos]``, in any of its encodings (Part 1 §1.6: null,
    uint0, smalluint, uint).

    Returns:
        ``(value, offset after it)``; the value is None for null.

    Raises:
        DecodeError: truncated (nothing at or past ``end`` is read), or not a uint.
    """
    if pos >= end:
        raise DecodeError("truncated uint")
    code = buf[pos]
    if code == 0x40:
        return None, pos + 1
    if code == 0x43:
        return 0, pos + 1
    if code == 0x52:
        if pos + 2 > end:
            raise DecodeError("truncated uint")
        return buf[pos + 1], pos + 2
    if code == 0x70:
        if pos + 5 > end:
            raise DecodeError("truncated uint")
        return _U32.unpack_from(buf, pos + 1)[0], pos + 5
    raise DecodeError(f"expected uint, got constructor 0x{code:02x}")


def _read_bool(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[bool, int]:
    if pos >= end:
        raise DecodeError("truncated boolean")
    code = buf[pos]
    if code == 0x41:
        return True, pos + 1
    if code == 0x42 or code == 0x40:
        return False, pos + 1
    if code == 0x56:
        if pos + 2 > end:
            raise DecodeError("truncated boolean")
        return buf[pos + 1] != 0, pos + 2
    raise DecodeError(f"expected boolean, got constructor 0x{code:02x}")


def list_bounds(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """Read a list header at ``pos``: return ``(first_element_offset, count, list_end)``.

    Raises:
        DecodeError: not a list encoding or truncated.
    """
    if pos >= end:
        raise DecodeError("truncated list")
    code = buf[pos]
    if code == 0x45:
        return pos + 1, 0, pos + 1
    if code == 0xC0:
        if pos + 3 > end:
            raise DecodeError("truncated list")
        size = buf[pos + 1]
        lend = pos + 2 + size
        if size < 1 or lend > end:
            raise DecodeError("bad list size")
        return pos + 3, buf[pos + 2], lend
    if code == 0xD0:
        if pos + 9 > end:
            raise DecodeError("truncated list")
        size = _U32.unpack_from(buf, pos + 1)[0]
        lend = pos + 5 + size
        if size < 4 or lend > end:
            raise DecodeError("bad list size")
        return pos + 9, _U32.unpack_from(buf, pos + 5)[0], lend
    raise DecodeError(f"expected list, got constructor 0x{code:02x}")


@dataclass(slots=True)
class TransferHeader:
    """The Transfer fields the proxy needs (Part 2 §2.7.5)."""

    handle: int
    delivery_id: int | None
    settled: bool
    more: bool
    aborted: bool
    payload_offset: int
    """Offset in the buffer where the payload (the message bytes) starts."""
    delivery_tag: bytes | None = None


def read_transfer(buf: bytes | bytearray | memoryview, pos: int, end: int) -> TransferHeader:
    """Read a Transfer performative whose descriptor starts at ``buf[pos]``.

    The caller has already checked that the descriptor is transfer (0x00 0x53 0x14, or the
    8-byte ulong form). ``pos`` points at the 0x00 of the descriptor.

    Args:
        buf: frame bytes.
        pos: offset of the described type constructor (0x00).
        end: offset one past the frame's last byte.

    Returns:
        The header, with ``payload_offset`` the offset of the payload in ``buf``.

    Raises:
        DecodeError: truncated or wrongly typed fields, or a missing handle.
    """
    # The list must be canonical: its count fills its size, every field has the spec's type
    # (a sixth field inside the size of a five-field list would be `more` to the router).
    code, _, _ = check_performative(buf, pos, end)
    if code != 0x14:
        raise DecodeError("not a transfer")
    # descriptor: 0x00 0x53 0x14 or 0x00 0x80 <8 bytes>
    if buf[pos + 1] == 0x53:
        pos += 3
    else:
        pos += 10
    first, count, lend = list_bounds(buf, pos, end)
    p = first
    if count < 1:
        raise DecodeError("transfer without handle")
    handle, p = read_uint(buf, p, lend)
    if handle is None:
        raise DecodeError("transfer without handle")
    delivery_id = None
    delivery_tag = None
    settled = more = aborted = False
    if count > 1:
        delivery_id, p = read_uint(buf, p, lend)
    if count > 2:
        if p >= lend:
            raise DecodeError("transfer list shorter than its count")
        code = buf[p]
        if code != 0xA0 and code != 0xB0 and code != 0x40:
            raise DecodeError("transfer delivery-tag is not binary")
        nxt = skip_value(buf, p, lend)  # bounds-checked before the tag is sliced
        if code == 0xA0:
            delivery_tag = bytes(buf[p + 2 : nxt])
        elif code == 0xB0:
            delivery_tag = bytes(buf[p + 5 : nxt])
        p = nxt
    if count > 3:
        if p < lend and buf[p] not in _UINT_SIZE:
            raise DecodeError("transfer message-format is not a uint")
        p = skip_value(buf, p, lend)  # message-format
    if count > 4:
        settled, p = _read_bool(buf, p, lend)
    if count > 5:
        more, p = _read_bool(buf, p, lend)
    if count > 6:
        if p < lend and buf[p] not in (0x40, 0x50):
            raise DecodeError("transfer rcv-settle-mode is not a ubyte")
        p = skip_value(buf, p, lend)  # rcv-settle-mode
    if count > 7:
        if p < lend and buf[p] not in (0x40, 0x00):
            raise DecodeError("transfer state is not a delivery state")
        p = skip_value(buf, p, lend)  # state
    if count > 8:
        _, p = _read_bool(buf, p, lend)  # resume
    if count > 9:
        aborted, p = _read_bool(buf, p, lend)
    return TransferHeader(handle, delivery_id, settled, more, aborted, lend, delivery_tag)


class TransferFields(NamedTuple):
    """The fields of a Transfer (Part 2 §2.7.5) the relay loops decide on, read in place.

    What :func:`read_transfer_fields` (and its C twin, ``_relayscan.transfer_fields``, which
    builds the same type) answers: a tuple, so unpacking works, with the spec's names.
    """

    handle: int
    """The link's handle (the field is mandatory)."""
    delivery_id: int | None
    """delivery-id, None when absent (a continuation frame of a multi-frame delivery)."""
    settled: bool
    """settled (absent: False)."""
    more: bool
    """more: further frames of this delivery follow (absent: False)."""
    aborted: bool
    """aborted (absent: False)."""
    payload_offset: int
    """Offset in the buffer of the first payload byte (just after the performative)."""
    tag_offset: int
    """Offset of the delivery-tag's constructor byte, -1 when the field is absent or null."""


_fields = tuple.__new__  # TransferFields from an item tuple, without NamedTuple's __new__


def read_transfer_fields(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> TransferFields:
    """Hot-path variant of :func:`read_transfer`: the same fields, nothing copied.

    Returns ``TransferFields(handle, delivery_id, settled, more, aborted, payload_offset,
    tag_offset)`` where ``tag_offset`` is the offset of the delivery-tag's constructor byte (``-1`` when the
    field is absent or null); :func:`delivery_tag_at` materialises the tag when it is needed
    (a denied delivery). The encodings real clients use (list8/list32, ``uint`` as
    ``0x43``/``0x52``/``0x70``, ``binary8`` tag, booleans as ``0x41``/``0x42``/``null``) are
    read inline; anything else, including every malformed Transfer, goes through
    :func:`read_transfer`, so the results and the errors are the same.

    Args:
        buf: frame bytes.
        pos: offset of the described type constructor (0x00).
        end: offset one past the frame's last byte.

    Raises:
        DecodeError: as :func:`read_transfer`.
    """
    try:
        if buf[pos + 1] != 0x53:
            return _fields_slow(buf, pos, end)
        p = pos + 3
        code = buf[p]
        if code == 0xC0:
            size = buf[p + 1]
            lend = p + 2 + size
            count = buf[p + 2]
            p += 3
            if size < 1:
                return _fields_slow(buf, pos, end)
        elif code == 0xD0:
            size, count = _U32X2.unpack_from(buf, p + 1)
            lend = p + 5 + size
            p += 9
            if size < 4:
                return _fields_slow(buf, pos, end)
        else:
            return _fields_slow(buf, pos, end)
        if lend > end or count < 1:
            return _fields_slow(buf, pos, end)
        handle, p = read_uint(buf, p, lend)  # mandatory: null goes to the reference reader
        if handle is None:
            return _fields_slow(buf, pos, end)
        delivery_id = None
        tag = -1
        settled = more = aborted = False
        if count > 1:
            delivery_id, p = read_uint(buf, p, lend)
            if count > 2:
                code = buf[p]
                if code == 0xA0:
                    tag = p
                    p += 2 + buf[p + 1]
                elif code == 0x40:
                    p += 1
                else:
                    return _fields_slow(buf, pos, end)
                if count > 3:
                    p += _UINT_SIZE[buf[p]]  # message-format (KeyError: not a uint)
                    if count > 4:
                        settled = _FLAG[buf[p]]  # (KeyError: not a one-byte boolean)
                        p += 1
                        if count > 5:
                            more = _FLAG[buf[p]]
                            p += 1
                            if count > 6:
                                return _fields_slow(buf, pos, end)
        if p != lend:  # fields and list size disagree: let the reference reader say why
            return _fields_slow(buf, pos, end)
        return _fields(TransferFields, (handle, delivery_id, settled, more, aborted, lend, tag))
    except (IndexError, KeyError, struct_error, DecodeError):
        return _fields_slow(buf, pos, end)


def _fields_slow(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> TransferFields:
    hdr = read_transfer(buf, pos, end)
    tag = -1
    if hdr.delivery_tag is not None:
        tag = _tag_offset(buf, pos)
    return TransferFields(hdr.handle, hdr.delivery_id, hdr.settled, hdr.more, hdr.aborted,
                          hdr.payload_offset, tag)


def _tag_offset(buf: bytes | bytearray | memoryview, pos: int) -> int:
    # Only called once read_transfer accepted the frame: the fields are well formed.
    p = pos + 3 if buf[pos + 1] == 0x53 else pos + 10
    p, _, lend = list_bounds(buf, p, len(buf))
    p = skip_value(buf, p, lend)  # handle
    return skip_value(buf, p, lend)  # delivery-id


def delivery_tag_at(buf: bytes | bytearray | memoryview, tag_offset: int) -> bytes | None:
    """The delivery-tag whose constructor is at ``buf[tag_offset]`` (from
    :func:`read_transfer_fields`), as ``bytes``; None for ``tag_offset`` -1.

    Only valid on a frame :func:`read_transfer_fields` accepted.
    """
    if tag_offset < 0:
        return None
    if buf[tag_offset] == 0xA0:
        n = buf[tag_offset + 1]
        return bytes(buf[tag_offset + 2 : tag_offset + 2 + n])
    n = _U32.unpack_from(buf, tag_offset + 1)[0]
    return bytes(buf[tag_offset + 5 : tag_offset + 5 + n])


def is_transfer_descriptor(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int | None:
    """Return the numeric descriptor code at ``buf[pos]`` when cheaply readable, else None.

    Recognises ``0x00 0x53 <code>`` (smallulong) and ``0x00 0x80 <8 bytes>`` (ulong).
    """
    if pos + 3 > end or buf[pos] != 0x00:
        return None
    kind = buf[pos + 1]
    if kind == 0x53:
        return buf[pos + 2]
    if kind == 0x80 and pos + 10 <= end:
        return int.from_bytes(buf[pos + 2 : pos + 10], "big")
    if kind == 0x44:  # ulong0
        return 0
    return None


def _uint(value: int, like: int) -> bytes:
    """``value`` as an AMQP uint: in the encoding ``like`` (a constructor byte) when it fits,
    else the smallest one."""
    if like == 0x70 or value > 0xFF:
        return b"\x70" + _U32.pack(value)
    if value or like == 0x52:
        return bytes((0x52, value))
    return b"\x43"


def transfer_with_delivery_id(buf: bytes | bytearray | memoryview, body: int, fend: int,
                              channel: int, delivery_id: int) -> bytes:
    """A copy of the Transfer frame whose performative starts at ``buf[body]`` (its payload
    runs to ``fend``), sent on ``channel``, with its delivery-id set to ``delivery_id``.

    Only the delivery-id changes (Part 2 §2.7.5): it keeps its encoding's width when the new
    value fits (``0x70`` always does), else takes the smallest that does; the list size
    follows (a list8 that would pass 255 bytes becomes a list32) and so does the frame size.
    The new frame has the plain 8-byte header (DOFF 2): an extended header carries nothing.

    Args:
        buf: the client's bytes; body: offset of the performative (descriptor constructor);
        fend: one past the frame's last byte; channel: the frame's channel;
        delivery_id: the new value, 0 to 2**32 - 1.

    Raises:
        DecodeError: the Transfer cannot be read, or it has no delivery-id to replace.
    """
    p = body + 3 if buf[body + 1] == 0x53 else body + 10
    first, count, lend = list_bounds(buf, p, fend)
    if count < 2:
        raise DecodeError("transfer without a delivery-id to renumber")
    q = skip_value(buf, first, lend)  # past the handle
    r = skip_value(buf, q, lend)  # past the delivery-id
    if buf[q] == 0x40:
        raise DecodeError("transfer without a delivery-id to renumber")
    value = _uint(delivery_id, buf[q])
    if len(value) == r - q:  # the same width: one copy, patched in place
        out = bytearray(_U32.pack(8 + fend - body) + b"\x02\x00" + _U16.pack(channel))
        out += buf[body:fend]
        out[8 + q - body:8 + r - body] = value
        return bytes(out)
    fields = bytes(buf[first:q]) + value + bytes(buf[r:lend])
    if buf[p] == 0xC0 and len(fields) + 1 <= 0xFF:
        lst = bytes((0xC0, len(fields) + 1, count)) + fields
    else:
        lst = b"\xd0" + _U32X2.pack(len(fields) + 4, count) + fields
    perf = bytes(buf[body:p]) + lst
    size = 8 + len(perf) + (fend - lend)
    return b"".join((_U32.pack(size), b"\x02\x00", _U16.pack(channel), perf,
                     bytes(buf[lend:fend])))


def read_flow_fields(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[int | None, int | None, int | None, int | None, int | None, int | None, int | None,
           bool]:
    """Read the fields of a Flow (Part 2 §2.7.4) whose descriptor starts at ``buf[pos]``
    without decoding it: ``(next-incoming-id, incoming-window, next-outgoing-id,
    outgoing-window, handle, delivery-count, link-credit, drain)``, None for an absent or null
    field. The uints may be in any of their encodings; ``available``, ``echo`` and
    ``properties`` are not read.

    Args:
        buf: frame bytes; pos: offset of the descriptor constructor (0x00); end: one past the
            frame's last byte.

    Raises:
        DecodeError: not a list of those types.
    """
    p = pos + 3 if buf[pos + 1] == 0x53 else pos + 10
    p, count, lend = list_bounds(buf, p, end)
    values: list[int | None] = []
    for _ in range(min(count, 7)):
        value, p = read_uint(buf, p, lend)
        values.append(value)
    values.extend([None] * (7 - len(values)))
    drain = False
    if count > 8:
        p = skip_value(buf, p, lend)  # available
        drain, p = _read_bool(buf, p, lend)
    return (values[0], values[1], values[2], values[3], values[4], values[5], values[6],
            drain)
