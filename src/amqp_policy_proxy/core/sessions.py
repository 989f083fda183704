"""Sans-IO. Sessions and links: Begin, Attach, Flow, Detach, End from both legs.

What the client began and attached (the records of :mod:`.records`, in the client's channel and
handle numbering, mapped to the router's as its answers arrive), the live and peak counts,
QDR's session and link denials (Begin+End and Attach+Detach answered by the proxy on channels
and handles kept back from the router, decision 0003), and the session window the group's
``maxSessionWindow`` gives the client (its Flows: :mod:`.flows`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..amqp import constants as C
from ..amqp.constants import UINT_MAX, USHORT_MAX, Condition
from ..amqp.errors import (
    DecodeError,
    FramingError,
    HandleInUseError,
    IllegalStateError,
    NotAllowedError,
    ResourceLimitError,
    UnattachedHandleError,
)
from ..amqp.performatives import (
    Attach,
    Begin,
    Detach,
    Disposition,
    End,
    Flow,
    Source,
    Target,
    checked_replace,
)
from ..policy import decisions
from ..policy.reasons import DenialKind, LinkDenyReason, SessionDenyReason
from .commands import CLIENT, ROUTER
from .context import Context, Room
from .eligibility import refresh_link, refresh_router
from .events import LinkDenied, SessionDenied
from .flows import SessionFlows
from .numbering import disposition_to_router, inserted_disposition
from .proxylinks import ProxyLinks, node_of, reads_broker_renewals
from .records import LinkRecord, ReservedPool, SessionRecord
from .rules import MessageRules
from .shadow import shadowed, verb
from .wire import error, frame, rechannel

if TYPE_CHECKING:
    from .shaping import Shaping

logger = logging.getLogger(__name__)

#: Channels kept back from the router (top of the client's channel-max) for Begin+End replies.
RESERVED_CHANNELS = 8
#: Handles kept back from the router (top of the client's handle-max) for Attach+Detach replies.
RESERVED_HANDLES = 64
#: The reserve of a connection whose Open is not decided yet: empty, so nothing is ever taken
#: from it or given back to it, and one pool serves every connection.
_NONE_RESERVED = ReservedPool(0, 0)


def _address(terminus: Any) -> str | None:
    """A Source or Target's address as text, or None (no terminus, or no address)."""
    address = getattr(terminus, "address", None)
    return None if address is None else str(address)


def _int_or_none(value: Any) -> int | None:
    """A decoded uint (or None) as a Python int."""
    return None if value is None else int(value)


class Sessions(SessionFlows):
    """The sessions and links of one connection, both legs."""

    __slots__ = (
        "rules",
        "sessions",
        "router_sessions",
        "denied_sessions",
        "reserved_channels",
        "advertised_channel_max",
        "policy_channel_max",
        "window_frames",
        "shaping",
        "renumbering",
        "early_denials",
        "count_router_transfers",
        "window_pending",
        "router_fast",
        "inserting",
        "reads_replies",
        "proxy",
    )

    def __init__(self, ctx: Context, rules: MessageRules) -> None:
        """No session yet; the channel limits are set at the Opens."""
        Room.__init__(self, ctx)
        self.rules = rules
        self.sessions: dict[int, SessionRecord] = {}
        """Client channel -> session."""
        self.router_sessions: dict[int, SessionRecord] = {}
        """Router channel -> session."""
        self.denied_sessions: dict[int, int] = {}
        """Client channel of a denied Begin -> the reserved channel it was answered on."""
        self.reserved_channels = _NONE_RESERVED
        """The channels kept back for session denials (none until the client's Open)."""
        self.advertised_channel_max = USHORT_MAX
        """The channel-max the client was given (the router's, lowered by policy)."""
        self.policy_channel_max: int | None = None
        """``maxSessions - 1`` of the group, if set."""
        self.window_frames: int | None = None
        """The group's ``maxSessionWindow`` in transfer frames, if set (at the router's Open)."""
        self.shaping: Shaping | None = None
        """The user's message or byte rate, if the group has one (set at admission)."""
        self.renumbering = False
        """Some session withheld a client delivery: the router's Dispositions are read."""
        self.count_router_transfers = False
        """The router's Transfers are counted per session (``maxSessionWindow``, or sessions
        that keep the router's flow state, :attr:`~.records.SessionRecord.tracks_router`)."""
        self.router_fast = True
        """May the C walker pass runs of the router's Transfers and Dispositions
        (:func:`.eligibility.refresh_router`)."""
        self.window_pending: set[SessionRecord] = set()
        """Sessions whose client sent Transfers in the read being processed: their window is
        reopened once the whole read is (:meth:`~.flows.SessionFlows.reopen_windows`)."""
        self.inserting = False
        """Some session carries deliveries of the proxy's own toward the client: the router's
        Transfers on it are renumbered (:class:`.numbering.InsertedNumbering`)."""
        self.reads_replies = False
        """Some receiver link is RabbitMQ's own ``/management`` on a token connection: the
        router's Transfers are read for the broker's answers to forwarded renewals
        (:meth:`.proxylinks.ProxyLinks.broker_reply`)."""
        self.proxy = ProxyLinks(ctx, self)
        """The links the proxy answers itself (:mod:`.proxylinks`)."""
        self.early_denials: list[bytes] = []
        """Session denials answered before the router's Open reached the client (Begins
        pipelined behind the client's Open): sent right after that Open."""

    def reserve_channels(self, channel_max: int) -> int:
        """Keep the top of the client's ``channel_max`` back for session denials (decision
        0003); return the channel-max to give the router."""
        reserve = min(RESERVED_CHANNELS, channel_max // 2)
        self.reserved_channels = ReservedPool(channel_max, reserve)
        return channel_max - reserve

    # ------------------------------------------------------------------ client frames

    def session(self, channel: int, what: str) -> SessionRecord | None:
        """The client's session on ``channel``; None for one the proxy denied (the frame is
        consumed).

        Raises:
            NotAllowedError: a channel the client never began.
            IllegalStateError: a session the client already ended.
        """
        session = self.sessions.get(channel)
        if session is None:
            if channel in self.denied_sessions:
                return None
            raise NotAllowedError(f"{what} on channel {channel} that was never begun")
        if session.client_ended:
            raise IllegalStateError(f"{what} on channel {channel} after End")
        return session

    def on_client_begin(self, perf: Begin, raw: bytes, channel: int, now: float) -> None:
        """A client Begin (Part 2 §2.7.2): denied beyond ``maxSessions`` (Begin+End, QDR's
        ``session disallowed by local policy``), else forwarded with handle-max lowered by
        the handles kept back for link denials.

        Raises:
            NotAllowedError: a channel in use, or a Begin that claims a remote-channel.
            FramingError: a channel above the channel-max the client was given.
        """
        if channel in self.sessions or channel in self.denied_sessions:
            raise NotAllowedError(f"channel {channel} already in use")
        if perf.remote_channel is not None:
            raise NotAllowedError("client-initiated Begin with remote-channel set")
        conn = self.ctx
        pcm = self.policy_channel_max
        group = conn.group
        figures = conn.figures
        if (
            group is not None
            and group.max_sessions
            and (
                (pcm is not None and channel > pcm) or figures.active_sessions >= group.max_sessions
            )
            and self._deny_session(channel, now)  # False: shadow mode lets it through
        ):
            return
        if channel > self.advertised_channel_max:
            raise FramingError(
                f"remote channel {channel} is above negotiated channel_max "
                f"{self.advertised_channel_max}."
            )
        hmax = UINT_MAX if perf.handle_max is None else int(perf.handle_max)
        reserve = min(RESERVED_HANDLES, hmax // 2)
        session = SessionRecord(
            channel, ReservedPool(hmax, reserve), _int_or_none(perf.next_outgoing_id) or 0
        )
        self.sessions[channel] = session
        if self.shaping is not None:
            session.shaping = self.shaping.session(perf)
        figures.active_sessions += 1
        if figures.active_sessions > figures.peak_sessions:
            figures.peak_sessions = figures.active_sessions
        if reserve:
            raw = frame(channel, checked_replace(perf, handle_max=hmax - reserve))
        self.wire.send(ROUTER, raw)

    def _deny_session(self, channel: int, now: float) -> bool:
        """Deny a Begin over ``maxSessions``, as QDR does: a Begin answering it then an End
        with ``amqp:resource-limit-exceeded`` "session disallowed by local policy", sent on
        a channel kept back from the router (so the two legs' channels never collide).

        Returns:
            True when denied; False when shadow mode lets the Begin through (logged
            ``SHADOW DENY`` and reported only).

        Raises:
            ResourceLimitError: no kept-back channel is left (the connection then closes).
        """
        conn = self.ctx
        shadow = shadowed(conn, DenialKind.SESSION, SessionDenyReason.SESSION_LIMIT, now)
        conn.denial_lines.log(
            logger, conn.conn_id, now,
            "[%s] %s AMQP Begin Session due to session limit. user: %s, rhost: %s, vhost: %s",
            conn.conn_id,
            verb(shadow),
            conn.user,
            conn.remote_host,
            conn.vhost_name,
        )
        if shadow:
            return False
        reply = _deny_on_reserved(self.denied_sessions, self.reserved_channels, channel,
                                  "session disallowed by local policy (no reply channel)")
        err = error(Condition.RESOURCE_LIMIT_EXCEEDED, C.SESSION_DISALLOWED)
        data = frame(
            reply,
            Begin(remote_channel=channel, next_outgoing_id=0, incoming_window=0, outgoing_window=0),
        ) + frame(reply, End(error=err))
        if self.wire.open_sent:
            self.wire.send(CLIENT, data)
        else:  # nothing may precede the Open (Part 2 §2.4.1): the router's is on its way
            self.early_denials.append(data)
        self.wire.emit(SessionDenied(*conn.who(now), channel=channel))
        return True

    def on_client_attach(self, perf: Attach, raw: bytes, channel: int, now: float) -> None:
        """A client Attach (Part 2 §2.7.3), checked as QDR does: sender/receiver counts, the
        target or source address rules (``${user}``), anonymous senders, dynamic sources, then
        the topic models. A denial is answered Attach+Detach(closed) on a reserved handle; the
        router never sees the link.

        Raises:
            DecodeError: no name, handle or role.
            HandleInUseError: the handle is attached already.
            FramingError: a handle above the handle-max the router gave.
        """
        session = self.session(channel, "attach")
        if session is None:
            return  # pipelined behind a denied Begin: consumed
        if perf.handle is None or perf.name is None or perf.role is None:
            raise DecodeError("attach without name, handle or role")
        handle = int(perf.handle)
        if handle in session.links or handle in session.denied_handles:
            raise HandleInUseError(f"handle {handle} is already attached")
        if session.handle_max is not None and handle > session.handle_max:
            raise FramingError(f"remote handle {handle} is above handle_max {session.handle_max}")
        is_sender = perf.role is False or perf.role == 0
        terminus = perf.target if is_sender else perf.source
        address = _address(terminus)
        dynamic = bool(getattr(terminus, "dynamic", False))
        conn = self.ctx
        if session.proxy_links is not None and handle in session.proxy_links:
            raise HandleInUseError(f"handle {handle} is already attached")
        proxy_node = node_of(conn, address) if not dynamic else None
        if proxy_node is not None:  # token renewal: the proxy answers it, never the router
            self.proxy.attach(session, perf, handle, is_sender, proxy_node, now)
            if session.inserted is not None and not self.inserting:
                self.inserting = True
            refresh_router(self)
            return
        if not is_sender:
            session.had_receivers = True
        figures = conn.figures
        group = conn.group
        if group is not None:
            user = conn.user or ""
            if is_sender:
                reason = decisions.approve_sender(
                    group,
                    user=user,
                    target_address=address or None,
                    open_senders=figures.active_senders,
                    naming=conn.naming,
                )
            else:
                reason = decisions.approve_receiver(
                    group,
                    user=user,
                    source_address=address or None,
                    dynamic=dynamic,
                    open_receivers=figures.active_receivers,
                    naming=conn.naming,
                )
            if reason is not None and self._deny_link(
                session, perf, handle, is_sender, address, reason, now
            ):
                return
        rules = self.rules
        qos = 1
        verdict = None
        if rules.topics is not None:
            qos = rules.qos_of(
                _int_or_none(perf.snd_settle_mode), _int_or_none(perf.rcv_settle_mode)
            )
            node = conn.naming.resolve(address) if address and not dynamic else None
            if address and not dynamic and (node is None or not node.by_subject):
                # on the node the upstream routes to (a by-subject sender: each message)
                verdict = rules.check_link(is_sender, address, node, qos, now)
                if not verdict.allowed:
                    if self._deny_link(
                        session, perf, handle, is_sender, address, LinkDenyReason.TOPIC, now
                    ):
                        return
                    verdict = None  # allowed in shadow: no per-delivery filter either
        link = LinkRecord(str(perf.name), handle, is_sender, address)
        if address and not dynamic:
            link.node = conn.naming.resolve(address)
            link.by_subject = link.node is not None and link.node.by_subject
        link.initial_count = _int_or_none(perf.initial_delivery_count) or 0
        link.dynamic = dynamic
        link.qos = qos
        link.renewal = not dynamic and reads_broker_renewals(conn, address)
        link.inspect = is_sender and group is not None and (rules.inspects(link) or link.renewal)
        if link.renewal and not is_sender:
            self.reads_replies = True  # the broker's answers to forwarded renewals are read
            refresh_router(self)
        if link.inspect:
            # a delivery may be withheld here: keep the router's flow state (numbering.py)
            session.tracks_router = self.count_router_transfers = True
            refresh_router(self)
        if (
            verdict is not None
            and not is_sender
            and (verdict.per_delivery or verdict.strip_durable)
        ):
            assert group is not None, "topic models are governed under a group"
            link.topic_filter = verdict.per_delivery
            # a durable rewrite is not a denial: in shadow nothing on the wire changes
            link.strip_durable = verdict.strip_durable and not group.shadow
            rules.topic_receivers = True
            refresh_router(self)
        session.links[handle] = link
        if is_sender:
            if self.shaping is not None:
                link.shaper = self.shaping.attach(session, link, perf)
            refresh_link(link, rules.scan_user_id)
            session.senders += 1
            figures.active_senders += 1
            figures.peak_senders = max(figures.peak_senders, figures.active_senders)
        else:
            session.receivers += 1
            figures.active_receivers += 1
            figures.peak_receivers = max(figures.peak_receivers, figures.active_receivers)
        self.wire.send(ROUTER, raw)

    def _deny_link(
        self,
        session: SessionRecord,
        perf: Attach,
        handle: int,
        is_sender: bool,
        address: str | None,
        reason: LinkDenyReason,
        now: float,
    ) -> bool:
        """QDR's link denial: Attach (terminus present, address absent) then Detach(closed)
        with ``amqp:resource-limit-exceeded`` (counts) or ``amqp:unauthorized-access``.

        Returns:
            True when denied; False when shadow mode lets the Attach through (logged
            ``SHADOW DENY`` and reported only).
        """
        conn = self.ctx
        role = "sender" if is_sender else "receiver"
        shadow = shadowed(conn, DenialKind.LINK, reason, now, role=role, address=address)
        conn.denial_lines.log(
            logger, conn.conn_id, now,
            "[%s] %s AMQP Attach %s '%s' for user '%s', rhost '%s', vhost '%s' (%s)",
            conn.conn_id,
            verb(shadow),
            role,
            address,
            conn.user,
            conn.remote_host,
            conn.vhost_name,
            reason,
        )
        if shadow:
            return False
        reply_handle = _deny_on_reserved(session.denied_handles, session.reserved_handles, handle,
                                         "link disallowed by local policy (no reply handle)")
        condition = (
            Condition.RESOURCE_LIMIT_EXCEEDED
            if reason in (LinkDenyReason.SENDER_LIMIT, LinkDenyReason.RECEIVER_LIMIT)
            else Condition.UNAUTHORIZED_ACCESS
        )
        reply = Attach(
            name=perf.name,
            handle=reply_handle,
            role=is_sender,
            snd_settle_mode=perf.snd_settle_mode,
            rcv_settle_mode=perf.rcv_settle_mode,
            source=Source(),
            target=Target(),
            initial_delivery_count=None if is_sender else 0,
        )
        detach = Detach(handle=reply_handle, closed=True, error=error(condition, C.LINK_DISALLOWED))
        self.reply_on_session(session, frame(0, reply), frame(0, detach))
        self.wire.emit(
            LinkDenied(*conn.who(now), role=role, address=address, reason=reason)
        )
        return True

    def reply_on_session(self, session: SessionRecord, *frames: bytes) -> None:
        """Send synthesized frames (encoded for channel 0) on the router's channel of
        ``session``; they wait for the router's Begin if it has not reached the client yet."""
        if session.router_channel is None:
            session.pending_replies.extend(frames)
            return
        channel = session.router_channel
        self.wire.send(CLIENT, b"".join(rechannel(f, channel) for f in frames))

    def on_client_detach(self, perf: Detach, raw: bytes, channel: int, now: float) -> None:
        """A client Detach (Part 2 §2.7.7): one that answers a denial is consumed (the router
        must never see a Detach for a handle it does not know), else the link is counted down
        and the Detach forwarded.

        Raises:
            DecodeError: no handle. UnattachedHandleError: not attached.
            IllegalStateError: detached twice.
        """
        session = self.session(channel, "detach")
        if session is None:
            return
        if perf.handle is None:
            raise DecodeError("detach without handle")
        handle = int(perf.handle)
        if _answers_denial(session.denied_handles, session.reserved_handles, handle):
            return
        if session.proxy_links is not None:
            plink = session.proxy_links.get(handle)
            if plink is not None:
                self.proxy.detach(session, plink, perf)
                return
        link = session.links.get(handle)
        if link is None:
            raise UnattachedHandleError(f"detach of handle {handle} that is not attached")
        if link.revoked and not link.client_answered:
            # the router got the proxy's Detach already: consumed (the client's own, or its
            # answer to the Detach the proxy passed on from the router)
            link.client_answered = True
            if link.router_detached:
                self._forget_revoked(session, link)
            return
        if link.client_detached:
            raise IllegalStateError(f"second detach of handle {handle}")
        link.client_detached = True
        refresh_link(link, None)
        self._detached(session, link)
        self.wire.send(ROUTER, raw)

    def on_client_end(self, perf: End, raw: bytes, channel: int, now: float) -> None:
        """A client End (Part 2 §2.7.8): one that answers a denied Begin is consumed, else the
        session is counted down and the End forwarded.

        Raises:
            NotAllowedError: a channel never begun. IllegalStateError: ended twice.
        """
        if _answers_denial(self.denied_sessions, self.reserved_channels, channel):
            return
        session = self.session(channel, "end")
        assert session is not None  # a denied session's End was answered above
        session.client_ended = True
        self._ended(session)
        self.wire.send(ROUTER, raw)

    def on_client_disposition(self, perf: Any, raw: bytes, channel: int, now: float) -> None:
        """A client Disposition (Part 2 §2.7.6): forwarded, unless its session was denied;
        on a session that withheld deliveries, the ids of the client's own deliveries in the
        router's numbering (:func:`.numbering.disposition_to_router`)."""
        session = self.session(channel, "disposition")
        if session is None:
            return
        if session.numbering is not None:
            raw = disposition_to_router(session.numbering, perf, raw, channel)
        if session.inserted is not None and raw:
            raw = inserted_disposition(session.inserted, perf, raw, channel, from_client=True)
        if raw:
            self.wire.send(ROUTER, raw)

    # ------------------------------------------------------------------ counting

    def _detached(self, session: SessionRecord, link: LinkRecord) -> None:
        """One leg detached ``link`` (called after setting that leg's flag): the first uncounts
        it from its session and the connection's figures (not at all once an End already
        uncounted the whole session), the second forgets it (:meth:`_drop_link`)."""
        if link.client_detached and link.router_detached:
            self._drop_link(session, link)
            return
        if session.client_ended or session.router_ended:
            return
        figures = self.ctx.figures
        if link.is_sender:
            session.senders -= 1
            figures.active_senders -= 1
        else:
            session.receivers -= 1
            figures.active_receivers -= 1

    def revoke_link(self, session: SessionRecord, link: LinkRecord) -> None:
        """Take back a link a reload's policy no longer allows, on the client's behalf: the
        router gets Detach(closed) now, as if the client had sent it, and the link is counted
        down; the client gets the router's answer as Detach(closed) with
        ``amqp:unauthorized-access`` (QDR's condition for a link policy denies), and its own
        answer is consumed. Meanwhile its Transfers on the link are dropped and its Flows
        lose the handle. The session and connection go on."""
        if link.client_detached or link.revoked:
            return
        link.revoked = True
        link.client_detached = True
        refresh_link(link, None)
        session.revoked_handles.add(link.handle)
        self._detached(session, link)
        self.wire.send(ROUTER, frame(session.channel, Detach(handle=link.handle, closed=True)))

    def _forget_revoked(self, session: SessionRecord, link: LinkRecord) -> None:
        """Both legs are done with a revoked link: forget it (its handles may be reused)."""
        session.revoked_handles.discard(link.handle)
        self._drop_link(session, link)

    def _drop_link(self, session: SessionRecord, link: LinkRecord) -> None:
        """Forget the link under both legs' handles (the handles may be reused afterwards)."""
        if session.links.get(link.handle) is link:
            del session.links[link.handle]
            if session.numbering is not None:
                session.numbering.forget_handle(link.handle)
        if link.router_handle is not None and session.router_links.get(link.router_handle) is link:
            del session.router_links[link.router_handle]

    def _ended(self, session: SessionRecord) -> None:
        """One leg ended ``session`` (called after setting that leg's flag): the first uncounts
        it and its links, the second forgets it (:meth:`_drop_session`)."""
        if session.client_ended and session.router_ended:
            self._drop_session(session)
            return
        figures = self.ctx.figures
        figures.active_sessions -= 1
        figures.active_senders -= session.senders
        figures.active_receivers -= session.receivers
        session.senders = session.receivers = 0

    def _drop_session(self, session: SessionRecord) -> None:
        """Forget the session under both legs' channels (the channels may be reused)."""
        if self.sessions.get(session.channel) is session:
            del self.sessions[session.channel]
        if session.router_channel is not None:
            if self.router_sessions.get(session.router_channel) is session:
                del self.router_sessions[session.router_channel]

    # ------------------------------------------------------------------ router frames

    def on_router_begin(self, perf: Begin, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Begin answering the client's: map its channel, lower its
        incoming-window to ``maxSessionWindow`` and send the denial replies that waited."""
        session = None
        if perf.remote_channel is not None:
            session = self.sessions.get(int(perf.remote_channel))
        if session is None:
            return raw  # a router-initiated session: relayed untouched
        session.router_channel = channel
        session.handle_max = UINT_MAX if perf.handle_max is None else int(perf.handle_max)
        session.router_next_out = _int_or_none(perf.next_outgoing_id) or 0
        session.router_out_window = _int_or_none(perf.outgoing_window) or 0
        self.router_sessions[channel] = session
        data = raw
        iw = 0 if perf.incoming_window is None else int(perf.incoming_window)
        # the router's next-incoming-id is the client's next-outgoing-id (Part 2 §2.5.6)
        session.router_window_end = session.client_next_out + iw
        if self.window_frames is not None:
            given = min(iw, self.window_frames)
            session.client_window_end = session.client_next_out + given
            if iw > self.window_frames:
                data = frame(channel, dataclasses.replace(perf, incoming_window=given))
        if session.pending_replies:
            data = data + b"".join(rechannel(f, channel) for f in session.pending_replies)
            session.pending_replies.clear()
        if session.proxy_links:
            self.wire.send(CLIENT, data)  # the Begin first, then the proxy links' credit
            self.proxy.session_ready(session)
            return b""
        return data

    def on_router_attach(self, perf: Attach, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Attach: map its handle to the client's link of the same name."""
        session = self.router_sessions.get(channel)
        if session is not None and perf.name is not None and perf.handle is not None:
            for link in session.links.values():
                if link.name == perf.name and link.router_handle is None:
                    link.router_handle = int(perf.handle)
                    session.router_links[int(perf.handle)] = link
                    break
        return raw

    def on_router_detach(self, perf: Detach, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Detach: the link is counted down (once). On a revoked link it answers
        the proxy's Detach: the client gets it with ``amqp:unauthorized-access`` (or as the
        answer to the client's own Detach, when it sent one meanwhile)."""
        session = self.router_sessions.get(channel)
        if session is not None and perf.handle is not None:
            link = session.router_links.get(int(perf.handle))
            if link is not None and link.revoked and not link.router_detached:
                link.router_detached = True
                if link.client_answered:
                    self._forget_revoked(session, link)
                    return frame(channel, Detach(handle=perf.handle, closed=True))
                return frame(channel, Detach(handle=perf.handle, closed=True, error=error(
                    Condition.UNAUTHORIZED_ACCESS, C.LINK_DISALLOWED)))
            if link is not None and not link.router_detached:
                link.router_detached = True
                self._detached(session, link)
        return raw

    def on_router_end(self, perf: End, raw: bytes, channel: int, now: float) -> bytes:
        """The router's End: the session is counted down (once)."""
        session = self.router_sessions.get(channel)
        if session is not None and not session.router_ended:
            session.router_ended = True
            self._ended(session)
        return raw


def _deny_on_reserved(denied: dict[int, int], reserved: ReservedPool, number: int,
                      exhausted: str) -> int:
    """Take the reserved number (a channel, a handle) the denial of the client's ``number`` goes
    out on, and record the denial (decision 0003); :func:`_answers_denial` gives it back.

    Raises:
        ResourceLimitError: ``exhausted``: every reserved number is in use (the connection
            closes).
    """
    reply = reserved.take()
    if reply is None:
        raise ResourceLimitError(exhausted)
    denied[number] = reply
    return reply


def _answers_denial(denied: dict[int, int], reserved: ReservedPool, number: int) -> bool:
    """Whether a client Detach or End of ``number`` (a handle, a channel) answers the proxy's
    denial of it: then it is consumed, and the reserved number the denial went out on is free
    again (decision 0003)."""
    reply = denied.pop(number, None)
    if reply is None:
        return False
    reserved.give_back(reply)
    return True


#: The session and link performatives, by type: the :class:`Sessions` handler of the client's
#: and of the router's (None: the router's is relayed untouched, or read by the router leg
#: itself). Both legs' dispatch tables take theirs from here.
SESSION_HANDLERS: dict[type, tuple[Any, Any]] = {
    Begin: (Sessions.on_client_begin, Sessions.on_router_begin),
    Attach: (Sessions.on_client_attach, Sessions.on_router_attach),
    Flow: (Sessions.on_client_flow, Sessions.on_router_flow),
    Detach: (Sessions.on_client_detach, Sessions.on_router_detach),
    End: (Sessions.on_client_end, Sessions.on_router_end),
    Disposition: (Sessions.on_client_disposition, None),
}
