"""Sans-IO. What the two legs of a connection share (:class:`.client_side.ClientSide`,
:class:`.router_side.RouterSide`): the connection's context and output, the sessions and
deliveries their frames go to, and the bytes of a unit that straddles reads."""

from __future__ import annotations

from .context import Context, Room
from .deliveries import Deliveries
from .sessions import Sessions


class Leg(Room):
    """One leg of a connection, the client's or the router's."""

    __slots__ = ("sessions", "deliveries", "buf")

    def __init__(self, ctx: Context, sessions: Sessions, deliveries: Deliveries) -> None:
        """A leg of ``ctx`` that has received nothing yet."""
        Room.__init__(self, ctx)
        self.sessions = sessions
        self.deliveries = deliveries
        self.buf = bytearray()
        """The bytes of a unit that straddles reads (at most one frame, or a protocol
        header), handed to :func:`.framebuf.feed` with the next read."""
