"""Sans-IO. The AMQP 1.0 type codec: the ONLY module that imports proton.

We use proton's ``Data`` (the C codec of Qpid Proton) to decode and encode described lists
(performatives, sources, targets, errors, delivery states). proton's typed wrappers (``uint``,
``ushort``, ``symbol``, ...) are re-exported so the rest of the package keeps AMQP types
distinct without importing proton itself. ``proton.DataException`` never leaks: it becomes
:class:`~amqp_policy_proxy.amqp.errors.DecodeError`.
"""

from __future__ import annotations

from typing import Any

from proton import (
    Array,
    Data,
    DataException,
    Described,
    char,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

from .constants import SYMBOLIC_DESCRIPTORS
from .errors import DecodeError

__all__ = [
    "Array",
    "Described",
    "char",
    "decode_described",
    "decode_value",
    "encode_described",
    "encode_value",
    "symbol",
    "symbol_array",
    "timestamp",
    "ubyte",
    "uint",
    "ulong",
    "ushort",
]


def symbol_array(names: list[str]) -> Array:
    """Return an AMQP array of symbols (e.g. sasl-server-mechanisms, capabilities)."""
    from proton import UNDESCRIBED

    # proton's annotation of the descriptor omits UNDESCRIBED, its own marker of an array
    # without a descriptor (proton itself builds symbol arrays this way)
    return Array(UNDESCRIBED, Data.SYMBOL, *[symbol(n) for n in names])  # type: ignore[arg-type]


def descriptor_code(descriptor: Any) -> int | None:
    """Return the numeric code of a descriptor (ulong or a known symbol), else None."""
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return int(descriptor)
    if isinstance(descriptor, str):
        return SYMBOLIC_DESCRIPTORS.get(descriptor)
    return None


def decode_value(data: bytes | bytearray | memoryview) -> tuple[Any, int]:
    """Decode the first AMQP value in ``data``.

    Args:
        data: encoded bytes; may continue past the value (e.g. a Transfer payload).

    Returns:
        ``(value, consumed)``: the Python value (proton wrappers for AMQP types) and the
        number of bytes it occupied.

    Raises:
        DecodeError: the bytes are not a complete, valid AMQP value, or nest too deeply for
            proton's decoder (never ``RecursionError``).
    """
    d = Data()
    try:
        consumed = d.decode(bytes(data))
        d.rewind()
        if not d.next():
            raise DecodeError("empty AMQP value")
        value = _materialize(d.get_object())
    except DataException as exc:
        raise DecodeError(f"malformed AMQP value: {exc}") from None
    except (TypeError, ValueError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        raise DecodeError(f"malformed AMQP value: {exc}") from None
    except RecursionError:
        # proton's Python decoder recurses once per nesting level: a deeply nested value from
        # a peer is malformed input, not an internal error (it used to log a 155 KB traceback)
        raise DecodeError("malformed AMQP value: nested too deeply") from None
    return value, consumed


def _materialize(value: Any) -> Any:
    """Copy binary values out of proton's buffer (``get_object`` returns memoryviews into the
    ``Data`` object, which is freed when it goes out of scope)."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, list):
        return [_materialize(v) for v in value]
    if isinstance(value, Described):
        # a descriptor may be any type, binary included: copy it too
        return Described(_materialize(value.descriptor), _materialize(value.value))
    if isinstance(value, dict):
        return {_materialize(k): _materialize(v) for k, v in value.items()}
    if isinstance(value, Array):
        return Array(_materialize(value.descriptor), value.type,
                     *[_materialize(v) for v in value.elements])
    return value


def decode_described(data: bytes | bytearray | memoryview) -> tuple[int, list[Any], int]:
    """Decode a described list (a performative, source, target, error, outcome).

    Args:
        data: encoded bytes starting with the described type's constructor.

    Returns:
        ``(descriptor_code, fields, consumed)``. ``fields`` is the list value, possibly
        shorter than the type's field count (trailing nulls may be omitted on the wire).

    Raises:
        DecodeError: not a described type, an unknown descriptor, or not a list body.
    """
    value, consumed = decode_value(data)
    if not isinstance(value, Described):
        raise DecodeError("expected a described type")
    code = descriptor_code(value.descriptor)
    if code is None:
        raise DecodeError(f"unknown descriptor {value.descriptor!r}")
    fields = value.value
    if fields is None:
        fields = []
    if not isinstance(fields, list):
        raise DecodeError(f"descriptor 0x{code:02x}: expected a list body")
    return code, fields, consumed


def encode_described(code: int, fields: list[Any]) -> bytes:
    """Encode a described list with a numeric descriptor.

    Args:
        code: the descriptor code (e.g. 0x10 for open).
        fields: field values in order; trailing ``None`` values are dropped.

    Returns:
        The encoded bytes.

    Raises:
        DecodeError: a field value cannot be encoded (it came from a malformed peer frame).
    """
    end = len(fields)
    while end and fields[end - 1] is None:
        end -= 1
    return encode_value(Described(ulong(code), list(fields[:end])))


def encode_value(value: Any) -> bytes:
    """Encode one value with proton's type mapping (see ``proton.Data.put_object``).

    Raises:
        DecodeError: the value cannot be encoded.
    """
    d = Data()
    try:
        d.put_object(value)
        return bytes(d.encode())
    except (DataException, TypeError, ValueError, KeyError, OverflowError) as exc:
        raise DecodeError(f"cannot encode value: {exc}") from None
    except RecursionError:
        raise DecodeError("cannot encode value: nested too deeply") from None
