"""Sans-IO. Every state of a proxied connection and the legal transitions, as tables.

Rules (in the spirit of h11's ``_state.py``):

1. Everything a connection can *be* lives here: the client leg's state, the router leg's
   state, and the Close exchange on each leg. Handlers elsewhere in ``core/`` never assign a
   state: they call :meth:`Sides.to_client` / :meth:`Sides.to_router` (or
   :meth:`Sides.close_sent` / :meth:`Sides.close_received`), which check the move against the
   tables below and raise :class:`IllegalTransition` (a proxy bug, never a peer's fault: peer
   errors are :class:`~amqp_policy_proxy.amqp.errors.AmqpError`) for any other.
2. A state says what the proxy does with that leg's bytes; nothing else (no boolean) says it.
3. This module knows no bytes and no policy.

The client leg (``ClientState``)::

    AWAIT_HEADER -> SASL -> AWAIT_AMQP_HEADER -> AWAIT_OPEN -> DECIDING -> OPENED -> CLOSING
         \\------ (no SASL: user anonymous) -------/            |  \\-> DENIED      |
                                                                \\-> UNAVAILABLE   v
    any state -> STOPPED (nothing more is read: violation, timeout, refusal) -> CLOSED

The router leg (``RouterState``)::

    IDLE -> CONNECTING -> AWAIT_HEADER -> SASL -> AWAIT_AMQP_HEADER -> AMQP
                  |                 \\-> LOGIN -/   (token_authority "proxy": the proxy's
                  |                                  own SASL with its service identity)
                  \\-> FAILED (no upstream accepted)
    any state -> STOPPED (nothing more is read from it or sent to it) -> CLOSED

A Close exchange per leg (``CloseState``): NONE -> SENT (the proxy sent the leg a Close) or
RECEIVED (the leg sent one) -> BOTH.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class IllegalTransition(RuntimeError):
    """A move the tables do not allow: a bug in the proxy, not a protocol violation."""


class _State(Enum):
    """Base of the state enums: members are singletons compared by identity, hashed as
    objects (in C), not through ``Enum.__hash__`` (a Python call), since the transition tables
    and the state sets look states up several times per frame."""

    __hash__ = object.__hash__


class ClientState(_State):
    """The client leg: where the client is in its protocol, and what its bytes are."""

    AWAIT_HEADER = "await_header"
    """Nothing received yet: the next 8 bytes are a protocol header."""
    SASL = "sasl"
    """SASL header seen: the client's SASL frames are relayed to the router (Part 5 §5.3)."""
    AWAIT_AMQP_HEADER = "await_amqp_header"
    """The router's sasl-outcome ``ok`` was relayed: the client's AMQP header comes next."""
    AWAIT_OPEN = "await_open"
    """AMQP header seen: the client's Open is intercepted for the admission decision."""
    DECIDING = "deciding"
    """The client's Open is here; the decision waits for the upstream connection (nobody is
    admitted without an upstream); what the client pipelines behind the Open is held."""
    OPENED = "opened"
    """Admitted: frames are relayed under the group's limits."""
    CLOSING = "closing"
    """A Close exchange is under way (the client's, the router's, or the proxy's own)."""
    DENIED = "denied"
    """Refused at the Open: QDR's Open + Close was sent; the client's Close is awaited."""
    UNAVAILABLE = "unavailable"
    """No upstream: the client gets SASL ``sys-temp`` or Open + Close ``connection:forced``."""
    STOPPED = "stopped"
    """Nothing more is read from the client (its transport is being closed); writes still go."""
    CLOSED = "closed"
    """The client transport is gone."""


class RouterState(_State):
    """The router leg: where the upstream connection is, and what its bytes are."""

    IDLE = "idle"
    """No upstream connection asked for yet (the client's protocol header is awaited)."""
    CONNECTING = "connecting"
    """The upstream connect is under way; bytes for the router are queued."""
    AWAIT_HEADER = "await_header"
    """Connected: the router's protocol header comes next."""
    SASL = "sasl"
    """The router's SASL frames are relayed to the client."""
    LOGIN = "login"
    """The proxy authenticates to the router itself with its service identity (``token_authority
    = "proxy"``): the router's SASL frames are answered by the proxy, nothing is relayed."""
    AWAIT_AMQP_HEADER = "await_amqp_header"
    """The router's sasl-outcome was relayed: its AMQP header comes next."""
    AMQP = "amqp"
    """AMQP frames: held until the Open decision, then relayed."""
    FAILED = "failed"
    """No upstream accepted the connection."""
    STOPPED = "stopped"
    """Nothing more is read from the router or sent to it (its transport is being closed)."""
    CLOSED = "closed"
    """The router transport is gone."""


class CloseState(_State):
    """The AMQP Close exchange on one leg (Part 2 §2.4.3)."""

    NONE = "none"
    SENT = "sent"
    """The proxy sent this leg a Close; its answer is awaited."""
    RECEIVED = "received"
    """This leg sent a Close; the answer has not been sent to it yet."""
    BOTH = "both"


# Every state as a plain module name, which the rooms use in code: on CPython 3.11 reading an
# Enum member through its class goes through EnumType's __getattr__ hook (~75 ns, about 150
# times per connection), a module name costs ~10 ns. ``C_`` client leg, ``R_`` router leg,
# ``CLOSE_`` the Close exchange.
C_AWAIT_HEADER = ClientState.AWAIT_HEADER
C_SASL = ClientState.SASL
C_AWAIT_AMQP_HEADER = ClientState.AWAIT_AMQP_HEADER
C_AWAIT_OPEN = ClientState.AWAIT_OPEN
C_DECIDING = ClientState.DECIDING
C_OPENED = ClientState.OPENED
C_CLOSING = ClientState.CLOSING
C_DENIED = ClientState.DENIED
C_UNAVAILABLE = ClientState.UNAVAILABLE
C_STOPPED = ClientState.STOPPED
C_CLOSED = ClientState.CLOSED
R_IDLE = RouterState.IDLE
R_CONNECTING = RouterState.CONNECTING
R_AWAIT_HEADER = RouterState.AWAIT_HEADER
R_SASL = RouterState.SASL
R_LOGIN = RouterState.LOGIN
R_AWAIT_AMQP_HEADER = RouterState.AWAIT_AMQP_HEADER
R_AMQP = RouterState.AMQP
R_FAILED = RouterState.FAILED
R_STOPPED = RouterState.STOPPED
R_CLOSED = RouterState.CLOSED
CLOSE_NONE = CloseState.NONE
CLOSE_SENT = CloseState.SENT
CLOSE_RECEIVED = CloseState.RECEIVED
CLOSE_BOTH = CloseState.BOTH


_ANY_CLIENT_END = {C_STOPPED, C_CLOSED}
_ANY_ROUTER_END = {R_STOPPED, R_CLOSED}

#: ``ClientState`` -> the states it may move to.
CLIENT_TRANSITIONS: dict[ClientState, frozenset[ClientState]] = {
    C_AWAIT_HEADER: frozenset({C_SASL, C_AWAIT_OPEN, *_ANY_CLIENT_END}),
    C_SASL: frozenset({C_AWAIT_AMQP_HEADER, C_AWAIT_OPEN, C_UNAVAILABLE, *_ANY_CLIENT_END}),
    C_AWAIT_AMQP_HEADER: frozenset({C_AWAIT_OPEN, C_UNAVAILABLE, *_ANY_CLIENT_END}),
    C_AWAIT_OPEN: frozenset({C_DECIDING, C_UNAVAILABLE, *_ANY_CLIENT_END}),
    C_DECIDING: frozenset({C_OPENED, C_DENIED, C_UNAVAILABLE, *_ANY_CLIENT_END}),
    C_OPENED: frozenset({C_CLOSING, *_ANY_CLIENT_END}),
    C_CLOSING: frozenset(_ANY_CLIENT_END),
    C_DENIED: frozenset(_ANY_CLIENT_END),
    C_UNAVAILABLE: frozenset(_ANY_CLIENT_END),
    C_STOPPED: frozenset({C_CLOSED}),
    C_CLOSED: frozenset(),
}

#: ``RouterState`` -> the states it may move to.
ROUTER_TRANSITIONS: dict[RouterState, frozenset[RouterState]] = {
    R_IDLE: frozenset({R_CONNECTING, *_ANY_ROUTER_END}),
    R_CONNECTING: frozenset({R_AWAIT_HEADER, R_FAILED, *_ANY_ROUTER_END}),
    R_AWAIT_HEADER: frozenset({R_SASL, R_LOGIN, R_AMQP, *_ANY_ROUTER_END}),
    R_SASL: frozenset({R_AWAIT_AMQP_HEADER, *_ANY_ROUTER_END}),
    R_LOGIN: frozenset({R_AWAIT_AMQP_HEADER, *_ANY_ROUTER_END}),
    R_AWAIT_AMQP_HEADER: frozenset({R_AMQP, *_ANY_ROUTER_END}),
    R_AMQP: frozenset(_ANY_ROUTER_END),
    R_FAILED: frozenset({R_CLOSED}),
    R_STOPPED: frozenset({R_CLOSED}),
    R_CLOSED: frozenset(),
}

#: ``(CloseState, event)`` -> the new state; event is ``"sent"`` or ``"received"``.
CLOSE_TRANSITIONS: dict[tuple[CloseState, str], CloseState] = {
    (CLOSE_NONE, "sent"): CLOSE_SENT,
    (CLOSE_NONE, "received"): CLOSE_RECEIVED,
    (CLOSE_SENT, "received"): CLOSE_BOTH,
    (CLOSE_RECEIVED, "sent"): CLOSE_BOTH,
}
#: :data:`CLOSE_TRANSITIONS` by event, for the setters.
_ON_SENT = {old: new for (old, event), new in CLOSE_TRANSITIONS.items() if event == "sent"}
_ON_RECEIVED = {old: new for (old, event), new in CLOSE_TRANSITIONS.items()
                if event == "received"}
#: The Close states in which the proxy has sent that leg a Close, and those in which the leg
#: has sent one.
_SENT = frozenset({CLOSE_SENT, CLOSE_BOTH})
_RECEIVED = frozenset({CLOSE_RECEIVED, CLOSE_BOTH})

#: Client states whose bytes are SASL frames (or the AMQP header that ends SASL).
CLIENT_SASL = frozenset({C_SASL, C_AWAIT_AMQP_HEADER})
#: Client states whose bytes are AMQP frames.
CLIENT_AMQP = frozenset({C_AWAIT_OPEN, C_DECIDING, C_OPENED, C_CLOSING, C_DENIED,
                         C_UNAVAILABLE})
#: Client states in which nothing more is read.
CLIENT_DONE = frozenset({C_STOPPED, C_CLOSED})
#: Router states in which bytes may be sent to it (queued while it connects).
ROUTER_WRITABLE = frozenset({R_IDLE, R_CONNECTING, R_AWAIT_HEADER, R_SASL, R_LOGIN,
                             R_AWAIT_AMQP_HEADER, R_AMQP})
#: Router states in which it is connected.
ROUTER_CONNECTED = frozenset({R_AWAIT_HEADER, R_SASL, R_LOGIN, R_AWAIT_AMQP_HEADER, R_AMQP,
                              R_STOPPED})


def _allowed(table: dict[Any, frozenset[Any]], leg: str, old: Any, new: Any) -> Any:
    """``new``, when ``table`` (a leg's transitions) allows the move from ``old`` (staying is
    always allowed).

    Raises:
        IllegalTransition: ``table`` has no such move (a proxy bug).
    """
    if new is not old and new not in table[old]:
        raise IllegalTransition(f"{leg} {old.name} -> {new.name}")
    return new


class Sides:
    """The current state of both legs and of both Close exchanges, changed only through the
    setters, which enforce the tables."""

    __slots__ = ("client", "router", "client_close", "router_close")

    def __init__(self) -> None:
        """A freshly accepted client transport: nothing received, no upstream yet."""
        self.client = C_AWAIT_HEADER
        self.router = R_IDLE
        self.client_close = CLOSE_NONE
        self.router_close = CLOSE_NONE

    def to_client(self, new: ClientState) -> None:
        """Move the client leg to ``new`` (:func:`_allowed` by ``CLIENT_TRANSITIONS``)."""
        self.client = _allowed(CLIENT_TRANSITIONS, "client", self.client, new)

    def to_router(self, new: RouterState) -> None:
        """Move the router leg to ``new`` (:func:`_allowed` by ``ROUTER_TRANSITIONS``)."""
        self.router = _allowed(ROUTER_TRANSITIONS, "router", self.router, new)

    def stop_client(self) -> None:
        """Read nothing more from the client (unless its transport is already gone)."""
        if self.client is not C_CLOSED:
            self.to_client(C_STOPPED)

    def stop_router(self) -> None:
        """Read and send nothing more on the router leg (unless it is gone or never came)."""
        if self.router not in (R_CLOSED, R_FAILED):
            self.to_router(R_STOPPED)

    def close_sent(self, to_client: bool) -> None:
        """Record that the proxy sent a Close to the client (``to_client``) or the router.

        Raises:
            IllegalTransition: a second Close to the same leg.
        """
        if to_client:
            new = _ON_SENT.get(self.client_close)
            if new is None:
                raise IllegalTransition("a second Close sent to the client")
            self.client_close = new
        else:
            new = _ON_SENT.get(self.router_close)
            if new is None:
                raise IllegalTransition("a second Close sent to the router")
            self.router_close = new

    def close_received(self, from_client: bool) -> bool:
        """Record a Close from the client (``from_client``) or the router.

        Returns:
            False when that leg had already sent one (nothing changes).
        """
        if from_client:
            new = _ON_RECEIVED.get(self.client_close)
            if new is None:
                return False
            self.client_close = new
        else:
            new = _ON_RECEIVED.get(self.router_close)
            if new is None:
                return False
            self.router_close = new
        return True

    def client_close_sent(self) -> bool:
        """The proxy has sent the client a Close."""
        return self.client_close in _SENT

    def client_close_received(self) -> bool:
        """The client has sent a Close."""
        return self.client_close in _RECEIVED

    def router_close_sent(self) -> bool:
        """The proxy has sent the router a Close."""
        return self.router_close in _SENT

    def router_close_received(self) -> bool:
        """The router has sent a Close."""
        return self.router_close in _RECEIVED
