"""Sans-IO. Admission: the decision on the client's Open, and what follows it.

QDR's order (the rules of :mod:`..policy.decisions`): the vhost from the Open's hostname, the
user's group, the client's address against the group's ``remoteHosts``, then the connection
counts (vhost, per user, per host) in the ledger, then (an extension over QDR) the connection
rates (vhost, per user, per host) in the shared token buckets. Rates come after counts so that
every connection QDR would deny is denied with QDR's reason; a connection over a rate is
uncounted at once (it never holds a count slot) and takes no token. A denied client gets QDR's Open + Close
``amqp:resource-limit-exceeded`` / ``connection disallowed by local policy`` and the router gets
nothing of its Open. An admitted client's Open goes to the router (its channel-max lowered by
the channels kept back for session denials, decision 0003), followed by what the client
pipelined behind it, and the router's frames held meanwhile (the facade replays both).

Three things beyond QDR: a banned user or client address (the daemon's ban list, read
through :class:`AdmissionBans` at the decision) is denied before anything else, reason
``banned``, whatever the policy says; a vhost an operator paused (the daemon's set, read
through a plain ``Container[str]``) is denied next, reason ``vhost_paused``; and in shadow mode
(:mod:`.shadow`) the first would-be denial is logged ``SHADOW DENY`` and the connection is
admitted and counted. Each decision is emitted with the rule that decided
(:class:`~.events.OpenDecided`, the event log's ``auth_decision``).

A ledger may answer later (the fleet ledger asks a shared store, docs/decisions/0006): its
``try_admit`` then returns :data:`LEDGER_PENDING`, the client leg stays ``DECIDING`` with its
frames held, and the shell feeds the answer back through
``ProxyConnection.ledger_answered``; the decision is then finished exactly as if the ledger had
answered at once.
"""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..amqp import constants as C
from ..amqp.constants import UINT_MAX, USHORT_MAX, Condition
from ..amqp.errors import IllegalStateError
from ..amqp.framing import encode_frame
from ..amqp.handshake import OpenHead, patch_open
from ..amqp.performatives import Open, checked_replace, decode_as
from ..policy import decisions
from ..policy.lookup import lookup_vhost
from ..policy.model import GroupSettings
from ..policy.reasons import ConnectionDenyReason, DenialKind
from .commands import ROUTER
from .context import ROUTER_FRAME_LIMIT, Context, Room
from .eligibility import refresh_links
from .events import ConnectionApproved, ConnectionDenied, OpenDecided
from .rules import MessageRules
from .sessions import Sessions
from .shadow import in_shadow, shadowed, verb
from .state import C_DENIED, C_OPENED
from .tokenauth import open_decision
from .wire import error, frame

if TYPE_CHECKING:
    from ..policy.model import VhostPolicy

logger = logging.getLogger(__name__)

#: The ledger's group for an unknown user admitted in shadow mode (it has no group: its
#: sessions, links and messages are not checked); counted under group ``""``.
UNGROUPED = GroupSettings(name="")


class LedgerPending:
    """The type of :data:`LEDGER_PENDING`: the ledger will answer later."""

    __slots__ = ()

    def __repr__(self) -> str:
        """``LEDGER_PENDING``, the name it is known by."""
        return "LEDGER_PENDING"


LEDGER_PENDING = LedgerPending()
"""What :meth:`AdmissionLedger.try_admit` returns when its answer comes later, through
``ProxyConnection.ledger_answered`` (the one instance; compare with ``is``)."""


class AdmissionLedger(Protocol):
    """What admission needs from the connection ledger (vhost, per-user, per-host counts).

    :class:`~amqp_policy_proxy.limits.connections.ConnectionLedger` is the in-process one.
    """

    def try_admit(
        self,
        conn_id: str,
        *,
        vhost: VhostPolicy,
        group: GroupSettings,
        user: str,
        remote_host: str,
        enforce: bool = True,
    ) -> ConnectionDenyReason | None | LedgerPending:
        """Count the connection if every limit allows it (None); else the first failed limit
        (with ``enforce`` False, shadow mode: counted anyway, the failed limit still
        returned); or :data:`LEDGER_PENDING` when the answer is fed back later."""

    def release(self, conn_id: str) -> bool:
        """Uncount an admitted connection (exactly once); for a pending one, uncount it when
        its answer comes (the answer is then not fed back)."""


class AdmissionRates(Protocol):
    """What admission needs from the connection-rate buckets (vhost, per user, per host).

    :class:`~amqp_policy_proxy.limits.rates.RateLimits` is the in-process one.
    """

    def try_admit(
        self, *, vhost: VhostPolicy, group: GroupSettings, user: str, remote_host: str,
        now: float
    ) -> ConnectionDenyReason | None:
        """Take a token from each limited bucket if all have one; else the first without."""


class AdmissionBans(Protocol):
    """What admission needs from the ban list (the daemon's live one, so a ban applies to
    Opens already on their way). :class:`~amqp_policy_proxy.limits.bans.BanList` is it."""

    def banned(self, user: str | None, remote_host: str, now: float) -> str | None:
        """The rule text of the ban that refuses ``user`` (None: not known) connecting from
        ``remote_host`` at ``now`` (loop-clock seconds), or None."""


class _Waiting(NamedTuple):
    """A decision between the policy's rules and the ledger's answer."""

    open_: Open | OpenHead
    body: bytes | None
    vhost: VhostPolicy
    group: GroupSettings | None
    user: str
    hostname: str | None
    decision: decisions.OpenAllowed | decisions.OpenDenied
    would: tuple[ConnectionDenyReason, str] | None
    shadow: bool


class Admission(Room):
    """The Open decision of one connection."""

    __slots__ = ("sessions", "rules", "ledger", "rates", "in_ledger",
                 "paused", "bans", "waiting")

    def __init__(
        self,
        ctx: Context,
        sessions: Sessions,
        rules: MessageRules,
        ledger: AdmissionLedger,
        rates: AdmissionRates | None = None,
        paused: Container[str] = frozenset(),
        bans: AdmissionBans | None = None,
    ) -> None:
        """Nothing decided yet. Without ``rates`` no connection rate is enforced. ``paused``:
        the vhost names an operator paused, read at the decision (the daemon's live set: a
        pause applies to Opens already on their way). ``bans``: the daemon's ban list, read
        at the decision; None: nobody is banned."""
        Room.__init__(self, ctx)
        self.paused = paused
        self.bans = bans
        self.sessions = sessions
        self.rules = rules
        self.ledger = ledger
        self.rates = rates
        self.in_ledger = False
        """The connection is counted in the ledger, or may be once a pending answer comes
        (released exactly once at the end)."""
        self.waiting: _Waiting | None = None
        """While the ledger's answer is pending: what the rest of the decision needs."""

    def decide(self, open_: Open | OpenHead, body: bytes | None, now: float) -> bool | None:
        """Decide the client's Open (``body``: its frame body as received): admit it or deny
        it, in QDR's order; a paused vhost is denied first, and in shadow mode a would-be
        denial is admitted and reported (:mod:`.shadow`). Every decision emits
        :class:`~.events.OpenDecided` with the rule that decided.

        Returns:
            True when admitted (the Open is on its way to the router), False when denied,
            None when the ledger answers later (:meth:`answered` finishes the decision; the
            handshake deadline still runs meanwhile).

        Raises:
            IllegalStateError: an Open before a successful SASL outcome.
        """
        ctx = self.ctx
        if not ctx.sasl_ok:
            raise IllegalStateError("Open before a successful SASL outcome")
        user = ctx.sasl_user
        ctx.user = user
        deadline, ctx.handshake_deadline = ctx.handshake_deadline, None
        policy = ctx.policy
        hostname = None if open_.hostname is None else str(open_.hostname)
        ctx.open_hostname = hostname
        bans = self.bans
        if bans is not None:
            ban = bans.banned(user, ctx.remote_host, now)
            if ban is not None:
                ctx.vhost = lookup_vhost(policy, hostname)  # the denial's vhost label
                logger.info("[%s] DENY AMQP Open for user '%s', rhost '%s': %s", ctx.conn_id,
                            user, ctx.remote_host, ban)
                self._deny(ConnectionDenyReason.BANNED, ban, hostname, now)
                return False
        if not policy.settings.enable_vhost_policy:
            self._decided("allow", None, "enableVhostPolicy is false", hostname, now)
            self._approve(open_, body, None, now)
            return True
        if user is None:
            ctx.vhost = lookup_vhost(policy, hostname)
            self._deny(
                ConnectionDenyReason.UNKNOWN_USER if ctx.vhost else ConnectionDenyReason.NO_VHOST,
                "no authenticated user name", hostname, now)
            return False
        decision = open_decision(ctx, policy, hostname)  # (a token's groups: .tokenauth)
        vhost = ctx.vhost = decision.vhost
        ctx.group = decision.group
        if vhost is not None and vhost.hostname in self.paused:
            logger.info(
                "[%s] DENY AMQP Open for user '%s', rhost '%s', vhost '%s': vhost paused by "
                "an operator", ctx.conn_id, user, ctx.remote_host, vhost.hostname,
            )
            self._deny(ConnectionDenyReason.VHOST_PAUSED,
                       f"vhost '{vhost.hostname}' paused by an operator", hostname, now)
            return False
        shadow = in_shadow(ctx)
        would: tuple[ConnectionDenyReason, str] | None = None  # a denial shadow lets through
        if isinstance(decision, decisions.OpenDenied):
            logger.info("[%s] %s%s", ctx.conn_id, "SHADOW " if shadow else "", decision.log)
            if not shadow:
                self._deny(decision.reason, decision.rule, hostname, now)
                return False
            would = (decision.reason, decision.rule)
        group = decision.group
        assert vhost is not None
        reason = self.ledger.try_admit(
            ctx.conn_id,
            vhost=vhost,
            group=group if group is not None else UNGROUPED,
            user=user,
            remote_host=ctx.remote_host,
            enforce=not shadow,
        )
        waiting = _Waiting(open_, body, vhost, group, user, hostname, decision, would, shadow)
        if isinstance(reason, LedgerPending):  # (LEDGER_PENDING, the one instance)
            self.in_ledger = True  # the ledger may count it before the answer comes
            self.waiting = waiting
            ctx.handshake_deadline = deadline
            return None
        return self._counted(reason, waiting, now)

    def answered(self, reason: ConnectionDenyReason | None, now: float) -> bool | None:
        """Finish a decision the ledger answered later (see :meth:`decide`).

        Args:
            reason: the ledger's answer: None counted (admitted), else the failed limit (in
                shadow mode the connection is counted anyway and this is the would-be
                denial).
            now: loop-clock seconds.

        Returns:
            True admitted, False denied, None when no decision was waiting (nothing done).
        """
        waiting, self.waiting = self.waiting, None
        if waiting is None:
            return None
        self.ctx.handshake_deadline = None
        if reason is not None and not waiting.shadow:
            self.in_ledger = False
        return self._counted(reason, waiting, now)

    def _counted(self, reason: ConnectionDenyReason | None, w: _Waiting, now: float) -> bool:
        """Finish the decision on the ledger's answer: the connection rates, then approve or
        deny (in shadow mode, approve and report the first would-be denial)."""
        ctx = self.ctx
        vhost, group, user, shadow, would = w.vhost, w.group, w.user, w.shadow, w.would
        if reason is None and would is None and self.rates is not None:
            reason = self.rates.try_admit(vhost=vhost, group=group or UNGROUPED, user=user,
                                          remote_host=ctx.remote_host, now=now)
            if reason is not None and not shadow:
                self.ledger.release(ctx.conn_id)  # a denied connection holds no count slot
        if reason is not None and would is None:
            logger.info(
                "[%s] %s AMQP Open for user '%s', rhost '%s', vhost '%s': %s",
                ctx.conn_id,
                verb(shadow),
                user,
                ctx.remote_host,
                vhost.hostname,
                reason,
            )
            rule = decisions.count_rule(reason, vhost, group or UNGROUPED)
            if not shadow:
                self._deny(reason, rule, w.hostname, now)
                return False
            would = (reason, rule)
        self.in_ledger = True
        if would is not None:
            shadowed(ctx, DenialKind.CONNECTION, would[0], now)
            self._decided("allow", would[0], would[1], w.hostname, now)
        else:
            decision = w.decision
            rule = decision.rule if isinstance(decision, decisions.OpenAllowed) else ""
            self._decided("allow", None, f"{rule}; counts within limits", w.hostname, now)
        self._approve(w.open_, w.body, group, now)
        return True

    def _decided(
        self, decision: str, reason: str | None, rule: str, hostname: str | None, now: float
    ) -> None:
        """Emit the audit trail's record of this Open decision (``auth_decision``)."""
        ctx = self.ctx
        self.wire.emit(
            OpenDecided(
                *ctx.who(now),
                decision=decision,
                reason=None if reason is None else str(reason),
                # a denial is always enforced (a pause too, in a vhost in shadow)
                enforcement="shadow" if decision == "allow" and in_shadow(ctx) else "enforce",
                rule=rule,
                hostname=hostname,
            )
        )

    def _deny(
        self, reason: ConnectionDenyReason, rule: str, hostname: str | None, now: float
    ) -> None:
        """QDR's connection denial; the router never receives anything of this Open."""
        ctx = self.ctx
        sides = self.sides
        wire = self.wire
        sides.to_client(C_DENIED)
        ctx.close_reason = "denied"
        err = error(Condition.RESOURCE_LIMIT_EXCEEDED, C.CONNECTION_DISALLOWED)
        self._decided("deny", reason, rule, hostname, now)
        wire.emit(
            ConnectionDenied(
                *ctx.who(now),
                reason=reason,
                condition=str(err.condition),
                description=str(err.description),
            )
        )
        wire.pending.clear()
        sides.stop_router()
        wire.close_transport(ROUTER)
        ctx.send_open_close(err)
        ctx.linger(now)

    def _approve(
        self, open_: Open | OpenHead, body: bytes | None, group: GroupSettings | None, now: float
    ) -> None:
        """Admit: apply the group and forward the Open (its channel-max lowered by the
        channels kept back for session denials)."""
        ctx = self.ctx
        ctx.governed = group is not None
        self.sides.to_client(C_OPENED)
        ctx.opened_at = now
        if group is not None:
            self.rules.govern(group, ctx.user or "", ctx.tls_subject)
            refresh_links(self.sessions)  # the user-id check may change (.eligibility)
            # in shadow nothing on the wire changes: channel-max is not lowered, so Begins
            # beyond maxSessions reach the session check and are reported there
            if group.max_sessions and not group.shadow:
                self.sessions.policy_channel_max = max(0, group.max_sessions - 1)
        self.wire.emit(
            ConnectionApproved(
                *ctx.who(now),
                hostname=None if open_.hostname is None else str(open_.hostname),
            )
        )
        cmax = min(UINT_MAX if open_.channel_max is None else int(open_.channel_max), USHORT_MAX)
        given = self.sessions.reserve_channels(cmax)
        if given != cmax:
            # the client's own bytes with channel-max patched (plain encodings); otherwise
            # re-encoded, refusing fields proton would not re-encode faithfully
            patched = None if body is None else patch_open(
                body, channel_max=given,
                fields=open_.fields if isinstance(open_, OpenHead) else None)
            if patched is not None:
                forward = encode_frame(0, patched)
            else:
                if not isinstance(open_, Open):  # read from bytes, yet not patchable
                    assert body is not None, "an OpenHead is read from the Open's bytes"
                    open_ = decode_as(body, Open)
                forward = frame(0, checked_replace(open_, channel_max=given))
        elif isinstance(open_, OpenHead) and body is not None:
            forward = encode_frame(0, body)  # read from its bytes: relayed as it came
        else:
            forward = frame(0, open_)
        # The router may send frames up to the client's max-frame-size.
        cmfs = UINT_MAX if open_.max_frame_size is None else int(open_.max_frame_size)
        ctx.router_frame_limit = max(C.MIN_MAX_FRAME_SIZE, min(cmfs, ROUTER_FRAME_LIMIT))
        self.wire.send(ROUTER, forward)

    def release(self) -> None:
        """Uncount the connection in the ledger (once; nothing if it was never counted)."""
        if self.in_ledger:
            self.in_ledger = False
            self.ledger.release(self.ctx.conn_id)
