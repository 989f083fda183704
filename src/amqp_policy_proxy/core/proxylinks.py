"""Sans-IO. The links the proxy answers itself: in-band token renewal on a live token
connection (docs/oauth2.md "Renewal"), CBS ``put-token`` on ``$cbs`` and RabbitMQ 4.1's
``PUT /auth/tokens`` on ``/management`` (:mod:`..tokens.renewal`).

A token connection's Attach to one of those nodes (a sender to it, a receiver from it) never
reaches the router, which does not know them: the proxy answers the Attach itself on a handle
kept back from the router (decision 0003, the reserve link denials use), gives the request
link credit, receives and settles (``accepted``) each request, decides the renewal
(:func:`~..tokens.renewal.renew`) and sends the reply on the paired receiver link. The session
stays the router's, so every number the proxy's frames take is renumbered on the router's
frames (decision 0002 and :mod:`.numbering`): the requests are withheld client deliveries
(their delivery-ids and transfer-ids), the replies are deliveries the router never sent
(:class:`~.numbering.InsertedNumbering`, and ``SessionRecord.inserted_transfers`` in Flows).

A reply link may not be attached on a session where the client already receives from the
router (the router's delivery-ids there were never read, so the proxy cannot number its own
after them): it is refused with ``amqp:precondition-failed``; attach the renewal links first
or on a session of their own.

In front of RabbitMQ (``[[upstream]] kind = "rabbitmq"``) ``/management`` is the broker's own
node, so its links go to the broker; with ``token_authority = "upstream"`` the broker holds the
connection's token and renews it on ``PUT /auth/tokens``. There the proxy reads the pair
instead of answering it (decision 0008): each request is looked at on its first frame
(:meth:`ProxyLinks.broker_request`); a renewal the proxy refuses never reaches the broker (the
delivery is withheld and rejected, ``amqp:unauthorized-access``); one it accepts is forwarded
as it came and remembered by its ``message-id``; the broker's answer on the reply link
(:meth:`ProxyLinks.broker_reply`, the reply's ``correlation-id``) decides: ``204`` puts the
connection under the new identity, anything else changes nothing. With ``token_authority =
"proxy"`` the broker knows the proxy's service identity, not the client's token: a renewal there
is refused (renew on ``$cbs``, which the proxy answers in front of every router).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..amqp.accel import read_head
from ..amqp.constants import UINT_MAX, Condition
from ..amqp.errors import ResourceLimitError
from ..amqp.performatives import Accepted, Attach, Detach, Disposition, Flow, Source, Target
from ..amqp.performatives import Transfer as TransferPerf
from ..tokens.claims import TokenIdentity
from ..tokens.renewal import (
    BAD_REQUEST,
    CBS_NODE,
    HTTP_NO_CONTENT,
    MANAGEMENT_NODE,
    RenewalOutcome,
    RenewalRequestError,
    answer_auth_tokens,
    answer_cbs,
    auth_tokens_response,
    cbs_response,
    parse_auth_tokens_put,
    parse_cbs_put_token,
    renew,
)
from ..tokens.sections import MAX_MESSAGE_BYTES, MessageError, decode_message
from .commands import CLIENT
from .context import Context, Room
from .eligibility import refresh_router
from .events import TokenRenewed
from .numbering import InsertedNumbering
from .records import ProxyLink, SessionRecord
from .wire import error, frame

logger = logging.getLogger(__name__)

#: The nodes the proxy answers on a token connection.
NODES = frozenset({CBS_NODE, MANAGEMENT_NODE})
#: The link-credit the proxy gives a request link (topped up after each request).
REQUEST_CREDIT = 16
#: Replies kept per reply link while the client gives no credit (older ones are dropped).
MAX_PENDING = 16
#: The description of a refused reply link (see the module text).
REPLY_LINK_REFUSED = ("the token renewal reply link must be attached before any receiver "
                      "link on its session")
#: ``TokenRenewed.result`` values (the ``result`` label of the renewals metric).
ACCEPTED, REFUSED, BAD = "accepted", "refused", "bad_request"
#: The refusal reason of a renewal whose new groups would not admit the connection.
GROUPS_DENIED = "groups_denied"
#: The refusal reason of a forwarded renewal the broker did not answer ``204``.
UPSTREAM_REFUSED = "upstream_refused"
#: The refusal reason of a ``PUT /auth/tokens`` to a broker that does not hold the token.
NOT_UPSTREAM = "not_upstream_authority"
#: Forwarded renewals waiting for the broker's answer, per connection (older ones dropped).
MAX_FORWARDED = 16
#: The rejection's description of a renewal request the proxy refused (broker's pair).
RENEWAL_REFUSED = "token renewal refused"

Renewed = Callable[[TokenIdentity, float], str | None]
"""The facade's part of an accepted renewal: put the connection under the new identity (its
groups re-checked, its links re-checked, its deadline moved); returns None, or why the new
identity is refused (it changes nothing then)."""


def node_of(ctx: Context, address: str | None) -> str | None:
    """The node the proxy answers for an Attach's ``address`` on this connection, or None
    (not a token connection, or another address). ``/management`` is RabbitMQ's own node in
    front of RabbitMQ (``[[upstream]] kind = "rabbitmq"``: queues, exchanges, bindings, and
    its own ``/auth/tokens``): its links go to the broker, read there
    (:func:`reads_broker_renewals`)."""
    if ctx.token is None or address not in NODES or reads_broker_renewals(ctx, address):
        return None
    return address


def reads_broker_renewals(ctx: Context, address: str | None) -> bool:
    """Whether a link to or from ``address`` is one of RabbitMQ's own ``/management`` pair on
    a token connection: its requests (a sender) or replies (a receiver) are read for renewals
    (:meth:`ProxyLinks.broker_request`, :meth:`ProxyLinks.broker_reply`)."""
    return (ctx.token is not None and address == MANAGEMENT_NODE
            and ctx.naming.kind == "rabbitmq")


def is_token_put(to: str | None, method: str | None) -> bool:
    """Whether an HTTP-over-AMQP request with properties ``to`` and ``subject`` ``method`` may
    be a token renewal as the broker reads it: ``PUT`` in any case, and a path whose segments,
    percent-decoded and compared without case, empty ones left out, are ``auth``, ``tokens``.
    Wider than the broker's own match on purpose: what could be a renewal is treated as one
    (and must then be exactly ``PUT /auth/tokens``, or it is refused)."""
    if to is None or method is None or method.upper() != "PUT":
        return False
    path = unquote(to)
    return [part.lower() for part in path.split("/") if part] == ["auth", "tokens"]


class ProxyLinks(Room):
    """The links of one connection that the proxy answers itself."""

    __slots__ = ("sessions", "renewed", "forwarded")

    def __init__(self, ctx: Context, sessions: Any) -> None:
        """For the connection ``ctx`` and its ``sessions`` (:class:`.sessions.Sessions`,
        which owns this room: typed ``Any`` so that the two modules do not import each
        other); :attr:`renewed` is set by the facade."""
        Room.__init__(self, ctx)
        self.sessions = sessions
        self.renewed: Renewed | None = None
        self.forwarded: dict[tuple[type, Any], TokenIdentity] = {}
        """Renewals forwarded to the broker (``/management`` of RabbitMQ), by the request's
        ``message-id`` (its type and value): the identity each puts in force on ``204``."""

    # ------------------------------------------------------------------ links

    def attach(self, session: SessionRecord, perf: Attach, handle: int, is_sender: bool,
               node: str, now: float) -> None:
        """Answer the client's Attach of a link to (``is_sender``) or from ``node``.

        Raises:
            ResourceLimitError: no reserved handle is left (the connection closes).
        """
        sessions = self.sessions
        reply_handle = session.reserved_handles.take()
        if reply_handle is None:
            raise ResourceLimitError("no handle left for the proxy's links")
        if not is_sender and session.had_receivers and session.inserted is None:
            reply = Attach(name=perf.name, handle=reply_handle, role=False, source=Source(),
                           target=Target(), initial_delivery_count=0)
            detach = Detach(handle=reply_handle, closed=True,
                            error=error(Condition.PRECONDITION_FAILED, REPLY_LINK_REFUSED))
            session.denied_handles[handle] = reply_handle
            sessions.reply_on_session(session, frame(0, reply), frame(0, detach))
            return
        target = perf.target
        source = perf.source
        address = getattr(source if is_sender else target, "address", None)
        link = ProxyLink(perf.name, handle, reply_handle, is_sender, node,
                         None if address is None else str(address))
        if session.proxy_links is None:
            session.proxy_links = {}
        session.proxy_links[handle] = link
        # the router's session state is kept from here on: the proxy's Flows carry it
        session.tracks_router = sessions.count_router_transfers = True
        if is_sender:
            answer = Attach(name=perf.name, handle=reply_handle, role=True,
                            snd_settle_mode=perf.snd_settle_mode,
                            rcv_settle_mode=perf.rcv_settle_mode,
                            source=source if source is not None else Source(),
                            target=Target(address=node))
        else:
            mode = perf.snd_settle_mode
            link.settle_first = mode is None or int(mode) != 0
            answer = Attach(name=perf.name, handle=reply_handle, role=False,
                            snd_settle_mode=mode, rcv_settle_mode=perf.rcv_settle_mode,
                            source=Source(address=node),
                            target=target if target is not None else Target(),
                            initial_delivery_count=0)
            if session.inserted is None:
                session.inserted = InsertedNumbering()
                sessions.renumbering = True  # the router's Dispositions are read
        refresh_router(sessions)
        sessions.reply_on_session(session, frame(0, answer))
        if is_sender and session.router_channel is not None:
            self._credit(session, link)

    def session_ready(self, session: SessionRecord) -> None:
        """The router's Begin reached the client (its Attach answers went out): give the
        request links their credit and send what waited."""
        for link in list((session.proxy_links or {}).values()):
            if link.is_sender:
                self._credit(session, link)
            else:
                self._send_pending(session, link)

    def detach(self, session: SessionRecord, link: ProxyLink, perf: Detach) -> None:
        """The client detached a proxy link: answered, its handle free again."""
        assert session.proxy_links is not None
        del session.proxy_links[link.handle]
        link.gone = True
        self.sessions.reply_on_session(
            session, frame(0, Detach(handle=link.reply_handle, closed=perf.closed)))
        session.reserved_handles.give_back(link.reply_handle)

    def flow(self, session: SessionRecord, link: ProxyLink, perf: Flow) -> None:
        """The client's Flow for a proxy link: credit for the replies (a receiver link);
        nothing to do for a request link (the proxy gives that credit)."""
        if link.is_sender or perf.link_credit is None:
            return
        count = link.delivery_count if perf.delivery_count is None else int(perf.delivery_count)
        link.credit = max(0, (count + int(perf.link_credit) - link.delivery_count) & UINT_MAX)
        if link.credit > REQUEST_CREDIT * 1024:
            link.credit = REQUEST_CREDIT * 1024
        self._send_pending(session, link)
        if perf.drain and link.credit:
            link.delivery_count = (link.delivery_count + link.credit) & UINT_MAX
            link.credit = 0
            self._link_flow(session, link, drain=True)
        elif perf.echo:
            self._link_flow(session, link)

    # ------------------------------------------------------------------ requests

    def transfer(self, session: SessionRecord, link: ProxyLink, buf: Any, payload: int,
                 fend: int, delivery_id: int | None, settled: bool, more: bool,
                 aborted: bool, now: float) -> None:
        """A client Transfer on a request link (already withheld from the router by the
        caller): the request's bytes; once whole, its answer."""
        if not link.in_delivery:
            link.in_delivery = True
            link.payload = bytearray()
            link.delivery_id = delivery_id
            link.delivery_settled = settled
        elif settled:
            link.delivery_settled = True
        if len(link.payload) <= MAX_MESSAGE_BYTES:
            link.payload += buf[payload:fend]
        if more and not aborted:
            return
        link.in_delivery = False
        data, link.payload = bytes(link.payload), bytearray()
        frames = []
        if not link.delivery_settled and link.delivery_id is not None:
            frames.append(frame(0, Disposition(role=True, first=link.delivery_id, settled=True,
                                               state=Accepted())))
        link.delivery_count = (link.delivery_count + 1) & UINT_MAX
        if frames:
            self.sessions.reply_on_session(session, *frames)
        self._credit(session, link)
        if not aborted:
            self._request(session, link, data, now)

    def _request(self, session: SessionRecord, link: ProxyLink, data: bytes,
                 now: float) -> None:
        """Decide one whole request and send its reply."""
        ctx = self.ctx
        cbs = link.node == CBS_NODE
        try:
            request: Any = (parse_cbs_put_token(data) if cbs else parse_auth_tokens_put(data))
        except RenewalRequestError as exc:
            self._record(BAD, BAD_REQUEST_REASON, exc.description, link.node, now)
            if exc.message_id is None:
                return  # nothing to correlate an answer with
            reply = (cbs_response(exc.message_id, exc.reply_to, exc.status_code,
                                  exc.description) if cbs else
                     auth_tokens_response(exc.message_id, exc.status_code, exc.description))
            self._reply(session, link.node, exc.reply_to, reply)
            return
        tokens = ctx.tokens
        token = ctx.token
        assert tokens is not None and token is not None
        wall = now + ctx.wall_offset
        outcome = renew(token.identity, request.token, config=tokens.config,
                        keys=tokens.keys.keys(now), now=wall)
        if outcome.accepted and self.renewed is not None:
            why = self.renewed(outcome.identity, now)
            if why is not None:
                outcome = RenewalOutcome(False, token.identity, None, why)
        if outcome.accepted:
            self._record(ACCEPTED, "", "", link.node, now)
        else:
            reason = GROUPS_DENIED if outcome.reason is None else outcome.reason.value
            self._record(REFUSED, reason, outcome.detail, link.node, now)
        reply = answer_cbs(request, outcome) if cbs else answer_auth_tokens(request, outcome)
        self._reply(session, link.node, request.reply_to, reply)

    def _record(self, result: str, reason: str, detail: str, node: str, now: float) -> None:
        """The renewal's log line (never the token) and its event."""
        ctx = self.ctx
        if result == ACCEPTED:
            token = ctx.token
            left = 0.0 if token is None else token.identity.expires_at - now - ctx.wall_offset
            logger.info("[%s] token renewed on %s for user '%s', rhost '%s': expires in %.0f s",
                        ctx.conn_id, node, ctx.user, ctx.remote_host, left)
        else:
            logger.info("[%s] token renewal on %s refused for user '%s', rhost '%s': %s",
                        ctx.conn_id, node, ctx.user, ctx.remote_host, detail)
        self.wire.emit(TokenRenewed(*ctx.who(now), node=node, result=result, reason=reason))

    # ------------------------------------------------------------------ the broker's pair

    def broker_request(self, buf: Any, payload: int, fend: int, more: bool,
                       now: float) -> bool:
        """The first frame of a client delivery to RabbitMQ's own ``/management``
        (:func:`reads_broker_renewals`), its message at ``buf[payload:fend]``: False refuses it
        (the caller withholds and rejects the delivery), True forwards it.

        A request that is not a renewal (:func:`is_token_put`) goes on. A renewal must be whole
        in this frame and exactly ``PUT /auth/tokens`` with a ``message-id`` and a token the
        proxy accepts (:func:`~..tokens.renewal.renew`: same subject, an ``exp`` no earlier),
        on a connection whose broker holds the token (``token_authority = "upstream"``); then
        it is forwarded and remembered until the broker answers (:meth:`broker_reply`).
        Every refusal is counted (``TokenRenewed``) and logged without the token.

        Raises:
            DecodeError: the message head is not canonical.
        """
        head = read_head(buf, payload, fend, last=not more, subject=True)
        if not head.complete:  # (only a delivery of more frames)
            self._record(BAD, BAD_REQUEST_REASON, "a request's properties must fit its first "
                         "frame", MANAGEMENT_NODE, now)
            return False
        if not is_token_put(head.to, head.subject):
            return True
        if more:
            self._record(BAD, BAD_REQUEST_REASON, "a token renewal must fit one frame",
                         MANAGEMENT_NODE, now)
            return False
        try:
            request = parse_auth_tokens_put(bytes(buf[payload:fend]))
        except RenewalRequestError as exc:
            self._record(BAD, BAD_REQUEST_REASON, exc.description, MANAGEMENT_NODE, now)
            return False
        ctx = self.ctx
        tokens = ctx.tokens
        token = ctx.token
        assert tokens is not None and token is not None
        if tokens.authority != "upstream":
            self._record(REFUSED, NOT_UPSTREAM, "the broker does not hold this connection's "
                         "token (token_authority proxy): renew on $cbs", MANAGEMENT_NODE, now)
            return False
        key = (type(request.message_id), request.message_id)
        if key in self.forwarded:
            self._record(BAD, BAD_REQUEST_REASON, "a renewal with this message-id is already "
                         "waiting for the broker's answer", MANAGEMENT_NODE, now)
            return False
        outcome = renew(token.identity, request.token, config=tokens.config,
                        keys=tokens.keys.keys(now), now=now + ctx.wall_offset)
        if not outcome.accepted:
            reason = GROUPS_DENIED if outcome.reason is None else outcome.reason.value
            self._record(REFUSED, reason, outcome.detail, MANAGEMENT_NODE, now)
            return False
        self.forwarded[key] = outcome.identity
        while len(self.forwarded) > MAX_FORWARDED:
            del self.forwarded[next(iter(self.forwarded))]
        return True

    def broker_reply(self, buf: Any, payload: int, fend: int, more: bool, now: float) -> None:
        """The first frame of a delivery from RabbitMQ's own ``/management`` to the client,
        its message at ``buf[payload:fend]``: the broker's answer to a forwarded renewal (its
        ``correlation-id`` that renewal's ``message-id``) puts the connection under the new
        identity when it is ``204`` (its groups re-checked by the facade), else changes
        nothing. The first answer with an id settles it (the broker answers a link's requests
        in order). Anything else, or a reply that spans frames, is relayed and not read."""
        forwarded = self.forwarded
        if not forwarded or more:
            return
        try:
            message = decode_message(buf[payload:fend])
        except MessageError:
            return
        props = message.properties
        if props is None:
            return
        mid = props.correlation_id
        identity = forwarded.pop((type(mid), mid), None)
        if identity is None:
            return
        if props.subject != str(HTTP_NO_CONTENT):
            self._record(REFUSED, UPSTREAM_REFUSED, f"the broker answered "
                         f"{str(props.subject)[:16]!r}", MANAGEMENT_NODE, now)
            return
        why = None if self.renewed is None else self.renewed(identity, now)
        if why is not None:
            self._record(REFUSED, GROUPS_DENIED, why, MANAGEMENT_NODE, now)
            return
        self._record(ACCEPTED, "", "", MANAGEMENT_NODE, now)

    # ------------------------------------------------------------------ replies

    def _reply(self, session: SessionRecord, node: str, reply_to: str | None,
               message: bytes) -> None:
        """Send ``message`` on the client's reply link for ``node``: on ``session`` first (the
        one whose target is ``reply_to``, else any), else on another session."""
        candidates: list[tuple[int, SessionRecord, ProxyLink]] = []
        for other in [session, *self.sessions.sessions.values()]:
            for link in (other.proxy_links or {}).values():
                if link.is_sender or link.node != node or link.gone:
                    continue
                rank = (0 if other is session else 2) + (0 if link.address == reply_to else 1)
                candidates.append((rank, other, link))
        if not candidates:
            logger.info("[%s] token renewal reply on %s dropped: no reply link", self.ctx.conn_id,
                        node)
            return
        _, where, link = min(candidates, key=lambda c: c[0])
        link.pending.append(message)
        del link.pending[:-MAX_PENDING]
        self._send_pending(where, link)

    def _send_pending(self, session: SessionRecord, link: ProxyLink) -> None:
        """Send the replies waiting on ``link`` as far as its credit goes."""
        channel = session.router_channel
        numbering = session.inserted
        if channel is None or numbering is None or session.router_ended or session.client_ended:
            return
        out = []
        while link.pending and link.credit > 0:
            message = link.pending.pop(0)
            delivery_id = numbering.insert()
            tag = struct.pack(">I", link.delivery_count)
            perf = TransferPerf(handle=link.reply_handle, delivery_id=delivery_id,
                                delivery_tag=tag, message_format=0,
                                settled=True if link.settle_first else None)
            out.append(frame(channel, perf, message))
            link.delivery_count = (link.delivery_count + 1) & UINT_MAX
            link.credit -= 1
            session.inserted_transfers += 1
        if out:
            self.wire.send(CLIENT, b"".join(out))

    def _credit(self, session: SessionRecord, link: ProxyLink) -> None:
        """Give a request link :data:`REQUEST_CREDIT` from its delivery-count on."""
        if session.router_channel is None:
            return
        self._link_flow(session, link, credit=REQUEST_CREDIT)

    def _link_flow(self, session: SessionRecord, link: ProxyLink, *, credit: int | None = None,
                   drain: bool = False) -> None:
        """A Flow for a proxy link with the router's session state in the client's
        numbering (as :func:`.numbering.credit_back` computes it)."""
        channel = session.router_channel
        if channel is None:
            return
        next_in = session.client_next_out + session.transfers_in
        if self.sessions.window_frames is not None:
            end = session.client_window_end
        else:
            end = session.router_window_end + session.dropped_transfers
        flow = Flow(
            next_incoming_id=next_in & UINT_MAX,
            incoming_window=min(max(0, end - next_in), UINT_MAX),
            next_outgoing_id=(session.router_next_out + session.transfers_out
                              + session.inserted_transfers) & UINT_MAX,
            outgoing_window=session.router_out_window,
            handle=link.reply_handle,
            delivery_count=link.delivery_count,
            link_credit=link.credit if credit is None else credit,
            drain=True if drain else None,
        )
        self.wire.send(CLIENT, frame(channel, flow))


#: The ``reason`` of a request that could not be acted on.
BAD_REQUEST_REASON = "bad_request"
__all__ = ["ACCEPTED", "BAD", "BAD_REQUEST", "NODES", "REFUSED", "RENEWAL_REFUSED", "ProxyLinks",
           "is_token_put", "node_of", "reads_broker_renewals"]
