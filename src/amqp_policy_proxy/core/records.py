"""Sans-IO. The records a connection keeps: its sessions and links, the numbers it keeps back
for denials, and its figures.

Plain slotted objects (tens of thousands of connections: no ``__dict__``); the logic that
changes them is in :mod:`.sessions` (Begin, Attach, Detach, End, Flow) and :mod:`.deliveries`
(Transfers).
"""

from __future__ import annotations

from typing import Any


class ReservedPool:
    """Numbers kept back from the router for the proxy's synthesized denial replies.

    The proxy lowers the channel-max (Open) and handle-max (Begin) it forwards, so the top
    ``count`` numbers are the proxy's to answer denied sessions and links on. :meth:`take`
    hands them out from the top down and reuses the ones given back first (last in, first out):
    the order of ``list(range(high - count + 1, high + 1))`` popped from its end, in three slots
    instead of a list of ``count`` ints (about 2 KiB per session for 64 handles near 2**32).
    """

    __slots__ = ("low", "next", "returned")

    def __init__(self, high: int, count: int) -> None:
        """Reserve ``high - count + 1 .. high`` (none when ``count`` is 0)."""
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


class LinkRecord:
    """A link the client attached and the proxy forwarded (client handle numbering)."""

    __slots__ = (
        "name", "handle", "is_sender", "address", "router_handle", "client_detached",
        "router_detached", "anonymous", "inspect", "delivery_bytes", "delivery_id",
        "delivery_tag", "delivery_settled", "in_delivery", "discarding", "discard_reason",
        "qos", "topic_filter", "strip_durable", "rewrite_durable", "shaper", "withheld",
        "initial_count", "router_flow", "node", "by_subject", "revoked", "client_answered",
        "dynamic", "fast", "renewal",
    )

    def __init__(self, name: str, handle: int, is_sender: bool, address: str | None) -> None:
        """Record a link: its name, the client's handle, its role and terminus address."""
        self.name = name
        self.handle = handle
        self.is_sender = is_sender
        """The client sends messages on it (role sender)."""
        self.address = address
        """Target address (sender) or source address (receiver); None when absent."""
        self.router_handle: int | None = None
        self.client_detached = False
        self.router_detached = False
        self.dynamic = False
        """A receiver whose source the router creates (``dynamic``: allowDynamicSource)."""
        self.revoked = False
        """The proxy detached it on the client's behalf (a reload's policy no longer allows
        it): the router got a Detach, the client gets one when the router answers."""
        self.client_answered = False
        """A revoked link's client sent its Detach (its own, or the answer to the proxy's)."""
        self.anonymous = is_sender and not address
        self.node: Any = None
        """The terminus address as the upstream resolves it (a
        :class:`~amqp_policy_proxy.policy.naming.Node`; None: no address or dynamic)."""
        self.by_subject = False
        """The upstream routes each message of this sender by its ``subject`` (RabbitMQ
        ``/exchange/X/``, ``/queue``): every delivery's head is checked in Python."""
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
        self.qos = 1
        """QoS the link's settle modes map to, for relay publish checks (topic models)."""
        self.topic_filter = False
        """Receiver with a wildcard subscription under ``nearestAcl``: check every delivery."""
        self.strip_durable = False
        """Receiver whose principal lacks the persistent authority: durable delivered as false."""
        self.rewrite_durable = False
        """The router-to-client delivery in progress gets its ``durable`` flag cleared."""
        self.shaper: Any = None
        """A sending link under the user's message or byte rate: its
        :class:`.shaping.ShapedLink` (the Transfers leave the fast path and are charged);
        typed ``Any`` here so that the records, which shaping reads, import nothing of it."""
        self.withheld = 0
        """Client deliveries on this sender link the router never saw (decision 0002): the
        router's ``delivery-count`` is this much behind the client's (mod 2**32)."""
        self.initial_count = 0
        """The client's initial-delivery-count (sender Attach)."""
        self.router_flow: tuple[int, int, bool] | None = None
        """The router's last link state for this sender link: ``(delivery-count, link-credit,
        drain)`` from its latest Flow (recorded on sessions that may withhold deliveries)."""
        self.fast = 0
        """May the client fast path take its Transfers (:mod:`.eligibility`: ``NOT_FAST``
        until computed at attach)."""
        self.renewal = False
        """One of RabbitMQ's own ``/management`` pair on a token connection
        (:func:`.proxylinks.reads_broker_renewals`): a sender's requests are read for token
        renewals (``inspect`` is set too), a receiver's deliveries for the broker's answers
        (``Sessions.reads_replies``)."""

    def carry(self, delivery: tuple[int, int | None, bool] | None) -> None:
        """Take the delivery in progress as the relay scanner left it
        (:data:`..amqp.accel.Delivery`: payload bytes so far, delivery-id, settled; None
        between deliveries): the state the general Transfer handler
        (:meth:`.deliveries.Deliveries.client_transfer`) would have reached over the frames it
        passed."""
        if delivery is None:
            self.in_delivery = False
        else:
            self.in_delivery = True
            self.delivery_bytes, self.delivery_id, self.delivery_settled = delivery
            self.discarding = False
            self.discard_reason = None


class SessionRecord:
    """A session the client began and the proxy forwarded (client channel numbering)."""

    __slots__ = (
        "channel", "router_channel", "handle_max", "links", "router_links", "denied_handles",
        "reserved_handles", "pending_replies", "dropped_transfers", "client_ended",
        "router_ended", "senders", "receivers", "transfers_in", "transfers_out",
        "client_next_out", "client_window_end", "router_next_out", "router_window_end",
        "router_out_window", "shaping", "numbering", "tracks_router", "revoked_handles",
        "fast", "proxy_links", "inserted", "inserted_transfers", "had_receivers",
    )

    def __init__(self, channel: int, reserved_handles: ReservedPool,
                 client_next_out: int) -> None:
        """Record a session on the client's ``channel``."""
        self.channel = channel
        self.router_channel: int | None = None
        self.handle_max: int | None = None
        self.links: dict[int, LinkRecord] = {}
        self.router_links: dict[int, LinkRecord] = {}
        self.denied_handles: dict[int, int] = {}
        self.revoked_handles: set[int] = set()
        """Client handles of revoked links not forgotten yet (their Flows lose the handle,
        their Transfers are dropped)."""
        self.reserved_handles = reserved_handles
        self.pending_replies: list[bytes] = []
        self.dropped_transfers = 0
        """Client Transfer frames never forwarded (withheld deliveries, denied handles)."""
        self.client_ended = False
        self.router_ended = False
        self.senders = 0
        self.receivers = 0
        # session flow control under maxSessionWindow (Part 2 §2.5.6), in transfer frames
        # Transfer ids are kept as unbounded ints from the Begin's next-outgoing-id (the wire
        # carries them modulo 2**32).
        self.transfers_in = 0
        """Transfer frames received from the client on this session (forwarded or not)."""
        self.transfers_out = 0
        """Transfer frames sent to the client on this session."""
        self.client_next_out = client_next_out
        """The client's next-outgoing-id at its Begin."""
        self.client_window_end = 0
        """The first transfer-id (client numbering) the client's window does not cover."""
        self.router_next_out = 0
        """The router's next-outgoing-id at its Begin."""
        self.router_window_end = 0
        """The first transfer-id (router numbering) the router's own window does not cover."""
        self.router_out_window = 0
        """The router's last outgoing-window."""
        self.shaping: Any = None
        """Set on connections under a message or byte rate: the session's
        :class:`.shaping.ShapedSession` (both legs' Flows on this session are read)."""
        self.numbering: Any = None
        """The client's and the router's delivery-ids once a delivery was withheld: a
        :class:`.numbering.DeliveryNumbering`; None while they are the same."""
        self.fast = True
        """May the client fast path take its Transfers (:mod:`.eligibility`: not once a
        delivery was withheld and the session renumbers)."""
        self.proxy_links: dict[int, ProxyLink] | None = None
        """Client handle -> the links the proxy answers itself (token renewal, ``$cbs`` and
        ``/management``: :mod:`.proxylinks`); the router never sees them."""
        self.inserted: Any = None
        """Once a proxy link that sends to the client is attached: the
        :class:`.numbering.InsertedNumbering` of the router's delivery-ids toward the client
        (the proxy's own replies take ids of that direction)."""
        self.inserted_transfers = 0
        """Transfer frames the proxy sent the client on this session itself (router Flows'
        next-outgoing-id and client Flows' next-incoming-id are renumbered by it)."""
        self.had_receivers = False
        """The client attached a receiver link to the router on this session (the router may
        have sent deliveries whose ids the proxy did not read)."""
        self.tracks_router = False
        """A sender link where a delivery may be withheld is attached: the router's flow state
        (windows, link credit, next-outgoing-id and Transfers since) is kept from its Flows,
        so that the proxy can give back the credit of a withheld delivery."""


class ProxyLink:
    """A link the client attached to a node the proxy answers itself (:mod:`.proxylinks`):
    the router never sees it; its Attach and Detach are answered on a reserved handle."""

    __slots__ = ("name", "handle", "reply_handle", "is_sender", "node", "address",
                 "credit", "delivery_count", "payload", "in_delivery", "delivery_id",
                 "delivery_settled", "pending", "settle_first", "gone")

    def __init__(self, name: Any, handle: int, reply_handle: int, is_sender: bool, node: str,
                 address: str | None) -> None:
        """A proxy link: the client's ``handle``, the proxy's ``reply_handle``, the client's
        role (``is_sender``: it sends requests), the ``node`` (``$cbs``, ``/management``)
        and the client's own terminus address (a receiver's target: the reply-to)."""
        self.name = name
        self.handle = handle
        self.reply_handle = reply_handle
        self.is_sender = is_sender
        self.node = node
        self.address = address
        self.credit = 0
        """Receiver links: deliveries the client lets the proxy send."""
        self.delivery_count = 0
        """Receiver links: the proxy's delivery-count (Part 2 §2.6.7)."""
        self.payload = bytearray()
        """Sender links: the request being received (its frames' payloads joined)."""
        self.in_delivery = False
        self.delivery_id: int | None = None
        self.delivery_settled = False
        self.pending: list[bytes] = []
        """Receiver links: replies waiting for credit (message bytes)."""
        self.settle_first = True
        """Receiver links: the proxy's replies are sent settled (the client did not ask for
        ``snd-settle-mode`` unsettled)."""
        self.gone = False
        """The client detached it."""


class Figures:
    """Counters of one connection (for the event log's ``connection_closed`` and metrics)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "transfers_in",
        "transfers_out",
        "active_sessions",
        "active_senders",
        "active_receivers",
        "peak_sessions",
        "peak_senders",
        "peak_receivers",
    )

    def __init__(self) -> None:
        """All zero."""
        self.bytes_in = 0
        """Bytes received from the client (client to router), frames included."""
        self.bytes_out = 0
        """Bytes received from the router (router to client)."""
        self.transfers_in = 0
        """Transfer frames received from the client."""
        self.transfers_out = 0
        """Transfer frames received from the router."""
        self.active_sessions = 0
        self.active_senders = 0
        """Client sender links attached now."""
        self.active_receivers = 0
        self.peak_sessions = 0
        self.peak_senders = 0
        self.peak_receivers = 0
