"""Sans-IO. The PROXY protocol header a load balancer sends before the client's first byte.

HAProxy's PROXY protocol (versions 1 and 2, ``proxy-protocol.txt``): a load balancer that
relays a TCP connection writes one header first, carrying the addresses of the connection it
relays, so the server behind it can use the client's address instead of the balancer's. The
daemon reads it from the socket before anything else (before TLS, before the AMQP header) and
:func:`parse_header` decides on the bytes read so far:

* :class:`NeedMore`: no header ends within these bytes yet, and they can still begin one. Every
  byte given is then part of the header (a v1 line ends at its first CRLF, a v2 header at
  ``16 + len``), so the caller may consume them from the socket.
* :class:`ProxyHeader`: a complete header, ``length`` bytes long (bytes after it are the
  client's stream).
* :class:`HeaderError`: not a header, or one the spec says to reject. Final: more bytes never
  turn an error into a header.

Bounds: a v1 line is at most :data:`V1_MAX_LENGTH` (107) bytes with its CRLF (spec section
2.1); a v2 header at most :data:`V2_MAX_LENGTH` bytes (16 plus the length it announces; the
spec allows 65,551, no balancer sends more than a few hundred). The parser never looks beyond
the bound, so the caller never needs to read more than :data:`MAX_LENGTH` bytes.

What is accepted, following the spec's MUSTs:

* v1 ``PROXY TCP4|TCP6 SRC DST SPORT DPORT\\r\\n``, single spaces, addresses in canonical form
  of the announced family (IPv4 without leading zeros; no IPv6 zone id), ports 0..65535
  without leading zeros. ``PROXY UNKNOWN`` with anything up to the CRLF: use the real
  endpoints. A lone CR or LF never ends the line.
* v2: the 12-byte signature, version 2, command LOCAL (``0x0``) or PROXY (``0x1``). LOCAL: use
  the real endpoints whatever follows (the family is ignored, the block skipped). PROXY over
  TCP/IPv4 (``0x11``) and TCP/IPv6 (``0x21``): the addresses are used. PROXY with the other
  valid family bytes (``0x00`` UNSPEC, UDP ``0x12``/``0x22``, UNIX ``0x31``/``0x32``): the
  spec lets a receiver fall back to UNSPEC, which means using the real endpoints. Any other
  version, command or family byte is rejected, and so is an address block shorter than its
  family needs. TLVs after the addresses are skipped, as the spec allows (a CRC32C TLV is not
  verified).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

V1_SIGNATURE: Final = b"PROXY "
"""``PROXY`` and the one space that follows it."""
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
"""The 12 bytes that begin every v2 header."""
V1_MAX_LENGTH: Final = 107
"""Longest v1 line, CRLF included (``PROXY UNKNOWN`` with two full IPv6 addresses)."""
V2_MAX_LENGTH: Final = 4096
"""Longest v2 header accepted, the 16 fixed bytes included (addresses and TLVs: 4,080)."""
MAX_LENGTH: Final = V2_MAX_LENGTH
"""The most bytes :func:`parse_header` ever looks at."""

_V2_FIXED = 16
_V2_VERSION = 0x2
_CMD_LOCAL = 0x0
_CMD_PROXY = 0x1
#: Family/protocol bytes of a PROXY command: the length of the address block to read, or None
#: for the valid ones the spec lets a receiver treat as UNSPEC (use the real endpoints).
_V2_FAMILIES: Final[dict[int, tuple[str, int | None]]] = {
    0x00: ("UNSPEC", None),
    0x11: ("TCP4", 12),
    0x12: ("UDP4", None),
    0x21: ("TCP6", 36),
    0x22: ("UDP6", None),
    0x31: ("UNIX", None),
    0x32: ("UNIX_DGRAM", None),
}


@dataclass(frozen=True, slots=True)
class NeedMore:
    """No header ends within the bytes given yet; every one of them belongs to the header."""

    at_least: int
    """The total number of bytes (counting those given) needed before the next decision."""


@dataclass(frozen=True, slots=True)
class HeaderError:
    """Not a PROXY header, or one the spec says to reject (the connection must be dropped)."""

    reason: str
    """What was wrong, for the log line (no bytes of the input beyond a short excerpt)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete, valid PROXY header."""

    version: int
    """1 (text) or 2 (binary)."""
    command: str
    """``"PROXY"`` (relayed on behalf of a client) or ``"LOCAL"`` (v2: the balancer's own
    connection, e.g. a health check)."""
    family: str
    """``TCP4``, ``TCP6``, ``UNKNOWN`` (v1), or v2's ``UNSPEC``, ``UDP4``, ``UDP6``, ``UNIX``,
    ``UNIX_DGRAM`` (for LOCAL: the byte as sent, which is ignored)."""
    source: tuple[IPAddress, int] | None
    """The client's address and port; None when the real endpoints are to be used (LOCAL,
    ``UNKNOWN``, and the families handled as UNSPEC)."""
    destination: tuple[IPAddress, int] | None
    """The address and port the client connected to (the balancer's front); None with
    ``source``."""
    length: int
    """Bytes the header takes at the start of the stream."""


ParseResult = ProxyHeader | NeedMore | HeaderError


def parse_header(data: bytes | bytearray | memoryview) -> ParseResult:
    """Decide on the first bytes of a connection that must begin with a PROXY header.

    Args:
        data: the bytes received so far, from the first one (only the first
            :data:`MAX_LENGTH` are looked at).

    Returns:
        :class:`ProxyHeader` (complete; ``length`` bytes), :class:`NeedMore` (no header ends
        within ``data`` and it can still begin one), or :class:`HeaderError` (final). Never
        raises.
    """
    head = bytes(data[:MAX_LENGTH])
    if not head:
        return NeedMore(1)
    if head[0] == V1_SIGNATURE[0]:
        return _parse_v1(head)
    if head[0] == V2_SIGNATURE[0]:
        return _parse_v2(head)
    return HeaderError(f"no PROXY header: the stream begins with {_excerpt(head)}")


def _excerpt(data: bytes, n: int = 16) -> str:
    return repr(data[:n]) + ("..." if len(data) > n else "")


# ---------------------------------------------------------------------------------- version 1


def _parse_v1(head: bytes) -> ParseResult:
    sig = len(V1_SIGNATURE)
    if head[:sig] != V1_SIGNATURE[: len(head)]:
        return HeaderError(f"no PROXY header: the stream begins with {_excerpt(head)}")
    end = head.find(b"\n", 0, V1_MAX_LENGTH)
    if end < 0:
        if len(head) >= V1_MAX_LENGTH:
            return HeaderError(f"PROXY v1 line without CRLF in its first {V1_MAX_LENGTH} bytes")
        lone_cr = head.find(b"\r")
        if lone_cr >= 0 and lone_cr + 1 < len(head):
            return HeaderError("PROXY v1 line with a CR not followed by LF")
        return NeedMore(len(head) + 1)
    if end == 0 or head[end - 1] != 0x0D:
        return HeaderError("PROXY v1 line ended by a LF without CR")
    line = head[:end - 1]
    length = end + 1
    if b"\r" in line:
        return HeaderError("PROXY v1 line with a CR not followed by LF")
    fields = line[sig:].split(b" ")
    family = fields[0]
    if family == b"UNKNOWN":
        return ProxyHeader(1, "PROXY", "UNKNOWN", None, None, length)
    if family not in (b"TCP4", b"TCP6"):
        return HeaderError(f"PROXY v1 family {_excerpt(family)} is not TCP4, TCP6 or UNKNOWN")
    if len(fields) != 5:
        return HeaderError(f"PROXY v1 {family.decode()} line has {len(fields) - 1} fields "
                           "after the family, not 4 (or not single spaces)")
    version = 4 if family == b"TCP4" else 6
    src = _v1_address(fields[1], version)
    dst = _v1_address(fields[2], version)
    sport = _v1_port(fields[3])
    dport = _v1_port(fields[4])
    if src is None or dst is None:
        bad = fields[1] if src is None else fields[2]
        return HeaderError(f"PROXY v1 address {_excerpt(bad, 40)} is not a canonical "
                           f"IPv{version} address")
    if sport is None or dport is None:
        bad = fields[3] if sport is None else fields[4]
        return HeaderError(f"PROXY v1 port {_excerpt(bad)} is not 0..65535 without leading "
                           "zeros")
    return ProxyHeader(1, "PROXY", family.decode(), (src, sport), (dst, dport), length)


def _v1_address(text: bytes, version: int) -> IPAddress | None:
    if not text or not text.isascii() or b"%" in text:
        return None
    try:
        addr = ipaddress.ip_address(text.decode("ascii"))
    except ValueError:  # leading zeros in IPv4 included (Python >= 3.9.5)
        return None
    return addr if addr.version == version else None


def _v1_port(text: bytes) -> int | None:
    if not 1 <= len(text) <= 5 or not text.isdigit() or (len(text) > 1 and text[0] == 0x30):
        return None
    port = int(text)
    return port if port <= 65535 else None


# ---------------------------------------------------------------------------------- version 2


def _parse_v2(head: bytes) -> ParseResult:
    sig = len(V2_SIGNATURE)
    if head[:sig] != V2_SIGNATURE[: len(head)]:
        return HeaderError(f"no PROXY header: the stream begins with {_excerpt(head)}")
    if len(head) > sig:
        version, command = head[sig] >> 4, head[sig] & 0x0F
        if version != _V2_VERSION:
            return HeaderError(f"PROXY v2 header with version {version}, not 2")
        if command not in (_CMD_LOCAL, _CMD_PROXY):
            return HeaderError(f"PROXY v2 header with command {command}, not LOCAL or PROXY")
        if command == _CMD_PROXY and len(head) > sig + 1 and head[sig + 1] not in _V2_FAMILIES:
            return HeaderError(f"PROXY v2 header with family/protocol byte "
                               f"0x{head[sig + 1]:02x}, not one of the spec's")
    if len(head) < _V2_FIXED:
        return NeedMore(_V2_FIXED)
    length = _V2_FIXED + int.from_bytes(head[14:16], "big")
    if length > V2_MAX_LENGTH:
        return HeaderError(f"PROXY v2 header of {length} bytes, over the {V2_MAX_LENGTH} "
                           "accepted")
    if len(head) < length:
        return NeedMore(length)
    fam = head[13]
    if head[12] & 0x0F == _CMD_LOCAL:
        return ProxyHeader(2, "LOCAL", _V2_FAMILIES.get(fam, (f"0x{fam:02x}", None))[0], None,
                           None, length)
    family, needed = _V2_FAMILIES[fam]
    if needed is None:
        return ProxyHeader(2, "PROXY", family, None, None, length)
    if length - _V2_FIXED < needed:
        return HeaderError(f"PROXY v2 {family} header with a {length - _V2_FIXED}-byte address "
                           f"block, {needed} needed")
    size = 4 if family == "TCP4" else 16
    block = head[_V2_FIXED:_V2_FIXED + needed]
    cls = ipaddress.IPv4Address if size == 4 else ipaddress.IPv6Address
    src = cls(block[:size])
    dst = cls(block[size:2 * size])
    sport = int.from_bytes(block[2 * size:2 * size + 2], "big")
    dport = int.from_bytes(block[2 * size + 2:2 * size + 4], "big")
    return ProxyHeader(2, "PROXY", family, (src, sport), (dst, dport), length)
