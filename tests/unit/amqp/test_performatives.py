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


def test_each_field_is_declared_with_the_amqp_type_the_canonical_check_gives_it():
    # A composite names each field once, annotated with its AMQP type, and TYPES is derived
    # from the annotations; canonical.py lists the wire kinds of the same fields: they agree.
    import dataclasses

    from amqp_policy_proxy.amqp.canonical import COMPOSITE_FIELDS, PERFORMATIVE_FIELDS
    from amqp_policy_proxy.amqp.performatives import _REGISTRY

    wrapped = {"uint", "ushort", "ubyte", "ulong", "symbol"}
    for code, kinds in {**PERFORMATIVE_FIELDS, **COMPOSITE_FIELDS}.items():
        cls = _REGISTRY[code]
        names = [f.name for f in dataclasses.fields(cls)]
        assert len(names) == len(kinds), cls.__name__
        assert cls.TYPES == {n: k for n, k in zip(names, kinds, strict=True) if k in wrapped}
        assert cls.DESCRIPTOR == code


def test_a_field_annotated_with_no_amqp_type_is_refused():
    from amqp_policy_proxy.amqp.performatives import Composite, _composite

    with pytest.raises(TypeError, match="Bad.x: int is not an AMQP type"):
        @_composite(None)
        class Bad(Composite):
            x: "int"
