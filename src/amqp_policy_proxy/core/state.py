"""Sans-IO. Connection phases and per-session/per-link records of one proxied connection.

Rule (h11 ``_state.py`` style): the phases a connection can be in live here, with the order
they advance in; the handlers in :mod:`.connection` move between them.

    AWAIT_HEADER -> SASL -> AWAIT_AMQP_HEADER -> AWAIT_OPEN -> OPENED -> CLOSING -> CLOSED
                                   \\-> (no SASL) -----------/        \\-> DENIED -/

A client that sends the AMQP header first skips SASL (user ``anonymous``, as in QDR).
``DENIED``: the proxy sent Open+Close and waits for the client's Close (or a linger timeout).
``UNAVAILABLE``: no upstream accepted; the proxy plays a minimal SASL/AMQP server to hand the
client ``amqp:connection:forced``.
"""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    """Where the connection is in its life."""

    AWAIT_HEADER = "await_header"  #: nothing received from the client yet
    SASL = "sasl"  #: relaying the SASL exchange
    AWAIT_AMQP_HEADER = "await_amqp_header"  #: SASL done, waiting for the client's AMQP header
    AWAIT_OPEN = "await_open"  #: AMQP header seen, the client's Open is intercepted
    OPENED = "opened"  #: admitted; frames relayed under the group's limits
    DENIED = "denied"  #: Open+Close sent to the client, waiting for its Close
    UNAVAILABLE = "unavailable"  #: no upstream; minimal local handshake to send a Close
    CLOSING = "closing"  #: Close exchange in progress
    CLOSED = "closed"  #: both transports closed; counts released


class LinkRecord:
    """A link the client attached and the proxy forwarded (client handle numbering)."""

    __slots__ = (
        "name",
        "handle",
        "is_sender",
        "address",
        "broker_handle",
        "client_detached",
        "broker_detached",
        "anonymous",
        "inspect",
        "delivery_bytes",
        "delivery_id",
        "delivery_tag",
        "delivery_settled",
        "in_delivery",
        "discarding",
        "discard_reason",
        "qos",
        "topic_filter",
        "strip_durable",
        "rewrite_durable",
    )

    def __init__(self, name: str, handle: int, is_sender: bool, address: str | None) -> None:
        """Record a link.

        Args:
            name: the link name from the client's Attach.
            handle: the client's handle for the link.
            is_sender: True when the client sends messages on it (role sender).
            address: target address (sender) or source address (receiver), None if absent.
        """
        self.name = name
        self.handle = handle
        self.is_sender = is_sender
        self.address = address
        self.broker_handle: int | None = None
        self.client_detached = False
        self.broker_detached = False
        self.anonymous = is_sender and not address
        self.inspect = False
        """The first frame of each delivery goes through the per-message checks (user-id,
        relay ``to``, router annotations, topic publish of ``to``)."""
        self.delivery_bytes = 0
        self.delivery_id: int | None = None
        self.delivery_tag: bytes | None = None
        self.delivery_settled = False
        self.in_delivery = False
        self.discarding = False
        self.discard_reason: str | None = None
        # topic authorization (docs/decisions/0004-topic-delivery-filtering.md)
        self.qos = 1
        """QoS the link's settle modes map to (ARCHITECTURE 4.6), for relay publish checks."""
        self.topic_filter = False
        """Receiver with a wildcard subscription under ``nearestAcl``: check every delivery."""
        self.strip_durable = False
        """Receiver whose principal lacks the persistent authority: durable delivered as false."""
        self.rewrite_durable = False
        """The router-to-client delivery in progress gets its ``durable`` flag cleared."""


class ReservedPool:
    """Numbers kept back from the router for the proxy's synthesized denial replies.

    The proxy lowers the channel-max (Open) and handle-max (Begin) it forwards, so the top
    ``count`` numbers are the proxy's to answer denied sessions and links on. :meth:`take`
    hands them out from the top down and reuses the ones given back first (last in, first
    out): the order of ``list(range(high - count + 1, high + 1))`` popped from its end, in
    three slots instead of a list of ``count`` ints (which cost about 2 KiB per session for
    64 handles near 2**32).
    """

    __slots__ = ("low", "next", "returned")

    def __init__(self, high: int, count: int) -> None:
        """Reserve ``high - count + 1 .. high`` (none when ``count`` is 0).

        Args:
            high: the highest number (the peer's channel-max or handle-max).
            count: how many numbers to reserve (>= 0).
        """
        self.low = high - count + 1
        self.next = high
        self.returned: list[int] | None = None

    def take(self) -> int | None:
        """Return a free reserved number, or None when all are in use."""
        if self.returned:
            return self.returned.pop()
        n = self.next
        if n < self.low:
            return None
        self.next = n - 1
        return n

    def give_back(self, number: int) -> None:
        """Make ``number`` (from :meth:`take`) free again; it is the next one taken."""
        if self.returned is None:
            self.returned = []
        self.returned.append(number)


class SessionRecord:
    """A session the client began and the proxy forwarded (client channel numbering)."""

    __slots__ = (
        "channel",
        "broker_channel",
        "handle_max",
        "links",
        "broker_links",
        "denied_handles",
        "reserved_handles",
        "pending_replies",
        "dropped_transfers",
        "client_ended",
        "broker_ended",
        "senders",
        "receivers",
    )

    def __init__(self, channel: int, reserved_handles: ReservedPool) -> None:
        """Record a session.

        Args:
            channel: the client's channel.
            reserved_handles: handles the router was told it cannot use, for denials.
        """
        self.channel = channel
        self.broker_channel: int | None = None
        self.handle_max: int | None = None
        self.links: dict[int, LinkRecord] = {}
        self.broker_links: dict[int, LinkRecord] = {}
        self.denied_handles: dict[int, int] = {}
        self.reserved_handles = reserved_handles
        self.pending_replies: list[bytes] = []
        self.dropped_transfers = 0
        self.client_ended = False
        self.broker_ended = False
        self.senders = 0
        self.receivers = 0
