"""The relay scanner (``amqp.accel``): the C build against the pure-Python statement of its
contract, on well-formed runs, on crafted frames and on random bytes.

The C scanner must never crash, never read outside ``buf[pos:end]`` (checked by changing
every byte outside that window and by handing it a copy that ends at ``end``), never pass a
frame the Python statement would not pass, and pass exactly the same frames on the
encodings real clients use.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol

from amqp_policy_proxy.amqp import accel
from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.handshake import OpenHead
from amqp_policy_proxy.amqp.handshake import is_sasl_mechanisms as is_sasl_mechanisms_py
from amqp_policy_proxy.amqp.handshake import read_open_head as read_open_head_py
from amqp_policy_proxy.amqp.handshake import read_sasl_init as read_sasl_init_py
from amqp_policy_proxy.amqp.message import read_message_head
from amqp_policy_proxy.amqp.performatives import (
    Disposition,
    Open,
    SaslInit,
    SaslMechanisms,
    Transfer,
)
from amqp_policy_proxy.amqp.transfer import read_transfer_fields
from tests.support.encodings import transfer_body as _transfer
from tests.support.scan_twins import scan_py, scan_router_py
from tests.support.scanners import scanners
from tests.unit.amqp.test_handshake import opens

scan_c = accel.scan_c
needs_c = pytest.mark.skipif(scan_c is None, reason="C extension not built (no compiler?)")


@pytest.fixture(params=[pytest.param("c", marks=needs_c), "python"])
def c_parts(request: pytest.FixtureRequest):
    """The test runs with the C parts in use ("c", when built) and without ("python")."""
    with scanners(request.param):
        yield request.param


LIMIT = 65536
HEARTBEAT = bytes.fromhex("0000000802000000")


def _frame(channel: int, body: bytes, doff: int = 2, ftype: int = 0) -> bytes:
    return ((8 + (doff - 2) * 4 + len(body)).to_bytes(4, "big") + bytes([doff, ftype])
            + channel.to_bytes(2, "big") + b"\0" * ((doff - 2) * 4) + body)


def _both(buf: bytes, pos: int, end: int, limit: int = LIMIT, channel: int = 0,
          handle: int = 0, max_size: int = -1, delivery: Any = None) -> tuple[Any, Any]:
    return (scan_c(buf, pos, end, limit, channel, handle, max_size, None, delivery),
            scan_py(buf, pos, end, limit, channel, handle, max_size, None, delivery))


@needs_c
def test_a_run_of_plain_transfers_and_heartbeats_is_passed_whole():
    run = b"".join(_frame(0, _transfer(0, i, b"t%d" % i)) + HEARTBEAT for i in range(50))
    stop = _frame(0, Disposition(role=False, first=0, settled=True).encode())
    buf = run + stop
    assert _both(buf, 0, len(buf)) == ((len(run), 50, None), (len(run), 50, None))


@needs_c
@pytest.mark.parametrize("stop, why", [
    (_frame(1, _transfer(0, 1, b"x")), "another channel"),
    (_frame(0, _transfer(1, 1, b"x")), "another link"),
    (_frame(0, _transfer(0, 1, b"x", payload=b"y" * 101)), "over max_size"),
    (_frame(0, _transfer(0, 1, b"x", payload=b"y" * 100) + b"\x00", doff=3), "over max_size"),
    (_frame(0, b"\x00\x53\x14\xc0\x0b\x0a" + b"\x43\x43\x40\x43\x42\x42\x40\x40\x40\x41"),
     "aborted (10 fields)"),
    (_frame(0, b"\x00\x53\x14\xc0\x02\x01\x40"), "null handle"),
    (_frame(0, b"\x00\x53\x14\xc0\x01\x00"), "no fields"),
    (_frame(0, b"\x00\x53\x14\x45"), "list0"),
    (_frame(0, b"\x00\x53\x14\xc0\x05\x01\x43"), "list runs past the frame"),
    (_frame(0, b"\x00\x53\x14\xd0\x00\x00\x00\x02\x00\x00\x00\x01\x43"), "list32 size < 4"),
    (_frame(0, b"\x00\x53\x14\xc0\x03\x03\x43\x43\xa0\x05ab"), "tag runs past the list"),
    (_frame(0, b"\x00\x53\x14\xc0\x04\x03\x43\x43\xb0"), "binary32 tag (general reader)"),
    (_frame(0, b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x02\x01\x43"), "ulong descr."),
    (_frame(0, b"\x00\x53\x13\xc0\x01\x00"), "a Flow"),
    (_frame(0, b"\x00\x53\x14"), "descriptor only"),
    (_frame(0, b"", ftype=1), "SASL frame type (empty)"),
    (_frame(0, _transfer(0, 1, b"x"), ftype=1), "SASL frame type"),
    (bytes.fromhex("0000000701000000"), "size below 8"),
    (bytes.fromhex("0000000c01000000") + b"abcd", "doff below 2"),
    (bytes.fromhex("0000000c04000000") + b"abcd", "doff*4 above size"),
    (b"AMQP\x00\x01\x00\x00", "a protocol header"),
    ((LIMIT + 1).to_bytes(4, "big") + b"\x02\x00\x00\x00" + b"\0" * (LIMIT - 7), "over limit"),
])
def test_stops_at_any_frame_that_may_need_a_decision(stop, why):
    head = _frame(0, _transfer(0, 0, b"a")) + HEARTBEAT
    buf = head + stop
    c, py = _both(buf, 0, len(buf), max_size=100)
    assert c == py == (len(head), 1, None), why


@needs_c
def test_partial_frame_is_left_for_the_next_read():
    one = _frame(0, _transfer(0, 0, b"a"))
    buf = one + one
    for end in range(len(one), len(buf)):
        assert _both(buf, 0, end) == ((len(one), 1, None), (len(one), 1, None))


@needs_c
def test_arguments_are_checked():
    with pytest.raises(ValueError):
        scan_c(b"x" * 8, 9, 8, LIMIT, 0, 0, -1, None, None)
    with pytest.raises(ValueError):
        scan_c(b"x" * 8, -1, 8, LIMIT, 0, 0, -1, None, None)
    with pytest.raises(TypeError):
        scan_c("not bytes", 0, 8, LIMIT, 0, 0, -1, None, None)
    with pytest.raises(TypeError):
        scan_c(b"", 0, 0)
    buf = _frame(0, _transfer(0, 0, b"a"))
    with pytest.raises(TypeError):
        scan_c(b"", 0, 0, LIMIT, 0, 0, -1, None, 5)  # delivery not a tuple
    with pytest.raises(ValueError):
        scan_c(b"", 0, 0, LIMIT, 0, 0, -1, None, (-1, None, False))
    with pytest.raises(ValueError):
        scan_c(b"", 0, 0, LIMIT, 0, 0, -1, None, (0, 2**32, False))
    assert scan_c(buf, 0, 10**6, LIMIT, 0, 0, -1, None, None) == (len(buf), 1, None)  # clamped
    assert scan_c(buf, 5, 2, LIMIT, 0, 0, -1, None, None) == (5, 0, None)  # end before pos
    assert scan_c(buf, 0, len(buf), LIMIT, 70000, 0, -1, None, None) == (0, 0, None)  # channel
    assert scan_c(buf, 0, len(buf), LIMIT, 0, -1, -1, None, None) == (0, 0, None)  # handle
    assert scan_c(bytearray(buf), 0, len(buf), LIMIT, 0, 0, -1, None, None) == (len(buf), 1, None)
    assert scan_c(memoryview(buf), 0, len(buf), LIMIT, 0, 0, -1, None, None) == (len(buf), 1, None)
    # a delivery in progress is carried through, untouched when nothing is passed
    assert scan_c(buf, 0, 0, LIMIT, 0, 0, -1, None, (5, 7, True)) == (0, 0, (5, 7, True))


plain = st.builds(
    lambda handle, did, tag, count, settled, more, wide, list32, payload, doff, hb: (
        _frame(0, _transfer(handle, did, tag, count=count, settled=settled, more=more,
                            wide=wide, list32=list32, payload=payload), doff=doff)
        + (HEARTBEAT if hb else b"")),
    st.sampled_from([0, 0, 0, 7, 300]),
    st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.integers(1, 6),
    st.one_of(st.none(), st.booleans()),
    st.sampled_from([None, False, False, True]),
    st.booleans(),
    st.booleans(),
    st.binary(max_size=120),
    st.sampled_from([2, 2, 3, 5]),
    st.booleans(),
)
other = st.one_of(
    st.builds(lambda b, ch: _frame(ch, b), st.binary(max_size=30), st.sampled_from([0, 1])),
    st.builds(lambda m: _frame(0, _transfer(0, 1, b"x", count=6, more=m)), st.booleans()),
    st.just(_frame(0, Transfer(handle=0, delivery_id=1, delivery_tag=b"p", settled=True,
                               more=False).encode() + b"proton")),
    st.just(_frame(0, Transfer(handle=0, more=False, aborted=True).encode())),
)

#: A link's delivery in progress as the scanner carries it (None: between deliveries).
deliveries = st.one_of(
    st.none(),
    st.tuples(st.sampled_from([0, 1, 59, 60, 100]), st.one_of(st.none(), st.integers(0, 2**32 - 1)),
              st.booleans()),
)


@needs_c
@given(st.lists(st.one_of(plain, plain, plain, other), max_size=12), st.data())
@settings(max_examples=400, deadline=None)
def test_same_decisions_as_python_on_client_encodings(frames, data):
    buf = b"".join(frames)
    pos = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(pos, len(buf) + 3))
    max_size = data.draw(st.sampled_from([-1, 0, 60, 100, 10**9]))
    limit = data.draw(st.sampled_from([LIMIT, 100, 0x40FFFFFF]))
    handle = data.draw(st.sampled_from([0, 7]))
    c, py = _both(buf, pos, end, limit, 0, handle, max_size, data.draw(deliveries))
    assert c == py


def _never_reads_outside(fn: Any, buf: bytes, pos: int, end: int, *args: Any) -> Any:
    """``fn(buf, pos, end, *args)`` (a C entry point), which must answer the same on the same
    window with every byte outside it changed, and on a buffer that stops at ``end``."""
    got = fn(buf, pos, end, *args)
    flipped = bytearray(b ^ 0xFF for b in buf)
    flipped[pos:end] = buf[pos:end]
    assert fn(bytes(flipped), pos, end, *args) == got
    if end <= len(buf):
        assert fn(buf[:end], pos, end, *args) == got
    return got


def _message(user_id: bytes | None, to: str | None, message_id: Any, subject: str | None,
             durable: bool, priority: int | None, ttl: float | None,
             annotations: dict[Any, Any] | None, app: dict[str, Any] | None,
             body: Any) -> bytes:
    """A message as proton (python-qpid-proton, what real clients use) encodes it."""
    msg = Message(body=body, address=to, id=message_id, subject=subject, durable=durable,
                  properties=app, annotations=annotations)
    if user_id is not None:
        msg.user_id = user_id
    if priority is not None:
        msg.priority = priority
    if ttl is not None:
        msg.ttl = ttl
    msg.content_type = "text/plain"
    return msg.encode()


messages = st.tuples(
    st.sampled_from([None, b"alice", b"alice", b"mallory", b"", b"alic"]),
    st.sampled_from([None, "q.a", "q.\u00fc", "x" * 300]),
    st.sampled_from([None, 7, 2**40, "m-1", uuid.UUID(int=5), b"bin"]),
    st.sampled_from([None, "subject", "s\u00e9"]),
    st.booleans(),
    st.sampled_from([None, 4, 9]),
    st.sampled_from([None, 1.5]),
    st.sampled_from([None, None, {symbol("x-opt-app"): 1}, {symbol("x-opt-qd.to"): "q.b"}]),
    st.sampled_from([None, None, {"k": 1}]),
    st.sampled_from([b"payload", "text", None, ["a", 1]]),
).map(lambda fields: (_message(*fields), fields))
"""``(payload, the fields it was made of)``."""
#: Transfers carrying a real message (whose head the user-id check reads).
headed = st.builds(lambda m, handle: _frame(0, _transfer(handle, 1, b"t", payload=m[0])),
                   messages, st.sampled_from([0, 0, 7]))


def _plainly_read(fields: tuple[Any, ...]) -> bool:
    """Whether the C scanner reads the head of the message made of ``fields`` itself (else
    it stops and Python judges): no annotations, ASCII text, a properties list within a
    list8, a non-empty user-id (an empty one passes in Python only). (proton cuts a ``to``
    at its first NUL: such a ``to`` is tested with hand-written bytes.)"""
    user_id, to, message_id, subject, _, _, _, annotations, _, _ = fields
    texts = [to or "", subject or "", message_id if isinstance(message_id, str) else ""]
    return (not annotations and all(t.isascii() for t in texts) and len(to or "") < 200
            and user_id != b"")


@needs_c
@given(st.lists(st.tuples(messages, st.sampled_from([b"alice", None])), min_size=1,
                max_size=5))
@settings(max_examples=300, deadline=None)
def test_user_id_check_same_decisions_as_python_on_proton_messages(items):
    """On the messages real clients send, the C scanner passes exactly what the Python
    reader passes, and stops at the same frame (a user-id of someone else, or a head it does
    not read plainly, where it only stops earlier)."""
    for (payload, fields), user_id in items:
        buf = _frame(0, _transfer(0, 1, b"t", payload=payload)) * 2
        c = scan_c(buf, 0, len(buf), LIMIT, 0, 0, -1, user_id, None)
        py = scan_py(buf, 0, len(buf), LIMIT, 0, 0, -1, user_id)
        if user_id is None or _plainly_read(fields):
            assert c == py
        else:
            assert c == (0, 0, None) and py[1] in (0, 2)


def test_user_id_check_passes_the_users_messages_and_stops_at_others():
    mine = _frame(0, _transfer(0, 1, b"t", payload=_message(
        b"alice", "q.a", "m-1", "s", True, 4, 1.5, None, {"k": 1}, b"x")))
    anyone = _frame(0, _transfer(0, 2, b"u", payload=Message(body=b"no user-id").encode()))
    theirs = _frame(0, _transfer(0, 3, b"v", payload=_message(
        b"mallory", None, None, None, False, None, None, None, None, b"x")))
    buf = mine + anyone + mine + theirs + mine
    stop = len(mine + anyone + mine)
    assert scan_py(buf, 0, len(buf), LIMIT, 0, 0, -1, b"alice") == (stop, 3, None)
    if scan_c is not None:
        assert scan_c(buf, 0, len(buf), LIMIT, 0, 0, -1, b"alice", None) == (stop, 3, None)
        with pytest.raises(TypeError):
            scan_c(buf, 0, len(buf), LIMIT, 0, 0, -1, "alice", None)


@pytest.mark.parametrize("head, passed, plain", [
    ("005373 c006 03 40 40 a10171", True, True),                  # to "q"
    ("005373 c008 03 40 40 a103710061", False, True),             # to "q\\0a": NUL
    ("005373 c009 02 40 a005616c696365", True, True),             # user-id "alice"
    ("005373 c009 02 40 a0056d616c6c6f", False, True),            # user-id "mallo"
    ("005373 c004 02 40 a000", True, False),                      # user-id empty: Python only
    ("005373 c009 03 40 a005616c696365", False, True),            # count 3, two fields
    ("005373 c008 02 40 a005616c696365", False, True),            # size one byte short
    ("005370 45 005373 45", True, True),                          # empty header, properties
    ("005370 c003 02 41 50 005373 45", False, True),              # priority (ubyte) cut by the size
    ("005373 45 005370 45", False, True),                         # header after properties
    ("005372 c10100 005373 45", True, False),                     # annotations: Python reads
    ("0080000000000000007345", True, False),                      # ulong descriptor
])
def test_hand_written_heads(head, passed, plain):
    """Heads proton does not write: the C scanner passes exactly what Python passes on the
    ones it reads plainly, and stops at the others (Python then judges them)."""
    payload = bytes.fromhex(head.replace(" ", "")) + bytes.fromhex("005377a1017a")
    buf = _frame(0, _transfer(0, 1, b"t", payload=payload))
    py = scan_py(buf, 0, len(buf), LIMIT, 0, 0, -1, b"alice")
    assert py == ((len(buf), 1, None) if passed else (0, 0, None))
    if scan_c is not None:
        c = scan_c(buf, 0, len(buf), LIMIT, 0, 0, -1, b"alice", None)
        assert c == (py if plain else (0, 0, None))


@pytest.mark.slow
@needs_c
@given(st.binary(max_size=300), st.data())
@settings(max_examples=500, deadline=None)
def test_random_bytes_never_crash_or_pass_more_than_python(raw, data):
    lead = data.draw(st.sampled_from([b"", _frame(0, _transfer(0, 0, b"a")), HEARTBEAT]))
    buf = lead + raw
    pos = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(pos, len(buf)))
    args = (data.draw(st.sampled_from([LIMIT, 20, 0x40FFFFFF])), 0, 0,
            data.draw(st.sampled_from([-1, 0, 50])), data.draw(st.sampled_from([None, b"alice"])),
            data.draw(deliveries))
    c_pos, c_n, c_delivery = _never_reads_outside(scan_c, buf, pos, end, *args)
    py_pos, py_n, _ = scan_py(buf, pos, end, *args)
    assert pos <= c_pos <= py_pos and c_n <= py_n
    # every frame the C scanner passed, Python passes too, to the same delivery state
    assert scan_py(buf, pos, c_pos, *args) == (c_pos, c_n, c_delivery)


@pytest.mark.slow
@needs_c
@given(st.lists(st.one_of(plain, other, headed), min_size=1, max_size=6), st.data())
@settings(max_examples=400, deadline=None)
def test_mutated_transfers_never_crash_or_pass_more_than_python(frames, data):
    """Valid runs with bytes overwritten: sizes, counts and constructors from the wire lie."""
    buf = bytearray(b"".join(frames))
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x40, 0x41, 0x43, 0x45, 0x52, 0x70,
                                            0xA0, 0xB0, 0xC0, 0xD0, 0xFF, 0x7F]))
    buf = bytes(buf)
    args = (LIMIT, 0, 0, data.draw(st.sampled_from([-1, 60])),
            data.draw(st.sampled_from([None, b"alice"])), data.draw(deliveries))
    c_pos, c_n, c_delivery = _never_reads_outside(scan_c, buf, 0, len(buf), *args)
    py_pos, py_n, _ = scan_py(buf, 0, len(buf), *args)
    assert c_pos <= py_pos and c_n <= py_n
    assert scan_py(buf, 0, c_pos, *args) == (c_pos, c_n, c_delivery)


@pytest.mark.slow
def test_env_switch_turns_the_c_parts_off_at_import():
    code = "import amqp_policy_proxy.amqp.accel as a; print(a.scan is None, a.in_use())"
    env = {**os.environ, accel.DISABLE_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False"]
    env[accel.DISABLE_ENV] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(not accel.BUILT), str(accel.BUILT)]


@needs_c
def test_use_switches_every_c_part():
    """``accel.use(False)``: no scanner, every reader the Python one; ``use(True)``: the C
    parts."""
    body = Open(container_id="c", hostname="h").encode()
    with scanners("python"):
        assert not accel.in_use() and accel.scan is None and accel.scan_router is None
        assert accel.read_open_head(body) == read_open_head_py(body)
        accel.use(True)
        assert accel.in_use() and accel.scan is scan_c
        assert accel.scan_router is accel.scan_router_c
        assert accel.read_open_head(body) == read_open_head_py(body)


@pytest.mark.skipif(accel.BUILT, reason="the C extension is built")
def test_use_true_is_refused_without_the_extension():
    with pytest.raises(RuntimeError, match="_relayscan is not built"):
        accel.use(True)
    assert not accel.in_use()


def test_proton_encoded_transfer_is_passed_by_both():
    body = Transfer(handle=0, delivery_id=5, delivery_tag=b"tag", message_format=0,
                    settled=True, more=False).encode() + b"payload"
    buf = encode_frame(0, body) * 3
    assert scan_py(buf, 0, len(buf), LIMIT, 0, 0, -1) == (len(buf), 3, None)
    if scan_c is not None:
        assert scan_c(buf, 0, len(buf), LIMIT, 0, 0, -1, None, None) == (len(buf), 3, None)


# --- the message-head reader (``_relayscan.message_head`` behind ``accel.read_head``)

head_c = accel.message_head_c


def _python_head(buf: bytes, pos: int, end: int, last: bool) -> Any:
    """The Python reader's answer: the head as a plain tuple, or the DecodeError it raised."""
    try:
        return tuple(read_message_head(buf, pos, end, last=last))[:4]  # C reads no subject
    except DecodeError as exc:
        return exc


def _c_head_agrees(buf: bytes, pos: int, end: int, last: bool) -> Any:
    """Call the C reader (also on the same window with every byte outside it changed, and
    on a copy that stops at ``end``) and check that any answer it gives is Python's."""
    got = _never_reads_outside(head_c, buf, pos, end, last)
    if got is not None:
        assert got == _python_head(buf, pos, end, last)
    return got


@needs_c
@given(messages, st.booleans())
@settings(max_examples=300, deadline=None)
def test_c_head_answers_as_python_on_proton_messages(item, last):
    """On the messages real clients send, the C reader answers exactly as Python does, and
    answers at all whenever the head is plain (no annotations, ASCII text, list8)."""
    payload, fields = item
    got = _c_head_agrees(payload, 0, len(payload), last)
    user_id, to, message_id, subject, _, _, _, annotations, _, _ = fields
    texts = [to or "", subject or "", message_id if isinstance(message_id, str) else ""]
    if not annotations and all(t.isascii() for t in texts) and len(to or "") < 200:
        assert got is not None


@needs_c
@pytest.mark.parametrize("head", [
    "005373 c006 03 40 40 a10171",                 # to "q"
    "005373 c008 03 40 40 a103710061",             # to "q\\0a": NUL (Python refuses)
    "005373 c009 02 40 a005616c696365",            # user-id "alice"
    "005373 c004 02 40 a000",                      # user-id empty
    "005373 c009 03 40 a005616c696365",            # count 3, two fields
    "005373 c008 02 40 a005616c696365",            # size one byte short
    "005370 45 005373 45",                         # empty header, properties
    "005370 c003 02 41 50 005373 45",              # priority (ubyte) cut by the size
    "005373 45 005370 45",                         # header after properties
    "005370 45 005370 45",                         # header twice
    "005372 c10100 005373 45",                     # annotations: Python reads
    "0080000000000000007345",                      # ulong descriptor
    "005373 c006 03 40 40 a101c3",                 # to: a lone UTF-8 lead byte
    "005373 c007 03 40 40 a102c3bc",               # to "ü": UTF-8, not ASCII
    "005373",                                      # cut after the descriptor
])
@pytest.mark.parametrize("tail", ["", "005377a1017a", "0053"])
@pytest.mark.parametrize("last", [True, False])
def test_c_head_hand_written(head, tail, last):
    """Heads proton does not write: wherever the C reader answers, it answers as Python."""
    payload = bytes.fromhex((head + tail).replace(" ", ""))
    _c_head_agrees(payload, 0, len(payload), last)


@pytest.mark.slow
@needs_c
@given(st.binary(max_size=200), st.data())
@settings(max_examples=1000, deadline=None)
def test_c_head_on_random_and_mutated_bytes(raw, data):
    """Random bytes, and proton's heads with bytes overwritten and cut anywhere: the C reader
    never crashes, never reads outside the window, and only ever answers as Python does."""
    payload, _ = data.draw(messages)
    buf = bytearray(data.draw(st.sampled_from([b"", payload])) + raw)
    for _ in range(data.draw(st.integers(0, 3)) if buf else 0):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x40, 0x45, 0x53, 0x70, 0x73, 0x77, 0xA0,
                                            0xA1, 0xC0, 0xD0, 0xFF]))
    pos = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(pos, len(buf)))
    _c_head_agrees(bytes(buf), pos, end, data.draw(st.booleans()))


def test_read_head_is_the_python_reader_with_or_without_the_extension(c_parts):
    """``accel.read_head`` gives the Python reader's result (with or without the C reader)
    and raises what it raises."""
    plain = bytes.fromhex("005373c0060340 40a10171 005377a1017a".replace(" ", ""))
    assert accel.read_head(plain, 0, len(plain), last=True) == read_message_head(
        plain, 0, len(plain), last=True)
    assert accel.read_head(plain, 0, len(plain), last=True).to == "q"
    bad = bytes.fromhex("005373c0080340 40a103710061".replace(" ", ""))
    with pytest.raises(DecodeError):
        accel.read_head(bad, 0, len(bad), last=True)


# --- the router-side walker (``_relayscan.scan_router`` against ``scan_router_py``)

scan_router_c = accel.scan_router_c
_DISPOSITION = _frame(0, Disposition(role=False, first=0, last=3, settled=True).encode())
_FLOW = _frame(1, bytes.fromhex("005313c00c05434370000003e8437000000064"))
router_frames = st.one_of(
    st.builds(lambda ch, did: _frame(ch, _transfer(0, did, b"t", payload=b"x" * 20)),
              st.integers(0, 3), st.integers(0, 300)),
    st.just(_DISPOSITION), st.just(_FLOW), st.just(HEARTBEAT),
    st.just(_frame(0, bytes.fromhex("00800000000000000014c0020140"))),  # ulong descriptor
    st.just(_frame(0, Transfer(handle=0, delivery_id=1).encode(), doff=3)),  # extended header
)


def _router_agrees(buf: bytes, pos: int, end: int, limit: int) -> tuple[int, int]:
    """The C walker's answer, which must be the Python statement's, and must not change when
    the bytes outside the window do (or when the buffer stops at ``end``)."""
    got = _never_reads_outside(scan_router_c, buf, pos, end, limit)
    assert got == scan_router_py(buf, pos, end, limit)
    return got


@needs_c
@given(st.lists(router_frames, min_size=1, max_size=8), st.data())
@settings(max_examples=400, deadline=None)
def test_router_walker_same_as_python_on_router_streams(frames, data):
    """Runs of what a router sends: the C walker passes exactly what the Python statement
    passes (Transfers and Dispositions with the short descriptor, heartbeats), cut anywhere."""
    buf = b"".join(frames)
    end = data.draw(st.integers(0, len(buf)))
    limit = data.draw(st.sampled_from([65536, 40, 0x40FFFFFF]))
    pos, transfers = _router_agrees(buf, 0, end, limit)
    # the run stops at the first frame that is not passed, or at a partial one
    passed = 0
    expected_pos = 0
    for f in frames:
        if expected_pos + len(f) > end or len(f) > limit:
            break
        body = f[f[4] * 4:]
        if body and not (body[:2] == b"\x00\x53" and body[2] in (0x14, 0x15)):
            break
        passed += body[:3] == b"\x00\x53\x14"
        expected_pos += len(f)
    assert (pos, transfers) == (expected_pos, passed)


@pytest.mark.slow
@needs_c
@given(st.binary(max_size=300), st.data())
@settings(max_examples=500, deadline=None)
def test_router_walker_on_random_and_mutated_bytes(raw, data):
    frames = data.draw(st.lists(router_frames, max_size=4))
    buf = bytearray(b"".join(frames) + raw)
    for _ in range(data.draw(st.integers(0, 3)) if buf else 0):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x08, 0x14, 0x15, 0x53, 0xFF]))
    pos = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(pos, len(buf)))
    _router_agrees(bytes(buf), pos, end, data.draw(st.sampled_from([65536, 20, 0x40FFFFFF])))


def test_router_walker_stops_where_the_loop_must_look():
    t = _frame(0, _transfer(0, 1, b"t"))
    assert scan_router_py(t + HEARTBEAT + _DISPOSITION + _FLOW + t, 0, 10**6, 65536) == (
        len(t + HEARTBEAT + _DISPOSITION), 1)
    assert scan_router_py(t + t, 0, len(t) * 2 - 1, 65536) == (len(t), 1)  # partial
    assert scan_router_py(t, 0, len(t), len(t) - 1) == (0, 0)  # over the limit
    if scan_router_c is not None:
        with pytest.raises(TypeError):
            scan_router_c(t, 0, len(t))


@needs_c
def test_a_multi_frame_delivery_is_carried_across_frames_and_calls():
    """The frames of a multi-frame delivery pass while the delivery stays within max_size;
    the state comes back to the caller and goes on in the next call (Part 2 §2.6.12)."""
    first = _frame(0, _transfer(0, 9, b"t", count=6, settled=False, more=True, payload=b"a" * 40))
    middle = _frame(0, _transfer(0, None, None, count=6, settled=True, more=True,
                                 payload=b"b" * 40))
    last = _frame(0, _transfer(0, None, None, count=6, settled=False, more=False,
                               payload=b"c" * 40))
    whole = _frame(0, _transfer(0, 10, b"u"))
    buf = first + HEARTBEAT + middle
    assert _both(buf, 0, len(buf)) == ((len(buf), 2, (80, 9, True)),) * 2
    buf = last + whole
    assert _both(buf, 0, len(buf), delivery=(80, 9, True)) == ((len(buf), 2, None),) * 2
    # over max_size on its third frame: stops there, the delivery as it stood before it
    buf = first + middle + last
    stop = len(first + middle)
    assert _both(buf, 0, len(buf), max_size=100) == ((stop, 2, (80, 9, True)),) * 2
    # a later frame's own size counts with what came before
    assert _both(last, 0, len(last), max_size=100, delivery=(61, None, False)) == (
        (0, 0, (61, None, False)),) * 2


@needs_c
def test_user_id_check_leaves_the_first_frame_of_a_multi_frame_delivery_to_python():
    """With QDR's user-id check its head may not be whole in the first frame: Python decides;
    the later frames of a delivery Python let through need no check."""
    first = _frame(0, _transfer(0, 1, b"t", count=6, more=True, payload=b"x" * 10))
    last = _frame(0, _transfer(0, None, None, count=6, more=False, payload=b"y" * 10))
    assert scan_c(first, 0, len(first), LIMIT, 0, 0, -1, b"alice", None) == (0, 0, None)
    assert scan_py(first, 0, len(first), LIMIT, 0, 0, -1, b"alice") == (0, 0, None)
    assert scan_c(last, 0, len(last), LIMIT, 0, 0, -1, b"alice", (10, 1, True)) == (
        len(last), 1, None)


# --- the Open reader (``_relayscan.open_head`` behind ``accel.read_open_head``)

open_head_c = accel.open_head_c


def _c_open_agrees(body: bytes, strict: bool) -> Any:
    """Call the C reader and check that any answer it gives is the Python reader's (and that
    it reads nothing past the body: the same answer on a copy with bytes after it)."""
    got = open_head_c(body, strict)
    assert open_head_c(bytearray(body), strict) == got
    if got is not None:
        py = read_open_head_py(body, strict=strict)
        assert py is not None and tuple(py) == got
    return got


#: Opens as proton encodes them (hostnames long enough for a str32 included).
proton_opens = opens


@needs_c
@given(proton_opens, st.booleans())
@settings(max_examples=400, deadline=None)
def test_c_open_answers_as_python_on_proton_opens(open_, strict):
    """On the Opens proton encodes, the C reader answers exactly as Python does, and answers
    at all wherever Python does (no described field in them)."""
    body = open_.encode()
    got = _c_open_agrees(body, strict)
    assert (got is None) == (read_open_head_py(body, strict=strict) is None)


@needs_c
@pytest.mark.parametrize("body, answers", [
    ("005310 c00502 a1016340", "both"),                       # container-id "c", hostname null
    ("005310 c00401 a10163", "both"),                         # container-id only
    ("005310 c00100", ""),                                    # no field: Python refuses
    ("005310 45", ""),                                        # list0
    ("005310 d000000007 00000001 a10163", "both"),            # list32
    ("005310 d000000006 00000001 a10163", ""),                # list32 one byte short
    ("005310 c00502 a1016340 40", ""),                        # a byte after the list
    ("005310 c00402 a10163", ""),                             # count 2, one field
    ("005310 c00601 a1016340", ""),                           # count 1, two fields
    ("005310 c00501 a3016340", ""),                           # container-id a symbol
    ("005310 c00401 a101c3", ""),                             # container-id not UTF-8
    ("005310 c00501 a1020061", "relaxed"),                    # container-id with a NUL
    ("005310 c00a03 a10163 40 7000000100", "both"),           # max-frame-size uint
    ("005310 c00703 a10163 40 80", ""),                       # max-frame-size cut
    ("005310 c00e03 a10163 40 800000000000000100", ""),       # max-frame-size a ulong
    ("005310 c00904 a10163 40 40 6000ff", "both"),            # channel-max ushort
    ("005310 c00804 a10163 40 40 52ff", ""),                  # channel-max a smalluint
    ("005310 c00905 a10163 40 40 40 5201", "both"),           # idle-time-out smalluint
    ("005310 c00905 a10163 40 40 40 a000", "relaxed"),        # idle-time-out binary
    ("005310 c00906 a10163 40 40 40 40 45", "relaxed"),       # outgoing-locales list0
    ("005310 c00e06 a10163 40 40 40 40 e00401a30161", "relaxed"),  # outgoing-locales array8
    ("005310 c00c06 a10163 40 40 40 40 00530145", ""),        # a described field: Python's
    ("005310 c00e0b a10163 40 40 40 40 40 40 40 40 40 40", ""),  # eleven fields
    ("005310 c00d0a a10163 40 40 40 40 40 40 40 40 40", "both"),  # ten fields
    ("005311 c00502 a1016340", ""),                           # a Begin
    ("0053", ""),                                             # cut
])
@pytest.mark.parametrize("strict", [True, False])
def test_c_open_hand_written(body, answers, strict):
    """Opens proton does not write: wherever the C reader answers, it answers as Python;
    ``answers`` says where it does (both modes, only the relaxed one, or neither)."""
    got = _c_open_agrees(bytes.fromhex(body.replace(" ", "")), strict)
    assert (got is not None) == (answers == "both" or (answers == "relaxed" and not strict))


@pytest.mark.slow
@needs_c
@given(proton_opens, st.binary(max_size=60), st.data())
@settings(max_examples=1000, deadline=None)
def test_c_open_on_random_and_mutated_bytes(open_, raw, data):
    """Proton's Opens with bytes overwritten, cut or grown, and random bytes: the C reader
    never crashes and only ever answers as Python does."""
    buf = bytearray(data.draw(st.sampled_from([b"", open_.encode()])) + raw)
    for _ in range(data.draw(st.integers(0, 3)) if buf else 0):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x05, 0x10, 0x40, 0x45, 0x52, 0x53,
                                            0x60, 0x70, 0xA1, 0xB1, 0xC0, 0xD0, 0xFF]))
    cut = data.draw(st.integers(0, len(buf)))
    _c_open_agrees(bytes(buf[:cut]), data.draw(st.booleans()))


def test_read_open_head_is_the_python_reader_with_or_without_the_extension(c_parts):
    """``accel.read_open_head`` gives the Python reader's answer, an :class:`OpenHead`."""
    body = Open(container_id="c", hostname="h", max_frame_size=512, channel_max=7).encode()
    got = accel.read_open_head(body)
    assert isinstance(got, OpenHead) and got == read_open_head_py(body)
    assert got.hostname == "h" and got.fields == ([12, 15, 18, 23], 26)
    assert accel.read_open_head(b"\x00\x53\x10\x45") is None


# --- the Transfer-field reader (``_relayscan.transfer_fields`` behind ``accel.read_fields``)

fields_c = accel.transfer_fields_c


def _python_fields(buf: bytes, pos: int, end: int) -> Any:
    """The Python reader's answer, or the DecodeError it raised."""
    try:
        return read_transfer_fields(buf, pos, end)
    except DecodeError as exc:
        return exc


def _c_fields_agree(buf: bytes, pos: int, end: int) -> Any:
    """Call the C reader (also with every byte outside ``buf[pos:end]`` changed, and on a copy
    that stops at ``end``) and check that any answer it gives is Python's."""
    got = _never_reads_outside(fields_c, buf, pos, end)
    if got is not None:
        assert got == _python_fields(buf, pos, end)
    return got


@needs_c
@given(st.lists(st.one_of(plain, other, headed), min_size=1, max_size=4))
@settings(max_examples=500, deadline=None)
def test_c_fields_answer_as_python_on_client_encodings(frames):
    """On the Transfers clients send (hand-written in their encodings, and proton's), the C
    reader answers exactly as Python does, and answers for every proton-encoded one."""
    buf = b"".join(frames)
    pos = 0
    for one in frames:
        size = int.from_bytes(one[:4], "big")
        body, fend = pos + one[4] * 4, pos + size
        if fend - body > 3 and buf[body:body + 3] == b"\x00\x53\x14":
            _c_fields_agree(buf, body, fend)
        pos += size


@needs_c
@given(st.builds(Transfer, handle=st.integers(0, 2**32 - 1),
                 delivery_id=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
                 delivery_tag=st.one_of(st.none(), st.binary(max_size=32)),
                 message_format=st.one_of(st.none(), st.just(0)),
                 settled=st.one_of(st.none(), st.booleans()),
                 more=st.one_of(st.none(), st.booleans())))
@settings(max_examples=300, deadline=None)
def test_c_fields_answer_every_proton_transfer(perf):
    body = perf.encode() + b"payload"
    assert _c_fields_agree(body, 0, len(body)) is not None


@pytest.mark.slow
@needs_c
@given(st.binary(max_size=120), st.data())
@settings(max_examples=1000, deadline=None)
def test_c_fields_on_random_and_mutated_bytes(raw, data):
    """Random bytes after a Transfer descriptor, and client Transfers with bytes overwritten
    and cut anywhere: the C reader never crashes, never reads outside its window, and only
    ever answers as Python does."""
    lead = data.draw(st.sampled_from([b"\x00\x53\x14", _transfer(0, 1, b"t", count=6),
                                      _transfer(300, None, None, count=3, list32=True)]))
    buf = bytearray(lead + raw)
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x06, 0x40, 0x41, 0x42, 0x43,
                                            0x52, 0x53, 0x56, 0x70, 0xA0, 0xB0, 0xC0, 0xD0]))
    end = data.draw(st.integers(0, len(buf)))
    _c_fields_agree(bytes(buf), 0, end)


@needs_c
@pytest.mark.parametrize("fields, answers", [
    ("c00b06 52 07 52 03 a0 01 74 43 41 42", True),       # handle 7, id 3, tag "t", settled
    ("c00201 43", True),                                    # handle only
    ("c00302 43 40", True),                                 # delivery-id null
    ("d00000000a00000002 43 7000000009", True),             # list32, 32-bit delivery-id
    ("c00201 40", False),                                   # null handle: Python refuses
    ("c00202 43", False),                                   # count 2, one field
    ("c00403 43 43 b0", False),                             # binary32 tag: Python's
    ("c00706 43 43 40 43 56 01", False),                    # 0x56 boolean: Python's
    ("c00c0a 43 43 40 43 42 42 40 40 40 41", False),        # aborted (10 fields): Python's
    ("45", False),                                          # list0
])
def test_c_fields_hand_written(fields, answers):
    body = bytes.fromhex("005314" + fields.replace(" ", "")) + b"payload"
    got = _c_fields_agree(body, 0, len(body))
    assert (got is not None) == answers
    if got is not None:
        assert got[5] == len(body) - len(b"payload")


def test_read_fields_is_the_python_reader_with_or_without_the_extension(c_parts):
    body = _transfer(7, 3, b"tag", count=6, settled=False, more=True) + b"x"
    assert accel.read_fields(body, 0, len(body)) == read_transfer_fields(body, 0, len(body))
    assert accel.read_fields(body, 0, len(body))[:4] == (7, 3, False, True)
    with pytest.raises(DecodeError):
        accel.read_fields(b"\x00\x53\x14\xc0\x02\x01\x40", 0, 7)


# --- the SASL readers (``_relayscan.sasl_init``, ``_relayscan.sasl_mechanisms``)

sasl_init_c = accel.sasl_init_c
sasl_mechanisms_c = accel.sasl_mechanisms_c


def _c_sasl_agrees(body: bytes, pos: int, end: int) -> tuple[Any, Any]:
    """Call both C readers (also on the same window with every byte outside it changed) and
    check that each answer they give is the Python reader's."""
    init = _never_reads_outside(sasl_init_c, body, pos, end)
    if init is not None:
        assert init == read_sasl_init_py(body, pos, end)
    mechanisms = _never_reads_outside(sasl_mechanisms_c, body, pos, end)
    assert mechanisms in (None, True)
    if mechanisms:
        assert is_sasl_mechanisms_py(body, pos, end)
    return init, mechanisms


sasl_inits = st.builds(
    SaslInit,
    mechanism=st.sampled_from(["PLAIN", "ANONYMOUS", "SCRAM-SHA-256", "EXTERNAL"]).map(symbol),
    initial_response=st.one_of(st.none(), st.binary(max_size=300)),
    hostname=st.one_of(st.none(), st.text(max_size=20)),
)
sasl_mechanism_lists = st.builds(
    lambda names: SaslMechanisms(sasl_server_mechanisms=symbol_array(names)),
    st.lists(st.sampled_from(["ANONYMOUS", "PLAIN", "EXTERNAL", "SCRAM-SHA-1"]), min_size=1,
             max_size=4),
)


@needs_c
@given(sasl_inits)
@settings(max_examples=300, deadline=None)
def test_c_sasl_init_answers_as_python_on_proton_inits(perf):
    """On the sasl-inits proton encodes, the C reader answers as Python does, and answers
    whenever the hostname is ASCII."""
    body = perf.encode()
    init, _ = _c_sasl_agrees(body, 0, len(body))
    if (perf.hostname or "").isascii():
        assert init is not None


@needs_c
@given(sasl_mechanism_lists)
@settings(max_examples=100, deadline=None)
def test_c_sasl_mechanisms_answers_on_proton_mechanisms(perf):
    body = perf.encode()
    _, mechanisms = _c_sasl_agrees(body, 0, len(body))
    assert mechanisms is True


@pytest.mark.slow
@needs_c
@given(st.one_of(sasl_inits, sasl_mechanism_lists), st.binary(max_size=40), st.data())
@settings(max_examples=1000, deadline=None)
def test_c_sasl_readers_on_random_and_mutated_bytes(perf, raw, data):
    """Proton's sasl-inits and sasl-mechanisms with bytes overwritten, cut or grown, and
    random bytes: the C readers never crash, never read outside their window, and only ever
    answer as Python does."""
    buf = bytearray(data.draw(st.sampled_from([b"", perf.encode()])) + raw)
    for _ in range(data.draw(st.integers(0, 3)) if buf else 0):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x40, 0x41, 0x45, 0x53, 0x80, 0xA0,
                                            0xA1, 0xA3, 0xB0, 0xB3, 0xC0, 0xD0, 0xE0, 0xFF]))
    pos = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(pos, len(buf)))
    _c_sasl_agrees(bytes(buf), pos, end)


def test_sasl_readers_are_the_python_readers_with_or_without_the_extension():
    body = SaslInit(mechanism=symbol("PLAIN"), initial_response=b"\0u\0p").encode()
    assert accel.read_sasl_init(body, 0, len(body)) == ("PLAIN", b"\0u\0p")
    assert accel.read_sasl_init(body, 0, len(body)) == read_sasl_init_py(body, 0, len(body))
    mechs = SaslMechanisms(sasl_server_mechanisms=symbol_array(["PLAIN"])).encode()
    assert accel.is_sasl_mechanisms(mechs, 0, len(mechs)) is True
    assert accel.is_sasl_mechanisms(body, 0, len(body)) is False


def _sym32(code: int, data: bytes, length: int | None = None) -> bytes:
    return bytes([code]) + (len(data) if length is None else length).to_bytes(4, "big") + data


def _list32(code: int, items: list[bytes]) -> bytes:
    content = b"".join(items)
    return (b"\x00\x53" + bytes([code]) + b"\xd0" + (len(content) + 4).to_bytes(4, "big")
            + len(items).to_bytes(4, "big") + content)


#: 32-bit lengths a 32-bit Py_ssize_t (i386, armv7 builds) would read as negative: the C
#: readers once cast them before comparing them with the room left, so that a sasl-init's
#: field could end before it started (the next field read at an earlier offset) and a
#: sasl-mechanisms' sym32 loop could step before the buffer.
NEGATIVE_ON_32_BITS = [0x80000000, 0xC0000000, 0xFFFFFFF0, 0xFFFFFFFB, 0xFFFFFFFF]


@needs_c
@pytest.mark.parametrize("length", NEGATIVE_ON_32_BITS)
@pytest.mark.parametrize("field", [0, 1, 2])
def test_c_sasl_init_refuses_32_bit_lengths_past_the_body(length, field):
    """A sasl-init whose mechanism (sym32), initial-response (vbin32) or hostname (str32)
    claims a length of 2**31 or more, behind bytes a backward step would land on: no answer
    from C (Python refuses it too), whatever the width of Py_ssize_t."""
    items = [_sym32(0xB3, b"PLAIN"), _sym32(0xB0, b"\0alice\0pw"), _sym32(0xB1, b"test")]
    items[field] = items[field][:1] + length.to_bytes(4, "big") + items[field][5:]
    prefix = b"\x40\xa0\x00" * 20  # a null and an empty vbin8 to land on
    buf = prefix + _list32(0x41, items)
    assert _c_sasl_agrees(buf, len(prefix), len(buf)) == (None, None)
    assert read_sasl_init_py(buf, len(prefix), len(buf)) is None
    good = prefix + _list32(0x41, [_sym32(0xB3, b"PLAIN"), _sym32(0xB0, b"\0alice\0pw"),
                                   _sym32(0xB1, b"test")])
    assert sasl_init_c(good, len(prefix), len(good)) == ("PLAIN", b"\0alice\0pw")


@needs_c
@pytest.mark.parametrize("length", NEGATIVE_ON_32_BITS)
def test_c_sasl_mechanisms_refuses_32_bit_lengths_past_the_body(length):
    """An array32 of sym32 whose first name claims a length of 2**31 or more, and a lone
    sym32 that does: no answer from C, and no step before the array."""
    names = length.to_bytes(4, "big") + b"PLAIN" + (5).to_bytes(4, "big") + b"PLAIN"
    array = b"\xf0" + (len(names) + 5).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\xb3"
    for body in (_list32(0x40, [array + names]), _list32(0x40, [_sym32(0xB3, b"PLAIN", length)])):
        buf = b"\xb3\x00\x00\x00\x00" * 8 + body
        assert _c_sasl_agrees(buf, 40, len(buf)) == (None, None)
        assert not is_sasl_mechanisms_py(buf, 40, len(buf))
