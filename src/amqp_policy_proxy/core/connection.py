"""Sans-IO. ``ProxyConnection``: one proxied AMQP 1.0 connection, bytes and ``now`` in,
commands out.

The shell (``daemon/relay.py``) feeds it what each transport delivers and executes the returned
commands in order; nothing here touches sockets or clocks. ``ProxyConnection`` is a facade over
one room per concern:

=====================  =========================================================================
:mod:`.state`          the states of both legs and the legal transitions (tables)
:mod:`.wire`           what is written to which leg, in order; the run of forwarded bytes
:mod:`.client_side`    the client's header, SASL frames, Open and the dispatch of its frames
:mod:`.router_side`    the router's header, SASL frames, held and relayed frames, its Open
:mod:`.admission`      the Open decision: admit (forward the Open) or deny (QDR's Open+Close)
:mod:`.sessions`       Begin, Attach, Flow, Detach, End: records, counts, session/link denials
:mod:`.deliveries`     Transfers: message size, per-message checks, withheld deliveries
:mod:`.fastpath`       admitted client frames that need no decision (with the C scanner)
:mod:`.shaping`        the user's message and byte rates, enforced through link-credit
:mod:`.view`           what the shell may read: figures and a read-only view
=====================  =========================================================================

This module keeps the connection's life: the upstream connecting or failing, transports lost,
the timers (handshake timeout, linger after a Close, credit shaping's refills: the earliest
deadline wins), the graceful drain, and the boundary
where a protocol violation (an :class:`~amqp_policy_proxy.amqp.errors.AmqpError` raised deep
in a handler) becomes a Close of this one connection.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Container
from typing import Any, Protocol

from ..amqp import constants as C
from ..amqp.constants import Condition
from ..amqp.errors import AmqpError
from ..policy.decisions import OpenAllowed
from ..policy.reasons import ConnectionDenyReason
from ..tokens.claims import TokenIdentity, seconds_left
from .admission import Admission, AdmissionBans, AdmissionLedger, AdmissionRates
from .client_side import ClientSide
from .commands import CLIENT, ROUTER, Command, Side
from .context import HANDSHAKE_SECONDS, LINGER_SECONDS, Context
from .deliveries import Deliveries
from .eligibility import refresh_router
from .events import ConnectionClosed, ConnectionDenied, ProtocolViolation
from .proxylinks import GROUPS_DENIED
from .revocation import ENFORCE, OFF, Revocation
from .router_side import RouterSide
from .rules import MessageRules
from .sessions import Sessions
from .shaping import Shaping, ShapingBuckets
from .state import (
    C_AWAIT_AMQP_HEADER,
    C_AWAIT_OPEN,
    C_CLOSED,
    C_CLOSING,
    C_DECIDING,
    C_OPENED,
    C_STOPPED,
    C_UNAVAILABLE,
    CLIENT_AMQP,
    R_AMQP,
    R_AWAIT_HEADER,
    R_CLOSED,
    R_CONNECTING,
    R_FAILED,
    R_IDLE,
    ROUTER_CONNECTED,
)
from .tokenauth import TOKEN_EXPIRED, ServiceLogin, TokenCheck, token_open_decision
from .view import ConnectionView
from .wire import error

logger = logging.getLogger(__name__)

__all__ = ["HANDSHAKE_SECONDS", "LINGER_SECONDS", "ProxyConnection"]

#: Seconds a client of an unreachable upstream has to read its answer before it is closed.
UNAVAILABLE_LINGER_SECONDS = 10.0
UPSTREAM_UNAVAILABLE = "no upstream available"
UPSTREAM_LOST = "upstream connection lost"
#: Close descriptions of the connection's end (:meth:`ProxyConnection.set_expiry`).
CREDENTIAL_EXPIRED = "credential expired"
LIFETIME_REACHED = "maximum connection lifetime reached"
#: Up to this fraction of ``maxConnectionLifetimeSeconds`` earlier, spread by connection id.
LIFETIME_SPREAD = 0.1


class RateLimits(AdmissionRates, ShapingBuckets, Protocol):
    """The shared rate buckets: connection rates at the Open, message and byte rates of
    users (``limits.rates.RateLimits``)."""


class ProxyConnection(Context):
    """One client connection and its upstream leg, as a sans-IO state machine.

    Inputs: :meth:`receive_data`, :meth:`router_connected`, :meth:`router_connect_failed`,
    :meth:`ledger_answered`, :meth:`connection_lost`, :meth:`handle_timer`,
    :meth:`begin_shutdown`, :meth:`close_by_operator`, :meth:`internal_error`. Each returns
    the commands to execute, in order.
    :meth:`get_timer` says when to call :meth:`handle_timer` next (loop-clock seconds).
    :attr:`view` is what the shell may read.
    """

    __slots__ = ("rules", "sessions", "deliveries", "client", "router", "admission", "rates",
                 "revocation_due")

    def __init__(
        self,
        conn_id: str,
        *,
        ledger: AdmissionLedger,
        paused_vhosts: Container[str] = frozenset(),
        rates: RateLimits | None = None,
        bans: AdmissionBans | None = None,
        **facts: Any,
    ) -> None:
        """Create the state machine for a freshly accepted client transport.

        Args:
            conn_id: unique id for logs and events.
            ledger: the vhost/user/host connection counts (the global count at accept is the
                shell's).
            paused_vhosts: vhost names an operator paused: an Open to one of them is denied
                (``vhost_paused``). Read at the Open decision, so the daemon passes its live
                set.
            rates: the connection-rate and shaping buckets shared by the daemon's
                connections; None: no rate limit (connection, message or byte) applies.
            bans: the daemon's ban list: a banned user or client address is denied at the
                Open (``banned``). Read at the decision; None: nobody is banned.
            facts: the connection's facts, the keyword arguments of
                :class:`~.context.Context` (``remote_host``, ``listener``, ``policy``, ``now``
                and the optional ``handshake_timeout``, ``container_id``, ``tls_subject``,
                ``wall_offset``, ``balancer_host``).
        """
        Context.__init__(self, conn_id, **facts)
        self.revocation_due = False
        """A re-evaluation decided that this connection must close and left the Close to
        :meth:`close_revoked` (a paced close, ``[policy] reevaluate_close_rate``)."""
        self.rules = MessageRules(self)
        self.sessions = Sessions(self, self.rules)
        self.deliveries = Deliveries(self, self.sessions, self.rules)
        self.client = ClientSide(self, self.sessions, self.deliveries, self._decide_when_ready)
        self.router = RouterSide(self, self.sessions, self.deliveries,
                                 self._login_done, self._login_failed)
        self.admission = Admission(self, self.sessions, self.rules, ledger, rates,
                                   paused_vhosts, bans)
        self.rates = rates
        self.sessions.proxy.renewed = self._renewed

    @property
    def view(self) -> ConnectionView:
        """What the shell may read of this connection (a new view per call: the shell keeps
        it as long as it likes, and the connection holds no reference back to it)."""
        return ConnectionView(self, self.client, self.router)

    # ------------------------------------------------------------------ the Open decision

    def _decide_when_ready(self, now: float) -> None:
        """Decide the client's Open now, or once the upstream is connected (called when the
        client's Open is here, the client leg DECIDING, and when the upstream connects).

        Nobody is admitted without an upstream: while the connect is under way the decision
        waits (the Open could not reach the router before that anyway); if no upstream
        accepts, the client is told so without an admission. Once admitted, the router's
        frames held meanwhile (its Open, usually) are relayed, then what the client pipelined
        behind its Open; once denied, both are dropped.

        Raises:
            AmqpError: a protocol violation in the client's Open or the held frames.
        """
        router = self.sides.router
        client = self.client
        if router not in ROUTER_CONNECTED or client.open is None:
            return
        tokens = self.tokens
        if tokens is not None and tokens.proxy and not self.service_ok:
            return  # the proxy's own login to the router is not over yet
        try:
            approved = self.admission.decide(client.open, client.open_body, now)
        finally:
            client.open = client.open_body = None  # decided: not kept for the connection's life
        self._decided(approved, now)

    def _decided(self, approved: bool | None, now: float) -> None:
        """Replay or drop what was held behind the Open, once it is decided (None: the
        ledger answers later, everything stays held)."""
        client = self.client
        if approved is None:
            return
        if approved:
            self._shape(now)
            self._arm_expiry(now)
            self.router.release_held(now)
            client.release_held(now)
        else:
            client.held.clear()
            self.router.held.clear()

    def _shape(self, now: float) -> None:
        """An admitted user whose group has ``maxMessageRatePerUser`` or
        ``maxByteRatePerUser``: its sending links are shaped (:mod:`.shaping`)."""
        group = self.group
        rates = self.rates
        if group is None or rates is None:
            return
        if not (group.max_message_rate_per_user or group.max_byte_rate_per_user):
            return
        bucket = rates.acquire(vhost=self.vhost_name or "", group=group.name,
                               user=self.user or "", message_rate=group.max_message_rate_per_user,
                               byte_rate=group.max_byte_rate_per_user, now=now)
        self.sessions.shaping = Shaping(self, rates, bucket)
        refresh_router(self.sessions)

    def _arm_expiry(self, now: float) -> None:
        """An admitted connection's end: when the client certificate it authenticated with
        (SASL EXTERNAL) expires, and when its group's ``maxConnectionLifetimeSeconds`` is
        reached (up to a tenth earlier, spread by connection id so that connections opened
        together do not all close and reconnect together)."""
        token = self.token
        if token is not None and self.tokens is not None:  # exp + grace, on the loop clock
            left = seconds_left(token.identity, self.tokens.config, now + self.wall_offset)
            self.set_expiry(now + left, Condition.UNAUTHORIZED_ACCESS, TOKEN_EXPIRED,
                            "token_expired")
        not_after = self.tls_not_after
        if not_after is not None and (self.sasl_mechanism or "").upper() == "EXTERNAL":
            self.set_expiry(not_after - self.wall_offset, Condition.UNAUTHORIZED_ACCESS,
                            CREDENTIAL_EXPIRED, "credential_expired")
        group = self.group
        lifetime = None if group is None else group.max_connection_lifetime_seconds
        if lifetime:
            spread = (zlib.crc32(self.conn_id.encode()) % 1000) / 1000 * LIFETIME_SPREAD
            base = now if self.opened_at is None else self.opened_at
            self.set_expiry(base + lifetime * (1 - spread), Condition.CONNECTION_FORCED,
                            LIFETIME_REACHED, "lifetime")

    def _renewed(self, identity: TokenIdentity, now: float) -> str | None:
        """An in-band renewal the tokens package accepted (:mod:`.proxylinks`): the
        connection's identity becomes ``identity`` when its groups still admit the connection
        (the Open's questions asked again under them); then its links are re-checked under the
        new group (those it no longer allows are detached with ``amqp:unauthorized-access``,
        :meth:`.revocation.Revocation.links`) and its end moves to the new ``exp`` (the
        lifetime and certificate deadlines stay).

        Returns:
            None when applied; the refusal in words when the new groups do not admit the
            connection (nothing changed).
        """
        token = self.token
        assert token is not None
        policy = self.policy
        if policy.settings.enable_vhost_policy and self.group is not None:
            decision = token_open_decision(policy, hostname=self.open_hostname,
                                           identity=identity, remote_host=self.client_address)
            if not isinstance(decision, OpenAllowed):
                return (f"{GROUPS_DENIED}: the new token's groups do not admit this "
                        f"connection ({decision.reason})")
        self.token = TokenCheck(identity, token.mechanism)
        if self.group is not None:
            Revocation(self, self.sessions, self.rules).links(policy, now, ENFORCE)
        self.expiry_deadline = None
        self.expiry = None
        self._arm_expiry(now)
        return None

    def set_expiry(self, deadline: float, condition: str, description: str,
                   reason: str) -> None:
        """End this connection at ``deadline`` (loop clock) with Close(``condition``,
        ``description``), close reason ``reason``, unless an earlier end is set already. The
        one per-connection deadline of expiring credentials and lifetimes (token expiry uses
        it too). A deadline already past ends the connection at the next timer."""
        if self.expiry_deadline is None or deadline < self.expiry_deadline:
            self.expiry_deadline = deadline
            self.expiry = (str(condition), description, reason)

    # ------------------------------------------------------------------ public inputs

    def receive_data(self, side: Side, data: bytes, now: float) -> list[Command]:
        """Feed bytes received from ``side`` (any split; frames may span calls).

        Returns:
            Commands to execute in order.
        """
        out: list[Command] = []
        self.wire.out = out
        if self.finished or not data:
            return out
        try:
            if side is CLIENT:
                self.figures.bytes_in += len(data)
                self.client.data(data, now)
            else:
                self.figures.bytes_out += len(data)
                self.router.data(data, now)
        except AmqpError as exc:
            self._violation(side, exc, now)
        return out

    def router_connected(self, now: float, *,
                         login: ServiceLogin | None = None) -> list[Command]:
        """The upstream transport is up: send what the client sent meanwhile.

        Args:
            now: loop-clock seconds.
            login: the service identity for this upstream, with which the proxy logs in to
                it for token connections of ``token_authority = "proxy"`` (ignored
                otherwise).
        """
        out: list[Command] = self._begin()
        if login is not None:
            self.service_login = login
        sides = self.sides
        if self.finished or sides.router is not R_CONNECTING:
            self.wire.close_transport(ROUTER)
            return out
        sides.to_router(R_AWAIT_HEADER)
        pending = self.wire.take_pending()
        if pending:
            self.wire.send(ROUTER, pending)
        tokens = self.tokens
        if tokens is not None and tokens.proxy and self.service_login is not None:
            # the proxy's login pipelined behind its SASL header: its sasl-init and the AMQP
            # header go now, not one round trip each later (the router side still checks
            # that the router offers the mechanism, and the Open waits for its ``ok``)
            self.wire.send(ROUTER, self.service_login.sasl_init_frame() + C.AMQP_HEADER)
        if sides.client is C_DECIDING:
            try:
                self._decide_when_ready(now)
            except AmqpError as exc:
                self._violation(CLIENT, exc, now)
        return out

    def ledger_answered(self, reason: ConnectionDenyReason | None, now: float) -> list[Command]:
        """The ledger's answer to a decision it left pending (``LEDGER_PENDING``).

        Args:
            reason: None when the connection is counted (admitted), else the failed limit
                (the client gets QDR's denial, as with an immediate answer).
            now: loop-clock seconds.

        Returns:
            Commands to execute in order (none when the connection is finished or was not
            waiting for the ledger).
        """
        out = self._begin()
        if self.finished or self.sides.client is not C_DECIDING:
            return out
        try:
            self._decided(self.admission.answered(reason, now), now)
        except AmqpError as exc:
            self._violation(CLIENT, exc, now)
        return out

    def keys_changed(self, now: float) -> list[Command]:
        """The JWKS fetch a waiting token asked for is over (:attr:`.view.ConnectionView.
        token_waiting`): the token is validated again, and accepted or refused."""
        out = self._begin()
        if self.finished or self.token_wait is None:
            return out
        try:
            self.client.keys_changed(now)
        except AmqpError as exc:
            self._violation(CLIENT, exc, now)
        return out

    def _login_done(self, now: float) -> None:
        """The router accepted the proxy's service identity: an Open waiting is decided."""
        if self.sides.client is C_DECIDING:
            self._decide_when_ready(now)

    def _login_failed(self, why: str, now: float) -> None:
        """The router did not accept the proxy's service identity: nobody can be admitted
        through it (the client is told there is no upstream, as when none accepts)."""
        if self.service_ok or self.finished:
            return
        logger.error("[%s] the upstream refused the proxy's service identity: %s",
                     self.conn_id, why)
        self.sides.stop_router()
        self.wire.pending.clear()
        self.wire.close_transport(ROUTER)
        self._unavailable(now)

    def router_connect_failed(self, now: float) -> list[Command]:
        """No upstream accepted the connection (each was tried in turn): see
        :meth:`_unavailable`."""
        out = self._begin()
        sides = self.sides
        if sides.router in (R_IDLE, R_CONNECTING):
            sides.to_router(R_FAILED)
        self.wire.pending.clear()
        self._unavailable(now)
        return out

    def _unavailable(self, now: float) -> None:
        """No upstream authenticated the client, and none will.

        Nobody can authenticate the client, so nobody is admitted (decision 0001): a client in
        SASL gets the router's SASL header and mechanisms if they were relayed, else the
        proxy's own (ANONYMOUS and PLAIN, so that any client goes on to send its sasl-init),
        then the sasl-outcome ``sys-temp`` (Part 5 §5.3.3.6) once its sasl-init is there, never
        ``ok``; a client that skipped SASL gets Open + Close ``amqp:connection:forced`` / ``no
        upstream available``. No Open goes through admission, no policy denial is counted: the
        connection is counted (and logged once) as ``upstream_unavailable``.
        """
        sides = self.sides
        wire = self.wire
        if (self.finished or sides.client in (C_STOPPED, C_CLOSED)
                or self.token_refusal is not None):
            return  # (a refused token's outcome is on its way)
        self.close_reason = self.close_reason or "upstream_unavailable"
        self.handshake_deadline = None
        self.linger(now, UNAVAILABLE_LINGER_SECONDS)
        logger.info("[%s] no upstream available for client %s", self.conn_id, self.remote_host)
        wire.emit(
            ConnectionDenied(
                *self.who(now),
                reason=ConnectionDenyReason.UPSTREAM_UNAVAILABLE,
                condition=str(Condition.CONNECTION_FORCED),
                description=UPSTREAM_UNAVAILABLE,
            )
        )
        client = self.client
        if self.sasl_used and not self.sasl_ok:
            # SASL not over (the client may have pipelined its AMQP header already)
            sides.to_client(C_UNAVAILABLE)
            greeting = self.router.greeting_missing()
            if greeting:
                wire.send(CLIENT, greeting)
            if self.sasl_init_seen:
                # the client's sasl-init came before: answer it now
                client.answer_unavailable()
        elif (sides.client is C_AWAIT_OPEN or sides.client is C_DECIDING
              or sides.client is C_AWAIT_AMQP_HEADER):
            # (AWAIT_AMQP_HEADER: a token client the proxy answered ``ok`` itself)
            sides.to_client(C_UNAVAILABLE)
            client.held.clear()
            self.send_open_close(error(Condition.CONNECTION_FORCED, UPSTREAM_UNAVAILABLE))

    def connection_lost(self, side: Side, now: float) -> list[Command]:
        """``side``'s transport closed (by the peer, by the proxy, or by an error).

        When the client's transport is gone the connection is finished: counts are released
        exactly once and :class:`ConnectionClosed` is emitted (if it was approved).
        """
        out = self._begin()
        sides = self.sides
        wire = self.wire
        if side is ROUTER:
            failed = sides.router is R_FAILED
            if sides.router is not R_CLOSED:
                sides.to_router(R_CLOSED)
            if self.finished or failed or sides.client is C_UNAVAILABLE:
                return out
            if self.router.authenticating():
                # the router went away before it authenticated the client (or the proxy's
                # service identity): nobody can now
                self._unavailable(now)
                return out
            if self.close_reason is None:
                self.close_reason = "broker_close"
            if sides.client is not C_CLOSED:
                if wire.open_sent and not sides.client_close_sent():
                    if not sides.router_close_received():
                        wire.send_close(
                            CLIENT, error(Condition.CONNECTION_FORCED, UPSTREAM_LOST)
                        )
                    wire.close_transport(CLIENT)
                elif (
                    sides.client in (C_AWAIT_OPEN, C_DECIDING)
                    and not wire.open_sent
                ):
                    self.send_open_close(error(Condition.CONNECTION_FORCED, UPSTREAM_LOST))
                    wire.close_transport(CLIENT)
                else:
                    wire.close_transport(CLIENT)
            return out
        # the client's transport is gone
        if (self.sasl_used and not self.sasl_ok and self.close_reason is None
                and sides.client is not C_UNAVAILABLE):
            self.sasl_failed("dropped", None, now)  # it left in the middle of SASL
        if sides.client is not C_CLOSED:
            sides.to_client(C_CLOSED)
        if self.close_reason is None:
            self.close_reason = "client_close"
        if sides.router not in (R_CLOSED, R_FAILED):
            wire.close_transport(ROUTER)
        self._finish(now)
        return out

    def handle_timer(self, now: float) -> list[Command]:
        """Handle the deadline :meth:`get_timer` gave: the handshake timeout (nothing decided
        within ``handshake_timeout``), the end of a linger, or tokens for a shaped link."""
        out = self._begin()
        if self.finished:
            return out
        wire = self.wire
        if self.handshake_deadline is not None and now >= self.handshake_deadline:
            self.handshake_deadline = None
            self.close_reason = "timeout"
            self.refuse_unopened(ConnectionDenyReason.HANDSHAKE_TIMEOUT, "handshake timeout", now)
            wire.close_transport(ROUTER)
            wire.close_transport(CLIENT)
        if self.linger_deadline is not None and now >= self.linger_deadline:
            self.linger_deadline = None
            wire.close_transport(CLIENT)
            wire.close_transport(ROUTER)
        if self.expiry_deadline is not None and now >= self.expiry_deadline:
            self.expiry_deadline = None
            condition, description, reason = self.expiry or (
                str(Condition.CONNECTION_FORCED), LIFETIME_REACHED, "lifetime")
            logger.info("[%s] closing the connection of user '%s', rhost '%s', vhost '%s': %s",
                        self.conn_id, self.user, self.remote_host, self.vhost_name, description)
            self._close_forced(description, reason, now, None, condition)
        if self.rate_deadline is not None:
            shaping = self.sessions.shaping
            if shaping is None or self.sides.client is not C_OPENED:
                self.rate_deadline = None  # closing: no more credit
            else:
                shaping.on_timer(now)
        return out

    def get_timer(self) -> float | None:
        """The earliest deadline (loop-clock seconds), or None."""
        handshake, linger, rate = self.handshake_deadline, self.linger_deadline, self.rate_deadline
        expiry = self.expiry_deadline
        if handshake is None and rate is None and expiry is None:
            return linger  # the steady state: all None, asked after every read
        return min(d for d in (handshake, linger, rate, expiry) if d is not None)

    def begin_shutdown(self, now: float, grace: float | None = None) -> list[Command]:
        """Start a graceful drain: Close(``amqp:connection:forced``, ``proxy shutting down``).

        An admitted client gets the Close; what it sends until its answering Close (typically
        dispositions settling deliveries) is still relayed, then the router gets a Close and
        both transports close. A client that does not answer within ``grace`` seconds
        (default :data:`LINGER_SECONDS`) is closed. Connections not admitted yet close at once.
        """
        return self._forced_close(C.PROXY_SHUTTING_DOWN, "shutdown", now, grace)

    def reevaluate(self, policy: Any, now: float, mode: str = ENFORCE, *,
                   close_now: bool = True) -> list[Command]:
        """Check this connection and its links against a reloaded ``policy``
        (``[policy] reevaluate_open``, :mod:`.revocation`).

        A connection the policy no longer admits (its user, group or client address) gets
        QDR's Close for a denied connection (``amqp:resource-limit-exceeded``, "connection
        disallowed by local policy") and closes as for an operator's close, close reason
        ``revoked``; a link the new group no longer allows is detached with
        ``amqp:unauthorized-access`` while its session goes on; a kept connection comes under
        the new group for new deliveries. ``shadow``: reported only, nothing changes on the
        wire; ``off``: nothing (QDR's behaviour). Connections not admitted yet keep the
        policy they were accepted under.

        Args:
            policy: the new :class:`~amqp_policy_proxy.policy.model.Policy`.
            now: loop-clock seconds.
            mode: ``enforce``, ``shadow`` or ``off``.
            close_now: False: a connection to close is only marked
                (:attr:`revocation_due`, the :class:`~.events.Revoked` event is emitted now)
                and closes at :meth:`close_revoked`, when the shell's paced close comes to it;
                until then it goes on as it was.
        """
        out = self._begin()
        if (self.finished or mode == OFF or self.opened_at is None
                or self.sides.client is not C_OPENED):
            return out
        revocation = Revocation(self, self.sessions, self.rules)
        verdict = revocation.connection(policy, now, mode)
        if verdict is None:
            self.revocation_due = False  # a later reload admits it again
            revocation.links(policy, now, mode)
        elif verdict[0] == ENFORCE:
            if close_now:
                self._close_revoked(now)
            else:
                self.revocation_due = True
        return out

    def close_revoked(self, now: float) -> list[Command]:
        """Close a connection a re-evaluation marked (:attr:`revocation_due`) with QDR's Close
        for a denied connection, close reason ``revoked``; nothing when it is not marked (a
        later reload admitted it again) or already ending."""
        out = self._begin()
        if self.revocation_due and not self.finished and self.sides.client is C_OPENED:
            self._close_revoked(now)
        return out

    def _close_revoked(self, now: float) -> None:
        self.revocation_due = False
        self._close_forced(C.CONNECTION_DISALLOWED, "revoked", now, None,
                           Condition.RESOURCE_LIMIT_EXCEEDED)

    def close_by_operator(
        self, description: str, now: float, grace: float | None = None, *,
        reason: str = "admin_close",
    ) -> list[Command]:
        """Close this connection for an operator (``amqp-policy-proxy connections close``).

        As :meth:`begin_shutdown`, with the operator's words: the admitted client gets Close
        ``amqp:connection:forced`` with ``description``; what it sends until its answering
        Close is relayed, then the router gets a Close (no error) and both transports close,
        so the router sees an orderly end; the ledger's counts are released when the client's
        transport is gone (at most ``grace`` seconds, default :data:`LINGER_SECONDS`). The
        close reason is ``reason``: ``admin_close``, or ``banned`` for the connections a ban
        ends. A connection not admitted yet closes at once.

        Args:
            description: the Close's description (the operator's reason).
            now: loop-clock seconds.
            grace: seconds the client has to answer.
            reason: the close reason (one of the event log's ``CLOSE_REASONS``).
        """
        return self._forced_close(description, reason, now, grace)

    def _forced_close(
        self, description: str, reason: str, now: float, grace: float | None,
        condition: str = Condition.CONNECTION_FORCED,
    ) -> list[Command]:
        """Close(``condition``, default ``amqp:connection:forced``, ``description``) to an
        admitted client, then wait for its answer (see :meth:`begin_shutdown`); close at once
        what is not admitted."""
        out = self._begin()
        if not self.finished:
            self._close_forced(description, reason, now, grace, condition)
        return out

    def _close_forced(self, description: str, reason: str, now: float, grace: float | None,
                      condition: str) -> None:
        """:meth:`_forced_close` within an input already begun."""
        sides = self.sides
        self.close_reason = self.close_reason or reason
        if sides.client is C_OPENED and self.wire.open_sent:
            if not sides.client_close_sent():
                self.wire.send_close(CLIENT, error(condition, description))
            sides.to_client(C_CLOSING)
            self.linger(now, LINGER_SECONDS if grace is None else grace)
        elif sides.client is not C_CLOSING:
            self.wire.close_transport(ROUTER)
            self.wire.close_transport(CLIENT)

    def internal_error(self, now: float) -> None:
        """The shell contained a bug while handling this connection (it aborts both
        transports): the close reason says so."""
        if self.close_reason is None:
            self.close_reason = "internal_error"

    def close_received_from(self, side: Side) -> bool:
        """True once ``side`` has sent its AMQP Close."""
        sides = self.sides
        return (
            sides.client_close_received() if side is CLIENT else sides.router_close_received()
        )

    # ------------------------------------------------------------------ internals

    def _begin(self) -> list[Command]:
        """Start collecting the commands of one input (bytes, timer, socket event)."""
        out: list[Command] = []
        self.wire.out = out
        return out

    def _violation(self, side: Side, exc: AmqpError, now: float) -> None:
        """Close this connection because ``side`` broke the protocol (one INFO line, one
        ``ProtocolViolation`` event, Close with the violation's condition where a Close can
        be sent)."""
        condition = str(exc.condition)
        description = exc.description
        logger.info("[%s] %s protocol error %s: %s", self.conn_id, side, condition, description)
        wire = self.wire
        sides = self.sides
        wire.emit(
            ProtocolViolation(
                *self.who(now),
                side=str(side),
                condition=condition,
                description=description,
            )
        )
        if self.close_reason is None:
            self.close_reason = "protocol_error"
        err = error(condition, description)
        if side is CLIENT:
            if sides.client in CLIENT_AMQP and not sides.client_close_sent():
                if wire.open_sent:
                    wire.send_close(CLIENT, err)
                else:
                    self.send_open_close(err)
            if self.opened_at is not None and not sides.router_close_sent():
                # the router has the client's Open: end its side cleanly
                wire.send_close(ROUTER, error(Condition.CONNECTION_FORCED, "client error"))
        else:
            if wire.open_sent and not sides.client_close_sent():
                wire.send_close(
                    CLIENT, error(Condition.CONNECTION_FORCED, "upstream protocol error")
                )
            if sides.router is R_AMQP and not sides.router_close_sent():
                wire.send_close(ROUTER, err)
        sides.stop_client()
        sides.stop_router()
        self.handshake_deadline = None
        # Nothing more is read from either side: drop what was buffered. New objects rather
        # than clear(): a memoryview into the old buffer may still be alive in the traceback.
        self.client.buf = bytearray()
        self.router.buf = bytearray()
        self.client.held = bytearray()
        self.router.held = []
        wire.close_transport(ROUTER)
        wire.close_transport(CLIENT)

    def _finish(self, now: float) -> None:
        """Finish the connection once: stop the timers, release its admission (the ledger's
        counts) and emit ``ConnectionClosed`` with its figures if it was ever admitted."""
        if self.finished:
            return
        self.finished = True
        self.handshake_deadline = None
        self.linger_deadline = None
        self.admission.release()
        self.denial_lines.flush(logger, self.conn_id, now)
        if self.sessions.shaping is not None:
            self.sessions.shaping.close(now)
        if self.opened_at is not None:
            opened = self.opened_at
            f = self.figures
            self.wire.emit(
                ConnectionClosed(
                    *self.who(now),
                    opened_at=opened,
                    duration_seconds=max(0.0, now - opened),
                    bytes_in=f.bytes_in,
                    bytes_out=f.bytes_out,
                    transfers_in=f.transfers_in,
                    transfers_out=f.transfers_out,
                    max_sessions=f.peak_sessions,
                    max_senders=f.peak_senders,
                    max_receivers=f.peak_receivers,
                    close_reason=self.close_reason or "client_close",
                )
            )
        self._let_go()

    def _let_go(self) -> None:
        """Cut the references from the rooms back to this facade and between records, once
        the connection is finished (nothing but :attr:`view` is read after that), so that
        reference counting frees the whole connection as soon as the shell lets go of it.

        Left as cycles, every connection would be garbage for the cycle collector: ~3 µs of
        CPU per connection, and objects that each full collection walks while they wait.
        A room used after this raises AttributeError (a proxy bug) instead of acting on a
        finished connection.
        """
        client = self.client
        proxy = self.sessions.proxy
        proxy.renewed = None
        for room in (self.rules, self.sessions, self.deliveries, client, client.fast,
                     self.router, self.admission, proxy):
            del room.ctx
        del proxy.sessions
        del client.open_received, client.fast.general
        self.router.login_done = self.router.login_failed = None
        sessions = self.sessions
        sessions.shaping = None  # closed above: its links and waits are gone
        refresh_router(sessions)
        sessions.sessions.clear()
        sessions.router_sessions.clear()
