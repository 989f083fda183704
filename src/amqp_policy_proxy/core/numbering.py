"""Sans-IO. The delivery-ids of a session whose client deliveries the proxy withheld.

A delivery the policy refuses (``user-id``, relay ``to``, router annotations, topic publish,
``maxMessageSize`` on its first frame) never reaches the router, not even as an aborted
Transfer (decision 0002: RabbitMQ 3.x ends the session on one). The client numbered it, the
router never saw it, so from then on the two ends number the client's deliveries differently
(Part 2 §2.6.12: delivery-ids are assigned in order by the sender, RFC 1982 serial numbers
modulo 2**32). :class:`DeliveryNumbering` keeps that difference for one session and maps
every number that crosses the proxy in the client-to-router direction of deliveries:

- the ``delivery-id`` of each client Transfer forwarded after a withheld delivery (first and
  continuation frames): client id minus the deliveries withheld before it;
- a router Disposition with ``role=receiver`` (its outcome for deliveries the client sent):
  router ids to client ids, the range split wherever it spans a withheld delivery;
- a client Disposition with ``role=sender`` (the client settling its own deliveries): client
  ids to router ids, withheld ids trimmed out of the range.

Dispositions about deliveries the *router* sent (client ``role=receiver``, router
``role=sender``) are in the other direction's numbering, which the proxy never changes.

The map is a list of *eras*: between two withheld runs the difference is constant. Era 0
(before the first withheld delivery) maps ids to themselves; every later era remembers the
deliveries still *live* in it (forwarded, and settled by neither end): once an era has no
live delivery and a newer era exists it is forgotten, and a disposition still naming one of
its ids is dropped (an end that settled a delivery ignores news of it, and no longer sends
any). So the map holds at most one era per live delivery, plus two.

Link credit (Part 2 §2.6.7) counts deliveries per link the same way: :func:`flow_to_client`
and :func:`flow_to_router` add or subtract the deliveries withheld on the link
(:attr:`~.records.LinkRecord.withheld`) to the ``delivery-count`` of Flows for client sender
links, so that the link-credit each end computes is the one the other end meant; and
:func:`credit_back` gives the client back, after each withheld delivery, the unit of credit
it spent on it, from the router's flow state the proxy keeps (:func:`note_router_flow`) on
sessions where deliveries may be withheld.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..amqp.errors import AmqpError, InvalidFieldError, ResourceLimitError
from ..amqp.performatives import Disposition, Flow, decode_performative
from ..amqp.transfer import read_flow_fields
from .records import LinkRecord, SessionRecord
from .wire import frame

SERIAL = 1 << 32
MASK = SERIAL - 1
HALF = 1 << 31


def near(value: int, ref: int) -> int:
    """The unbounded serial number whose wire value (mod 2**32) is ``value``, the nearest to
    the unbounded ``ref`` (RFC 1982: within 2**31 before or after it)."""
    d = (value - ref) & MASK
    return ref + d if d < HALF else ref + d - SERIAL


class Era:
    """Client delivery-ids ``start .. end - 1`` (unbounded; ``end`` None: still open) whose
    router id is the client id minus ``shift``."""

    __slots__ = ("start", "end", "shift", "live")

    def __init__(self, start: int, end: int | None, shift: int, live: int) -> None:
        """An era; ``live`` -1 means its deliveries are not tracked (era 0)."""
        self.start = start
        self.end = end
        self.shift = shift
        self.live = live


class DeliveryNumbering:
    """The map between the client's and the router's delivery-ids of one session, created at
    its first withheld delivery (all ids are unbounded ints internally, wire values outside).
    """

    __slots__ = ("eras", "next", "live")

    def __init__(self, withheld: int) -> None:
        """Start with the client's delivery-id ``withheld`` (wire value) withheld."""
        self.eras = [Era(withheld - HALF, withheld, 0, -1), Era(withheld + 1, None, 1, 0)]
        self.next = withheld + 1
        """The next client delivery-id expected (unbounded)."""
        self.live: dict[int, tuple[Era, int]] = {}
        """Client id -> (its era, the client's link handle) of forwarded deliveries that are
        unsettled or not yet complete (eras after era 0 only)."""

    @property
    def shift(self) -> int:
        """How many deliveries the router has not seen of those the client sent so far."""
        return self.eras[-1].shift

    # ------------------------------------------------------------------ client Transfers

    def withhold(self, delivery_id: int | None) -> None:
        """The delivery starting with this client first frame is withheld (never forwarded);
        ``delivery_id`` None is the implicit next one.

        Raises:
            InvalidFieldError: ``delivery_id`` is not the session's next one.
        """
        u = self._take_next(delivery_id)
        cur = self.eras[-1]
        if u == cur.start:  # nothing forwarded since the last withheld delivery
            cur.start = u + 1
            cur.shift += 1
        else:
            cur.end = u
            self.eras.append(Era(u + 1, None, cur.shift + 1, 0))
            if cur.live == 0:
                self.eras.remove(cur)
        self._expire()

    def forward_first(self, delivery_id: int | None, handle: int, complete: bool) -> int | None:
        """The router's delivery-id (wire value) for a forwarded first frame, None to leave the
        field as it is (absent: the implicit next id is right on both sides; or an id the map
        does not know). ``complete``: the delivery ends settled in this frame (nothing will
        name it again).

        Raises:
            InvalidFieldError: ``delivery_id`` is not the session's next one.
        """
        u = self._take_next(delivery_id)
        era = self._era(u)
        if era is None:
            return None
        if era.live >= 0 and not complete and u not in self.live:
            self.live[u] = (era, handle)
            era.live += 1
        return None if delivery_id is None else (u - era.shift) & MASK

    def _take_next(self, delivery_id: int | None) -> int:
        """The session's next client delivery-id (unbounded), taken by a first frame whose
        ``delivery-id`` (wire value; None: implicit) must be it.

        Raises:
            InvalidFieldError: ``delivery_id`` is not the session's next one.
        """
        nxt = self.next
        if delivery_id is not None and delivery_id != nxt & MASK:
            raise _sequencing_error(nxt, delivery_id)
        self.next = nxt + 1
        return nxt

    def forward_more(self, delivery_id: int) -> int | None:
        """The router's id for the delivery-id a continuation frame repeats (None: unknown)."""
        u = near(delivery_id, self.next)
        era = self._era(u)
        return None if era is None else (u - era.shift) & MASK

    def delivery_done(self, delivery_id: int | None, settled: bool) -> None:
        """The last frame of a forwarded multi-frame delivery went out; ``settled`` (on any of
        its frames, or aborted) ends its life."""
        if settled and delivery_id is not None:
            self._settle(near(delivery_id, self.next))

    # ------------------------------------------------------------------ dispositions

    def router_to_client(self, first: int, last: int | None) -> list[tuple[int, int]]:
        """Router ids ``first..last`` (wire, a router ``role=receiver`` Disposition) as client
        id ranges, unbounded, in order; ids of forgotten eras and ids not yet sent are left
        out."""
        r_next = self.next - self.shift
        uf = near(first, r_next)
        ul = uf + (((first if last is None else last) - first) & MASK)
        out = []
        for era in self.eras:
            shift = era.shift
            end = self.next if era.end is None else era.end
            a = max(uf, era.start - shift)
            b = min(ul, end - 1 - shift)
            if a <= b:
                out.append((a + shift, b + shift))
        return out

    def client_to_router(self, first: int, last: int | None) -> list[tuple[int, int, int]]:
        """Client ids ``first..last`` (wire, a client ``role=sender`` Disposition) split by
        era: ``(a, b, shift)`` unbounded client ranges, in order, whose router ids are
        ``a - shift .. b - shift``; withheld ids and forgotten eras are left out."""
        uf = near(first, self.next)
        ul = uf + (((first if last is None else last) - first) & MASK)
        out = []
        for era in self.eras:
            end = self.next if era.end is None else era.end
            a = max(uf, era.start)
            b = min(ul, end - 1)
            if a <= b:
                out.append((a, b, era.shift))
        return out

    def settle_range(self, a: int, b: int) -> None:
        """Client ids ``a..b`` (unbounded) were settled by one end: no longer live."""
        live = self.live
        if not live:
            return
        if b - a + 1 <= len(live):
            for u in range(a, b + 1):
                if u in live:
                    self._settle(u)
        else:
            for u in [u for u in live if a <= u <= b]:
                self._settle(u)

    def forget_handle(self, handle: int) -> None:
        """The client's link ``handle`` is detached on both sides: its deliveries are gone."""
        for u in [u for u, (_, h) in self.live.items() if h == handle]:
            self._settle(u)

    # ------------------------------------------------------------------ internals

    def _era(self, u: int) -> Era | None:
        """The era (a run of client ids renumbered by one offset) the unbounded client id
        ``u`` belongs to, or None when no era names it."""
        for era in reversed(self.eras):
            if era.start <= u and (era.end is None or u < era.end):
                return era
        return None

    def _settle(self, u: int) -> None:
        """The delivery of unbounded client id ``u`` is settled: forget it, and its era once
        no live delivery is left in it (the current era is kept)."""
        entry = self.live.pop(u, None)
        if entry is None:
            return
        era = entry[0]
        era.live -= 1
        if era.live == 0 and era is not self.eras[-1] and era in self.eras:
            self.eras.remove(era)

    def _expire(self) -> None:
        """Forget eras that serial numbers can no longer name (2**31 ids behind)."""
        horizon = self.next - HALF
        eras = self.eras
        while len(eras) > 1 and eras[0].end is not None and eras[0].end <= horizon:
            gone = eras.pop(0)
            for u in [u for u, (era, _) in self.live.items() if era is gone]:
                del self.live[u]


# ---------------------------------------------------------------------- frames


def _sequencing_error(expected: int, got: int | None) -> InvalidFieldError:
    """A first frame whose delivery-id is not the session's next one (Part 2 §2.7.5: the
    sender numbers its deliveries in order). Once the proxy renumbers a session the router
    cannot see the client's own numbering, so the proxy refuses it as proton does
    (``sequencing error, expected delivery-id E, got G``) instead of guessing."""
    return InvalidFieldError(f"sequencing error, expected delivery-id {expected & MASK}, "
                             f"got {got}")


def _range(perf: Disposition, a: int, b: int) -> Disposition:
    """``perf`` for the delivery-ids ``a`` .. ``b`` (unbounded; sent modulo 2**32, ``last``
    omitted for a single id: Part 2 §2.7.6)."""
    a &= MASK
    b &= MASK
    return dataclasses.replace(perf, first=a, last=None if a == b else b)


def disposition_to_client(numbering: DeliveryNumbering, perf: Disposition, raw: bytes,
                          channel: int) -> bytes:
    """The router's Disposition ``perf`` (``raw`` its bytes, on ``channel``) as the client must
    read it: unchanged unless it is the router's outcome for client deliveries
    (``role=receiver``); then one Disposition per client id range (none when every id was
    withheld or forgotten). A settling one ends the life of those deliveries."""
    if not perf.role or perf.first is None:
        return raw
    ranges = numbering.router_to_client(int(perf.first), _int(perf.last))
    if perf.settled:
        for a, b in ranges:
            numbering.settle_range(a, b)
    if len(ranges) == 1 and ranges[0][0] & MASK == int(perf.first) and (
            ranges[0][1] & MASK) == int(perf.first if perf.last is None else perf.last):
        return raw
    return b"".join(frame(channel, _range(perf, a, b)) for a, b in ranges)


def disposition_to_router(numbering: DeliveryNumbering, perf: Disposition, raw: bytes,
                          channel: int) -> bytes:
    """The client's Disposition ``perf`` as the router must read it: unchanged unless the
    client settles or updates its own deliveries (``role=sender``); then one per router id
    range, withheld ids left out (empty: nothing to send)."""
    if perf.role or perf.first is None:
        return raw
    parts = numbering.client_to_router(int(perf.first), _int(perf.last))
    if perf.settled:
        for a, b, _ in parts:
            numbering.settle_range(a, b)
    if len(parts) == 1 and parts[0][2] == 0 and parts[0][0] & MASK == int(perf.first) and (
            parts[0][1] & MASK) == int(perf.first if perf.last is None else perf.last):
        return raw
    return b"".join(frame(channel, _range(perf, a - s, b - s)) for a, b, s in parts)


def flow_to_client(perf: Flow, withheld: int, initial: int = 0) -> dict[str, Any]:
    """The change a router Flow for a client sender link needs: its ``delivery-count`` (the
    router's count of the link's deliveries) plus the ``withheld`` ones the client counted.
    A Flow without one (the router had not read the sender's Attach yet: its count is the
    sender's ``initial`` one, Part 2 §2.6.7) gets it."""
    if not withheld:
        return {}
    count = initial if perf.delivery_count is None else int(perf.delivery_count)
    return {"delivery_count": (count + withheld) & MASK}


def flow_to_router(perf: Flow, withheld: int) -> dict[str, Any]:
    """The change a client Flow for its sender link needs: ``delivery-count`` minus the
    ``withheld`` deliveries the router never counted."""
    if not withheld or perf.delivery_count is None:
        return {}
    return {"delivery_count": (int(perf.delivery_count) - withheld) & MASK}


def _int(value: Any) -> int | None:
    """A decoded AMQP uint field as an ``int``, None when absent or null."""
    return None if value is None else int(value)


# ---------------------------------------------------------------------- link credit

FlowFields = tuple[int | None, int | None, int | None, int | None, int | None, int | None,
                   int | None, bool]
"""``(next-incoming-id, incoming-window, next-outgoing-id, outgoing-window, handle,
delivery-count, link-credit, drain)`` of a Flow (:func:`~..amqp.transfer.read_flow_fields`)."""


def note_router_flow(session: SessionRecord, fields: FlowFields) -> None:
    """Keep the router's flow state from one of its Flows on ``session``: its next-outgoing-id
    (its Transfers are counted from there on), its incoming window (the first transfer-id,
    router numbering, it does not cover), its outgoing window, and for a client sender link
    its delivery-count and link-credit (a count it left out is the sender's initial one)."""
    nin, iw, nout, ow, handle, count, credit, drain = fields
    if nout is not None:
        # every router Transfer before this Flow is counted: anchor the count on its id
        session.router_next_out = nout - session.transfers_out
    if ow is not None:
        session.router_out_window = ow
    if iw is not None:
        sent = session.client_next_out + session.transfers_in - session.dropped_transfers
        nid = session.client_next_out if nin is None else near(nin, sent)
        session.router_window_end = nid + iw
    if handle is not None and credit is not None:
        link = session.router_links.get(handle)
        if link is not None and link.is_sender:
            link.router_flow = (link.initial_count if count is None else count, credit, drain)


def note_router_flow_bytes(session: SessionRecord, buf: Any, body: int, fend: int) -> None:
    """:func:`note_router_flow` from a router Flow's bytes (its performative at
    ``buf[body:fend]``), read without decoding it; one the fast reader cannot read goes
    through the codec, one nothing can read is left unrecorded (the router's frames are
    relayed as they are, not judged)."""
    try:
        fields = read_flow_fields(buf, body, fend)
    except AmqpError:
        try:
            perf, _ = decode_performative(memoryview(buf)[body:fend])
        except AmqpError:
            return
        if not isinstance(perf, Flow):
            return
        fields = flow_fields(perf)
    note_router_flow(session, fields)


def flow_fields(perf: Flow) -> FlowFields:
    """The :data:`FlowFields` of a decoded Flow."""
    return (_int(perf.next_incoming_id), _int(perf.incoming_window), _int(perf.next_outgoing_id),
            _int(perf.outgoing_window), _int(perf.handle), _int(perf.delivery_count),
            _int(perf.link_credit), bool(perf.drain))


def credit_back(session: SessionRecord, link: LinkRecord, window_frames: int | None
                ) -> Flow | None:
    """The Flow that gives the client back the credit a withheld delivery used on ``link``.

    The client spent one unit of link-credit on it; the router, which never saw it, still
    counts that unit as unused and, if it grants more only when its own count runs low (a
    window it tops up: RabbitMQ 4, ActiveMQ Artemis, the demo broker), never will: a client
    whose credit went on refused deliveries would wait forever. So the proxy sends, as the
    router would have after receiving and refusing the delivery, the router's own latest link
    state in the client's numbering (its delivery-count plus the withheld deliveries, its
    link-credit), with the session state the router stands at now: every Transfer the client
    sent counted as received (the dropped ones too, in the client's numbering), the window
    the router gave (or the one ``maxSessionWindow`` lets the client have), the router's
    next-outgoing-id: its latest Flow's, plus its Transfers since (Part 2 §2.5.6).

    Returns:
        None when the router's state is not known (the session did not keep it, or the router
        never granted this link credit yet) or the link or session is ending.
    """
    state = link.router_flow
    if (state is None or not session.tracks_router or session.router_channel is None
            or link.router_handle is None or link.router_detached or session.router_ended
            or session.client_ended):
        return None
    count, credit, drain = state
    next_in = session.client_next_out + session.transfers_in
    if window_frames is not None:
        end = session.client_window_end
    else:
        end = session.router_window_end + session.dropped_transfers
    return Flow(
        next_incoming_id=next_in & MASK,
        incoming_window=min(max(0, end - next_in), MASK),
        next_outgoing_id=(session.router_next_out + session.transfers_out) & MASK,
        outgoing_window=session.router_out_window,
        handle=link.router_handle,
        delivery_count=(count + link.withheld) & MASK,
        link_credit=credit,
        drain=drain or None,
    )


# ---------------------------------------------------------------------- the proxy's own deliveries

#: The most runs of the router's deliveries between two of the proxy's replies a session
#: keeps (each renewal reply after router deliveries starts one): more and the connection is
#: closed (``amqp:resource-limit-exceeded``).
MAX_INSERTED_ERAS = 1024


class InsertedNumbering:
    """The router-to-client delivery-ids of a session on which the proxy sends deliveries of
    its own (the replies on a link it answers itself, :mod:`.proxylinks`).

    The mirror of :class:`DeliveryNumbering`: there the client numbered deliveries the router
    never saw; here the client receives deliveries (the proxy's) the router never sent, and
    proton checks that the ids it receives are consecutive (``sequencing error``). So from the
    proxy's first delivery on, each router delivery is given to the client with its id plus
    the proxy's deliveries before it, its continuation frames likewise, and the Dispositions
    about router deliveries are mapped both ways (the client's ``role=receiver`` ones to the
    router's ids, the proxy's own ids left out; the router's ``role=sender`` ones to the
    client's).

    The map is a list of eras ``[router_from, offset]``: router ids from ``router_from`` on
    (until the next era) are client ids ``id + offset``; the proxy's ids are the gaps between
    eras. ``router_from`` None: from the start; ``offset`` None: not known yet (no router
    delivery seen since the proxy's last one: the next fixes it). Ids are unbounded ints
    inside, wire values (mod 2**32) outside.
    """

    __slots__ = ("eras", "client_next", "router_next", "mine", "open", "plain_below")

    def __init__(self) -> None:
        """Nothing sent yet by the proxy: ids pass as they are."""
        self.eras: list[list[int | None]] = []
        self.client_next: int | None = None
        """The next delivery-id the client expects (unbounded), None before any."""
        self.router_next: int | None = None
        """The router's next delivery-id (unbounded), None before any was seen."""
        self.mine: list[int] = []
        """The proxy's latest delivery-ids (client numbering; the last 64)."""
        self.open: dict[int, int] = {}
        """Router handle -> unbounded router id of its multi-frame delivery under way."""
        self.plain_below: int | None = None
        """Router ids below this one (the router's next at the proxy's first delivery) went to
        the client unchanged; None: the router had sent none by then."""

    def insert(self) -> int:
        """A delivery-id for a delivery of the proxy's (wire value): the client's next one.

        Raises:
            ResourceLimitError: more than :data:`MAX_INSERTED_ERAS` runs kept.
        """
        c = 0 if self.client_next is None else self.client_next
        self.client_next = c + 1
        offset = None if self.router_next is None else c + 1 - self.router_next
        eras = self.eras
        if not eras:
            self.plain_below = self.router_next
        if eras and eras[-1][0] == self.router_next:
            eras[-1][1] = offset  # no router delivery since the proxy's last one
        else:
            if len(eras) >= MAX_INSERTED_ERAS:
                raise ResourceLimitError("too many renewal replies on one session")
            eras.append([self.router_next, offset])
        self.mine.append(c)
        del self.mine[:-64]
        return c & MASK

    def router_transfer(self, handle: int, delivery_id: int | None, more: bool,
                        aborted: bool) -> int | None:
        """The client's delivery-id (wire) for a router Transfer on ``handle`` whose
        ``delivery-id`` is the router's (None: absent), None to leave the frame as it is."""
        first = handle not in self.open
        if delivery_id is None:
            if first:  # the implicit next id: right on both sides
                if self.router_next is not None:
                    self.router_next += 1
                if self.client_next is not None:
                    self.client_next += 1
            if not more or aborted:
                self.open.pop(handle, None)
            return None
        u = delivery_id if self.router_next is None else near(delivery_id, self.router_next)
        if first:
            if not self.eras:
                self.router_next = self.client_next = u + 1
                if more and not aborted:
                    self.open[handle] = u
                return None
            era = self.eras[-1]
            if era[1] is None:
                era[0] = u
                era[1] = 0 if self.client_next is None else self.client_next - u
            self.router_next = u + 1
            c = u + int(era[1])  # type: ignore[arg-type]
            self.client_next = c + 1
            if more and not aborted:
                self.open[handle] = u
        else:
            u = self.open.get(handle, u)
            if not more or aborted:
                self.open.pop(handle, None)
            c = u + self._offset(u)
        return None if c == u else c & MASK

    def _offset(self, u: int) -> int:
        """The offset of router id ``u``'s era (0 before the first)."""
        for start, offset in reversed(self.eras):
            if offset is not None and (start is None or start <= u):
                return offset
        return 0

    def _spans(self) -> list[tuple[int, int, int]]:
        """``(router_lo, router_hi, offset)`` of every era whose offset is known, router ids
        ``lo .. hi - 1``; before the first era ids map to themselves."""
        out: list[tuple[int, int, int]] = []
        r_next = self.router_next if self.router_next is not None else 0
        bounds = [e[0] for e in self.eras] + [r_next]
        plain = self.plain_below
        if plain is not None:
            out.append((plain - HALF, plain, 0))
        for i, (start, offset) in enumerate(self.eras):
            if offset is None:
                continue
            lo = (r_next - HALF) if start is None else start
            nxt = bounds[i + 1]
            hi = r_next if nxt is None else nxt
            out.append((lo, hi, offset))
        return out

    def client_to_router(self, first: int, last: int | None) -> list[tuple[int, int]]:
        """Client ids ``first..last`` (wire, a client ``role=receiver`` Disposition) as router
        id ranges (unbounded), the proxy's own ids left out."""
        ref = self.client_next if self.client_next is not None else first
        uf = near(first, ref)
        ul = uf + (((first if last is None else last) - first) & MASK)
        if not self.eras:
            return [(uf, ul)]  # the proxy sent nothing yet: the ids are the router's
        out = []
        for lo, hi, off in self._spans():
            a, b = max(uf, lo + off), min(ul, hi - 1 + off)
            if a <= b:
                out.append((a - off, b - off))
        return out

    def router_to_client(self, first: int, last: int | None) -> list[tuple[int, int]]:
        """Router ids ``first..last`` (wire, a router ``role=sender`` Disposition) as client
        id ranges (unbounded)."""
        ref = self.router_next if self.router_next is not None else first
        uf = near(first, ref)
        ul = uf + (((first if last is None else last) - first) & MASK)
        if not self.eras:
            return [(uf, ul)]
        out = []
        for lo, hi, off in self._spans():
            a, b = max(uf, lo), min(ul, hi - 1)
            if a <= b:
                out.append((a + off, b + off))
        return out

    def is_mine(self, first: int, last: int | None) -> bool:
        """Whether the client's ids ``first..last`` name only deliveries of the proxy's."""
        ids = {u & MASK for u in self.mine}
        n = ((first if last is None else last) - first) & MASK
        return n < 64 and all(((first + i) & MASK) in ids for i in range(n + 1))


def inserted_disposition(numbering: InsertedNumbering, perf: Disposition, raw: bytes,
                         channel: int, *, from_client: bool) -> bytes:
    """A Disposition about router deliveries (the client's ``role=receiver``, the router's
    ``role=sender``) on a session with deliveries of the proxy's, in the other end's
    numbering (one frame per range; empty when it names only the proxy's deliveries)."""
    if perf.first is None or bool(perf.role) is not from_client:
        return raw
    first, last = int(perf.first), _int(perf.last)
    if from_client:
        ranges = numbering.client_to_router(first, last)
    else:
        ranges = numbering.router_to_client(first, last)
    if len(ranges) == 1 and ranges[0][0] & MASK == first and ranges[0][1] & MASK == (
            first if last is None else last):
        return raw
    return b"".join(frame(channel, _range(perf, a, b)) for a, b in ranges)
