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
    """A protocol violation; ``condition`` is the symbol to close the connection with.

    A subclass names its condition in its bases: ``class X(AmqpError, condition=...)``.
    """

    condition: ClassVar[Condition] = Condition.INTERNAL_ERROR

    def __init_subclass__(cls, *, condition: Condition | None = None, **kwargs: object) -> None:
        """Give the subclass ``condition`` (without one it keeps its base's)."""
        super().__init_subclass__(**kwargs)
        if condition is not None:
            cls.condition = condition

    def __init__(self, description: str) -> None:
        """Create the error.

        Args:
            description: human-readable text sent as the Close error description.
        """
        super().__init__(description)
        self.description = description


class FramingError(AmqpError, condition=Condition.CONNECTION_FRAMING_ERROR):
    """Bad frame header, size, doff, protocol header or frame type (Part 2 §2.3)."""


class DecodeError(AmqpError, condition=Condition.DECODE_ERROR):
    """A frame body that does not decode as the AMQP type system says (Part 1)."""


class IllegalStateError(AmqpError, condition=Condition.ILLEGAL_STATE):
    """A performative that is not allowed in the current state (e.g. a second Open)."""


class NotAllowedError(AmqpError, condition=Condition.NOT_ALLOWED):
    """A frame the peer is not allowed to send (e.g. on a channel it never began)."""


class InvalidFieldError(AmqpError, condition=Condition.INVALID_FIELD):
    """A mandatory field missing or a field with an invalid value."""


class HandleInUseError(AmqpError, condition=Condition.SESSION_HANDLE_IN_USE):
    """An Attach on a handle that is already attached (Part 2 §2.7.3)."""


class UnattachedHandleError(AmqpError, condition=Condition.SESSION_UNATTACHED_HANDLE):
    """A frame referring to a handle that is not attached."""


class ResourceLimitError(AmqpError, condition=Condition.RESOURCE_LIMIT_EXCEEDED):
    """A resource the proxy cannot provide (e.g. no reserved channel left for a reply)."""


class WindowViolationError(AmqpError, condition=Condition.SESSION_WINDOW_VIOLATION):
    """A Transfer beyond the session's incoming-window the peer was given (Part 2 §2.5.6:
    the sender MUST NOT send a Transfer once the remote incoming-window is zero; proton ends
    the connection with this condition, "incoming session window exceeded")."""


class TransferLimitError(AmqpError, condition=Condition.LINK_TRANSFER_LIMIT_EXCEEDED):
    """A sender that sent (or counted) more deliveries than the link-credit it was given
    (Part 2 §2.6.7: "a sender MUST NOT send more messages" once link-credit is zero)."""
