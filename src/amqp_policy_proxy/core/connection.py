"""Sans-IO. ``ProxyConnection``: one proxied AMQP 1.0 connection, bytes and ``now`` in, commands out.

The shell (``daemon/relay.py``) feeds it the bytes each transport delivers and executes the
returned commands in order. Nothing here touches sockets or clocks.

What it does (ARCHITECTURE section 1 and decisions 1-6):

- relays the SASL exchange and takes the user from the client's sasl-init, trusting it only
  once the router's sasl-outcome is ``ok``;
- intercepts the client's Open and holds everything the client pipelines behind it until the
  admission decision; a denied connection gets QDR's Open+Close and the router receives
  nothing of its Open;
- after admission, forwards frames as their original bytes, decoding only what policy needs
  (Open, Begin, Attach, Detach, End, Close, and Flow when rewriting), rewrites the router's
  Open/Begin/Flow toward the client, and synthesizes QDR's session, link and message denials;
- turns every protocol violation into a Close of this one connection.

Protocol violations raise :class:`~amqp_policy_proxy.amqp.errors.AmqpError` inside the
handlers and are caught only in :meth:`ProxyConnection.receive_data`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from struct import Struct
from typing import Any

from ..amqp import accel
from ..amqp import constants as C
from ..amqp.canonical import check_performative
from ..amqp.constants import Condition, Descriptor, FrameType, SaslCode
from ..amqp.errors import (
    AmqpError,
    DecodeError,
    FramingError,
    HandleInUseError,
    IllegalStateError,
    NotAllowedError,
    ResourceLimitError,
    UnattachedHandleError,
)
from ..amqp.framing import encode_frame
from ..amqp.handshake import (
    OpenHead,
    is_sasl_mechanisms,
    patch_open,
    read_open_head,
    read_sasl_init,
    sasl_outcome_code,
)
from ..amqp.message import cleared_durable_byte, durable_flag_offset, read_message_head
from ..amqp.performatives import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    Rejected,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
    decode_performative,
)
from ..amqp.sasl import ANONYMOUS_USER, identity_from_sasl_init
from ..amqp.transfer import (
    delivery_tag_at,
    is_transfer_descriptor,
    read_transfer_fields,
)
from ..policy import decisions
from ..policy.lookup import lookup_vhost
from .commands import CloseTransport, Command, ConnectBroker, Emit, SendData, Side
from .events import (
    ConnectionApproved,
    ConnectionClosed,
    ConnectionDenied,
    ConnectionDenyReason,
    LinkDenied,
    LinkDenyReason,
    MessageDenied,
    MessageDenyReason,
    ProtocolViolation,
    ProxyEvent,
    SessionDenied,
)
from .state import LinkRecord, Phase, ReservedPool, SessionRecord

logger = logging.getLogger(__name__)

_HDR = Struct(">IBBH")
_U32 = Struct(">I")
_UINT_MAX = 0xFFFFFFFF
#: Largest frame accepted from the client before the proxy has advertised a max-frame-size
#: (the spec says 512 for SASL frames and an Open; we are lenient but bounded).
PRE_OPEN_FRAME_LIMIT = 65536
#: Cap on the broker-side frame size we buffer (the router honours the client's value).
BROKER_FRAME_LIMIT = 64 * 1024 * 1024
#: Channels kept back from the router (top of the client's channel-max) for Begin+End replies.
RESERVED_CHANNELS = 8
#: Handles kept back from the router (top of the client's handle-max) for Attach+Detach replies.
RESERVED_HANDLES = 64
#: Seconds to wait for the client's Close after a denial or shutdown Close before closing.
LINGER_SECONDS = 2.0
#: Seconds a client of an unreachable upstream has to read its answer before it is closed.
UNAVAILABLE_LINGER_SECONDS = 10.0
#: How much of the router's SASL greeting reached the client (``_sasl_relayed``).
_SASL_HEADER_RELAYED = 1
_SASL_MECHANISMS_RELAYED = 2
_SASL_OUTCOME_RELAYED = 3
UPSTREAM_UNAVAILABLE = "no upstream available"
UPSTREAM_LOST = "upstream connection lost"

#: Phases in which admitted frames are relayed (decoded as policy needs).
_RELAYING = (Phase.OPENED, Phase.CLOSING)
_TRANSFER = Descriptor.TRANSFER
_CLOSE = Descriptor.CLOSE
_OPEN = Descriptor.OPEN
#: The encodings of an error-less Close (list0, list8, list32 with no fields). Such a frame
#: is recognised from its bytes; proton's decoder gives exactly ``Close()`` for each.
_EMPTY_CLOSE_BODIES = frozenset({
    bytes.fromhex("00531845"), bytes.fromhex("005318c00100"),
    bytes.fromhex("005318d00000000400000000"),
})
_FLOW = Descriptor.FLOW
_DISPOSITION = Descriptor.DISPOSITION
#: The C scanner of runs of plain Transfers (``amqp.accel``), or None: every frame in Python.
_scan_transfers = accel.scan


_EMPTY_CLOSE = Close()


def _frame(channel: int, perf: Any, payload: bytes = b"", ftype: int = FrameType.AMQP) -> bytes:
    return encode_frame(channel, perf.encode() + payload, ftype)


def _error(condition: str, description: str) -> Error:
    return Error(condition=condition, description=description)


def _address(terminus: Any) -> str | None:
    address = getattr(terminus, "address", None)
    if address is None:
        return None
    return str(address)


class ProxyConnection:
    """One client connection and its upstream leg, as a sans-IO state machine.

    Inputs: :meth:`receive_data`, :meth:`broker_connected`, :meth:`broker_connect_failed`,
    :meth:`connection_lost`, :meth:`handle_timer`, :meth:`begin_shutdown`. Each returns the
    list of commands to execute in order. :meth:`get_timer` says when to call
    :meth:`handle_timer` next (loop-clock seconds) or None.
    """

    #: Every attribute, so instances carry no __dict__: about 1 KiB less per connection
    #: (bench/bench_memory.py).
    __slots__ = (
        "conn_id", "remote_host", "listener", "policy", "ledger", "container_id",
        "tls_subject", "wall_offset", "accepted_at", "phase", "user", "vhost", "group",
        "governed", "admitted", "opened_at", "close_reason", "_handshake_deadline",
        "_linger_deadline", "_cbuf", "_bbuf", "_client_mode", "_broker_mode",
        "_broker_up", "_broker_failed", "_broker_closed", "_client_closed",
        "_to_broker_pending", "_sasl_user", "_sasl_ok", "_used_sasl", "_held_client",
        "_run_buf", "_run_start", "_run_end", "_held_broker", "_client_open",
        "_client_open_body", "_broker_open_seen", "_open_sent_to_client",
        "_amqp_header_sent_to_client", "_close_sent_client", "_close_sent_broker",
        "_close_received_client", "_close_received_broker", "_finished",
        "_client_frame_limit", "_broker_frame_limit", "_advertised_channel_max",
        "_policy_channel_max", "_window_frames", "_client_channel_max",
        "_reserved_channels", "_sessions", "_broker_sessions", "_denied_sessions",
        "_max_message_size", "_check_user_id", "_user_id_bytes", "_relay_allowed",
        "_topics", "_principal", "_qos_of", "_topic_receivers", "bytes_in", "bytes_out",
        "transfers_in", "transfers_out", "active_sessions", "active_senders",
        "active_receivers", "peak_sessions", "peak_senders", "peak_receivers",
        "_sasl_init_seen", "_sasl_relayed",
    )

    def __init__(
        self,
        conn_id: str,
        *,
        remote_host: str,
        listener: str,
        policy: Any,
        ledger: Any,
        now: float,
        handshake_timeout: float = 10.0,
        container_id: str = "amqp-policy-proxy",
        tls_subject: str | None = None,
        wall_offset: float = 0.0,
    ) -> None:
        """Create the state machine for a freshly accepted client transport.

        Args:
            conn_id: unique id for logs and events.
            remote_host: the client's IP address, already normalised (ingress.peer).
            listener: the listener's ``HOST:PORT``.
            policy: the :class:`~amqp_policy_proxy.policy.model.Policy` snapshot current at
                accept time; the connection keeps it for its whole life (decision 7).
            ledger: the :class:`~amqp_policy_proxy.limits.connections.ConnectionLedger`.
                The global (TCP accept) count is the shell's; this object admits and
                releases the vhost/user/host counts.
            now: loop-clock seconds at accept.
            handshake_timeout: seconds from accept to the Open decision.
            container_id: container-id of Opens the proxy synthesizes.
            tls_subject: RFC 4514 subject of the client's verified TLS certificate (listeners
                with ``require_client_cert``), else None; DDS permission grants match it.
            wall_offset: POSIX seconds minus loop-clock seconds, for checks against wall-clock
                dates (DDS grant validity). The core never reads a clock itself.
        """
        self.conn_id = conn_id
        self.remote_host = remote_host
        self.listener = listener
        self.policy = policy
        self.ledger = ledger
        self.container_id = container_id
        self.tls_subject = tls_subject
        self.wall_offset = wall_offset
        self.accepted_at = now
        self.phase = Phase.AWAIT_HEADER
        self.user: str | None = None
        self.vhost: Any = None
        self.group: Any = None
        self.governed = False
        self.admitted = False
        self.opened_at: float | None = None
        self.close_reason: str | None = None

        self._handshake_deadline: float | None = now + handshake_timeout
        self._linger_deadline: float | None = None
        self._cbuf = bytearray()
        self._bbuf = bytearray()
        self._client_mode = "header"  # header | sasl | amqp | closed
        self._broker_mode = "header"
        self._broker_up = False
        self._broker_failed = False
        self._broker_closed = False
        self._client_closed = False
        self._to_broker_pending: list[bytes] = []
        self._sasl_user: str | None = None
        self._sasl_ok = False
        self._used_sasl = False
        self._sasl_init_seen = False  # the client's sasl-init arrived (answered or not)
        self._sasl_relayed = 0  # _SASL_HEADER_RELAYED, _SASL_MECHANISMS_RELAYED
        self._held_client = bytearray()  # client frames after its Open, before the decision
        self._run_buf: Any = b""  # the buffer of the run being accumulated (see _flush_run)
        self._run_start = -1
        self._run_end = 0
        self._held_broker: list[bytes] = []  # broker AMQP frames before the decision
        self._client_open: Open | None = None
        #: The client's Open frame body while its admission is being decided.
        self._client_open_body: bytes | None = None
        self._broker_open_seen = False
        self._open_sent_to_client = False
        self._amqp_header_sent_to_client = False
        # AMQP Close sent to / received from each side (four flags, not two dicts: memory).
        self._close_sent_client = self._close_sent_broker = False
        self._close_received_client = self._close_received_broker = False
        self._finished = False

        # negotiated/advertised limits
        self._client_frame_limit = PRE_OPEN_FRAME_LIMIT
        self._broker_frame_limit = PRE_OPEN_FRAME_LIMIT
        self._advertised_channel_max = 0xFFFF
        self._policy_channel_max: int | None = None
        self._window_frames: int | None = None
        self._client_channel_max = 0xFFFF
        self._reserved_channels = ReservedPool(0, 0)  # set at the client's Open
        self._sessions: dict[int, SessionRecord] = {}
        self._broker_sessions: dict[int, SessionRecord] = {}
        self._denied_sessions: dict[int, int] = {}
        self._max_message_size: int | None = None
        self._check_user_id = False
        self._user_id_bytes = b""  # the authenticated user, as a message user-id must be
        self._relay_allowed: str | None = None  # the last relay 'to' the address rules allowed
        self._topics: Any = None  # the group's TopicAuthorizer, if any (ARCHITECTURE 4.6)
        self._principal: Any = None  # policy.topics.Principal of this connection
        self._qos_of: Any = None
        self._topic_receivers = False  # some receiver link needs per-delivery topic handling

        # figures for the event log
        self.bytes_in = 0
        self.bytes_out = 0
        self.transfers_in = 0
        self.transfers_out = 0
        self.active_sessions = 0
        self.active_senders = 0
        self.active_receivers = 0
        self.peak_sessions = 0
        self.peak_senders = 0
        self.peak_receivers = 0

    # ------------------------------------------------------------------ public inputs

    def receive_data(self, side: Side, data: bytes, now: float) -> list[Command]:
        """Feed bytes received from ``side``.

        Args:
            side: which transport delivered them.
            data: the bytes (any split; frames may span calls).
            now: loop-clock seconds.

        Returns:
            Commands to execute in order.
        """
        out: list[Command] = []
        if self._finished or not data:
            return out
        try:
            if side is Side.CLIENT:
                self.bytes_in += len(data)
                if self._client_mode != "closed":
                    self._client_data(data, now, out)
            else:
                self.bytes_out += len(data)
                if self._broker_mode != "closed":
                    self._broker_data(data, now, out)
        except AmqpError as exc:
            self._violation(side, exc, now, out)
        return out

    def broker_connected(self, now: float) -> list[Command]:
        """The upstream transport is up: flush what the client sent meanwhile."""
        out: list[Command] = []
        self._broker_up = True
        if self._finished:
            out.append(CloseTransport(Side.BROKER))
            return out
        if self._to_broker_pending:
            out.append(SendData(Side.BROKER, b"".join(self._to_broker_pending)))
            self._to_broker_pending.clear()
        return out

    def broker_connect_failed(self, now: float) -> list[Command]:
        """No upstream accepted the connection (after trying each in turn).

        Nobody can authenticate the client, so nobody is admitted (decision 0001): a client
        still in SASL gets the router's SASL header and mechanisms if they were relayed, else
        the proxy's own (ANONYMOUS and PLAIN, so that any client can go on to read the
        outcome), then the sasl-outcome ``sys-temp`` (Part 5 §5.3.3.6, code 4) once its
        sasl-init is there, never ``ok``; a client that skipped SASL gets Open + Close
        ``amqp:connection:forced`` / ``no upstream available``. No Open goes through
        admission, no policy denial is counted: the connection is counted (and logged once)
        as ``upstream_unavailable``.
        """
        out: list[Command] = []
        self._broker_failed = True
        self._broker_mode = "closed"
        self._to_broker_pending.clear()
        if self._finished:
            return out
        self.close_reason = self.close_reason or "upstream_unavailable"
        self.phase = Phase.UNAVAILABLE
        self._handshake_deadline = None
        self._linger_deadline = now + UNAVAILABLE_LINGER_SECONDS
        logger.info("[%s] no upstream available for client %s", self.conn_id, self.remote_host)
        self._emit(ConnectionDenied(
            **self._ctx(now), reason=ConnectionDenyReason.UPSTREAM_UNAVAILABLE,
            condition=str(Condition.CONNECTION_FORCED), description=UPSTREAM_UNAVAILABLE,
        ), out)
        if self._used_sasl and not self._sasl_ok:
            # SASL not over (the client may have pipelined its AMQP header and Open already)
            data = b""
            if self._sasl_relayed < _SASL_HEADER_RELAYED:
                data += C.SASL_HEADER
            if self._sasl_relayed < _SASL_MECHANISMS_RELAYED:
                data += _frame(
                    0,
                    SaslMechanisms(sasl_server_mechanisms=_symbol_array(["ANONYMOUS", "PLAIN"])),
                    ftype=FrameType.SASL,
                )
            if self._sasl_init_seen:
                # the client's sasl-init came before the connect failed: answer it now
                data += self._sasl_outcome_frame(SaslCode.SYS_TEMP)
                self._client_mode = "closed"
                out.append(SendData(Side.CLIENT, data))
                out.append(CloseTransport(Side.CLIENT))
                return out
            if data:
                out.append(SendData(Side.CLIENT, data))
        elif self._client_mode == "amqp":
            self._send_unavailable_close(out)
        return out

    def connection_lost(self, side: Side, now: float) -> list[Command]:
        """``side``'s transport closed (by the peer, by us, or by an error).

        When the client's transport is gone the connection is finished: counts are released
        exactly once and :class:`ConnectionClosed` is emitted (if it was admitted).
        """
        out: list[Command] = []
        if side is Side.BROKER:
            self._broker_closed = True
            self._broker_mode = "closed"
            if self._finished:
                return out
            if self.phase is Phase.UNAVAILABLE or self._broker_failed:
                return out
            if (self._used_sasl and not self._sasl_ok and self._client_mode != "closed"
                    and self._sasl_relayed < _SASL_OUTCOME_RELAYED):
                # the router went away before it authenticated the client: nobody can now
                return self.broker_connect_failed(now)
            if self.close_reason is None:
                self.close_reason = "broker_close"
            if not self._client_closed:
                if self._open_sent_to_client and not self._close_sent_client:
                    if not self._close_received_broker:
                        self._send_close(
                            Side.CLIENT, _error(Condition.CONNECTION_FORCED, UPSTREAM_LOST), out
                        )
                    out.append(CloseTransport(Side.CLIENT))
                elif self._client_mode == "amqp" and not self._open_sent_to_client:
                    self._send_open_close(
                        _error(Condition.CONNECTION_FORCED, UPSTREAM_LOST), out
                    )
                    out.append(CloseTransport(Side.CLIENT))
                else:
                    out.append(CloseTransport(Side.CLIENT))
            return out
        # client side gone
        self._client_closed = True
        self._client_mode = "closed"
        if self.close_reason is None:
            self.close_reason = "client_close"
        if not self._broker_closed and (self._broker_up or not self._broker_failed):
            out.append(CloseTransport(Side.BROKER))
        self._finish(now, out)
        return out

    def handle_timer(self, now: float) -> list[Command]:
        """Handle the deadline returned by :meth:`get_timer` (handshake timeout, linger)."""
        out: list[Command] = []
        if self._finished:
            return out
        if self._handshake_deadline is not None and now >= self._handshake_deadline:
            self._handshake_deadline = None
            self.close_reason = "timeout"
            self._emit(
                ConnectionDenied(
                    **self._ctx(now),
                    reason=ConnectionDenyReason.HANDSHAKE_TIMEOUT,
                    condition="",
                    description="handshake timeout",
                ),
                out,
            )
            out.append(CloseTransport(Side.BROKER))
            out.append(CloseTransport(Side.CLIENT))
            self._client_mode = "closed"
            self._broker_mode = "closed"
        if self._linger_deadline is not None and now >= self._linger_deadline:
            self._linger_deadline = None
            out.append(CloseTransport(Side.CLIENT))
            out.append(CloseTransport(Side.BROKER))
        return out

    @property
    def broker_backlog(self) -> int:
        """Bytes queued for the router while its connection is being made (the shell stops
        reading the client when this grows, so a slow upstream cannot make it unbounded)."""
        return sum(map(len, self._to_broker_pending))

    @property
    def held_bytes(self) -> int:
        """Bytes this connection holds in its own buffers: a partial frame from either side,
        frames pipelined behind the Open or waiting for the upstream connection (the shell
        sums them over the connections not yet admitted, against a memory budget)."""
        return (len(self._cbuf) + len(self._bbuf) + len(self._held_client)
                + sum(map(len, self._held_broker)) + self.broker_backlog)

    def get_timer(self) -> float | None:
        """Return the next deadline (loop-clock seconds), or None."""
        handshake, linger = self._handshake_deadline, self._linger_deadline
        if handshake is None:
            return linger  # the steady state: both None, asked after every read
        return handshake if linger is None else min(handshake, linger)

    def begin_shutdown(self, now: float, grace: float | None = None) -> list[Command]:
        """Start a graceful drain: Close(``amqp:connection:forced``, ``proxy shutting down``).

        Admitted connections get the Close; frames the client sends until its answering Close
        (dispositions settling deliveries, typically) are still relayed, then the router gets
        a Close and both transports close. A client that does not answer within ``grace``
        seconds (default :data:`LINGER_SECONDS`) is closed. Connections not admitted yet are
        closed at once.
        """
        out: list[Command] = []
        if self._finished:
            return out
        self.close_reason = self.close_reason or "shutdown"
        if self.phase is Phase.OPENED and self._open_sent_to_client:
            if not self._close_sent_client:
                self._send_close(
                    Side.CLIENT, _error(Condition.CONNECTION_FORCED, C.PROXY_SHUTTING_DOWN), out
                )
            self.phase = Phase.CLOSING
            self._linger_deadline = now + (LINGER_SECONDS if grace is None else grace)
        elif self.phase is Phase.CLOSING:
            pass  # a Close exchange is already under way
        else:
            out.append(CloseTransport(Side.BROKER))
            out.append(CloseTransport(Side.CLIENT))
        return out

    def close_received_from(self, side: Side) -> bool:
        """True once ``side`` has sent its AMQP Close."""
        return self._close_received_client if side is Side.CLIENT else \
            self._close_received_broker

    def admitted_or_open(self) -> bool:
        """True once the Open decision let the connection through (frames are relayed)."""
        return self.opened_at is not None

    @property
    def finished(self) -> bool:
        """True once the connection is over and its counts are released."""
        return self._finished

    # ------------------------------------------------------------------ helpers

    def _ctx(self, now: float) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "at": now,
            "vhost": getattr(self.vhost, "hostname", None),
            "group": getattr(self.group, "name", None),
            "user": self.user,
            "remote_host": self.remote_host,
            "listener": self.listener,
        }

    def _emit(self, event: ProxyEvent, out: list[Command]) -> None:
        out.append(Emit(event))

    def _send(self, side: Side, data: bytes, out: list[Command]) -> None:
        if self._run_start >= 0:
            self._flush_run(out)  # earlier frames of the client's run go first
        if side is Side.BROKER:
            if self._broker_failed or self._broker_closed:
                return
            if not self._broker_up:
                self._to_broker_pending.append(bytes(data))
                return
        elif self._client_closed:
            return
        out.append(SendData(side, data))

    def _send_close(self, side: Side, error: Error | None, out: list[Command]) -> None:
        if side is Side.CLIENT:
            self._close_sent_client = True
        else:
            self._close_sent_broker = True
        self._send(side, _frame(0, Close(error=error)), out)

    def _send_open_close(self, error: Error, out: list[Command]) -> None:
        """QDR's denial on the wire: an Open (listener defaults) immediately followed by Close."""
        self._open_sent_to_client = True
        self._close_sent_client = True
        data = _frame(0, Open(container_id=self.container_id)) + _frame(0, Close(error=error))
        if not self._amqp_header_sent_to_client:
            # the client is waiting for the AMQP protocol header (the router's may not have
            # arrived yet, and will not be relayed now)
            self._amqp_header_sent_to_client = True
            self._broker_mode = "closed"
            data = C.AMQP_HEADER + data
        self._send(Side.CLIENT, data, out)

    def _send_unavailable_close(self, out: list[Command]) -> None:
        self._send_open_close(_error(Condition.CONNECTION_FORCED, UPSTREAM_UNAVAILABLE), out)
        self._client_mode = "amqp"

    def _violation(self, side: Side, exc: AmqpError, now: float, out: list[Command]) -> None:
        """Close this connection because ``side`` broke the protocol."""
        condition = str(exc.condition)
        description = exc.description
        logger.info("[%s] %s protocol error %s: %s", self.conn_id, side, condition, description)
        self._emit(
            ProtocolViolation(**self._ctx(now), side=str(side), condition=condition,
                              description=description),
            out,
        )
        if self.close_reason is None:
            self.close_reason = "protocol_error"
        err = _error(condition, description)
        if side is Side.CLIENT:
            if self._client_mode == "amqp" and not self._close_sent_client:
                if self._open_sent_to_client:
                    self._send_close(Side.CLIENT, err, out)
                else:
                    self._send_open_close(err, out)
            if self.admitted and not self._close_sent_broker:
                self._send_close(Side.BROKER, _error(Condition.CONNECTION_FORCED, "client error"),
                                 out)
        else:
            if self._open_sent_to_client and not self._close_sent_client:
                self._send_close(
                    Side.CLIENT, _error(Condition.CONNECTION_FORCED, "upstream protocol error"),
                    out,
                )
            if self._broker_mode == "amqp" and not self._close_sent_broker:
                self._send_close(Side.BROKER, err, out)
        self._client_mode = "closed"
        self._broker_mode = "closed"
        self._handshake_deadline = None
        # Nothing more is read from either side: drop what was buffered (the receive path
        # appended the whole chunk before the violation was found). New objects rather than
        # clear(): a memoryview into the old buffer may still be alive in the traceback.
        self._cbuf = bytearray()
        self._bbuf = bytearray()
        self._held_client = bytearray()
        self._held_broker = []
        out.append(CloseTransport(Side.BROKER))
        out.append(CloseTransport(Side.CLIENT))

    def _finish(self, now: float, out: list[Command]) -> None:
        if self._finished:
            return
        self._finished = True
        self.phase = Phase.CLOSED
        self._handshake_deadline = None
        self._linger_deadline = None
        if self.admitted:
            self.ledger.release(self.conn_id)
            opened = self.opened_at if self.opened_at is not None else now
            self._emit(
                ConnectionClosed(
                    **self._ctx(now),
                    opened_at=opened,
                    duration_seconds=max(0.0, now - opened),
                    bytes_in=self.bytes_in,
                    bytes_out=self.bytes_out,
                    transfers_in=self.transfers_in,
                    transfers_out=self.transfers_out,
                    max_sessions=self.peak_sessions,
                    max_senders=self.peak_senders,
                    max_receivers=self.peak_receivers,
                    close_reason=self.close_reason or "client_close",
                ),
                out,
            )

    # ------------------------------------------------------------------ client bytes

    def _client_data(self, data: bytes, now: float, out: list[Command]) -> None:
        buf = self._cbuf
        start = 0
        if buf:
            # A unit straddled the previous read. When it is a frame of known size, complete
            # it with just the bytes it lacks and read the rest of the new bytes in place:
            # each byte is then copied once (into the run sent on), not appended to the
            # buffer and copied out again. Otherwise buffer everything, as before.
            size = self._pending_frame_size(buf, self._client_mode, self._client_frame_limit)
            start = size - len(buf)
            if 0 < start < len(data):
                buf += memoryview(data)[:start]
            else:
                start = len(data)
                buf += data
            pos = self._client_process(buf, 0, len(buf), now, out)
            del buf[:pos]
            if start == len(data):
                return
            if buf:  # not consumed (the connection closed meanwhile): keep the bytes
                buf += memoryview(data)[start:]
                return
        pos = self._client_process(data, start, len(data), now, out)
        if pos < len(data):
            self._cbuf += memoryview(data)[pos:]

    @staticmethod
    def _pending_frame_size(buf: bytearray, mode: str, limit: int) -> int:
        """Size of the AMQP/SASL frame whose first bytes are buffered, or 0 if not known yet
        or not plainly valid (then the general path reads it, and raises what is wrong)."""
        if len(buf) < 8 or mode not in ("amqp", "sasl") or buf[0] == 0x41:
            return 0
        size = _U32.unpack_from(buf, 0)[0]
        return size if 8 <= size <= limit else 0

    def _client_process(self, buf: Any, start: int, end: int, now: float,
                        out: list[Command]) -> int:
        """Consume whole units (protocol headers, frames) from ``buf[start:end]``; return the
        offset reached.

        Admitted frames forwarded unchanged accumulate into one run of original bytes that
        is written as a single ``SendData`` (flushed before anything else is sent, so the
        order on the wire is kept).
        """
        saved = (self._run_buf, self._run_start, self._run_end)
        self._run_buf, self._run_start, self._run_end = buf, -1, 0
        try:
            return self._client_frames(buf, start, end, now, out)
        finally:
            self._flush_run(out)
            self._run_buf, self._run_start, self._run_end = saved

    def _flush_run(self, out: list[Command]) -> None:
        start = self._run_start
        if start < 0:
            return
        self._run_start = -1
        buf = self._run_buf
        end = self._run_end
        self._send(Side.BROKER, _run_data(buf, start, end), out)

    def _client_frames(self, buf: Any, pos: int, end: int, now: float, out: list[Command]) -> int:
        while pos < end and self._client_mode != "closed":
            mode = self._client_mode
            if mode == "amqp" and self.phase is Phase.OPENED:
                # The admitted steady state. It returns at a partial frame, at a frame it
                # leaves to the general code below, or once the phase has changed; the code
                # below then handles that one unit (or waits for more bytes).
                pos = self._client_relay(buf, pos, end, now, out)
                if pos >= end or self._client_mode == "closed":
                    break
                mode = self._client_mode
            if mode == "header":
                if end - pos < 8:
                    if bytes(buf[pos:end]) != C.AMQP_HEADER[: end - pos][: end - pos] and not (
                        C.SASL_HEADER.startswith(bytes(buf[pos:end]))
                        or C.TLS_HEADER.startswith(bytes(buf[pos:end]))
                    ):
                        self._bad_header(out, now)
                        return end
                    return pos
                self._client_header(bytes(buf[pos : pos + 8]), now, out)
                pos += 8
                continue
            if end - pos < 8:
                return pos
            if buf[pos] == 0x41 and bytes(buf[pos : pos + 4]) == b"AMQP":
                # a protocol header where a frame would be: only the AMQP header after SASL
                self._client_header(bytes(buf[pos : pos + 8]), now, out)
                pos += 8
                continue
            size, doff, ftype, channel = _HDR.unpack_from(buf, pos)
            limit = self._client_frame_limit
            if size < 8 or size > limit or doff < 2 or doff * 4 > size or ftype > 1:
                if size > limit and size >= 8:
                    raise FramingError(
                        f"malformed frame: size {size} above max-frame-size {limit}"
                    )
                raise FramingError("malformed frame")
            if end - pos < size:
                return pos
            fend = pos + size
            if mode == "sasl":
                self._client_sasl_frame(buf, pos, doff, ftype, fend, now, out)
            elif self.phase is Phase.OPENED or (
                self.phase is Phase.CLOSING and not self._close_received_client
                and self.admitted_or_open()
            ):
                if self._client_amqp_frame(buf, pos, doff, ftype, channel, fend, now, out):
                    if self._run_start < 0:
                        self._run_start = pos
                    self._run_end = fend
            else:
                self._client_preopen_frame(buf, pos, doff, ftype, channel, fend, now, out)
            pos = fend
        return pos

    def _bad_header(self, out: list[Command], now: float) -> None:
        # QDR answers garbage with an AMQP 1.0 header, Open and Close framing-error.
        self._emit(
            ProtocolViolation(**self._ctx(now), side=str(Side.CLIENT),
                              condition=str(Condition.CONNECTION_FRAMING_ERROR),
                              description=C.UNKNOWN_PROTOCOL),
            out,
        )
        self.close_reason = "protocol_error"
        self._handshake_deadline = None
        self._send_open_close(_error(Condition.CONNECTION_FRAMING_ERROR, C.UNKNOWN_PROTOCOL), out)
        self._client_mode = "closed"
        out.append(CloseTransport(Side.BROKER))
        out.append(CloseTransport(Side.CLIENT))

    def _client_header(self, header: bytes, now: float, out: list[Command]) -> None:
        mode = self._client_mode
        if mode == "header":
            if header == C.SASL_HEADER:
                self._used_sasl = True
                self._client_mode = "sasl"
                self.phase = Phase.SASL
                out.append(ConnectBroker())
                self._send(Side.BROKER, header, out)
                return
            if header == C.AMQP_HEADER:
                self._client_mode = "amqp"
                self.phase = Phase.AWAIT_OPEN
                self._sasl_user = ANONYMOUS_USER
                self._sasl_ok = True
                out.append(ConnectBroker())
                self._send(Side.BROKER, header, out)
                return
            self._bad_header(out, now)
            return
        if mode == "sasl" and header == C.AMQP_HEADER:
            self._client_mode = "amqp"
            self.phase = Phase.AWAIT_OPEN
            if self.phase is Phase.UNAVAILABLE or self._broker_failed:
                self._send_unavailable_close(out)
                return
            self._send(Side.BROKER, header, out)
            return
        raise FramingError(f"unexpected protocol header {header!r}")

    def _client_sasl_frame(
        self, buf: Any, pos: int, doff: int, ftype: int, fend: int, now: float,
        out: list[Command],
    ) -> None:
        """A client SASL frame (Part 5 §5.3): the sasl-init or a sasl-response.

        The sasl-init names the identity the router will authenticate (:mod:`..amqp.sasl`);
        a client asking for another authorization identity is refused with the outcome
        ``auth`` and its sasl-init never reaches the router. Both frames are accepted only in
        canonical form (:mod:`..amqp.canonical`), so the router reads the same credentials
        the proxy read. With no upstream reachable, the sasl-init is answered ``sys-temp``.
        """
        if ftype != FrameType.SASL:
            raise FramingError("AMQP frame during SASL negotiation")
        body = pos + doff * 4
        if body == fend:
            raise FramingError("empty frame during SASL negotiation")
        init = read_sasl_init(buf, body, fend)  # plain encodings, no decode
        if init is None:
            code, _, _ = check_performative(buf, body, fend)
            if code == Descriptor.SASL_INIT:
                perf, _ = decode_performative(memoryview(buf)[body:fend])
                init = (str(perf.mechanism or ""), perf.initial_response)
            elif code != Descriptor.SASL_RESPONSE:
                raise IllegalStateError(f"client sent {Descriptor(code).name} during SASL")
        if init is not None:
            if self._sasl_user is not None or self._sasl_init_seen:
                raise IllegalStateError("second sasl-init")
            self._sasl_init_seen = True
            identity = identity_from_sasl_init(*init, tls_identity=self.tls_subject)
            if identity.impersonates:
                self._refuse_impersonation(identity.user, identity.authzid, now, out)
                return
            self._sasl_user = identity.user
            if self._broker_failed:
                self._client_mode = "closed"
                out.append(SendData(Side.CLIENT, self._sasl_outcome_frame(SaslCode.SYS_TEMP)))
                out.append(CloseTransport(Side.CLIENT))
                return
        self._send(Side.BROKER, bytes(buf[pos:fend]), out)

    @staticmethod
    def _sasl_outcome_frame(code: SaslCode) -> bytes:
        """A sasl-outcome frame with ``code`` (Part 5 §5.3.3.6)."""
        return _frame(0, SaslOutcome(code=int(code)), ftype=FrameType.SASL)

    def _refuse_impersonation(self, user: str | None, authzid: str | None, now: float,
                              out: list[Command]) -> None:
        """Answer a sasl-init that asks to act as ``authzid`` while authenticating as ``user``.

        The router (proton with Cyrus) would authenticate ``user`` and accept any authzid, so
        the proxy refuses the exchange itself: the sasl-outcome ``auth`` (code 1) goes to the
        client, the sasl-init never reaches the router, and both transports close. Counted as
        a connection denied for ``authzid``.
        """
        self.user = user
        self.close_reason = "denied"
        self._handshake_deadline = None
        logger.info("[%s] DENY SASL for user '%s', rhost '%s': authorization identity '%s' "
                    "differs from the authenticated identity", self.conn_id, user,
                    self.remote_host, authzid)
        self._emit(ConnectionDenied(**self._ctx(now), reason=ConnectionDenyReason.AUTHZID,
                                    condition="", description="sasl-outcome auth"), out)
        self._client_mode = "closed"
        self._broker_mode = "closed"
        self._to_broker_pending.clear()
        out.append(SendData(Side.CLIENT, self._sasl_outcome_frame(SaslCode.AUTH)))
        out.append(CloseTransport(Side.BROKER))
        out.append(CloseTransport(Side.CLIENT))

    def _client_preopen_frame(
        self, buf: Any, pos: int, doff: int, ftype: int, channel: int, fend: int, now: float,
        out: list[Command],
    ) -> None:
        if ftype != FrameType.AMQP:
            raise FramingError("SASL frame after SASL negotiation")
        if self.phase in (Phase.DENIED, Phase.UNAVAILABLE, Phase.CLOSING):
            self._client_after_close_frame(buf, pos, doff, fend, now, out)
            return
        if self._client_open is not None:
            # pipelined behind the Open: held until the decision
            self._held_client += buf[pos:fend]
            if len(self._held_client) > 4 * 1024 * 1024:
                raise ResourceLimitError("too much data pipelined before the Open decision")
            return
        body = pos + doff * 4
        if body == fend:
            return  # heartbeat before Open: nothing to relay yet
        raw = bytes(buf[body:fend])
        # the fields admission needs, read from the plain encoding without a decode
        perf: Open | OpenHead | None = read_open_head(raw)
        if perf is None:
            check_performative(raw, 0, len(raw))
            perf, _ = decode_performative(raw)
            if not isinstance(perf, Open):
                raise IllegalStateError(f"expected Open, got {type(perf).__name__}")
        if channel != 0:
            raise FramingError("Open on a channel other than 0")
        self._client_open = perf
        self._client_open_body = raw
        try:
            self._decide_open(perf, now, out)
        finally:
            self._client_open_body = None

    def _client_after_close_frame(
        self, buf: Any, pos: int, doff: int, fend: int, now: float, out: list[Command]
    ) -> None:
        body = pos + doff * 4
        if body == fend:
            return
        code = is_transfer_descriptor(buf, body, fend)
        if code == Descriptor.OPEN and self.phase is Phase.UNAVAILABLE:
            return
        if code == Descriptor.CLOSE:
            self._close_received_client = True
            out.append(CloseTransport(Side.CLIENT))
            if self.phase is Phase.CLOSING:
                out.append(CloseTransport(Side.BROKER))

    # ------------------------------------------------------------------ the Open decision

    def _decide_open(self, open_: Open | OpenHead, now: float, out: list[Command]) -> None:
        if not self._sasl_ok or self._sasl_user is None and self._used_sasl:
            # SASL did not succeed (the router will close), or the user is unknown
            if not self._sasl_ok:
                raise IllegalStateError("Open before a successful SASL outcome")
        user = self._sasl_user
        self.user = user
        self._handshake_deadline = None
        policy = self.policy
        settings = policy.settings
        if not settings.enable_vhost_policy:
            self._approve(open_, None, None, now, out)
            return
        hostname = open_.hostname
        hostname = None if hostname is None else str(hostname)
        if user is None:
            vhost = lookup_vhost(policy, hostname)
            self.vhost = vhost
            self._deny(ConnectionDenyReason.UNKNOWN_USER if vhost else ConnectionDenyReason.NO_VHOST,
                       now, out)
            return
        decision = decisions.approve_open(
            policy, hostname=hostname, user=user, remote_host=self.remote_host
        )
        if isinstance(decision, decisions.OpenDenied):
            self.vhost = decision.vhost
            self.group = decision.group
            logger.info("[%s] %s", self.conn_id, decision.log)
            self._deny(ConnectionDenyReason(decision.reason), now, out)
            return
        self.vhost = decision.vhost
        self.group = decision.group
        reason = self.ledger.try_admit(
            self.conn_id, vhost=decision.vhost, group=decision.group, user=user,
            remote_host=self.remote_host,
        )
        if reason is not None:
            logger.info(
                "[%s] DENY AMQP Open for user '%s', rhost '%s', vhost '%s': %s",
                self.conn_id, user, self.remote_host, decision.vhost.hostname, reason,
            )
            self._deny(ConnectionDenyReason(reason), now, out)
            return
        self._approve(open_, decision.vhost, decision.group, now, out)

    def _deny(self, reason: ConnectionDenyReason, now: float, out: list[Command]) -> None:
        self.phase = Phase.DENIED
        self.close_reason = "denied"
        err = _error(Condition.RESOURCE_LIMIT_EXCEEDED, C.CONNECTION_DISALLOWED)
        self._emit(
            ConnectionDenied(
                **self._ctx(now), reason=reason, condition=str(err.condition),
                description=str(err.description),
            ),
            out,
        )
        self._held_client.clear()
        self._held_broker.clear()
        # the router never receives anything of a denied connection's Open
        self._to_broker_pending.clear()
        self._broker_mode = "closed"
        out.append(CloseTransport(Side.BROKER))
        self._send_open_close(err, out)
        self._linger_deadline = now + LINGER_SECONDS

    def _approve(self, open_: Open | OpenHead, vhost: Any, group: Any, now: float,
                 out: list[Command]) -> None:
        self.admitted = vhost is not None
        self.governed = group is not None
        self.phase = Phase.OPENED
        self.opened_at = now
        if group is not None:
            self._max_message_size = group.max_message_size
            self._check_user_id = not group.allow_user_id_proxy
            self._user_id_bytes = (self.user or "").encode("utf-8")
            topics = getattr(group, "topics", None)
            if topics is not None:
                from ..policy.topics import Principal, qos_of  # only vhosts with topic models

                self._topics = topics
                self._qos_of = qos_of
                self._principal = Principal(user=self.user or "", group=group.name,
                                            subject=self.tls_subject)
            if group.max_sessions:
                self._policy_channel_max = max(0, group.max_sessions - 1)
        self._emit(
            ConnectionApproved(**self._ctx(now),
                               hostname=None if open_.hostname is None else str(open_.hostname)),
            out,
        )
        # Reserve the top of the client's channel-max for synthesized Begin+End replies.
        cmax = _UINT_MAX if open_.channel_max is None else int(open_.channel_max)
        cmax = min(cmax, 0xFFFF)
        self._client_channel_max = cmax
        reserve = min(RESERVED_CHANNELS, cmax // 2)
        self._reserved_channels = ReservedPool(cmax, reserve)
        body = self._client_open_body
        if reserve:
            # the client's own bytes with channel-max patched (plain encodings); otherwise
            # re-encoded, refusing fields proton would not re-encode faithfully
            patched = None if body is None else patch_open(body, channel_max=cmax - reserve)
            if patched is not None:
                fwd_frame = encode_frame(0, patched)
            else:
                if not isinstance(open_, Open):  # read from bytes, yet not patchable
                    open_, _ = decode_performative(body)
                fwd_frame = _frame(0, _checked_replace(open_, channel_max=cmax - reserve))
        elif isinstance(open_, OpenHead) and body is not None:
            fwd_frame = encode_frame(0, body)  # read from its bytes: relayed as it came
        else:
            fwd_frame = _frame(0, open_)
        # The router may send frames up to the client's max-frame-size.
        cmfs = _UINT_MAX if open_.max_frame_size is None else int(open_.max_frame_size)
        self._broker_frame_limit = max(C.MIN_MAX_FRAME_SIZE, min(cmfs, BROKER_FRAME_LIMIT))
        self._send(Side.BROKER, fwd_frame, out)
        # Frames the router sent before the decision (its Open, usually).
        held_broker = b"".join(self._held_broker)
        self._held_broker.clear()
        if held_broker:
            self._broker_amqp(held_broker, now, out)
        held = bytes(self._held_client)
        self._held_client.clear()
        if held:
            self._client_process(held, 0, len(held), now, out)

    # ------------------------------------------------------------------ admitted client frames

    def _client_relay(self, buf: Any, pos: int, end: int, now: float, out: list[Command]) -> int:
        """Relay admitted client frames from ``buf[pos:end]`` while the phase is OPENED.

        The proxy's hot path. A Transfer on an attached sender link whose delivery needs no
        decision (within maxMessageSize, its ``to``/``user-id`` allowed, not aborted, not
        being discarded) and a heartbeat only extend the run of original bytes; every other
        frame goes through :meth:`_client_amqp_frame` / :meth:`_client_transfer`, the handlers
        the general loop uses, so behaviour is the same either way.

        Returns:
            The offset of the first unconsumed byte: a partial frame, a frame whose header
            the general loop must look at (it raises what is wrong with it, or reads a
            protocol header), or the frame after one that changed the phase.
        """
        sessions = self._sessions
        # a size from 0x41000000 up may be a protocol header ("AMQP"): the general loop decides
        limit = min(self._client_frame_limit, 0x40FFFFFF)
        max_size = self._max_message_size
        unpack = _HDR.unpack_from
        read_fields = read_transfer_fields
        run_start = self._run_start
        run_end = self._run_end
        transfers = 0
        scan = _scan_transfers
        scan_max = -1 if max_size is None else min(max_size, 1 << 62)
        try:
            while end - pos >= 8:
                size, doff, ftype, channel = unpack(buf, pos)
                if size > limit or size < 8 or doff < 2 or ftype or doff * 4 > size:
                    break
                fend = pos + size
                if fend > end:
                    break
                body = pos + doff * 4
                if body == fend:  # heartbeat
                    if run_start < 0:
                        run_start = pos
                    run_end = pos = fend
                    continue
                f = None
                if (fend - body > 3 and buf[body] == 0x00 and buf[body + 1] == 0x53
                        and buf[body + 2] == 0x14):
                    transfers += 1
                    session = sessions.get(channel)
                    if session is not None:
                        f = read_fields(buf, body, fend)
                        link = session.links.get(f[0])
                        if (link is not None and link.is_sender and not f[4]
                                and not link.discarding and not link.client_detached):
                            payload = fend - f[5]
                            if not link.in_delivery:
                                if (max_size is None or payload <= max_size) and not (
                                    link.inspect
                                    and self._message_denial(link, buf, f[5], fend, f[3], now)
                                ):
                                    if f[3]:  # more frames of this delivery follow
                                        link.in_delivery = True
                                        link.delivery_bytes = payload
                                        link.delivery_id = f[1]
                                        link.delivery_settled = f[2]
                                    if run_start < 0:
                                        run_start = pos
                                    run_end = pos = fend
                                    if scan is not None and not f[3] and not link.inspect:
                                        # the frames after this one on the same link are
                                        # most often more of the same: the C scanner passes
                                        # them (and heartbeats) without a decision, and
                                        # stops at the first frame that may need one
                                        pos, n = scan(buf, pos, end, limit, channel, f[0],
                                                      scan_max)
                                        transfers += n
                                        run_end = pos
                                    continue
                            else:
                                total = link.delivery_bytes + payload
                                if max_size is None or total <= max_size:
                                    link.delivery_bytes = total
                                    if f[2]:
                                        link.delivery_settled = True
                                    if not f[3]:
                                        link.in_delivery = False
                                    if run_start < 0:
                                        run_start = pos
                                    run_end = pos = fend
                                    continue
                    # a decision, a denial or an error: the general transfer handler
                    self._run_start, self._run_end = run_start, run_end
                    forward = self._client_transfer(buf, pos, body, channel, fend, now, out, f)
                else:
                    self._run_start, self._run_end = run_start, run_end
                    forward = self._client_amqp_frame(buf, pos, doff, ftype, channel, fend, now,
                                                      out)
                run_start, run_end = self._run_start, self._run_end
                if forward:
                    if run_start < 0:
                        run_start = pos
                    run_end = fend
                pos = fend
                if self.phase is not Phase.OPENED or self._client_mode != "amqp":
                    break
        finally:
            self._run_start, self._run_end = run_start, run_end
            self.transfers_in += transfers
        return pos

    def _message_denial(self, link: LinkRecord, buf: Any, payload: int, fend: int, more: bool,
                        now: float) -> tuple[MessageDenyReason, str | None] | None:
        """Per-message checks on the first frame of a delivery on a link that needs them
        (``link.inspect``): QDR's ``user-id`` check when allowUserIdProxy is false and the
        anonymous-relay ``to`` (address rules, then topics, QDR-POLICY 3.6.1); no router
        annotations on an anonymous-relay message (qdrouterd would route it by
        ``x-opt-qd.to`` instead of the ``to`` checked here); on a topic publisher's link, a
        ``to`` other than the link's target must be publishable too (topic subscribers are
        filtered by ``to``).

        The message head is read canonically (:func:`~..amqp.message.read_message_head`);
        one that does not fit in the delivery's first frame is refused rather than let pass.

        Returns:
            ``(reason, to)`` for a denial, else None.

        Raises:
            DecodeError: the message head is not canonical (the connection closes with
                ``amqp:decode-error``).
        """
        head = read_message_head(buf, payload, fend, last=not more)
        to = head.to
        if not head.complete:
            if link.anonymous:
                return MessageDenyReason.RELAY_TARGET, to
            return (MessageDenyReason.USER_ID if self._check_user_id
                    else MessageDenyReason.TOPIC), to
        if self._check_user_id and head.user_id and head.user_id != self._user_id_bytes:
            return MessageDenyReason.USER_ID, to
        if link.anonymous:
            if head.router_annotations:
                return MessageDenyReason.ROUTER_ANNOTATIONS, to
            if to is not None:
                if to != self._relay_allowed:  # a relay sender usually repeats its destination
                    if not decisions.approve_relay_target(self.group, user=self.user or "",
                                                          to=to):
                        return MessageDenyReason.RELAY_TARGET, to
                    self._relay_allowed = to
                if self._topics is not None and not self._topics.check_publish(
                        self._principal, to, qos=link.qos,
                        wall_now=now + self.wall_offset).allowed:
                    return MessageDenyReason.TOPIC, to
        elif self._topics is not None and to is not None and to != link.address:
            if not self._topics.check_publish(self._principal, to, qos=link.qos,
                                              wall_now=now + self.wall_offset).allowed:
                return MessageDenyReason.TOPIC, to
        return None

    def _client_amqp_frame(
        self, buf: Any, pos: int, doff: int, ftype: int, channel: int, fend: int, now: float,
        out: list[Command],
    ) -> bool:
        """Handle one admitted client frame; True means "forward its original bytes"."""
        if ftype != FrameType.AMQP:
            raise FramingError("SASL frame after SASL negotiation")
        body = pos + doff * 4
        if body == fend:
            return True  # heartbeat
        code = is_transfer_descriptor(buf, body, fend)
        if code == _TRANSFER:
            self.transfers_in += 1
            return bool(self._client_transfer(buf, pos, body, channel, fend, now, out))
        if code == _DISPOSITION:
            if channel in self._denied_sessions:
                return False
            if channel not in self._sessions:
                raise NotAllowedError(f"disposition on channel {channel} that was never begun")
            return True
        if code == _FLOW:
            session = self._sessions.get(channel)
            if session is None:
                if channel in self._denied_sessions:
                    return False
                raise NotAllowedError(f"flow on channel {channel} that was never begun")
            if not session.denied_handles and not session.dropped_transfers:
                return True
        if code == _CLOSE and bytes(buf[body:fend]) in _EMPTY_CLOSE_BODIES:
            perf: Any = _EMPTY_CLOSE
        else:
            # what the proxy decides on must be what the router reads (decision 0005)
            check_performative(buf, body, fend)
            perf, _ = decode_performative(memoryview(buf)[body:fend])
        handler = self._CLIENT_HANDLERS.get(type(perf))
        if handler is None:
            raise IllegalStateError(f"unexpected {type(perf).__name__} from client")
        handler(self, perf, bytes(buf[pos:fend]), channel, now, out)
        return False

    def _on_client_open(self, perf: Any, raw: bytes, channel: int, now: float,
                        out: list[Command]) -> None:
        raise IllegalStateError("second Open")

    def _on_client_begin(self, perf: Begin, raw: bytes, channel: int, now: float,
                         out: list[Command]) -> None:
        if channel in self._sessions or channel in self._denied_sessions:
            raise NotAllowedError(f"channel {channel} already in use")
        if perf.remote_channel is not None:
            raise NotAllowedError("client-initiated Begin with remote-channel set")
        pcm = self._policy_channel_max
        group = self.group
        if group is not None and group.max_sessions and (
            (pcm is not None and channel > pcm) or self.active_sessions >= group.max_sessions
        ):
            self._deny_session(channel, now, out)
            return
        if channel > self._advertised_channel_max:
            raise FramingError(
                f"remote channel {channel} is above negotiated channel_max "
                f"{self._advertised_channel_max}."
            )
        hmax = _UINT_MAX if perf.handle_max is None else int(perf.handle_max)
        reserve = min(RESERVED_HANDLES, hmax // 2)
        session = SessionRecord(channel, ReservedPool(hmax, reserve))
        self._sessions[channel] = session
        self.active_sessions += 1
        if self.active_sessions > self.peak_sessions:
            self.peak_sessions = self.active_sessions
        if reserve:
            raw = _frame(channel, _checked_replace(perf, handle_max=hmax - reserve))
        self._send(Side.BROKER, raw, out)

    def _deny_session(self, channel: int, now: float, out: list[Command]) -> None:
        reply = self._reserved_channels.take()
        if reply is None:
            raise ResourceLimitError("session disallowed by local policy (no reply channel)")
        self._denied_sessions[channel] = reply
        err = _error(Condition.RESOURCE_LIMIT_EXCEEDED, C.SESSION_DISALLOWED)
        data = _frame(
            reply, Begin(remote_channel=channel, next_outgoing_id=0, incoming_window=0,
                         outgoing_window=0),
        ) + _frame(reply, End(error=err))
        self._send(Side.CLIENT, data, out)
        logger.info(
            "[%s] DENY AMQP Begin Session due to session limit. user: %s, rhost: %s, vhost: %s",
            self.conn_id, self.user, self.remote_host, getattr(self.vhost, "hostname", None),
        )
        self._emit(SessionDenied(**self._ctx(now), channel=channel), out)

    def _session(self, channel: int, what: str) -> SessionRecord | None:
        session = self._sessions.get(channel)
        if session is None:
            if channel in self._denied_sessions:
                return None
            raise NotAllowedError(f"{what} on channel {channel} that was never begun")
        if session.client_ended:
            raise IllegalStateError(f"{what} on channel {channel} after End")
        return session

    def _on_client_attach(self, perf: Attach, raw: bytes, channel: int, now: float,
                          out: list[Command]) -> None:
        session = self._session(channel, "attach")
        if session is None:
            return  # pipelined behind a denied Begin: consumed
        if perf.handle is None or perf.name is None or perf.role is None:
            raise DecodeError("attach without name, handle or role")
        handle = int(perf.handle)
        if handle in session.links or handle in session.denied_handles:
            raise HandleInUseError(f"handle {handle} is already attached")
        if session.handle_max is not None and handle > session.handle_max:
            raise FramingError(
                f"remote handle {handle} is above handle_max {session.handle_max}"
            )
        is_sender = perf.role is False or perf.role == 0
        if is_sender:
            address = _address(perf.target)
            dynamic = bool(getattr(perf.target, "dynamic", False))
        else:
            address = _address(perf.source)
            dynamic = bool(getattr(perf.source, "dynamic", False))
        group = self.group
        if group is not None:
            user = self.user or ""
            if is_sender:
                reason = decisions.approve_sender(
                    group, user=user, target_address=address or None,
                    open_senders=self.active_senders,
                )
            else:
                reason = decisions.approve_receiver(
                    group, user=user, source_address=address or None, dynamic=dynamic,
                    open_receivers=self.active_receivers,
                )
            if reason is not None:
                self._deny_link(session, perf, handle, is_sender, address,
                                LinkDenyReason(reason), now, out)
                return
        qos = 1
        verdict = None
        if self._topics is not None:
            qos = self._qos_of(_int_or_none(perf.snd_settle_mode), _int_or_none(perf.rcv_settle_mode))
            if address and not dynamic:
                check = (self._topics.check_publish if is_sender
                         else self._topics.check_subscribe)
                verdict = check(self._principal, address, qos=qos,
                                wall_now=now + self.wall_offset)
                if not verdict.allowed:
                    logger.info("[%s] topic authorization denies %s '%s' for user '%s': %s",
                                self.conn_id, "publish" if is_sender else "subscribe",
                                address, self.user, verdict.decided_by)
                    self._deny_link(session, perf, handle, is_sender, address,
                                    LinkDenyReason.TOPIC, now, out)
                    return
        link = LinkRecord(str(perf.name), handle, is_sender, address)
        link.qos = qos
        # a governed sender's deliveries are read when a per-message rule applies to them
        link.inspect = is_sender and group is not None and (
            link.anonymous or self._check_user_id or self._topics is not None)
        if verdict is not None and not is_sender and (verdict.per_delivery
                                                      or verdict.strip_durable):
            link.topic_filter = verdict.per_delivery
            link.strip_durable = verdict.strip_durable
            self._topic_receivers = True
        session.links[handle] = link
        if is_sender:
            session.senders += 1
            self.active_senders += 1
            self.peak_senders = max(self.peak_senders, self.active_senders)
        else:
            session.receivers += 1
            self.active_receivers += 1
            self.peak_receivers = max(self.peak_receivers, self.active_receivers)
        self._send(Side.BROKER, raw, out)

    def _deny_link(
        self, session: SessionRecord, perf: Attach, handle: int, is_sender: bool,
        address: str | None, reason: LinkDenyReason, now: float, out: list[Command],
    ) -> None:
        reply_handle = session.reserved_handles.take()
        if reply_handle is None:
            raise ResourceLimitError("link disallowed by local policy (no reply handle)")
        session.denied_handles[handle] = reply_handle
        condition = (
            Condition.RESOURCE_LIMIT_EXCEEDED
            if reason in (LinkDenyReason.SENDER_LIMIT, LinkDenyReason.RECEIVER_LIMIT)
            else Condition.UNAUTHORIZED_ACCESS
        )
        # Attach with terminus present and address absent, then Detach(closed), as QDR does.
        reply = Attach(
            name=perf.name, handle=reply_handle, role=is_sender,
            snd_settle_mode=perf.snd_settle_mode, rcv_settle_mode=perf.rcv_settle_mode,
            source=Source(), target=Target(),
            initial_delivery_count=None if is_sender else 0,
        )
        detach = Detach(handle=reply_handle, closed=True,
                        error=_error(condition, C.LINK_DISALLOWED))
        self._reply_on_session(session, _frame(0, reply), _frame(0, detach), out=out)
        role = "sender" if is_sender else "receiver"
        logger.info(
            "[%s] DENY AMQP Attach %s '%s' for user '%s', rhost '%s', vhost '%s' (%s)",
            self.conn_id, role, address, self.user, self.remote_host,
            getattr(self.vhost, "hostname", None), reason,
        )
        self._emit(LinkDenied(**self._ctx(now), role=role, address=address, reason=reason), out)

    def _reply_on_session(self, session: SessionRecord, *frames: bytes,
                          out: list[Command]) -> None:
        """Send synthesized frames (encoded for channel 0) on the router's channel of ``session``.

        If the router's Begin has not reached the client yet, they wait for it.
        """
        if session.broker_channel is None:
            session.pending_replies.extend(frames)
            return
        channel = session.broker_channel
        self._send(Side.CLIENT, b"".join(_rechannel(f, channel) for f in frames), out)

    def _on_client_flow(self, perf: Flow, raw: bytes, channel: int, now: float,
                        out: list[Command]) -> None:
        session = self._session(channel, "flow")
        if session is None:
            return
        if perf.handle is not None and int(perf.handle) in session.denied_handles:
            return
        if session.dropped_transfers and perf.next_outgoing_id is not None:
            nxt = (int(perf.next_outgoing_id) - session.dropped_transfers) & _UINT_MAX
            raw = _frame(channel, _replace(perf, next_outgoing_id=nxt))
        self._send(Side.BROKER, raw, out)

    def _on_client_detach(self, perf: Detach, raw: bytes, channel: int, now: float,
                          out: list[Command]) -> None:
        session = self._session(channel, "detach")
        if session is None:
            return
        if perf.handle is None:
            raise DecodeError("detach without handle")
        handle = int(perf.handle)
        reply = session.denied_handles.pop(handle, None)
        if reply is not None:
            session.reserved_handles.give_back(reply)
            return  # the answer to a synthesized denial: the router never saw the link
        link = session.links.get(handle)
        if link is None:
            raise UnattachedHandleError(f"detach of handle {handle} that is not attached")
        if link.client_detached:
            raise IllegalStateError(f"second detach of handle {handle}")
        link.client_detached = True
        self._link_gone(session, link)
        if link.broker_detached or link.broker_handle is None and perf.closed:
            pass
        if link.broker_detached:
            self._drop_link(session, link)
        self._send(Side.BROKER, raw, out)

    def _link_gone(self, session: SessionRecord, link: LinkRecord) -> None:
        # Called after setting the detaching side's flag: the link is uncounted when the
        # first side detaches (one flag set), never again when the second one does, and not
        # at all once an End already uncounted the whole session.
        if link.client_detached and link.broker_detached:
            return
        if session.client_ended or session.broker_ended:
            return
        if link.is_sender:
            session.senders -= 1
            self.active_senders -= 1
        else:
            session.receivers -= 1
            self.active_receivers -= 1

    def _drop_link(self, session: SessionRecord, link: LinkRecord) -> None:
        if session.links.get(link.handle) is link:
            del session.links[link.handle]
        if link.broker_handle is not None and session.broker_links.get(link.broker_handle) is link:
            del session.broker_links[link.broker_handle]

    def _on_client_end(self, perf: End, raw: bytes, channel: int, now: float,
                       out: list[Command]) -> None:
        reply = self._denied_sessions.pop(channel, None)
        if reply is not None:
            self._reserved_channels.give_back(reply)
            return  # answers a synthesized Begin+End
        session = self._sessions.get(channel)
        if session is None:
            raise NotAllowedError(f"end on channel {channel} that was never begun")
        if session.client_ended:
            raise IllegalStateError(f"second end on channel {channel}")
        session.client_ended = True
        self._session_gone(session)
        if session.broker_ended:
            self._drop_session(session)
        self._send(Side.BROKER, raw, out)

    def _session_gone(self, session: SessionRecord) -> None:
        # Called after setting the ending side's flag (see _link_gone).
        if session.client_ended and session.broker_ended:
            return
        self.active_sessions -= 1
        self.active_senders -= session.senders
        self.active_receivers -= session.receivers
        session.senders = session.receivers = 0

    def _drop_session(self, session: SessionRecord) -> None:
        if self._sessions.get(session.channel) is session:
            del self._sessions[session.channel]
        if session.broker_channel is not None:
            if self._broker_sessions.get(session.broker_channel) is session:
                del self._broker_sessions[session.broker_channel]

    def _on_client_close(self, perf: Close, raw: bytes, channel: int, now: float,
                         out: list[Command]) -> None:
        self._close_received_client = True
        if self.close_reason is None:
            self.close_reason = "client_close"
        if self._close_sent_client:
            # the client answers a Close it was sent (shutdown, oversize, the router's): done
            out.append(CloseTransport(Side.CLIENT))
            if not self._close_sent_broker:
                self._send_close(Side.BROKER, None, out)
            if self._close_received_broker:
                out.append(CloseTransport(Side.BROKER))
            return
        self.phase = Phase.CLOSING
        self._close_sent_broker = True
        self._linger_deadline = now + LINGER_SECONDS  # bounded wait for the router's answer
        self._send(Side.BROKER, raw, out)

    def _on_client_disposition(self, perf: Disposition, raw: bytes, channel: int, now: float,
                               out: list[Command]) -> None:
        if self._session(channel, "disposition") is None:
            return
        self._send(Side.BROKER, raw, out)

    def _on_client_transfer_decoded(self, perf: Transfer, raw: bytes, channel: int, now: float,
                                    out: list[Command]) -> None:
        raise DecodeError("transfer with a non-standard descriptor encoding")

    _CLIENT_HANDLERS: dict[type, Callable[..., None]] = {}

    # ------------------------------------------------------------------ client transfers

    def _client_transfer(self, buf: Any, pos: int, body: int, channel: int, fend: int,
                         now: float, out: list[Command],
                         fields: tuple[Any, ...] | None = None) -> bool | None:
        """Handle one client Transfer; True means "forward its original bytes".

        ``fields`` is the :func:`read_transfer_fields` tuple when the caller read it already.
        """
        session = self._sessions.get(channel)
        if session is None:
            if channel in self._denied_sessions:
                return
            raise NotAllowedError(f"transfer on channel {channel} that was never begun")
        if fields is None:
            fields = read_transfer_fields(buf, body, fend)
        handle, delivery_id, settled, more, aborted, payload_offset, tag = fields
        link = session.links.get(handle)
        if link is None:
            if handle in session.denied_handles:
                session.dropped_transfers += 1
                return
            raise UnattachedHandleError(f"transfer on handle {handle} that is not attached")
        if not link.is_sender:
            raise NotAllowedError("transfer on a link where the client is the receiver")
        if link.client_detached:
            raise IllegalStateError("transfer after detach")
        first = not link.in_delivery
        if first:
            link.in_delivery = True
            link.delivery_bytes = 0
            link.delivery_id = delivery_id
            link.delivery_settled = settled
            link.discarding = False
        elif settled:
            link.delivery_settled = True
        if not more or aborted:
            link.in_delivery = False
        if link.discarding:
            session.dropped_transfers += 1
            if not link.in_delivery:
                self._finish_denied_delivery(session, link, now, out)
            return
        link.delivery_bytes += fend - payload_offset
        if first and not aborted and link.inspect:
            denial = self._message_denial(link, buf, payload_offset, fend, more, now)
            if denial is not None:
                reason, address = denial
                self._deny_delivery(session, link, delivery_tag_at(buf, tag), reason, address,
                                    now, out)
                return
        limit = self._max_message_size
        if limit is not None and link.delivery_bytes > limit and not aborted:
            self._oversize(session, link, delivery_tag_at(buf, tag) if first else None, first,
                           now, out)
            return
        return True

    def _deny_delivery(self, session: SessionRecord, link: LinkRecord, tag: bytes | None,
                       reason: MessageDenyReason, address: str | None, now: float,
                       out: list[Command]) -> None:
        # The router gets an aborted, settled transfer in place of the first frame, so the
        # session's delivery-ids stay contiguous; later frames of the delivery are dropped and
        # counted (docs/decisions/0002-withheld-transfers.md).
        link.discarding = True
        link.discard_reason = reason
        self._log_message_denial(reason, address)
        self._send_aborted(session, link, tag, True, out)
        self._emit(MessageDenied(**self._ctx(now), address=address, reason=reason,
                                 size=link.delivery_bytes), out)
        if not link.in_delivery:
            self._finish_denied_delivery(session, link, now, out)

    def _log_message_denial(self, reason: MessageDenyReason, address: str | None,
                            detail: str = "") -> None:
        """One INFO line per refused message, with the same facts as every other denial
        (user, remote host, vhost, reason), as QDR logs its own."""
        logger.info("[%s] DENY AMQP Transfer for user '%s', rhost '%s', vhost '%s', address "
                    "'%s': %s%s", self.conn_id, self.user, self.remote_host,
                    getattr(self.vhost, "hostname", None), address, reason,
                    f" ({detail})" if detail else "")

    def _send_aborted(self, session: SessionRecord, link: LinkRecord, tag: bytes | None,
                      first: bool, out: list[Command]) -> None:
        if first:
            t = Transfer(handle=link.handle, delivery_id=link.delivery_id,
                         delivery_tag=tag or b"", message_format=0, settled=True,
                         more=False, aborted=True)
        else:
            t = Transfer(handle=link.handle, more=False, aborted=True, settled=True)
        self._send(Side.BROKER, _frame(session.channel, t), out)

    def _finish_denied_delivery(self, session: SessionRecord, link: LinkRecord, now: float,
                                out: list[Command]) -> None:
        reason = link.discard_reason
        link.discarding = False
        if reason == MessageDenyReason.MESSAGE_SIZE:
            self._finish_oversize(session, link, now, out)
            return
        description = (C.USER_ID_VIOLATION if reason == MessageDenyReason.USER_ID
                       else C.TARGET_VIOLATION)  # relay target, by address rules or topics
        if not link.delivery_settled and link.delivery_id is not None:
            disp = Disposition(role=True, first=link.delivery_id, settled=True,
                               state=Rejected(error=_error(Condition.UNAUTHORIZED_ACCESS,
                                                           description)))
            self._reply_on_session(session, _frame(0, disp), out=out)

    def _oversize(self, session: SessionRecord, link: LinkRecord, tag: bytes | None,
                  first: bool, now: float, out: list[Command]) -> None:
        self._log_message_denial(MessageDenyReason.MESSAGE_SIZE, link.address,
                                 f"maxMessageSize {self._max_message_size} exceeded")
        link.discarding = True
        link.discard_reason = MessageDenyReason.MESSAGE_SIZE
        self._send_aborted(session, link, tag, first, out)
        self._emit(MessageDenied(**self._ctx(now), address=link.address,
                                 reason=MessageDenyReason.MESSAGE_SIZE,
                                 size=link.delivery_bytes), out)
        if not link.in_delivery:
            self._finish_oversize(session, link, now, out)

    def _finish_oversize(self, session: SessionRecord, link: LinkRecord, now: float,
                         out: list[Command]) -> None:
        # QDR: reject the delivery, detach the link (no error), close the connection forced.
        frames = []
        if link.delivery_id is not None:
            frames.append(_frame(0, Disposition(
                role=True, first=link.delivery_id, settled=True,
                state=Rejected(error=_error(Condition.LINK_MESSAGE_SIZE_EXCEEDED,
                                            C.MESSAGE_SIZE_EXCEEDED)))))
        if link.broker_handle is not None:
            frames.append(_frame(0, Detach(handle=link.broker_handle, closed=True)))
        self._reply_on_session(session, *frames, out=out)
        self.close_reason = "message_size"
        self._send_close(Side.CLIENT, _error(Condition.CONNECTION_FORCED, C.MESSAGE_SIZE_EXCEEDED),
                         out)
        if not self._close_sent_broker:
            self._send_close(Side.BROKER, None, out)
        self.phase = Phase.CLOSING
        self._linger_deadline = now + LINGER_SECONDS

    # ------------------------------------------------------------------ broker bytes

    def _broker_data(self, data: bytes, now: float, out: list[Command]) -> None:
        mode = self._broker_mode
        if mode == "amqp" and self.phase in _RELAYING:
            bbuf = self._bbuf
            start = 0
            if bbuf:
                # A frame straddled the previous read: complete it with just the bytes it
                # lacks (all of them if its size is not known yet), then read the rest of
                # the new bytes in place instead of appending them to the buffer.
                size = self._pending_frame_size(bbuf, mode, self._broker_frame_limit)
                start = size - len(bbuf)
                if 0 < start < len(data):
                    bbuf += memoryview(data)[:start]
                else:
                    start = len(data)
                    bbuf += data
                with memoryview(bbuf) as view:
                    pos = self._broker_amqp_process(view, len(bbuf), now, out)
                del bbuf[:pos]
                if start == len(data):
                    return
                if bbuf:  # not consumed (the upstream leg closed meanwhile): keep the bytes
                    bbuf += memoryview(data)[start:]
                    return
            pos = self._broker_amqp_process(data, len(data), now, out, start)
            if pos < len(data):
                self._bbuf += memoryview(data)[pos:]
            return
        self._bbuf += data
        buf = self._bbuf
        pos = 0
        end = len(buf)
        while pos < end and self._broker_mode != "closed":
            mode = self._broker_mode
            if mode == "header":
                if end - pos < 8:
                    break
                header = bytes(buf[pos : pos + 8])
                if header == C.SASL_HEADER and not self._sasl_ok:
                    self._broker_mode = "sasl"
                    self._sasl_relayed = _SASL_HEADER_RELAYED
                elif header == C.AMQP_HEADER:
                    self._broker_mode = "amqp"
                    self._amqp_header_sent_to_client = True
                else:
                    raise FramingError(f"unexpected protocol header from upstream {header!r}")
                self._send(Side.CLIENT, header, out)
                pos += 8
                continue
            if mode == "sasl":
                if end - pos < 8:
                    break
                size, doff, ftype, _channel = _HDR.unpack_from(buf, pos)
                if size < 8 or size > PRE_OPEN_FRAME_LIMIT or doff < 2 or doff * 4 > size:
                    raise FramingError("malformed frame")
                if end - pos < size:
                    break
                fend = pos + size
                if ftype != FrameType.SASL:
                    raise FramingError("AMQP frame during SASL negotiation")
                body = pos + doff * 4
                if body < fend:
                    code = sasl_outcome_code(buf, body, fend)  # plain encodings, no decode
                    if code is None:
                        if is_sasl_mechanisms(buf, body, fend):
                            self._sasl_relayed = _SASL_MECHANISMS_RELAYED
                        else:
                            perf, _ = decode_performative(memoryview(buf)[body:fend])
                            if isinstance(perf, SaslOutcome):
                                code = 0 if perf.code is None else int(perf.code)
                            elif isinstance(perf, SaslMechanisms):
                                self._sasl_relayed = _SASL_MECHANISMS_RELAYED
                    if code is not None:
                        self._sasl_relayed = _SASL_OUTCOME_RELAYED
                        if code == 0:
                            self._sasl_ok = True
                            self.phase = Phase.AWAIT_AMQP_HEADER
                        self._broker_mode = "header"
                self._send(Side.CLIENT, bytes(buf[pos:fend]), out)
                pos = fend
                continue
            # amqp
            if self.phase in _RELAYING:
                pos += self._broker_amqp_process(memoryview(buf)[pos:end], end - pos, now, out)
                break
            # before the decision: hold whole frames
            if end - pos < 8:
                break
            size = _HDR.unpack_from(buf, pos)[0]
            if size < 8 or size > BROKER_FRAME_LIMIT:
                raise FramingError("malformed frame")
            if end - pos < size:
                break
            self._held_broker.append(bytes(buf[pos : pos + size]))
            pos += size
        del buf[:pos]

    def _broker_amqp(self, data: bytes, now: float, out: list[Command]) -> None:
        pos = self._broker_amqp_process(data, len(data), now, out)
        if pos < len(data):
            self._bbuf[:0] = data[pos:]

    def _broker_amqp_process(self, buf: Any, end: int, now: float, out: list[Command],
                             start: int = 0) -> int:
        """Relay admitted broker frames in ``buf[start:end]``; forward runs of untouched
        frames as one write. Returns the offset of the first unconsumed byte."""
        pos = run_start = start
        limit = self._broker_frame_limit
        unpack = _HDR.unpack_from
        while end - pos >= 8 and self._broker_mode == "amqp":
            size, doff, ftype, channel = unpack(buf, pos)
            if size < 8 or size > limit or doff < 2 or doff * 4 > size or ftype != 0:
                raise FramingError("malformed frame")
            if end - pos < size:
                break
            fend = pos + size
            body = pos + doff * 4
            if body == fend:
                pos = fend
                continue
            if fend - body >= 3 and buf[body] == 0x00 and buf[body + 1] == 0x53:
                code = buf[body + 2]  # is_transfer_descriptor's common case, inline
            else:
                code = is_transfer_descriptor(buf, body, fend)
            if code == _TRANSFER:
                self.transfers_out += 1
                if self._topic_receivers:
                    replacement = self._broker_transfer(buf, pos, body, fend, channel, now, out)
                    if replacement is not None:
                        if pos > run_start:
                            self._send(Side.CLIENT, _run_data(buf, run_start, pos), out)
                        self._send(Side.CLIENT, replacement, out)
                        run_start = fend
                pos = fend
                continue
            if code == _DISPOSITION:
                pos = fend
                continue
            if code == _FLOW:
                session = self._broker_sessions.get(channel)
                if session is None or (not session.dropped_transfers
                                       and self._window_frames is None):
                    pos = fend
                    continue
            # a frame we need to look at: flush the run before it
            if pos > run_start:
                self._send(Side.CLIENT, _run_data(buf, run_start, pos), out)
            perf: Any = None
            if code == _CLOSE and bytes(buf[body:fend]) in _EMPTY_CLOSE_BODIES:
                perf = _EMPTY_CLOSE
            elif code == _OPEN:
                # the router's Open is relayed as it came (or patched): read what the
                # proxy needs from its bytes; the client decodes the rest
                perf = read_open_head(bytes(buf[body:fend]), strict=False)
            if perf is None:
                perf, _ = decode_performative(memoryview(buf)[body:fend])
            replacement = self._broker_frame(perf, bytes(buf[pos:fend]), channel, now, out)
            if replacement:
                self._send(Side.CLIENT, replacement, out)
            pos = fend
            run_start = pos
        if pos > run_start and self._broker_mode == "amqp":
            self._send(Side.CLIENT, _run_data(buf, run_start, pos), out)
        return pos

    def _broker_transfer(self, buf: Any, pos: int, body: int, fend: int, channel: int,
                         now: float, out: list[Command]) -> bytes | None:
        """A router Transfer on a connection with topic-filtered receivers.

        Returns None to forward the frame's bytes as they are, else the bytes to send to the
        client instead: a copy with ``durable`` cleared, or a payload-less stand-in for a
        withheld delivery (docs/decisions/0004-topic-delivery-filtering.md).
        """
        session = self._broker_sessions.get(channel)
        if session is None:
            return None
        handle, delivery_id, settled, more, aborted, payload_offset, tag = read_transfer_fields(
            buf, body, fend)
        link = session.broker_links.get(handle)
        if link is None or link.is_sender or not (link.topic_filter or link.strip_durable):
            return None
        first = not link.in_delivery
        last = not more or aborted
        if first:
            link.delivery_id = delivery_id
            link.delivery_tag = delivery_tag_at(buf, tag)
            link.delivery_settled = settled
            link.discarding = False
            link.rewrite_durable = link.strip_durable
            if link.topic_filter and not aborted:
                # The message comes from a publisher, through the router: read its head
                # canonically; a ``to`` the proxy cannot read proves nothing.
                to: str | None = None
                try:
                    head = read_message_head(buf, payload_offset, fend, last=not more)
                except DecodeError:
                    head = None
                wall_now = now + self.wall_offset
                if head is not None and not head.complete:
                    visible = False  # cannot tell the address from the first frame: withhold
                    decided = "properties not in the first frame"
                elif head is not None and head.to is not None:
                    to = head.to
                    d = self._topics.check_delivery(self._principal, link.address or "",
                                                    to, wall_now=wall_now)
                    visible, decided = d.visible, d.decided_by
                    link.rewrite_durable = d.strip_durable
                else:
                    # no readable ``to``: visible only if every topic the wildcard can match
                    # is visible to this subscriber
                    d = self._topics.check_unknown_delivery(
                        self._principal, link.address or "", wall_now=wall_now)
                    visible, decided = d.visible, d.decided_by
                    link.rewrite_durable = d.strip_durable
                if not visible:
                    link.discarding = True
                    logger.debug("[%s] delivery %s on '%s' withheld: %s", self.conn_id,
                                 delivery_id, link.address, decided)
                    self._emit(MessageDenied(
                        **self._ctx(now), address=to, reason=MessageDenyReason.TOPIC_WITHHELD,
                        size=fend - payload_offset), out)
        elif settled:
            link.delivery_settled = True
        link.in_delivery = not last
        if link.discarding:
            # One payload-less frame per router frame keeps the session's transfer-ids and the
            # link's delivery-count in step on both sides; the last one aborts the delivery,
            # which settles it for the client (Part 2 §2.7.5).
            if first:
                t = Transfer(handle=handle, delivery_id=delivery_id,
                             delivery_tag=link.delivery_tag or b"", message_format=0,
                             settled=True if last else None, more=not last,
                             aborted=True if last else None)
            else:
                t = Transfer(handle=handle, more=not last, settled=True if last else None,
                             aborted=True if last else None)
            if last:
                link.discarding = False
                if not link.delivery_settled and not aborted and link.delivery_id is not None:
                    # settle it toward the router: the subscriber may not see it
                    self._send(Side.BROKER, _frame(session.channel, Disposition(
                        role=True, first=link.delivery_id, settled=True, state=Accepted())), out)
            return _frame(channel, t)
        if first and link.rewrite_durable:
            link.rewrite_durable = False
            offset = durable_flag_offset(buf, payload_offset, fend)
            if offset is not None:
                frame = bytearray(buf[pos:fend])
                frame[offset - pos] = cleared_durable_byte(buf, offset)
                return bytes(frame)
        return None

    def _broker_frame(self, perf: Any, raw: bytes, channel: int, now: float,
                      out: list[Command]) -> bytes | None:
        """Handle one decoded broker frame; return the bytes to send to the client."""
        if isinstance(perf, Open | OpenHead):
            return self._on_broker_open(perf, raw, out)
        if isinstance(perf, Begin):
            return self._on_broker_begin(perf, raw, channel, out)
        if isinstance(perf, Attach):
            session = self._broker_sessions.get(channel)
            if session is not None and perf.name is not None and perf.handle is not None:
                for link in session.links.values():
                    if link.name == perf.name and link.broker_handle is None:
                        link.broker_handle = int(perf.handle)
                        session.broker_links[int(perf.handle)] = link
                        break
            return raw
        if isinstance(perf, Flow):
            session = self._broker_sessions.get(channel)
            changes: dict[str, Any] = {}
            if session is not None and session.dropped_transfers and perf.next_incoming_id is not None:
                changes["next_incoming_id"] = (
                    int(perf.next_incoming_id) + session.dropped_transfers
                ) & _UINT_MAX
            if self._window_frames is not None and perf.incoming_window is not None:
                if int(perf.incoming_window) > self._window_frames:
                    changes["incoming_window"] = self._window_frames
            if changes:
                return _frame(channel, _replace(perf, **changes))
            return raw
        if isinstance(perf, Detach):
            session = self._broker_sessions.get(channel)
            if session is not None and perf.handle is not None:
                link = session.broker_links.get(int(perf.handle))
                if link is not None and not link.broker_detached:
                    link.broker_detached = True
                    self._link_gone(session, link)
                    if link.client_detached:
                        self._drop_link(session, link)
            return raw
        if isinstance(perf, End):
            session = self._broker_sessions.get(channel)
            if session is not None and not session.broker_ended:
                session.broker_ended = True
                self._session_gone(session)
                if session.client_ended:
                    self._drop_session(session)
            return raw
        if isinstance(perf, Close):
            self._close_received_broker = True
            if self._close_sent_client:
                # the client already has the proxy's Close (shutdown/oversize)
                if self._close_received_client or self.phase is Phase.CLOSING:
                    out.append(CloseTransport(Side.BROKER))
                return None
            if self.close_reason is None:
                self.close_reason = "broker_close"
            self._close_sent_client = True
            self.phase = Phase.CLOSING
            # a client that never answers (half-open) must not hold its counts forever
            self._linger_deadline = now + LINGER_SECONDS
            return raw
        return raw

    def _on_broker_open(self, perf: Open | OpenHead, raw: bytes, out: list[Command]) -> bytes:
        if self._broker_open_seen:
            raise IllegalStateError("second Open from upstream")
        self._broker_open_seen = True
        changes: dict[str, Any] = {}
        group = self.group
        mfs = _UINT_MAX if perf.max_frame_size is None else int(perf.max_frame_size)
        cmax = 0xFFFF if perf.channel_max is None else int(perf.channel_max)
        if group is not None:
            if group.max_frame_size:
                new = max(C.MIN_MAX_FRAME_SIZE, min(mfs, group.max_frame_size))
                if new != mfs:
                    changes["max_frame_size"] = new
                    mfs = new
            if self._policy_channel_max is not None:
                new = min(cmax, self._policy_channel_max)
                if new != cmax:
                    changes["channel_max"] = new
                    cmax = new
            if group.max_session_window:
                self._window_frames = max(1, group.max_session_window // mfs)
        self._client_frame_limit = max(C.MIN_MAX_FRAME_SIZE, mfs)
        self._advertised_channel_max = cmax
        self._open_sent_to_client = True
        if changes:
            patched = patch_open(raw[raw[4] * 4:], **changes)
            if patched is not None:
                return encode_frame(0, patched)
            if not isinstance(perf, Open):  # read from bytes, yet not patchable
                perf, _ = decode_performative(raw[raw[4] * 4:])
            return _frame(0, _replace(perf, **changes))
        return raw

    def _on_broker_begin(self, perf: Begin, raw: bytes, channel: int,
                         out: list[Command]) -> bytes:
        session = None
        if perf.remote_channel is not None:
            session = self._sessions.get(int(perf.remote_channel))
        if session is None:
            return raw  # a router-initiated session: relayed untouched
        session.broker_channel = channel
        session.handle_max = _UINT_MAX if perf.handle_max is None else int(perf.handle_max)
        self._broker_sessions[channel] = session
        data = raw
        if self._window_frames is not None:
            iw = 0 if perf.incoming_window is None else int(perf.incoming_window)
            if iw > self._window_frames:
                data = _frame(channel, _replace(perf, incoming_window=self._window_frames))
        if session.pending_replies:
            data = data + b"".join(_rechannel(f, channel) for f in session.pending_replies)
            session.pending_replies.clear()
        return data


ProxyConnection._CLIENT_HANDLERS = {
    Open: ProxyConnection._on_client_open,
    Begin: ProxyConnection._on_client_begin,
    Attach: ProxyConnection._on_client_attach,
    Flow: ProxyConnection._on_client_flow,
    Detach: ProxyConnection._on_client_detach,
    End: ProxyConnection._on_client_end,
    Close: ProxyConnection._on_client_close,
    Disposition: ProxyConnection._on_client_disposition,
    Transfer: ProxyConnection._on_client_transfer_decoded,
}


def _run_data(buf: Any, start: int, end: int) -> bytes | memoryview:
    """``buf[start:end]``, a run of frames forwarded as they came, to hand to ``SendData``.

    A read the transport delivered is an immutable ``bytes``: the run is a view of it (no
    copy; the shell writes it, or its transport keeps the view until it is sent). Anything
    else (the proxy's own buffers, which change after this call) is copied once.
    """
    if type(buf) is bytes:
        return buf if (start == 0 and end == len(buf)) else memoryview(buf)[start:end]
    with memoryview(buf) as view:
        return view[start:end].tobytes()


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _replace(perf: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(perf, **changes)


def _checked_replace(perf: Any, **changes: Any) -> Any:
    """Return ``perf`` with ``changes``, refusing values that do not survive re-encoding.

    A rewritten client frame (Open, Begin) is re-encoded by proton's codec; a crafted value
    (e.g. a nested described type proton normalises) could otherwise reach the router with
    different fields from the ones the proxy decided on (fuzz finding
    ``framing-nested-described-reencode``).

    Raises:
        DecodeError: the re-encoded performative decodes to something else.
    """
    new = _replace(perf, **changes)
    back, _ = decode_performative(new.encode())
    if back != new:
        raise DecodeError(f"{type(perf).__name__} fields do not survive re-encoding")
    return new


def _rechannel(frame: bytes, channel: int) -> bytes:
    """Return ``frame`` with its channel field set to ``channel``."""
    return frame[:6] + channel.to_bytes(2, "big") + frame[8:]


def _symbol_array(names: list[str]) -> Any:
    from ..amqp.codec import symbol_array

    return symbol_array(names)
