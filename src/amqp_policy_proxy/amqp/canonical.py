"""Sans-IO. Canonical encodings: bytes every AMQP 1.0 peer reads the same way.

The proxy decides on what it reads from a client's frame and forwards the frame's own bytes
(or its own re-encoding of what it read). That is only safe when the router reads those bytes
the same way. Real peers do not: proton's C engine (qdrouterd, the Python binding's engine)
reads a list *by its size* and skips a field of the wrong type, proton's Python ``Data``
decoder reads a list *by its count*, and qdrouterd's own message walker reads a properties list
by its count and steps over a described value as if it were one byte. A hostile client with
one valid account used those differences to show the proxy one link, address, identity or
message and the router another (docs/decisions/0005-canonical-encodings.md).

So the proxy accepts a client's performatives, SASL frames and the message sections it reads
only in *canonical* form, checked here before anything else looks at them:

- every compound value (list, map, array), at any depth, holds exactly ``count`` elements
  that exactly fill its ``size``; a map has an even count; an array's elements use one
  non-empty constructor; nesting stops at :data:`MAX_DEPTH`;
- only the constructors of AMQP 1.0 Part 1 §1.6 appear, a ``boolean`` (0x56) is 0 or 1, and a
  described value's descriptor is a ``ulong`` or a ``symbol`` whose value is not itself
  described;
- a performative's descriptor is numeric (``0x00 0x53 code`` or ``0x00 0x80`` + 8 bytes), its
  list fills the frame body (a Transfer's list is followed by its payload), and each field has
  the spec's type or is null (:data:`PERFORMATIVE_FIELDS`): real booleans for ``role``,
  ``dynamic``, ``more``; a ``string`` address; source and target described as 0x28/0x29 (or
  ``amqp:source:list``/``amqp:target:list``); no described value where the spec has none;
- the fields policy needs are present (Attach name, handle and role; Transfer handle; Detach
  handle; sasl-init mechanism) and the strings it compares hold no NUL (proton's C engine
  hands the router a C string that ends at the first NUL).

Anything else raises :class:`~.errors.DecodeError` (``amqp:decode-error``): an ambiguity is a
denial. The checks are iterative over lists and bounded in depth, so no input can exhaust the
stack (a 2,000-deep nested list used to raise ``RecursionError`` from proton's decoder).
"""

from __future__ import annotations

from struct import Struct

from .constants import Descriptor
from .errors import DecodeError

#: Deepest nesting of compound and described values accepted anywhere (AMQP values real
#: clients send nest a few levels: a filter map in a source in an Attach).
MAX_DEPTH = 32

_U32 = Struct(">I")
_U32X2 = Struct(">II")

#: Fixed-width constructors (Part 1 §1.6) and the bytes that follow each one.
_FIXED: dict[int, int] = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}
_STR8, _STR32, _SYM8, _SYM32, _BIN8, _BIN32 = 0xA1, 0xB1, 0xA3, 0xB3, 0xA0, 0xB0
_LIST8, _LIST32, _MAP8, _MAP32, _ARRAY8, _ARRAY32 = 0xC0, 0xD0, 0xC1, 0xD1, 0xE0, 0xF0
_NULL = 0x40
_BOOLEAN = 0x56


def check_value(buf: bytes | bytearray | memoryview, pos: int, end: int, depth: int = 0) -> int:
    """Check the canonical encoding of the AMQP value at ``buf[pos]``; return where it ends.

    Args:
        buf: the bytes; nothing past ``end`` is read.
        pos: offset of the value's constructor.
        end: one past the last byte the value may use.
        depth: nesting depth of this value (0 at the top).

    Returns:
        The offset just past the value.

    Raises:
        DecodeError: truncated, an unknown constructor, a compound whose count and size
            disagree, a boolean other than 0/1, a bad descriptor, or nesting deeper than
            :data:`MAX_DEPTH`.
    """
    if pos >= end:
        raise DecodeError("truncated value")
    code = buf[pos]
    if code == 0x00:
        if depth >= MAX_DEPTH:
            raise DecodeError("values nested too deeply")
        pos = _descriptor(buf, pos + 1, end)
        if pos < end and buf[pos] == 0x00:
            raise DecodeError("a described value whose value is described")
        return check_value(buf, pos, end, depth + 1)
    return _body(buf, pos + 1, end, code, depth)


def _descriptor(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """Skip a descriptor (ulong or symbol, Part 1 §1.5); return the offset after it."""
    if pos >= end:
        raise DecodeError("truncated descriptor")
    code = buf[pos]
    if code not in (0x44, 0x53, 0x80, _SYM8, _SYM32):
        raise DecodeError(f"descriptor is not a ulong or a symbol (constructor 0x{code:02x})")
    return _body(buf, pos + 1, end, code, 0)


def _sized(buf: bytes | bytearray | memoryview, pos: int, end: int, wide: bool) -> tuple[int, int]:
    """``(start, stop)`` of a variable-width value's bytes whose length prefix is at ``pos``."""
    if wide:
        if pos + 4 > end:
            raise DecodeError("truncated value")
        start = pos + 4
        stop = start + _U32.unpack_from(buf, pos)[0]
    else:
        if pos + 1 > end:
            raise DecodeError("truncated value")
        start = pos + 1
        stop = start + buf[pos]
    if stop > end:
        raise DecodeError("truncated value")
    return start, stop


def _body(buf: bytes | bytearray | memoryview, pos: int, end: int, code: int,
          depth: int) -> int:
    """Check the bytes after constructor ``code`` (at ``pos``); return where they end."""
    width = _FIXED.get(code)
    if width is not None:
        stop = pos + width
        if stop > end:
            raise DecodeError("truncated value")
        if code == _BOOLEAN and buf[pos] > 1:
            raise DecodeError(f"boolean encoded as {buf[pos]}, not 0 or 1")
        return stop
    if code in (_STR8, _STR32, _SYM8, _SYM32, _BIN8, _BIN32):
        start, stop = _sized(buf, pos, end, code >= 0xB0)
        if code in (_STR8, _STR32):
            try:
                bytes(buf[start:stop]).decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError("string is not UTF-8") from None
        elif code in (_SYM8, _SYM32) and not bytes(buf[start:stop]).isascii():
            raise DecodeError("symbol is not ASCII")
        return stop
    if code in (_LIST8, _MAP8, _LIST32, _MAP32):
        first, count, lend = _compound(buf, pos, end, code in (_LIST32, _MAP32))
        if code in (_MAP8, _MAP32) and count % 2:
            raise DecodeError("map with an odd number of elements")
        if depth >= MAX_DEPTH:
            raise DecodeError("values nested too deeply")
        p = first
        for _ in range(count):
            if p >= lend:
                raise DecodeError("list count and size disagree")
            p = check_value(buf, p, lend, depth + 1)
        if p != lend:
            raise DecodeError("list count and size disagree")
        return lend
    if code in (_ARRAY8, _ARRAY32):
        return _array(buf, pos, end, code == _ARRAY32, depth)
    raise DecodeError(f"invalid constructor 0x{code:02x}")


def _compound(buf: bytes | bytearray | memoryview, pos: int, end: int,
              wide: bool) -> tuple[int, int, int]:
    """``(first element, count, end)`` of a list/map/array body whose size is at ``pos``."""
    if wide:
        if pos + 8 > end:
            raise DecodeError("truncated compound value")
        size, count = _U32X2.unpack_from(buf, pos)
        if size < 4:
            raise DecodeError("compound size smaller than its count")
        lend = pos + 4 + size
        first = pos + 8
    else:
        if pos + 2 > end:
            raise DecodeError("truncated compound value")
        size, count = buf[pos], buf[pos + 1]
        if size < 1:
            raise DecodeError("compound size smaller than its count")
        lend = pos + 1 + size
        first = pos + 2
    if lend > end:
        raise DecodeError("compound value runs past its container")
    return first, count, lend


def _array(buf: bytes | bytearray | memoryview, pos: int, end: int, wide: bool,
           depth: int) -> int:
    """Check an array body (Part 1 §1.6.25): size, count, one constructor, the elements."""
    first, count, lend = _compound(buf, pos, end, wide)
    if depth >= MAX_DEPTH:
        raise DecodeError("values nested too deeply")
    p = first
    if p >= lend:
        raise DecodeError("array without an element constructor")
    ctor = buf[p]
    p += 1
    if ctor == 0x00:  # an array of described values: one descriptor, then the constructor
        p = _descriptor(buf, p, lend)
        if p >= lend:
            raise DecodeError("array without an element constructor")
        ctor = buf[p]
        p += 1
    if ctor == 0x00 or _FIXED.get(ctor) == 0:
        # zero-width elements (null, true, uint0, list0...) have no canonical array form
        raise DecodeError(f"array element constructor 0x{ctor:02x} is not allowed")
    for _ in range(count):
        if p >= lend:
            raise DecodeError("array count and size disagree")
        p = _body(buf, p, lend, ctor, depth + 1)
    if p != lend:
        raise DecodeError("array count and size disagree")
    return lend


# ------------------------------------------------------------------ field types

#: Field kinds of :data:`PERFORMATIVE_FIELDS` and :data:`COMPOSITE_FIELDS`: the constructors
#: each accepts besides null (Part 2 §2.7-2.8, Part 3 §3.2, §3.4-3.5, Part 5 §5.3.3).
KINDS: dict[str, frozenset[int]] = {
    "uint": frozenset({0x43, 0x52, 0x70}),
    "ushort": frozenset({0x60}),
    "ubyte": frozenset({0x50}),
    "ulong": frozenset({0x44, 0x53, 0x80}),
    "boolean": frozenset({0x41, 0x42, _BOOLEAN}),
    "string": frozenset({_STR8, _STR32}),
    "symbol": frozenset({_SYM8, _SYM32}),
    "symbols": frozenset({_SYM8, _SYM32, _ARRAY8, _ARRAY32}),  # symbol, or an array of them
    "binary": frozenset({_BIN8, _BIN32}),
    "map": frozenset({_MAP8, _MAP32}),
    "timestamp": frozenset({0x83}),
    "message-id": frozenset({0x44, 0x53, 0x80, 0x98, _BIN8, _BIN32, _STR8, _STR32}),
}

#: Field kinds of each performative and SASL frame, in order. A ``"*"`` field takes any
#: canonical value that is not described; a ``"source"``, ``"target"``, ``"error"`` or
#: ``"state"`` field a described list with the right descriptor (or null).
PERFORMATIVE_FIELDS: dict[int, tuple[str, ...]] = {
    Descriptor.OPEN: ("string", "string", "uint", "ushort", "uint", "symbols", "symbols",
                      "symbols", "symbols", "map"),
    Descriptor.BEGIN: ("ushort", "uint", "uint", "uint", "uint", "symbols", "symbols", "map"),
    Descriptor.ATTACH: ("string", "uint", "boolean", "ubyte", "ubyte", "source", "target",
                        "map", "boolean", "uint", "ulong", "symbols", "symbols", "map"),
    Descriptor.FLOW: ("uint", "uint", "uint", "uint", "uint", "uint", "uint", "uint",
                      "boolean", "boolean", "map"),
    Descriptor.TRANSFER: ("uint", "uint", "binary", "uint", "boolean", "boolean", "ubyte",
                          "state", "boolean", "boolean", "boolean"),
    Descriptor.DISPOSITION: ("boolean", "uint", "uint", "boolean", "state", "boolean"),
    Descriptor.DETACH: ("uint", "boolean", "error"),
    Descriptor.END: ("error",),
    Descriptor.CLOSE: ("error",),
    Descriptor.SASL_MECHANISMS: ("symbols",),
    Descriptor.SASL_INIT: ("symbol", "binary", "string"),
    Descriptor.SASL_CHALLENGE: ("binary",),
    Descriptor.SASL_RESPONSE: ("binary",),
    Descriptor.SASL_OUTCOME: ("ubyte", "binary"),
}

#: Field kinds of the composite types found inside performatives.
COMPOSITE_FIELDS: dict[int, tuple[str, ...]] = {
    Descriptor.SOURCE: ("string", "uint", "symbol", "uint", "boolean", "map", "symbol", "map",
                        "state", "symbols", "symbols"),
    Descriptor.TARGET: ("string", "uint", "symbol", "uint", "boolean", "map", "symbols"),
    Descriptor.ERROR: ("symbol", "string", "map"),
}

#: Fields (by index) that must be present and not null, per performative.
MANDATORY: dict[int, tuple[int, ...]] = {
    Descriptor.ATTACH: (0, 1, 2),
    Descriptor.TRANSFER: (0,),
    Descriptor.DETACH: (0,),
    Descriptor.SASL_INIT: (0,),
    Descriptor.SASL_OUTCOME: (0,),
    Descriptor.OPEN: (0,),
}

#: Fields (by index) holding a string the proxy compares (names, addresses, hostname): no NUL.
_NO_NUL: dict[int, tuple[int, ...]] = {
    Descriptor.OPEN: (0, 1),
    Descriptor.ATTACH: (0,),
    Descriptor.SOURCE: (0,),
    Descriptor.TARGET: (0,),
}

_DELIVERY_STATES = frozenset({
    Descriptor.RECEIVED, Descriptor.ACCEPTED, Descriptor.REJECTED, Descriptor.RELEASED,
    Descriptor.MODIFIED, 0x33, 0x34,  # declared, transactional-state (Part 4 §4.5)
})
_SYMBOLIC = {
    b"amqp:source:list": Descriptor.SOURCE,
    b"amqp:target:list": Descriptor.TARGET,
    b"amqp:error:list": Descriptor.ERROR,
    b"amqp:received:list": Descriptor.RECEIVED,
    b"amqp:accepted:list": Descriptor.ACCEPTED,
    b"amqp:rejected:list": Descriptor.REJECTED,
    b"amqp:released:list": Descriptor.RELEASED,
    b"amqp:modified:list": Descriptor.MODIFIED,
}


def descriptor_at(buf: bytes | bytearray | memoryview, pos: int, end: int,
                  symbolic: bool) -> tuple[int, int]:
    """``(code, offset after the descriptor)`` of the described value at ``buf[pos]``.

    Numeric descriptors: ``0x00 0x53 code``, ``0x00 0x80`` + 8 bytes (``0x00 0x44`` is code 0).
    With ``symbolic``, the symbols of the composite types are accepted too. Anything else (a
    symbol the proxy does not know, a numeric descriptor outside the domain 0) gives code -1.

    Raises:
        DecodeError: not a described value, or truncated.
    """
    if pos + 2 > end or buf[pos] != 0x00:
        raise DecodeError("expected a described value")
    kind = buf[pos + 1]
    if kind == 0x53 and pos + 3 <= end:  # smallulong, as peers write descriptors: no slicing
        return buf[pos + 2], pos + 3
    if kind in (0x44, 0x53, 0x80):  # ulong0, smallulong, ulong
        stop = pos + 2 + _FIXED[kind]
        if stop > end:
            raise DecodeError("truncated descriptor")
        value = int.from_bytes(buf[pos + 2:stop], "big")
        return (value if value <= 0xFF else -1), stop
    if kind in (_SYM8, _SYM32):
        start, stop = _sized(buf, pos + 2, end, kind == _SYM32)
        code = _SYMBOLIC.get(bytes(buf[start:stop]), -1) if symbolic else -1
        return code, stop
    raise DecodeError(f"descriptor is not a ulong or a symbol (constructor 0x{kind:02x})")


def _check_fields(buf: bytes | bytearray | memoryview, first: int, count: int, lend: int,
                  kinds: tuple[str, ...], what: str) -> list[int]:
    """Check each list element against ``kinds``; return the offset of each element."""
    if count > len(kinds):
        raise DecodeError(f"{what} has {count} fields, at most {len(kinds)} allowed")
    offsets = []
    p = first
    for i in range(count):
        if p >= lend:
            raise DecodeError(f"{what}: list count and size disagree")
        offsets.append(p)
        code = buf[p]
        kind = kinds[i]
        if code != _NULL:
            allowed = KINDS.get(kind)
            if allowed is not None:
                if code not in allowed:
                    raise DecodeError(f"{what} field {i} is not a {kind} "
                                      f"(constructor 0x{code:02x})")
                if kind == "symbols" and code in (_ARRAY8, _ARRAY32):
                    _symbol_array(buf, p, lend, what, i)
            elif kind in ("source", "target", "error"):
                want = {"source": Descriptor.SOURCE, "target": Descriptor.TARGET,
                        "error": Descriptor.ERROR}[kind]
                _check_composite(buf, p, lend, want, what, i)
            elif kind == "state":
                got, q = descriptor_at(buf, p, lend, symbolic=True)
                if got not in _DELIVERY_STATES or buf[q] not in (_LIST8, _LIST32, 0x45):
                    raise DecodeError(f"{what} field {i} is not a delivery state")
            elif code == 0x00:  # "*": any value, but not a described one
                raise DecodeError(f"{what} field {i} is a described value")
        p = check_value(buf, p, lend, 1)
    if p != lend:
        raise DecodeError(f"{what}: list count and size disagree")
    return offsets


def _symbol_array(buf: bytes | bytearray | memoryview, pos: int, end: int, what: str,
                  index: int) -> None:
    """An array in a ``symbols`` field must hold symbols."""
    head = 2 if buf[pos] == _ARRAY8 else 8
    ctor_at = pos + 1 + head
    if ctor_at >= end or buf[ctor_at] not in (_SYM8, _SYM32):
        raise DecodeError(f"{what} field {index} is not an array of symbols")


def _check_composite(buf: bytes | bytearray | memoryview, pos: int, end: int, want: int,
                     what: str, index: int) -> None:
    """A source/target/error field: the right descriptor and its own fields' kinds."""
    code, p = descriptor_at(buf, pos, end, symbolic=True)
    if code != want:
        raise DecodeError(f"{what} field {index} has descriptor {code:#x}, not {want:#x}")
    stop = check_value(buf, pos, end, 1)
    ctor = buf[p]
    if ctor == 0x45:
        return
    if ctor not in (_LIST8, _LIST32):
        raise DecodeError(f"{what} field {index} is not a described list")
    first, count, lend = _compound(buf, p + 1, stop, ctor == _LIST32)
    name = Descriptor(want).name.lower()
    offsets = _check_fields(buf, first, count, lend, COMPOSITE_FIELDS[want], name)
    for i in _NO_NUL.get(want, ()):
        if i < len(offsets):
            _no_nul(buf, offsets[i], lend, f"{name} field {i}")


def _no_nul(buf: bytes | bytearray | memoryview, pos: int, end: int, what: str) -> None:
    code = buf[pos]
    if code in (_STR8, _STR32):
        start, stop = _sized(buf, pos + 1, end, code == _STR32)
        if 0 in buf[start:stop]:
            raise DecodeError(f"{what} holds a NUL character")


def check_performative(buf: bytes | bytearray | memoryview, pos: int,
                       end: int) -> tuple[int, int, list[int]]:
    """Check the performative (or SASL frame) whose frame body is ``buf[pos:end]``.

    Args:
        buf: the frame bytes.
        pos: offset of the body (the descriptor's ``0x00``).
        end: the frame's end.

    Returns:
        ``(descriptor code, end of the list, offset of each field present)``. The list ends at
        ``end`` except for a Transfer, whose payload follows it.

    Raises:
        DecodeError: not a canonical performative (see the module docstring): an unknown or
            symbolic descriptor, a list that does not fill its size or the body, a field of
            the wrong type, a missing mandatory field, a NUL in a name or address.
    """
    code, p = descriptor_at(buf, pos, end, symbolic=False)
    kinds = PERFORMATIVE_FIELDS.get(code)
    if kinds is None:
        raise DecodeError(f"unknown performative descriptor {code:#x}")
    what = _NAMES[code]
    if p >= end:
        raise DecodeError(f"{what} without a field list")
    ctor = buf[p]
    if ctor == 0x45:
        first, count, lend = p + 1, 0, p + 1
    elif ctor in (_LIST8, _LIST32):
        first, count, lend = _compound(buf, p + 1, end, ctor == _LIST32)
    else:
        raise DecodeError(f"{what} is not a described list")
    offsets = _check_fields(buf, first, count, lend, kinds, what)
    if lend != end and code != Descriptor.TRANSFER:
        raise DecodeError(f"{what}: bytes after the performative")
    for i in MANDATORY.get(code, ()):
        if i >= count or buf[offsets[i]] == _NULL:
            raise DecodeError(f"{what} without its mandatory field {i}")
    for i in _NO_NUL.get(code, ()):
        if i < count:
            _no_nul(buf, offsets[i], lend, f"{what} field {i}")
    return code, lend, offsets


_NAMES = {code: Descriptor(code).name.lower().replace("_", "-")
          for code in PERFORMATIVE_FIELDS}
