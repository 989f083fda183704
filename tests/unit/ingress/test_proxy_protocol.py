"""ingress/proxy_protocol.py: the PROXY header parser (v1 text, v2 binary), examples and
properties (any split, anything after the header, errors are final, never raises)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_policy_proxy.ingress.proxy_protocol import (
    MAX_LENGTH,
    V1_MAX_LENGTH,
    V2_MAX_LENGTH,
    HeaderError,
    NeedMore,
    ProxyHeader,
    parse_header,
)
from tests.support import proxy_header as pp

IP4 = ipaddress.IPv4Address
IP6 = ipaddress.IPv6Address


# ---------------------------------------------------------------------------------- v1


def test_v1_tcp4() -> None:
    data = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nAMQP\x03\x01\x00\x00"
    assert parse_header(data) == ProxyHeader(
        1, "PROXY", "TCP4", (IP4("192.168.0.1"), 56324), (IP4("192.168.0.11"), 443), 47)


def test_v1_tcp6_longest_line() -> None:
    full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    data = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(data) == 104
    header = parse_header(data)
    assert isinstance(header, ProxyHeader)
    assert header.source == (IP6(full), 65535) and header.length == 104


def test_v1_tcp6_mapped_and_compressed_forms() -> None:
    header = parse_header(b"PROXY TCP6 ::ffff:10.1.2.3 ::1 1 2\r\n")
    assert isinstance(header, ProxyHeader)
    assert header.source == (IP6("::ffff:10.1.2.3"), 1)


@pytest.mark.parametrize("line", [
    b"PROXY UNKNOWN\r\n",
    b"PROXY UNKNOWN ffff:f::f ffff:f::f 65535 65535\r\n",
    b"PROXY UNKNOWN anything at all, even \x00 and \xff\r\n",
])
def test_v1_unknown_means_the_real_endpoints(line: bytes) -> None:
    assert parse_header(line + b"rest") == ProxyHeader(1, "PROXY", "UNKNOWN", None, None,
                                                       len(line))


@pytest.mark.parametrize(("line", "words"), [
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\n", "LF without CR"),
    (b"PROXY TCP4 192.168.0.1\r192.168.0.11 56324 443\r\n", "CR not followed by LF"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324\r\n", "not 4"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443 \r\n", "not 4"),
    (b"PROXY TCP4  192.168.0.1 192.168.0.11 56324 443\r\n", "not 4"),
    (b"PROXY  TCP4 192.168.0.1 192.168.0.11 56324 443\r\n", "family"),
    (b"PROXY UDP4 192.168.0.1 192.168.0.11 56324 443\r\n", "family"),
    (b"PROXY tcp4 192.168.0.1 192.168.0.11 56324 443\r\n", "family"),
    (b"PROXY TCP4 192.168.000.1 192.168.0.11 56324 443\r\n", "canonical IPv4"),
    (b"PROXY TCP4 ::1 192.168.0.11 56324 443\r\n", "canonical IPv4"),
    (b"PROXY TCP6 192.168.0.1 ::1 56324 443\r\n", "canonical IPv6"),
    (b"PROXY TCP6 fe80::1%eth0 ::1 56324 443\r\n", "canonical IPv6"),
    (b"PROXY TCP4 192.168.0.1 host.example 56324 443\r\n", "canonical IPv4"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 056324 443\r\n", "port"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 65536 443\r\n", "port"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 -1 443\r\n", "port"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 +80 443\r\n", "port"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 1_0 443\r\n", "port"),
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 \xd9\xa1 443\r\n", "port"),
    (b"PROXY\r\n", "no PROXY header"),
    (b"PROXYTCP4 1.2.3.4 1.2.3.4 1 2\r\n", "no PROXY header"),
    (b"PROXY " + b"UNKNOWN " + b"x" * 100 + b"\r\n", "without CRLF in its first 107"),
])
def test_v1_malformed(line: bytes, words: str) -> None:
    result = parse_header(line)
    assert isinstance(result, HeaderError), result
    assert words in result.reason


def test_v1_waits_for_the_crlf_but_not_beyond_107_bytes() -> None:
    assert parse_header(b"PROXY TCP4 1.2.3.4") == NeedMore(19)
    assert parse_header(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r") == NeedMore(32)
    assert parse_header(b"PROXY UNKNOWN " + b"x" * 92) == NeedMore(V1_MAX_LENGTH)
    assert isinstance(parse_header(b"PROXY UNKNOWN " + b"x" * 93), HeaderError)
    longest = b"PROXY UNKNOWN " + b"x" * 91 + b"\r\n"
    assert len(longest) == V1_MAX_LENGTH
    assert isinstance(parse_header(longest), ProxyHeader)


# ---------------------------------------------------------------------------------- v2


def test_v2_tcp4_with_tlvs() -> None:
    data = pp.v2("10.1.2.3", "10.0.0.1", 40000, 5672,
                 tlvs=pp.tlv(0x05, b"unique") + pp.tlv(0x04, b"")) + b"AMQP"
    assert parse_header(data) == ProxyHeader(
        2, "PROXY", "TCP4", (IP4("10.1.2.3"), 40000), (IP4("10.0.0.1"), 5672), len(data) - 4)


def test_v2_tcp6() -> None:
    data = pp.v2("2001:db8::7", "2001:db8::1", 1, 65535)
    header = parse_header(data)
    assert isinstance(header, ProxyHeader)
    assert (header.family, header.source, header.length) == ("TCP6", (IP6("2001:db8::7"), 1),
                                                             52)


@pytest.mark.parametrize("family", [0x00, 0x11, 0x21, 0x31, 0x55, 0xFF])
def test_v2_local_uses_the_real_endpoints_whatever_follows(family: int) -> None:
    data = pp.v2(command=0, family=family, block=b"\x01" * 7)
    header = parse_header(data)
    assert isinstance(header, ProxyHeader)
    assert (header.command, header.source, header.length) == ("LOCAL", None, 23)


@pytest.mark.parametrize(("family", "name"), [(0x00, "UNSPEC"), (0x12, "UDP4"),
                                              (0x22, "UDP6"), (0x31, "UNIX"),
                                              (0x32, "UNIX_DGRAM")])
def test_v2_proxy_families_handled_as_unspec(family: int, name: str) -> None:
    header = parse_header(pp.v2(family=family, block=b"\x00" * 216))
    assert isinstance(header, ProxyHeader)
    assert (header.command, header.family, header.source) == ("PROXY", name, None)


@pytest.mark.parametrize(("data", "words"), [
    (pp.v2("1.2.3.4")[:12] + b"\x11\x11\x00\x0c" + b"\x00" * 12, "version 1"),
    (pp.v2("1.2.3.4")[:12] + b"\x22\x11\x00\x0c" + b"\x00" * 12, "command 2"),
    (pp.v2("1.2.3.4")[:12] + b"\x2f", "command 15"),
    (pp.v2(family=0x13, block=b"\x00" * 12), "family/protocol byte 0x13"),
    (pp.v2(family=0x41, block=b"\x00" * 12), "family/protocol byte 0x41"),
    (pp.v2(family=0x11, block=b"\x00" * 11), "11-byte address block, 12 needed"),
    (pp.v2(family=0x21, block=b"\x00" * 35), "35-byte address block, 36 needed"),
    (pp.v2(family=0x11, block=b"\x00" * (V2_MAX_LENGTH - 15))[:16], "over the 4096"),
    (b"\r\n\r\n\x00\r\nQUIX\n", "no PROXY header"),
    (b"\r\r", "no PROXY header"),
])
def test_v2_malformed(data: bytes, words: str) -> None:
    result = parse_header(data)
    assert isinstance(result, HeaderError), result
    assert words in result.reason


def test_v2_needs_the_fixed_part_then_the_block() -> None:
    data = pp.v2("10.1.2.3", tlvs=pp.tlv(0x02, b"broker.example"))
    assert parse_header(data[:5]) == NeedMore(16)
    assert parse_header(data[:16]) == NeedMore(len(data))
    assert parse_header(data[:-1]) == NeedMore(len(data))
    longest = pp.v2(family=0x11, block=b"\x00" * (V2_MAX_LENGTH - 16))
    assert isinstance(parse_header(longest), ProxyHeader)


@pytest.mark.parametrize("data", [b"AMQP\x00\x01\x00\x00", b"\x16\x03\x01\x02\x00",
                                  b"GET / HTTP/1.1\r\n", b"\x00"])
def test_other_protocols_are_refused_at_the_first_byte(data: bytes) -> None:
    assert isinstance(parse_header(data[:1]), HeaderError)
    assert isinstance(parse_header(data), HeaderError)


def test_nothing_yet() -> None:
    assert parse_header(b"") == NeedMore(1)


# ---------------------------------------------------------------------------------- properties

ipv4 = st.builds(IP4, st.integers(0, 2**32 - 1))
ipv6 = st.builds(IP6, st.integers(0, 2**128 - 1))
ports = st.integers(0, 65535)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, ProxyHeader]:
    """A valid header as a balancer writes it, and what it must parse to."""
    ips = draw(st.sampled_from([ipv4, ipv6]))
    src, dst, sport, dport = draw(ips), draw(ips), draw(ports), draw(ports)
    family = "TCP4" if src.version == 4 else "TCP6"
    kind = draw(st.sampled_from(["v1", "v2", "v1-unknown", "v2-local"]))
    if kind == "v1":
        data = pp.v1(str(src), str(dst), sport, dport)
        return data, ProxyHeader(1, "PROXY", family, (src, sport), (dst, dport), len(data))
    if kind == "v1-unknown":
        rest = draw(st.text(st.characters(codec="ascii", exclude_characters="\r\n"),
                            max_size=90))
        data = pp.v1_unknown(rest)
        return data, ProxyHeader(1, "PROXY", "UNKNOWN", None, None, len(data))
    tlvs = b"".join(pp.tlv(t, v) for t, v in draw(st.lists(
        st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=5)))
    if kind == "v2":
        data = pp.v2(str(src), str(dst), sport, dport, tlvs=tlvs)
        return data, ProxyHeader(2, "PROXY", family, (src, sport), (dst, dport), len(data))
    data = pp.v2(str(src), str(dst), sport, dport, command=0, tlvs=tlvs)
    return data, ProxyHeader(2, "LOCAL", family, None, None, len(data))


@given(headers(), st.binary(max_size=200))
def test_a_header_parses_whatever_follows_it(case: tuple[bytes, ProxyHeader],
                                             tail: bytes) -> None:
    data, expected = case
    assert parse_header(data + tail) == expected


@given(headers())
def test_every_proper_prefix_needs_more_and_all_of_it_is_header(
        case: tuple[bytes, ProxyHeader]) -> None:
    data, expected = case
    for cut in range(len(data)):
        result = parse_header(data[:cut])
        assert isinstance(result, NeedMore), (cut, result)
        assert cut < result.at_least <= expected.length


@given(st.sampled_from([b"", b"PROXY ", b"PROXY TCP4 ", pp.V2_SIGNATURE,
                        pp.V2_SIGNATURE + b"\x21\x11"]), st.binary(max_size=300))
def test_never_raises_and_errors_are_final(start: bytes, rest: bytes) -> None:
    data = start + rest
    seen_error = False
    for cut in range(len(data) + 1):
        result = parse_header(data[:cut])
        assert isinstance(result, ProxyHeader | NeedMore | HeaderError)
        if seen_error:
            assert isinstance(result, HeaderError), (cut, result)
        seen_error = isinstance(result, HeaderError)
        if isinstance(result, ProxyHeader):
            assert result.length <= cut
            assert parse_header(data[:result.length]) == result  # stable from there on
            break
        if isinstance(result, NeedMore):
            assert result.at_least > cut


@given(headers(), st.integers(0, 200), st.binary(min_size=1, max_size=3))
def test_a_corrupted_header_never_parses_past_its_bound(case: tuple[bytes, ProxyHeader],
                                                        at: int, junk: bytes) -> None:
    data, _ = case
    at = at % len(data)
    mutated = data[:at] + junk + data[at + 1:]
    result = parse_header(mutated + b"\x00" * MAX_LENGTH)
    if isinstance(result, ProxyHeader):
        assert result.length <= (V1_MAX_LENGTH if result.version == 1 else V2_MAX_LENGTH)
    else:
        assert isinstance(result, HeaderError)
