"""Sans-IO. Admission: the decision on the client's Open, and what follows it.

QDR's order (the rules of :mod:`..policy.decisions`): the vhost from the Open's hostname, the
user's group, the client's address against the group's ``remoteHosts``, then the connection
counts (vhost, per user, per host) in the ledger. A denied client gets QDR's Open + Close
``amqp:resource-limit-exceeded`` / ``connection disallowed by local policy`` and the router gets
nothing of its Open. An admitted client's Open goes to the router (its channel-max lowered by
the channels kept back for session denials, decision 0003), followed by what the client
pipelined behind it; the router's frames held meanwhile are relayed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..amqp import constants as C
from ..amqp.constants import Condition
from ..amqp.errors import IllegalStateError
from ..amqp.framing import encode_frame
from ..amqp.handshake import OpenHead, patch_open
from ..amqp.performatives import Open, decode_performative
from ..policy import decisions
from ..policy.lookup import lookup_vhost
from ..policy.reasons import ConnectionDenyReason
from .commands import Side
from .events import ConnectionApproved, ConnectionDenied
from .records import ReservedPool
from .router_side import ROUTER_FRAME_LIMIT
from .sessions import RESERVED_CHANNELS, USHORT_MAX, _checked_replace
from .state import ROUTER_CONNECTED, ClientState, RouterState
from .wire import error, frame

if TYPE_CHECKING:
    from ..policy.model import GroupSettings, VhostPolicy
    from .connection import ProxyConnection

logger = logging.getLogger(__name__)

UINT_MAX = 0xFFFFFFFF


class AdmissionLedger(Protocol):
    """What admission needs from the connection ledger (vhost, per-user, per-host counts).

    :class:`~amqp_policy_proxy.limits.connections.ConnectionLedger` is the in-process one.
    """

    def try_admit(self, conn_id: str, *, vhost: VhostPolicy, group: GroupSettings, user: str,
                  remote_host: str) -> ConnectionDenyReason | None:
        """Count the connection if every limit allows it; else the first failed limit."""

    def release(self, conn_id: str) -> bool:
        """Uncount an admitted connection (exactly once)."""


class Admission:
    """The Open decision of one connection."""

    __slots__ = ("conn", "wire", "sides", "ledger", "in_ledger")

    def __init__(self, conn: ProxyConnection, ledger: AdmissionLedger) -> None:
        """Nothing decided yet."""
        self.conn = conn
        self.wire = conn.wire
        self.sides = conn.sides
        self.ledger = ledger
        self.in_ledger = False
        """The connection is counted in the ledger (released exactly once at the end)."""

    def when_ready(self, now: float) -> None:
        """Decide the client's Open now, or once the upstream is connected.

        Nobody is admitted without an upstream: while the connect is under way the decision
        waits (the client's Open cannot reach the router before that anyway); if no upstream
        accepts, the client is told so without an admission.

        Raises:
            IllegalStateError: an Open before a successful SASL outcome.
        """
        router = self.sides.router
        if router is RouterState.IDLE or router is RouterState.CONNECTING:
            return
        client = self.conn.client
        if router in ROUTER_CONNECTED and client.open is not None:
            try:
                self.decide(client.open, now)
            finally:
                client.open_body = None

    def decide(self, open_: Open | OpenHead, now: float) -> None:
        """Decide the client's Open: admit it or deny it (QDR's order).

        Raises:
            IllegalStateError: an Open before a successful SASL outcome.
        """
        conn = self.conn
        client = conn.client
        if not client.sasl_ok:
            raise IllegalStateError("Open before a successful SASL outcome")
        user = client.sasl_user
        conn.user = user
        conn.handshake_deadline = None
        policy = conn.policy
        if not policy.settings.enable_vhost_policy:
            self._approve(open_, None, None, now)
            return
        hostname = None if open_.hostname is None else str(open_.hostname)
        if user is None:
            conn.vhost = lookup_vhost(policy, hostname)
            self._deny(ConnectionDenyReason.UNKNOWN_USER if conn.vhost
                       else ConnectionDenyReason.NO_VHOST, now)
            return
        decision = decisions.approve_open(policy, hostname=hostname, user=user,
                                          remote_host=conn.client_address)
        conn.vhost = decision.vhost
        conn.group = decision.group
        if isinstance(decision, decisions.OpenDenied):
            logger.info("[%s] %s", conn.conn_id, decision.log)
            self._deny(decision.reason, now)
            return
        reason = self.ledger.try_admit(conn.conn_id, vhost=decision.vhost,
                                       group=decision.group, user=user,
                                       remote_host=conn.remote_host)
        if reason is not None:
            logger.info("[%s] DENY AMQP Open for user '%s', rhost '%s', vhost '%s': %s",
                        conn.conn_id, user, conn.remote_host, decision.vhost.hostname, reason)
            self._deny(reason, now)
            return
        self.in_ledger = True
        self._approve(open_, decision.vhost, decision.group, now)

    def _deny(self, reason: ConnectionDenyReason, now: float) -> None:
        """QDR's connection denial; the router never receives anything of this Open."""
        conn = self.conn
        sides = self.sides
        wire = self.wire
        sides.to_client(ClientState.DENIED)
        conn.close_reason = "denied"
        err = error(Condition.RESOURCE_LIMIT_EXCEEDED, C.CONNECTION_DISALLOWED)
        wire.emit(ConnectionDenied(**conn.ctx(now), reason=reason,
                                   condition=str(err.condition),
                                   description=str(err.description)))
        conn.client.held.clear()
        conn.router.held.clear()
        wire.pending.clear()
        sides.stop_router()
        wire.close_transport(Side.ROUTER)
        conn.send_open_close(err)
        conn.linger(now)

    def _approve(self, open_: Open | OpenHead, vhost: VhostPolicy | None,
                 group: GroupSettings | None, now: float) -> None:
        """Admit: apply the group, forward the Open, replay what both legs sent meanwhile."""
        conn = self.conn
        sides = conn.sessions
        conn.governed = group is not None
        self.sides.to_client(ClientState.OPENED)
        conn.opened_at = now
        if group is not None:
            conn.deliveries.govern(group, conn.user or "", conn.tls_subject)
            if group.max_sessions:
                sides.policy_channel_max = max(0, group.max_sessions - 1)
        self.wire.emit(ConnectionApproved(
            **conn.ctx(now), hostname=None if open_.hostname is None else str(open_.hostname)))
        # Reserve the top of the client's channel-max for synthesized Begin+End replies.
        cmax = min(UINT_MAX if open_.channel_max is None else int(open_.channel_max),
                   USHORT_MAX)
        reserve = min(RESERVED_CHANNELS, cmax // 2)
        sides.reserved_channels = ReservedPool(cmax, reserve)
        body = conn.client.open_body
        if reserve:
            # the client's own bytes with channel-max patched (plain encodings); otherwise
            # re-encoded, refusing fields proton would not re-encode faithfully
            patched = None if body is None else patch_open(body, channel_max=cmax - reserve)
            if patched is not None:
                forward = encode_frame(0, patched)
            else:
                if not isinstance(open_, Open):  # read from bytes, yet not patchable
                    open_, _ = decode_performative(body)
                forward = frame(0, _checked_replace(open_, channel_max=cmax - reserve))
        elif isinstance(open_, OpenHead) and body is not None:
            forward = encode_frame(0, body)  # read from its bytes: relayed as it came
        else:
            forward = frame(0, open_)
        # The router may send frames up to the client's max-frame-size.
        cmfs = UINT_MAX if open_.max_frame_size is None else int(open_.max_frame_size)
        conn.router.frame_limit = max(C.MIN_MAX_FRAME_SIZE, min(cmfs, ROUTER_FRAME_LIMIT))
        self.wire.send(Side.ROUTER, forward)
        conn.router.release_held(now)
        conn.client.release_held(now)

    def release(self) -> None:
        """Uncount the connection in the ledger (once; nothing if it was never counted)."""
        if self.in_ledger:
            self.in_ledger = False
            self.ledger.release(self.conn.conn_id)

