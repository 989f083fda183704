"""Sans-IO. What one connection writes, to which leg, in order.

:class:`Wire` turns the handlers' decisions into commands: bytes for either leg (queued while
the upstream connect is under way, dropped once a leg can no longer be written), the Close
performatives with their bookkeeping in :class:`~.state.Sides`, transport closes, events. It
also holds the client's :class:`Run`: consecutive client frames forwarded as they came
accumulate as one slice of the original bytes, written with a single ``SendData`` before
anything else is sent, so the order on the wire is kept and a burst of Transfers costs one
write. The router side keeps a :class:`Run` of the router's frames the same way.
"""

from __future__ import annotations

from typing import Any

from ..amqp.constants import AMQP_FRAME, AMQP_HEADER
from ..amqp.framing import encode_frame
from ..amqp.performatives import Close, Error, Open
from .commands import CLIENT, ROUTER, CloseTransport, Command, Emit, SendData, Side
from .events import ProxyEvent
from .state import C_CLOSED, R_CONNECTING, R_IDLE, ROUTER_WRITABLE, Sides


def frame(channel: int, perf: Any, payload: bytes = b"", ftype: int = AMQP_FRAME) -> bytes:
    """A whole frame (DOFF 2) holding ``perf`` encoded, then ``payload``."""
    return encode_frame(channel, perf.encode() + payload, ftype)


def error(condition: str, description: str) -> Error:
    """An AMQP error (Part 2 §2.8.14)."""
    return Error(condition=condition, description=description)


def run_data(buf: Any, start: int, end: int) -> bytes | memoryview:
    """``buf[start:end]``, a run of frames forwarded as they came, to hand to ``SendData``.

    A read the transport delivered is an immutable ``bytes``: the run is a view of it (no copy;
    the shell writes it, or its transport keeps the view until it is sent). Anything else (the
    proxy's own buffers, which change after this call) is copied once.
    """
    if type(buf) is bytes:
        return buf if (start == 0 and end == len(buf)) else memoryview(buf)[start:end]
    with memoryview(buf) as view:
        return view[start:end].tobytes()


def rechannel(data: bytes, channel: int) -> bytes:
    """``data`` (one frame) with its channel field set to ``channel``."""
    return data[:6] + channel.to_bytes(2, "big") + data[8:]


class Run:
    """Consecutive frames of one leg forwarded as they came: ``buf[start:end]``, one write.

    Both legs use it: the client's run (:attr:`Wire.run`, frames for the router, flushed by
    :meth:`Wire.send` before anything else is written) and the router side's run of frames
    for the client (``core.router_side``, which flushes it before each frame it rewrites).
    ``start`` is -1 while the run is empty. A relay loop may hold ``start`` and ``end`` in
    locals for speed (``core.fastpath``), and stores them back before it calls anything that
    writes; everything else goes through the methods.
    """

    __slots__ = ("buf", "start", "end")

    def __init__(self, buf: Any = b"", start: int = -1) -> None:
        """A run over ``buf`` (the bytes of one read), empty, or starting at ``start``."""
        self.buf = buf
        """The read the run's frames are in (a run never spans two reads)."""
        self.start = start
        """Offset of the run's first byte, -1 while it is empty."""
        self.end = start
        """Offset one past the run's last byte."""

    def extend(self, pos: int, end: int) -> None:
        """Add the frame ``buf[pos:end]``, which follows the run (or starts it)."""
        if self.start < 0:
            self.start = pos
        self.end = end

    def take(self, end: int) -> bytes | memoryview:
        """The run's bytes up to ``end`` (:func:`run_data`); the run is empty afterwards."""
        start = self.start
        self.start = -1
        return run_data(self.buf, start, end)


class Wire:
    """The output of one connection while it handles one input."""

    __slots__ = ("sides", "out", "pending", "run",
                 "amqp_header_sent", "open_sent", "container_id", "client_sealed",
                 "router_sealed")

    def __init__(self, sides: Sides, container_id: str) -> None:
        """Create the output side of a connection.

        Args:
            sides: the connection's states (sending depends on them; Closes change them).
            container_id: container-id of the Opens the proxy synthesizes.
        """
        self.sides = sides
        self.out: list[Command] = []
        """The commands of the input being handled (a new list per input)."""
        self.pending: list[bytes] = []
        """Bytes for the router, queued while its connection is being made."""
        self.run = Run()
        """The client's run of frames forwarded as they came (:meth:`begin_run`)."""
        self.amqp_header_sent = False
        """The client was sent an AMQP protocol header (the router's, or the proxy's own)."""
        self.open_sent = False
        """The client was sent an Open (the router's, or the proxy's own)."""
        self.container_id = container_id
        self.client_sealed = False
        """The proxy wrote its own Close to the client: nothing more is written to it (Part 2
        §2.4.3: no frame follows a Close). A relayed Close does not seal: the router that sent
        it writes nothing after it."""
        self.router_sealed = False
        """The proxy wrote its own Close to the router (as for :attr:`client_sealed`)."""

    # ------------------------------------------------------------------ bytes

    def send(self, side: Side, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` to ``side`` after the run of client bytes accumulated so far.

        To the router: queued while it connects, dropped once it failed, stopped or is gone.
        To the client: dropped once its transport is gone. To either: dropped once the proxy
        wrote its own Close to that leg (:attr:`client_sealed`, :attr:`router_sealed`).
        """
        if self.run.start >= 0:
            self.flush_run()  # earlier frames of the client's run go first
        if side is ROUTER:
            if self.router_sealed:
                return
            router = self.sides.router
            if router not in ROUTER_WRITABLE:
                return
            if router is R_IDLE or router is R_CONNECTING:
                self.pending.append(bytes(data))
                return
        elif self.client_sealed or self.sides.client is C_CLOSED:
            return
        self.out.append(SendData(side, data))

    def begin_run(self, buf: Any) -> Run:
        """Start an empty client run over the read ``buf``; returns the run it replaces (a
        read handled while another is, such as held bytes released by an admission), which
        :meth:`end_run` puts back. What that run holds is written first: the order on the
        wire is the order the frames came in."""
        self.flush_run()
        previous = self.run
        self.run = Run(buf)
        return previous

    def end_run(self, previous: Run) -> None:
        """Write what the current client run holds, then go back to ``previous``."""
        self.flush_run()
        self.run = previous

    def flush_run(self) -> None:
        """Write the accumulated run of client frames to the router."""
        run = self.run
        if run.start >= 0:
            self.send(ROUTER, run.take(run.end))

    def extend_run(self, pos: int, end: int) -> None:
        """Add the client frame ``run.buf[pos:end]`` to the run (forwarded as it came)."""
        self.run.extend(pos, end)

    def take_pending(self) -> bytes:
        """Everything queued for the router while it connected (it is connected now)."""
        data = b"".join(self.pending)
        self.pending.clear()
        return data

    @property
    def router_backlog(self) -> int:
        """Bytes queued for the router while its connection is being made."""
        return sum(map(len, self.pending))

    # ------------------------------------------------------------------ performatives

    def send_close(self, side: Side, err: Error | None) -> None:
        """Send ``side`` a Close (Part 2 §2.7.9) and record it in the Close exchange."""
        self.sides.close_sent(side is CLIENT)
        self.send(side, frame(0, Close(error=err)))
        if side is CLIENT:
            self.client_sealed = True
        else:
            self.router_sealed = True

    def send_open_close(self, err: Error) -> None:
        """QDR's connection denial on the wire: an Open (listener defaults) and then Close.

        The AMQP header goes first when the client has none yet (the router's is then never
        relayed).
        """
        self.open_sent = True
        self.sides.close_sent(True)
        data = frame(0, Open(container_id=self.container_id)) + frame(0, Close(error=err))
        if not self.amqp_header_sent:
            self.amqp_header_sent = True
            data = AMQP_HEADER + data
        self.send(CLIENT, data)
        self.client_sealed = True

    # ------------------------------------------------------------------ the rest

    def close_transport(self, side: Side) -> None:
        """Close ``side``'s transport after what was written before."""
        if self.run.start >= 0:
            self.flush_run()
        self.out.append(CloseTransport(side))

    def emit(self, event: ProxyEvent) -> None:
        """Publish ``event`` (metrics, event log)."""
        self.out.append(Emit(event))
