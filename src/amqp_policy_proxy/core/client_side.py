"""Sans-IO. The client leg: its protocol header, its SASL frames, its Open, and the dispatch of
its AMQP frames to the handlers of :mod:`.sessions` and :mod:`.deliveries`.

What the client's bytes are is decided by its state (:class:`~.state.ClientState`): a protocol
header first; SASL frames, relayed to the router (the sasl-init names the identity the router
will authenticate, :mod:`..amqp.sasl`); then its Open, held with everything pipelined behind it
until the admission decision (:mod:`.admission`); then frames relayed under the group's limits
(:mod:`.fastpath` for those that need no decision). Every client performative the proxy reads is
checked canonically first (:mod:`..amqp.canonical`, decision 0005).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from struct import Struct
from typing import Any

from ..amqp import accel
from ..amqp import constants as C
from ..amqp.canonical import check_performative
from ..amqp.codec import symbol_array
from ..amqp.constants import (
    AMQP_FRAME,
    CLOSE_CODE,
    DISPOSITION_CODE,
    DOFF_UNIT,
    FLOW_CODE,
    FRAME_HEADER_SIZE,
    PROTOCOL_HEADER_FIRST_BYTE,
    PROTOCOL_HEADER_SIZE,
    SASL_FRAME,
    TRANSFER_CODE,
    Condition,
    Descriptor,
    SaslCode,
)
from ..amqp.errors import FramingError, IllegalStateError, NotAllowedError, ResourceLimitError
from ..amqp.framing import check_frame_header
from ..amqp.handshake import OpenHead
from ..amqp.performatives import (
    EMPTY_CLOSE,
    EMPTY_CLOSE_BODIES,
    Close,
    Open,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
    decode_as,
    decode_performative,
)
from ..amqp.sasl import ANONYMOUS_USER, identity_from_sasl_init
from ..amqp.transfer import is_transfer_descriptor
from ..tokens.sasl import MECHANISMS as TOKEN_MECHANISMS
from ..tokens.sasl import TokenCredentials, oauthbearer_error_challenge
from .commands import CLIENT, ROUTER, ConnectRouter, SendData
from .context import Context
from .deliveries import Deliveries
from .events import ConnectionDenyReason, ProtocolViolation, SaslFailed, TokenRefused
from .fastpath import FastPath
from .framebuf import feed
from .leg import Leg
from .sessions import SESSION_HANDLERS, Sessions
from .state import (
    C_AWAIT_AMQP_HEADER,
    C_AWAIT_HEADER,
    C_AWAIT_OPEN,
    C_CLOSING,
    C_DECIDING,
    C_DENIED,
    C_OPENED,
    C_SASL,
    C_UNAVAILABLE,
    CLIENT_AMQP,
    CLIENT_SASL,
    R_CONNECTING,
    ClientState,
)
from .tokenauth import NO_TOKEN, Rejected, check_token, read_token
from .wire import error, frame

logger = logging.getLogger(__name__)

_HDR = Struct(">IBBH")

#: Bytes a client may pipeline behind its Open before the admission decision.
PIPELINED_LIMIT = 4 * 1024 * 1024

_HEADER, _SASL, _AMQP, _NONE = range(4)
#: How the client's bytes are cut in each state (:meth:`ClientSide._mode`; ``UNAVAILABLE``
#: depends on how far SASL went and is looked at there).
_MODE_OF = {
    state: (_AMQP if state in CLIENT_AMQP else _SASL if state in CLIENT_SASL
            else _HEADER if state is C_AWAIT_HEADER else _NONE)
    for state in ClientState
}


def sasl_outcome(code: SaslCode) -> bytes:
    """A sasl-outcome frame with ``code`` (Part 5 §5.3.3.6)."""
    return frame(0, SaslOutcome(code=int(code)), ftype=SASL_FRAME)


#: The outcomes the proxy answers a token client with itself, encoded once.
OUTCOME_OK = sasl_outcome(SaslCode.OK)
OUTCOME_AUTH = sasl_outcome(SaslCode.AUTH)
#: The error challenge of a refused OAUTHBEARER token (RFC 7628 §3.2.2).
BEARER_CHALLENGE = frame(0, SaslChallenge(challenge=oauthbearer_error_challenge()),
                         ftype=SASL_FRAME)
#: The proxy's SASL greeting to a token client it authenticates itself (``token_authority =
#: "proxy"``): the SASL header and the token mechanisms.
TOKEN_GREETING = C.SASL_HEADER + frame(
    0, SaslMechanisms(sasl_server_mechanisms=symbol_array(list(TOKEN_MECHANISMS))),
    ftype=SASL_FRAME)


class ClientSide(Leg):
    """The client leg of one connection."""

    __slots__ = ("open_received", "fast", "held", "open", "open_body")

    def __init__(
        self,
        ctx: Context,
        sessions: Sessions,
        deliveries: Deliveries,
        open_received: Callable[[float], None],
    ) -> None:
        """Nothing received yet; ``open_received(now)`` is called when the client's Open is
        here (the facade decides it)."""
        Leg.__init__(self, ctx, sessions, deliveries)
        self.open_received = open_received
        self.fast = FastPath(ctx, sessions, deliveries, self.amqp_frame)
        self.held = bytearray()
        """Client frames pipelined behind its Open, held until the decision."""
        self.open: Open | OpenHead | None = None
        self.open_body: bytes | None = None
        """The client's Open frame body until its admission is decided."""

    # ------------------------------------------------------------------ bytes in

    def _mode(self) -> int:
        """How the next client bytes are cut, from the client state: ``_HEADER`` (an 8-byte
        protocol header), ``_SASL`` or ``_AMQP`` (frames) or ``_NONE`` (ignore them: closed).
        A client refused for want of an upstream before its SASL finished still sends SASL."""
        state = self.sides.client
        if state is C_UNAVAILABLE:
            ctx = self.ctx
            return _SASL if ctx.sasl_used and not ctx.sasl_ok else _AMQP
        return _MODE_OF[state]

    def data(self, data: bytes, now: float) -> None:
        """Bytes the client sent (any split; frames may span reads)."""
        mode = self._mode()
        if mode == _NONE:
            return
        self.buf = feed(
            self.buf, data, mode != _HEADER, self.ctx.client_frame_limit, self.process, now
        )

    def process(self, buf: Any, start: int, end: int, now: float) -> int:
        """Consume whole units from ``buf[start:end]``; return the offset reached.

        Admitted frames forwarded unchanged accumulate into one run of original bytes,
        written as a single ``SendData`` (flushed before anything else is sent).
        """
        wire = self.wire
        previous = wire.begin_run(buf)
        try:
            pos = self._units(buf, start, end, now)
            if self.sessions.window_pending:
                self.sessions.reopen_windows()  # once per read: see reopen_windows
            return pos
        finally:
            wire.end_run(previous)

    def _units(self, buf: Any, pos: int, end: int, now: float) -> int:
        """Consume whole units (protocol headers, frames) of client bytes from ``buf[pos:end]``.

        Hands the admitted steady state to the fast path and everything else to the per-state
        handlers; returns the offset of the first byte not consumed (a partial unit, or the
        first byte after the state stopped reading).
        """
        sides = self.sides
        ctx = self.ctx
        while pos < end:
            if ctx.token_wait is not None:
                return pos  # the rest waits with the token for the JWKS fetch
            state = sides.client
            if state is C_OPENED:
                # The admitted steady state; returns at a partial frame, a frame it leaves to
                # the general code below, or once the state has changed.
                pos = self.fast.relay(buf, pos, end, now)
                if pos >= end:
                    break
                state = sides.client  # the fast path stops when a frame changed it
            mode = self._mode()
            if mode == _NONE:
                break
            if mode == _HEADER:
                if end - pos < PROTOCOL_HEADER_SIZE:
                    head = bytes(buf[pos:end])
                    if not (
                        C.AMQP_HEADER.startswith(head)
                        or C.SASL_HEADER.startswith(head)
                        or C.TLS_HEADER.startswith(head)
                    ):
                        self._bad_header(now)
                        return end
                    return pos
                self._header(bytes(buf[pos : pos + PROTOCOL_HEADER_SIZE]), now)
                pos += PROTOCOL_HEADER_SIZE
                continue
            if end - pos < FRAME_HEADER_SIZE:
                return pos
            if buf[pos] == PROTOCOL_HEADER_FIRST_BYTE and bytes(buf[pos : pos + 4]) == b"AMQP":
                # a protocol header where a frame would be: only the AMQP header after SASL
                self._header(bytes(buf[pos : pos + PROTOCOL_HEADER_SIZE]), now)
                pos += PROTOCOL_HEADER_SIZE
                continue
            size, doff, ftype, channel = _HDR.unpack_from(buf, pos)
            check_frame_header(size, doff, ftype, self.ctx.client_frame_limit)
            if end - pos < size:
                return pos
            fend = pos + size
            if mode == _SASL:
                self._sasl_frame(buf, pos, doff, ftype, fend, now)
            elif state is C_OPENED or (
                # a Close under way: the client's frames still count while the router leg is
                # open (drain: the client may settle deliveries until it answers the Close);
                # once the proxy closed the router leg itself they have nowhere to go
                state is C_CLOSING
                and not sides.client_close_received()
                and not sides.router_close_sent()
                and self.ctx.opened_at is not None
            ):
                if self.amqp_frame(buf, pos, doff, ftype, channel, fend, now):
                    self.wire.extend_run(pos, fend)
                else:
                    self.wire.flush_run()  # consumed: a run never stretches over it
            else:
                self._preopen_frame(buf, pos, doff, ftype, channel, fend, now)
            pos = fend
        return pos

    # ------------------------------------------------------------------ headers and SASL

    def _bad_header(self, now: float) -> None:
        """Garbage or another protocol: QDR answers with an AMQP header, Open and Close
        ``amqp:connection:framing-error`` ``Unknown protocol detected``."""
        conn = self.ctx
        self.wire.emit(
            ProtocolViolation(
                *conn.who(now),
                side=str(CLIENT),
                condition=str(Condition.CONNECTION_FRAMING_ERROR),
                description=C.UNKNOWN_PROTOCOL,
            )
        )
        conn.close_reason = "protocol_error"
        conn.handshake_deadline = None
        conn.send_open_close(error(Condition.CONNECTION_FRAMING_ERROR, C.UNKNOWN_PROTOCOL))
        self.sides.stop_client()
        self.wire.close_transport(ROUTER)
        self.wire.close_transport(CLIENT)

    def _header(self, header: bytes, now: float) -> None:
        """A protocol header (Part 2 §2.2): SASL or AMQP first, AMQP after SASL.

        Raises:
            FramingError: any other header where one may come.
        """
        sides = self.sides
        state = sides.client
        tokens = self.ctx.tokens
        if state is C_AWAIT_HEADER:
            if header == C.SASL_HEADER:
                self.ctx.sasl_used = True
                sides.to_client(C_SASL)
                if tokens is not None and tokens.proxy:
                    # the proxy authenticates the client itself, and logs in to the router
                    # with its own SASL header (queued until the upstream is up)
                    sides.to_router(R_CONNECTING)
                    self.wire.out.append(ConnectRouter())
                    self.wire.send(CLIENT, TOKEN_GREETING)
                    self.wire.send(ROUTER, header)
                    return
            elif header == C.AMQP_HEADER and tokens is not None:
                self._refuse_token(Rejected(NO_TOKEN, "the client skipped SASL"), "", now)
                return
            elif header == C.AMQP_HEADER:
                # no SASL: user anonymous, as in QDR
                self.ctx.sasl_user = ANONYMOUS_USER
                self.ctx.sasl_ok = True
                sides.to_client(C_AWAIT_OPEN)
            else:
                self._bad_header(now)
                return
            sides.to_router(R_CONNECTING)
            self.wire.out.append(ConnectRouter())
            self.wire.send(ROUTER, header)
            return
        if state in CLIENT_SASL and header == C.AMQP_HEADER:
            if tokens is not None and tokens.proxy:
                if state is not C_AWAIT_AMQP_HEADER:
                    raise FramingError("AMQP header before the sasl-outcome")
                # the proxy answers it: the router's own AMQP header follows its login
                sides.to_client(C_AWAIT_OPEN)
                self.wire.send(CLIENT, header)
                self.wire.amqp_header_sent = True
                return
            sides.to_client(C_AWAIT_OPEN)
            self.wire.send(ROUTER, header)
            return
        if state is C_UNAVAILABLE and header == C.AMQP_HEADER and self.ctx.sasl_ok:
            return  # a token client told there is no upstream right after its outcome
        raise FramingError(f"unexpected protocol header {header!r}")

    def _sasl_frame(self, buf: Any, pos: int, doff: int, ftype: int, fend: int, now: float) -> None:
        """A client SASL frame (Part 5 §5.3): the sasl-init or a sasl-response.

        The sasl-init names the identity the router will authenticate; a client asking for
        another authorization identity is refused with the outcome ``auth`` and its sasl-init
        never reaches the router. Both frames are accepted only in canonical form. With no
        upstream reachable the sasl-init is answered ``sys-temp``.

        Raises:
            FramingError: an AMQP or empty frame during SASL.
            IllegalStateError: a second sasl-init, or another SASL frame.
            DecodeError: not canonical, or a malformed initial response.
        """
        if ftype != SASL_FRAME:
            raise FramingError("AMQP frame during SASL negotiation")
        body = pos + doff * DOFF_UNIT
        if body == fend:
            raise FramingError("empty frame during SASL negotiation")
        init = accel.read_sasl_init(buf, body, fend)  # plain encodings, no decode
        if init is None:
            code, _, _ = check_performative(buf, body, fend)
            if code == Descriptor.SASL_INIT:
                perf = decode_as(memoryview(buf)[body:fend], SaslInit)
                init = (str(perf.mechanism or ""), perf.initial_response)
            elif code != Descriptor.SASL_RESPONSE:
                raise IllegalStateError(f"client sent {Descriptor(code).name} during SASL")
        if self.ctx.tokens is not None:
            self._token_sasl_frame(init, buf, pos, fend, now)
            return
        if init is not None:
            ctx = self.ctx
            if ctx.sasl_user is not None or ctx.sasl_init_seen:
                raise IllegalStateError("second sasl-init")
            ctx.sasl_init_seen = True
            ctx.sasl_mechanism = init[0]
            identity = identity_from_sasl_init(*init, tls_identity=ctx.tls_subject)
            if identity.impersonates:
                self._refuse_impersonation(identity.user, identity.authzid, now)
                return
            user = identity.user
            if user is not None and identity.asserted:
                # the name the upstream's authenticator records (decision 0007)
                canonical = ctx.naming.identity(user)
                if canonical is None:
                    self._refuse_identity(user, now)
                    return
                user = canonical
            ctx.sasl_user = user
            if self.sides.client is C_UNAVAILABLE:
                self.answer_unavailable()
                return
        self.wire.send(ROUTER, bytes(buf[pos:fend]))

    # ------------------------------------------------------------------ token connections

    def _token_sasl_frame(self, init: tuple[str, Any] | None, buf: Any, pos: int, fend: int,
                          now: float) -> None:
        """A SASL frame of a token connection (:mod:`.tokenauth`): the sasl-init's token is
        validated by the proxy (``proxy``: then answered by it; ``upstream``: then relayed
        to the router, which must accept it too); a sasl-response is the dummy answer to the
        proxy's error challenge, or (``upstream``) relayed to the router.

        Raises:
            IllegalStateError: a second sasl-init, or a sasl-response the proxy did not ask
                for (``proxy``).
        """
        ctx = self.ctx
        tokens = ctx.tokens
        assert tokens is not None
        if init is None:  # a sasl-response
            refusal = ctx.token_refusal
            if refusal is not None:
                self._token_outcome_auth()
                return
            if tokens.proxy or not ctx.sasl_init_seen:
                raise IllegalStateError("sasl-response without a challenge")
            self.wire.send(ROUTER, bytes(buf[pos:fend]))
            return
        if ctx.sasl_init_seen:
            raise IllegalStateError("second sasl-init")
        ctx.sasl_init_seen = True
        ctx.sasl_mechanism = init[0]
        if self.sides.client is C_UNAVAILABLE:
            self.answer_unavailable()
            return
        try:
            bearer = read_token(init[0], init[1])
        except Rejected as exc:
            self._refuse_token(exc, init[0], now)
            return
        self.token_attempt(bearer, None if tokens.proxy else bytes(buf[pos:fend]), now)

    def token_attempt(self, bearer: TokenCredentials, raw: bytes | None, now: float, *,
                      again: bool = False) -> None:
        """Validate a sasl-init's token: accepted, the client is answered ``ok``
        (``proxy``) or its sasl-init ``raw`` goes to the router (``upstream``); refused, it
        gets the outcome ``auth``. A token with a ``kid`` the keys lack waits for the JWKS
        fetch it asks for (once: ``again`` is the retry after it)."""
        ctx = self.ctx
        tokens = ctx.tokens
        assert tokens is not None
        try:
            check = check_token(tokens, bearer, now, now + ctx.wall_offset)
        except Rejected as exc:
            if exc.unknown_kid and not again and tokens.keys.unknown_kid(exc.kid, now):
                ctx.token_wait = (bearer, raw)
                return
            self._refuse_token(exc, bearer.mechanism, now)
            return
        ctx.token = check
        ctx.sasl_user = check.identity.user
        if tokens.proxy:
            ctx.sasl_ok = True
            self.sides.to_client(C_AWAIT_AMQP_HEADER)
            self.wire.send(CLIENT, OUTCOME_OK)
        else:
            assert raw is not None
            self.wire.send(ROUTER, raw)

    def keys_changed(self, now: float) -> None:
        """The JWKS fetch a waiting token asked for is over (keys or not): validate it again
        (refused now if its ``kid`` is still unknown), then go on with what the client sent
        meanwhile."""
        ctx = self.ctx
        wait, ctx.token_wait = ctx.token_wait, None
        if wait is None:
            return
        if self.sides.client is C_UNAVAILABLE:
            self.answer_unavailable()
            return
        self.token_attempt(*wait, now, again=True)
        if self.buf and self._mode() != _NONE:
            kept, self.buf = bytes(self.buf), bytearray()
            self.data(kept, now)

    def _refuse_token(self, exc: Rejected, mechanism: str, now: float) -> None:
        """Refuse a token connection (docs/oauth2.md): one log line (never the token), the
        ``TokenRefused`` event (the rejections counter) and the ``sasl_failed`` record with the
        reason; the router gets nothing of the sasl-init and its leg is closed. The client
        gets the outcome ``auth`` (code 1), after the JSON error challenge and its dummy
        response for OAUTHBEARER (RFC 7628 §3.2.2); one that skipped SASL gets the SASL
        header (the only protocol offered) and is closed."""
        ctx = self.ctx
        wire = self.wire
        ctx.close_reason = "denied"
        ctx.handshake_deadline = None
        ctx.sasl_recorded = True
        logger.info("[%s] DENY SASL token, rhost '%s', mechanism %s: %s", ctx.conn_id,
                    ctx.remote_host, ascii(mechanism[:32]) if mechanism else "(none)", exc)
        who = ctx.who(now)
        wire.emit(TokenRefused(*who, mechanism=mechanism, reason=exc.reason))
        wire.emit(SaslFailed(*who, mechanism=mechanism, reason=exc.reason,
                             code=int(SaslCode.AUTH)))
        wire.pending.clear()
        self.sides.stop_router()
        wire.close_transport(ROUTER)
        if not ctx.sasl_used:
            self.sides.stop_client()
            wire.send(CLIENT, C.SASL_HEADER)
            wire.close_transport(CLIENT)
        elif mechanism.upper() == "OAUTHBEARER" and exc.reason != NO_TOKEN:
            ctx.token_refusal = exc
            ctx.linger(now)  # the client has this long to send its dummy response
            wire.send(CLIENT, BEARER_CHALLENGE)
        else:
            self._token_outcome_auth()

    def _token_outcome_auth(self) -> None:
        """The outcome ``auth`` of a refused token, and the end of the client leg."""
        self.ctx.token_refusal = None
        self.sides.stop_client()
        self.wire.send(CLIENT, OUTCOME_AUTH)
        self.wire.close_transport(CLIENT)

    def answer_unavailable(self) -> None:
        """No upstream authenticated the client: sasl-outcome ``sys-temp``, then close."""
        self.ctx.token_wait = None
        self.sides.stop_client()
        self.wire.send(CLIENT, sasl_outcome(SaslCode.SYS_TEMP))
        self.wire.close_transport(CLIENT)

    def _refuse_identity(self, user: str, now: float) -> None:
        """The client's identity is not one the upstream's authenticator records as sent
        (``Naming.identity``: whitespace Cyrus SASL trims under ``identity = "strict"``, a
        control character): sasl-outcome ``auth`` (code 1), nothing to the router, both
        transports closed; counted as a connection denied (``identity``)."""
        conn = self.ctx
        conn.user = user
        conn.close_reason = "denied"
        conn.handshake_deadline = None
        logger.info(
            "[%s] DENY SASL for user %s, rhost '%s': the upstream's authenticator would "
            "record another name (identity %s)",
            conn.conn_id, ascii(user), conn.remote_host, conn.naming.identity_mode,
        )
        conn.refuse_unopened(ConnectionDenyReason.IDENTITY, "sasl-outcome auth", now)
        wire = self.wire
        wire.pending.clear()
        wire.out.append(SendData(CLIENT, sasl_outcome(SaslCode.AUTH)))
        wire.close_transport(ROUTER)
        wire.close_transport(CLIENT)

    def _refuse_impersonation(self, user: str | None, authzid: str | None, now: float) -> None:
        """The client asks to act as ``authzid`` while authenticating as ``user``.

        The router (proton with Cyrus) would authenticate ``user`` and accept any authzid, so
        the proxy refuses the exchange itself: sasl-outcome ``auth`` (code 1) to the client,
        nothing of the sasl-init to the router, both transports closed; counted as a
        connection denied for ``authzid``.
        """
        conn = self.ctx
        conn.user = user
        conn.close_reason = "denied"
        conn.handshake_deadline = None
        logger.info(
            "[%s] DENY SASL for user '%s', rhost '%s': authorization identity '%s' "
            "differs from the authenticated identity",
            conn.conn_id,
            user,
            conn.remote_host,
            authzid,
        )
        conn.refuse_unopened(ConnectionDenyReason.AUTHZID, "sasl-outcome auth", now)
        wire = self.wire
        wire.pending.clear()
        wire.out.append(SendData(CLIENT, sasl_outcome(SaslCode.AUTH)))
        wire.close_transport(ROUTER)
        wire.close_transport(CLIENT)

    # ------------------------------------------------------------------ before the decision

    def _preopen_frame(
        self, buf: Any, pos: int, doff: int, ftype: int, channel: int, fend: int, now: float
    ) -> None:
        """A client AMQP frame before its admission: the Open (decided at once), frames
        pipelined behind it (held), or frames after a refusal (only its Close matters).

        Raises:
            FramingError: a SASL frame after SASL, or an Open on a channel other than 0.
            ResourceLimitError: more than 4 MiB pipelined behind the Open.
            IllegalStateError: something else than an Open first.
            DecodeError: an Open that is not canonical.
        """
        if ftype != AMQP_FRAME:
            raise FramingError("SASL frame after SASL negotiation")
        state = self.sides.client
        if state in (C_DENIED, C_UNAVAILABLE, C_CLOSING):
            self._after_close_frame(buf, pos, doff, fend)
            return
        if state is C_DECIDING:  # pipelined behind the Open: held until the decision
            self.held += buf[pos:fend]
            if len(self.held) > PIPELINED_LIMIT:
                raise ResourceLimitError("too much data pipelined before the Open decision")
            return
        body = pos + doff * DOFF_UNIT
        if body == fend:
            return  # heartbeat before Open: nothing to relay yet
        raw = bytes(buf[body:fend])
        # the fields admission needs, read from the plain encoding without a decode
        perf: Open | OpenHead | None = accel.read_open_head(raw)
        if perf is None:
            check_performative(raw, 0, len(raw))
            decoded, _ = decode_performative(raw)
            if not isinstance(decoded, Open):
                raise IllegalStateError(f"expected Open, got {type(decoded).__name__}")
            perf = decoded
        if channel != 0:
            raise FramingError("Open on a channel other than 0")
        self.open = perf
        self.open_body = raw
        self.sides.to_client(C_DECIDING)
        self.open_received(now)

    def _after_close_frame(self, buf: Any, pos: int, doff: int, fend: int) -> None:
        """A frame after the client was refused or sent its Close: consumed; its Close ends
        the exchange (the transports close)."""
        body = pos + doff * DOFF_UNIT
        if body == fend:
            return
        code = is_transfer_descriptor(buf, body, fend)
        sides = self.sides
        if code == Descriptor.OPEN and sides.client is C_UNAVAILABLE:
            return
        if code == Descriptor.CLOSE:
            sides.close_received(True)
            self.wire.close_transport(CLIENT)
            if sides.client is C_CLOSING:
                self.wire.close_transport(ROUTER)

    def release_held(self, now: float) -> None:
        """The Open was approved: process what the client pipelined behind it."""
        held = bytes(self.held)
        self.held.clear()
        if held:
            self.process(held, 0, len(held), now)

    # ------------------------------------------------------------------ admitted frames

    def amqp_frame(
        self, buf: Any, pos: int, doff: int, ftype: int, channel: int, fend: int, now: float
    ) -> bool:
        """Handle one admitted client frame; True means "forward its original bytes".

        Raises:
            FramingError: a SASL frame. NotAllowedError: a Flow or Disposition on a channel
            never begun. IllegalStateError: a performative the client may not send.
            DecodeError: not canonical.
        """
        if ftype != AMQP_FRAME:
            raise FramingError("SASL frame after SASL negotiation")
        body = pos + doff * DOFF_UNIT
        if body == fend:
            return True  # heartbeat
        sessions = self.sessions
        code = is_transfer_descriptor(buf, body, fend)
        if code == TRANSFER_CODE:
            self.ctx.figures.transfers_in += 1
            forward = self.deliveries.client_transfer(buf, body, channel, fend, now)
            session = sessions.sessions.get(channel)
            if session is not None and sessions.window_frames is not None:
                sessions.window_pending.add(session)
            return forward
        if code == DISPOSITION_CODE:
            if channel in sessions.denied_sessions:
                return False
            session = sessions.sessions.get(channel)
            if session is None:
                raise NotAllowedError(f"disposition on channel {channel} that was never begun")
            if session.numbering is None and session.inserted is None:
                return True
        if code == FLOW_CODE:
            session = sessions.sessions.get(channel)
            if session is None:
                if channel in sessions.denied_sessions:
                    return False
                raise NotAllowedError(f"flow on channel {channel} that was never begun")
            if (not session.denied_handles and not session.dropped_transfers
                    and session.shaping is None and not session.revoked_handles
                    and session.proxy_links is None and not session.inserted_transfers):
                return True
        if code == CLOSE_CODE and bytes(buf[body:fend]) in EMPTY_CLOSE_BODIES:
            perf: Any = EMPTY_CLOSE
        else:
            # what the proxy decides on must be what the router reads (decision 0005)
            check_performative(buf, body, fend)
            perf, _ = decode_performative(memoryview(buf)[body:fend])
        entry = _HANDLERS.get(type(perf))
        if entry is None:
            raise IllegalStateError(f"unexpected {type(perf).__name__} from client")
        in_sessions, handler = entry
        handler(self.sessions if in_sessions else self, perf, bytes(buf[pos:fend]), channel, now)
        return False

    def on_second_open(self, perf: Any, raw: bytes, channel: int, now: float) -> None:
        """A second Open (Part 2 §2.4.1 allows one).

        Raises:
            IllegalStateError: always.
        """
        raise IllegalStateError("second Open")

    def on_decoded_transfer(self, perf: Any, raw: bytes, channel: int, now: float) -> None:
        """A Transfer that only the general decoder recognised (a symbolic descriptor).

        Raises:
            DecodeError: always (never reached: the canonical check refuses it first).
        """
        raise IllegalStateError("transfer with a non-standard descriptor encoding")

    def on_close(self, perf: Close, raw: bytes, channel: int, now: float) -> None:
        """The client's Close (Part 2 §2.7.9): the answer to the proxy's Close ends the
        connection; otherwise it is relayed and the router's answer awaited (bounded by the
        linger time)."""
        conn = self.ctx
        sides = self.sides
        wire = self.wire
        sides.close_received(True)
        if conn.close_reason is None:
            conn.close_reason = "client_close"
        if sides.client_close_sent():
            # the client answers a Close it was sent (shutdown, oversize, the router's): done
            wire.close_transport(CLIENT)
            if not sides.router_close_sent():
                wire.send_close(ROUTER, None)
            if sides.router_close_received():
                wire.close_transport(ROUTER)
            return
        if sides.client is C_OPENED:
            sides.to_client(C_CLOSING)
        sides.close_sent(False)
        conn.linger(now)  # bounded wait for the router's answer
        wire.send(ROUTER, raw)


#: Every performative an admitted client may send: type -> (handled by :class:`Sessions`?,
#: the handler); any other is an ``amqp:illegal-state``. One table per class (see
#: ``router_side._HANDLERS``).
_HANDLERS: dict[type, tuple[bool, Callable[..., None]]] = {
    **{kind: (True, client) for kind, (client, _) in SESSION_HANDLERS.items()},
    Close: (False, ClientSide.on_close),
    Open: (False, ClientSide.on_second_open),
    Transfer: (False, ClientSide.on_decoded_transfer),
}
