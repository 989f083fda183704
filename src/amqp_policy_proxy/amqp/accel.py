"""Sans-IO. The optional C accelerator of the relay loops and of the handshake readers.

What it does: ``_relayscan.scan`` (:data:`scan`) walks a run of client frames that need no
decision — heartbeats and the Transfers of one sender link, whole deliveries or the frames of a
multi-frame one — and returns how far the run goes, so that the relay's fast path
(``core.fastpath.FastPath.relay``) forwards the run as one slice of the original bytes without
looking at each frame in Python. Anything else (another link or session, an aborted Transfer, a
delivery over maxMessageSize, a frame header the general loop must judge, an encoding the
inline reader of :func:`~amqp_policy_proxy.amqp.transfer.read_transfer_fields` does not cover)
ends the run, and the Python loop handles that frame with its general handlers. The router
side's walker ``_relayscan.scan_router`` (:data:`scan_router`) passes runs of router
Transfers, Dispositions and heartbeats the same way. Their contracts are written out in
Python, as the test oracles they are, in ``tests/support/scan_twins.py``.

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

The switch: the extension is built by ``setup.py``, as an optional extension unless
``AMQP_PROXY_REQUIRE_ACCEL`` is set (CI sets it: a build that cannot compile it fails).
Where it was not built (:data:`BUILT` false), or when the environment variable
``AMQP_PROXY_NO_ACCEL`` is set to a non-empty value other than ``0`` (read once, at import),
the C parts are off: :data:`scan` and :data:`scan_router` are None and every reader is the
Python one (the reference implementation). :func:`use` turns them on or off at run time (the
tests run the core both ways with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from .handshake import OpenHead
from .handshake import is_sasl_mechanisms as is_sasl_mechanisms_py
from .handshake import read_open_head as read_open_head_py
from .handshake import read_sasl_init as read_sasl_init_py
from .message import MessageHead, read_message_head
from .transfer import TransferFields, read_transfer_fields

#: Environment variable that turns the C parts off when set (not "" or "0"), read at import.
DISABLE_ENV = "AMQP_PROXY_NO_ACCEL"

Buffer = bytes | bytearray | memoryview
"""What the readers read: the connection's receive buffer, or a view of it."""

Delivery = tuple[int, int | None, bool]
"""A sender link's delivery in progress as the scanner carries it: ``(payload bytes so far,
its first frame's delivery-id or None, whether a frame of it was settled)``."""

ScanFunction = Callable[[Buffer, int, int, int, int, int, int, bytes | None, Delivery | None],
                        tuple[int, int, Delivery | None]]

HeadFunction = Callable[[Buffer, int, int, bool],
                        tuple[bytes | None, str | None, bool, bool] | None]

RouterScanFunction = Callable[[Buffer, int, int, int], tuple[int, int]]

OpenHeadFunction = Callable[
    [Buffer, bool], tuple[str, str | None, int | None, int | None, tuple[list[int], int]] | None]

_T = TypeVar("_T")
WindowReader = Callable[[Buffer, int, int], _T | None]
"""A C reader of ``buf[pos:end]`` (``(buf, pos, end) -> answer``, None: the Python reader
decides), generic in its answer."""

# the C functions, or None each when the extension is not built
scan_c: ScanFunction | None
message_head_c: HeadFunction | None
scan_router_c: RouterScanFunction | None
open_head_c: OpenHeadFunction | None
sasl_init_c: WindowReader[tuple[str, bytes | None]] | None
sasl_mechanisms_c: WindowReader[bool] | None
transfer_fields_c: WindowReader[TransferFields] | None
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

#: Whether the C extension ``_relayscan`` is built (importable).
BUILT = scan_c is not None

#: The C scanner of client runs while the C parts are in use, else None (the relay loop then
#: does every frame in Python).
scan: ScanFunction | None = None
#: The C walker of the router's runs while the C parts are in use, else None (the router
#: side's loop then looks at every frame in Python).
scan_router: RouterScanFunction | None = None
#: The C readers while the C parts are in use, else None: plain message heads, Opens,
#: sasl-inits and sasl-mechanisms, Transfer fields.
_message_head: HeadFunction | None = None
_open_head: OpenHeadFunction | None = None
_sasl_init: WindowReader[tuple[str, bytes | None]] | None = None
_sasl_mechanisms: WindowReader[bool] | None = None
_transfer_fields: WindowReader[TransferFields] | None = None


def use(enabled: bool) -> None:
    """Use the C parts (``enabled``) or the pure-Python code alone, from the next call on.

    For tests and benchmarks (the proxy itself never calls it): every relay loop and reader
    looks its C part up here at each read, so the switch takes effect at each connection's
    next read. The default, set at import, is on when :data:`BUILT` and :data:`DISABLE_ENV`
    is not set.

    Raises:
        RuntimeError: ``enabled`` while the extension is not built.
    """
    global scan, scan_router, _message_head, _open_head, _sasl_init, _sasl_mechanisms
    global _transfer_fields
    if enabled and not BUILT:
        raise RuntimeError("the C extension amqp_policy_proxy.amqp._relayscan is not built")
    scan = scan_c if enabled else None
    scan_router = scan_router_c if enabled else None
    _message_head = message_head_c if enabled else None
    _open_head = open_head_c if enabled else None
    _sasl_init = sasl_init_c if enabled else None
    _sasl_mechanisms = sasl_mechanisms_c if enabled else None
    _transfer_fields = transfer_fields_c if enabled else None


def in_use() -> bool:
    """Whether the C parts are in use (:func:`use`)."""
    return scan is not None


use(BUILT and os.environ.get(DISABLE_ENV, "") in ("", "0"))
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


def _answer(c_reader: WindowReader[_T] | None, py_reader: Callable[[Buffer, int, int], _T],
            buf: Buffer, pos: int, end: int) -> _T:
    """``c_reader(buf, pos, end)`` when the C reader is there and answers (not None), else
    ``py_reader(buf, pos, end)``, the Python reader it answers for."""
    if c_reader is not None:
        got = c_reader(buf, pos, end)
        if got is not None:
            return got
    return py_reader(buf, pos, end)


def read_fields(buf: bytes | bytearray | memoryview, pos: int, end: int) -> TransferFields:
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
