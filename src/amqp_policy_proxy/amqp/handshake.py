"""Sans-IO. Byte-level shortcuts for the connection handshake: the sasl-outcome code read from
its bytes, and an Open's channel-max patched in place.

Both serve the connection rate: decoding a performative through proton's codec and encoding
it again costs tens of µs, several times per connection. Each function only handles the
plain encodings (the ones proton and the routers emit) and returns None for anything else;
the caller then decodes (and re-encodes) as before, so no input is treated differently, only
faster.
"""

from __future__ import annotations

from .errors import DecodeError
from .transfer import list_bounds, skip_value

_SASL_OUTCOME = 0x44
_OPEN = 0x10


def _plain_list(buf: bytes | bytearray | memoryview, pos: int,
                end: int) -> tuple[int, int, int] | None:
    """``(first, count, list_end)`` of a list8/list32 at ``buf[pos]`` that ends exactly at
    ``end``; None otherwise."""
    try:
        first, count, lend = list_bounds(buf, pos, end)
    except DecodeError:
        return None
    if lend != end or buf[pos] == 0x45:
        return None
    return first, count, lend


def sasl_outcome_code(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int | None:
    """The ``code`` of the sasl-outcome (Part 5 §5.3.3.6) whose frame body is ``buf[pos:end]``.

    Read only from the plain encoding: descriptor ``0x00 0x53 0x44``, a list8 or list32 that
    fills the body, holding the code as a ``ubyte`` (``0x50``) and, optionally, the
    additional-data as ``null`` or ``binary8``/``binary32`` that ends the list.

    Returns:
        The code (0 = ok), or None when the body is not a sasl-outcome in that encoding (the
        caller decodes it with proton instead).
    """
    if end - pos < 6 or buf[pos] != 0x00 or buf[pos + 1] != 0x53 or buf[pos + 2] != _SASL_OUTCOME:
        return None
    lst = _plain_list(buf, pos + 3, end)
    if lst is None:
        return None
    p, count, lend = lst
    if count not in (1, 2) or lend - p < 2 or buf[p] != 0x50:
        return None
    code = buf[p + 1]
    p += 2
    if count == 2:
        if p >= lend or buf[p] not in (0x40, 0xA0, 0xB0):
            return None
        try:
            p = skip_value(buf, p, lend)
        except DecodeError:
            return None
    return code if p == lend else None


def open_with_channel_max(body: bytes, channel_max: int) -> bytes | None:
    """The Open frame body ``body`` with its channel-max (Part 2 §2.7.1, field 4) set to
    ``channel_max``, patched in place: every other byte stays the client's.

    Only when the Open is ``0x00 0x53 0x10`` with a list8/list32 that fills the body and
    channel-max is present as a ``ushort`` (``0x60``, what clients send); an absent or null
    channel-max (the default 65535) has no bytes to patch.

    Args:
        body: the frame body (after the frame header), already decoded successfully by the
            caller, so its fields are known to be well formed.
        channel_max: the new value, 0 to 65535.

    Returns:
        The patched body, or None (the caller re-encodes the Open instead).
    """
    if len(body) < 4 or body[0] != 0x00 or body[1] != 0x53 or body[2] != _OPEN:
        return None
    lst = _plain_list(body, 3, len(body))
    if lst is None:
        return None
    p, count, lend = lst
    if not 4 <= count <= 10:  # more fields than Open has: let the re-encoding decide
        return None
    try:
        for _ in range(3):  # container-id, hostname, max-frame-size
            p = skip_value(body, p, lend)
    except DecodeError:
        return None
    if lend - p < 3 or body[p] != 0x60:
        return None
    return body[:p + 1] + channel_max.to_bytes(2, "big") + body[p + 3:]
