"""A proton client that sends a planned list of messages at once and records each outcome.

For end-to-end tests of refused deliveries: one connection, one session, a sender per address;
every message goes out as soon as its link has credit (so several deliveries are in flight,
some of them refused by the proxy), tagged with its body, and each outcome (``accepted``,
``rejected: <description>``) is recorded under that tag. The client closes once every
message has one; :func:`run` fails if that does not happen in time (a client left without
link credit, say).
"""

from __future__ import annotations

import threading
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Burst(MessagingHandler):
    """Send ``plan`` (``(address, message)`` pairs, bodies unique strings) over ``url``."""

    def __init__(self, url: str, plan: list[tuple[str, Message]], **connect: Any) -> None:
        """``connect``: keyword arguments of ``Container.connect`` (user, mechanisms...)."""
        super().__init__(auto_settle=True)
        self.url, self.plan, self.connect = url, list(plan), connect
        self.total = len(plan)
        self.outcomes: dict[str, str] = {}
        """Message body -> ``accepted`` or ``rejected: <the condition's description>``."""
        self.senders: dict[str, Any] = {}
        self.error: str | None = None
        """A session or transport error the client saw, if any."""

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, **self.connect)
        for address in dict.fromkeys(a for a, _ in self.plan):
            self.senders[address] = event.container.create_sender(conn, address)

    def on_sendable(self, event: Any) -> None:
        for address, message in list(self.plan):
            sender = self.senders[address]
            if sender.credit <= 0:
                break
            sender.send(message, tag=str(message.body).encode())
            self.plan.remove((address, message))

    def _outcome(self, event: Any, outcome: str) -> None:
        tag = event.delivery.tag
        self.outcomes[tag.decode() if isinstance(tag, bytes) else str(tag)] = outcome
        if len(self.outcomes) == self.total:
            event.connection.close()

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self._outcome(event, f"rejected: {event.delivery.remote.condition.description}")

    def on_session_error(self, event: Any) -> None:
        self.error = str(event.session.remote_condition)
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.error = str(event.transport.condition)


def run(handler: MessagingHandler, timeout: float = 20) -> None:
    """Run ``handler`` in a container on a thread of its own.

    Raises:
        AssertionError: the client did not finish within ``timeout`` seconds.
    """
    container = Container(handler)
    container.timeout = timeout
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the client did not finish"
