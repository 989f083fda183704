"""Sans-IO. The sections of one whole AMQP message (Part 3 §3.2), read and written for the
renewal requests the proxy answers itself.

:func:`decode_message` reads a message's bytes (the payload of its Transfers, joined) with the
project's codec (:mod:`amqp_policy_proxy.amqp.codec`, proton's) into :class:`Message`: the
properties the request/response patterns use, the application-properties map, the body.
Sections must come in the spec's order and only once each (data and amqp-sequence sections may
repeat); anything else is a :class:`MessageError`. :func:`encode_message` writes a reply.

AMQP ``int`` values (CBS's ``status-code``) are written as :class:`Int32`: the codec maps a
Python ``int`` to ``long``, and the CBS clients read the status as an ``int``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ..amqp import codec
from ..amqp.errors import DecodeError

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, PROPERTIES = 0x70, 0x71, 0x72, 0x73
APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER = 0x74, 0x75, 0x76, 0x77, 0x78
_SYMBOLS = {
    "amqp:header:list": HEADER, "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS, "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES, "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE, "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
_BODY = (DATA, AMQP_SEQUENCE, AMQP_VALUE)
#: The largest message read (a renewal request is a token and a few properties).
MAX_MESSAGE_BYTES = 256 * 1024

BodyKind = Literal["value", "data", "sequence"]


class MessageError(ValueError):
    """The bytes are not one well-formed message of the shape a request needs."""


class Int32(int):
    """An ``int`` value to be written as AMQP ``int`` (32-bit signed, code 0x71)."""


@dataclass(frozen=True, slots=True)
class Properties:
    """The properties section fields the request/response patterns use (Part 3 §3.2.4)."""

    message_id: Any = None
    """``message-id``: a ulong, uuid, binary or string (None: absent)."""
    to: str | None = None
    """``to`` (the HTTP-over-AMQP request target)."""
    subject: str | None = None
    """``subject`` (the HTTP method of a request, the status code of a response)."""
    reply_to: str | None = None
    """``reply-to``."""
    correlation_id: Any = None
    """``correlation-id`` (a response's: the request's message-id)."""


@dataclass(frozen=True, slots=True)
class Message:
    """What a request's sections hold."""

    properties: Properties | None = None
    """None when the message has no properties section."""
    application_properties: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}))
    """String keys to their values."""
    body: Any = None
    """The amqp-value's value; the data sections' bytes, joined; the sequences' items;
    None without a body."""
    body_kind: BodyKind | None = None
    """Which body the message has."""


def is_message_id(value: Any) -> bool:
    """Whether ``value`` is of a type a message-id may have (ulong, uuid, binary, string)."""
    if isinstance(value, codec.symbol):
        return False
    return isinstance(value, codec.ulong | uuid.UUID | bytes | str)


def decode_message(payload: bytes | bytearray | memoryview, *,
                   max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Read a whole message's sections.

    Args:
        payload: the message's bytes (its Transfers' payloads joined).
        max_bytes: the largest message read.

    Returns:
        Its properties, application-properties and body.

    Raises:
        MessageError: larger than ``max_bytes``; a value the codec cannot read; a section
            that is not a described value with a section descriptor, out of order, repeated,
            or of the wrong kind (properties not a list, application-properties not a map
            with string keys, data not binary, two body kinds); properties fields of the
            wrong type.
    """
    data = bytes(payload)
    if len(data) > max_bytes:
        raise MessageError(f"message of {len(data)} bytes, more than the {max_bytes} read")
    pos = 0
    last = -1
    props: Properties | None = None
    app: Mapping[str, Any] = MappingProxyType({})
    body: Any = None
    kind: BodyKind | None = None
    while pos < len(data):
        try:
            value, used = codec.decode_value(data[pos:])
        except DecodeError as exc:
            raise MessageError(str(exc)) from None
        pos += used
        code = _section_code(value)
        if code < last or (code == last and code not in (DATA, AMQP_SEQUENCE)):
            raise MessageError("message sections out of order or repeated")
        if code in _BODY and last in _BODY and code != last:
            raise MessageError("a message has one kind of body")
        last = code
        content = value.value
        if code == PROPERTIES:
            props = _properties(content)
        elif code == APPLICATION_PROPERTIES:
            app = _application_properties(content)
        elif code == DATA:
            if not isinstance(content, bytes):
                raise MessageError("a data section is not binary")
            body = (body or b"") + content
            kind = "data"
        elif code == AMQP_SEQUENCE:
            if not isinstance(content, list):
                raise MessageError("an amqp-sequence section is not a list")
            body = [*(body or []), *content]
            kind = "sequence"
        elif code == AMQP_VALUE:
            body = content
            kind = "value"
    return Message(props, app, body, kind)


def _section_code(value: Any) -> int:
    if not isinstance(value, codec.Described):
        raise MessageError("a message section is not a described value")
    descriptor = value.descriptor
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        code = int(descriptor)
    elif isinstance(descriptor, str):
        code = _SYMBOLS.get(descriptor, -1)
    else:
        code = -1
    if not HEADER <= code <= FOOTER:
        raise MessageError("not a message section descriptor")
    return code


def _properties(content: Any) -> Properties:
    if content is None:
        content = []
    if not isinstance(content, list) or len(content) > 13:
        raise MessageError("the properties section is not a list of at most 13 fields")
    fields = [*content[:6], *[None] * (6 - min(len(content), 6))]
    message_id, _user_id, to, subject, reply_to, correlation_id = fields
    for name, text in (("to", to), ("subject", subject), ("reply-to", reply_to)):
        if text is not None and (not isinstance(text, str) or isinstance(text, codec.symbol)):
            raise MessageError(f"properties {name} is not a string")
    for name, mid in (("message-id", message_id), ("correlation-id", correlation_id)):
        if mid is not None and not is_message_id(mid):
            raise MessageError(f"properties {name} is not a ulong, uuid, binary or string")
    return Properties(message_id, to, subject, reply_to, correlation_id)


def _application_properties(content: Any) -> Mapping[str, Any]:
    if content is None:
        return MappingProxyType({})
    if not isinstance(content, dict) or not all(isinstance(k, str) for k in content):
        raise MessageError("application-properties is not a map with string keys")
    return MappingProxyType({str(k): v for k, v in content.items()})


# ---------------------------------------------------------------------------- writing


def encode_message(properties: Properties | None = None,
                   application_properties: Sequence[tuple[str, Any]] = (), *,
                   body: Any = None, body_kind: BodyKind | None = None) -> bytes:
    """Write a message: properties, application-properties, then the body.

    Args:
        properties: the properties section (None: none); the message-id and correlation-id
            keep their AMQP types (a decoded ulong stays a ulong, bytes are binary).
        application_properties: ``(key, value)`` pairs in order; a value is written by the
            codec's mapping (str a string, int a long), an :class:`Int32` as an AMQP int.
        body: the body (with ``body_kind``).
        body_kind: ``"value"`` (an amqp-value section of ``body``), ``"data"`` (one data
            section of ``body``'s bytes) or None (no body section).

    Returns:
        The message's bytes.

    Raises:
        MessageError: a value the codec cannot write.
    """
    out = bytearray()
    try:
        if properties is not None:
            fields = [properties.message_id, None, properties.to, properties.subject,
                      properties.reply_to, properties.correlation_id]
            while fields and fields[-1] is None:
                fields.pop()
            out += codec.encode_value(codec.Described(codec.ulong(PROPERTIES), fields))
        if application_properties:
            out += b"\x00\x53" + bytes([APPLICATION_PROPERTIES])
            out += _map(application_properties)
        if body_kind == "value":
            out += codec.encode_value(codec.Described(codec.ulong(AMQP_VALUE), body))
        elif body_kind == "data":
            out += codec.encode_value(codec.Described(codec.ulong(DATA), bytes(body)))
    except DecodeError as exc:
        raise MessageError(str(exc)) from None
    return bytes(out)


def _value(value: Any) -> bytes:
    if isinstance(value, Int32):
        return b"\x71" + struct.pack(">i", int(value))
    return codec.encode_value(value)


def _map(pairs: Sequence[tuple[str, Any]]) -> bytes:
    """An AMQP map of ``pairs`` (map8 when it fits, else map32)."""
    items = b"".join(codec.encode_value(k) + _value(v) for k, v in pairs)
    count = 2 * len(pairs)
    if len(items) + 1 <= 0xFF and count <= 0xFF:
        return bytes([0xC1, len(items) + 1, count]) + items
    return b"\xd1" + struct.pack(">II", len(items) + 4, count) + items
