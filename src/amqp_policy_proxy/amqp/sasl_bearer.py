"""Sans-IO. The bearer token in a sasl-init: SASL PLAIN with the token as password, or SASL
OAUTHBEARER (RFC 7628).

Token connections (``token_authority``, docs/oauth2.md) carry an OAuth 2.0 access token where
other connections carry a password:

* PLAIN (RFC 4616) ``authzid NUL authcid NUL passwd``: the password is the token (RabbitMQ's
  convention); the authcid may be empty or must name the token's identity, and so must a
  non-empty authzid. Unlike a password connection (:mod:`.sasl`), an empty authcid is allowed.
* OAUTHBEARER (RFC 7628 §3.1) ``gs2-header %x01 *(kvpair) %x01`` with ``gs2-header =
  ("n" / "y" / "p=" cb-name) "," ["a=" saslname] ","`` and ``kvpair = key "=" value %x01``;
  the token is the ``auth`` pair's value after ``Bearer `` (case-insensitive scheme, RFC 6750
  §2.1). Channel binding (``p=``) is refused: the proxy offers no ``-PLUS`` variant.

On a refused token the OAUTHBEARER server sends a challenge with a JSON error object
(:data:`BEARER_ERROR_CHALLENGE`) and the client answers it with a single ``%x01``
(:data:`BEARER_DUMMY_RESPONSE`), after which the outcome is ``auth`` (RFC 7628 §3.2.2).

The token is returned, never logged or kept here; a :class:`~.errors.DecodeError` never holds
any part of it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import DecodeError

#: The mechanisms that carry a token, in the order the proxy offers them.
TOKEN_MECHANISMS = ("OAUTHBEARER", "PLAIN")
#: The challenge a server sends on a refused OAUTHBEARER token (RFC 7628 §3.2.2): the JSON
#: error object, ``status`` as in RFC 6750 §3.1.
BEARER_ERROR_CHALLENGE = b'{"status":"invalid_token"}'
#: The client's answer to that challenge (RFC 7628 §3.2.3).
BEARER_DUMMY_RESPONSE = b"\x01"
#: The longest initial response read (a token plus its framing), bytes.
MAX_RESPONSE_BYTES = 64 * 1024

_KEY = re.compile(rb"[A-Za-z]+")
#: RFC 7628 value: VCHAR / SP / HTAB / CR / LF.
_VALUE = re.compile(rb"[\x21-\x7e \t\r\n]*")
_BEARER = re.compile(rb"[Bb][Ee][Aa][Rr][Ee][Rr] +([\x21-\x7e]+) *")


class BearerResponse(NamedTuple):
    """What a token sasl-init holds."""

    token: bytes
    """The access token (never logged)."""
    username: str | None
    """The name the client gives (PLAIN's authcid or a non-empty authzid, OAUTHBEARER's
    ``a=``); None when it gives none. It must be the token's identity."""
    mechanism: str
    """``PLAIN`` or ``OAUTHBEARER``."""


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"{what} is not UTF-8") from None


def _saslname(raw: bytes) -> str:
    """RFC 5801 saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is bad."""
    text = _utf8(raw, "OAUTHBEARER authzid")
    if "=" in text.replace("=2C", "").replace("=3D", ""):
        raise DecodeError("OAUTHBEARER authzid has a bad '=' escape")
    return text.replace("=2C", ",").replace("=3D", "=")


def parse_plain_token(response: bytes) -> BearerResponse:
    """The token and user name of a PLAIN initial response whose password is a token.

    Args:
        response: ``authzid NUL authcid NUL token``.

    Returns:
        The token; ``username`` the authcid (or the authzid when the authcid is empty), None
        when both are empty.

    Raises:
        DecodeError: not three NUL-separated parts, an empty token, an authzid that differs
            from a non-empty authcid, or names that are not UTF-8.
    """
    if len(response) > MAX_RESPONSE_BYTES:
        raise DecodeError("PLAIN initial response too long")
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise DecodeError("PLAIN initial response must be authzid NUL authcid NUL passwd")
    authzid, authcid, token = parts
    if not token:
        raise DecodeError("PLAIN initial response without a password (the token)")
    zid = _utf8(authzid, "PLAIN authzid") if authzid else None
    cid = _utf8(authcid, "PLAIN authcid") if authcid else None
    if zid is not None and cid is not None and zid != cid:
        raise DecodeError("PLAIN authzid differs from the authcid")
    return BearerResponse(token, cid if cid is not None else zid, "PLAIN")


def parse_oauthbearer(response: bytes) -> BearerResponse:
    """The token and user name of an OAUTHBEARER initial client response (RFC 7628 §3.1).

    Args:
        response: ``gs2-header %x01 key=value %x01 ... %x01``.

    Returns:
        The ``auth`` pair's bearer token and the gs2-header's ``a=`` (None when absent). The
        ``host``, ``port`` and any other pair are read and ignored.

    Raises:
        DecodeError: a malformed gs2-header, channel binding asked for (``p=``), a malformed
            or repeated pair, no ``auth`` pair, or an ``auth`` that is not ``Bearer <token>``.
    """
    if len(response) > MAX_RESPONSE_BYTES:
        raise DecodeError("OAUTHBEARER initial response too long")
    head, sep, rest = response.partition(b"\x01")
    if not sep:
        raise DecodeError("OAUTHBEARER initial response without %x01 separators")
    fields = head.split(b",")
    if len(fields) != 3 or fields[2] != b"":
        raise DecodeError("OAUTHBEARER gs2-header malformed")
    flag, authz = fields[0], fields[1]
    if flag.startswith(b"p="):
        raise DecodeError("OAUTHBEARER channel binding is not offered")
    if flag not in (b"n", b"y"):
        raise DecodeError("OAUTHBEARER gs2-header malformed")
    username: str | None = None
    if authz:
        if not authz.startswith(b"a=") or len(authz) == 2:
            raise DecodeError("OAUTHBEARER gs2-header authzid malformed")
        username = _saslname(authz[2:])
    # rest: *(key "=" value %x01) %x01, i.e. it ends with the empty pair's %x01
    if not rest.endswith(b"\x01"):
        raise DecodeError("OAUTHBEARER initial response does not end with %x01")
    pairs = rest[:-1].split(b"\x01")
    if pairs[-1] != b"":
        raise DecodeError("OAUTHBEARER key/value pairs must each end with %x01")
    seen: dict[bytes, bytes] = {}
    for pair in pairs[:-1]:
        key, eq, value = pair.partition(b"=")
        if not eq or _KEY.fullmatch(key) is None or _VALUE.fullmatch(value) is None:
            raise DecodeError("OAUTHBEARER key/value pair malformed")
        if key in seen:
            raise DecodeError("OAUTHBEARER key/value pair repeated")
        seen[key] = value
    auth = seen.get(b"auth")
    if auth is None:
        raise DecodeError("OAUTHBEARER initial response without auth=")
    bearer = _BEARER.fullmatch(auth)
    if bearer is None:
        raise DecodeError("OAUTHBEARER auth is not 'Bearer <token>'")
    return BearerResponse(bearer.group(1), username, "OAUTHBEARER")


def parse_token_response(mechanism: str, response: bytes | None) -> BearerResponse:
    """The token of a sasl-init for a token mechanism (:data:`TOKEN_MECHANISMS`).

    Args:
        mechanism: the sasl-init's mechanism (case-insensitive).
        response: its initial response.

    Raises:
        DecodeError: another mechanism, no initial response, or a malformed one.
    """
    mech = mechanism.upper()
    if response is not None and not isinstance(response, bytes | bytearray):
        raise DecodeError("sasl-init initial-response is not binary")
    if mech not in TOKEN_MECHANISMS:
        raise DecodeError(f"mechanism {mech[:32]!a} carries no token")
    if not response:
        raise DecodeError(f"{mech} sasl-init without an initial response")
    raw = bytes(response)
    return parse_plain_token(raw) if mech == "PLAIN" else parse_oauthbearer(raw)
