"""Sans-IO. Credit shaping: a user's ``maxMessageRatePerUser`` and ``maxByteRatePerUser``
enforced through the link-credit of the user's sending links, so that nothing is dropped,
rejected or closed: a fast sender simply waits for credit.

On a link where the client sends (the router is the receiver), the router grants credit in
its Flows (AMQP 1.0 Part 2 §2.6.7, §2.7.4): the sender may send while its delivery-count is
below the router's *limit* ``delivery-count + link-credit``. The proxy gives the client a lower
limit, at most what the user's buckets (``limits/rates.py``, shared by the user's connections
on this proxy) hold, and raises it with a Flow of its own as the tokens refill (a timer:
:meth:`Shaping.on_timer`). The router's view of the link is unchanged: the proxy holds back
part of what it granted; delivery-count is never rewritten while the two views agree.

All link arithmetic is in the client's delivery-count numbering, as unbounded integers near
the client's count (the wire carries them modulo 2**32, RFC 1982 serial numbers):

- ``sent``: the client's delivery-count (deliveries started, Part 2 §2.6.7), counted here;
- ``limit``: the limit the client was given (its link-credit is ``limit - sent``);
- ``high``: the highest limit ever given; a Transfer or delivery-count beyond it breaks the
  protocol (``amqp:link:transfer-limit-exceeded``, a Close as for any violation);
- ``router_limit``: the router's limit (``limit <= router_limit``);
- ``offset``: the router's delivery-count minus the client's, 0 until a drain.

Drain (§2.6.7): the router's drain flag is relayed; the client uses its credit or advances its
delivery-count to ``limit`` and says so. The held-back credit ``router_limit - limit`` is then
consumed toward the router: the client's Flow (or, when the client has no credit and will not
answer, a Flow of the proxy's on its behalf) carries delivery-count ``router_limit`` in the
router's numbering and link-credit 0, and from then on delivery-counts are translated by
``offset``. Echo is relayed both ways. Flows the client sends carry the router's view of the
credit (``router_limit - sent``).

Tokens are charged when the client sends (:meth:`~UserBucket.used`), a message at a time and
payload byte by byte; the byte bucket may go into debt (a message larger than what is left is
let through; no credit is given until the debt is paid). A link is granted at most what the
buckets hold minus the credit it still has, so one link never exceeds the rate; each of the
user's other links can add the credit it holds to a burst (at most a tenth of a second's worth
each), and the debt that follows keeps the long-run rate.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..amqp.constants import UINT_MAX
from ..amqp.errors import TransferLimitError
from ..amqp.performatives import Attach, Begin, Flow
from .commands import CLIENT, ROUTER
from .context import Context, Room
from .records import LinkRecord, SessionRecord
from .wire import frame

logger = logging.getLogger(__name__)

_SERIAL = 1 << 32
_HALF = 1 << 31
#: A timer that fires this early (seconds) counts as due: event loops round timers to 1 ms.
TIMER_SLACK = 0.001


def near(wire: int, ref: int) -> int:
    """The integer congruent to ``wire`` modulo 2**32 nearest to ``ref`` (serial numbers)."""
    d = (wire - ref) & UINT_MAX
    return ref + (d - _SERIAL if d >= _HALF else d)


class UserBucket(Protocol):
    """One user's message and byte buckets (``limits.rates.UserRate``)."""

    def cap(self) -> int:
        """The most credit one link may hold."""

    def chunk(self) -> int:
        """The fewest credits worth a top-up Flow to a link that still has credit."""

    def credit(self, held: int, now: float) -> int:
        """Credits a link holding ``held`` may be granted at ``now``."""

    def wait(self, need: int, now: float) -> float:
        """Seconds until :meth:`credit` for a link holding nothing reaches ``need``."""

    def used(self, messages: int, nbytes: int, now: float) -> None:
        """Charge ``messages`` (0 or 1) and ``nbytes`` of payload the client sent."""

    def sized(self, nbytes: int) -> None:
        """A whole message of ``nbytes`` payload was sent (the mean message size)."""

    def throttled(self, on: bool, now: float) -> None:
        """A link starts or stops waiting for tokens with no credit left."""

    def set_rates(self, message_rate: float | None, byte_rate: float | None) -> None:
        """The group's messages and bytes per second (None or 0: unlimited), as a reload
        changes them."""


class ShapingBuckets(Protocol):
    """What the core needs of the shared shaping buckets (``limits.rates.RateLimits``)."""

    def acquire(self, *, vhost: str, group: str, user: str, message_rate: int | None,
                byte_rate: int | None, now: float) -> UserBucket:
        """The user's buckets, shared with the user's other connections."""

    def release(self, bucket: Any, now: float) -> None:
        """One connection of the bucket's user is gone."""


class ShapedSession:
    """What shaping remembers of a session to write Flows of its own (Part 2 §2.5.6)."""

    __slots__ = ("in_end", "out_window", "client_nid", "client_iw", "client_ow")

    def __init__(self, begin: Begin) -> None:
        """From the client's Begin."""
        self.in_end = 0
        """The end of the router's incoming window as the client was told (client ids)."""
        self.out_window = 0
        """The router's last outgoing-window."""
        self.client_nid: int | None = None
        """The client's last next-incoming-id (None: not sent yet, the router's Begin's)."""
        self.client_iw = 0 if begin.incoming_window is None else int(begin.incoming_window)
        self.client_ow = 0 if begin.outgoing_window is None else int(begin.outgoing_window)


class ShapedLink:
    """The credit state of one shaped sending link (client numbering, see the module)."""

    __slots__ = ("shaping", "session", "link", "sent", "limit", "high", "router_limit",
                 "offset", "drain", "size", "waiting", "throttled", "until")

    def __init__(self, shaping: Shaping, session: SessionRecord, link: LinkRecord,
                 initial: int) -> None:
        """A link attached with ``initial-delivery-count`` ``initial``: no credit yet."""
        self.shaping = shaping
        self.session = session
        self.link = link
        self.sent = self.limit = self.high = initial
        self.router_limit: int | None = None
        self.offset = 0
        self.drain = False
        self.size = 0
        """Payload bytes of the delivery under way."""
        self.waiting = False
        self.throttled = False
        self.until = 0.0

    def transfer(self, first: bool, nbytes: int, now: float) -> None:
        """A client Transfer on this link (``first``: it starts a delivery) with ``nbytes``
        of payload: see :meth:`Shaping.transfer`."""
        self.shaping.transfer(self, first, nbytes, now)

    def gone(self) -> bool:
        """Either side detached the link or ended its session."""
        link, session = self.link, self.session
        return (link.client_detached or link.router_detached or session.client_ended
                or session.router_ended)


class Shaping(Room):
    """The shaped links of one connection, drawing on its user's buckets."""

    __slots__ = ("buckets", "bucket", "links", "waiting")

    def __init__(self, ctx: Context, buckets: ShapingBuckets, bucket: UserBucket) -> None:
        """Shape the connection ``ctx`` with ``bucket`` (from ``buckets.acquire``)."""
        Room.__init__(self, ctx)
        self.buckets = buckets
        self.bucket = bucket
        self.links: list[ShapedLink] = []
        self.waiting: list[ShapedLink] = []
        """Links waiting for tokens, in the order they started waiting."""

    # ------------------------------------------------------------------ hooks

    def session(self, begin: Begin) -> ShapedSession:
        """A client Begin on this shaped connection."""
        return ShapedSession(begin)

    def attach(self, session: SessionRecord, link: LinkRecord, attach: Attach) -> ShapedLink:
        """A client sender link forwarded to the router: shaped from now on."""
        self.links = [s for s in self.links if not s.gone()]
        initial = attach.initial_delivery_count
        shaped = ShapedLink(self, session, link, 0 if initial is None else int(initial))
        self.links.append(shaped)
        return shaped

    def router_flow(self, session: SessionRecord, perf: Flow, changes: dict[str, Any],
                    now: float) -> None:
        """A router Flow on a shaped session (``changes``: what the proxy already rewrites).

        Records the router's session window as the client sees it; for a shaped link, lowers
        the link-credit to what the user's buckets allow (translating delivery-count after a
        drain), and answers a drain at once for a client that has no credit left.
        """
        ss = session.shaping
        nid = changes.get("next_incoming_id", perf.next_incoming_id)
        iw = changes.get("incoming_window", perf.incoming_window)
        if nid is not None and iw is not None:
            ss.in_end = near(int(nid), session.client_next_out + session.transfers_in) + int(iw)
        if perf.outgoing_window is not None:
            ss.out_window = int(perf.outgoing_window)
        s = _shaped_link(session.router_links, perf)
        if s is None:
            return
        credit = 0 if perf.link_credit is None else int(perf.link_credit)
        if perf.delivery_count is None:  # the router saw no Attach yet (§2.7.4)
            dc = s.sent
        else:
            dc = near((int(perf.delivery_count) - s.offset) & UINT_MAX, s.sent)
        s.router_limit = dc + credit
        if s.router_limit < s.limit:  # the router lowered its credit
            s.limit = max(s.sent, s.router_limit)
        s.drain = False
        self._top_up(s, now, send=False)  # "use it or lose it": a drain may get credit too
        s.drain = bool(perf.drain)
        if s.drain:
            self._wait(s, False, now)  # no more credit until the router grants again
        given = max(0, s.limit - dc)
        if given != credit:
            changes["link_credit"] = given
        if s.offset:
            changes["delivery_count"] = dc & UINT_MAX
        if s.drain and s.limit == s.sent and s.router_limit > s.limit:
            self._drain_done(s, None)  # the client has no credit: it will not answer

    def client_flow(self, session: SessionRecord, perf: Flow, changes: dict[str, Any],
                    now: float) -> None:
        """A client Flow on a shaped session: its session window is recorded; on a shaped
        link its delivery-count is taken (credit the client drained costs no token), the
        router's drain is completed when the client has used or drained its credit, and the
        router gets its own view of the credit.

        Raises:
            TransferLimitError: a delivery-count beyond the credit the client was given.
        """
        ss = session.shaping
        if perf.next_incoming_id is not None:
            ss.client_nid = int(perf.next_incoming_id)
        if perf.incoming_window is not None:
            ss.client_iw = int(perf.incoming_window)
        if perf.outgoing_window is not None:
            ss.client_ow = int(perf.outgoing_window)
        s = _shaped_link(session.links, perf)
        if s is None:
            return
        if perf.delivery_count is not None:
            dc = near(int(perf.delivery_count), s.sent)
            if dc > s.high:
                raise TransferLimitError(
                    f"delivery-count {dc & UINT_MAX} beyond the link-credit granted")
            s.sent = max(s.sent, dc)
        if s.router_limit is None:
            return
        if s.drain and s.sent >= s.limit and s.router_limit > s.limit:
            self._drain_done(s, changes)
            return
        credit = max(0, s.router_limit - s.sent)
        if perf.link_credit is None or int(perf.link_credit) != credit:
            changes["link_credit"] = credit
        if s.offset:
            changes["delivery_count"] = (s.sent + s.offset) & UINT_MAX

    def transfer(self, s: ShapedLink, first: bool, nbytes: int, now: float) -> None:
        """A client Transfer on the shaped link ``s``: charged to the user's buckets, then
        more credit if the link used half of what it holds (or the drain completed).

        Raises:
            TransferLimitError: a delivery beyond the credit the client was given.
        """
        bucket = self.bucket
        if first:
            if s.sent >= s.high:
                raise TransferLimitError("transfer beyond the link-credit granted")
            s.sent += 1
            if s.size:
                bucket.sized(s.size)
            s.size = 0
        s.size += nbytes
        bucket.used(1 if first else 0, nbytes, now)
        if not first or s.router_limit is None:
            return
        if s.drain:
            if s.sent >= s.limit and s.router_limit > s.limit:
                # answered right after this Transfer (which is not written yet): at once
                s.until = now
                self._wait(s, True, now, throttled=False)
            return
        self._top_up(s, now, send=True)

    def withheld(self, s: ShapedLink, now: float) -> None:
        """The delivery the client just started on ``s`` never reaches the router (refused
        by policy, docs/decisions/0002): from now on the router's delivery-count is one
        behind the client's (``offset``), so the router's limit in the client's numbering
        is one higher, and the credit the client spent on it comes back as the tokens allow
        (the proxy's own top-up, as for any delivery)."""
        s.offset = (s.offset - 1) & UINT_MAX
        if s.router_limit is not None:
            s.router_limit += 1
            self._top_up(s, now, send=True)

    # ------------------------------------------------------------------ the timer

    def on_timer(self, now: float) -> None:
        """The earliest wait is over: grant the waiting links what the tokens allow, in the
        order they started waiting (a link served goes to the back if it waits again)."""
        self.ctx.rate_deadline = None
        given = 0  # what this round granted is not charged yet: the next link sees less
        for s in list(self.waiting):
            if s.gone():
                self._wait(s, False, now)
            elif s.until <= now + TIMER_SLACK:
                given += self._top_up(s, now, send=True, due=True, given=given)
        self._arm()

    def close(self, now: float) -> None:
        """The connection is over: stop every wait and let the user's buckets go."""
        for s in list(self.waiting):
            self._wait(s, False, now)
        self.links.clear()
        self.ctx.rate_deadline = None
        self.buckets.release(self.bucket, now)

    # ------------------------------------------------------------------ internals

    def _top_up(self, s: ShapedLink, now: float, *, send: bool, due: bool = False,
                given: int = 0) -> int:
        """Raise the client's limit on ``s`` if the link used half its credit and the router
        and the tokens (less ``given`` just granted elsewhere) allow, with a Flow to the
        client when ``send``; else wait for tokens. Returns the credit granted."""
        if s.router_limit is None or s.drain or s.gone():
            if (send and s.drain and s.sent >= s.limit and s.router_limit is not None
                    and s.router_limit > s.limit):  # (a drain comes with the router's limit)
                self._drain_done(s, None)
            self._wait(s, False, now)
            return 0
        room = s.router_limit - s.limit
        held = s.limit - s.sent
        bucket = self.bucket
        cap = bucket.cap()
        if room <= 0 or held * 2 > cap:
            self._wait(s, False, now)  # the router's credit is the limit, or plenty is left
            return 0
        want = min(room, cap - held)
        n = min(want, bucket.credit(held + given, now))
        need = 1 if due else min(want, bucket.chunk())
        if n < need:
            wait = bucket.wait(held + given + min(want, bucket.chunk()), now)
            s.until = now + max(TIMER_SLACK, wait)
            self._wait(s, True, now)
            return 0
        s.limit += n
        if s.limit > s.high:
            s.high = s.limit
        self._wait(s, False, now)
        if send:
            self._send_credit(s)
        return n

    def _wait(self, s: ShapedLink, on: bool, now: float, *, throttled: bool = True) -> None:
        """``s`` starts (``on``) or stops waiting for tokens (or for the timer, not
        ``throttled``); the user is throttled while a link waits with no credit left."""
        throttled = throttled and on and s.limit == s.sent
        if throttled != s.throttled:
            s.throttled = throttled
            self.bucket.throttled(throttled, now)
        if on:
            if not s.waiting:
                s.waiting = True
                self.waiting.append(s)
            self._arm()
        elif s.waiting:
            s.waiting = False
            self.waiting.remove(s)
            self._arm()

    def _arm(self) -> None:
        """The connection's shaping deadline: the earliest wait's end."""
        self.ctx.rate_deadline = min((s.until for s in self.waiting), default=None)

    def _send_credit(self, s: ShapedLink) -> None:
        """A Flow of the proxy's to the client, in the router's name: the router's session
        state as the client knows it and the link's new credit (Part 2 §2.7.4)."""
        session = s.session
        ss = session.shaping
        channel = session.router_channel
        assert channel is not None, "a shaped link's session has begun on the router"
        next_in = session.client_next_out + session.transfers_in
        end = max(ss.in_end, session.client_window_end)
        flow = Flow(
            next_incoming_id=next_in & UINT_MAX,
            incoming_window=min(UINT_MAX, max(0, end - next_in)),
            next_outgoing_id=(session.router_next_out + session.transfers_out) & UINT_MAX,
            outgoing_window=ss.out_window,
            handle=s.link.router_handle,
            delivery_count=s.sent & UINT_MAX,
            link_credit=s.limit - s.sent,
        )
        self.wire.send(CLIENT, frame(channel, flow))

    def _drain_done(self, s: ShapedLink, changes: dict[str, Any] | None) -> None:
        """The client has no credit left during the router's drain: the credit the proxy
        held back is consumed toward the router (its delivery-count advances to its limit,
        link-credit 0), in ``changes`` to the client's Flow, else in a Flow of the proxy's."""
        assert s.router_limit is not None
        s.offset = (s.offset + s.router_limit - s.limit) & UINT_MAX
        s.router_limit = s.limit
        s.drain = False
        dc = (s.limit + s.offset) & UINT_MAX
        if changes is not None:
            changes.update(delivery_count=dc, link_credit=0, drain=True)
            return
        session = s.session
        ss = session.shaping
        nid = session.router_next_out if ss.client_nid is None else ss.client_nid
        next_out = session.client_next_out + session.transfers_in - session.dropped_transfers
        flow = Flow(
            next_incoming_id=nid & UINT_MAX,
            incoming_window=ss.client_iw,
            next_outgoing_id=next_out & UINT_MAX,
            outgoing_window=ss.client_ow,
            handle=s.link.handle,
            delivery_count=dc,
            link_credit=0,
            drain=True,
        )
        self.wire.send(ROUTER, frame(session.channel, flow))


def _shaped_link(links: dict[int, LinkRecord], perf: Flow) -> ShapedLink | None:
    """The shaped link a Flow names (``links``: the session's links by the sender's handle
    numbering), or None for a session-only Flow or a link that is not shaped."""
    if perf.handle is None:
        return None
    link = links.get(int(perf.handle))
    return None if link is None else link.shaper
