"""An embedded AMQP 1.0 broker on proton's reactor, used by ``demo`` and by the test suite.

What it does:

- One in-memory FIFO queue per address, created on first use. A client sender (the broker's
  receiving link) enqueues; a client receiver (the broker's sending link) consumes, competing
  with the other receivers of the address (round robin among links with credit).
- Anonymous relay: a client sender without a target address routes each message by its ``to``
  property; the broker offers the ``ANONYMOUS-RELAY`` connection capability.
- Topic subscriptions: a receiver whose source address has a wildcard token (MQTT style over
  ``/``-separated addresses: ``+`` one token, ``#`` the rest, e.g. ``A/+`` or ``A/#``) gets its
  own queue and a copy of every message later sent to a matching address (the address's own
  queue keeps its copy too). Messages keep their ``to``, so a subscriber can tell them apart.
- Dynamic nodes: a receiver asking for a dynamic source (or a sender for a dynamic target) gets
  a fresh ``dynamic/<hex>`` address in the broker's Attach; the node goes when the link does.
- Messages are forwarded as the exact bytes received (never decoded and re-encoded; only relayed
  messages are decoded, to read their ``to``).
- Settlement: incoming unsettled deliveries are accepted and settled once enqueued. Outgoing
  deliveries stay unsettled until the consumer settles them: accepted or rejected removes the
  message, released or modified puts it back at the head of its queue, and a consumer link or
  connection that goes away returns its unsettled messages. Receivers asking for
  ``snd-settle-mode settled`` (at-most-once) get pre-settled deliveries.
- SASL through Cyrus (see :mod:`.sasl`): PLAIN (and SCRAM) checked against a sasldb, ANONYMOUS
  when allowed, insecure mechanisms allowed on plain TCP by default.
- Introspection for tests: queue depths and counters, the peers' Open and Begin fields, the
  Attaches received and the authenticated user names.

The container runs in a daemon thread; :meth:`Broker.stop` (also run at interpreter exit) closes
the listener and every connection and joins the thread.

Cyrus SASL is configured once per process (proton initialises the Cyrus server library with the
first config it is given and ignores later ones). All brokers of a process therefore share one
*active* SASL config: the first one any broker asks for (:func:`.sasl.shared_sasl_config` for
brokers built without one). A later broker with a different config made by
:func:`.sasl.make_sasl_config` has its users added to the active sasldb (so, within a process,
every broker accepts the union of those users); one whose mechanisms or users cannot be merged
raises :class:`SaslConfigConflict`.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from proton import (
    SASL,
    Condition,
    Delivery,
    Endpoint,
    Handler,
    Link,
    Message,
    SymbolList,
    Terminus,
    Transport,
)
from proton.handlers import EndpointStateHandler, MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector

from .sasl import (
    SaslConfig,
    add_sasl_users,
    load_sasl_config,
    mirror_sasl_users,
    shared_sasl_config,
)

__all__ = [
    "Broker",
    "BrokerError",
    "PeerAttach",
    "PeerBegin",
    "PeerOpen",
    "SaslConfigConflict",
]

_log = logging.getLogger(__name__)

ANONYMOUS_RELAY = "ANONYMOUS-RELAY"
DYNAMIC_PREFIX = "dynamic/"


class BrokerError(RuntimeError):
    """The broker could not start, or its event loop failed."""


class SaslConfigConflict(BrokerError):
    """A broker's SASL config cannot be used because another one is active in this process."""


# -- process-wide Cyrus SASL configuration ---------------------------------------------------

_cyrus_lock = threading.Lock()
_cyrus_active: SaslConfig | None = None
_cyrus_merged: set[tuple[Path, str]] = set()  # configs whose users were added to the active one


def _same_config(a: SaslConfig, b: SaslConfig) -> bool:
    return (
        Path(a.config_dir).resolve() == Path(b.config_dir).resolve()
        and a.config_name == b.config_name
    )


def _activate_sasl(requested: SaslConfig | None) -> SaslConfig:
    """Return the SASL config every server transport of this process must name.

    The first call fixes it (``requested``, or the shared config when ``None``). Later calls with
    another config merge that config's users into the active sasldb when they can.
    """
    global _cyrus_active
    with _cyrus_lock:
        if _cyrus_active is None:
            _cyrus_active = requested if requested is not None else shared_sasl_config()
            return _cyrus_active
        active = _cyrus_active
    if requested is None or _same_config(requested, active):
        return active
    key = (Path(requested.config_dir).resolve(), requested.config_name)
    with _cyrus_lock:
        if key in _cyrus_merged:
            return active  # merged before (by a broker given the same config)
    missing = [m for m in requested.mechs if m not in active.mechs]
    if missing:
        raise SaslConfigConflict(
            f"SASL config {requested.config_name!r} wants mechanisms {missing} that the config "
            f"already active in this process ({active.config_file}) does not offer; Cyrus SASL "
            "is initialised once per process. Use demo.sasl.shared_sasl_config() in tests."
        )
    if requested.users is None:
        raise SaslConfigConflict(
            f"SASL config {requested.config_name!r} in {requested.config_dir} cannot be used: "
            f"Cyrus SASL is initialised once per process and {active.config_file} is active; "
            "its users are unknown so they cannot be merged (make it with make_sasl_config, "
            "or use shared_sasl_config())."
        )
    target = dataclasses.replace(active, realm=requested.realm, users=None)
    if requested.users:
        add_sasl_users(target, requested.users)
    mirror_sasl_users(requested, target)
    with _cyrus_lock:
        _cyrus_merged.add(key)
    if requested.users:
        _log.info(
            "SASL users of %s added to the process's active sasldb %s",
            requested.config_file,
            active.sasldb_path,
        )
    return active


def active_sasl_config(requested: SaslConfig | None = None) -> SaslConfig:
    """The Cyrus SASL config every server transport of this process must name.

    proton initialises the Cyrus server library once per process: the first config asked for
    stays active, and the users of a config asked for later are added to its sasldb (user names
    must not collide with other passwords). Brokers do this themselves; other proton servers of
    the process (a test's engine in server mode) call this.

    Raises:
        SaslConfigConflict: ``requested`` cannot be merged into the active config.
    """
    return _activate_sasl(requested)


# -- records for tests ---------------------------------------------------------------------


@dataclass(frozen=True)
class PeerOpen:
    """A peer's Open as the broker received it (after SASL).

    Attributes:
        conn_id: the broker's number for the connection (1, 2, ... in accept order).
        remote_address: ``(host, port)`` of the peer's socket.
        container_id: the Open's container-id.
        hostname: the Open's hostname (``None`` when absent).
        channel_max: the peer's channel-max as proton applies it (65535 when absent).
        max_frame_size: the peer's max-frame-size in bytes as proton reports it.
        idle_timeout: the peer's idle-time-out in seconds (0 when absent).
        offered_capabilities, desired_capabilities: the Open's capability symbols.
        properties: the Open's properties (``None`` when absent).
        user: the authenticated user name (``anonymous`` for ANONYMOUS or no SASL).
        mechanism: the SASL mechanism used (``None`` without SASL).
        authenticated: whether a SASL exchange succeeded.
        fields: the Open's fields exactly as present in the frame, name -> proton's text form
            (for example ``{"channel-max": "0x9"}``); empty when frame recording is off.
    """

    conn_id: int
    remote_address: tuple[str, int] | None
    container_id: str | None
    hostname: str | None
    channel_max: int
    max_frame_size: int
    idle_timeout: float
    offered_capabilities: tuple[str, ...]
    desired_capabilities: tuple[str, ...]
    properties: dict[Any, Any] | None
    user: str | None
    mechanism: str | None
    authenticated: bool
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PeerBegin:
    """A peer's Begin frame, read from proton's frame trace.

    Attributes:
        conn_id: the connection (see :attr:`PeerOpen.conn_id`).
        channel: the channel the Begin arrived on.
        remote_channel, next_outgoing_id, incoming_window, outgoing_window, handle_max: the
            Begin's fields (``None`` when absent; handle-max's default is 4294967295).
        fields: every field present, name -> proton's text form.
    """

    conn_id: int
    channel: int
    remote_channel: int | None
    next_outgoing_id: int | None
    incoming_window: int | None
    outgoing_window: int | None
    handle_max: int | None
    fields: Mapping[str, str]


@dataclass(frozen=True)
class PeerAttach:
    """A peer's Attach (link opening) as the broker received it.

    Attributes:
        conn_id: the connection.
        name: the link name.
        role: the *client's* role: ``"sender"`` or ``"receiver"``.
        source, target: the terminus addresses (``None`` when absent).
        dynamic: whether the client asked for a dynamic source (receiver) or target (sender).
        address: the address the broker uses for the link (the generated one when dynamic,
            ``None`` for an anonymous sender).
        snd_settle_mode, rcv_settle_mode: the modes the client asked for (proton's constants).
    """

    conn_id: int
    name: str
    role: str
    source: str | None
    target: str | None
    dynamic: bool
    address: str | None
    snd_settle_mode: int
    rcv_settle_mode: int


# -- internal state --------------------------------------------------------------------------


class _Queue:
    __slots__ = (
        "address",
        "messages",
        "consumers",
        "rr",
        "received",
        "delivered",
        "unsettled",
        "dynamic",
    )

    def __init__(self, address: str, dynamic: bool = False) -> None:
        self.address = address
        self.messages: collections.deque[bytes] = collections.deque()
        self.consumers: list[_LinkState] = []
        self.rr = 0
        self.received = 0
        self.delivered = 0
        self.unsettled = 0
        self.dynamic = dynamic


class _LinkState:
    __slots__ = (
        "link",
        "conn_id",
        "is_consumer",
        "address",
        "queue",
        "presettled",
        "unsettled",
        "tags",
        "buffer",
        "refuse",
        "closed",
        "credit",
    )

    def __init__(self, link: Link, conn_id: int) -> None:
        self.link = link
        self.conn_id = conn_id
        self.is_consumer = link.is_sender  # the broker sends: the client consumes
        self.address: str | None = None
        self.queue: _Queue | None = None
        self.presettled = False
        self.unsettled: dict[Any, tuple[Delivery, bytes]] = {}
        self.tags = itertools.count(1)
        self.buffer = bytearray()
        self.refuse: Condition | None = None
        self.closed = False
        self.credit = 0  # the consumer link's credit as last seen on the container thread


class _ConnState:
    __slots__ = ("conn_id", "connection", "transport", "remote_address", "opened", "links")

    def __init__(self, conn_id: int, connection: Any, transport: Transport) -> None:
        self.conn_id = conn_id
        self.connection = connection
        self.transport = transport
        self.remote_address: tuple[str, int] | None = None
        self.opened = False
        self.links: list[_LinkState] = []


_FRAME_RE = re.compile(r"(\d+) <- @(open|begin)\(\d+\) \[(.*)\]")


def _split_fields(text: str) -> dict[str, str]:
    """Split proton's ``name=value, name=value`` frame text at top-level commas."""
    fields: dict[str, str] = {}
    depth = 0
    quote = False
    start = 0
    items = []
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    items.append(text[start:])
    for item in items:
        name, sep, value = item.strip().partition("=")
        if sep:
            fields[name] = value
    return fields


def _int_field(fields: Mapping[str, str], name: str) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    try:
        return int(value, 0)
    except ValueError:
        return None


def _symbols(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (str(value),)
    try:
        return tuple(str(v) for v in value)
    except TypeError:
        return (str(value),)


# -- the reactor handler ---------------------------------------------------------------------


class _ForceClose(Handler):
    """Timer handler: force-close the connections that did not finish closing in time."""

    def __init__(self, handler: _BrokerHandler) -> None:
        super().__init__()
        self._handler = handler

    def on_timer_task(self, event: Any) -> None:
        self._handler.force_close_all()


class _BrokerHandler(MessagingHandler):
    """The broker's event handler; runs only on the container thread."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        # Keep only the endpoint open/close automation; deliveries, flow control and settlement
        # are handled here (raw bytes, no decode/re-encode).
        # (proton annotates the attribute with its class-level descriptor: here it is a list)
        self.handlers = [h for h in self.handlers  # type: ignore[union-attr]
                         if isinstance(h, EndpointStateHandler)]
        self.broker = broker
        self.queues: dict[str, _Queue] = {}
        self.topic_subs: dict[_LinkState, re.Pattern[str]] = {}
        self.conns: dict[int, _ConnState] = {}
        self.links: dict[Link, _LinkState] = {}
        self.acceptor: Any = None
        self.injector: EventInjector | None = None
        self.stopping = False
        self._grace_task: Any = None

    # -- lifecycle --------------------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        self.broker._loop_started.set()

    def on_broker_stop(self, event: Any) -> None:
        self.stopping = True
        if self.acceptor is not None:
            self.acceptor.close()
        if self.injector is not None:
            self.injector.close()
        for state in list(self.conns.values()):
            conn = state.connection
            if not conn.state & Endpoint.LOCAL_CLOSED:
                conn.condition = Condition("amqp:connection:forced", "broker stopping")
                conn.close()
        if self.conns:
            assert self.broker._container is not None
            self._grace_task = self.broker._container.schedule(
                self.broker.stop_grace, _ForceClose(self)
            )

    def force_close_all(self) -> None:
        for state in list(self.conns.values()):
            self._force_close(state.transport)
            self._forget_connection(state.conn_id)

    @staticmethod
    def _force_close(transport: Transport) -> None:
        """Close a transport and its socket now (what proton's IOHandler does on a socket error)."""
        with contextlib.suppress(Exception):
            transport.close_head()
        with contextlib.suppress(Exception):
            transport.close_tail()
        sel = getattr(transport, "_selectable", None)
        if sel is not None:
            with contextlib.suppress(Exception):
                sel.terminate()
                sel._transport = None
                transport._selectable = None
                sel.update()

    # -- connections ------------------------------------------------------------------------

    def on_connection_bound(self, event: Any) -> None:
        b = self.broker
        transport = event.transport
        connection = event.connection
        conn_id = b._next_conn_id()
        connection.broker_conn_id = conn_id
        state = _ConnState(conn_id, connection, transport)
        url = getattr(connection, "url", None)
        if url is not None and url.host:
            with contextlib.suppress(TypeError, ValueError):
                state.remote_address = (str(url.host), int(url.port))
        self.conns[conn_id] = state
        with b._lock:
            b._sockets += 1
        if self.stopping:
            self._force_close(transport)
            return
        if b.max_frame_size:
            transport.max_frame_size = b.max_frame_size
        if b.channel_max is not None:
            transport.channel_max = b.channel_max
        if b.idle_timeout:
            transport.idle_timeout = b.idle_timeout
        transport.require_auth(b.require_auth)
        sasl = transport.sasl()
        sasl.allow_insecure_mechs = b.allow_insecure_mechs
        active = b._active_sasl
        if active is not None:
            sasl.config_path(str(active.config_dir))
            sasl.config_name(active.config_name)
        sasl.allowed_mechs(" ".join(b._mechs))
        if b.record_frames:
            transport.tracer = lambda _t, msg, cid=conn_id: self._on_trace(cid, msg)
            transport.trace(Transport.TRACE_FRM)

    def _on_trace(self, conn_id: int, message: str) -> None:
        if "<- @open(" not in message and "<- @begin(" not in message:
            return
        match = _FRAME_RE.search(message)
        if match is None:
            return
        channel, kind, body = int(match.group(1)), match.group(2), match.group(3)
        fields = _split_fields(body)
        b = self.broker
        if kind == "open":
            with b._lock:
                b._open_fields[conn_id] = fields
            return
        begin = PeerBegin(
            conn_id=conn_id,
            channel=channel,
            remote_channel=_int_field(fields, "remote-channel"),
            next_outgoing_id=_int_field(fields, "next-outgoing-id"),
            incoming_window=_int_field(fields, "incoming-window"),
            outgoing_window=_int_field(fields, "outgoing-window"),
            handle_max=_int_field(fields, "handle-max"),
            fields=fields,
        )
        with b._lock:
            b._begins.append(begin)

    def on_connection_opening(self, event: Any) -> None:
        b = self.broker
        conn = event.connection
        transport = event.transport or conn.transport
        conn.container = b.container_id
        conn.offered_capabilities = SymbolList([ANONYMOUS_RELAY])
        conn_id = getattr(conn, "broker_conn_id", None)
        state = self.conns.get(conn_id) if conn_id is not None else None
        sasl = transport.sasl() if transport is not None else None
        user = transport.user if transport is not None else None
        with b._lock:
            fields = b._open_fields.get(conn_id or 0, {})
        record = PeerOpen(
            conn_id=conn_id or 0,
            remote_address=state.remote_address if state else None,
            container_id=conn.remote_container,
            hostname=conn.remote_hostname,
            channel_max=transport.remote_channel_max if transport is not None else 0,
            max_frame_size=transport.remote_max_frame_size if transport is not None else 0,
            idle_timeout=transport.remote_idle_timeout if transport is not None else 0.0,
            offered_capabilities=_symbols(conn.remote_offered_capabilities),
            desired_capabilities=_symbols(conn.remote_desired_capabilities),
            properties=dict(conn.remote_properties) if conn.remote_properties else None,
            user=user,
            mechanism=sasl.mech if sasl is not None else None,
            authenticated=bool(transport is not None and transport.authenticated),
            fields=dict(fields),
        )
        with b._lock:
            b._opens.append(record)
            b.open_hostnames.append(conn.remote_hostname)
            b.auth_users.append(user)
            if len(b.auth_users) > 2 * b.record_limit:  # trim now and then, keep it a list
                del b.auth_users[: -b.record_limit]
                del b.open_hostnames[: -b.record_limit]
            b._open_connections += 1
        if state is not None:
            state.opened = True

    def on_transport_error(self, event: Any) -> None:
        cond = event.transport.condition if event.transport is not None else None
        if cond is not None and cond.name == "amqp:unauthorized-access":
            with self.broker._lock:
                self.broker._auth_failures += 1
        _log.debug("transport error: %s", cond)

    def on_transport_closed(self, event: Any) -> None:
        conn = event.connection
        conn_id = getattr(conn, "broker_conn_id", None) if conn is not None else None
        if conn_id is not None:
            self._forget_connection(conn_id)

    def on_connection_error(self, event: Any) -> None:
        _log.debug("connection closed by peer with %s", event.connection.remote_condition)

    def on_session_error(self, event: Any) -> None:
        _log.debug("session ended by peer with %s", event.session.remote_condition)

    def on_link_error(self, event: Any) -> None:
        _log.debug("link detached by peer with %s", event.link.remote_condition)

    def _forget_connection(self, conn_id: int) -> None:
        state = self.conns.pop(conn_id, None)
        if state is None:
            return
        for link_state in list(state.links):
            self._drop_link(link_state)
        b = self.broker
        with b._lock:
            b._sockets -= 1
            if state.opened:
                b._open_connections -= 1
            b._open_fields.pop(conn_id, None)
        if self.stopping and not self.conns and self._grace_task is not None:
            self._grace_task.cancel()
            self._grace_task = None

    # -- sessions and links -----------------------------------------------------------------

    def on_session_remote_close(self, event: Any) -> None:
        session = event.session
        for link_state in list(self.links.values()):
            if link_state.link.session == session:
                self._drop_link(link_state)

    def on_link_opening(self, event: Any) -> None:
        link = event.link
        conn_id = getattr(link.connection, "broker_conn_id", 0)
        state = _LinkState(link, conn_id)
        self.links[link] = state
        conn_state = self.conns.get(conn_id)
        if conn_state is not None:
            conn_state.links.append(state)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        remote_source, remote_target = link.remote_source, link.remote_target
        if state.is_consumer:
            dynamic = bool(remote_source.dynamic)
            if dynamic:
                address: str | None = self._new_dynamic(state)
                link.source.address = address
            else:
                address = remote_source.address
            link.rcv_settle_mode = link.remote_rcv_settle_mode
            state.presettled = link.snd_settle_mode == Link.SND_SETTLED
            if not address:
                state.refuse = Condition("amqp:not-found", "no source address")
                link.source.type = Terminus.UNSPECIFIED
            else:
                state.address = address
                pattern = _topic_pattern(address)
                if pattern is not None:
                    state.queue = _Queue(address)  # private: one copy per subscription
                    self.topic_subs[state] = pattern
                else:
                    state.queue = self._queue(address)
                with self.broker._lock:
                    state.queue.consumers.append(state)
        else:
            dynamic = bool(remote_target.dynamic)
            if dynamic:
                address = self._new_dynamic(state)
                link.target.address = address
            else:
                address = remote_target.address
            link.rcv_settle_mode = Link.RCV_FIRST
            state.address = address or None  # None: anonymous relay by each message's "to"
        record = PeerAttach(
            conn_id=conn_id,
            name=link.name,
            role="receiver" if state.is_consumer else "sender",
            source=remote_source.address,
            target=remote_target.address,
            dynamic=dynamic,
            address=state.address,
            snd_settle_mode=int(link.remote_snd_settle_mode),
            rcv_settle_mode=int(link.remote_rcv_settle_mode),
        )
        with self.broker._lock:
            self.broker._attaches.append(record)

    def on_link_opened(self, event: Any) -> None:
        link = event.link
        state = self.links.get(link)
        if state is None:
            return
        if state.refuse is not None:
            link.condition = state.refuse
            link.close()
            self._drop_link(state)
            return
        if state.is_consumer:
            if state.queue is not None:
                self._pump(state.queue)
        else:
            link.flow(self.broker.credit_window)

    def on_link_remote_close(self, event: Any) -> None:
        state = self.links.get(event.link)
        if state is not None:
            self._drop_link(state)

    def on_link_remote_detach(self, event: Any) -> None:
        link = event.link
        state = self.links.get(link)
        if state is not None:
            self._drop_link(state)
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.detach()

    def _new_dynamic(self, state: _LinkState) -> str:
        address = f"{DYNAMIC_PREFIX}{uuid.uuid4().hex}"
        self._queue(address, dynamic=True)
        return address

    def _queue(self, address: str, dynamic: bool = False) -> _Queue:
        queue = self.queues.get(address)
        if queue is None:
            queue = _Queue(address, dynamic)
            with self.broker._lock:
                self.queues[address] = queue
        return queue

    def _drop_link(self, state: _LinkState) -> None:
        if state.closed:
            return
        state.closed = True
        self.links.pop(state.link, None)
        self.topic_subs.pop(state, None)
        conn_state = self.conns.get(state.conn_id)
        if conn_state is not None and state in conn_state.links:
            conn_state.links.remove(state)
        queue = state.queue
        if queue is not None and state in queue.consumers:
            with self.broker._lock:
                queue.consumers.remove(state)
        returned = [body for (_dlv, body) in state.unsettled.values()]
        for dlv, _body in state.unsettled.values():
            with contextlib.suppress(Exception):
                dlv.settle()
        state.unsettled.clear()
        state.buffer = bytearray()
        if queue is not None and returned:
            with self.broker._lock:
                queue.messages.extendleft(reversed(returned))
                queue.unsettled -= len(returned)
        if state.address is not None and state.address.startswith(DYNAMIC_PREFIX):
            dyn = self.queues.get(state.address)
            if dyn is not None and dyn.dynamic:
                with self.broker._lock:
                    del self.queues[state.address]
                return
        if queue is not None and returned:
            self._pump(queue)

    # -- flow and deliveries ----------------------------------------------------------------

    def on_link_flow(self, event: Any) -> None:
        state = self.links.get(event.link)
        if state is not None and state.is_consumer and state.queue is not None:
            self._pump(state.queue)
            state.credit = state.link.credit

    def on_delivery(self, event: Any) -> None:
        dlv = event.delivery
        link = dlv.link
        state = self.links.get(link)
        if state is None:
            if not dlv.partial:
                dlv.settle()
            return
        if state.is_consumer:
            self._on_consumer_disposition(state, dlv)
        else:
            self._on_incoming(state, dlv)

    def _on_incoming(self, state: _LinkState, dlv: Delivery) -> None:
        link = state.link
        if dlv.aborted:
            state.buffer = bytearray()
            dlv.settle()
            self._replenish(link)
            return
        if not dlv.readable:
            return
        pending = dlv.pending
        if pending > 0:
            data = link.recv(pending)
            if data:
                state.buffer += data
        if dlv.partial:
            return
        body = bytes(state.buffer)
        state.buffer = bytearray()
        link.advance()
        address = state.address
        if address is None:
            try:
                msg = Message()
                msg.decode(body)
                address = msg.address
            except Exception as exc:  # noqa: BLE001 - any decode failure rejects the message
                self._reject(dlv, "amqp:decode-error", f"cannot decode message: {exc}")
                self._replenish(link)
                return
            if not address:
                self._reject(dlv, "amqp:not-found", "anonymous relay needs a 'to' address")
                self._replenish(link)
                return
        queue = self._queue(address)
        copies = [sub.queue for sub, pattern in self.topic_subs.items()
                  if sub.queue is not None and pattern.fullmatch(address)]
        with self.broker._lock:
            queue.messages.append(body)
            queue.received += 1
            for copy in copies:
                copy.messages.append(body)
                copy.received += 1
        if not dlv.settled:
            dlv.update(Delivery.ACCEPTED)
        dlv.settle()
        self._replenish(link)
        self._pump(queue)
        for copy in copies:
            self._pump(copy)

    @staticmethod
    def _reject(dlv: Delivery, name: str, description: str) -> None:
        if not dlv.settled:
            dlv.local.condition = Condition(name, description)
            dlv.update(Delivery.REJECTED)
        dlv.settle()

    def _replenish(self, link: Link) -> None:
        window = self.broker.credit_window
        if link.credit <= window // 2 and link.state & Endpoint.LOCAL_ACTIVE:
            link.flow(window - link.credit)

    def _on_consumer_disposition(self, state: _LinkState, dlv: Delivery) -> None:
        if not dlv.updated:
            return
        remote = dlv.remote_state
        terminal = remote in (
            Delivery.ACCEPTED,
            Delivery.REJECTED,
            Delivery.RELEASED,
            Delivery.MODIFIED,
        )
        if not terminal and not dlv.settled:
            return  # e.g. RECEIVED: nothing to do yet
        entry = state.unsettled.pop(dlv.tag, None)
        dlv.settle()
        queue = state.queue
        if entry is None or queue is None:
            return
        requeue = remote in (Delivery.RELEASED, Delivery.MODIFIED)
        with self.broker._lock:
            queue.unsettled -= 1
            if requeue:
                queue.messages.appendleft(entry[1])
        if requeue:
            self._pump(queue)

    def _pump(self, queue: _Queue) -> None:
        """Send queued messages to the queue's consumers with credit, round robin."""
        consumers = queue.consumers
        while queue.messages and consumers:
            chosen = None
            for i in range(len(consumers)):
                candidate = consumers[(queue.rr + i) % len(consumers)]
                if candidate.link.credit > 0:
                    chosen = candidate
                    queue.rr = (queue.rr + i + 1) % len(consumers)
                    break
            if chosen is None:
                break
            with self.broker._lock:
                body = queue.messages.popleft()
                queue.delivered += 1
            self._send(chosen, body)
            chosen.credit = chosen.link.credit
            if not chosen.presettled:
                with self.broker._lock:
                    queue.unsettled += 1
        if not queue.messages:
            for consumer in consumers:
                link = consumer.link
                if link.drain_mode and link.credit > 0:
                    link.drained()

    @staticmethod
    def _send(state: _LinkState, body: bytes) -> None:
        link = state.link
        dlv = link.delivery(str(next(state.tags)))
        link.stream(body)
        link.advance()
        if state.presettled:
            dlv.settle()
        else:
            state.unsettled[dlv.tag] = (dlv, body)  # keyed as proton reports the tag


def _topic_pattern(address: str) -> re.Pattern[str] | None:
    """A regex for an MQTT-style subscription (``+`` one token, ``#`` the rest), else None."""
    tokens = address.split("/")
    if "+" not in tokens and "#" not in tokens:
        return None
    parts: list[str] = []
    for i, token in enumerate(tokens):
        if token == "#" and i == len(tokens) - 1:
            # "#" also matches the parent itself ("A/#" matches "A")
            return re.compile("/".join(parts) + ("(?:/.*)?" if parts else ".*"))
        parts.append("[^/]+" if token == "+" else re.escape(token))
    return re.compile("/".join(parts))


# -- the public broker -----------------------------------------------------------------------

_live_brokers: weakref.WeakSet[Broker] = weakref.WeakSet()
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    with _live_lock:
        brokers = list(_live_brokers)
    for broker in brokers:
        broker.stop_grace = min(broker.stop_grace, 0.2)
        with contextlib.suppress(Exception):
            broker.stop(timeout=2.0)


atexit.register(_stop_all_at_exit)


class Broker:
    """An in-memory AMQP 1.0 broker running proton's reactor in a daemon thread.

    Nothing runs until :meth:`start`. Usable as a context manager (``with Broker() as b:``).

    Args:
        host: IPv4 address (or name) to listen on; ``127.0.0.1`` by default. proton's
            acceptor is IPv4-only.
        port: TCP port; 0 (default) lets the kernel pick a free one, see :attr:`port`.
        sasl: Cyrus SASL config (:func:`.sasl.make_sasl_config` or
            :func:`.sasl.shared_sasl_config`) checking PLAIN/SCRAM passwords. ``None``: the
            broker offers ANONYMOUS only. See the module docstring for the one-config-per-
            process rule.
        sasl_config_dir, sasl_config_name: the same as ``sasl``, given as a Cyrus config
            directory and config name (the ``<name>.conf`` file is read for ``mech_list`` and
            ``sasldb_path``). Mutually exclusive with ``sasl``.
        allow_anonymous: offer ANONYMOUS too (when ``sasl`` lists it). Without ``sasl``, must
            stay true.
        allow_insecure_mechs: let Cyrus offer PLAIN and other mechanisms on plain TCP (it
            offers none there otherwise).
        require_auth: refuse clients that skip SASL (proton's ``require_auth``); by default a
            client without SASL is let in as ``anonymous``.
        max_frame_size: the broker's Open max-frame-size in bytes (``None``: proton's default,
            32768).
        channel_max: the broker's Open channel-max (``None``: proton's default, 32767).
        idle_timeout: the broker's idle timeout in seconds (``None``/0: none): proton closes
            connections that send nothing for this long, and advertises half of it as the
            Open idle-time-out so that peers heartbeat in time.
        container_id: the container-id of the broker's Open.
        credit_window: link credit the broker grants each client sender, topped up as
            messages arrive.
        record_frames: trace incoming frames to record the peers' Open fields and Begin
            frames (:meth:`opens`, :meth:`begins`); costs some CPU per frame.
        stop_grace: seconds :meth:`stop` lets peers answer the broker's Close before it drops
            their sockets.
        record_limit: how many Open/Begin/Attach records and user/hostname entries to keep
            (the oldest go first), so long runs do not grow without bound.

    Raises:
        ValueError: for contradictory arguments (``sasl`` with ``sasl_config_dir``; no
            ``sasl`` and ``allow_anonymous=False``; an IPv6 ``host``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sasl: SaslConfig | None = None,
        sasl_config_dir: str | Path | None = None,
        sasl_config_name: str | None = None,
        allow_anonymous: bool = True,
        allow_insecure_mechs: bool = True,
        require_auth: bool = False,
        max_frame_size: int | None = None,
        channel_max: int | None = None,
        idle_timeout: float | None = None,
        container_id: str = "demo-broker",
        credit_window: int = 250,
        record_frames: bool = True,
        stop_grace: float = 1.0,
        record_limit: int = 10000,
    ) -> None:
        if ":" in host:
            raise ValueError("the demo broker listens on IPv4 only (proton's acceptor)")
        if sasl is not None and (sasl_config_dir is not None or sasl_config_name is not None):
            raise ValueError("give either sasl= or sasl_config_dir/sasl_config_name, not both")
        if sasl_config_dir is not None or sasl_config_name is not None:
            if sasl_config_dir is None or sasl_config_name is None:
                raise ValueError("sasl_config_dir and sasl_config_name go together")
            sasl = load_sasl_config(sasl_config_dir, sasl_config_name)
        if sasl is None and not allow_anonymous:
            raise ValueError("without a SASL config the broker can only offer ANONYMOUS")
        if credit_window < 1:
            raise ValueError("credit_window must be at least 1")
        self.host = host
        self.port = port
        self.sasl = sasl
        self.allow_anonymous = allow_anonymous
        self.allow_insecure_mechs = allow_insecure_mechs
        self.require_auth = require_auth
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.idle_timeout = idle_timeout
        self.container_id = container_id
        self.credit_window = credit_window
        self.record_frames = record_frames
        self.stop_grace = stop_grace
        self.record_limit = max(1, record_limit)
        if sasl is None:
            mechs = ["ANONYMOUS"]
        else:
            mechs = [m for m in sasl.mechs if allow_anonymous or m != "ANONYMOUS"]
        self._mechs: tuple[str, ...] = tuple(mechs)
        #: Authenticated user name of every connection whose Open arrived, in order
        #: (``anonymous`` for ANONYMOUS and for clients without SASL).
        self.auth_users: list[str | None] = []
        #: The Open hostname of every connection, in order (``None`` when absent).
        self.open_hostnames: list[str | None] = []
        self.error: BaseException | None = None
        self._active_sasl: SaslConfig | None = None
        self._lock = threading.Lock()
        self._loop_started = threading.Event()
        self._conn_ids = itertools.count(1)
        self._sockets = 0
        self._open_connections = 0
        self._auth_failures = 0
        self._opens: collections.deque[PeerOpen] = collections.deque(maxlen=self.record_limit)
        self._open_fields: dict[int, dict[str, str]] = {}
        self._begins: collections.deque[PeerBegin] = collections.deque(maxlen=self.record_limit)
        self._attaches: collections.deque[PeerAttach] = collections.deque(maxlen=self.record_limit)
        self._handler: _BrokerHandler | None = None
        self._container: Container | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the broker listens on (the real port once started)."""
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``amqp://host:port`` for clients."""
        return f"amqp://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the container thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> Broker:
        """Bind the listener, start the container thread, and wait until it runs.

        The socket listens before this returns, so clients may connect at once.

        Args:
            timeout: seconds to wait for the container thread to start processing.

        Returns:
            ``self`` (so ``b = Broker().start()`` works).

        Raises:
            OSError: the address cannot be bound (e.g. the port is in use).
            SaslConfigConflict: the SASL config cannot be used in this process.
            BrokerError: a SASL config was given but proton lacks Cyrus SASL.
            BrokerError: the event loop did not start in time or failed while starting.
            RuntimeError: the broker was already started.
        """
        if self._thread is not None or self._stopped:
            raise RuntimeError("a Broker can be started once")
        if SASL.extended():
            self._active_sasl = _activate_sasl(self.sasl)
        elif self.sasl is not None:
            raise BrokerError(
                "python-qpid-proton was built without Cyrus SASL (proton.SASL.extended() is "
                "False), so it cannot check passwords: install libsasl2-dev and rebuild it "
                "(pip install --no-binary python-qpid-proton python-qpid-proton)"
            )
        handler = _BrokerHandler(self)
        container = Container(handler, container_id=self.container_id)
        handler.acceptor = container.listen(f"{self.host}:{self.port}")
        sock = getattr(handler.acceptor, "_selectable", None)
        if sock is None:
            handler.acceptor.close()
            raise BrokerError("cannot find the listening socket of proton's acceptor")
        self.port = int(sock.getsockname()[1])
        with contextlib.suppress(OSError):
            sock.listen(1024)  # proton listens with a backlog of 10
        handler.injector = EventInjector()
        container.selectable(handler.injector)
        self._handler = handler
        self._container = container
        self._thread = threading.Thread(
            target=self._run, name=f"demo-broker-{self.port}", daemon=True
        )
        with _live_lock:
            _live_brokers.add(self)
        self._thread.start()
        if not self._loop_started.wait(timeout) or self.error is not None:
            error = self.error
            self.stop()
            raise BrokerError(f"the broker's event loop did not start: {error!r}")
        return self

    def _run(self) -> None:
        assert self._container is not None
        try:
            self._container.run()
        except BaseException as exc:  # noqa: BLE001 - recorded and logged, the thread ends
            self.error = exc
            _log.exception("demo broker event loop failed")
            self._loop_started.set()
            handler = self._handler
            if handler is not None:
                with contextlib.suppress(Exception):
                    handler.acceptor.close()
                    handler.acceptor._selectable.close()
                for state in list(handler.conns.values()):
                    sel = getattr(state.transport, "_selectable", None)
                    if sel is not None:
                        with contextlib.suppress(Exception):
                            sel.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and all connections, stop the container and join its thread.

        Peers get a Close (``amqp:connection:forced``, "broker stopping"); sockets of peers
        that do not answer within ``stop_grace`` seconds are dropped. Idempotent; also run at
        interpreter exit for every broker still running.

        Args:
            timeout: seconds to wait for the thread.

        Raises:
            BrokerError: the thread did not end within ``timeout`` seconds.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        thread, handler = self._thread, self._handler
        if thread is not None and thread.is_alive() and handler is not None:
            assert handler.injector is not None
            with contextlib.suppress(Exception):
                handler.injector.trigger(ApplicationEvent("broker_stop"))
            if thread is not threading.current_thread():
                thread.join(timeout)
                if thread.is_alive():
                    raise BrokerError(f"the broker thread did not stop within {timeout} s")
        with _live_lock:
            _live_brokers.discard(self)
        if (
            handler is not None
            and handler.injector is not None
            and not (thread is not None and thread.is_alive())
        ):
            # proton never closes an EventInjector's pipe
            for fd in handler.injector.pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            handler.injector = None

    def __enter__(self) -> Broker:
        """Start the broker and return it."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the broker."""
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Broker {self.host}:{self.port} {state}>"

    def _next_conn_id(self) -> int:
        return next(self._conn_ids)

    # -- introspection (thread-safe) --------------------------------------------------------

    def connection_count(self) -> int:
        """AMQP connections now open: the peer's Open arrived and the transport is not closed."""
        with self._lock:
            return self._open_connections

    def socket_count(self) -> int:
        """TCP connections now accepted and not closed (including ones still in SASL)."""
        with self._lock:
            return self._sockets

    def auth_failures(self) -> int:
        """How many SASL authentications failed so far."""
        with self._lock:
            return self._auth_failures

    def queue_depth(self, address: str) -> int:
        """Messages waiting on ``address`` (not counting ones delivered but unsettled)."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return len(queue.messages) if queue is not None else 0

    def unsettled_count(self, address: str) -> int:
        """Messages of ``address`` delivered to consumers and not yet settled by them."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return queue.unsettled if queue is not None else 0

    def delivered(self, address: str) -> int:
        """Deliveries ever sent to consumers of ``address`` (redeliveries count again)."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return queue.delivered if queue is not None else 0

    def consumer_count(self, address: str) -> int:
        """Client receivers now attached to ``address``."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return len(queue.consumers) if queue is not None else 0

    def consumer_credit(self, address: str) -> int:
        """The link credit the receivers of ``address`` have granted and not used, in total."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return sum(c.credit for c in queue.consumers) if queue is not None else 0

    def received(self, address: str) -> int:
        """Messages ever enqueued on ``address`` (from its senders and by anonymous relay)."""
        with self._lock:
            queue = self._handler.queues.get(address) if self._handler else None
            return queue.received if queue is not None else 0

    def addresses(self) -> list[str]:
        """The addresses that have a queue now (dynamic ones included while their link lives)."""
        with self._lock:
            return sorted(self._handler.queues) if self._handler else []

    def opens(self) -> list[PeerOpen]:
        """Every peer Open received, in order."""
        with self._lock:
            return list(self._opens)

    def last_open(self) -> PeerOpen | None:
        """The most recent peer Open, or ``None``."""
        with self._lock:
            return self._opens[-1] if self._opens else None

    def begins(self) -> list[PeerBegin]:
        """Every peer Begin received, in order (empty when ``record_frames`` is off)."""
        with self._lock:
            return list(self._begins)

    def attaches(self) -> list[PeerAttach]:
        """Every peer Attach (link opening) received, in order."""
        with self._lock:
            return list(self._attaches)

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01
    ) -> bool:
        """Poll ``predicate`` until it is true or ``timeout`` seconds pass.

        Returns:
            The predicate's last value.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())
