"""Sans-IO. Fast hand-written readers for the hot path: Transfer headers and message properties.

Only the fields the proxy needs are read: handle, delivery-id, more, aborted, settled and
where the payload starts (Part 2 §2.7.5), and from the first transfer of a delivery the
``properties`` section's ``user-id`` and ``to`` (Part 3 §3.2.4). Everything is done with
index arithmetic on the original bytes; nothing is copied or re-encoded. Compound values are
skipped in O(1) through their size prefix (Part 1 §1.6 encodings).
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct
from struct import error as struct_error

from .errors import DecodeError

_U32 = Struct(">I")
_U16 = Struct(">H")
_U32X2 = Struct(">II")
_UINT_CODES = (0x40, 0x43, 0x52, 0x70)


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
        if width == 0x4:
            nxt = pos + 1
        elif width == 0x5:
            nxt = pos + 2
        elif width == 0x6:
            nxt = pos + 3
        elif width == 0x7:
            nxt = pos + 5
        elif width == 0x8:
            nxt = pos + 9
        elif width == 0x9:
            nxt = pos + 17
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


def _read_uint(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int | None, int]:
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
    # descriptor: 0x00 0x53 0x14 or 0x00 0x80 <8 bytes>
    if buf[pos + 1] == 0x53:
        pos += 3
    else:
        pos += 10
    first, count, lend = list_bounds(buf, pos, end)
    p = first
    if count < 1:
        raise DecodeError("transfer without handle")
    handle, p = _read_uint(buf, p, lend)
    if handle is None:
        raise DecodeError("transfer without handle")
    delivery_id = None
    delivery_tag = None
    settled = more = aborted = False
    if count > 1:
        delivery_id, p = _read_uint(buf, p, lend)
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
        if p < lend and buf[p] not in _UINT_CODES:
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


def read_transfer_fields(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[int, int | None, bool, bool, bool, int, int]:
    """Hot-path variant of :func:`read_transfer`: the same fields as a tuple, nothing copied.

    Returns ``(handle, delivery_id, settled, more, aborted, payload_offset, tag_offset)``
    where ``tag_offset`` is the offset of the delivery-tag's constructor byte (``-1`` when the
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
        # handle (mandatory)
        code = buf[p]
        if code == 0x52:
            handle = buf[p + 1]
            p += 2
        elif code == 0x43:
            handle = 0
            p += 1
        elif code == 0x70:
            handle = _U32.unpack_from(buf, p + 1)[0]
            p += 5
        else:
            return _fields_slow(buf, pos, end)
        delivery_id = None
        tag = -1
        settled = more = aborted = False
        if count > 1:
            code = buf[p]
            if code == 0x52:
                delivery_id = buf[p + 1]
                p += 2
            elif code == 0x43:
                delivery_id = 0
                p += 1
            elif code == 0x70:
                delivery_id = _U32.unpack_from(buf, p + 1)[0]
                p += 5
            elif code == 0x40:
                p += 1
            else:
                return _fields_slow(buf, pos, end)
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
                    code = buf[p]  # message-format
                    if code == 0x43 or code == 0x40:
                        p += 1
                    elif code == 0x70:
                        p += 5
                    elif code == 0x52:
                        p += 2
                    else:
                        return _fields_slow(buf, pos, end)
                    if count > 4:
                        code = buf[p]
                        if code == 0x41:
                            settled = True
                        elif code != 0x42 and code != 0x40:
                            return _fields_slow(buf, pos, end)
                        p += 1
                        if count > 5:
                            code = buf[p]
                            if code == 0x41:
                                more = True
                            elif code != 0x42 and code != 0x40:
                                return _fields_slow(buf, pos, end)
                            p += 1
                            if count > 6:
                                return _fields_slow(buf, pos, end)
        if p > lend:  # a field ran past the list: let the reference reader say why
            return _fields_slow(buf, pos, end)
        return handle, delivery_id, settled, more, aborted, lend, tag
    except (IndexError, struct_error):
        return _fields_slow(buf, pos, end)


def _fields_slow(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[int, int | None, bool, bool, bool, int, int]:
    hdr = read_transfer(buf, pos, end)
    tag = -1
    if hdr.delivery_tag is not None:
        tag = _tag_offset(buf, pos)
    return (hdr.handle, hdr.delivery_id, hdr.settled, hdr.more, hdr.aborted,
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


@dataclass(slots=True)
class MessageRouting:
    """What the policy needs from a message's bare properties (Part 3 §3.2.4)."""

    user_id: bytes | None
    to: str | None
    complete: bool
    """False when the buffer ended before the properties (or the first body section)."""


_SKIPPABLE_SECTIONS = (0x70, 0x71, 0x72)  # header, delivery-annotations, message-annotations


def read_message_routing(buf: bytes | bytearray | memoryview, pos: int, end: int) -> MessageRouting:
    """Find ``properties.user-id`` and ``properties.to`` in a message's leading sections.

    Args:
        buf: bytes holding the start of the message (payload of the first transfers).
        pos: offset of the first section.
        end: one past the last available byte.

    Returns:
        The values found; ``complete`` False if more bytes are needed to decide.

    Raises:
        DecodeError: a malformed section.
    """
    while pos < end:
        if pos + 3 > end:
            return MessageRouting(None, None, False)
        if buf[pos] != 0x00:
            raise DecodeError("message section is not a described type")
        kind = buf[pos + 1]
        if kind == 0x53:
            code = buf[pos + 2]
            vpos = pos + 3
        elif kind == 0x80:
            if pos + 10 > end:
                return MessageRouting(None, None, False)
            code = int.from_bytes(buf[pos + 2 : pos + 10], "big")
            vpos = pos + 10
        else:
            raise DecodeError("unsupported message section descriptor")
        if code in _SKIPPABLE_SECTIONS:
            try:
                pos = skip_value(buf, vpos, end)
            except DecodeError:
                return MessageRouting(None, None, False)
            continue
        if code != 0x73:
            return MessageRouting(None, None, True)  # body or application-properties: no properties
        try:
            lend = skip_value(buf, vpos, end)
        except DecodeError:
            return MessageRouting(None, None, False)
        first, count, lend = list_bounds(buf, vpos, lend)
        p = first
        user_id: bytes | None = None
        to: str | None = None
        if count > 0:
            p = skip_value(buf, p, lend)  # message-id
        if count > 1 and p < lend:
            code = buf[p]
            if code != 0xA0 and code != 0xB0 and code != 0x40:
                raise DecodeError("user-id is not binary")
            nxt = skip_value(buf, p, lend)  # bounds-checked before the value is sliced
            if code == 0xA0:
                user_id = bytes(buf[p + 2 : nxt])
            elif code == 0xB0:
                user_id = bytes(buf[p + 5 : nxt])
            p = nxt
        if count > 2 and p < lend:
            code = buf[p]
            nxt = skip_value(buf, p, lend)
            if code in (0xA1, 0xA3):
                to = bytes(buf[p + 2 : nxt]).decode("utf-8", "replace")
            elif code in (0xB1, 0xB3):
                to = bytes(buf[p + 5 : nxt]).decode("utf-8", "replace")
            elif code != 0x40:
                raise DecodeError("to is not a string")
        return MessageRouting(user_id, to, True)
    return MessageRouting(None, None, False)


def read_routing(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[bytes | None, str | None, bool]:
    """Hot-path variant of :func:`read_message_routing`: ``(user_id, to, complete)``.

    The common layouts (``header``/annotation sections as lists or maps, ``properties`` as
    list8/list32 with a null or any message-id, ``binary8`` user-id, ``str8`` to) are read
    inline; anything else goes through :func:`read_message_routing`, so results and errors
    are the same.

    Raises:
        DecodeError: as :func:`read_message_routing`.
    """
    try:
        while True:
            if pos + 3 >= end:
                return _routing_slow(buf, pos, end)
            if buf[pos] != 0x00 or buf[pos + 1] != 0x53:
                return _routing_slow(buf, pos, end)
            code = buf[pos + 2]
            v = pos + 3
            if code == 0x73:
                break
            if code == 0x70 or code == 0x71 or code == 0x72:
                c = buf[v]
                if c == 0x45:
                    pos = v + 1
                elif c == 0xC0 or c == 0xC1:
                    pos = v + 2 + buf[v + 1]
                elif c == 0xD0 or c == 0xD1:
                    pos = v + 5 + _U32.unpack_from(buf, v + 1)[0]
                else:
                    return _routing_slow(buf, pos, end)
                if pos >= end:
                    return _routing_slow(buf, v - 3, end)
                continue
            return None, None, True  # body or application-properties: no properties
        c = buf[v]
        if c == 0xC0:
            size = buf[v + 1]
            lend = v + 2 + size
            count = buf[v + 2]
            p = v + 3
            if size < 1:
                return _routing_slow(buf, pos, end)
        elif c == 0xD0:
            size, count = _U32X2.unpack_from(buf, v + 1)
            lend = v + 5 + size
            p = v + 9
            if size < 4:
                return _routing_slow(buf, pos, end)
        elif c == 0x45:
            return None, None, True
        else:
            return _routing_slow(buf, pos, end)
        if lend > end:
            return _routing_slow(buf, pos, end)
        user_id = to = None
        if count > 0:
            if p >= lend:
                return _routing_slow(buf, pos, end)
            p = p + 1 if buf[p] == 0x40 else skip_value(buf, p, lend)  # message-id
        if count > 1 and p < lend:
            c = buf[p]
            if c == 0xA0:
                nxt = p + 2 + buf[p + 1]
                if nxt > lend:
                    return _routing_slow(buf, pos, end)
                user_id = bytes(buf[p + 2 : nxt])
                p = nxt
            elif c == 0x40:
                p += 1
            else:
                return _routing_slow(buf, pos, end)
        if count > 2 and p < lend:
            c = buf[p]
            if c == 0xA1:
                nxt = p + 2 + buf[p + 1]
                if nxt > lend:
                    return _routing_slow(buf, pos, end)
                to = str(buf[p + 2 : nxt], "utf-8", "replace")
            elif c != 0x40:
                return _routing_slow(buf, pos, end)
        return user_id, to, True
    except (IndexError, struct_error):
        return _routing_slow(buf, pos, end)


def _routing_slow(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[bytes | None, str | None, bool]:
    r = read_message_routing(buf, pos, end)
    return r.user_id, r.to, r.complete
