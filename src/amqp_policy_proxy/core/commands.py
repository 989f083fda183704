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
    """The two peers of a proxied connection."""

    CLIENT = "client"
    """The AMQP client connected to the proxy's listener."""
    BROKER = "broker"
    """The upstream router or broker the proxy connected to."""


def other(side: Side) -> Side:
    """Return the opposite side."""
    return Side.BROKER if side is Side.CLIENT else Side.CLIENT


@dataclass(frozen=True, slots=True)
class SendData:
    """Write ``data`` (forwarded original bytes or synthesized frames) to ``side``."""

    side: Side
    data: bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class ConnectBroker:
    """Open the upstream transport (issued once the client's protocol header is valid)."""


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close ``side``'s TCP transport after flushing what was written before."""

    side: Side


@dataclass(frozen=True, slots=True)
class Emit:
    """Publish an observability event."""

    event: ProxyEvent


Command = SendData | ConnectBroker | CloseTransport | Emit
