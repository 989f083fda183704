"""Sans-IO. AMQP 1.0 wire constants: protocol headers, frame types, descriptors, conditions.

References: OASIS AMQP 1.0 Part 2 (transport) §2.2 (version negotiation), §2.3 (framing),
§2.7 (performatives), §2.8.15-16 (error conditions); Part 5 §5.3 (SASL).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

#: Protocol header for AMQP (protocol id 0), version 1.0.0. Part 2 §2.2.
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
#: Protocol header for TLS (protocol id 2). Part 5 §5.2.
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
#: Protocol header for SASL (protocol id 3). Part 5 §5.3.
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
PROTOCOL_HEADER_SIZE = 8

#: "Prior to any explicit negotiation, the maximum frame size is 512 (MIN-MAX-FRAME-SIZE)".
MIN_MAX_FRAME_SIZE = 512
#: Frame header: 4-byte SIZE, 1-byte DOFF, 1-byte TYPE, 2 type-specific bytes (the channel).
FRAME_HEADER_SIZE = 8
#: DOFF counts 4-byte words: the frame body starts at ``DOFF * DOFF_UNIT`` (Part 2 §2.3.1).
DOFF_UNIT = 4
#: The first byte of every protocol header ("A" of "AMQP"); a frame's size never starts with it
#: below the header's value read as a size (0x41000000 bytes).
PROTOCOL_HEADER_FIRST_BYTE = 0x41
#: A described value starts with this constructor; a performative's descriptor is then most
#: often a ``smallulong`` (format code 0x53) holding the code (Part 1 §1.2, §1.6.9).
DESCRIBED = 0x00
SMALLULONG = 0x53
#: The largest ``ushort`` and ``uint`` (Part 1 §1.6.5, §1.6.7); sequence numbers (transfer-ids,
#: delivery-ids, delivery-counts) wrap at ``UINT_MAX + 1`` (Part 2 §2.7.2, RFC 1982).
USHORT_MAX = 0xFFFF
UINT_MAX = 0xFFFFFFFF
#: channel-max when the Open leaves it out (Part 2 §2.7.1: "65535").
DEFAULT_CHANNEL_MAX = USHORT_MAX


class FrameType(IntEnum):
    """Frame TYPE byte (Part 2 §2.3.1; SASL frames Part 5 §5.3.1)."""

    AMQP = 0x00
    SASL = 0x01


class Descriptor(IntEnum):
    """Numeric descriptors (domain 0x00000000) of performatives and the types we decode."""

    OPEN = 0x10
    BEGIN = 0x11
    ATTACH = 0x12
    FLOW = 0x13
    TRANSFER = 0x14
    DISPOSITION = 0x15
    DETACH = 0x16
    END = 0x17
    CLOSE = 0x18
    ERROR = 0x1D
    RECEIVED = 0x23
    ACCEPTED = 0x24
    REJECTED = 0x25
    RELEASED = 0x26
    MODIFIED = 0x27
    SOURCE = 0x28
    TARGET = 0x29
    DELETE_ON_CLOSE = 0x2B
    DELETE_ON_NO_LINKS = 0x2C
    DELETE_ON_NO_MESSAGES = 0x2D
    DELETE_ON_NO_LINKS_OR_MESSAGES = 0x2E
    SASL_MECHANISMS = 0x40
    SASL_INIT = 0x41
    SASL_CHALLENGE = 0x42
    SASL_RESPONSE = 0x43
    SASL_OUTCOME = 0x44
    # Message sections (Part 3 §3.2).
    HEADER = 0x70
    DELIVERY_ANNOTATIONS = 0x71
    MESSAGE_ANNOTATIONS = 0x72
    PROPERTIES = 0x73
    APPLICATION_PROPERTIES = 0x74
    DATA = 0x75
    AMQP_SEQUENCE = 0x76
    AMQP_VALUE = 0x77
    FOOTER = 0x78


# The descriptors the per-frame loops compare codes with, as plain module names: looking a
# member up on its Enum class costs ~70 ns on CPython 3.11 (a module name ~15), and the relay
# loops do it several times per frame.
OPEN_CODE = Descriptor.OPEN
FLOW_CODE = Descriptor.FLOW
TRANSFER_CODE = Descriptor.TRANSFER
DISPOSITION_CODE = Descriptor.DISPOSITION
CLOSE_CODE = Descriptor.CLOSE
AMQP_FRAME = FrameType.AMQP
SASL_FRAME = FrameType.SASL


#: Symbolic descriptors, as a peer may send them instead of the numeric code.
SYMBOLIC_DESCRIPTORS: dict[str, int] = {
    "amqp:open:list": Descriptor.OPEN,
    "amqp:begin:list": Descriptor.BEGIN,
    "amqp:attach:list": Descriptor.ATTACH,
    "amqp:flow:list": Descriptor.FLOW,
    "amqp:transfer:list": Descriptor.TRANSFER,
    "amqp:disposition:list": Descriptor.DISPOSITION,
    "amqp:detach:list": Descriptor.DETACH,
    "amqp:end:list": Descriptor.END,
    "amqp:close:list": Descriptor.CLOSE,
    "amqp:error:list": Descriptor.ERROR,
    "amqp:received:list": Descriptor.RECEIVED,
    "amqp:accepted:list": Descriptor.ACCEPTED,
    "amqp:rejected:list": Descriptor.REJECTED,
    "amqp:released:list": Descriptor.RELEASED,
    "amqp:modified:list": Descriptor.MODIFIED,
    "amqp:source:list": Descriptor.SOURCE,
    "amqp:target:list": Descriptor.TARGET,
    "amqp:sasl-mechanisms:list": Descriptor.SASL_MECHANISMS,
    "amqp:sasl-init:list": Descriptor.SASL_INIT,
    "amqp:sasl-challenge:list": Descriptor.SASL_CHALLENGE,
    "amqp:sasl-response:list": Descriptor.SASL_RESPONSE,
    "amqp:sasl-outcome:list": Descriptor.SASL_OUTCOME,
}


class Role:
    """Link role as carried in Attach/Disposition (Part 2 §2.8.1): a boolean."""

    SENDER = False
    RECEIVER = True


class SaslCode(IntEnum):
    """sasl-outcome codes (Part 5 §5.3.3.6)."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


#: sasl-outcome code -> its name in the spec (``auth``, ``sys``, ``sys-perm``, ``sys-temp``):
#: the ``reason`` of a failed authentication (``amqp_proxy_sasl_failures_total``).
SASL_OUTCOMES: dict[int, str] = {1: "auth", 2: "sys", 3: "sys-perm", 4: "sys-temp"}


class Condition(StrEnum):
    """Error condition symbols (Part 2 §2.8.15 amqp-error, §2.8.16-18) and the ones QDR uses."""

    INTERNAL_ERROR = "amqp:internal-error"
    NOT_FOUND = "amqp:not-found"
    UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
    DECODE_ERROR = "amqp:decode-error"
    RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
    NOT_ALLOWED = "amqp:not-allowed"
    INVALID_FIELD = "amqp:invalid-field"
    NOT_IMPLEMENTED = "amqp:not-implemented"
    RESOURCE_LOCKED = "amqp:resource-locked"
    PRECONDITION_FAILED = "amqp:precondition-failed"
    RESOURCE_DELETED = "amqp:resource-deleted"
    ILLEGAL_STATE = "amqp:illegal-state"
    FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
    CONNECTION_FORCED = "amqp:connection:forced"
    CONNECTION_FRAMING_ERROR = "amqp:connection:framing-error"
    CONNECTION_REDIRECT = "amqp:connection:redirect"
    SESSION_WINDOW_VIOLATION = "amqp:session:window-violation"
    SESSION_ERRANT_LINK = "amqp:session:errant-link"
    SESSION_HANDLE_IN_USE = "amqp:session:handle-in-use"
    SESSION_UNATTACHED_HANDLE = "amqp:session:unattached-handle"
    LINK_DETACH_FORCED = "amqp:link:detach-forced"
    LINK_TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
    LINK_MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
    LINK_REDIRECT = "amqp:link:redirect"
    LINK_STOLEN = "amqp:link:stolen"


# The descriptions qdrouterd 1.19 puts in its denials, reproduced exactly: the three "disallowed"
# ones from src/policy.c, the target and user-id rejections and the size limit from
# src/router_node.c, the protocol-header one from proton's transport (a client that does not
# speak AMQP). ``PROXY_SHUTTING_DOWN`` is the proxy's own (drain).
CONNECTION_DISALLOWED = "connection disallowed by local policy"
SESSION_DISALLOWED = "session disallowed by local policy"
LINK_DISALLOWED = "link disallowed by local policy"
TARGET_VIOLATION = "policy violation on target"
USER_ID_VIOLATION = "user_id proxy violation"
MESSAGE_SIZE_EXCEEDED = "Message size exceeded"
UNKNOWN_PROTOCOL = "Unknown protocol detected"
PROXY_SHUTTING_DOWN = "proxy shutting down"
