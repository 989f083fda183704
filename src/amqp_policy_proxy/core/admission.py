"""Sans-IO. Admission: the decision on the client's Open, and what follows it.

QDR's order (the rules of :mod:`..policy.decisions`): the vhost from the Open's hostname, the
user's group, the client's address against the group's ``remoteHosts``, then the connection
counts (vhost, per user, per host) in the ledger. A denied client gets QDR's Open + Close
``amqp:resource-limit-exceeded`` / ``connection disallowed by local policy`` and the router gets
nothing of its Open. An admitted client's Open goes to the router (its channel-max lowered by
the channels kept back for session denials, decision 0003), followed by what the client
pipelined behind it, and the router's frames held meanwhile (the facade replays both).

A ledger may answer later (the fleet ledger asks a shared store, docs/decisions/0006): its
``try_admit`` then returns :data:`LEDGER_PENDING`, the client leg stays ``DECIDING`` with its
frames held, and the shell feeds the answer back through
``ProxyConnection.ledger_answered``; the decision is then finished exactly as if the ledger had
answered at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..amqp import constants as C
from ..amqp.constants import Condition
from ..amqp.errors import IllegalStateError
from ..amqp.framing import encode_frame
from ..amqp.handshake import OpenHead, patch_open
from ..amqp.performatives import Open, checked_replace, decode_performative
from ..policy import decisions
from ..policy.lookup import lookup_vhost
from ..policy.reasons import ConnectionDenyReason
from .commands import Side
from .context import ROUTER_FRAME_LIMIT, Context
from .events import ConnectionApproved, ConnectionDenied
from .rules import MessageRules
from .sessions import USHORT_MAX, Sessions
from .state import ClientState
from .wire import error, frame

if TYPE_CHECKING:
    from ..policy.model import GroupSettings, VhostPolicy

logger = logging.getLogger(__name__)

UINT_MAX = 0xFFFFFFFF


class LedgerPending:
    """The type of :data:`LEDGER_PENDING`: the ledger will answer later."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LEDGER_PENDING"


LEDGER_PENDING = LedgerPending()
"""What :meth:`AdmissionLedger.try_admit` returns when its answer comes later, through
``ProxyConnection.ledger_answered`` (the one instance; compare with ``is``)."""


class AdmissionLedger(Protocol):
    """What admission needs from the connection ledger (vhost, per-user, per-host counts).

    :class:`~amqp_policy_proxy.limits.connections.ConnectionLedger` is the in-process one; the
    fleet ledger (``fleet/ledger.py``) answers :data:`LEDGER_PENDING` and later.
    """

    def try_admit(
        self, conn_id: str, *, vhost: VhostPolicy, group: GroupSettings, user: str, remote_host: str
    ) -> ConnectionDenyReason | None | LedgerPending:
        """Count the connection if every limit allows it (None); else the first failed limit;
        or :data:`LEDGER_PENDING` when the answer is fed back later."""

    def release(self, conn_id: str) -> bool:
        """Uncount an admitted connection (exactly once); for a pending one, uncount it when
        its answer comes (the answer is then not fed back)."""


class Admission:
    """The Open decision of one connection."""

    __slots__ = ("ctx", "wire", "sides", "sessions", "rules", "ledger", "in_ledger", "waiting")

    def __init__(
        self, ctx: Context, sessions: Sessions, rules: MessageRules, ledger: AdmissionLedger
    ) -> None:
        """Nothing decided yet."""
        self.ctx = ctx
        self.wire = ctx.wire
        self.sides = ctx.sides
        self.sessions = sessions
        self.rules = rules
        self.ledger = ledger
        self.in_ledger = False
        """The connection is counted in the ledger, or may be once a pending answer comes
        (released exactly once at the end)."""
        self.waiting: tuple[Open | OpenHead, bytes | None, GroupSettings, str] | None = None
        """While the ledger's answer is pending: the Open, its body, the group and the user."""

    def decide(self, open_: Open | OpenHead, body: bytes | None, now: float) -> bool | None:
        """Decide the client's Open (``body``: its frame body as received): admit it or deny
        it, in QDR's order.

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
        if not policy.settings.enable_vhost_policy:
            self._approve(open_, body, None, now)
            return True
        hostname = None if open_.hostname is None else str(open_.hostname)
        if user is None:
            ctx.vhost = lookup_vhost(policy, hostname)
            self._deny(
                ConnectionDenyReason.UNKNOWN_USER if ctx.vhost else ConnectionDenyReason.NO_VHOST,
                now,
            )
            return False
        decision = decisions.approve_open(
            policy, hostname=hostname, user=user, remote_host=ctx.client_address
        )
        ctx.vhost = decision.vhost
        ctx.group = decision.group
        if isinstance(decision, decisions.OpenDenied):
            logger.info("[%s] %s", ctx.conn_id, decision.log)
            self._deny(decision.reason, now)
            return False
        reason = self.ledger.try_admit(
            ctx.conn_id,
            vhost=decision.vhost,
            group=decision.group,
            user=user,
            remote_host=ctx.remote_host,
        )
        if reason is LEDGER_PENDING:
            self.in_ledger = True  # the ledger may count it before the answer comes
            self.waiting = (open_, body, decision.group, user)
            ctx.handshake_deadline = deadline
            return None
        return self._counted(reason, open_, body, decision.group, user, now)

    def answered(self, reason: ConnectionDenyReason | None, now: float) -> bool | None:
        """Finish a decision the ledger answered later (see :meth:`decide`).

        Args:
            reason: the ledger's answer: None admitted, else the failed limit.
            now: loop-clock seconds.

        Returns:
            True admitted, False denied, None when no decision was waiting (nothing done).
        """
        waiting, self.waiting = self.waiting, None
        if waiting is None:
            return None
        open_, body, group, user = waiting
        self.ctx.handshake_deadline = None
        if reason is not None:
            self.in_ledger = False
        return self._counted(reason, open_, body, group, user, now)

    def _counted(
        self,
        reason: ConnectionDenyReason | None | LedgerPending,
        open_: Open | OpenHead,
        body: bytes | None,
        group: GroupSettings,
        user: str,
        now: float,
    ) -> bool:
        """Approve or deny on the ledger's answer."""
        ctx = self.ctx
        if reason is not None:
            assert reason is not LEDGER_PENDING
            logger.info(
                "[%s] DENY AMQP Open for user '%s', rhost '%s', vhost '%s': %s",
                ctx.conn_id,
                user,
                ctx.remote_host,
                ctx.vhost_name,
                reason,
            )
            self._deny(reason, now)  # type: ignore[arg-type]
            return False
        self.in_ledger = True
        self._approve(open_, body, group, now)
        return True

    def _deny(self, reason: ConnectionDenyReason, now: float) -> None:
        """QDR's connection denial; the router never receives anything of this Open."""
        ctx = self.ctx
        sides = self.sides
        wire = self.wire
        sides.to_client(ClientState.DENIED)
        ctx.close_reason = "denied"
        err = error(Condition.RESOURCE_LIMIT_EXCEEDED, C.CONNECTION_DISALLOWED)
        wire.emit(
            ConnectionDenied(
                **ctx.event_fields(now),
                reason=reason,
                condition=str(err.condition),
                description=str(err.description),
            )
        )
        wire.pending.clear()
        sides.stop_router()
        wire.close_transport(Side.ROUTER)
        ctx.send_open_close(err)
        ctx.linger(now)

    def _approve(
        self, open_: Open | OpenHead, body: bytes | None, group: GroupSettings | None, now: float
    ) -> None:
        """Admit: apply the group and forward the Open (its channel-max lowered by the
        channels kept back for session denials)."""
        ctx = self.ctx
        ctx.governed = group is not None
        self.sides.to_client(ClientState.OPENED)
        ctx.opened_at = now
        if group is not None:
            self.rules.govern(group, ctx.user or "", ctx.tls_subject)
            if group.max_sessions:
                self.sessions.policy_channel_max = max(0, group.max_sessions - 1)
        self.wire.emit(
            ConnectionApproved(
                **ctx.event_fields(now),
                hostname=None if open_.hostname is None else str(open_.hostname),
            )
        )
        cmax = min(UINT_MAX if open_.channel_max is None else int(open_.channel_max), USHORT_MAX)
        given = self.sessions.reserve_channels(cmax)
        if given != cmax:
            # the client's own bytes with channel-max patched (plain encodings); otherwise
            # re-encoded, refusing fields proton would not re-encode faithfully
            patched = None if body is None else patch_open(body, channel_max=given)
            if patched is not None:
                forward = encode_frame(0, patched)
            else:
                if not isinstance(open_, Open):  # read from bytes, yet not patchable
                    open_, _ = decode_performative(body)
                forward = frame(0, checked_replace(open_, channel_max=given))
        elif isinstance(open_, OpenHead) and body is not None:
            forward = encode_frame(0, body)  # read from its bytes: relayed as it came
        else:
            forward = frame(0, open_)
        # The router may send frames up to the client's max-frame-size.
        cmfs = UINT_MAX if open_.max_frame_size is None else int(open_.max_frame_size)
        ctx.router_frame_limit = max(C.MIN_MAX_FRAME_SIZE, min(cmfs, ROUTER_FRAME_LIMIT))
        self.wire.send(Side.ROUTER, forward)

    def release(self) -> None:
        """Uncount the connection in the ledger (once; nothing if it was never counted)."""
        if self.in_ledger:
            self.in_ledger = False
            self.ledger.release(self.ctx.conn_id)
