"""Sans-IO. Receive buffering for one leg: whole units are read in place, a partial one is kept.

Each read from a transport is handed to a *process* function that consumes whole units
(protocol headers, frames) from ``buf[start:end]`` and returns the offset it reached. Only the
bytes of a unit that straddles reads are kept (at most one frame, bounded by the leg's frame
size limit, which the process function enforces when it reads the frame header). When the kept
bytes are the start of a frame of known size, just the bytes it lacks are appended and the rest
of the new read is processed in place: each byte is then copied once (into the run that is
forwarded), not appended to the buffer and copied out again.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any

from ..amqp.constants import FRAME_HEADER_SIZE, PROTOCOL_HEADER_FIRST_BYTE

_U32 = Struct(">I")

Process = Callable[[Any, int, int, float], int]
"""``process(buf, start, end, now) -> offset reached`` (a whole number of units consumed)."""


def pending_frame_size(kept: bytearray, framed: bool, limit: int) -> int:
    """Size of the frame whose first bytes are ``kept``, or 0 when it is not known yet, the
    leg is not reading frames, or the size is not plainly valid (the process function then
    reads the header from the buffer and says what is wrong with it)."""
    if not framed or len(kept) < FRAME_HEADER_SIZE or kept[0] == PROTOCOL_HEADER_FIRST_BYTE:
        return 0
    size = _U32.unpack_from(kept, 0)[0]
    return size if FRAME_HEADER_SIZE <= size <= limit else 0


def feed(kept: bytearray, data: bytes, framed: bool, limit: int, process: Process,
         now: float) -> bytearray:
    """Process ``data`` after the bytes ``kept`` from the previous read; return what to keep.

    Args:
        kept: the partial unit kept from earlier reads (may be empty); consumed in place.
        data: the new read.
        framed: the leg is reading frames (not a protocol header).
        limit: the leg's largest frame in bytes (for completing a kept frame).
        process: consumes whole units, see :data:`Process`.
        now: loop-clock seconds, passed to ``process``.

    Returns:
        The buffer holding the bytes of the next partial unit (``kept`` itself, or a new one).
    """
    start = 0
    if kept:
        size = pending_frame_size(kept, framed, limit)
        start = size - len(kept)
        if 0 < start < len(data):
            kept += memoryview(data)[:start]
        else:
            start = len(data)
            kept += data
        pos = process(kept, 0, len(kept), now)
        del kept[:pos]
        if start == len(data):
            return kept
        if kept:  # not consumed (the connection stopped reading meanwhile): keep the bytes
            kept += memoryview(data)[start:]
            return kept
    pos = process(data, start, len(data), now)
    if pos < len(data):
        kept += memoryview(data)[pos:]
    return kept
