"""core/wire.py: the run of frames forwarded as they came, on both legs, and its write order."""

from __future__ import annotations

from amqp_policy_proxy.core.commands import CLIENT, ROUTER, SendData
from amqp_policy_proxy.core.state import RouterState, Sides
from amqp_policy_proxy.core.wire import Run, Wire

READ = bytes(range(40))


def _connected_wire() -> Wire:
    """A Wire whose router leg is connected and whose client leg is open."""
    sides = Sides()
    for state in (RouterState.CONNECTING, RouterState.AWAIT_HEADER, RouterState.SASL,
                  RouterState.AWAIT_AMQP_HEADER, RouterState.AMQP):
        sides.to_router(state)
    return Wire(sides, "proxy")


def _sent(wire: Wire) -> list[tuple[object, bytes]]:
    return [(c.side, bytes(c.data)) for c in wire.out if isinstance(c, SendData)]


def test_a_run_is_one_slice_of_the_read_and_empty_after_take():
    run = Run(READ)
    assert run.start == -1
    run.extend(4, 10)
    run.extend(10, 16)
    assert (run.start, run.end) == (4, 16)
    data = run.take(run.end)
    assert bytes(data) == READ[4:16]
    assert isinstance(data, memoryview)  # a view of the read, not a copy
    assert run.start == -1


def test_a_whole_read_is_handed_on_as_it_is():
    run = Run(READ)
    run.extend(0, len(READ))
    assert run.take(run.end) is READ


def test_a_mutable_buffer_is_copied_once():
    buf = bytearray(READ)
    run = Run(buf, 2)
    data = run.take(8)
    buf[2:8] = b"\xff" * 6  # the proxy's own buffers change after the call
    assert data == READ[2:8]


def test_the_client_run_goes_before_anything_else_written():
    wire = _connected_wire()
    previous = wire.begin_run(READ)
    wire.extend_run(0, 8)
    wire.extend_run(8, 12)
    wire.send(CLIENT, b"to-client")
    wire.extend_run(20, 24)
    wire.end_run(previous)
    assert _sent(wire) == [
        (ROUTER, READ[0:12]),
        (CLIENT, b"to-client"),
        (ROUTER, READ[20:24]),
    ]
    assert wire.run is previous


def test_a_nested_read_gets_its_own_run_and_gives_the_outer_one_back():
    wire = _connected_wire()
    outer = wire.begin_run(READ)
    wire.extend_run(0, 4)
    inner_previous = wire.begin_run(b"held-bytes")  # e.g. held bytes released inside a read
    wire.extend_run(0, 4)
    wire.end_run(inner_previous)
    wire.extend_run(4, 8)
    wire.end_run(outer)
    # the outer run is written before the nested read writes anything
    assert _sent(wire) == [(ROUTER, READ[0:4]), (ROUTER, b"held"), (ROUTER, READ[4:8])]
    assert wire.run is outer
