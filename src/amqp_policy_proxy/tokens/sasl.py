"""Sans-IO. The token in a SASL initial response: PLAIN's password, or OAUTHBEARER's bearer.

* PLAIN (RFC 4616, RabbitMQ's convention for tokens): ``authzid NUL authcid NUL token``; the
  user name may be empty, else it must be the token's identity
  (:func:`~.claims.check_username`).
* OAUTHBEARER (RFC 7628 §3.1): a GS2 header ``n,`` or ``y,`` (no channel binding), an
  optional ``a=authzid``, then ``\\x01``-separated ``key=value`` pairs of which ``auth`` is
  ``Bearer <token>``, closed by ``\\x01\\x01``. A refused OAUTHBEARER exchange is answered with
  the error challenge of §3.2.2 (:func:`oauthbearer_error_challenge`), to which the client
  replies with a lone ``\\x01`` (:func:`is_oauthbearer_abort`) before the outcome ``auth``.

Nothing here keeps or logs the token; :class:`TokenCredentials` hides it from ``repr``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .errors import RejectReason, TokenRejected

PLAIN, OAUTHBEARER = "PLAIN", "OAUTHBEARER"
MECHANISMS = (OAUTHBEARER, PLAIN)
"""The mechanisms a token listener offers, preferred first."""
_KEY = re.compile(r"[A-Za-z]+")
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*)")


@dataclass(frozen=True, slots=True)
class TokenCredentials:
    """What a token client's SASL initial response says."""

    mechanism: str
    """``PLAIN`` or ``OAUTHBEARER``."""
    username: str | None
    """PLAIN's authcid (None when empty); OAUTHBEARER has none."""
    authzid: str | None
    """PLAIN's authzid or OAUTHBEARER's ``a=`` (None when absent or empty)."""
    token: bytes = field(repr=False)
    """The token (never in ``repr``)."""

    @property
    def claimed_user(self) -> str | None:
        """The user the client names, if any: the authzid, else PLAIN's authcid; it must be
        the token's identity (:func:`~.claims.check_username`)."""
        return self.authzid or self.username


def _malformed(why: str) -> TokenRejected:
    return TokenRejected(RejectReason.MALFORMED, why)


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{what} is not UTF-8") from None


def credentials_from_sasl(mechanism: str, initial_response: bytes | None) -> TokenCredentials:
    """The token and names of a PLAIN or OAUTHBEARER sasl-init.

    Args:
        mechanism: the sasl-init's mechanism (case-insensitive).
        initial_response: its initial response (holds the token; not kept).

    Returns:
        The credentials.

    Raises:
        TokenRejected: ``malformed`` for another mechanism, a missing or ill-formed response,
            names that are not UTF-8, or no token (the text never holds the response).
    """
    mech = mechanism.upper()
    if initial_response is not None and not isinstance(initial_response, bytes | bytearray):
        raise _malformed("the initial response is not binary")
    if not initial_response:
        raise _malformed(f"{mech} sasl-init without an initial response")
    raw = bytes(initial_response)
    if mech == PLAIN:
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise _malformed("PLAIN initial response must be authzid NUL authcid NUL token")
        authzid, authcid, token = parts
        if not token:
            raise _malformed("PLAIN initial response without a token")
        return TokenCredentials(PLAIN, _utf8(authcid, "PLAIN authcid") or None,
                                _utf8(authzid, "PLAIN authzid") or None, token)
    if mech == OAUTHBEARER:
        return _oauthbearer(raw)
    raise _malformed(f"mechanism '{mech[:20]}' carries no token (PLAIN or OAUTHBEARER)")


def _oauthbearer(raw: bytes) -> TokenCredentials:
    header, sep, rest = raw.partition(b"\x01")
    if not sep or not rest.endswith(b"\x01\x01"):
        raise _malformed("OAUTHBEARER response is not gs2-header \\x01 pairs \\x01\\x01")
    gs2 = _utf8(header, "OAUTHBEARER gs2-header").split(",")
    if len(gs2) != 3 or gs2[0] not in ("n", "y") or gs2[2]:
        raise _malformed("OAUTHBEARER gs2-header must be n,[a=authzid], or y,[a=authzid],")
    authzid = None
    if gs2[1]:
        if not gs2[1].startswith("a="):
            raise _malformed("OAUTHBEARER gs2-header authzid is not a=...")
        authzid = _saslname(gs2[1][2:]) or None
    token: bytes | None = None
    for pair in rest[:-2].split(b"\x01"):
        key, eq, value = pair.partition(b"=")
        name = _utf8(key, "OAUTHBEARER key")
        if not eq or not _KEY.fullmatch(name):
            raise _malformed("OAUTHBEARER pair is not key=value")
        if name == "auth":
            if token is not None:
                raise _malformed("OAUTHBEARER response with two auth pairs")
            match = _BEARER.fullmatch(_utf8(value, "OAUTHBEARER auth"))
            if match is None:
                raise _malformed("OAUTHBEARER auth is not 'Bearer <token>'")
            token = match.group(1).encode("ascii")
    if token is None:
        raise _malformed("OAUTHBEARER response without auth=Bearer")
    return TokenCredentials(OAUTHBEARER, None, authzid, token)


def _saslname(name: str) -> str:
    # RFC 5801: "=2C" and "=3D" stand for "," and "="; any other "=" is bad
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise _malformed("OAUTHBEARER authzid has a bad '=' escape")
    return name.replace("=2C", ",").replace("=3D", "=")


def oauthbearer_error_challenge(status: str = "invalid_token", *, scope: str | None = None,
                                openid_configuration: str | None = None) -> bytes:
    """The server's error challenge of a refused OAUTHBEARER exchange (RFC 7628 §3.2.2): a
    JSON object with ``status`` (and ``scope``, ``openid-configuration`` when given)."""
    body: dict[str, str] = {"status": status}
    if scope is not None:
        body["scope"] = scope
    if openid_configuration is not None:
        body["openid-configuration"] = openid_configuration
    return json.dumps(body, separators=(",", ":")).encode()


def is_oauthbearer_abort(response: bytes | None) -> bool:
    """Whether a sasl-response is the client's ``\\x01`` after an error challenge (then the
    exchange ends with the outcome ``auth``)."""
    return response == b"\x01"
