"""Sans-IO. User-name extraction from a client's sasl-init (ARCHITECTURE decision 1).

The proxy relays SASL to the router, which stays the authentication authority; the user name
read here is trusted only after the router's sasl-outcome is ``ok``. Passwords are never
returned, stored or logged: only the name leaves this module.
"""

from __future__ import annotations

from .errors import DecodeError

ANONYMOUS_USER = "anonymous"


def _scram_unescape(name: str) -> str:
    # RFC 5802 §5.1: "=2C" and "=3D" stand for "," and "=" in saslname.
    return name.replace("=2C", ",").replace("=3D", "=")


def user_from_sasl_init(mechanism: str, initial_response: bytes | None) -> str | None:
    """Return the user name a client claims in its sasl-init, or None if unknown.

    Args:
        mechanism: the SASL mechanism name (case-insensitive).
        initial_response: the raw initial response (may hold a password; not kept).

    Returns:
        PLAIN: the authzid if present, else the authcid (RFC 4616). SCRAM-*: the ``n=``
        attribute of the client-first-message, unescaped (RFC 5802). ANONYMOUS:
        ``"anonymous"``. EXTERNAL: the authzid if one is given, else None (the identity is
        the TLS client certificate's, known only to the router). Other mechanisms: None, and
        the connection is treated as a user in no group.

    Raises:
        DecodeError: a PLAIN or SCRAM response that is not well formed, or an initial
            response that is not binary.
    """
    mech = mechanism.upper()
    if mech == "ANONYMOUS":
        return ANONYMOUS_USER
    if initial_response is not None and not isinstance(initial_response, bytes | bytearray):
        # The field is binary (Part 5 §5.3.3.2); anything else comes from a hostile client.
        # Never call bytes() on it: bytes(int) allocates that many bytes.
        raise DecodeError("sasl-init initial-response is not binary")
    if mech == "PLAIN":
        if not initial_response:
            raise DecodeError("PLAIN sasl-init without initial response")
        parts = bytes(initial_response).split(b"\x00")
        if len(parts) != 3:
            raise DecodeError("PLAIN initial response must be authzid NUL authcid NUL passwd")
        authzid, authcid = parts[0], parts[1]
        name = authzid or authcid
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("PLAIN user name is not UTF-8") from None
    if mech.startswith("SCRAM-"):
        if not initial_response:
            raise DecodeError("SCRAM sasl-init without client-first-message")
        try:
            text = bytes(initial_response).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("SCRAM client-first-message is not UTF-8") from None
        # gs2-header: "n,," / "y,," / "p=...,"; then "n=<user>,r=<nonce>"
        pieces = text.split(",")
        if len(pieces) < 4:
            raise DecodeError("SCRAM client-first-message malformed")
        authzid = pieces[1]
        for attr in pieces[2:]:
            if attr.startswith("n="):
                if authzid.startswith("a="):
                    return _scram_unescape(authzid[2:])
                return _scram_unescape(attr[2:])
        raise DecodeError("SCRAM client-first-message without n=")
    if mech == "EXTERNAL":
        if initial_response:
            try:
                return bytes(initial_response).decode("utf-8") or None
            except UnicodeDecodeError:
                raise DecodeError("EXTERNAL authzid is not UTF-8") from None
        return None
    return None
