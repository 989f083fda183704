"""amqp/codec.py: values decoded through proton own their bytes."""

from __future__ import annotations

from pathlib import Path

from amqp_policy_proxy.amqp.codec import decode_value, encode_value
from fuzz.harness import run_framing

# A described value whose descriptor is binary (legal: a descriptor may be any type).
BINARY_DESCRIBED = b"\x00\xa0\x04\x01\x02\x03\x04\xa1\x03abc"
REGRESSION = (Path(__file__).parents[3] / "fuzz" / "regressions" / "framing"
              / "described-binary-descriptor-2073cf4a")


def test_binary_descriptor_is_copied_out_of_protons_buffer():
    value, consumed = decode_value(BINARY_DESCRIBED)
    assert consumed == len(BINARY_DESCRIBED)
    assert isinstance(value.descriptor, bytes) and value.descriptor == b"\x01\x02\x03\x04"
    assert value.value == "abc"
    assert encode_value(value) == BINARY_DESCRIBED


def test_attach_with_binary_descriptor_source_re_encodes_stably_run_after_run():
    # Found by fuzz_framing: an Attach whose source had a binary descriptor kept a memoryview
    # into a freed proton buffer, so re-encoding it wrote whatever the memory held by then.
    # It showed on the second run of the same input in one process, so replay it a few times.
    data = REGRESSION.read_bytes()
    for _ in range(4):
        run_framing(data)
