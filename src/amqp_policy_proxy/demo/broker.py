"""An embedded AMQP 1.0 broker on proton's reactor, used by ``demo`` and by the test suite.

Queues per address (in memory, FIFO, competing consumers, credit respected), anonymous relay
by each message's ``to``, dynamic sources, at-least-once and at-most-once delivery, and SASL
through Cyrus (PLAIN against a sasldb) or ANONYMOUS. It runs its container in a daemon thread
and binds 127.0.0.1 by default.
"""

from __future__ import annotations

import collections
import itertools
import socket
import threading
import time
from typing import Any

from proton import Delivery, Link, Message, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

from .sasl import SaslConfig


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Queue:
    __slots__ = ("messages", "consumers", "received", "_rr")

    def __init__(self) -> None:
        self.messages: collections.deque[Message] = collections.deque()
        self.consumers: list[Link] = []
        self.received = 0
        self._rr = 0

    def dispatch(self, unsettled: dict[Delivery, tuple[str, Message]], address: str) -> None:
        consumers = [c for c in self.consumers if c.credit > 0]
        while self.messages and consumers:
            link = consumers[self._rr % len(consumers)]
            self._rr += 1
            msg = self.messages.popleft()
            delivery = link.send(msg)
            if link.snd_settle_mode == Link.SND_SETTLED:
                delivery.settle()
            else:
                unsettled[delivery] = (address, msg)
            consumers = [c for c in self.consumers if c.credit > 0]


class _Handler(MessagingHandler):
    def __init__(self, broker: Broker) -> None:
        super().__init__(auto_accept=False, auto_settle=True)
        self.broker = broker
        self.queues: dict[str, _Queue] = collections.defaultdict(_Queue)
        self.unsettled: dict[Delivery, tuple[str, Message]] = {}
        self._dyn = itertools.count(1)

    # lifecycle ---------------------------------------------------------------------------
    def on_start(self, event: Any) -> None:
        b = self.broker
        self.acceptor = event.container.listen(f"{b.host}:{b.port}")
        b._started.set()

    def on_connection_bound(self, event: Any) -> None:
        b = self.broker
        transport = event.transport
        if b.max_frame_size:
            transport.max_frame_size = b.max_frame_size
        if b.idle_timeout:
            transport.idle_timeout = b.idle_timeout
        sasl = transport.sasl()
        sasl.allow_insecure_mechs = True
        if b.sasl is not None:
            sasl.config_path(b.sasl.config_dir)
            sasl.config_name(b.sasl.config_name)
            mechs = ["PLAIN"] + (["ANONYMOUS"] if b.allow_anonymous else [])
            sasl.allowed_mechs(" ".join(mechs))
        else:
            sasl.allowed_mechs("ANONYMOUS")

    def on_connection_opening(self, event: Any) -> None:
        conn = event.connection
        conn.offered_capabilities = symbol("ANONYMOUS-RELAY")
        conn.container = self.broker.container_id
        with self.broker._lock:
            self.broker.open_hostnames.append(conn.remote_hostname)
            user = conn.transport.user if conn.transport is not None else None
            self.broker.auth_users.append(user)
            self.broker._connections += 1

    def on_connection_closed(self, event: Any) -> None:
        self._forget(event.connection)

    def on_transport_closed(self, event: Any) -> None:
        conn = event.connection
        if conn is not None:
            self._forget(conn)

    def _forget(self, conn: Any) -> None:
        if getattr(conn, "_broker_counted_down", False):
            return
        try:
            conn._broker_counted_down = True
        except AttributeError:
            pass
        with self.broker._lock:
            self.broker._connections = max(0, self.broker._connections - 1)
        for q in self.queues.values():
            q.consumers = [c for c in q.consumers if c.connection is not conn]
        for delivery, (address, msg) in list(self.unsettled.items()):
            if delivery.link.connection is conn:
                del self.unsettled[delivery]
                self.queues[address].messages.appendleft(msg)

    # links ---------------------------------------------------------------------------------
    def on_link_opening(self, event: Any) -> None:
        link = event.link
        if link.is_sender:  # the client receives
            if link.remote_source.dynamic:
                address = f"dynamic.{self.broker.container_id}.{next(self._dyn)}"
            else:
                address = link.remote_source.address
            link.source.address = address
            link.source.dynamic = bool(link.remote_source.dynamic)
            if address:
                self.queues[address].consumers.append(link)
        else:
            link.target.address = link.remote_target.address

    def on_link_closing(self, event: Any) -> None:
        self._drop_consumer(event.link)

    def on_link_closed(self, event: Any) -> None:
        self._drop_consumer(event.link)

    def _drop_consumer(self, link: Any) -> None:
        if link.is_sender and link.source.address:
            q = self.queues.get(link.source.address)
            if q is not None and link in q.consumers:
                q.consumers.remove(link)

    def on_sendable(self, event: Any) -> None:
        address = event.link.source.address
        if address:
            self.queues[address].dispatch(self.unsettled, address)

    # messages -----------------------------------------------------------------------------
    def on_message(self, event: Any) -> None:
        address = event.link.target.address or event.message.address
        if not address:
            self.reject(event.delivery)
            return
        q = self.queues[address]
        q.messages.append(event.message)
        q.received += 1
        self.accept(event.delivery)
        q.dispatch(self.unsettled, address)

    def on_accepted(self, event: Any) -> None:
        self.unsettled.pop(event.delivery, None)

    def on_rejected(self, event: Any) -> None:
        self.unsettled.pop(event.delivery, None)

    def on_released(self, event: Any) -> None:
        item = self.unsettled.pop(event.delivery, None)
        if item is not None:
            address, msg = item
            self.queues[address].messages.appendleft(msg)
            self.queues[address].dispatch(self.unsettled, address)

    on_modified = on_released


class Broker:
    """An in-memory AMQP 1.0 broker in a background thread.

    Args:
        host: address to bind (default 127.0.0.1).
        port: TCP port; 0 picks a free one.
        sasl: a Cyrus SASL config (:func:`.sasl.make_sasl_config`) for PLAIN; None offers
            ANONYMOUS only.
        allow_anonymous: also offer ANONYMOUS when ``sasl`` is given.
        max_frame_size: the broker's max-frame-size in bytes (None: proton's default).
        idle_timeout: the broker's idle-time-out in seconds (None: none).
        container_id: the container-id of the broker's Open.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, sasl: SaslConfig | None = None,
                 allow_anonymous: bool = True, max_frame_size: int | None = None,
                 idle_timeout: float | None = None, container_id: str = "demo-broker") -> None:
        """Configure; nothing runs until :meth:`start`."""
        self.host = host
        self.port = port or _free_port(host)
        self.sasl = sasl
        self.allow_anonymous = allow_anonymous
        self.max_frame_size = max_frame_size
        self.idle_timeout = idle_timeout
        self.container_id = container_id
        self.auth_users: list[str | None] = []
        self.open_hostnames: list[str | None] = []
        self._connections = 0
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._handler = _Handler(self)
        self._container: Container | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the broker listens on."""
        return (self.host, self.port)

    def start(self, timeout: float = 10.0) -> Broker:
        """Start the container thread and wait until the port accepts connections.

        Raises:
            RuntimeError: the listener did not come up within ``timeout`` seconds.
        """
        self._container = Container(self._handler)
        self._container.container_id = self.container_id
        self._thread = threading.Thread(target=self._container.run, name="demo-broker",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not listen on {self.host}:{self.port}")

    def stop(self) -> None:
        """Stop the container and join its thread. Idempotent."""
        container = self._container
        if container is None:
            return
        self._container = None

        def _stop() -> None:
            try:
                self._handler.acceptor.close()
            except Exception:
                pass
            container.stop()

        try:
            container.schedule(0, _CallbackHandler(_stop))
        except Exception:
            container.stop()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # introspection (thread-safe enough for tests: reads of ints and list copies)
    def connection_count(self) -> int:
        """Currently open client connections."""
        with self._lock:
            return self._connections

    def queue_depth(self, address: str) -> int:
        """Messages waiting on ``address``."""
        q = self._handler.queues.get(address)
        return len(q.messages) if q is not None else 0

    def received(self, address: str) -> int:
        """Messages ever received for ``address``."""
        q = self._handler.queues.get(address)
        return q.received if q is not None else 0


class _CallbackHandler:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def on_timer_task(self, event: Any) -> None:
        self.fn()
