"""Canonical encodings (decision 0005): what is accepted is read the same by every peer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.amqp.canonical import MAX_DEPTH, check_performative, check_value
from amqp_policy_proxy.amqp.codec import decode_value, encode_value, symbol
from amqp_policy_proxy.amqp.errors import DecodeError
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    Error,
    Flow,
    Open,
    SaslInit,
    Source,
    Target,
    Transfer,
)
from tests.support import hostile


def check(hexbytes: str) -> int:
    buf = bytes.fromhex(hexbytes.replace(" ", ""))
    return check_value(buf, 0, len(buf))


class TestValues:
    @pytest.mark.parametrize("hexbytes", [
        "40", "41", "42", "5600", "5601", "43", "52ff", "7000000001", "a100", "a3026162",
        "c00100", "c0020141", "c10100", "c1030241 42", "d00000000400000000",
        "e00402 52 01 02", "e006 02a3 0161 0162", "0053 28 45", "00a3 03 616263 40",
    ])
    def test_canonical_values_pass(self, hexbytes):
        assert check(hexbytes) == len(bytes.fromhex(hexbytes.replace(" ", "")))

    @pytest.mark.parametrize(("hexbytes", "why"), [
        ("5602", "boolean encoded as 2"),
        ("c00106", "count and size disagree"),  # finding 3's name
        ("c0020241", "count and size disagree"),
        ("c0020241 42", "count and size disagree"),  # the second element is past the size
        ("c1020141", "odd number"),
        ("c00000", "size smaller than its count"),
        ("e0020140", "element constructor 0x40"),
        ("e00201 41", "element constructor 0x41"),
        ("0000530153 02", "not a ulong or a symbol"),
        ("005301 005302 40", "whose value is described"),
        ("00a1 01 61 40", "not a ulong or a symbol"),
        ("ff", "invalid constructor"),
        ("a1 02 c3 28", "not UTF-8"),
        ("a3 01 ff", "not ASCII"),
        ("a1 05 61", "truncated"),
    ])
    def test_ambiguous_values_are_refused(self, hexbytes, why):
        with pytest.raises(DecodeError, match=why):
            check(hexbytes)

    def test_nesting_is_bounded_without_recursion_errors(self):
        value = encode_value([[[]]])
        assert check_value(value, 0, len(value)) == len(value)
        deep = b"\x45"
        for _ in range(5000):
            deep = b"\xc0" + bytes([len(deep) + 1 if len(deep) < 254 else 0]) + b"\x01" + deep
        with pytest.raises(DecodeError):
            check_value(deep, 0, len(deep))
        nested = b"\x45"
        for _ in range(MAX_DEPTH + 1):
            nested = b"\xd0" + (len(nested) + 4).to_bytes(4, "big") + b"\0\0\0\x01" + nested
        with pytest.raises(DecodeError, match="nested too deeply"):
            check_value(nested, 0, len(nested))


values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**31, 2**31 - 1), st.text(max_size=8),
              st.binary(max_size=8), st.builds(symbol, st.text("abcxyz", max_size=5))),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.builds(symbol, st.text("ab", max_size=3)),
                                            inner, max_size=3)),
    max_leaves=12,
)


@given(values, st.data())
@settings(max_examples=400, deadline=None)
def test_what_proton_encodes_is_canonical_and_mutations_never_read_two_ways(value, data):
    """Proton's encodings pass; a mutated one is either refused or decoded by proton (count
    driven) to a value that ends exactly where the size-driven check says it ends."""
    encoded = bytearray(encode_value(value))
    assert check_value(encoded, 0, len(encoded)) == len(encoded)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(encoded) - 1))
        encoded[i] = data.draw(st.integers(0, 255))
    buf = bytes(encoded)
    try:
        end = check_value(buf, 0, len(buf))
    except DecodeError:
        return
    try:
        _, consumed = decode_value(buf[:end])
    except DecodeError:
        # well-formed, but proton's Python decoder cannot build it (a map keyed by a binary:
        # an unhashable memoryview; a char beyond U+10FFFF; an array count too large for a C
        # int): refused, so not read two ways either
        return
    assert consumed == end


performatives = st.one_of(
    st.builds(Open, container_id=st.text(max_size=10), hostname=st.one_of(st.none(),
                                                                             st.text(max_size=5))),
    st.builds(Begin, next_outgoing_id=st.integers(0, 2**32 - 1), incoming_window=st.just(10),
              outgoing_window=st.just(10), handle_max=st.one_of(st.none(), st.just(7))),
    st.builds(Attach, name=st.text(max_size=10), handle=st.integers(0, 2**32 - 1),
              role=st.booleans(), snd_settle_mode=st.one_of(st.none(), st.integers(0, 2)),
              source=st.one_of(st.none(), st.builds(Source, address=st.text(max_size=5),
                                                    dynamic=st.booleans())),
              target=st.one_of(st.none(), st.builds(Target, address=st.text(max_size=5))),
              initial_delivery_count=st.one_of(st.none(), st.just(0))),
    st.builds(Flow, incoming_window=st.just(1), next_outgoing_id=st.just(1),
              outgoing_window=st.just(1), handle=st.one_of(st.none(), st.just(3)),
              link_credit=st.one_of(st.none(), st.integers(0, 2**32 - 1)), drain=st.booleans()),
    st.builds(Transfer, handle=st.integers(0, 9), delivery_id=st.integers(0, 2**32 - 1),
              delivery_tag=st.binary(max_size=8), more=st.booleans(), settled=st.booleans()),
    st.builds(Disposition, role=st.booleans(), first=st.just(1), settled=st.booleans()),
    st.builds(Detach, handle=st.just(1), closed=st.booleans(),
              error=st.one_of(st.none(), st.builds(Error, condition=st.just("amqp:x"),
                                                  description=st.text(max_size=5)))),
    st.builds(Close),
    st.builds(SaslInit, mechanism=st.just("PLAIN"),
              initial_response=st.one_of(st.none(), st.binary(max_size=10))),
)


@given(performatives)
@settings(max_examples=300, deadline=None)
def test_every_performative_the_codec_writes_is_canonical(perf):
    body = perf.encode()
    names = ("name", "container_id", "hostname")
    if any("\x00" in (getattr(perf, n, "") or "") for n in names):
        return  # a NUL in a compared name is refused on purpose
    for t in (getattr(perf, "source", None), getattr(perf, "target", None)):
        if t is not None and "\x00" in (t.address or ""):
            return
    code, lend, offsets = check_performative(body, 0, len(body))
    assert code == perf.DESCRIPTOR and lend == len(body)


class TestPerformatives:
    def body(self, frame: bytes) -> bytes:
        return frame[8:]

    @pytest.mark.parametrize(("frame", "why"), [
        (hostile.shadow_attach(0, 0, shown="public.d", hidden="secret"), "field 0 is not a string"),
        (hostile.attach_count_exceeds_size(0, 0, shown="a"), "count and size disagree"),
        (hostile.attach_unknown_target_descriptor(0, 0, "a"), "descriptor"),
        (hostile.attach_ubyte_dynamic(0, 0, "a"), "source field 4 is not a boolean"),
        (hostile.attach_ubyte_role(0, 0, "a"), "attach field 2 is not a boolean"),
        (hostile.transfer_hidden_more(0, 0, 0, b""), "count and size disagree"),
        (hostile.sasl_init_count_exceeds_size("admin", "m", "pw"), "count and size disagree"),
    ])
    def test_findings_are_refused(self, frame, why):
        body = self.body(frame)
        with pytest.raises(DecodeError, match=why):
            check_performative(body, 0, len(body))

    def test_symbolic_performative_descriptors_are_refused(self):
        body = b"\x00\xa3\x0eamqp:open:list" + encode_value(["c"])
        with pytest.raises(DecodeError, match="unknown performative"):
            check_performative(body, 0, len(body))

    def test_symbolic_source_descriptor_is_accepted(self):
        source = b"\x00\xa3\x10amqp:source:list\xc0\x03\x01\xa1\x00"
        fields = b"\xa1\x01n\x43\x41\x40\x40" + source
        body = b"\x00\x53\x12\xc0" + bytes([len(fields) + 1, 6]) + fields
        assert check_performative(body, 0, len(body))[0] == 0x12

    def test_coordinator_target_is_refused(self):
        coordinator = b"\x00\x53\x30\x45"
        fields = b"\xa1\x01n\x43\x42\x40\x40\x40" + coordinator
        body = b"\x00\x53\x12\xc0" + bytes([len(fields) + 1, 7]) + fields
        with pytest.raises(DecodeError, match="descriptor"):
            check_performative(body, 0, len(body))

    def test_nul_in_an_address_is_refused(self):
        fields = b"\xa1\x01n\x43\x42\x40\x40\x40" + hostile.target("public.a\x00secret")
        body = b"\x00\x53\x12\xc0" + bytes([len(fields) + 1, 7]) + fields
        with pytest.raises(DecodeError, match="NUL"):
            check_performative(body, 0, len(body))

    def test_mandatory_fields(self):
        body = Attach(name="x", handle=0).encode()  # no role
        with pytest.raises(DecodeError, match="mandatory field 2"):
            check_performative(body, 0, len(body))
