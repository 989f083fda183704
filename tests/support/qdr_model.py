"""A model of how qdrouterd 1.19 reads a message's sections (its ``src/message.c``), for the
differential oracle.

The router does not decode a message with an AMQP decoder: it walks the sections in a fixed
order, each matched by its descriptor bytes (``00 53 xx`` or ``00 80 00..00 xx``), checks the
section's first tag against the kinds it expects, and steps over the section by the size in
its encoding (``message_check_depth_LH``). Properties fields are then located by walking the
list's *count* of fields with ``traverse_field``, which sizes a field by the high nibble of its
constructor alone: a described value (``0x00``) counts as one byte. This module reproduces
exactly that, so a test can ask "what ``to`` would the router route this message by?".

Test support only: nothing in the proxy imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

_SECTIONS = (  # (code, expected first tags)
    (0x70, b"\x45\xc0\xd0"),  # header
    (0x71, b"\xc1\xd1"),  # delivery-annotations
    (0x72, b"\xc1\xd1"),  # message-annotations
    (0x73, b"\x45\xc0\xd0"),  # properties
    (0x74, b"\xc1\xd1"),  # application-properties
)


@dataclass
class RouterView:
    """What the router reads from a message."""

    valid: bool
    """False where the router would reject the message as invalid (``invalid message format``)."""
    to: bytes | None = None
    user_id: bytes | None = None
    to_override: bool = False
    """The message annotations carry a router annotation (``x-opt-qd.``)."""


def _section_length(buf: bytes, pos: int) -> tuple[int, int] | None:
    """``(header bytes, value bytes)`` of the value whose tag is at ``pos`` (the router's
    ``message_section_check_LH`` sizing), or None when the buffer ends first."""
    if pos >= len(buf):
        return None
    tag = buf[pos]
    sub = tag & 0xF0
    fixed = {0x40: 0, 0x50: 1, 0x60: 2, 0x70: 4, 0x80: 8, 0x90: 16}
    if sub in fixed:
        return 1, fixed[sub]
    if sub in (0xB0, 0xD0, 0xF0):
        if pos + 5 > len(buf):
            return None
        return 5, int.from_bytes(buf[pos + 1:pos + 5], "big")
    if sub in (0xA0, 0xC0, 0xE0):
        if pos + 2 > len(buf):
            return None
        return 2, buf[pos + 1]
    return 1, 0


def _traverse_field(buf: bytes, pos: int) -> int | None:
    """The router's ``traverse_field``: the offset after the field at ``pos``."""
    if pos >= len(buf):
        return None
    tag = buf[pos]
    sub = tag & 0xF0
    consume = {0x40: 0, 0x50: 1, 0x60: 2, 0x70: 4, 0x80: 8, 0x90: 16}.get(sub)
    if consume is not None:
        end = pos + 1 + consume
    elif sub in (0xB0, 0xD0, 0xF0):
        if pos + 5 > len(buf):
            return None
        end = pos + 5 + int.from_bytes(buf[pos + 1:pos + 5], "big")
    elif sub in (0xA0, 0xC0, 0xE0):
        if pos + 2 > len(buf):
            return None
        end = pos + 2 + buf[pos + 1]
    else:  # 0x00 (described) and anything else: the tag alone
        end = pos + 1
    return end if end <= len(buf) else None


def _field_value(buf: bytes, pos: int) -> bytes | None:
    """The bytes of a field as ``qd_message_field_iterator`` gives them (header skipped),
    None for null."""
    tag = buf[pos]
    if tag == 0x40:
        return None
    sub = tag & 0xF0
    if sub in (0xB0, 0xD0, 0xF0):
        n = int.from_bytes(buf[pos + 1:pos + 5], "big")
        return buf[pos + 5:pos + 5 + n]
    if sub in (0xA0, 0xC0, 0xE0):
        return buf[pos + 2:pos + 2 + buf[pos + 1]]
    end = _traverse_field(buf, pos)
    return buf[pos + 1:end]


def router_view(message: bytes) -> RouterView:
    """Read ``message`` (a whole delivery's bytes) the way qdrouterd does."""
    pos = 0
    found: dict[int, tuple[int, int]] = {}  # code -> (value start, value end)
    for code, tags in _SECTIONS:
        short = b"\x00\x53" + bytes([code])
        long = b"\x00\x80" + b"\x00" * 7 + bytes([code])
        if message.startswith(short, pos):
            start = pos + len(short)
        elif message.startswith(long, pos):
            start = pos + len(long)
        else:
            continue  # optional section absent
        if start >= len(message) or message[start] not in tags:
            return RouterView(valid=False)
        sized = _section_length(message, start)
        if sized is None:
            return RouterView(valid=False)
        head, length = sized
        end = start + head + length
        if end > len(message):
            return RouterView(valid=False)
        found[code] = (start, end)
        pos = end
    view = RouterView(valid=True)
    if 0x72 in found:
        start, end = found[0x72]
        view.to_override = b"x-opt-qd." in message[start:end]
    if 0x73 in found:
        start, end = found[0x73]
        tag = message[start]
        if tag == 0x45:
            return view
        if tag == 0xC0:
            count, p = message[start + 2], start + 3
        else:
            count, p = int.from_bytes(message[start + 5:start + 9], "big"), start + 9
        fields: list[int] = []
        for _ in range(min(count, 3)):
            fields.append(p)
            nxt = _traverse_field(message, p)
            if nxt is None:
                return view
            p = nxt
        if len(fields) > 1:
            view.user_id = _field_value(message, fields[1])
        if len(fields) > 2:
            view.to = _field_value(message, fields[2])
    return view
