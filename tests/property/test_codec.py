"""Property tests of the wire codec (hypothesis): round trips, any split, garbage."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.errors import AmqpError
from amqp_policy_proxy.amqp.framing import FrameDecoder, encode_frame
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Flow,
    Open,
    Source,
    Target,
    Transfer,
    decode_performative,
)
from amqp_policy_proxy.amqp.transfer import read_transfer

u32 = st.integers(0, 2**32 - 1)
u16 = st.integers(0, 2**16 - 1)
text = st.text(max_size=40)
opt = st.one_of(st.none(), u32)

opens = st.builds(Open, container_id=text, hostname=st.one_of(st.none(), text),
                  max_frame_size=opt, channel_max=st.one_of(st.none(), u16),
                  idle_time_out=opt)
begins = st.builds(Begin, remote_channel=st.one_of(st.none(), u16), next_outgoing_id=u32,
                   incoming_window=u32, outgoing_window=u32, handle_max=opt)
attaches = st.builds(
    Attach, name=text, handle=u32, role=st.booleans(),
    source=st.one_of(st.none(), st.builds(Source, address=st.one_of(st.none(), text),
                                          dynamic=st.one_of(st.none(), st.booleans()))),
    target=st.one_of(st.none(), st.builds(Target, address=st.one_of(st.none(), text))),
    initial_delivery_count=opt,
)
flows = st.builds(Flow, next_incoming_id=opt, incoming_window=u32, next_outgoing_id=u32,
                  outgoing_window=u32, handle=opt, delivery_count=opt, link_credit=opt,
                  drain=st.one_of(st.none(), st.booleans()))
performatives = st.one_of(opens, begins, attaches, flows)


@given(performatives)
def test_encode_decode_round_trip(perf):
    data = perf.encode()
    back, consumed = decode_performative(data + b"trailing payload")
    assert consumed == len(data)
    assert back.encode() == data
    assert type(back) is type(perf)


@given(handle=u32, delivery_id=opt, tag=st.binary(max_size=300), settled=st.booleans(),
       more=st.booleans(), aborted=st.booleans(), payload=st.binary(max_size=200))
def test_fast_transfer_reader_agrees_with_proton(handle, delivery_id, tag, settled, more,
                                                 aborted, payload):
    t = Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0,
                 settled=settled, more=more, aborted=aborted)
    body = t.encode()
    frame = encode_frame(1, body + payload)
    hdr = read_transfer(frame, 8, len(frame))
    assert (hdr.handle, hdr.delivery_id, hdr.settled, hdr.more, hdr.aborted) == (
        handle, delivery_id, settled, more, aborted)
    assert frame[hdr.payload_offset:] == payload
    assert hdr.delivery_tag == tag


@given(st.lists(performatives, min_size=1, max_size=5), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_split_decodes_the_same_frames(perfs, data):
    stream = b"".join(encode_frame(i, p.encode()) for i, p in enumerate(perfs))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = FrameDecoder(1 << 20)
    frames = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        decoder.receive_data(stream[prev:cut])
        prev = cut
        while (f := decoder.next_frame()) is not None:
            frames.append(f)
    assert [f.raw for f in frames] == [encode_frame(i, p.encode()) for i, p in enumerate(perfs)]
    assert decoder.buffered == 0


@given(st.binary(max_size=600))
def test_garbage_raises_only_amqp_errors(data):
    decoder = FrameDecoder(512)
    try:
        decoder.receive_data(data)
        while (f := decoder.next_frame()) is not None:
            if f.body:
                decode_performative(f.body)
    except AmqpError:
        pass
