"""Hand-written AMQP encodings for raw-frame tests: the forms real clients use and the ones
only the general reader takes, written byte by byte (not by proton), so a test states exactly
which encoding it sends."""

from __future__ import annotations


def uint(n: int | None, wide: bool = False) -> bytes:
    """A ``uint`` (Part 1 §1.6.8): null for None; ``uint0``/``smalluint`` when it fits and not
    ``wide``, else the four-byte form."""
    if n is None:
        return b"\x40"
    if not wide and n < 256:
        return b"\x43" if n == 0 else b"\x52" + bytes([n])
    return b"\x70" + n.to_bytes(4, "big")


def flag(value: bool | None, long_form: bool = False) -> bytes:
    """A ``boolean``: null for None, ``0x41``/``0x42``, or with ``long_form`` ``0x56`` and a
    byte (which only the general reader takes)."""
    if value is None:
        return b"\x40"
    if long_form:
        return b"\x56" + (b"\x01" if value else b"\x00")
    return b"\x41" if value else b"\x42"


def transfer_body(handle: int, did: int | None, tag: bytes | None, *, count: int = 5,
                  settled: bool | None = True, more: bool | None = False, wide: bool = False,
                  list32: bool = False, long_bool: bool = False, payload: bytes = b"m") -> bytes:
    """A Transfer frame body (Part 2 §2.7.5): its first ``count`` fields (handle,
    delivery-id, a ``binary8`` delivery-tag or null, message-format 0, settled, more) in a
    list8 or ``list32``, then ``payload``."""
    fields = [
        uint(handle, wide),
        uint(did, wide),
        b"\x40" if tag is None else b"\xa0" + bytes([len(tag)]) + tag,
        uint(0, wide),
        flag(settled, long_bool),
        flag(more, long_bool),
    ][:count]
    items = b"".join(fields)
    if list32:
        lst = b"\xd0" + (len(items) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + items
    else:
        lst = b"\xc0" + bytes([len(items) + 1, count]) + items
    return b"\x00\x53\x14" + lst + payload
