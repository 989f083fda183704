"""Fuzz harness of the PROXY protocol header parser (``ingress/proxy_protocol.py``).

One input is a byte stream as a load balancer (or anyone) might send it to a listener with
``proxy_protocol = true``, read the way the daemon reads it (``daemon/proxy_listener.py``):
arriving in chunks, parsed on what has arrived, consumed from the socket only while the parser
says every byte belongs to the header, and exactly up to its end once it is complete.

Invariants (a violation raises :class:`Finding`):

- *Exceptions*: none (the parser returns its errors).
- *Bounds*: the parser never asks for, and a header never takes, more than
  ``V1_MAX_LENGTH`` (v1) or ``V2_MAX_LENGTH`` (v2) bytes; ``NeedMore.at_least`` is more than
  what it was given.
- *Reading*: the bytes consumed never go past the header's end, so what follows (the TLS
  ClientHello, the AMQP header) reaches the next reader whole, whatever the chunking.
- *Finality*: once an error, always an error; once a header, the same header for every longer
  input.
- *Agreement*: on the whole input, the parser and :func:`reference` (the spec's rules written
  again, with a regular expression and ``struct``) accept the same headers with the same
  addresses and lengths, and reject the same inputs.

Input format: byte 0 sets the chunk size (``1 + byte % 32``), the rest is the stream.
"""

from __future__ import annotations

import ipaddress
import re
import struct

from amqp_policy_proxy.ingress.proxy_protocol import (
    MAX_LENGTH,
    V1_MAX_LENGTH,
    V2_MAX_LENGTH,
    HeaderError,
    NeedMore,
    ProxyHeader,
    parse_header,
)

__all__ = ["Finding", "reference", "run_proxy_header"]


class Finding(AssertionError):
    """An invariant violation: a bug found by the fuzzer."""


_V1 = re.compile(rb"PROXY (TCP4|TCP6) ([^ \r\n]+) ([^ \r\n]+) (0|[1-9][0-9]{0,4}) "
                 rb"(0|[1-9][0-9]{0,4})\r\n")
_V1_UNKNOWN = re.compile(rb"PROXY UNKNOWN(?: [^\r\n]*)?\r\n")
_V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"
_V2_TCP = {0x11: ("TCP4", 4), 0x21: ("TCP6", 16)}
_V2_UNSPEC = {0x00: "UNSPEC", 0x12: "UDP4", 0x22: "UDP6", 0x31: "UNIX", 0x32: "UNIX_DGRAM"}


def reference(data: bytes) -> ProxyHeader | None:
    """The decision on a complete input, by the spec's rules written independently.

    Returns:
        The header, or None when ``data`` does not begin with a valid complete one.
    """
    if data.startswith(b"PROXY "):
        line_end = data.find(b"\n")
        if not 0 <= line_end < V1_MAX_LENGTH:
            return None
        line = data[:line_end + 1]
        if _V1_UNKNOWN.fullmatch(line):
            return ProxyHeader(1, "PROXY", "UNKNOWN", None, None, len(line))
        m = _V1.fullmatch(line)
        if m is None:
            return None
        want = 4 if m.group(1) == b"TCP4" else 6
        try:
            src, dst = (ipaddress.ip_address(m.group(i).decode("ascii")) for i in (2, 3))
        except (ValueError, UnicodeDecodeError):
            return None
        ports = int(m.group(4)), int(m.group(5))
        if (src.version, dst.version) != (want, want) or max(ports) > 65535 or b"%" in line:
            return None
        return ProxyHeader(1, "PROXY", m.group(1).decode(), (src, ports[0]), (dst, ports[1]),
                           len(line))
    if data.startswith(_V2_SIG) and len(data) >= 16:
        ver_cmd, fam, size = struct.unpack_from("!BBH", data, 12)
        total = 16 + size
        if ver_cmd >> 4 != 2 or total > V2_MAX_LENGTH or len(data) < total:
            return None
        if ver_cmd & 0xF == 0:
            name = _V2_TCP.get(fam, (None,))[0] or _V2_UNSPEC.get(fam) or f"0x{fam:02x}"
            return ProxyHeader(2, "LOCAL", name, None, None, total)
        if ver_cmd & 0xF != 1:
            return None
        if fam in _V2_UNSPEC:
            return ProxyHeader(2, "PROXY", _V2_UNSPEC[fam], None, None, total)
        if fam not in _V2_TCP:
            return None
        name, n = _V2_TCP[fam]
        if size < 2 * n + 4:
            return None
        cls = ipaddress.IPv4Address if n == 4 else ipaddress.IPv6Address
        src, dst = cls(data[16:16 + n]), cls(data[16 + n:16 + 2 * n])
        sport, dport = struct.unpack_from("!HH", data, 16 + 2 * n)
        return ProxyHeader(2, "PROXY", name, (src, sport), (dst, dport), total)
    return None


def run_proxy_header(data: bytes) -> None:
    """Read ``data`` as the daemon would; raise :class:`Finding` on a bug."""
    if not data:
        return
    chunk = 1 + data[0] % 32
    stream = data[1:]
    consumed = 0  # bytes taken off the "socket" (all of them header bytes)
    arrived = 0
    final: ProxyHeader | HeaderError | None = None
    while final is None and arrived < len(stream):
        arrived = min(len(stream), arrived + chunk)
        # what a MSG_PEEK read of at most MAX_LENGTH - consumed bytes returns
        peeked = stream[consumed:min(arrived, MAX_LENGTH)]
        result = _parse(stream[:consumed] + peeked)
        if isinstance(result, NeedMore):
            if result.at_least <= consumed + len(peeked):
                raise Finding(f"NeedMore({result.at_least}) given {consumed + len(peeked)}")
            if result.at_least > MAX_LENGTH:
                raise Finding(f"NeedMore({result.at_least}) over the bound {MAX_LENGTH}")
            consumed += len(peeked)
            continue
        final = result
    if isinstance(final, ProxyHeader):
        bound = V1_MAX_LENGTH if final.version == 1 else V2_MAX_LENGTH
        if not consumed <= final.length <= min(bound, arrived):
            raise Finding(f"header of {final.length} bytes: consumed {consumed}, arrived "
                          f"{arrived}, bound {bound}")
        for longer in (len(stream), final.length + 1, MAX_LENGTH + 1):
            again = _parse(stream[:longer])
            if again != final:
                raise Finding(f"header {final} became {again} at {longer} bytes")
    elif isinstance(final, HeaderError):
        again = _parse(stream)
        if not isinstance(again, HeaderError):
            raise Finding(f"error {final.reason!r} became {again} on the whole input")
    whole = _parse(stream)
    expected = reference(stream)
    if isinstance(whole, NeedMore):
        if expected is not None:
            raise Finding(f"parser needs more, reference found {expected}")
    elif (whole if isinstance(whole, ProxyHeader) else None) != expected:
        raise Finding(f"parser says {whole}, reference says {expected}")


def _parse(data: bytes) -> ProxyHeader | NeedMore | HeaderError:
    try:
        return parse_header(data)
    except Exception as exc:  # noqa: BLE001 - any exception is the finding
        raise Finding(f"parse_header raised {exc!r}") from exc
