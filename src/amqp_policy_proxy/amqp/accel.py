"""Sans-IO. The optional C accelerator of the client relay loop, with its pure-Python twin.

What it does: :func:`scan_py` (and its C build, ``_relayscan.scan``) walks a run of client
frames that need no decision — heartbeats and the Transfers of one sender link, whole
deliveries or the frames of a multi-frame one — and returns how far the run goes, so that the
relay's fast path (``core.fastpath.FastPath.relay``) forwards the run as one slice of the
original bytes without looking at each frame in Python. Anything else (another link or session,
an aborted Transfer, a delivery over maxMessageSize, a frame header the general loop must
judge, an encoding the inline reader of
:func:`~amqp_policy_proxy.amqp.transfer.read_transfer_fields` does not cover) ends the run, and
the Python loop handles that frame with its general handlers.

It also reads a Transfer's fields where the scanner stops (the first Transfer of a read, every
Transfer of an inspected link): :func:`read_fields` answers
:func:`~amqp_policy_proxy.amqp.transfer.read_transfer_fields` in C
(``_relayscan.transfer_fields``) for the encodings the scanner reads, the others going to the
Python reader. It reads the handshake: :func:`read_sasl_init` and :func:`is_sasl_mechanisms`
answer :mod:`~amqp_policy_proxy.amqp.handshake`'s SASL readers in C (``_relayscan.sasl_init``,
``_relayscan.sasl_mechanisms``) for their plain encodings, and :func:`read_open_head` answers
:func:`~amqp_policy_proxy.amqp.handshake.read_open_head` in C (``_relayscan.open_head``) for
the plain Opens clients and routers send (two per connection), any other going to the Python
reader. And it reads message heads: :func:`read_head` answers
:func:`~amqp_policy_proxy.amqp.message.read_message_head` in C (``_relayscan.message_head``)
for the plain heads real clients send, which is every message of an anonymous-relay sender
(its ``to`` is checked per message) and of a link under QDR's user-id check when the scanner
stops; any other head goes to the Python reader.

Why C: with small messages the proxy spends its time in the per-frame Python code (about
1.6 µs per Transfer against 0.03 µs in C, ``bench/bench_core.py``), which is what keeps it
behind a byte-level TCP proxy such as HAProxy on 100-byte messages.

The fallback: the extension is built by ``setup.py`` as an optional extension; where it
was not built (no compiler) or when the environment variable ``AMQP_PROXY_NO_ACCEL`` is set
to a non-empty value other than ``0``, :data:`scan` is None and the relay loop does every
frame in Python (the reference implementation; the property tests run both ways). Read at
import time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .errors import DecodeError
from .framing import frame_header_ok
from .handshake import OpenHead
from .handshake import is_sasl_mechanisms as is_sasl_mechanisms_py
from .handshake import read_open_head as read_open_head_py
from .handshake import read_sasl_init as read_sasl_init_py
from .message import MessageHead, read_message_head
from .transfer import read_transfer_fields

#: Environment variable that forces the pure-Python relay loop when set (not "" or "0").
DISABLE_ENV = "AMQP_PROXY_NO_ACCEL"

Delivery = tuple[int, int | None, bool]
"""A sender link's delivery in progress as the scanner carries it: ``(payload bytes so far,
its first frame's delivery-id or None, whether a frame of it was settled)``."""

ScanFunction = Callable[[object, int, int, int, int, int, int, bytes | None, Delivery | None],
                        tuple[int, int, Delivery | None]]

HeadFunction = Callable[[object, int, int, bool], tuple[bytes | None, str | None, bool, bool] | None]

RouterScanFunction = Callable[[object, int, int, int], tuple[int, int]]

OpenHeadFunction = Callable[[object, bool], tuple[Any, ...] | None]

WindowReader = Callable[[object, int, int], Any]
"""A C reader of ``buf[pos:end]`` (``(buf, pos, end) -> answer``, None: the Python reader
decides)."""

try:
    from ._relayscan import message_head as message_head_c
    from ._relayscan import open_head as open_head_c
    from ._relayscan import sasl_init as sasl_init_c
    from ._relayscan import sasl_mechanisms as sasl_mechanisms_c
    from ._relayscan import scan as scan_c
    from ._relayscan import scan_router as scan_router_c
    from ._relayscan import transfer_fields as transfer_fields_c
except ImportError:  # not built: no compiler at install time, or a source checkout
    scan_c = None
    message_head_c = None
    scan_router_c = None
    open_head_c = None
    sasl_init_c = None
    sasl_mechanisms_c = None
    transfer_fields_c = None

_disabled = os.environ.get(DISABLE_ENV, "") not in ("", "0")

#: The C scanner when it is built and not disabled, else None (the relay loop then does
#: every frame in Python).
scan: ScanFunction | None = None if _disabled else scan_c
#: The C walker of the router's runs when built and not disabled, else None (the router
#: side's loop then looks at every frame in Python).
scan_router: RouterScanFunction | None = None if _disabled else scan_router_c
#: The C reader of plain message heads when built and not disabled, else None.
_message_head: HeadFunction | None = None if _disabled else message_head_c
#: The C reader of plain Opens when built and not disabled, else None.
_open_head: OpenHeadFunction | None = None if _disabled else open_head_c
#: The C readers of plain sasl-inits and sasl-mechanisms when built and not disabled.
_sasl_init: WindowReader | None = None if _disabled else sasl_init_c
_sasl_mechanisms: WindowReader | None = None if _disabled else sasl_mechanisms_c
#: The C reader of plain Transfer fields when built and not disabled, else None.
_transfer_fields: WindowReader | None = None if _disabled else transfer_fields_c
_new_head = tuple.__new__
_NO_SUBJECT = (None,)


def read_head(buf: bytes | bytearray | memoryview, pos: int, end: int, *,
              last: bool, subject: bool = False) -> MessageHead:
    """:func:`~.message.read_message_head`, answered in C for the plain heads real clients
    send (a header and properties in list8, short ASCII strings: ~0.3 µs instead of ~4).

    The C reader (``_relayscan.message_head``) answers only where its answer is the Python
    reader's (property-tested); for every other head, and without the extension, the Python
    reader reads it, or raises. Arguments, result and errors are those of
    :func:`~.message.read_message_head`; with ``subject`` (a link whose upstream routes each
    message by its subject) the Python reader reads the head, subject included.
    """
    reader = _message_head
    if reader is not None and not subject:
        got = reader(buf, pos, end, last)
        if got is not None:
            return _new_head(MessageHead, got + _NO_SUBJECT)  # C reads no subject
    return read_message_head(buf, pos, end, last=last, subject=subject)


def _answer(c_reader: WindowReader | None, py_reader: Callable[[Any, int, int], Any],
            buf: bytes | bytearray | memoryview, pos: int, end: int) -> Any:
    """``c_reader(buf, pos, end)`` when the C reader is there and answers (not None), else
    ``py_reader(buf, pos, end)``, the Python reader it answers for."""
    if c_reader is not None:
        got = c_reader(buf, pos, end)
        if got is not None:
            return got
    return py_reader(buf, pos, end)


def read_fields(buf: bytes | bytearray | memoryview, pos: int,
                end: int) -> tuple[int, int | None, bool, bool, bool, int, int]:
    """:func:`~.transfer.read_transfer_fields`, answered in C for the Transfers the scanner
    reads (~0.15 µs instead of ~0.9).

    The C reader (``_relayscan.transfer_fields``) answers only where its answer is the Python
    reader's (property-tested); for every other Transfer, and without the extension, the
    Python reader reads it, or raises. Arguments, result and errors are those of
    :func:`~.transfer.read_transfer_fields`.
    """
    return _answer(_transfer_fields, read_transfer_fields, buf, pos, end)


def read_sasl_init(buf: bytes | bytearray | memoryview, pos: int,
                   end: int) -> tuple[str, bytes | None] | None:
    """:func:`~.handshake.read_sasl_init`, answered in C for the plain sasl-inits clients
    send (its answer is the Python reader's, property-tested); any other goes to the Python
    reader. Arguments and result are those of :func:`~.handshake.read_sasl_init`."""
    return _answer(_sasl_init, read_sasl_init_py, buf, pos, end)


def is_sasl_mechanisms(buf: bytes | bytearray | memoryview, pos: int, end: int) -> bool:
    """:func:`~.handshake.is_sasl_mechanisms`, answered in C for the plain sasl-mechanisms
    routers send (True only where the Python reader says True, property-tested); any other
    body goes to the Python reader."""
    return _answer(_sasl_mechanisms, is_sasl_mechanisms_py, buf, pos, end)


def read_open_head(body: bytes | bytearray | memoryview, *,
                   strict: bool = True) -> OpenHead | None:
    """:func:`~.handshake.read_open_head`, answered in C for the plain Opens clients and
    routers send (~0.3 µs instead of ~3).

    The C reader (``_relayscan.open_head``) answers only where its answer is the Python
    reader's (property-tested); for every other Open, and without the extension, the Python
    reader reads it. Arguments and result are those of :func:`~.handshake.read_open_head`.
    """
    reader = _open_head
    if reader is not None:
        got = reader(body, strict)
        if got is not None:
            return _new_head(OpenHead, got)
    return read_open_head_py(body, strict=strict)


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
            :func:`~.message.read_message_head` reads its head and its ``user-id`` is absent,
            empty or this, and the first frame of a multi-frame delivery is not passed; None:
            no per-message check.
        delivery: the link's delivery in progress (:data:`Delivery`), None between
            deliveries. The caller guarantees it is not being discarded.

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
        / ``0x15``, at a header outside :func:`~.framing.frame_header_ok` (the loop then
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
    ``buf[pos:min(end, len(buf))]`` within :func:`~.framing.frame_header_ok` and ``limit``,
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
