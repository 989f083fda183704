"""Sans-IO. The relay's hot path: admitted client frames that need no decision.

An admitted client mostly sends Transfers on a sender link, whole deliveries or the frames of a
multi-frame one, within ``maxMessageSize``, with no per-message rule to apply, and heartbeats.
Those only extend the *run* (the slice of original bytes forwarded in one write,
:class:`~.wire.Wire`); once the first Transfer's link is known, the optional C scanner
(:mod:`..amqp.accel`) passes it and the frames after it that are more of the same, carrying the
link's delivery in progress (the state the general Transfer handler keeps,
:meth:`.records.LinkRecord.carry`). Every other frame (another performative, the first frame of
a delivery on an inspected link, a denied or shaped link, an aborted Transfer, a delivery over
``maxMessageSize``, a frame header the general loop must judge) goes to the general handlers
(:mod:`.client_side`, :mod:`.deliveries`), so the behaviour is the same with or without this
path, and with or without the C scanner (the property tests run all three).
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any

from ..amqp import accel
from ..amqp.constants import (
    DESCRIBED,
    DOFF_UNIT,
    FRAME_HEADER_SIZE,
    SMALLULONG,
    TRANSFER_CODE,
)
from ..amqp.framing import PROTOCOL_HEADER_MIN_SIZE, frame_header_ok
from .context import Context
from .deliveries import Deliveries
from .eligibility import FAST, FAST_USER_ID, NOT_FAST
from .sessions import Sessions
from .state import C_OPENED

_HDR = Struct(">IBBH")
#: A size of this or more may be a protocol header ("AMQP" read as a size): never a run frame.
_RUN_FRAME_LIMIT = PROTOCOL_HEADER_MIN_SIZE - 1
#: "No maxMessageSize" for the C scanner (which takes a signed 64-bit limit).
_NO_SIZE_LIMIT = -1

GeneralHandler = Callable[[Any, int, int, int, int, int, float], bool]
"""``handler(buf, pos, doff, ftype, channel, frame_end, now) -> forward its bytes?``: the
general handler of an admitted client frame (``ClientSide.amqp_frame``)."""


class FastPath:
    """The hot loop of one connection's admitted client frames."""

    __slots__ = ("ctx", "sessions", "deliveries", "general")

    def __init__(
        self, ctx: Context, sessions: Sessions, deliveries: Deliveries, general: GeneralHandler
    ) -> None:
        """The fast path of ``ctx``; ``general`` handles every frame it does not."""
        self.ctx = ctx
        self.sessions = sessions
        self.deliveries = deliveries
        self.general = general

    def relay(self, buf: Any, pos: int, end: int, now: float) -> int:
        """Relay admitted client frames from ``buf[pos:end]`` while the client is OPENED.

        Returns:
            The offset of the first unconsumed byte: a partial frame, a frame whose header the
            general loop must look at (it raises what is wrong with it, or reads a protocol
            header), or the frame after one that changed the client's state.
        """
        ctx = self.ctx
        all_sessions = self.sessions
        sessions = all_sessions.sessions
        deliveries = self.deliveries
        general = self.general
        wire = ctx.wire
        sides = ctx.sides
        limit = min(ctx.client_frame_limit, _RUN_FRAME_LIMIT)
        rules = deliveries.rules
        max_size = rules.max_message_size
        scan_max = _NO_SIZE_LIMIT if max_size is None else max_size
        uid_scan = rules.scan_user_id
        window = all_sessions.window_frames
        unpack = _HDR.unpack_from
        read_fields = accel.read_fields
        scan = accel.scan  # the C scanner of plain Transfer runs, or None (accel.use)
        run = wire.run  # held in locals while no frame needs a decision (.wire.Run)
        run_start, run_end = run.start, run.end
        transfers = 0
        try:
            while end - pos >= FRAME_HEADER_SIZE:
                size, doff, ftype, channel = unpack(buf, pos)
                if not frame_header_ok(size, doff, ftype, limit):
                    break
                fend = pos + size
                if fend > end:
                    break
                body = pos + doff * DOFF_UNIT
                if body == fend:  # heartbeat
                    if run_start < 0:
                        run_start = pos
                    run_end = pos = fend
                    continue
                if (
                    fend - body > 3
                    and buf[body] == DESCRIBED
                    and buf[body + 1] == SMALLULONG
                    and buf[body + 2] == TRANSFER_CODE
                ):
                    transfers += 1
                    session = sessions.get(channel)
                    f = None
                    link = None
                    if session is not None and session.fast:
                        # (a session that withheld a delivery renumbers every Transfer after
                        # it: the general handler does, and the scanner never sees them)
                        f = read_fields(buf, body, fend)
                        link = session.links.get(f.handle)
                        n = 0  # Transfers passed from this one on
                        # Transfer frames the client may still send (maxSessionWindow); the
                        # frame past the window takes the general handler, which refuses it
                        left = 1 if window is None else (all_sessions.window_left(session) or 0)
                        if link is not None and (not link.is_sender or link.client_detached):
                            link = None  # link: the client's attached sender link, else None
                        # the link's features decided once (.eligibility); the delivery in
                        # progress and this frame decide here
                        fast = NOT_FAST if link is None else link.fast
                        if (
                            link is not None
                            and fast
                            and not f.aborted
                            and not (link.in_delivery and link.discarding)
                        ):
                            if scan is not None:
                                # the C scanner passes this frame and the ones after it on the
                                # same link that need no decision (and heartbeats), carrying
                                # the link's delivery in progress; with QDR's user-id check as
                                # the link's one per-message rule, it passes the whole
                                # deliveries whose plain head has the user's user-id
                                npos, n, delivery = scan(
                                    buf, pos, end, limit, channel, f.handle, scan_max,
                                    uid_scan if fast == FAST_USER_ID else None,
                                    (link.delivery_bytes, link.delivery_id,
                                     link.delivery_settled) if link.in_delivery else None,
                                )
                                if window is not None and n > left:
                                    n = 0  # the window ends inside the run: frame by frame
                                if n:
                                    if delivery is not None or link.in_delivery:
                                        link.carry(delivery)
                                    if run_start < 0:
                                        run_start = pos
                                    pos = npos
                            if (not n and fast == FAST and not link.in_delivery and not f.more
                                    and (max_size is None or fend - f.payload_offset <= max_size)
                                    and left > 0):
                                # no scanner, or a frame it leaves to Python: a whole delivery
                                # that needs no decision is forwarded as it came (the frames
                                # of a multi-frame one take the general handler below)
                                if run_start < 0:
                                    run_start = pos
                                pos = fend
                                n = 1
                            if n:
                                transfers += n - 1  # this frame was counted above
                                session.transfers_in += n
                                run_end = pos
                                if window is not None:
                                    all_sessions.window_pending.add(session)
                                continue
                    # a decision, a denial or an error: the general Transfer handler
                    run.start, run.end = run_start, run_end
                    if f is not None and link is not None and session is not None:
                        # a sender link's Transfer (its lookups done above)
                        session.transfers_in += 1
                        if window is not None:
                            all_sessions.check_window(session)
                        forward = deliveries.sender_transfer(session, link, buf, body, fend, now,
                                                            f)
                    else:
                        forward = deliveries.client_transfer(buf, body, channel, fend, now, f)
                    if session is not None and window is not None:
                        all_sessions.window_pending.add(session)
                else:
                    run.start, run.end = run_start, run_end
                    forward = general(buf, pos, doff, ftype, channel, fend, now)
                run_start, run_end = run.start, run.end
                if forward:
                    if run_start < 0:
                        run_start = pos
                    run_end = fend
                elif run_start >= 0:
                    # consumed (a refused delivery, a frame for a denied link): the run is
                    # one contiguous slice, so it ends before this frame
                    wire.flush_run()
                    run_start, run_end = run.start, run.end
                pos = fend
                if sides.client is not C_OPENED:
                    break
        finally:
            run.start, run.end = run_start, run_end
            ctx.figures.transfers_in += transfers
        return pos
