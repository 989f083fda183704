"""Sans-IO. Deliveries: the per-message rules on client Transfers, and the topic filter on the
router's.

Client to router: each delivery is counted across its frames against ``maxMessageSize``, and
its first frame goes through the per-message checks on links that need them (``user-id`` when
``allowUserIdProxy`` is false, the anonymous-relay ``to``, router annotations, a topic
publisher's ``to``). A refused delivery never reaches the router, not even as an aborted
Transfer: its frames are dropped and the session's later delivery-ids, Flows and Dispositions
are renumbered (:mod:`.numbering`, decision 0002); the client gets QDR's answer (``rejected``
for a relay or user-id violation; rejected, detach and Close for an oversize message).

Router to client, on connections with topic-filtered receivers: a delivery a wildcard subscriber
may not see is replaced by payload-less frames that abort it, and ``durable`` is cleared for a
subscriber without the persistent authority (decision 0004).
"""

from __future__ import annotations

import logging
from typing import Any

from ..amqp import constants as C
from ..amqp.accel import read_head
from ..amqp.constants import UINT_MAX, Condition
from ..amqp.errors import (
    DecodeError,
    IllegalStateError,
    InvalidFieldError,
    NotAllowedError,
    UnattachedHandleError,
)
from ..amqp.message import cleared_durable_byte, durable_flag_offset
from ..amqp.performatives import Accepted, Detach, Disposition, Rejected, Transfer
from ..amqp.transfer import (
    TransferFields,
    delivery_tag_at,
    read_transfer_fields,
    transfer_with_delivery_id,
)
from ..policy.reasons import DenialKind, MessageDenyReason
from .commands import CLIENT, ROUTER
from .context import Context, Room
from .eligibility import refresh_router, refresh_session
from .events import MessageDenied
from .numbering import DeliveryNumbering, credit_back
from .proxylinks import RENEWAL_REFUSED
from .records import LinkRecord, ProxyLink, SessionRecord
from .rules import MessageRules
from .sessions import Sessions
from .shadow import DENY, SHADOW_DENY, in_shadow, shadowed
from .state import C_CLOSING, C_OPENED
from .wire import error, frame

logger = logging.getLogger(__name__)

#: ``LinkRecord.discard_reason`` of a delivery not discarded: its size denial was already
#: let through by shadow mode (reported once per delivery, not once per frame).
_SHADOWED_SIZE = "shadowed:message_size"


class Deliveries(Room):
    """The deliveries of one connection, both directions."""

    __slots__ = ("sessions", "rules")

    def __init__(self, ctx: Context, sessions: Sessions, rules: MessageRules) -> None:
        """The deliveries of the connection ``ctx``, on its ``sessions``, under ``rules``."""
        Room.__init__(self, ctx)
        self.sessions = sessions
        self.rules = rules

    # ------------------------------------------------------------------ client Transfers

    def client_transfer(
        self,
        buf: Any,
        body: int,
        channel: int,
        fend: int,
        now: float,
        fields: TransferFields | None = None,
    ) -> bool:
        """Handle one client Transfer (Part 2 §2.7.5); True means "forward its bytes".

        ``fields``: the Transfer's :class:`~..amqp.transfer.TransferFields` when the caller read
        them already.

        Raises:
            NotAllowedError: a channel never begun, or a Transfer where the client receives.
            UnattachedHandleError: a handle not attached. IllegalStateError: after Detach.
            DecodeError: a Transfer or message head that is not canonical.
            WindowViolationError: a Transfer past the incoming-window the client was given
                (``maxSessionWindow``, :meth:`.flows.SessionFlows.check_window`).
        """
        sessions = self.sessions
        session = sessions.sessions.get(channel)
        if session is None:
            if channel in sessions.denied_sessions:
                return False
            raise NotAllowedError(f"transfer on channel {channel} that was never begun")
        if fields is None:
            fields = read_transfer_fields(buf, body, fend)
        handle = fields.handle
        session.transfers_in += 1
        sessions.check_window(session)
        link = session.links.get(handle)
        if link is None:
            plinks = session.proxy_links
            if plinks is not None and handle in plinks:
                return self._proxy_transfer(session, plinks[handle], buf, fields, fend, now)
            if handle in session.denied_handles:
                # pipelined on a link the proxy denied: dropped, and its delivery-id withheld
                session.dropped_transfers += 1
                if fields.delivery_id is not None:
                    self._withhold_id(session, fields.delivery_id)
                return False
            raise UnattachedHandleError(f"transfer on handle {handle} that is not attached")
        if not link.is_sender:
            raise NotAllowedError("transfer on a link where the client is the receiver")
        if link.client_detached:
            if link.revoked and not link.client_answered:
                return self._revoked_transfer(session, link, fields)
            raise IllegalStateError("transfer after detach")
        return self.sender_transfer(session, link, buf, body, fend, now, fields)

    def _proxy_transfer(self, session: SessionRecord, plink: ProxyLink, buf: Any,
                        fields: TransferFields, fend: int, now: float) -> bool:
        """A client Transfer on a link the proxy answers itself (:mod:`.proxylinks`): never
        forwarded; a delivery it starts is withheld (the session's later delivery-ids are
        renumbered), the request goes to the proxy links.

        Raises:
            NotAllowedError: a Transfer on a link where the client receives.
        """
        _, delivery_id, settled, more, aborted, payload_offset, _ = fields
        if not plink.is_sender:
            raise NotAllowedError("transfer on a link where the client is the receiver")
        session.dropped_transfers += 1
        if not plink.in_delivery:
            self._withhold_id(session, delivery_id)
            if delivery_id is None and session.numbering is not None:
                delivery_id = (session.numbering.next - 1) & UINT_MAX
        self.sessions.proxy.transfer(session, plink, buf, payload_offset, fend, delivery_id,
                                     settled, more, aborted, now)
        return False

    def _revoked_transfer(self, session: SessionRecord, link: LinkRecord,
                          fields: TransferFields) -> bool:
        """A client Transfer on a link the proxy revoked that the client has not seen the
        Detach of yet: dropped (the router has the link detached); a delivery it starts is
        withheld (the session's later delivery-ids are renumbered), the rest of a delivery
        under way when the link was revoked just dropped (the router's Detach ended it)."""
        _, delivery_id, _, more, aborted, _, _ = fields
        session.dropped_transfers += 1
        if not link.in_delivery:
            self._withhold_id(session, delivery_id)
        link.in_delivery = bool(more) and not aborted
        return False

    def sender_transfer(self, session: SessionRecord, link: LinkRecord, buf: Any, body: int,
                        fend: int, now: float, fields: TransferFields) -> bool:
        """A client Transfer (Part 2 §2.7.5) on ``link``, a sender link the client attached
        and has not detached, on ``session`` (which counted it already), its body at
        ``buf[body:fend]``, its fields (:func:`read_transfer_fields`) ``fields``: the
        delivery bookkeeping, shaping, the per-message rules on a delivery's first frame,
        ``maxMessageSize``, the session's renumbering. True means "forward its bytes"
        (:meth:`client_transfer` without the lookups, for the relay's fast path, which did
        them).

        Raises:
            DecodeError: a message head that is not canonical.
        """
        _, delivery_id, settled, more, aborted, payload_offset, _ = fields
        # the delivery bookkeeping (Part 2 §2.6.12); the relay scanner carries the same state
        # across the frames it passes (LinkRecord.carry)
        first = not link.in_delivery
        if first:
            link.in_delivery = True
            link.delivery_bytes = 0
            link.delivery_id = delivery_id
            link.delivery_settled = settled
            link.discarding = False
            link.discard_reason = None
        elif settled:
            link.delivery_settled = True
        if not more or aborted:
            link.in_delivery = False
        shaper = link.shaper
        if shaper is not None:  # under the user's message or byte rate: charged
            shaper.transfer(first, fend - payload_offset, now)
        if link.discarding:
            session.dropped_transfers += 1
            if not link.in_delivery:
                self._finish_denied(session, link, now)
            return False
        link.delivery_bytes += fend - payload_offset
        if first and not aborted and link.inspect:
            # (a link inspected only for renewals has no per-message rule: it would read a
            # head that does not fit its first frame as a rule's denial)
            denial = (self.rules.message_denial(link, buf, payload_offset, fend, more, now)
                      if not link.renewal or self.rules.inspects(link) else None)
            if denial is not None and not self._shadow(denial[0], denial[1], now):
                self._deny(session, link, denial[0], denial[1], now)
                return False
            if link.renewal and not self.sessions.proxy.broker_request(
                    buf, payload_offset, fend, more, now):
                # a renewal the proxy refuses never reaches the broker (not a policy denial:
                # shadow mode does not let it through)
                self._deny(session, link, MessageDenyReason.TOKEN_RENEWAL, link.address, now)
                return False
        limit = self.rules.max_message_size
        if limit is not None and link.delivery_bytes > limit and not aborted:
            if link.discard_reason != _SHADOWED_SIZE:  # once per delivery
                if not self._shadow(MessageDenyReason.MESSAGE_SIZE, link.address, now,
                                    f"maxMessageSize {limit} exceeded"):
                    self._oversize(session, link, first, now)
                    return False
                link.discard_reason = _SHADOWED_SIZE
        if session.numbering is not None:
            return self._renumbered(buf, body, fend, session.channel, session.numbering, link,
                                    first, delivery_id, aborted)
        return True

    def _renumbered(self, buf: Any, body: int, fend: int, channel: int,
                    numbering: DeliveryNumbering, link: LinkRecord, first: bool,
                    delivery_id: int | None, aborted: bool) -> bool:
        """Forward a client Transfer of a session that withheld deliveries: its delivery-id
        in the router's numbering (:mod:`.numbering`); True when its bytes need no change."""
        last = not link.in_delivery
        if first:
            new = numbering.forward_first(
                delivery_id, link.handle, last and (link.delivery_settled or aborted))
        else:
            new = None if delivery_id is None else numbering.forward_more(delivery_id)
            if last:
                numbering.delivery_done(link.delivery_id, link.delivery_settled or aborted)
        if new is None or new == delivery_id:
            return True
        self.wire.send(ROUTER, transfer_with_delivery_id(buf, body, fend, channel, new))
        return False

    def _shadow(
        self, reason: MessageDenyReason, address: str | None, now: float, detail: str = ""
    ) -> bool:
        """True when shadow mode lets this message denial through: reported and logged
        ``SHADOW DENY``, the delivery is forwarded as it came."""
        if not shadowed(self.ctx, DenialKind.MESSAGE, reason, now, address=address):
            return False
        self._log_denial(reason, address, now, detail, SHADOW_DENY)
        return True

    def _log_denial(
        self, reason: MessageDenyReason, address: str | None, now: float, detail: str = "",
        verb: str = DENY,
    ) -> None:
        """One INFO line for a denied message, in QDR's words (``DENY AMQP Transfer ...``;
        ``verb`` ``SHADOW DENY`` for one shadow mode let through)."""
        conn = self.ctx
        conn.denial_lines.log(
            logger, conn.conn_id, now,
            "[%s] %s AMQP Transfer for user '%s', rhost '%s', vhost '%s', address '%s': %s%s",
            conn.conn_id,
            verb,
            conn.user,
            conn.remote_host,
            conn.vhost_name,
            address,
            reason,
            f" ({detail})" if detail else "",
        )

    def _deny(
        self,
        session: SessionRecord,
        link: LinkRecord,
        reason: MessageDenyReason,
        address: str | None,
        now: float,
    ) -> None:
        """Deny the delivery starting at this frame (a ``user-id`` or ``to`` violation).

        Nothing of it reaches the router: its frames are dropped and counted, and the session's
        later delivery-ids are renumbered (:meth:`_withhold`, decision 0002). Emits
        ``MessageDenied``.
        """
        link.discarding = True
        link.discard_reason = reason
        self._log_denial(reason, address, now)
        self._withhold(session, link, now)
        self.wire.emit(
            MessageDenied(
                *self.ctx.who(now),
                address=address,
                reason=reason,
                size=link.delivery_bytes,
            )
        )
        if not link.in_delivery:
            self._finish_denied(session, link, now)

    def _withhold(self, session: SessionRecord, link: LinkRecord, now: float) -> None:
        """The delivery whose first frame this is never reaches the router: the frame is
        dropped (the session's transfer-ids are renumbered in Flows), the link's
        ``delivery-count`` falls one behind the client's (on a shaped link, shaping's own
        offset takes it, :meth:`.shaping.Shaping.withheld`), and the session's delivery-ids
        from here on are the client's minus the deliveries withheld (:mod:`.numbering`).

        Raises:
            InvalidFieldError: the frame has no delivery-id and none was withheld before on
                the session: the proxy, which does not count the ids the client leaves
                implicit, cannot tell which one it is.
        """
        session.dropped_transfers += 1
        link.withheld = (link.withheld + 1) & UINT_MAX
        self._withhold_id(session, link.delivery_id)
        shaper = link.shaper
        if shaper is not None:
            shaper.shaping.withheld(shaper, now)

    def _withhold_id(self, session: SessionRecord, delivery_id: int | None) -> None:
        """The client delivery-id ``delivery_id`` (None: the implicit next one) is never
        forwarded: renumber the session from here on (an id seen before changes nothing).

        Raises:
            InvalidFieldError: ``delivery_id`` None on a session not renumbered yet.
        """
        numbering = session.numbering
        if numbering is not None:
            numbering.withhold(delivery_id)
        elif delivery_id is None:
            raise InvalidFieldError("delivery-id required on the first transfer of a delivery")
        else:
            session.numbering = DeliveryNumbering(delivery_id)
            refresh_session(session)
            self.sessions.renumbering = True
            refresh_router(self.sessions)

    def _finish_denied(self, session: SessionRecord, link: LinkRecord, now: float) -> None:
        """The denied delivery's last frame arrived: reject it toward the client, as QDR does
        (``amqp:unauthorized-access``, "policy violation on target" or "user_id proxy
        violation"), unless the client sent it settled, and give back the link credit it used
        (:func:`.numbering.credit_back`: QDR, which received it, would have). A size denial
        goes on to :meth:`_finish_oversize`."""
        reason = link.discard_reason
        link.discarding = False
        if reason == MessageDenyReason.MESSAGE_SIZE:
            self._finish_oversize(session, link, now)
            return
        description = (
            C.USER_ID_VIOLATION if reason == MessageDenyReason.USER_ID
            else RENEWAL_REFUSED if reason == MessageDenyReason.TOKEN_RENEWAL
            else C.TARGET_VIOLATION
        )  # relay target, by address rules or topics
        frames = []
        if not link.delivery_settled and link.delivery_id is not None:
            disp = Disposition(
                role=True,
                first=link.delivery_id,
                settled=True,
                state=Rejected(error=error(Condition.UNAUTHORIZED_ACCESS, description)),
            )
            frames.append(frame(0, disp))
        flow = None if link.shaper is not None else credit_back(
            session, link, self.sessions.window_frames)  # (shaping gives it back itself)
        if flow is not None:  # the credit the refused delivery used, given back
            frames.append(frame(0, flow))
        if frames:
            self.sessions.reply_on_session(session, *frames)

    def _oversize(
        self, session: SessionRecord, link: LinkRecord, first: bool, now: float
    ) -> None:
        """The delivery passed ``maxMessageSize`` (bytes, counted over all its frames): nothing
        more of it reaches the router, emit ``MessageDenied`` and finish as QDR does once its
        last frame is in.

        Caught on its first frame, the delivery is withheld whole (:meth:`_withhold`). Caught
        later, its first frames were forwarded: the router holds an incomplete delivery,
        which the Close that follows ends (Part 2 §2.6.14 would allow ``aborted``, which
        RabbitMQ 3.x refuses); its id stays used, so nothing is renumbered.
        """
        self._log_denial(
            MessageDenyReason.MESSAGE_SIZE,
            link.address,
            now,
            f"maxMessageSize {self.rules.max_message_size} exceeded",
        )
        link.discarding = True
        link.discard_reason = MessageDenyReason.MESSAGE_SIZE
        if first:
            self._withhold(session, link, now)
        else:
            session.dropped_transfers += 1
        self.wire.emit(
            MessageDenied(
                *self.ctx.who(now),
                address=link.address,
                reason=MessageDenyReason.MESSAGE_SIZE,
                size=link.delivery_bytes,
            )
        )
        if not link.in_delivery:
            self._finish_oversize(session, link, now)

    def _finish_oversize(self, session: SessionRecord, link: LinkRecord, now: float) -> None:
        """QDR's answer to an oversize message: reject the delivery
        (``amqp:link:message-size-exceeded``), detach the link (no error), then close the
        connection with ``amqp:connection:forced``."""
        frames = []
        if link.delivery_id is not None:
            frames.append(
                frame(
                    0,
                    Disposition(
                        role=True,
                        first=link.delivery_id,
                        settled=True,
                        state=Rejected(
                            error=error(
                                Condition.LINK_MESSAGE_SIZE_EXCEEDED, C.MESSAGE_SIZE_EXCEEDED
                            )
                        ),
                    ),
                )
            )
        if link.router_handle is not None:
            frames.append(frame(0, Detach(handle=link.router_handle, closed=True)))
        conn = self.ctx
        self.sessions.reply_on_session(session, *frames)
        conn.close_reason = "message_size"
        wire = self.wire
        if not conn.sides.client_close_sent():  # a second oversize message, pipelined: one Close
            wire.send_close(
                CLIENT, error(Condition.CONNECTION_FORCED, C.MESSAGE_SIZE_EXCEEDED)
            )
        if not conn.sides.router_close_sent():
            wire.send_close(ROUTER, None)
        if conn.sides.client is C_OPENED:
            conn.sides.to_client(C_CLOSING)
        conn.linger(now)

    # ------------------------------------------------------------------ router Transfers

    def router_transfer(
        self, buf: Any, pos: int, body: int, fend: int, channel: int, now: float
    ) -> bytes | None:
        """A router Transfer on a connection with topic-filtered receivers.

        Returns:
            None to forward the frame's bytes as they are, else the bytes to send the client
            instead: a copy with ``durable`` cleared, or a payload-less stand-in for a
            withheld delivery (docs/decisions/0004-topic-delivery-filtering.md).
        """
        session = self.sessions.router_sessions.get(channel)
        if session is None:
            return None
        handle, delivery_id, settled, more, aborted, payload_offset, tag = read_transfer_fields(
            buf, body, fend
        )
        link = session.router_links.get(handle)
        if link is None or link.is_sender or not (
                link.topic_filter or link.strip_durable or link.renewal):
            return None
        first = not link.in_delivery
        last = not more or aborted
        if first:
            link.delivery_id = delivery_id
            link.delivery_tag = delivery_tag_at(buf, tag)
            link.delivery_settled = settled
            link.discarding = False
            link.rewrite_durable = link.strip_durable
            if link.renewal and not aborted:
                self.sessions.proxy.broker_reply(buf, payload_offset, fend, more, now)
            if link.topic_filter and not aborted:
                self._filter(link, buf, payload_offset, fend, more, delivery_id, now)
        elif settled:
            link.delivery_settled = True
        link.in_delivery = not last
        if link.discarding:
            # One payload-less frame per router frame keeps the session's transfer-ids and the
            # link's delivery-count in step on both sides; the last one aborts the delivery,
            # which settles it for the client (Part 2 §2.7.5).
            if first:
                t = Transfer(
                    handle=handle,
                    delivery_id=delivery_id,
                    delivery_tag=link.delivery_tag or b"",
                    message_format=0,
                    settled=True if last else None,
                    more=not last,
                    aborted=True if last else None,
                )
            else:
                t = Transfer(
                    handle=handle,
                    more=not last,
                    settled=True if last else None,
                    aborted=True if last else None,
                )
            if last:
                link.discarding = False
                if not link.delivery_settled and not aborted and link.delivery_id is not None:
                    # settle it toward the router: the subscriber may not see it
                    self.wire.send(
                        ROUTER,
                        frame(
                            session.channel,
                            Disposition(
                                role=True, first=link.delivery_id, settled=True, state=Accepted()
                            ),
                        ),
                    )
            return frame(channel, t)
        if first and link.rewrite_durable:
            link.rewrite_durable = False
            offset = durable_flag_offset(buf, payload_offset, fend)
            if offset is not None:
                data = bytearray(buf[pos:fend])
                data[offset - pos] = cleared_durable_byte(buf, offset)
                return bytes(data)
        return None

    def _filter(
        self,
        link: LinkRecord,
        buf: Any,
        payload: int,
        fend: int,
        more: bool,
        delivery_id: int | None,
        now: float,
    ) -> None:
        """Decide whether the subscriber on ``link`` may see the delivery that starts here.

        The message comes from a publisher, through the router: its head is read canonically
        and a ``to`` the proxy cannot read proves nothing (visible only if the subscriber may
        see every topic its wildcard matches).
        """
        conn = self.ctx
        to: str | None = None
        try:
            head = read_head(buf, payload, fend, last=not more)
        except DecodeError:
            head = None
        wall_now = now + conn.wall_offset
        shadow = in_shadow(conn)  # a durable rewrite is not a denial: none in shadow
        topics = self.rules.topics
        assert topics is not None, "only a receiver under a topic model filters deliveries"
        if head is not None and not head.complete:
            visible, decided = False, "properties not in the first frame"
        elif head is not None and head.to is not None and (
                resolved := conn.naming.resolve(head.to)) is not None:
            to = head.to
            # the topic the upstream resolves the message's address to (decision 0007)
            d = topics.check_delivery(
                self.rules.principal, link.address or "", resolved.topic_name, wall_now=wall_now
            )
            visible, decided = d.visible, d.decided_by
            link.rewrite_durable = d.strip_durable and not shadow
        else:
            node = link.node  # the subscription as the upstream resolves it
            d = topics.check_unknown_delivery(
                self.rules.principal,
                node.topic_name if node is not None else link.address or "",
                wall_now=wall_now,
            )
            visible, decided = d.visible, d.decided_by
            link.rewrite_durable = d.strip_durable and not shadow
        if not visible and shadowed(
            conn, DenialKind.MESSAGE, MessageDenyReason.TOPIC_WITHHELD, now, address=to
        ):
            logger.debug("[%s] SHADOW delivery %s on '%s' not withheld: %s", conn.conn_id,
                         delivery_id, link.address, decided)
        elif not visible:
            link.discarding = True
            logger.debug(
                "[%s] delivery %s on '%s' withheld: %s",
                conn.conn_id,
                delivery_id,
                link.address,
                decided,
            )
            self.wire.emit(
                MessageDenied(
                    *conn.who(now),
                    address=to,
                    reason=MessageDenyReason.TOPIC_WITHHELD,
                    size=fend - payload,
                )
            )
