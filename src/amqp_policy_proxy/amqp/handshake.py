"""Sans-IO. Byte-level shortcuts for the connection handshake: the sasl-mechanisms recognised,
the sasl-init's mechanism and initial response, the sasl-outcome code and the Open fields the
admission decision needs, all read from their bytes; an Open's max-frame-size and channel-max
patched without re-encoding the rest.

They serve the connection rate: decoding a performative through proton's codec (and encoding
it again) costs tens of µs, four times per connection. Each function only handles the plain
encodings (the ones proton clients and the routers emit) and returns None for anything else;
the caller then decodes (and re-encodes) with proton as before. Where a function answers, the
property tests check that proton decodes the same bytes to the same values, so no input is
treated differently, only faster (the one stated exception is :func:`is_sasl_mechanisms`).
"""

from __future__ import annotations

from struct import Struct
from typing import Literal, NamedTuple, overload

from .errors import DecodeError
from .transfer import list_bounds, read_uint, skip_value

_SASL_MECHANISMS = 0x40
_SASL_INIT = 0x41
_SASL_OUTCOME = 0x44
_OPEN = 0x10
_U16 = Struct(">H")
_U32 = Struct(">I")
_U32X2 = Struct(">II")
#: Open has ten fields (Part 2 §2.7.1).
_OPEN_FIELDS = 10
_NULL = 0x40


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


# ------------------------------------------------------------------ small readers
# Each returns (value, next offset), or raises _NotPlain for an encoding it leaves to proton.


class _NotPlain(Exception):
    """An encoding the byte readers leave to proton's decoder."""


def _described_list(buf: bytes | bytearray | memoryview, pos: int, end: int,
                    descriptor: int) -> tuple[int, int, int]:
    """``(first, count, list_end)`` of ``0x00 0x53 <descriptor>`` + list8/list32 filling
    ``buf[pos:end]``."""
    if end - pos < 4 or buf[pos] != 0x00 or buf[pos + 1] != 0x53 or buf[pos + 2] != descriptor:
        raise _NotPlain
    lst = _plain_list(buf, pos + 3, end)
    if lst is None:
        raise _NotPlain
    return lst


def _sized(buf: bytes | bytearray | memoryview, p: int, end: int, short: int,
           long: int) -> tuple[int, int]:
    """``(start, stop)`` of the bytes of a str/sym/bin value with constructors ``short``
    (one-byte length) or ``long`` (four-byte length) at ``buf[p]``."""
    code = buf[p]
    if code == short:
        if p + 2 > end:
            raise _NotPlain
        start = p + 2
        stop = start + buf[p + 1]
    elif code == long:
        if p + 5 > end:
            raise _NotPlain
        start = p + 5
        stop = start + _U32.unpack_from(buf, p + 1)[0]
    else:
        raise _NotPlain
    if stop > end:
        raise _NotPlain
    return start, stop


@overload
def _string(buf: bytes | bytearray | memoryview, p: int, end: int,
            nullable: Literal[False]) -> tuple[str, int]: ...


@overload
def _string(buf: bytes | bytearray | memoryview, p: int, end: int,
            nullable: bool) -> tuple[str | None, int]: ...


def _string(buf: bytes | bytearray | memoryview, p: int, end: int,
            nullable: bool) -> tuple[str | None, int]:
    """A ``string`` (str8-utf8/str32-utf8), or null when ``nullable``."""
    if p >= end:
        raise _NotPlain
    if buf[p] == _NULL and nullable:
        return None, p + 1
    start, stop = _sized(buf, p, end, 0xA1, 0xB1)
    try:
        return bytes(buf[start:stop]).decode("utf-8"), stop
    except UnicodeDecodeError:
        raise _NotPlain from None


def _symbol(buf: bytes | bytearray | memoryview, p: int, end: int) -> tuple[str, int]:
    """A ``symbol`` (sym8/sym32, ASCII)."""
    if p >= end:
        raise _NotPlain
    start, stop = _sized(buf, p, end, 0xA3, 0xB3)
    try:
        return bytes(buf[start:stop]).decode("ascii"), stop
    except UnicodeDecodeError:
        raise _NotPlain from None


def _ushort(buf: bytes | bytearray | memoryview, p: int, end: int) -> tuple[int | None, int]:
    """A ``ushort`` or null."""
    if p >= end:
        raise _NotPlain
    code = buf[p]
    if code == _NULL:
        return None, p + 1
    if code == 0x60 and p + 3 <= end:
        return _U16.unpack_from(buf, p + 1)[0], p + 3
    raise _NotPlain


# ------------------------------------------------------------------ SASL


def is_sasl_mechanisms(buf: bytes | bytearray | memoryview, pos: int, end: int) -> bool:
    """Whether the SASL frame body ``buf[pos:end]`` is a sasl-mechanisms (Part 5 §5.3.3.1) in
    the plain encoding: ``0x00 0x53 0x40``, a list8/list32 that fills the body, holding one
    field, sasl-server-mechanisms, as a symbol or an array of symbols (each ASCII).

    The proxy relays the router's sasl-mechanisms unchanged; it only has to tell it apart
    from the sasl-outcome. True means proton would decode the same bytes to a
    ``SaslMechanisms`` (property-tested); False means "decode it" (the caller then does, and
    a malformed one is refused as before).
    """
    try:
        p, count, lend = _described_list(buf, pos, end, _SASL_MECHANISMS)
        if count != 1 or p >= lend:
            return False
        code = buf[p]
        if code in (0xA3, 0xB3):
            return _symbol(buf, p, lend)[1] == lend
        if code == 0xE0:  # array8: size, count, element constructor
            if p + 4 > lend:
                return False
            size, n, q = buf[p + 1], buf[p + 2], p + 3
        elif code == 0xF0:  # array32
            if p + 10 > lend:
                return False
            size, n = _U32X2.unpack_from(buf, p + 1)
            q = p + 9
        else:
            return False
        if (code == 0xE0 and p + 2 + size != lend) or (code == 0xF0 and p + 5 + size != lend):
            return False
        elem = buf[q]
        q += 1
        if elem == 0xA3:
            for _ in range(n):
                if q >= lend:
                    return False
                stop = q + 1 + buf[q]
                if stop > lend:
                    return False
                bytes(buf[q + 1:stop]).decode("ascii")
                q = stop
        elif elem == 0xB3:
            for _ in range(n):
                if q + 4 > lend:
                    return False
                stop = q + 4 + _U32.unpack_from(buf, q)[0]
                if stop > lend:
                    return False
                bytes(buf[q + 4:stop]).decode("ascii")
                q = stop
        else:
            return False
        return q == lend and n > 0
    except (_NotPlain, UnicodeDecodeError):
        return False



def read_sasl_init(buf: bytes | bytearray | memoryview, pos: int,
                   end: int) -> tuple[str, bytes | None] | None:
    """``(mechanism, initial_response)`` of the sasl-init (Part 5 §5.3.3.2) whose frame body
    is ``buf[pos:end]``.

    Read only from the plain encoding: ``0x00 0x53 0x41``, a list8/list32 filling the body
    with one to three fields: mechanism as a symbol (sym8/sym32, ASCII), initial-response as
    null or binary (vbin8/vbin32), hostname as null or a UTF-8 string.

    Returns:
        The mechanism and the initial response (bytes, or None when absent or null), or None
        for any other body (the caller decodes it with proton). The initial response may hold
        a password: never log it.
    """
    try:
        p, count, lend = _described_list(buf, pos, end, _SASL_INIT)
        if not 1 <= count <= 3:
            return None
        mechanism, p = _symbol(buf, p, lend)
        response: bytes | None = None
        if count >= 2:
            if p >= lend:
                return None
            if buf[p] == _NULL:
                p += 1
            else:
                start, p = _sized(buf, p, lend, 0xA0, 0xB0)
                response = bytes(buf[start:p])
        if count == 3:
            _, p = _string(buf, p, lend, nullable=True)
        return (mechanism, response) if p == lend else None
    except _NotPlain:
        return None


# ------------------------------------------------------------------ Open


class OpenHead(NamedTuple):
    """The first four fields of an Open (Part 2 §2.7.1): what admission and the relay need."""

    container_id: str
    hostname: str | None
    """The vhost the client asks for (``None`` when absent or null)."""
    max_frame_size: int | None
    """Bytes; ``None`` when absent or null (the default, 4294967295)."""
    channel_max: int | None
    """Highest channel number; ``None`` when absent or null (the default, 65535)."""
    fields: tuple[list[int], int] | None = None
    """Where each field of the body starts, and where its list ends: :func:`patch_open` takes
    them instead of walking the body again."""


def _open_fields(body: bytes | bytearray | memoryview) -> tuple[list[int], int] | None:
    """Offsets of each field of a plain-encoded Open body, plus the list's end; None if the
    body is not ``0x00 0x53 0x10`` + list8/list32 filling it with at most ten well-formed
    fields."""
    try:
        p, count, lend = _described_list(body, 0, len(body), _OPEN)
    except _NotPlain:
        return None
    if count > _OPEN_FIELDS:
        return None
    offsets = []
    try:
        for _ in range(count):
            offsets.append(p)
            p = skip_value(body, p, lend)
    except DecodeError:
        return None
    return (offsets, lend) if p == lend else None


def read_open_head(body: bytes | bytearray | memoryview, *,
                   strict: bool = True) -> OpenHead | None:
    """Read container-id, hostname, max-frame-size and channel-max of an Open frame body.

    Only the plain encoding: ``0x00 0x53 0x10``, a list8/list32 that fills the body, at most
    ten fields, container-id a UTF-8 string, hostname null or a string, max-frame-size null or
    a uint, channel-max null or a ushort.

    Args:
        body: the frame body.
        strict: also require idle-time-out to be null or a uint and every later field
            (locales, capabilities, properties) to be null, so that a non-None answer means
            proton decodes the whole Open to the same values (the client's Open: the proxy
            then never decodes it). With ``strict=False`` the later fields only have to be
            well-formed AMQP values (the router's Open, relayed as it came; the client
            decodes it).

    Returns:
        The fields, or None (the caller decodes the Open with proton).
    """
    fields = _open_fields(body)
    if fields is None:
        return None
    offsets, lend = fields
    n = len(offsets)
    if n == 0:
        return None
    try:
        stop = offsets + [lend]
        container_id, _ = _string(body, offsets[0], stop[1], nullable=False)
        hostname = max_frame_size = channel_max = None
        if n > 1:
            hostname, _ = _string(body, offsets[1], stop[2], nullable=True)
        if n > 2:
            max_frame_size, _ = read_uint(body, offsets[2], stop[3])
        if n > 3:
            channel_max, _ = _ushort(body, offsets[3], stop[4])
        if strict:
            if n > 4:
                read_uint(body, offsets[4], stop[5])
            for i in range(5, n):
                if body[offsets[i]] != _NULL:
                    return None
    except (_NotPlain, DecodeError):  # DecodeError: read_uint found no uint
        return None
    if strict and ("\x00" in container_id or (hostname is not None and "\x00" in hostname)):
        return None  # proton's C engine ends a string at a NUL: the strict check refuses it
    return OpenHead(container_id, hostname, max_frame_size, channel_max, fields)


def patch_open(body: bytes, *, max_frame_size: int | None = None,
               channel_max: int | None = None,
               fields: tuple[list[int], int] | None = None) -> bytes | None:
    """The Open frame body ``body`` with max-frame-size and/or channel-max replaced.

    Every other field keeps the client's (or router's) bytes; the two fields are written as
    ``uint``/``ushort`` (added with nulls before them when the Open was shorter), and the
    list header is rewritten for the new size (list8 stays list8 while it fits).

    Args:
        body: a frame body that :func:`read_open_head` (or proton) read successfully.
        max_frame_size: new max-frame-size in bytes (0 to 4294967295), or None to keep it.
        channel_max: new channel-max (0 to 65535), or None to keep it.
        fields: :attr:`OpenHead.fields` of ``body`` when :func:`read_open_head` read it (the
            body is then not walked again).

    Returns:
        The new body, or None when ``body`` is not a plain-encoded Open (the caller
        re-encodes the decoded Open instead).
    """
    if fields is None:
        fields = _open_fields(body)
    if fields is None:
        return None
    offsets, lend = fields
    if max_frame_size is None and channel_max is not None and len(offsets) > 3:
        at = offsets[3]
        if body[at] == 0x60:  # a ushort already: the same two bytes, patched in place
            return body[:at + 1] + _U16.pack(channel_max) + body[at + 3:]
    parts = [body[a:b] for a, b in zip(offsets, offsets[1:] + [lend], strict=True)]
    need = 4 if channel_max is not None else 3 if max_frame_size is not None else 0
    while len(parts) < need:
        parts.append(b"\x40")
    if max_frame_size is not None:
        parts[2] = b"\x70" + _U32.pack(max_frame_size)
    if channel_max is not None:
        parts[3] = b"\x60" + _U16.pack(channel_max)
    content = b"".join(parts)
    if body[3] == 0xC0 and len(content) + 1 <= 0xFF:
        head = bytes((0xC0, len(content) + 1, len(parts)))
    else:
        head = b"\xd0" + _U32X2.pack(len(content) + 4, len(parts))
    return body[:3] + head + content
