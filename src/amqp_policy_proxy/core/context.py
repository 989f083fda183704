"""Sans-IO. What every room of a connection shares: who the client is, what was decided, the
legs' states, the output, the figures, and the connection's timers.

:class:`Context` is the base of :class:`~.connection.ProxyConnection`; the rooms
(:mod:`.client_side`, :mod:`.router_side`, :mod:`.admission`, :mod:`.sessions`,
:mod:`.deliveries`) are given it (and each other, explicitly) when the connection is built, so
no room imports the facade and the imports run one way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..amqp.performatives import Error
from ..ingress.peer import ClientAddress
from ..policy.naming import DEFAULT_NAMING, Naming
from .events import ConnectionDenied, ConnectionDenyReason, SaslFailed
from .logbudget import LogBudget
from .records import Figures
from .state import Sides
from .wire import Wire

if TYPE_CHECKING:
    from ..policy.model import GroupSettings, Policy, VhostPolicy
    from ..tokens.sasl import TokenCredentials
    from .tokenauth import Rejected, ServiceLogin, TokenAuth, TokenCheck

#: Largest frame accepted from the client before the proxy has advertised a max-frame-size
#: (the spec says 512 for SASL frames and an Open; the proxy is lenient but bounded).
PRE_OPEN_FRAME_LIMIT = 64 * 1024
#: Cap on the frame size buffered from the router (it honours the client's max-frame-size).
ROUTER_FRAME_LIMIT = 64 * 1024 * 1024
logger = logging.getLogger(__name__)

#: Seconds to wait for the other side's Close after a denial or shutdown Close.
LINGER_SECONDS = 2.0
#: Default seconds from accept to the Open decision.
HANDSHAKE_SECONDS = 10.0

Who = tuple[str, float, str | None, str | None, str | None, str, str, str | None]
"""The positional fields of every event (:meth:`Context.who`)."""


class Context:
    """The shared facts of one proxied connection."""

    __slots__ = (
        "conn_id",
        "remote_host",
        "client_address",
        "listener",
        "balancer_host",
        "policy",
        "tls_subject",
        "wall_offset",
        "accepted_at",
        "user",
        "vhost",
        "group",
        "governed",
        "opened_at",
        "close_reason",
        "handshake_deadline",
        "linger_deadline",
        "rate_deadline",
        "finished",
        "sides",
        "wire",
        "figures",
        "sasl_used",
        "sasl_init_seen",
        "sasl_user",
        "sasl_ok",
        "client_frame_limit",
        "router_frame_limit",
        "naming",
        "denial_lines",
        "tls_not_after",
        "sasl_mechanism",
        "expiry_deadline",
        "expiry",
        "open_hostname",
        "sasl_recorded",
        "tokens",
        "token",
        "service_login",
        "service_ok",
        "token_wait",
        "token_refusal",
    )

    def __init__(
        self,
        conn_id: str,
        *,
        remote_host: str | ClientAddress,
        listener: str,
        policy: Policy,
        now: float,
        handshake_timeout: float = HANDSHAKE_SECONDS,
        container_id: str = "amqp-policy-proxy",
        tls_subject: str | None = None,
        wall_offset: float = 0.0,
        balancer_host: str | None = None,
        naming: Naming | None = None,
        tls_not_after: float | None = None,
        tokens: TokenAuth | None = None,
    ) -> None:
        """The facts of a freshly accepted client transport.

        Args:
            conn_id: unique id for logs and events.
            remote_host: the client's address, parsed once by the shell, or its normalised
                IP text.
            listener: the listener's ``HOST:PORT``.
            policy: the :class:`~amqp_policy_proxy.policy.model.Policy` snapshot current at
                accept time; the connection keeps it for its whole life.
            now: loop-clock seconds at accept.
            handshake_timeout: seconds from accept to the Open decision.
            container_id: container-id of the Opens the proxy synthesizes.
            tls_subject: RFC 4514 subject of the client certificate the proxy verified, else
                None (SASL EXTERNAL's identity; DDS permission grants match it).
            wall_offset: POSIX seconds minus loop-clock seconds (DDS validity dates).
            balancer_host: the load balancer's address when ``remote_host`` came from its
                PROXY protocol header (carried by every event), else None.
            naming: how the upstream resolves addresses and identities (``[[upstream]]
                kind``, :mod:`amqp_policy_proxy.policy.naming`); None: an upstream whose
                resolution the proxy does not know (only canonical names pass).
            tls_not_after: POSIX seconds of the verified client certificate's notAfter, else
                None: a connection authenticated by it (SASL EXTERNAL) ends when it passes.
            tokens: the upstreams' ``token_authority`` with the ``[token_auth]`` settings
                and keys (:mod:`.tokenauth`); None: no tokens, SASL is relayed as it came.
        """
        self.conn_id = conn_id
        self.remote_host = remote_host if isinstance(remote_host, str) else remote_host.text
        """The client's normalised IP text (logs, events, per-host counts)."""
        self.client_address = remote_host
        """The same, as the shell parsed it (``remoteHosts`` checks)."""
        self.listener = listener
        self.balancer_host = balancer_host
        """The load balancer's address when ``remote_host`` came from its PROXY header."""
        self.policy: Policy = policy
        """The policy snapshot the connection was accepted (or last re-evaluated) under."""
        self.tls_subject = tls_subject
        """RFC 4514 subject of the client certificate the proxy verified, else None."""
        self.wall_offset = wall_offset
        self.accepted_at = now
        self.user: str | None = None
        """The authenticated user, once the Open is decided."""
        self.vhost: VhostPolicy | None = None
        """The vhost the Open's hostname resolved to (None: before that, or none matched)."""
        self.group: GroupSettings | None = None
        """The user's group in that vhost, once admitted (None: before, or denied)."""
        self.governed = False
        """Admitted under a group whose limits apply."""
        self.opened_at: float | None = None
        """Loop-clock seconds of the admission (None: not admitted)."""
        self.close_reason: str | None = None
        self.handshake_deadline: float | None = now + handshake_timeout
        self.linger_deadline: float | None = None
        self.rate_deadline: float | None = None
        """When a shaped link waiting for tokens is looked at again (:mod:`.shaping`)."""
        self.finished = False
        """The connection is over and its counts are released."""
        self.sides = Sides()
        self.wire = Wire(self.sides, container_id)
        self.figures = Figures()
        self.denial_lines = LogBudget()
        """The budget of this connection's denial log lines (:mod:`.logbudget`)."""
        self.sasl_used = False
        """The client started with the SASL header."""
        self.sasl_init_seen = False
        self.sasl_user: str | None = None
        """The identity the sasl-init names (trusted only once the router said ``ok``)."""
        self.sasl_ok = False
        """The router's sasl-outcome ``ok`` was relayed (or the client skipped SASL)."""
        self.client_frame_limit = PRE_OPEN_FRAME_LIMIT
        """Largest frame accepted from the client (the max-frame-size it was given)."""
        self.router_frame_limit = ROUTER_FRAME_LIMIT
        """Largest frame accepted from the router (the client's max-frame-size, capped)."""
        self.naming: Naming = naming if naming is not None else DEFAULT_NAMING
        """How the upstream resolves names: every address and identity decision uses it."""
        self.tls_not_after = tls_not_after
        """POSIX seconds of the verified client certificate's notAfter, else None."""
        self.sasl_mechanism: str | None = None
        """The mechanism of the client's sasl-init (``PLAIN``, ``EXTERNAL``...), else None."""
        self.expiry_deadline: float | None = None
        """When an admitted connection must end (loop clock): its credential expires or its
        group's ``maxConnectionLifetimeSeconds`` is reached; None: never."""
        self.sasl_recorded = False
        """A failed authentication of this connection is on record already."""
        self.open_hostname: str | None = None
        """The hostname of the client's Open (a reload decides the vhost from it again)."""
        self.expiry: tuple[str, str, str] | None = None
        """What ends it then: ``(AMQP condition, description, close reason)``."""
        self.tokens = tokens
        """Token connections (:mod:`.tokenauth`), or None."""
        self.token: TokenCheck | None = None
        """The validated token of this connection (its identity is the policy user)."""
        self.service_login: ServiceLogin | None = None
        """The identity the proxy logs in to the router with (``token_authority =
        "proxy"``), given by the shell with the upstream it connected to."""
        self.service_ok = False
        """The router accepted the proxy's service identity (its sasl-outcome ``ok``)."""
        self.token_wait: tuple[TokenCredentials, bytes | None] | None = None
        """A sasl-init whose token names a ``kid`` the keys lack, waiting for the JWKS fetch
        it asked for (its token, and its frame for the router in ``upstream`` mode)."""
        self.token_refusal: Rejected | None = None
        """A refused OAUTHBEARER token whose error challenge was sent: the client's dummy
        response is awaited, then the outcome ``auth``."""

    @property
    def vhost_name(self) -> str | None:
        """The resolved vhost's name (None before resolution or when none matched)."""
        return None if self.vhost is None else self.vhost.hostname

    def who(self, now: float) -> Who:
        """The fields every event of this connection carries, in the order of
        :class:`~.events.ProxyEvent`'s positional fields: ``(conn_id, at, vhost, group, user,
        remote_host, listener, balancer_host)``, ``at`` being ``now``."""
        group = self.group
        vhost = self.vhost
        return (self.conn_id, now, None if vhost is None else vhost.hostname,
                None if group is None else group.name, self.user, self.remote_host,
                self.listener, self.balancer_host)

    def sasl_failed(self, reason: str, code: int | None, now: float) -> None:
        """Put a failed authentication on record once (:class:`~.events.SaslFailed` and one
        log line): the router's outcome ``reason`` (``auth``, ``sys``...) with its ``code``,
        or ``dropped`` (the client left in the middle of SASL). Never the password."""
        if self.sasl_recorded:
            return
        self.sasl_recorded = True
        mechanism = self.sasl_mechanism or ""
        user = self.sasl_user
        logger.warning("[%s] SASL authentication failed for user '%s', rhost '%s', mechanism "
                       "%s: %s%s", self.conn_id, "(none)" if user is None else user,
                       self.remote_host, mechanism or "(none)", reason,
                       "" if code is None else f" ({code})")
        who = self.who(now)
        # user: the name the sasl-init claimed, nobody authenticated it
        self.wire.emit(SaslFailed(*who[:4], user, *who[5:], mechanism=mechanism, reason=reason,
                                  code=code))

    def linger(self, now: float, seconds: float = LINGER_SECONDS) -> None:
        """Give the other side ``seconds`` to answer a Close before the transports close."""
        self.linger_deadline = now + seconds

    def refuse_unopened(self, reason: ConnectionDenyReason, description: str, now: float) -> None:
        """Refuse a client that never got as far as an Open decision (a handshake timeout, a
        sasl-init naming someone else): one ``ConnectionDenied`` event with no AMQP condition
        (none is sent: ``description`` says what the client got instead) and nothing more
        is read from either leg. The caller writes what the client gets and closes."""
        self.wire.emit(
            ConnectionDenied(
                *self.who(now), reason=reason, condition="", description=description
            )
        )
        self.sides.stop_client()
        self.sides.stop_router()

    def send_open_close(self, err: Error) -> None:
        """QDR's Open + Close to the client (its AMQP header first when it had none; the
        router's is then never relayed)."""
        if not self.wire.amqp_header_sent:
            self.sides.stop_router()
        self.wire.send_open_close(err)


class Room:
    """A room of a connection (admission, a leg, the sessions, the deliveries, shaping): what
    every room reads, the connection's context, its output and its legs' states."""

    __slots__ = ("ctx", "wire", "sides")

    def __init__(self, ctx: Context) -> None:
        """A room of the connection ``ctx``."""
        self.ctx = ctx
        self.wire = ctx.wire
        self.sides = ctx.sides
