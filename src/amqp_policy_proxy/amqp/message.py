"""Sans-IO. What the proxy reads from a message, and the one edit it makes (Part 3 §3.2).

:func:`read_message_head` reads the leading sections (header to properties) of a message in
canonical form only: the ``user-id`` and ``to`` policy checks, and whether the client set the
router's own annotations.

The proxy forwards messages as their original bytes. The one edit it makes is clearing the
header's ``durable`` flag for a subscriber without the *persistent* authority (topic
authorization, docs/topic-authorization.md, model ``nearestAcl``): ``true`` and ``false`` have encodings of
the same length, so the edit never changes a frame's size or any offset after it.
"""

from __future__ import annotations

from typing import NamedTuple

from .canonical import KINDS, check_value
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


# ------------------------------------------------------------------ the message head

#: Prefix of the router's own message annotations (qdrouterd routes an anonymous-relay
#: message by ``x-opt-qd.to`` when its listener keeps inbound annotations).
ROUTER_ANNOTATION_PREFIX = b"x-opt-qd."

#: The leading sections, in the only order the proxy accepts them (Part 3 §3.2), with the kind
#: of value each holds: header, delivery-annotations, message-annotations, properties.
_HEAD_SECTIONS = ((0x70, "list"), (0x71, "map"), (0x72, "map"), (0x73, "list"))
#: Sections that may follow the head: application-properties, data, amqp-sequence,
#: amqp-value, footer.
_LATER_SECTIONS = frozenset({0x74, 0x75, 0x76, 0x77, 0x78})
_HEADER_FIELDS = ("boolean", "ubyte", "uint", "boolean", "uint")
_PROPERTIES_FIELDS = ("message-id", "binary", "string", "string", "string", "message-id",
                      "symbol", "symbol", "timestamp", "timestamp", "string", "uint", "string")


class MessageHead(NamedTuple):
    """What policy reads from the start of a message (Part 3 §3.2.4 properties)."""

    user_id: bytes | None
    """``properties.user-id``; None when absent or null."""
    to: str | None
    """``properties.to``; None when absent or null."""
    router_annotations: bool
    """The message-annotations hold a key starting ``x-opt-qd.``."""
    complete: bool
    """False when the bytes end inside the head (header to properties): decide later or
    refuse; True when every head section present was read."""
    subject: str | None = None
    """``properties.subject`` when asked for (``read_message_head(subject=True)``), else
    None."""


def read_message_head(buf: bytes | bytearray | memoryview, pos: int, end: int, *,
                      last: bool, subject: bool = False) -> MessageHead:
    """Read the head of a message the way every peer reads it, or refuse it.

    The sections header, delivery-annotations, message-annotations and properties are each
    optional but, when present, come first and in that order (Part 3 §3.2), each described by
    its numeric descriptor (``0x00 0x53 code`` or ``0x00 0x80`` + 8 bytes: qdrouterd's section
    walker knows no other form), each canonical (:func:`.canonical.check_value`) with the
    spec's type in each field (a ``to`` that is a ``string`` without NUL, a message-id that is
    not a described value: qdrouterd steps over a described value as one byte, and would read
    the later properties fields from other bytes than the proxy).

    Args:
        buf: the bytes holding the start of the message (the payload of its first Transfer).
        pos: offset of the first section.
        end: one past the last available byte.
        last: True when the message ends at ``end`` (its Transfer has ``more`` false).
        subject: also read ``properties.subject`` (a string without NUL).

    Returns:
        The fields; ``complete`` is False when more frames are needed to see the whole head.

    Raises:
        DecodeError: a section out of order or repeated, an unknown section, a symbolic
            section descriptor, a non-canonical encoding, or a field of the wrong type.
    """
    user_id: bytes | None = None
    to: str | None = None
    subj: str | None = None
    router = False
    expected = 0  # index into _HEAD_SECTIONS of the first section still allowed
    while pos < end:
        if end - pos < 3:
            if last:
                raise DecodeError("truncated message section")
            return MessageHead(user_id, to, router, False, subj)
        if buf[pos] != 0x00:
            raise DecodeError("message section is not a described value")
        kind = buf[pos + 1]
        if kind == 0x53:
            code = buf[pos + 2]
            vpos = pos + 3
        elif kind == 0x80:
            if end - pos < 10:
                if last:
                    raise DecodeError("truncated message section")
                return MessageHead(user_id, to, router, False, subj)
            value = int.from_bytes(buf[pos + 2:pos + 10], "big")
            if value > 0xFF:
                raise DecodeError("unknown message section")
            code = value
            vpos = pos + 10
        else:
            raise DecodeError("message section descriptor is not numeric")
        index = next((i for i, (c, _) in enumerate(_HEAD_SECTIONS) if c == code), -1)
        if index < 0:
            if code in _LATER_SECTIONS:
                return MessageHead(user_id, to, router, True, subj)
            raise DecodeError(f"unknown message section {code:#x}")
        if index < expected:
            raise DecodeError("message sections out of order or repeated")
        expected = index + 1
        try:
            stop = check_value(buf, vpos, end)
        except DecodeError:
            if last or _complete_value_fits(buf, vpos, end):
                raise
            return MessageHead(user_id, to, router, False, subj)
        ctor = buf[vpos]
        want = _HEAD_SECTIONS[index][1]
        if want == "list" and ctor not in (0x45, 0xC0, 0xD0):
            raise DecodeError(f"message section {code:#x} is not a list")
        if want == "map" and ctor not in (0xC1, 0xD1):
            raise DecodeError(f"message section {code:#x} is not a map")
        if code == 0x70:
            _fields(buf, vpos, stop, _HEADER_FIELDS, "header")
        elif code == 0x72:
            router = _has_router_annotation(buf, vpos, stop)
        elif code == 0x73:
            offsets = _fields(buf, vpos, stop, _PROPERTIES_FIELDS, "properties")
            if len(offsets) > 1 and buf[offsets[1]] != 0x40:
                user_id = _bytes_at(buf, offsets[1])
            if len(offsets) > 2 and buf[offsets[2]] != 0x40:
                raw = _bytes_at(buf, offsets[2])
                if 0 in raw:
                    raise DecodeError("message 'to' holds a NUL character")
                to = raw.decode("utf-8")
            if subject and len(offsets) > 3 and buf[offsets[3]] != 0x40:
                raw = _bytes_at(buf, offsets[3])
                if 0 in raw:
                    raise DecodeError("message 'subject' holds a NUL character")
                subj = raw.decode("utf-8")
        pos = stop
    return MessageHead(user_id, to, router, last, subj)


def _complete_value_fits(buf: bytes | bytearray | memoryview, pos: int, end: int) -> bool:
    """True when the value at ``pos`` claims a size that fits in ``buf[pos:end]`` (so a
    failed check is a real error, not just a value continued in the next frame)."""
    if pos >= end:
        return False
    ctor = buf[pos]
    if ctor in (0xC0, 0xC1, 0xA0, 0xA1, 0xA3, 0xE0):
        return pos + 1 < end and pos + 2 + buf[pos + 1] <= end
    if ctor in (0xD0, 0xD1, 0xB0, 0xB1, 0xB3, 0xF0):
        return pos + 5 <= end and pos + 5 + int.from_bytes(buf[pos + 1:pos + 5], "big") <= end
    return True


def _fields(buf: bytes | bytearray | memoryview, pos: int, stop: int, kinds: tuple[str, ...],
            what: str) -> list[int]:
    """Offsets of the fields of the (already checked) list at ``pos``, each of its kind."""
    ctor = buf[pos]
    if ctor == 0x45:
        return []
    if ctor == 0xC0:
        count, p = buf[pos + 2], pos + 3
    else:
        count, p = int.from_bytes(buf[pos + 5:pos + 9], "big"), pos + 9
    if count > len(kinds):
        raise DecodeError(f"message {what} has {count} fields, at most {len(kinds)} allowed")
    offsets = []
    for i in range(count):
        if p >= stop:
            raise DecodeError(f"message {what}: list count and size disagree")
        offsets.append(p)
        code = buf[p]
        if code != 0x40 and code not in KINDS[kinds[i]]:
            raise DecodeError(f"message {what} field {i} is not a {kinds[i]}")
        p = check_value(buf, p, stop, 1)
    return offsets


def _bytes_at(buf: bytes | bytearray | memoryview, pos: int) -> bytes:
    """The bytes of the binary/string/symbol value at ``pos`` (already checked)."""
    if buf[pos] in (0xA0, 0xA1, 0xA3):
        return bytes(buf[pos + 2:pos + 2 + buf[pos + 1]])
    n = int.from_bytes(buf[pos + 1:pos + 5], "big")
    return bytes(buf[pos + 5:pos + 5 + n])


def _has_router_annotation(buf: bytes | bytearray | memoryview, pos: int, stop: int) -> bool:
    """True when the (already checked) map at ``pos`` has a key starting ``x-opt-qd.``."""
    if buf[pos] == 0xC1:
        count, p = buf[pos + 2], pos + 3
    else:
        count, p = int.from_bytes(buf[pos + 5:pos + 9], "big"), pos + 9
    for i in range(count):
        if p >= stop:
            raise DecodeError("message annotations: map count and size disagree")
        code = buf[p]
        if i % 2 == 0:
            if code not in (0xA3, 0xB3, 0x44, 0x53, 0x80):
                raise DecodeError("message annotation key is not a symbol or a ulong")
            if code in (0xA3, 0xB3) and _bytes_at(buf, p).startswith(ROUTER_ANNOTATION_PREFIX):
                return True
        p = check_value(buf, p, stop, 1)
    return False
