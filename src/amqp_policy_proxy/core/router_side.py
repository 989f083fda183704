"""Sans-IO. The router leg: its protocol headers and SASL frames, relayed to the client; its
AMQP frames, held until the client's Open is decided and then relayed, the few that policy
rewrites going through a dispatch table (Open, Begin, Attach, Flow, Detach, End, Close).

The router is the authentication authority (decision 0001): its sasl-outcome is what makes the
client's claimed identity trusted. Its frames are trusted as the router's: they are decoded
only where the proxy rewrites or maps them, and forwarded as their original bytes otherwise,
in runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from struct import Struct
from typing import Any

from ..amqp import accel
from ..amqp import constants as C
from ..amqp.codec import symbol_array
from ..amqp.constants import (
    AMQP_FRAME,
    CLOSE_CODE,
    DESCRIBED,
    DISPOSITION_CODE,
    DOFF_UNIT,
    FLOW_CODE,
    FRAME_HEADER_SIZE,
    OPEN_CODE,
    PROTOCOL_HEADER_SIZE,
    SASL_FRAME,
    SMALLULONG,
    TRANSFER_CODE,
    UINT_MAX,
)
from ..amqp.errors import FramingError, IllegalStateError
from ..amqp.framing import check_frame_header, encode_frame, frame_header_ok
from ..amqp.handshake import (
    OpenHead,
    patch_open,
    sasl_outcome_code,
)
from ..amqp.performatives import (
    EMPTY_CLOSE,
    EMPTY_CLOSE_BODIES,
    Close,
    Disposition,
    Open,
    SaslMechanisms,
    SaslOutcome,
    decode_as,
    decode_performative,
)
from ..amqp.transfer import (
    is_transfer_descriptor,
    read_transfer_fields,
    transfer_with_delivery_id,
)
from .commands import CLIENT, ROUTER
from .context import PRE_OPEN_FRAME_LIMIT, ROUTER_FRAME_LIMIT, Context
from .deliveries import Deliveries
from .eligibility import refresh_router
from .framebuf import feed
from .leg import Leg
from .numbering import disposition_to_client, inserted_disposition, note_router_flow_bytes
from .sessions import SESSION_HANDLERS, Sessions
from .state import (
    C_AWAIT_AMQP_HEADER,
    C_CLOSING,
    C_OPENED,
    C_SASL,
    R_AMQP,
    R_AWAIT_AMQP_HEADER,
    R_AWAIT_HEADER,
    R_CLOSED,
    R_FAILED,
    R_LOGIN,
    R_SASL,
    R_STOPPED,
)
from .wire import Run, frame

_HDR = Struct(">IBBH")

_U32 = Struct(">I")
#: The mechanisms the proxy offers when it must answer a SASL client itself (no upstream):
#: enough for any client to go on to its sasl-init, which is answered ``sys-temp``.
FALLBACK_MECHANISMS = ("ANONYMOUS", "PLAIN")
#: How much of the router's SASL greeting reached the client (``RouterSide.sasl_relayed``).
SASL_HEADER_RELAYED = 1
SASL_MECHANISMS_RELAYED = 2
SASL_OUTCOME_RELAYED = 3


#: The mechanism names of the sasl-mechanisms frames routers sent, by frame body (the proxy's
#: own login reads the same frame from every connection of a router).
_MECHANISMS: dict[bytes, tuple[str, ...]] = {}


def _mechanism_names(perf: SaslMechanisms) -> tuple[str, ...]:
    """The upper-case mechanism names of a sasl-mechanisms (a symbol or an array of them)."""
    offered: Any = perf.sasl_server_mechanisms
    if offered is not None and not isinstance(offered, str | list | tuple):
        offered = getattr(offered, "elements", [offered])  # a symbol array
    return tuple(str(m).upper() for m in (
        offered if isinstance(offered, list | tuple) else [offered]) if m is not None)


class RouterSide(Leg):
    """The router leg of one connection."""

    __slots__ = ("held", "open_seen", "sasl_relayed", "login_done", "login_failed")

    def __init__(self, ctx: Context, sessions: Sessions, deliveries: Deliveries,
                 login_done: Callable[[float], None] | None = None,
                 login_failed: Callable[[str, float], None] | None = None) -> None:
        """No upstream yet. ``login_done(now)`` is called when the router accepted the
        proxy's service identity, ``login_failed(why, now)`` when it did not (token
        connections of ``token_authority = "proxy"``)."""
        Leg.__init__(self, ctx, sessions, deliveries)
        self.login_done = login_done
        self.login_failed = login_failed

        self.held: list[bytes] = []
        """Router AMQP frames received before the client's Open was decided."""
        self.open_seen = False
        self.sasl_relayed = 0
        """``SASL_HEADER_RELAYED``, ``SASL_MECHANISMS_RELAYED``, ``SASL_OUTCOME_RELAYED``."""

    def greeting_missing(self) -> bytes:
        """What the client still lacks of a SASL greeting (header, mechanisms) when the proxy
        must answer it itself: nothing of what the router already relayed is repeated."""
        data = b""
        tokens = self.ctx.tokens
        if tokens is not None and tokens.proxy:
            return data  # the proxy's own greeting went to the client at its SASL header
        if self.sasl_relayed < SASL_HEADER_RELAYED:
            data += C.SASL_HEADER
        if self.sasl_relayed < SASL_MECHANISMS_RELAYED:
            data += frame(
                0,
                SaslMechanisms(sasl_server_mechanisms=symbol_array(list(FALLBACK_MECHANISMS))),
                ftype=SASL_FRAME,
            )
        return data

    def sasl_unfinished(self) -> bool:
        """The router has not relayed a sasl-outcome yet."""
        return self.sasl_relayed < SASL_OUTCOME_RELAYED

    def authenticating(self) -> bool:
        """The router has not finished authenticating yet: the client's relayed SASL, or
        the proxy's own login (``token_authority = "proxy"``)."""
        ctx = self.ctx
        tokens = ctx.tokens
        if tokens is not None and tokens.proxy:
            return not ctx.service_ok
        return ctx.sasl_used and not ctx.sasl_ok and self.sasl_relayed < SASL_OUTCOME_RELAYED

    # ------------------------------------------------------------------ bytes in

    def data(self, data: bytes, now: float) -> None:
        """Bytes the router sent (any split)."""
        state = self.sides.router
        if state in (R_STOPPED, R_CLOSED, R_FAILED):
            return
        framed = state is R_SASL or state is R_AMQP or state is R_LOGIN
        limit = PRE_OPEN_FRAME_LIMIT if state is not R_AMQP else self.ctx.router_frame_limit
        self.buf = feed(self.buf, data, framed, limit, self.process, now)

    def process(self, buf: Any, pos: int, end: int, now: float) -> int:
        """Consume whole units of router bytes from ``buf[pos:end]``; return where it ended."""
        sides = self.sides
        while pos < end:
            state = sides.router
            if state is R_AMQP:
                # router frames go straight to the client once it is admitted (OPENED) or its
                # Close is under way (CLOSING); before that they are held
                client = sides.client
                if client is C_OPENED or client is C_CLOSING:
                    return self.relay(buf, pos, end, now)
                pos = self._hold(buf, pos, end)
                break
            if state is R_AWAIT_HEADER or state is R_AWAIT_AMQP_HEADER:
                if end - pos < PROTOCOL_HEADER_SIZE:
                    break
                self._header(bytes(buf[pos : pos + PROTOCOL_HEADER_SIZE]), now)
                pos += PROTOCOL_HEADER_SIZE
                continue
            if (state is not R_SASL and state is not R_LOGIN) or end - pos < FRAME_HEADER_SIZE:
                break
            size, doff, ftype, _channel = _HDR.unpack_from(buf, pos)
            check_frame_header(size, doff, ftype, PRE_OPEN_FRAME_LIMIT)
            if end - pos < size:
                break
            fend = pos + size
            if state is R_LOGIN:
                self._login_frame(buf, pos, doff, ftype, fend, now)
            else:
                self._sasl_frame(buf, pos, doff, ftype, fend, now)
            pos = fend
        return pos

    def _header(self, header: bytes, now: float) -> None:
        """The router's protocol header, relayed to the client.

        Raises:
            FramingError: not the SASL header (before SASL) or the AMQP header.
        """
        sides = self.sides
        tokens = self.ctx.tokens
        if tokens is not None and tokens.proxy:
            # the proxy's own login: nothing of it is relayed to the client
            if header == C.SASL_HEADER and sides.router is R_AWAIT_HEADER:
                sides.to_router(R_LOGIN)
            elif header == C.AMQP_HEADER and sides.router is R_AWAIT_AMQP_HEADER:
                sides.to_router(R_AMQP)
            elif self.login_failed is not None:
                self.login_failed(f"the router answered the SASL header with {header!r}", now)
            return
        if header == C.SASL_HEADER and sides.router is R_AWAIT_HEADER:
            sides.to_router(R_SASL)
            self.sasl_relayed = SASL_HEADER_RELAYED
        elif header == C.AMQP_HEADER:
            sides.to_router(R_AMQP)
            self.wire.amqp_header_sent = True
        else:
            raise FramingError(f"unexpected protocol header from upstream {header!r}")
        self.wire.send(CLIENT, header)

    def _sasl_frame(self, buf: Any, pos: int, doff: int, ftype: int, fend: int,
                    now: float) -> None:
        """A router SASL frame (Part 5 §5.3.3), relayed; its sasl-outcome ``ok`` makes the
        client's claimed identity trusted, any other is on record (:class:`SaslFailed`).

        Raises:
            FramingError: an AMQP frame during SASL.
        """
        if ftype != SASL_FRAME:
            raise FramingError("AMQP frame during SASL negotiation")
        body = pos + doff * DOFF_UNIT
        if body < fend:
            code = sasl_outcome_code(buf, body, fend)  # plain encodings, no decode
            if code is None:
                if accel.is_sasl_mechanisms(buf, body, fend):
                    self.sasl_relayed = SASL_MECHANISMS_RELAYED
                else:
                    perf, _ = decode_performative(memoryview(buf)[body:fend])
                    if isinstance(perf, SaslOutcome):
                        code = 0 if perf.code is None else int(perf.code)
                    elif isinstance(perf, SaslMechanisms):
                        self.sasl_relayed = SASL_MECHANISMS_RELAYED
            if code is not None:
                self.sasl_relayed = SASL_OUTCOME_RELAYED
                if code == 0:
                    self.ctx.sasl_ok = True
                    if self.sides.client is C_SASL:
                        self.sides.to_client(C_AWAIT_AMQP_HEADER)
                else:
                    self.ctx.sasl_failed(C.SASL_OUTCOMES.get(code, "sys"), code, now)
                self.sides.to_router(R_AWAIT_AMQP_HEADER)
        self.wire.send(CLIENT, bytes(buf[pos:fend]))

    def _login_frame(self, buf: Any, pos: int, doff: int, ftype: int, fend: int,
                     now: float) -> None:
        """A router SASL frame of the proxy's own login (``token_authority = "proxy"``). The
        proxy's SASL header, sasl-init and AMQP header went to the router pipelined, at once
        (``ProxyConnection.router_connected``): its mechanisms must offer the service
        identity's mechanism, its outcome ``ok`` lets the Open be decided; anything else ends
        the login as failed. Nothing is relayed to the client.

        Raises:
            FramingError: an AMQP frame during SASL.
        """
        if ftype != SASL_FRAME:
            raise FramingError("AMQP frame during SASL negotiation")
        body = pos + doff * DOFF_UNIT
        if body == fend:
            return
        ctx = self.ctx
        login = ctx.service_login
        failed = self.login_failed
        assert failed is not None
        code = sasl_outcome_code(buf, body, fend)  # plain encodings, no decode
        if code is None:
            raw = bytes(buf[body:fend])
            names = _MECHANISMS.get(raw)
            if names is None:
                perf, _ = decode_performative(raw)
                if isinstance(perf, SaslOutcome):
                    code = 0 if perf.code is None else int(perf.code)
                elif isinstance(perf, SaslMechanisms):
                    names = _mechanism_names(perf)
                    if len(_MECHANISMS) < 64:  # a router sends the same few every time
                        _MECHANISMS[raw] = names
                else:
                    failed(f"unexpected {type(perf).__name__} during the login", now)
                    return
            if names is not None:
                if login is None:
                    failed("no service identity is configured for this upstream", now)
                elif login.mechanism not in names:
                    failed(f"the router offers {', '.join(names) or 'no mechanism'}, not "
                           f"{login.mechanism}", now)
                # else: its sasl-init went out already, pipelined (router_connected)
                return
        assert code is not None  # (a mechanisms frame returned above)
        if code == 0:
            self.sides.to_router(R_AWAIT_AMQP_HEADER)
            ctx.service_ok = True  # (the proxy's AMQP header went with its sasl-init)
            if self.login_done is not None:
                self.login_done(now)
        else:
            failed(f"sasl-outcome {C.SASL_OUTCOMES.get(code, 'sys')} ({code}) for "
                   f"{login.mechanism if login else '?'} "
                   f"'{login.username if login else ''}'", now)

    def _hold(self, buf: Any, pos: int, end: int) -> int:
        """Hold whole router frames until the client's Open is decided."""
        while end - pos >= FRAME_HEADER_SIZE:
            size, doff, ftype, _channel = _HDR.unpack_from(buf, pos)
            check_frame_header(size, doff, ftype, ROUTER_FRAME_LIMIT, AMQP_FRAME)
            if end - pos < size:
                break
            self.held.append(bytes(buf[pos : pos + size]))
            pos += size
        return pos

    def release_held(self, now: float) -> None:
        """The Open was approved: relay what the router sent meanwhile (its Open, usually)."""
        held = b"".join(self.held)
        self.held.clear()
        if held:
            pos = self.relay(held, 0, len(held), now)
            if pos < len(held):
                self.buf[:0] = held[pos:]

    # ------------------------------------------------------------------ relaying

    def relay(self, buf: Any, pos: int, end: int, now: float) -> int:
        """Relay admitted router frames in ``buf[pos:end]``; runs of untouched frames go as
        one write. Returns the offset of the first unconsumed byte.

        Raises:
            FramingError: a frame header that breaks the rule, or a SASL frame.
            IllegalStateError: a second Open.
        """
        run = Run(buf, pos)  # the router's run: buf[run.start:pos], frames relayed as they came
        ctx = self.ctx
        limit = ctx.router_frame_limit
        unpack = _HDR.unpack_from
        wire = self.wire
        sides = self.sides
        deliveries = self.deliveries
        rules = deliveries.rules
        sessions = self.sessions
        figures = ctx.figures
        shaped = sessions.shaping is not None  # set at admission, never while relaying
        scan = accel.scan_router
        while end - pos >= FRAME_HEADER_SIZE and sides.router is R_AMQP:
            if scan is not None and sessions.router_fast:  # (.eligibility)
                # nothing here looks at Transfers or Dispositions: the C walker passes the
                # run of them (and heartbeats) up to the first other frame
                pos, passed = scan(buf, pos, end, limit)
                figures.transfers_out += passed
                if end - pos < FRAME_HEADER_SIZE:
                    break
            size, doff, ftype, channel = unpack(buf, pos)
            if not frame_header_ok(size, doff, ftype, limit):
                check_frame_header(size, doff, ftype, limit, AMQP_FRAME)
            if end - pos < size:
                break
            fend = pos + size
            body = pos + doff * DOFF_UNIT
            if body == fend:
                pos = fend
                continue
            if fend - body >= 3 and buf[body] == DESCRIBED and buf[body + 1] == SMALLULONG:
                code = buf[body + 2]  # is_transfer_descriptor's common case, inline
            else:
                code = is_transfer_descriptor(buf, body, fend)
            if code == TRANSFER_CODE:
                figures.transfers_out += 1
                if shaped or sessions.count_router_transfers:
                    session = sessions.router_sessions.get(channel)
                    if session is not None:
                        session.transfers_out += 1
                if sessions.inserting:
                    replacement = self._inserted_transfer(buf, body, fend, channel)
                    if replacement is not None:
                        if pos > run.start:
                            wire.send(CLIENT, run.take(pos))
                        wire.send(CLIENT, replacement)
                        run.start = fend
                        pos = fend
                        continue
                if rules.topic_receivers or sessions.reads_replies:
                    replacement = deliveries.router_transfer(buf, pos, body, fend, channel, now)
                    if replacement is not None:
                        if pos > run.start:
                            wire.send(CLIENT, run.take(pos))
                        wire.send(CLIENT, replacement)
                        run.start = fend
                pos = fend
                continue
            if code == DISPOSITION_CODE:
                session = sessions.router_sessions.get(channel) if sessions.renumbering else None
                if session is None or (session.numbering is None and session.inserted is None):
                    pos = fend
                    continue
            if code == FLOW_CODE:
                session = sessions.router_sessions.get(channel)
                if session is None or (
                    not session.dropped_transfers and sessions.window_frames is None
                    and session.shaping is None and not session.inserted_transfers
                ):
                    if session is not None and session.tracks_router:
                        note_router_flow_bytes(session, buf, body, fend)
                    pos = fend
                    continue
            # a frame the proxy looks at: flush the run before it
            if pos > run.start:
                wire.send(CLIENT, run.take(pos))
            perf: Any = None
            if code == CLOSE_CODE and bytes(buf[body:fend]) in EMPTY_CLOSE_BODIES:
                perf = EMPTY_CLOSE
            elif code == OPEN_CODE:
                # relayed as it came (or patched): read what the proxy needs from its bytes
                perf = accel.read_open_head(bytes(buf[body:fend]), strict=False)
            if perf is None:
                perf, _ = decode_performative(memoryview(buf)[body:fend])
            raw = bytes(buf[pos:fend])
            entry = _HANDLERS.get(type(perf))
            if entry is None:
                replacement = raw  # relayed untouched
            else:
                in_sessions, handler = entry
                replacement = handler(self.sessions if in_sessions else self, perf, raw,
                                      channel, now)
            if replacement:
                wire.send(CLIENT, replacement)
            pos = run.start = fend
        if pos > run.start and sides.router is R_AMQP:
            wire.send(CLIENT, run.take(pos))
        return pos

    def on_open(self, perf: Open | OpenHead, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Open (Part 2 §2.7.1), relayed with the group's limits applied: its
        max-frame-size lowered to ``maxFrameSize``, its channel-max to ``maxSessions - 1``;
        ``maxSessionWindow`` becomes a window in frames of the max-frame-size in force. In
        shadow mode nothing is rewritten (the sessions over ``maxSessions`` are reported). The
        session denials of Begins pipelined behind the client's Open follow it.

        Raises:
            IllegalStateError: a second Open.
        """
        if self.open_seen:
            raise IllegalStateError("second Open from upstream")
        self.open_seen = True
        ctx = self.ctx
        sessions = self.sessions
        changes: dict[str, Any] = {}
        group = ctx.group
        mfs = UINT_MAX if perf.max_frame_size is None else int(perf.max_frame_size)
        cmax = C.DEFAULT_CHANNEL_MAX if perf.channel_max is None else int(perf.channel_max)
        if group is not None and not group.shadow:  # shadow: the Open as the router sent it
            if group.max_frame_size:
                new = max(C.MIN_MAX_FRAME_SIZE, min(mfs, group.max_frame_size))
                if new != mfs:
                    changes["max_frame_size"] = mfs = new
            if sessions.policy_channel_max is not None:
                new = min(cmax, sessions.policy_channel_max)
                if new != cmax:
                    changes["channel_max"] = cmax = new
            if group.max_session_window:
                sessions.window_frames = max(1, group.max_session_window // mfs)
                sessions.count_router_transfers = True
                refresh_router(sessions)
        ctx.client_frame_limit = max(C.MIN_MAX_FRAME_SIZE, mfs)
        sessions.advertised_channel_max = cmax
        self.wire.open_sent = True
        data = raw
        if changes:
            patched = patch_open(raw[raw[4] * DOFF_UNIT :], **changes,
                                 fields=perf.fields if isinstance(perf, OpenHead) else None)
            if patched is not None:
                data = encode_frame(0, patched)
            else:
                # read from bytes, yet not patchable: decoded
                whole = perf if isinstance(perf, Open) else decode_as(raw[raw[4] * DOFF_UNIT :],
                                                                       Open)
                data = frame(0, dataclasses.replace(whole, **changes))
        if sessions.early_denials:  # session denials that had to wait for this Open
            data += b"".join(sessions.early_denials)
            sessions.early_denials.clear()
        return data

    def on_disposition(self, perf: Disposition, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Disposition on a session that withheld client deliveries: its outcome
        for them in the client's numbering (:func:`.numbering.disposition_to_client`)."""
        session = self.sessions.router_sessions.get(channel)
        if session is None:
            return raw
        if session.numbering is not None:
            raw = disposition_to_client(session.numbering, perf, raw, channel)
        if session.inserted is not None and raw:
            raw = inserted_disposition(session.inserted, perf, raw, channel, from_client=False)
        return raw

    def _inserted_transfer(self, buf: Any, body: int, fend: int, channel: int) -> bytes | None:
        """A router Transfer on a session with deliveries of the proxy's own: its
        delivery-id in the client's numbering (:class:`.numbering.InsertedNumbering`); None
        when its bytes need no change."""
        session = self.sessions.router_sessions.get(channel)
        if session is None or session.inserted is None:
            return None
        fields = read_transfer_fields(buf, body, fend)
        new = session.inserted.router_transfer(fields.handle, fields.delivery_id, fields.more,
                                               fields.aborted)
        if new is None or new == fields.delivery_id:
            return None
        return transfer_with_delivery_id(buf, body, fend, channel, new)

    def on_close(self, perf: Close, raw: bytes, channel: int, now: float) -> bytes | None:
        """The router's Close: relayed to the client (whose answer is awaited for the linger
        time), or the answer to a Close the proxy sent (then the router transport closes)."""
        conn = self.ctx
        sides = self.sides
        sides.close_received(False)
        if sides.client_close_sent():
            # the client already has the proxy's Close (shutdown/oversize)
            if sides.client_close_received() or sides.client is C_CLOSING:
                self.wire.close_transport(ROUTER)
            return None
        if conn.close_reason is None:
            conn.close_reason = "broker_close"
        sides.close_sent(True)
        if sides.client is C_OPENED:
            sides.to_client(C_CLOSING)
        # a client that never answers (half-open) must not hold its counts forever
        conn.linger(now)
        return raw


#: The router performatives the proxy looks at: type -> (handled by :class:`Sessions`?, the
#: handler); the others are relayed untouched. One table per class: bound handlers in a dict
#: per connection cost over 1 KiB of each idle connection.
_HANDLERS: dict[type, tuple[bool, Callable[..., bytes | None]]] = {
    **{kind: (True, router) for kind, (_, router) in SESSION_HANDLERS.items() if router},
    Open: (False, RouterSide.on_open),
    OpenHead: (False, RouterSide.on_open),
    Disposition: (False, RouterSide.on_disposition),
    Close: (False, RouterSide.on_close),
}
