"""Sans-IO. Decisions taken back: an open connection and its links checked again against a
reloaded policy (``[policy] reevaluate_open``, docs/policy.md "Live policy").

QDR decides a connection once, at its Open, and keeps that decision for the connection's life.
The proxy, after a reload, asks every admitted connection the questions of its Open again
(vhost from the Open's hostname, group from the user, ``remoteHosts``) and every attached
link the questions of its Attach (the new group's ``sources`` / ``targets`` / patterns,
``allowAnonymousSender``, ``allowDynamicSource``, the topic models), on the names as the
upstream resolves them:

- a connection the new policy no longer admits is closed with QDR's Close for a denied
  connection (``amqp:resource-limit-exceeded``, "connection disallowed by local policy"),
  close reason ``revoked``;
- a link the new group no longer allows is detached (:meth:`.sessions.Sessions.revoke_link`:
  the router first, the client gets ``amqp:unauthorized-access``); its session and connection
  go on;
- a connection the new policy keeps comes under the new group: its message rules (maxMessageSize,
  user-id, router annotations, topic models) and shaping rates apply to new deliveries.

Counts are not questions asked again: a lowered ``maxConnectionsPerUser`` or ``maxSenders``
stops new connections and links only. In ``shadow`` (the mode, or the new group's or vhost's
own ``enforcement: shadow``) nothing changes on the wire: what enforce would do is logged
(``SHADOW REVOKE``) and reported (:class:`~.events.Revoked`).
"""

from __future__ import annotations

import logging
from typing import Any

from ..policy import decisions
from ..policy.keys import SHADOW
from ..policy.reasons import LinkDenyReason
from .context import Context, Room
from .eligibility import refresh_links
from .events import Revoked
from .records import LinkRecord, SessionRecord
from .rules import MessageRules
from .sessions import Sessions
from .tokenauth import open_decision

logger = logging.getLogger(__name__)

ENFORCE = "enforce"
SHADOW_MODE = "shadow"
OFF = "off"
#: The values of ``[policy] reevaluate_open``.
MODES: tuple[str, ...] = (ENFORCE, SHADOW_MODE, OFF)


class Revocation(Room):
    """The re-evaluation of one connection against a reloaded policy."""

    __slots__ = ("sessions", "rules")

    def __init__(self, ctx: Context, sessions: Sessions, rules: MessageRules) -> None:
        """For the connection ``ctx``, its ``sessions`` and message ``rules``."""
        Room.__init__(self, ctx)
        self.sessions = sessions
        self.rules = rules

    def connection(self, policy: Any, now: float, mode: str) -> tuple[str, Any] | None:
        """Ask the Open's questions again under ``policy``.

        Returns:
            None when the connection is kept (its vhost and group under ``policy`` are then
            read with :meth:`decisions.approve_open` again by :meth:`links`), else
            ``(mode, decision)`` for a connection the policy no longer admits: ``enforce``
            (the caller closes it) or ``shadow`` (reported only).
        """
        ctx = self.ctx
        if not policy.settings.enable_vhost_policy or ctx.user is None:
            return None
        decision = open_decision(ctx, policy, ctx.open_hostname)
        if isinstance(decision, decisions.OpenAllowed):
            return None
        shadow = mode == SHADOW_MODE or _shadow_scope(decision.group or decision.vhost)
        self._report("connection", str(decision.reason), shadow, now)
        logger.info("[%s] %s AMQP connection for user '%s', rhost '%s', vhost '%s' after a "
                    "policy reload: %s", ctx.conn_id, "SHADOW REVOKE" if shadow else "REVOKE",
                    ctx.user, ctx.remote_host, ctx.vhost_name, decision.reason)
        return (ENFORCE if not shadow else SHADOW_MODE), decision

    def links(self, policy: Any, now: float, mode: str) -> int:
        """A connection the reloaded ``policy`` keeps: detach (enforce) or report (shadow)
        every attached link the new group no longer allows, then put the connection under
        the new vhost and group (enforce only).

        Returns:
            The links revoked or reported.
        """
        ctx = self.ctx
        if not policy.settings.enable_vhost_policy or ctx.user is None or ctx.group is None:
            return 0
        decision = open_decision(ctx, policy, ctx.open_hostname)
        if not isinstance(decision, decisions.OpenAllowed):
            return 0
        group = decision.group
        shadow = mode == SHADOW_MODE or _shadow_scope(group)
        if not shadow:
            ctx.policy, ctx.vhost, ctx.group = policy, decision.vhost, group
            self.rules.govern(group, ctx.user, ctx.tls_subject)
            refresh_links(self.sessions)  # the user-id check may change (.eligibility)
            shaping = self.sessions.shaping
            if shaping is not None:
                shaping.bucket.set_rates(group.max_message_rate_per_user,
                                         group.max_byte_rate_per_user)
        n = 0
        for session in list(self.sessions.sessions.values()):
            if session.client_ended or session.router_ended:
                continue
            for link in list(session.links.values()):
                if link.client_detached or link.router_detached:
                    continue
                reason = self._link_reason(group, link, now)
                if reason is None:
                    continue
                n += 1
                self._revoke_link(session, link, reason, shadow, now)
        return n

    # ------------------------------------------------------------------ internals

    def _link_reason(self, group: Any, link: LinkRecord, now: float) -> LinkDenyReason | None:
        """The Attach's questions again for ``link`` under ``group`` (counts excepted)."""
        ctx = self.ctx
        user = ctx.user or ""
        if link.is_sender:
            reason = decisions.approve_sender(group, user=user,
                                              target_address=link.address or None,
                                              open_senders=0, naming=ctx.naming)
        else:
            reason = decisions.approve_receiver(group, user=user,
                                                source_address=link.address or None,
                                                dynamic=link.dynamic, open_receivers=0,
                                                naming=ctx.naming)
        if reason is not None:
            return reason
        rules = self.rules
        if (rules.topics is not None and link.address and not link.dynamic
                and (link.node is None or not link.node.by_subject)):
            verdict = rules.check_link(link.is_sender, link.address, link.node, link.qos, now)
            if not verdict.allowed:
                return LinkDenyReason.TOPIC
        return None

    def _revoke_link(self, session: SessionRecord, link: LinkRecord, reason: LinkDenyReason,
                     shadow: bool, now: float) -> None:
        ctx = self.ctx
        role = "sender" if link.is_sender else "receiver"
        logger.info("[%s] %s AMQP Attach %s '%s' for user '%s', rhost '%s', vhost '%s' after a "
                    "policy reload (%s)", ctx.conn_id, "SHADOW REVOKE" if shadow else "REVOKE",
                    role, link.address, ctx.user, ctx.remote_host, ctx.vhost_name, reason)
        self._report("link", str(reason), shadow, now, role=role, address=link.address)
        if not shadow:
            self.sessions.revoke_link(session, link)

    def _report(self, kind: str, reason: str, shadow: bool, now: float, *,
                role: str | None = None, address: str | None = None) -> None:
        self.wire.emit(Revoked(*self.ctx.who(now), kind=kind, reason=reason,
                               mode=SHADOW_MODE if shadow else ENFORCE, role=role,
                               address=address))


def _shadow_scope(scope: Any) -> bool:
    """The group's (else vhost's) own ``enforcement: shadow``."""
    return scope is not None and getattr(scope, "enforcement", None) is SHADOW
