"""Performatives decode from real captured bytes (python-qpid-proton 0.40 client) and re-encode."""

import pytest

from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.performatives import Attach, Begin, Open, decode_performative


def test_open_decodes_with_spec_field_names():
    body = Open(container_id="c", hostname="vh", max_frame_size=16384, channel_max=9,
                idle_time_out=60000).encode()
    perf, n = decode_performative(body)
    assert isinstance(perf, Open) and n == len(body)
    assert (perf.container_id, perf.hostname, perf.max_frame_size, perf.channel_max,
            perf.idle_time_out) == ("c", "vh", 16384, 9, 60000)


def test_begin_and_attach_round_trip_bytes():
    for perf in (Begin(next_outgoing_id=0, incoming_window=2147483647, outgoing_window=1),
                 Attach(name="x", handle=0, role=True)):
        data = perf.encode()
        assert decode_performative(data)[0].encode() == data


def test_composite_with_a_non_list_body_is_a_decode_error():
    # Found by fuzz_framing (regression framing/source-described-body-f54066d1): an Attach
    # whose source (0x28) held a described target instead of a list decoded, and re-encoding
    # it through proton did not give the same fields back.
    import pytest

    from amqp_policy_proxy.amqp.errors import DecodeError
    from amqp_policy_proxy.amqp.performatives import decode_performative

    attach = bytes.fromhex(
        "005312d00000001400000006a1016e43425002500000532800532945")  # source = 0x28(0x29(list0))
    with pytest.raises(DecodeError, match="expected a list body"):
        decode_performative(attach)


def test_a_deeply_nested_router_frame_is_a_decode_error_not_a_recursion_error():
    # issue 14 finding 10: proton's Python decoder recursed into RecursionError, which
    # escaped the core as an internal error with a 155 KB traceback per connection
    from amqp_policy_proxy.amqp.codec import decode_value

    value = b"\x45"
    for _ in range(5000):
        value = b"\xd0" + (len(value) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + value
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_value(value)
