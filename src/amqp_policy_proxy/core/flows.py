"""Sans-IO. Session flow control (Part 2 §2.5.6): the Flows of both legs and the window the
group's ``maxSessionWindow`` gives the client.

:class:`SessionFlows` is the flow-control part of :class:`.sessions.Sessions` (which it is a
base of), in a module of its own: the Flows the proxy rewrites (next-incoming-id and
next-outgoing-id past the Transfer frames the router never got, a sender link's
delivery-count past the deliveries it never got, :mod:`.numbering`; the router's
incoming-window lowered to ``maxSessionWindow``; shaping's credit, :mod:`.shaping`) and the
session Flows it sends itself to reopen that window.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..amqp.constants import UINT_MAX
from ..amqp.errors import WindowViolationError
from ..amqp.performatives import Flow
from .commands import CLIENT, ROUTER
from .context import Room
from .numbering import flow_fields, flow_to_client, flow_to_router, note_router_flow
from .records import SessionRecord
from .wire import frame

if TYPE_CHECKING:
    from .proxylinks import ProxyLinks
    from .shaping import Shaping


class SessionFlows(Room):
    """The Flow handlers and the window of :class:`.sessions.Sessions` (a base class: the state
    it reads is the sessions', set up by their ``__init__``, and it looks client sessions up
    with their :meth:`~.sessions.Sessions.session`)."""

    __slots__ = ()

    router_sessions: dict[int, SessionRecord]
    window_frames: int | None
    window_pending: set[SessionRecord]
    shaping: Shaping | None
    proxy: ProxyLinks

    if TYPE_CHECKING:  # Sessions' own method

        def session(self, channel: int, what: str) -> SessionRecord | None: ...

    def on_client_flow(self, perf: Flow, raw: bytes, channel: int, now: float) -> None:
        """A client Flow (Part 2 §2.7.4) that needs a look: one for a denied handle is consumed;
        its next-outgoing-id is renumbered past the Transfer frames the router never got, and
        a sender link's delivery-count past the deliveries it never got."""
        session = self.session(channel, "flow")
        if session is None:
            return
        changes: dict[str, Any] = {}
        if perf.handle is not None:
            handle = int(perf.handle)
            if handle in session.denied_handles:
                return
            if session.proxy_links is not None and handle in session.proxy_links:
                self.proxy.flow(session, session.proxy_links[handle], perf)
                return
            if handle in session.revoked_handles:
                # the router has this link detached: only the session's part goes on
                perf = dataclasses.replace(perf, handle=None, delivery_count=None,
                                           link_credit=None, available=None, drain=None,
                                           echo=None)
                raw = frame(channel, perf)
                handle = -1
            link = session.links.get(handle)
            if link is not None and link.withheld and link.is_sender and link.shaper is None:
                changes = flow_to_router(perf, link.withheld)  # (shaping keeps its own offset)
        if session.dropped_transfers and perf.next_outgoing_id is not None:
            nxt = (int(perf.next_outgoing_id) - session.dropped_transfers) & UINT_MAX
            changes["next_outgoing_id"] = nxt
        if session.inserted_transfers and perf.next_incoming_id is not None:
            changes["next_incoming_id"] = (
                int(perf.next_incoming_id) - session.inserted_transfers) & UINT_MAX
        if session.shaping is not None and self.shaping is not None:
            self.shaping.client_flow(session, perf, changes, now)
        if changes:
            raw = frame(channel, dataclasses.replace(perf, **changes))
        self.wire.send(ROUTER, raw)

    def on_router_flow(self, perf: Flow, raw: bytes, channel: int, now: float) -> bytes:
        """The router's Flow: next-incoming-id renumbered past the Transfer frames the router
        never got, a client sender link's delivery-count past the deliveries it never got,
        incoming-window lowered to ``maxSessionWindow``."""
        session = self.router_sessions.get(channel)
        changes: dict[str, Any] = {}
        if session is not None and session.dropped_transfers and perf.next_incoming_id is not None:
            changes["next_incoming_id"] = (
                int(perf.next_incoming_id) + session.dropped_transfers
            ) & UINT_MAX
        if session is not None and session.inserted_transfers and perf.next_outgoing_id is not None:
            changes["next_outgoing_id"] = (
                int(perf.next_outgoing_id) + session.inserted_transfers) & UINT_MAX
        if session is not None and session.numbering is not None and perf.handle is not None:
            link = session.router_links.get(int(perf.handle))
            if link is not None and link.withheld and link.is_sender and link.shaper is None:
                changes.update(flow_to_client(perf, link.withheld, link.initial_count))
        if session is not None and (self.window_frames is not None or session.tracks_router):
            note_router_flow(session, flow_fields(perf))
            if (self.window_frames is not None and perf.incoming_window is not None
                    and perf.next_incoming_id is not None):
                iw = int(perf.incoming_window)
                nid = session.router_window_end - iw  # router numbering, unbounded
                given = min(iw, self.window_frames)
                session.client_window_end = nid + session.dropped_transfers + given
                if iw > self.window_frames:
                    changes["incoming_window"] = given
        if session is not None and session.shaping is not None and self.shaping is not None:
            self.shaping.router_flow(session, perf, changes, now)
        if changes:
            return frame(channel, dataclasses.replace(perf, **changes))
        return raw

    def check_window(self, session: SessionRecord) -> None:
        """Hold the client to the incoming-window the proxy gave it (``maxSessionWindow``),
        after its Transfer frames were counted in ``session.transfers_in``.

        The window is the router's, lowered to ``maxSessionWindow`` frames and reopened by
        :meth:`reopen_window`; before the router's Begin it is 0. Unbounded (no check) when
        the group sets no ``maxSessionWindow``: the router holds the client to its own window.

        Raises:
            WindowViolationError: a Transfer frame past the window (proton's answer,
                ``amqp:session:window-violation``, "incoming session window exceeded").
        """
        left = self.window_left(session)
        if left is not None and left < 0:
            raise WindowViolationError("incoming session window exceeded")

    def window_left(self, session: SessionRecord) -> int | None:
        """Transfer frames the client may still send on ``session`` (None: unbounded)."""
        if self.window_frames is None:
            return None
        end = session.client_window_end
        if session.shaping is not None:
            end = max(end, session.shaping.in_end)
        return end - (session.client_next_out + session.transfers_in)

    def reopen_windows(self) -> None:
        """Reopen the window of every session that sent Transfers in the read just processed.

        Called once per client read, never between the frames of one read: a client can only
        have seen a Flow the proxy sent before it wrote, so frames it pipelined within one
        write are held to the window it had (as proton, which posts its Flows after it has
        processed its input), and a client that ignores the window is stopped at its end.
        """
        pending = self.window_pending
        for session in pending:
            self.reopen_window(session)
        pending.clear()

    def reopen_window(self, session: SessionRecord) -> None:
        """Give the client more of the ``maxSessionWindow`` once it used half of it.

        The proxy lowers the router's incoming-window to ``maxSessionWindow`` frames, but the
        router, whose own window is larger, sees no reason to send a Flow, so without this the
        client would stall after that many Transfer frames. A session Flow (Part 2 §2.5.6)
        carries the router's next-incoming-id in the client's numbering and a new window of up
        to ``maxSessionWindow`` frames, never past the window the router itself gave.
        """
        window = self.window_frames
        if window is None or session.router_channel is None or session.router_ended:
            return
        next_in = session.client_next_out + session.transfers_in
        if (session.client_window_end - next_in) * 2 >= window:
            return  # more than half of the window left
        router_left = session.router_window_end - (next_in - session.dropped_transfers)
        given = max(0, min(window, router_left))
        if next_in + given <= session.client_window_end:
            return
        session.client_window_end = next_in + given
        flow = Flow(
            next_incoming_id=next_in & UINT_MAX,
            incoming_window=given,
            next_outgoing_id=(session.router_next_out + session.transfers_out) & UINT_MAX,
            outgoing_window=session.router_out_window,
        )
        self.wire.send(CLIENT, frame(session.router_channel, flow))
