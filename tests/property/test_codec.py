"""Property tests of the wire codec (hypothesis): round trips, any split, garbage."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message

from amqp_policy_proxy.amqp.errors import AmqpError, DecodeError
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.message import read_message_head
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
from amqp_policy_proxy.amqp.transfer import (
    delivery_tag_at,
    read_transfer,
    read_transfer_fields,
)
from tests.support.frames import FrameDecoder

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


def _uint(value: int | None, form: int) -> bytes:
    """Encode a uint (or null) in one of the forms a peer may choose."""
    if value is None:
        return b"\x40"
    if value == 0 and form == 0:
        return b"\x43"
    if value < 256 and form == 1:
        return bytes([0x52, value])
    return b"\x70" + value.to_bytes(4, "big")


def _bool(value: bool | None, form: int) -> bytes:
    if value is None:
        return b"\x40"
    return bytes([0x56, int(value)]) if form == 2 else (b"\x41" if value else b"\x42")


@st.composite
def hand_encoded_transfers(draw):
    """Transfers encoded the ways real peers do (list8/list32, every uint/bool/binary form,
    trailing fields elided), with the expected reader result."""
    handle = draw(st.integers(0, 2**32 - 1))
    delivery_id = draw(st.one_of(st.none(), st.integers(0, 2**32 - 1)))
    tag = draw(st.one_of(st.none(), st.binary(max_size=300)))
    settled = draw(st.one_of(st.none(), st.booleans()))
    more = draw(st.one_of(st.none(), st.booleans()))
    aborted = draw(st.one_of(st.none(), st.booleans()))
    count = draw(st.integers(1, 11))
    forms = draw(st.lists(st.integers(0, 2), min_size=11, max_size=11))
    if tag is None:
        tag_bytes = b"\x40"
    elif len(tag) < 256 and forms[2] != 2:
        tag_bytes = bytes([0xA0, len(tag)]) + tag
    else:
        tag_bytes = b"\xb0" + len(tag).to_bytes(4, "big") + tag
    fields = [
        _uint(handle, forms[0]), _uint(delivery_id, forms[1]), tag_bytes,
        _uint(draw(st.one_of(st.none(), st.integers(0, 2**32 - 1))), forms[3]),
        _bool(settled, forms[4]), _bool(more, forms[5]),
        b"\x40" if forms[6] == 0 else b"\x50\x01",  # rcv-settle-mode
        b"\x40" if forms[7] == 0 else b"\x00\x53\x24\x45",  # state: accepted
        _bool(draw(st.one_of(st.none(), st.booleans())), forms[8]),  # resume
        _bool(aborted, forms[9]),
        _bool(draw(st.one_of(st.none(), st.booleans())), forms[10]),  # batchable
    ][:count]
    body = b"".join(fields)
    if len(body) + 1 < 256 and draw(st.booleans()):
        perf = b"\x00\x53\x14\xc0" + bytes([len(body) + 1, count]) + body
    else:
        perf = (b"\x00\x53\x14\xd0" + (len(body) + 4).to_bytes(4, "big")
                + count.to_bytes(4, "big") + body)
    expected = (
        handle,
        delivery_id if count > 1 else None,
        bool(settled) if count > 4 else False,
        bool(more) if count > 5 else False,
        bool(aborted) if count > 9 else False,
        tag if count > 2 else None,
    )
    return perf, expected


@given(hand_encoded_transfers(), st.binary(max_size=40))
def test_transfer_readers_agree_on_every_encoding(transfer, payload):
    perf, (handle, delivery_id, settled, more, aborted, tag) = transfer
    frame = encode_frame(0, perf + payload)
    hdr = read_transfer(frame, 8, len(frame))
    assert (hdr.handle, hdr.delivery_id, hdr.settled, hdr.more, hdr.aborted,
            hdr.delivery_tag) == (handle, delivery_id, settled, more, aborted, tag)
    fields = read_transfer_fields(frame, 8, len(frame))
    assert fields[:6] == (handle, delivery_id, settled, more, aborted, hdr.payload_offset)
    assert delivery_tag_at(frame, fields[6]) == tag
    assert frame[hdr.payload_offset:] == payload


def _outcome(reader, buf, end):
    try:
        result = reader(buf, 0, end)
    except AmqpError as exc:
        return type(exc), str(exc)
    if isinstance(result, tuple):
        return result[:6], delivery_tag_at(buf, result[6])
    return ((result.handle, result.delivery_id, result.settled, result.more, result.aborted,
             result.payload_offset), result.delivery_tag)


@given(hand_encoded_transfers(), st.data())
def test_transfer_readers_agree_on_damaged_frames(transfer, data):
    """Cut, flipped or spliced Transfers: the fast reader returns or raises what the reference
    reader does (and never anything but a DecodeError)."""
    perf, _ = transfer
    buf = bytearray(perf + data.draw(st.binary(max_size=8)))
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(3, len(buf) - 1))
        buf[i] = data.draw(st.sampled_from([0x00, 0x40, 0x41, 0x43, 0x52, 0x70, 0xA0, 0xB0,
                                            0xC0, 0xD0, 0xFF, data.draw(st.integers(0, 255))]))
    end = data.draw(st.integers(3, len(buf)))
    buf = bytes(buf[: data.draw(st.integers(end, len(buf)))])
    assert _outcome(read_transfer_fields, buf, end) == _outcome(read_transfer, buf, end)


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


messages = st.builds(
    Message,
    id=st.one_of(st.none(), st.text(max_size=20), st.integers(0, 2**63 - 1)),
    user_id=st.binary(max_size=300),
    address=st.one_of(st.none(), st.text(max_size=300)),
    subject=st.one_of(st.none(), st.text(max_size=10)),
    durable=st.booleans(), priority=st.integers(0, 9),
    annotations=st.one_of(st.none(), st.dictionaries(st.sampled_from(["x-opt-a", "x-opt-b"]),
                                                     st.integers(0, 9), max_size=2)),
    properties=st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.integers(0, 99),
                                                    max_size=2)),
    body=st.one_of(st.none(), st.binary(max_size=50), st.text(max_size=50)),
)


@given(messages, st.data())
def test_message_head_reads_what_proton_wrote(message, data):
    """Every message proton encodes is canonical: the head reader reads its ``to`` and
    ``user-id`` as proton does; cut anywhere or with bytes changed, it answers or raises
    ``DecodeError`` and nothing else."""
    encoded = bytearray(message.encode())
    head = read_message_head(bytes(encoded), 0, len(encoded), last=True)
    assert head.complete
    assert head.to == message.address
    assert (head.user_id or b"") == message.user_id
    assert head.router_annotations is False
    for _ in range(data.draw(st.integers(0, 2))):
        i = data.draw(st.integers(0, len(encoded) - 1))
        encoded[i] = data.draw(st.sampled_from([0x00, 0x40, 0x45, 0x53, 0x70, 0x73, 0xA0,
                                                0xA1, 0xB0, 0xC0, 0xD0, 0xFF]))
    end = data.draw(st.integers(0, len(encoded)))
    try:
        read_message_head(bytes(encoded), 0, end, last=data.draw(st.booleans()))
    except DecodeError:
        pass
