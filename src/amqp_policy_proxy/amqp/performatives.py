"""Sans-IO. AMQP 1.0 performatives and composite types as frozen dataclasses.

Field names are the spec's with hyphens as underscores (Part 2 §2.7 performatives, §2.8
definitions, Part 3 §3.4 delivery states, §3.5 source/target, Part 5 §5.3.3 SASL frames).
Values keep proton's AMQP type wrappers (``uint``, ``symbol``, ...) from decoding, so a
decoded performative re-encodes to the same bytes; plain ``int``/``str`` values we set are
wrapped with the field's declared AMQP type on encoding. A field is declared with one of the
aliases :data:`UInt`, :data:`UShort`, :data:`UByte`, :data:`ULong`, :data:`Symbol` (what the
type checker sees of it, and the AMQP type it is encoded as) or ``Any`` (any AMQP value).

Encoding and decoding go through :mod:`.codec` (proton's codec). Transfers on the hot path are
read by :mod:`.transfer` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar, dataclass_transform

from . import codec
from .constants import Descriptor
from .errors import DecodeError

_WRAPPERS: dict[str, Callable[[Any], Any]] = {
    "uint": codec.uint,
    "ushort": codec.ushort,
    "ubyte": codec.ubyte,
    "ulong": codec.ulong,
    "symbol": codec.symbol,
}

_REGISTRY: dict[int, type[Composite]] = {}

# The field types. A decoded integer field is an int in its type's range (``from_fields``
# checks it; proton's wrapper, a subclass of int) or None (absent or null); the proxy sets
# plain ints, wrapped on encoding. A symbol field is wrapped on encoding when it is a str,
# but a peer's value is not checked on decoding: it may be anything.
UInt: TypeAlias = int | None
"""An AMQP ``uint`` field."""
UShort: TypeAlias = int | None
"""An AMQP ``ushort`` field."""
UByte: TypeAlias = int | None
"""An AMQP ``ubyte`` field."""
ULong: TypeAlias = int | None
"""An AMQP ``ulong`` field."""
Symbol: TypeAlias = object
"""An AMQP ``symbol`` field (a str when the proxy sets it; None when absent)."""

#: The AMQP type of a field, by the name of the alias it is annotated with (``Any``: none).
_FIELD_KINDS = {"UInt": "uint", "UShort": "ushort", "UByte": "ubyte", "ULong": "ulong",
                "Symbol": "symbol"}

_INT_LIMITS = {"ubyte": 0xFF, "ushort": 0xFFFF, "uint": 0xFFFFFFFF, "ulong": 0xFFFFFFFFFFFFFFFF}


def _wrap(kind: str | None, value: Any) -> Any:
    if value is None or kind is None:
        return value
    if isinstance(value, Composite):
        return value.to_described()
    if kind == "symbol":
        return value if isinstance(value, codec.symbol) or not isinstance(value, str) else codec.symbol(value)
    wrapper = _WRAPPERS[kind]
    if isinstance(value, bool) or type(value) is not int:
        return value
    try:
        return wrapper(value)
    except (AssertionError, OverflowError, ValueError):
        # proton raises AssertionError for a negative uint: the value came from a peer
        # that sent a signed type where the spec says unsigned.
        raise DecodeError(f"{value} is out of range for {kind}") from None


def _unwrap(value: Any) -> Any:
    if isinstance(value, codec.Described):
        code = codec.descriptor_code(value.descriptor)
        cls = _REGISTRY.get(code) if code is not None else None
        if cls is not None:
            if not isinstance(value.value, list | type(None)):
                # composite types are described lists (Part 1 §1.4); anything else (a
                # described value inside, say) has no stable encoding through the codec
                raise DecodeError(f"{cls.__name__}: expected a list body, "
                                  f"got {type(value.value).__name__}")
            return cls.from_fields(value.value or [])
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Composite:
    """Base of described-list types: ``from_fields``/``to_fields``/``encode``."""

    DESCRIPTOR: ClassVar[int] = -1
    #: AMQP wire type per typed field (from its annotation, see ``_composite``), used to
    #: range-check decoded values and to wrap plain Python values when encoding.
    TYPES: ClassVar[dict[str, str]] = {}

    @classmethod
    def from_fields(cls, values: list[Any]) -> Composite:
        """Build from a decoded field list (shorter lists leave trailing fields None).

        Raises:
            DecodeError: more values than the type has fields.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        if len(values) > len(names):
            raise DecodeError(
                f"{cls.__name__}: {len(values)} fields, at most {len(names)} allowed"
            )
        types = cls.TYPES
        for name, v in zip(names, values, strict=False):
            limit = _INT_LIMITS.get(types.get(name, ""))
            # Any AMQP integer encoding is accepted for an unsigned field, but the value must
            # be an integer in the field's range: the proxy does arithmetic on these values
            # and int() on an array or string from a hostile peer must not reach it.
            if limit is not None and v is not None and (
                    type(v) is bool or not isinstance(v, int) or not 0 <= v <= limit):
                raise DecodeError(f"{cls.__name__}.{name}: {v!r} is not a {types[name]}")
        return cls(**{name: _unwrap(v) for name, v in zip(names, values, strict=False)})

    def to_fields(self) -> list[Any]:
        """Return the field values in wire order, wrapped in their AMQP types."""
        types = self.TYPES
        return [
            _wrap(types.get(f.name, "any"), getattr(self, f.name))
            if types.get(f.name) or isinstance(getattr(self, f.name), Composite)
            else getattr(self, f.name)
            for f in dataclasses.fields(self)
        ]

    def to_described(self) -> Any:
        """Return the proton ``Described`` value (used when nesting in another type)."""
        fields = self.to_fields()
        end = len(fields)
        while end and fields[end - 1] is None:
            end -= 1
        return codec.Described(codec.ulong(self.DESCRIPTOR), fields[:end])

    def encode(self) -> bytes:
        """Encode as AMQP bytes (descriptor and list)."""
        return codec.encode_described(self.DESCRIPTOR, self.to_fields())


_WRAP_ANY = "any"
_WRAPPERS[_WRAP_ANY] = lambda v: v  # composites are wrapped by _wrap itself


_C = TypeVar("_C", bound=Composite)


@dataclass_transform(frozen_default=True, kw_only_default=True)
def _composite(descriptor: int | None) -> Callable[[type[_C]], type[_C]]:
    """Class decorator: make ``cls`` a composite type whose fields are its annotations.

    Each field is declared once, in wire order, as ``name: KIND = None``, ``KIND`` being
    ``UInt``, ``UShort``, ``UByte``, ``ULong``, ``Symbol`` or ``Any``. A field of one of the
    first five goes into ``TYPES`` as ``uint``, ``ushort``, ``ubyte``, ``ulong`` or
    ``symbol`` (with the typed fields of the bases): its value is wrapped in that type on
    encoding and, for the integers, range-checked on decoding. Every field defaults to None
    (absent or null). The class becomes a frozen, slotted, keyword-only dataclass (the type
    checker knows: ``dataclass_transform``); with a ``descriptor`` it is that type's class,
    found by decoding (None: a base that only declares fields its subclasses share). The
    annotations are read as written (strings: this module has
    ``from __future__ import annotations``).

    Raises:
        TypeError: a field annotated with anything else.
    """

    def declare(cls: type[_C]) -> type[_C]:
        types = dict(cls.TYPES)
        for name, alias in cls.__dict__.get("__annotations__", {}).items():
            if alias != "Any":
                kind = _FIELD_KINDS.get(alias)
                if kind is None:
                    raise TypeError(f"{cls.__name__}.{name}: {alias} is not an AMQP type")
                types[name] = kind
            setattr(cls, name, None)
        cls.TYPES = types
        if descriptor is not None:
            cls.DESCRIPTOR = descriptor
        made = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        if descriptor is not None:
            _REGISTRY[descriptor] = made
        return made

    return declare


# --- composite types ---------------------------------------------------------------------


@_composite(Descriptor.ERROR)
class Error(Composite):
    """error (Part 2 §2.8.14): condition symbol, description, info map."""

    condition: Symbol = None
    description: Any = None
    info: Any = None


@_composite(None)
class _Terminus(Composite):
    """The fields a source and a target begin with, in the same order (Part 3 §3.5.3,
    §3.5.4): address, durability and expiry of the terminus, dynamic creation."""

    address: Any = None
    durable: UInt = None
    expiry_policy: Symbol = None
    timeout: UInt = None
    dynamic: Any = None
    dynamic_node_properties: Any = None


@_composite(Descriptor.SOURCE)
class Source(_Terminus):
    """source (Part 3 §3.5.3)."""

    distribution_mode: Symbol = None
    filter: Any = None
    default_outcome: Any = None
    outcomes: Any = None
    capabilities: Any = None


@_composite(Descriptor.TARGET)
class Target(_Terminus):
    """target (Part 3 §3.5.4)."""

    capabilities: Any = None


@_composite(Descriptor.RECEIVED)
class Received(Composite):
    """received delivery state (Part 3 §3.4.1)."""

    section_number: UInt = None
    section_offset: ULong = None


@_composite(Descriptor.ACCEPTED)
class Accepted(Composite):
    """accepted outcome (Part 3 §3.4.2)."""


@_composite(Descriptor.REJECTED)
class Rejected(Composite):
    """rejected outcome (Part 3 §3.4.3) carrying an ``Error``."""

    error: Any = None


@_composite(Descriptor.RELEASED)
class Released(Composite):
    """released outcome (Part 3 §3.4.4)."""


@_composite(Descriptor.MODIFIED)
class Modified(Composite):
    """modified outcome (Part 3 §3.4.5)."""

    delivery_failed: Any = None
    undeliverable_here: Any = None
    message_annotations: Any = None


# --- performatives (Part 2 §2.7) -----------------------------------------------------------


@_composite(Descriptor.OPEN)
class Open(Composite):
    """open (§2.7.1). ``max_frame_size`` in bytes, ``idle_time_out`` in milliseconds."""

    container_id: Any = None
    hostname: Any = None
    max_frame_size: UInt = None
    channel_max: UShort = None
    idle_time_out: UInt = None
    outgoing_locales: Any = None
    incoming_locales: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@_composite(Descriptor.BEGIN)
class Begin(Composite):
    """begin (§2.7.2). Windows are counted in transfer frames."""

    remote_channel: UShort = None
    next_outgoing_id: UInt = None
    incoming_window: UInt = None
    outgoing_window: UInt = None
    handle_max: UInt = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@_composite(Descriptor.ATTACH)
class Attach(Composite):
    """attach (§2.7.3). ``role`` False = sender, True = receiver (of the frame's sender)."""

    name: Any = None
    handle: UInt = None
    role: Any = None
    snd_settle_mode: UByte = None
    rcv_settle_mode: UByte = None
    source: Any = None
    target: Any = None
    unsettled: Any = None
    incomplete_unsettled: Any = None
    initial_delivery_count: UInt = None
    max_message_size: ULong = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@_composite(Descriptor.FLOW)
class Flow(Composite):
    """flow (§2.7.4)."""

    next_incoming_id: UInt = None
    incoming_window: UInt = None
    next_outgoing_id: UInt = None
    outgoing_window: UInt = None
    handle: UInt = None
    delivery_count: UInt = None
    link_credit: UInt = None
    available: UInt = None
    drain: Any = None
    echo: Any = None
    properties: Any = None


@_composite(Descriptor.TRANSFER)
class Transfer(Composite):
    """transfer (§2.7.5). On the hot path use :func:`.transfer.read_transfer` instead."""

    handle: UInt = None
    delivery_id: UInt = None
    delivery_tag: Any = None
    message_format: UInt = None
    settled: Any = None
    more: Any = None
    rcv_settle_mode: UByte = None
    state: Any = None
    resume: Any = None
    aborted: Any = None
    batchable: Any = None


@_composite(Descriptor.DISPOSITION)
class Disposition(Composite):
    """disposition (§2.7.6)."""

    role: Any = None
    first: UInt = None
    last: UInt = None
    settled: Any = None
    state: Any = None
    batchable: Any = None


@_composite(Descriptor.DETACH)
class Detach(Composite):
    """detach (§2.7.7)."""

    handle: UInt = None
    closed: Any = None
    error: Any = None


@_composite(Descriptor.END)
class End(Composite):
    """end (§2.7.8)."""

    error: Any = None


@_composite(Descriptor.CLOSE)
class Close(Composite):
    """close (§2.7.9)."""

    error: Any = None


# --- SASL frames (Part 5 §5.3.3) -------------------------------------------------------------


@_composite(Descriptor.SASL_MECHANISMS)
class SaslMechanisms(Composite):
    """sasl-mechanisms (§5.3.3.1)."""

    sasl_server_mechanisms: Any = None


@_composite(Descriptor.SASL_INIT)
class SaslInit(Composite):
    """sasl-init (§5.3.3.2). ``initial_response`` may hold credentials: never log it."""

    mechanism: Symbol = None
    initial_response: Any = None
    hostname: Any = None

    def __repr__(self) -> str:
        """Redacted representation: the initial response is never shown."""
        return f"SaslInit(mechanism={self.mechanism!r}, hostname={self.hostname!r})"


@_composite(Descriptor.SASL_CHALLENGE)
class SaslChallenge(Composite):
    """sasl-challenge (§5.3.3.3)."""

    challenge: Any = None


@_composite(Descriptor.SASL_RESPONSE)
class SaslResponse(Composite):
    """sasl-response (§5.3.3.4). May hold credentials: never log it."""

    response: Any = None

    def __repr__(self) -> str:
        """Redacted representation."""
        return "SaslResponse(<redacted>)"


@_composite(Descriptor.SASL_OUTCOME)
class SaslOutcome(Composite):
    """sasl-outcome (§5.3.3.6). ``code`` 0 = ok."""

    code: UByte = None
    additional_data: Any = None


#: The encodings of an error-less Close (list0, list8, list32 with no fields), recognised from
#: their bytes; proton's decoder gives exactly :data:`EMPTY_CLOSE` for each.
EMPTY_CLOSE_BODIES = frozenset(
    {
        bytes.fromhex("00531845"),
        bytes.fromhex("005318c00100"),
        bytes.fromhex("005318d00000000400000000"),
    }
)
EMPTY_CLOSE = Close()

PERFORMATIVES: dict[int, type[Composite]] = {
    code: cls for code, cls in _REGISTRY.items() if 0x10 <= code <= 0x18
}
SASL_FRAMES: dict[int, type[Composite]] = {
    code: cls for code, cls in _REGISTRY.items() if 0x40 <= code <= 0x44
}


def decode_performative(body: bytes | bytearray | memoryview) -> tuple[Composite, int]:
    """Decode the performative (or SASL frame body) at the start of a frame body.

    Args:
        body: the frame body (after the extended header); may continue with a payload.

    Returns:
        ``(performative, consumed)``; ``body[consumed:]`` is the payload.

    Raises:
        DecodeError: not a described list, or a descriptor that is not a performative or
            SASL frame.
    """
    code, fields, consumed = codec.decode_described(body)
    cls = PERFORMATIVES.get(code) or SASL_FRAMES.get(code)
    if cls is None:
        raise DecodeError(f"descriptor 0x{code:02x} is not a performative")
    return cls.from_fields(fields), consumed


def decode_as(body: bytes | bytearray | memoryview, cls: type[_C]) -> _C:
    """:func:`decode_performative` for a body whose descriptor says it is a ``cls`` (the
    caller looked), without the payload's offset.

    Raises:
        DecodeError: as :func:`decode_performative`, or the body is another performative.
    """
    perf, _ = decode_performative(body)
    if not isinstance(perf, cls):
        raise DecodeError(f"expected {cls.__name__}, got {type(perf).__name__}")
    return perf


def symbols(value: Any) -> tuple[str, ...]:
    """Return a capabilities-like field (a symbol, an array or list of symbols) as strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (str(value),)
    elements = getattr(value, "elements", value)
    try:
        return tuple(str(v) for v in elements if isinstance(v, str))
    except TypeError:
        return ()


def checked_replace(perf: Composite, **changes: Any) -> Composite:
    """Return ``perf`` with ``changes``, refusing values that do not survive re-encoding.

    A client frame the proxy rewrites (Open, Begin) is re-encoded by proton's codec; a value
    proton normalises would otherwise reach the router with other fields than the ones the
    proxy decided on (fuzz finding ``framing-nested-described-reencode``).

    Raises:
        DecodeError: the re-encoded performative decodes to something else.
    """
    new = dataclasses.replace(perf, **changes)
    back, _ = decode_performative(new.encode())
    if back != new:
        raise DecodeError(f"{type(perf).__name__} fields do not survive re-encoding")
    return new
