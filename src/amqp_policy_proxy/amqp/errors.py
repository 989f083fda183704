"""Sans-IO. Protocol violations as exceptions, one class per AMQP error condition.

Raised inside frame handlers and caught only at the ``ProxyConnection`` boundary, which turns
them into a Close for that one connection (aioquic/h3 ``ProtocolError.error_code`` style).
``amqp/`` knows nothing of proxy sides; the core records which side committed the violation.
Policy outcomes are never exceptions.
"""

from __future__ import annotations

from typing import ClassVar

from .constants import Condition


class AmqpError(Exception):
    """A protocol violation; ``condition`` is the symbol to close the connection with."""

    condition: ClassVar[Condition] = Condition.INTERNAL_ERROR

    def __init__(self, description: str) -> None:
        """Create the error.

        Args:
            description: human-readable text sent as the Close error description.
        """
        super().__init__(description)
        self.description = description


class FramingError(AmqpError):
    """Bad frame header, size, doff, protocol header or frame type (Part 2 §2.3)."""

    condition = Condition.CONNECTION_FRAMING_ERROR


class DecodeError(AmqpError):
    """A frame body that does not decode as the AMQP type system says (Part 1)."""

    condition = Condition.DECODE_ERROR


class IllegalStateError(AmqpError):
    """A performative that is not allowed in the current state (e.g. a second Open)."""

    condition = Condition.ILLEGAL_STATE


class NotAllowedError(AmqpError):
    """A frame the peer is not allowed to send (e.g. on a channel it never began)."""

    condition = Condition.NOT_ALLOWED


class InvalidFieldError(AmqpError):
    """A mandatory field missing or a field with an invalid value."""

    condition = Condition.INVALID_FIELD


class HandleInUseError(AmqpError):
    """An Attach on a handle that is already attached (Part 2 §2.7.3)."""

    condition = Condition.SESSION_HANDLE_IN_USE


class UnattachedHandleError(AmqpError):
    """A frame referring to a handle that is not attached."""

    condition = Condition.SESSION_UNATTACHED_HANDLE


class ResourceLimitError(AmqpError):
    """A resource the proxy cannot provide (e.g. no reserved channel left for a reply)."""

    condition = Condition.RESOURCE_LIMIT_EXCEEDED


class TransferLimitError(AmqpError):
    """A sender that sent (or counted) more deliveries than the link-credit it was given
    (Part 2 §2.6.7: "a sender MUST NOT send more messages" once link-credit is zero)."""

    condition = Condition.LINK_TRANSFER_LIMIT_EXCEEDED
