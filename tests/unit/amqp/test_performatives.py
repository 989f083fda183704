"""Performatives decode from real captured bytes (python-qpid-proton 0.40 client) and re-encode."""

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
