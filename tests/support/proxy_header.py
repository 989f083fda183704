"""PROXY protocol headers as a load balancer writes them (HAProxy's proxy-protocol.txt).

Written from the spec independently of ``ingress/proxy_protocol.py`` (the parser under test),
for the parser's tests and for raw-socket clients that play the balancer.
"""

from __future__ import annotations

import ipaddress
import struct

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def v1(source: str, destination: str, sport: int, dport: int) -> bytes:
    """``PROXY TCP4|TCP6 SRC DST SPORT DPORT\\r\\n`` (the family from ``source``)."""
    family = "TCP4" if ipaddress.ip_address(source).version == 4 else "TCP6"
    return f"PROXY {family} {source} {destination} {sport} {dport}\r\n".encode("ascii")


def v1_unknown(rest: str = "") -> bytes:
    """``PROXY UNKNOWN[ rest]\\r\\n``."""
    return f"PROXY UNKNOWN{' ' + rest if rest else ''}\r\n".encode("ascii")


def tlv(kind: int, value: bytes) -> bytes:
    """One v2 TLV: type, 16-bit length, value."""
    return struct.pack("!BH", kind, len(value)) + value


def v2(source: str | None = None, destination: str | None = None, sport: int = 0,
       dport: int = 0, *, command: int = 1, family: int | None = None, tlvs: bytes = b"",
       block: bytes | None = None) -> bytes:
    """A v2 header.

    Args:
        source, destination: the addresses (TCP over their family unless ``family`` says
            otherwise); None for no address block.
        sport, dport: the ports.
        command: 1 PROXY, 0 LOCAL (or any nibble, for bad headers).
        family: the family/protocol byte (default ``0x11``/``0x21`` from ``source``, ``0x00``
            without addresses).
        tlvs: bytes appended after the addresses (see :func:`tlv`).
        block: the whole block after the 16 fixed bytes instead of addresses and TLVs.
    """
    addresses = b""
    if source is not None:
        src = ipaddress.ip_address(source)
        dst = ipaddress.ip_address(destination or ("0.0.0.0" if src.version == 4 else "::"))
        addresses = src.packed + dst.packed + struct.pack("!HH", sport, dport)
        if family is None:
            family = 0x11 if src.version == 4 else 0x21
    if family is None:
        family = 0x00
    body = addresses + tlvs if block is None else block
    return V2_SIGNATURE + struct.pack("!BBH", 0x20 | command, family, len(body)) + body
