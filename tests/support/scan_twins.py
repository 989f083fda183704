"""The Python twins of the C scanners (``amqp/_relayscan.c``): the pure-Python statements of
``_relayscan.scan`` (:func:`scan_py`) and ``_relayscan.scan_router`` (:func:`scan_router_py`)
that the C code is property-tested against (``tests/unit/amqp/test_accel.py``). Test oracles
only: without its C parts the proxy's loops look at every frame in Python and call neither
(``amqp.accel``)."""

from __future__ import annotations

from collections.abc import Callable

from amqp_policy_proxy.amqp.accel import Delivery
from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.framing import frame_header_ok
from amqp_policy_proxy.amqp.message import read_message_head
from amqp_policy_proxy.amqp.transfer import read_transfer_fields

__all__ = ["scan_py", "scan_router_py"]


def scan_py(buf: bytes | bytearray | memoryview, pos: int, end: int, limit: int,
            channel: int, handle: int, max_size: int, user_id: bytes | None = None,
            delivery: Delivery | None = None) -> tuple[int, int, Delivery | None]:
    """Pure-Python statement of the scanner's contract (the C code does the same).

    Args:
        buf: the client bytes; only ``buf[pos:end]`` is read (``end`` is clamped to
            ``len(buf)``).
        pos: offset of the first frame to look at.
        end: one past the last readable byte.
        limit: the largest frame size to pass (the connection's max-frame-size, at most
            0x40FFFFFF so that a protocol header is never taken for a frame).
        channel: the session's channel; handle: the sender link's handle.
        max_size: the largest payload of a delivery in bytes (maxMessageSize), or ``-1`` for
            no limit.
        user_id: for a link under QDR's user-id check (``allowUserIdProxy`` false), the
            user's name as UTF-8: a whole delivery is passed only when
            :func:`read_message_head` reads its head and its ``user-id`` is absent,
            empty or this, and the first frame of a multi-frame delivery is not passed; None:
            no per-message check.
        delivery: the link's delivery in progress
            (:data:`amqp_policy_proxy.amqp.accel.Delivery`), None between deliveries. The caller
            guarantees it is not being discarded.

    Returns:
        ``(offset reached, Transfers passed, delivery in progress)``: the offset is that of
        the first frame not passed (``pos`` when none was). A frame is passed when it is an
        empty AMQP frame (heartbeat) or a Transfer on ``channel``/``handle`` whose fields the
        inline reader of :func:`read_transfer_fields` reads (list8/list32 with 1 to 6
        fields), not aborted, that keeps its delivery within ``max_size``: a whole delivery,
        the first frame of a multi-frame one (``more``) or a later frame of the one in
        progress, which is carried as the general Transfer handler keeps it
        (``core.deliveries.Deliveries.client_transfer``)
        (Part 2 §2.6.12). The C build may stop earlier, at a Transfer whose fields use an
        encoding only the general reader takes (a binary32 delivery-tag, a ``0x56`` boolean;
        with ``user_id``, a message head with annotations, a list32, a 32-bit length or
        non-ASCII text): it never passes a frame this function would not pass.

    Raises:
        Nothing for any bytes: a malformed frame simply ends the run.
    """
    state = [delivery]

    def link_transfer(pos: int, body: int, fend: int) -> int:
        if int.from_bytes(buf[pos + 6:pos + 8], "big") != channel:
            return _STOP
        if not (fend - body > 3 and buf[body] == 0x00 and buf[body + 1] == 0x53
                and buf[body + 2] == 0x14):
            return _STOP
        if not _inline_fields(buf, body, fend):
            return _STOP
        try:
            f = read_transfer_fields(buf, body, fend)
        except DecodeError:
            return _STOP
        if f[0] != handle or f[4]:
            return _STOP
        current = state[0]
        total = fend - f[5] + (0 if current is None else current[0])
        if max_size >= 0 and total > max_size:
            return _STOP
        if current is not None:  # more of the delivery under way
            current = (total, current[1], current[2] or f[2])
        elif f[3]:  # a multi-frame delivery starts: its head may not be whole
            if user_id is not None:
                return _STOP
            current = (total, f[1], f[2])
        elif user_id is not None:
            try:
                head = read_message_head(buf, f[5], fend, last=True)
            except DecodeError:
                return _STOP
            if head.user_id and head.user_id != user_id:
                return _STOP
        state[0] = current if f[3] else None
        return _PASS_TRANSFER

    pos, transfers = _walk(buf, pos, end, limit, link_transfer)
    return pos, transfers, state[0]


def scan_router_py(buf: bytes | bytearray | memoryview, pos: int, end: int,
                   limit: int) -> tuple[int, int]:
    """Pure-Python statement of the router-side walker (``_relayscan.scan_router``).

    The router side's loop (``core.router_side.RouterSide.relay``) relays most router frames
    as they came: heartbeats, Transfers and Dispositions need no look while no topic-filtered
    receiver, renumbered session or per-session count is in play. The walker passes a run of
    those in one call.

    Args:
        buf: the router bytes; only ``buf[pos:end]`` is read (``end`` clamped to
            ``len(buf)``).
        pos: offset of the first frame.
        end: one past the last readable byte.
        limit: the largest frame size the router may send (bytes).

    Returns:
        ``(offset reached, Transfers passed)``: it stops at the first frame that is not an
        empty AMQP frame, a Transfer or a Disposition with the descriptor ``0x00 0x53 0x14``
        / ``0x15``, at a header outside :func:`frame_header_ok` (the loop then
        raises what is wrong) and at a frame not wholly inside ``buf[:end]``.
    """
    def router_run(pos: int, body: int, fend: int) -> int:
        if fend - body < 3 or buf[body] != 0x00 or buf[body + 1] != 0x53:
            return _STOP
        if buf[body + 2] == 0x14:
            return _PASS_TRANSFER
        return _PASS if buf[body + 2] == 0x15 else _STOP

    return _walk(buf, pos, end, limit, router_run)


#: What a walk's rule says of one non-empty frame (as in ``_relayscan.c``): stop before it,
#: pass it, or pass it and count it as a Transfer.
_STOP, _PASS, _PASS_TRANSFER = 0, 1, 2


def _walk(buf: bytes | bytearray | memoryview, pos: int, end: int, limit: int,
          rule: Callable[[int, int, int], int]) -> tuple[int, int]:
    """The walk both statements make (the C ``walk()``): the whole frames of
    ``buf[pos:min(end, len(buf))]`` within :func:`frame_header_ok` and ``limit``,
    heartbeats always passed, every other frame as ``rule(pos, body, fend)`` says, up to the
    first it stops at. Returns ``(offset reached, Transfers passed)``."""
    end = min(end, len(buf))
    transfers = 0
    while end - pos >= 8:
        size = int.from_bytes(buf[pos:pos + 4], "big")
        doff, ftype = buf[pos + 4], buf[pos + 5]
        if not frame_header_ok(size, doff, ftype, limit) or size > end - pos:
            break
        fend = pos + size
        body = pos + doff * 4
        if body != fend:  # not a heartbeat
            verdict = rule(pos, body, fend)
            if verdict == _STOP:
                break
            transfers += verdict == _PASS_TRANSFER
        pos = fend
    return pos, transfers


def _inline_fields(buf: bytes | bytearray | memoryview, body: int, fend: int) -> bool:
    """True when the Transfer's list is one the scanner reads itself: list8 (size >= 1) or
    list32 (size >= 4) within the frame, 1 to 6 fields. Others go to the general handlers."""
    p = body + 3
    code = buf[p]
    if code == 0xC0:
        if fend - p < 3:
            return False
        size, count = buf[p + 1], buf[p + 2]
        ok = size >= 1 and p + 2 + size <= fend
    elif code == 0xD0:
        if fend - p < 9:
            return False
        size = int.from_bytes(buf[p + 1:p + 5], "big")
        count = int.from_bytes(buf[p + 5:p + 9], "big")
        ok = size >= 4 and p + 5 + size <= fend
    else:
        return False
    return ok and 1 <= count <= 6
