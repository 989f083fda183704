"""Sans-IO. The per-message rules a connection's group imposes, and their checks.

Set once at admission (:meth:`MessageRules.govern`): ``maxMessageSize``, whether a message's
``user-id`` must be the user's (QDR's ``allowUserIdProxy`` false), the anonymous-relay address
rules, and the topic models of the vhost and group. :mod:`.sessions` asks them about a link at
Attach; :mod:`.deliveries` about each delivery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..amqp.accel import Buffer, read_head
from ..policy import decisions
from ..policy.reasons import MessageDenyReason
from .context import Context
from .records import LinkRecord

if TYPE_CHECKING:
    from ..policy.model import GroupSettings
    from ..policy.naming import Node
    from ..policy.topics import TopicAuthorizer, TopicDecision

logger = logging.getLogger(__name__)


class MessageRules:
    """The message rules of one connection (none until it is admitted under a group)."""

    __slots__ = (
        "ctx",
        "max_message_size",
        "check_user_id",
        "user_id_bytes",
        "scan_user_id",
        "relay_allowed",
        "topics",
        "principal",
        "qos_of",
        "topic_receivers",
        "allow_router_annotations",
    )

    def __init__(self, ctx: Context) -> None:
        """No rule yet."""
        self.ctx = ctx
        self.max_message_size: int | None = None
        """Bytes; the group's maxMessageSize (resolved group -> vhost -> global)."""
        self.check_user_id = False
        """``allowUserIdProxy`` is false: a message's user-id must be the user's."""
        self.user_id_bytes = b""
        self.scan_user_id: bytes | None = None
        """The user's name for the C scanner when QDR's user-id check is the only rule of a
        named sender link (no topic model), else None (:mod:`.fastpath`)."""
        self.relay_allowed: str | None = None
        """The last relay ``to`` the address rules allowed (a relay sender repeats it)."""
        self.topics: TopicAuthorizer | None = None
        """The group's topic authorizer, if a topic model applies to it."""
        self.principal: Any = None
        """The :class:`~amqp_policy_proxy.policy.topics.Principal` the topic models are asked
        about, while :attr:`topics` is set (read only then)."""
        self.qos_of: Any = None
        """:func:`~amqp_policy_proxy.policy.topics.qos_of`, while :attr:`topics` is set (the
        topics package is imported only for a vhost with topic models)."""
        self.topic_receivers = False
        """Some receiver link needs per-delivery topic handling (router Transfers are read)."""
        self.allow_router_annotations = False
        """``allowRouterAnnotations``: relay messages may carry ``x-opt-qd.*`` annotations."""

    def govern(self, group: GroupSettings, user: str, tls_subject: str | None) -> None:
        """Apply ``group``'s message rules to this connection (at admission, and again when a
        reload's policy keeps the connection under a changed group: then they apply to new
        deliveries)."""
        self.max_message_size = group.max_message_size
        self.check_user_id = not group.allow_user_id_proxy
        self.allow_router_annotations = group.allow_router_annotations
        self.user_id_bytes = user.encode("utf-8")
        topics = group.topics
        self.topics = self.principal = None  # (a reload may govern again: rules.py's caller)
        self.scan_user_id = None
        if topics is not None:
            from ..policy.topics import Principal, qos_of  # only vhosts with topic models

            self.topics = topics
            self.qos_of = qos_of
            self.principal = Principal(user=user, group=group.name, subject=tls_subject)
        if self.check_user_id and self.topics is None:
            self.scan_user_id = self.user_id_bytes

    def inspects(self, link: LinkRecord) -> bool:
        """Whether the first frame of each delivery on the sender ``link`` needs a look
        (also every link whose upstream routes each message by its ``subject``)."""
        node = link.node
        return (link.anonymous or self.check_user_id or self.topics is not None
                or (node is not None and node.by_subject))

    def check_link(self, is_sender: bool, address: str, node: Node | None, qos: int,
                   now: float) -> TopicDecision:
        """The topic models' decision on a link to ``address`` (publish or subscribe), made
        on the topic the upstream resolves it to (``node``, a
        :class:`~amqp_policy_proxy.policy.naming.Node`; None in shadow mode for an address
        whose node is not certain: the raw text is shown to the models)."""
        conn = self.ctx
        topics = self.topics
        assert topics is not None, "check_link is asked only while topics is set"
        check = topics.check_publish if is_sender else topics.check_subscribe
        topic = address if node is None else node.topic_name
        verdict = check(self.principal, topic, qos=qos, wall_now=now + conn.wall_offset)
        if not verdict.allowed:
            conn.denial_lines.log(
                logger, conn.conn_id, now,
                "[%s] topic authorization denies %s '%s' for user '%s': %s",
                conn.conn_id,
                "publish" if is_sender else "subscribe",
                address,
                conn.user,
                verdict.decided_by,
            )
        return verdict

    def message_denial(
        self, link: LinkRecord, buf: Buffer, payload: int, fend: int, more: bool, now: float
    ) -> tuple[MessageDenyReason, str | None] | None:
        """The per-message checks on the first frame of a delivery on an inspected link:
        QDR's ``user-id`` check (allowUserIdProxy false) and anonymous-relay ``to`` (address
        rules, then topics); no router annotations on an anonymous-relay message (qdrouterd
        would route it by ``x-opt-qd.to``) unless ``allowRouterAnnotations``; on a topic publisher's link a ``to`` other than the
        target must be publishable too. The head is read canonically; one that does not fit in
        the first frame is refused rather than let pass.

        Returns:
            ``(reason, to)`` for a denial, else None.

        Raises:
            DecodeError: the message head is not canonical.
        """
        node = link.node
        by_subject = node is not None and node.by_subject
        head = read_head(buf, payload, fend, last=not more, subject=by_subject)
        to = head.to
        if not head.complete:
            if link.anonymous or by_subject:
                return MessageDenyReason.RELAY_TARGET, to
            return (
                MessageDenyReason.USER_ID if self.check_user_id else MessageDenyReason.TOPIC
            ), to
        if self.check_user_id and head.user_id and head.user_id != self.user_id_bytes:
            return MessageDenyReason.USER_ID, to
        conn = self.ctx
        topics = self.topics
        naming = conn.naming
        group = conn.group
        assert group is not None, "only a link attached under a group is inspected"
        if link.anonymous:
            if head.router_annotations and not self.allow_router_annotations:
                return MessageDenyReason.ROUTER_ANNOTATIONS, to
            if to is not None:
                if to != self.relay_allowed:
                    if not decisions.approve_relay_target(group, user=conn.user or "", to=to,
                                                          naming=naming):
                        return MessageDenyReason.RELAY_TARGET, to
                    self.relay_allowed = to
                if topics is not None:
                    resolved = naming.resolve(to)
                    if resolved is None or not topics.check_publish(
                        self.principal, resolved.topic_name, qos=link.qos,
                        wall_now=now + conn.wall_offset,
                    ).allowed:
                        return MessageDenyReason.TOPIC, to
            return None
        if by_subject:
            # RabbitMQ routes this message by its subject: that node is the message's target
            routed = naming.with_subject(node, head.subject)
            if routed is None or not decisions.node_allowed(
                    group.targets, routed, conn.user or "", group.declared_prefixes):
                return MessageDenyReason.RELAY_TARGET, head.subject
            if topics is not None and not topics.check_publish(
                self.principal, routed.topic_name, qos=link.qos,
                wall_now=now + conn.wall_offset,
            ).allowed:
                return MessageDenyReason.TOPIC, head.subject
            node = routed
        if topics is not None and to is not None and to != link.address:
            resolved = naming.resolve(to)
            if resolved is None:
                return MessageDenyReason.TOPIC, to
            if (node is None or resolved.name != node.name) and not topics.check_publish(
                self.principal, resolved.topic_name, qos=link.qos,
                wall_now=now + conn.wall_offset,
            ).allowed:
                return MessageDenyReason.TOPIC, to
        return None
