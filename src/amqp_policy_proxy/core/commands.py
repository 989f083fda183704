"""Sans-IO. Commands the core returns for the shell to execute, in order.

Imperatives (mitmproxy ``SendData``/``OpenConnection``): the shell writes bytes, opens the
upstream transport, closes transports and fans events out. It never awaits while executing
them, so feeding the core stays atomic.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .events import ProxyEvent


class Side(StrEnum):
    """The two legs of a proxied connection."""

    CLIENT = "client"
    """The AMQP client connected to the proxy's listener."""
    ROUTER = "broker"
    """The upstream router (qdrouterd, or a broker such as RabbitMQ) the proxy connected to.

    The value ``"broker"`` is what the metrics (``side`` label) and the event log
    (``protocol_error.side``) have always exported for this leg; dashboards and reports
    depend on it, so it stays."""


#: The two sides as plain module names (reading an Enum member through its class costs ~75 ns on
#: CPython 3.11, a module name ~10; the core names a side several times per frame).
CLIENT = Side.CLIENT
ROUTER = Side.ROUTER


def other(side: Side) -> Side:
    """Return the opposite side."""
    return ROUTER if side is CLIENT else CLIENT


@dataclass(slots=True)
class SendData:
    """Write ``data`` (forwarded original bytes or synthesized frames) to ``side``."""

    side: Side
    data: bytes | bytearray | memoryview


@dataclass(slots=True)
class ConnectRouter:
    """Open the upstream transport (issued once the client's protocol header is valid)."""


@dataclass(slots=True)
class CloseTransport:
    """Close ``side``'s TCP transport after flushing what was written before."""

    side: Side


@dataclass(slots=True)
class Emit:
    """Publish an observability event."""

    event: ProxyEvent


Command = SendData | ConnectRouter | CloseTransport | Emit
