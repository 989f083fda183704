"""Sans-IO. May the fast path take this frame? One computed answer per link, per session and
for the router side of a connection.

The fast paths (:mod:`.fastpath` for the client's Transfers, :meth:`.router_side.RouterSide.relay`
for the router's) forward frames without a decision, through the C scanners when they are
built. Whether a link, a session or the router side may go that way depends on the per-frame
features attached to it; instead of each loop reading those features' flags, each record
carries one value, recomputed here wherever a feature attaches or detaches:

================================  ===========================================================
value                             inputs (who sets them)
================================  ===========================================================
``LinkRecord.fast``               :data:`LINK_INPUTS`: the role, a client Detach (and a
                                  revocation), credit shaping (``shaper``, at attach), the
                                  per-message checks (``inspect``, ``anonymous``,
                                  ``by_subject``, at attach) and the connection's user-id
                                  check (``MessageRules.scan_user_id``: admission, reload)
``SessionRecord.fast``            :data:`SESSION_INPUTS`: the renumbering a withheld delivery
                                  starts (``numbering``)
``Sessions.router_fast``          :data:`ROUTER_INPUTS`: shaping (admission, close), counting
                                  the router's Transfers (``maxSessionWindow``, sessions that
                                  track the router's flow), renumbering, topic receivers, the
                                  proxy's own deliveries (``inserting``, :mod:`.proxylinks`),
                                  the broker's renewal answers (``reads_replies``)
================================  ===========================================================

What stays a per-frame test in the loops is per-delivery or per-frame state, not a feature:
a delivery being discarded, an aborted or multi-frame Transfer, ``maxMessageSize``, the
session window left (:data:`PER_FRAME_STATE`). ``tests/unit/core/test_eligibility.py`` fails
when a loop reads a flag that is in neither list, or when code sets an input without calling
the refresh here: a new per-frame feature must feed the predicate (docs/architecture.md,
"Where to put a new per-frame feature").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .records import LinkRecord, SessionRecord

__all__ = ["FAST", "FAST_USER_ID", "LINK_INPUTS", "NOT_FAST", "PER_FRAME_STATE",
           "ROUTER_INPUTS", "SESSION_INPUTS", "refresh_link", "refresh_links",
           "refresh_router", "refresh_session"]

class _Rules(Protocol):
    @property
    def scan_user_id(self) -> bytes | None: ...
    @property
    def topic_receivers(self) -> bool: ...


class _Sessions(Protocol):
    """What the refreshes read of :class:`.sessions.Sessions` (and set: ``router_fast``)."""

    router_fast: bool

    @property
    def rules(self) -> _Rules: ...
    @property
    def sessions(self) -> Mapping[int, SessionRecord]: ...
    @property
    def shaping(self) -> object | None: ...
    @property
    def count_router_transfers(self) -> bool: ...
    @property
    def renumbering(self) -> bool: ...
    @property
    def inserting(self) -> bool: ...
    @property
    def reads_replies(self) -> bool: ...


NOT_FAST = 0
"""Every Transfer on the link takes the general handlers."""
FAST = 1
"""Transfers that need no decision may be forwarded as they came (C scanner or Python)."""
FAST_USER_ID = 2
"""Only QDR's user-id check applies per message: the C scanner passes whole deliveries whose
plain head carries the user's user-id; everything else takes the general handlers."""

LINK_INPUTS = frozenset({"is_sender", "client_detached", "shaper", "inspect", "anonymous",
                         "by_subject", "scan_user_id"})
"""The link's (and the connection rules') attributes :func:`refresh_link` reads."""
SESSION_INPUTS = frozenset({"numbering"})
"""The session's attributes :func:`refresh_session` reads."""
ROUTER_INPUTS = frozenset({"shaping", "count_router_transfers", "renumbering",
                           "topic_receivers", "inserting", "reads_replies"})
"""The connection's attributes :func:`refresh_router` reads."""
PER_FRAME_STATE = frozenset({
    # the delivery in progress on a link (the scanner carries it, link.carry)
    "in_delivery", "discarding", "delivery_bytes", "delivery_id", "delivery_settled", "carry",
    # the records' maps and the session window (maxSessionWindow: frames left, per frame)
    "links", "sessions", "router_sessions", "get", "window_frames", "window_pending",
    "window_left", "check_window", "max_message_size",
    # what the router side's Flow and Disposition handlers read once a frame is theirs
    "tracks_router", "dropped_transfers", "inserted", "inserted_transfers",
    # the computed values themselves
    "fast", "router_fast",
})
"""What the fast loops may read besides the inputs above (which they read only to route a
frame the computed value already sent to the general handlers): the delivery in progress, the
records' maps, the session window and ``maxMessageSize`` (they depend on the frame, not on an
attached feature), and the state of the general Flow and Disposition handlers."""


def refresh_link(link: LinkRecord, scan_user_id: bytes | None) -> None:
    """Recompute ``link.fast`` (:data:`NOT_FAST`, :data:`FAST` or :data:`FAST_USER_ID`).

    Args:
        link: after any of :data:`LINK_INPUTS` changed on it.
        scan_user_id: the connection's ``MessageRules.scan_user_id`` (the user-id bytes when
            QDR's user-id check is the only per-message rule, else None).
    """
    if not link.is_sender or link.client_detached or link.shaper is not None:
        link.fast = NOT_FAST
    elif not link.inspect:
        link.fast = FAST
    elif scan_user_id is not None and not link.anonymous and not link.by_subject:
        link.fast = FAST_USER_ID
    else:
        link.fast = NOT_FAST


def refresh_links(sessions: _Sessions) -> None:
    """Recompute every link's value and the router side's (after a reload governs the
    connection's rules again: the user-id check may have changed)."""
    scan_user_id = sessions.rules.scan_user_id
    for session in sessions.sessions.values():
        for link in session.links.values():
            refresh_link(link, scan_user_id)
    refresh_router(sessions)


def refresh_session(session: SessionRecord) -> None:
    """Recompute ``session.fast``: no renumbering of its Transfers (a session that withheld
    a delivery renumbers every Transfer after it: the general handler does)."""
    session.fast = session.numbering is None


def refresh_router(sessions: _Sessions) -> None:
    """Recompute ``sessions.router_fast``: nothing looks at the router's Transfers and
    Dispositions (no shaping, no per-session count of them, no renumbering, no topic
    receiver), so the C walker may pass runs of them."""
    sessions.router_fast = not (sessions.shaping is not None
                                or sessions.count_router_transfers
                                or sessions.renumbering
                                or sessions.inserting
                                or sessions.reads_replies
                                or sessions.rules.topic_receivers)
