"""Sans-IO. AMQP 1.0 performatives and composite types as frozen dataclasses.

Field names are the spec's with hyphens as underscores (Part 2 §2.7 performatives, §2.8
definitions, Part 3 §3.4 delivery states, §3.5 source/target, Part 5 §5.3.3 SASL frames).
Values keep proton's AMQP type wrappers (``uint``, ``symbol``, ...) from decoding, so a
decoded performative re-encodes to the same bytes; plain ``int``/``str`` values we set are
wrapped with the field's declared AMQP type on encoding.

Encoding and decoding go through :mod:`.codec` (proton's codec). Transfers on the hot path are
read by :mod:`.transfer` instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from . import codec
from .constants import Descriptor
from .errors import DecodeError

_WRAPPERS = {
    "uint": codec.uint,
    "ushort": codec.ushort,
    "ubyte": codec.ubyte,
    "ulong": codec.ulong,
    "symbol": codec.symbol,
}

_REGISTRY: dict[int, type[Composite]] = {}

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
    #: AMQP wire type per field, used to wrap plain Python values when encoding.
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


# --- composite types ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Composite):
    """error (Part 2 §2.8.14): condition symbol, description, info map."""

    DESCRIPTOR: ClassVar[int] = Descriptor.ERROR
    TYPES: ClassVar[dict[str, str]] = {"condition": "symbol"}
    condition: Any = None
    description: Any = None
    info: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Source(Composite):
    """source (Part 3 §3.5.3)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SOURCE
    TYPES: ClassVar[dict[str, str]] = {
        "durable": "uint",
        "expiry_policy": "symbol",
        "timeout": "uint",
        "distribution_mode": "symbol",
    }
    address: Any = None
    durable: Any = None
    expiry_policy: Any = None
    timeout: Any = None
    dynamic: Any = None
    dynamic_node_properties: Any = None
    distribution_mode: Any = None
    filter: Any = None
    default_outcome: Any = None
    outcomes: Any = None
    capabilities: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Target(Composite):
    """target (Part 3 §3.5.4)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.TARGET
    TYPES: ClassVar[dict[str, str]] = {"durable": "uint", "expiry_policy": "symbol", "timeout": "uint"}
    address: Any = None
    durable: Any = None
    expiry_policy: Any = None
    timeout: Any = None
    dynamic: Any = None
    dynamic_node_properties: Any = None
    capabilities: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Received(Composite):
    """received delivery state (Part 3 §3.4.1)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.RECEIVED
    TYPES: ClassVar[dict[str, str]] = {"section_number": "uint", "section_offset": "ulong"}
    section_number: Any = None
    section_offset: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted(Composite):
    """accepted outcome (Part 3 §3.4.2)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.ACCEPTED


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected(Composite):
    """rejected outcome (Part 3 §3.4.3) carrying an ``Error``."""

    DESCRIPTOR: ClassVar[int] = Descriptor.REJECTED
    error: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Released(Composite):
    """released outcome (Part 3 §3.4.4)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.RELEASED


@dataclass(frozen=True, slots=True, kw_only=True)
class Modified(Composite):
    """modified outcome (Part 3 §3.4.5)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.MODIFIED
    delivery_failed: Any = None
    undeliverable_here: Any = None
    message_annotations: Any = None


# --- performatives (Part 2 §2.7) -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Open(Composite):
    """open (§2.7.1). ``max_frame_size`` in bytes, ``idle_time_out`` in milliseconds."""

    DESCRIPTOR: ClassVar[int] = Descriptor.OPEN
    TYPES: ClassVar[dict[str, str]] = {
        "max_frame_size": "uint",
        "channel_max": "ushort",
        "idle_time_out": "uint",
    }
    container_id: Any = None
    hostname: Any = None
    max_frame_size: Any = None
    channel_max: Any = None
    idle_time_out: Any = None
    outgoing_locales: Any = None
    incoming_locales: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Begin(Composite):
    """begin (§2.7.2). Windows are counted in transfer frames."""

    DESCRIPTOR: ClassVar[int] = Descriptor.BEGIN
    TYPES: ClassVar[dict[str, str]] = {
        "remote_channel": "ushort",
        "next_outgoing_id": "uint",
        "incoming_window": "uint",
        "outgoing_window": "uint",
        "handle_max": "uint",
    }
    remote_channel: Any = None
    next_outgoing_id: Any = None
    incoming_window: Any = None
    outgoing_window: Any = None
    handle_max: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Attach(Composite):
    """attach (§2.7.3). ``role`` False = sender, True = receiver (of the frame's sender)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.ATTACH
    TYPES: ClassVar[dict[str, str]] = {
        "handle": "uint",
        "snd_settle_mode": "ubyte",
        "rcv_settle_mode": "ubyte",
        "initial_delivery_count": "uint",
        "max_message_size": "ulong",
    }
    name: Any = None
    handle: Any = None
    role: Any = None
    snd_settle_mode: Any = None
    rcv_settle_mode: Any = None
    source: Any = None
    target: Any = None
    unsettled: Any = None
    incomplete_unsettled: Any = None
    initial_delivery_count: Any = None
    max_message_size: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow(Composite):
    """flow (§2.7.4)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.FLOW
    TYPES: ClassVar[dict[str, str]] = {
        "next_incoming_id": "uint",
        "incoming_window": "uint",
        "next_outgoing_id": "uint",
        "outgoing_window": "uint",
        "handle": "uint",
        "delivery_count": "uint",
        "link_credit": "uint",
        "available": "uint",
    }
    next_incoming_id: Any = None
    incoming_window: Any = None
    next_outgoing_id: Any = None
    outgoing_window: Any = None
    handle: Any = None
    delivery_count: Any = None
    link_credit: Any = None
    available: Any = None
    drain: Any = None
    echo: Any = None
    properties: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer(Composite):
    """transfer (§2.7.5). On the hot path use :func:`.transfer.read_transfer` instead."""

    DESCRIPTOR: ClassVar[int] = Descriptor.TRANSFER
    TYPES: ClassVar[dict[str, str]] = {
        "handle": "uint",
        "delivery_id": "uint",
        "message_format": "uint",
        "rcv_settle_mode": "ubyte",
    }
    handle: Any = None
    delivery_id: Any = None
    delivery_tag: Any = None
    message_format: Any = None
    settled: Any = None
    more: Any = None
    rcv_settle_mode: Any = None
    state: Any = None
    resume: Any = None
    aborted: Any = None
    batchable: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Disposition(Composite):
    """disposition (§2.7.6)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.DISPOSITION
    TYPES: ClassVar[dict[str, str]] = {"first": "uint", "last": "uint"}
    role: Any = None
    first: Any = None
    last: Any = None
    settled: Any = None
    state: Any = None
    batchable: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Detach(Composite):
    """detach (§2.7.7)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.DETACH
    TYPES: ClassVar[dict[str, str]] = {"handle": "uint"}
    handle: Any = None
    closed: Any = None
    error: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class End(Composite):
    """end (§2.7.8)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.END
    error: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Close(Composite):
    """close (§2.7.9)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.CLOSE
    error: Any = None


# --- SASL frames (Part 5 §5.3.3) -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslMechanisms(Composite):
    """sasl-mechanisms (§5.3.3.1)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SASL_MECHANISMS
    sasl_server_mechanisms: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslInit(Composite):
    """sasl-init (§5.3.3.2). ``initial_response`` may hold credentials: never log it."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SASL_INIT
    TYPES: ClassVar[dict[str, str]] = {"mechanism": "symbol"}
    mechanism: Any = None
    initial_response: Any = None
    hostname: Any = None

    def __repr__(self) -> str:
        """Redacted representation: the initial response is never shown."""
        return f"SaslInit(mechanism={self.mechanism!r}, hostname={self.hostname!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslChallenge(Composite):
    """sasl-challenge (§5.3.3.3)."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SASL_CHALLENGE
    challenge: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslResponse(Composite):
    """sasl-response (§5.3.3.4). May hold credentials: never log it."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SASL_RESPONSE
    response: Any = None

    def __repr__(self) -> str:
        """Redacted representation."""
        return "SaslResponse(<redacted>)"


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslOutcome(Composite):
    """sasl-outcome (§5.3.3.6). ``code`` 0 = ok."""

    DESCRIPTOR: ClassVar[int] = Descriptor.SASL_OUTCOME
    TYPES: ClassVar[dict[str, str]] = {"code": "ubyte"}
    code: Any = None
    additional_data: Any = None


for _cls in (
    Error, Source, Target, Received, Accepted, Rejected, Released, Modified, Open, Begin,
    Attach, Flow, Transfer, Disposition, Detach, End, Close, SaslMechanisms, SaslInit,
    SaslChallenge, SaslResponse, SaslOutcome,
):
    _REGISTRY[_cls.DESCRIPTOR] = _cls
del _cls

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
