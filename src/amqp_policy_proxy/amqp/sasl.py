"""Sans-IO. The identity a client's sasl-init asks the router to authenticate (decision 0001).

The proxy relays SASL to the router, which stays the authentication authority. Policy applies
to the identity the router *authenticates*, never to one the client merely names: PLAIN's
authcid (RFC 4616), SCRAM's ``n=`` (RFC 5802), ANONYMOUS as ``anonymous``, EXTERNAL the
subject of the TLS client certificate the proxy itself verified. A client may also name an
authorization identity (PLAIN's authzid, SCRAM's ``a=``, EXTERNAL's response); the router
(proton with Cyrus) accepts any authzid and authenticates the authcid, so a non-empty authzid
that differs from the authenticated identity is refused by the proxy (SASL outcome ``auth``)
before the sasl-init reaches the router. Mechanisms whose identity the proxy cannot read (e.g.
GSSAPI, XOAUTH2) give no user: such connections are denied as unknown users at the Open.

Passwords are never returned, stored or logged: only names leave this module.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import DecodeError

ANONYMOUS_USER = "anonymous"


class SaslIdentity(NamedTuple):
    """What a sasl-init says about who the client is."""

    user: str | None
    """The identity the router will authenticate (None: the proxy cannot tell)."""
    authzid: str | None
    """A non-empty authorization identity the client asked for, else None."""
    mechanism: str = ""
    """``PLAIN``, ``SCRAM``, ``ANONYMOUS``, ``EXTERNAL`` or ``""`` (another mechanism)."""

    @property
    def asserted(self) -> bool:
        """True when ``user`` is a name the client wrote (PLAIN authcid, SCRAM ``n=``), which
        the upstream's authenticator canonicalises before it looks the user up; False for
        ANONYMOUS, EXTERNAL (the certificate's subject) and unknown mechanisms."""
        return self.mechanism in ("PLAIN", "SCRAM")

    @property
    def impersonates(self) -> bool:
        """True when the client asks to act as someone other than the authenticated user."""
        return self.authzid is not None and self.authzid != self.user


_ANONYMOUS = SaslIdentity(ANONYMOUS_USER, None, "ANONYMOUS")


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"{what} is not UTF-8") from None


def _scram_unescape(name: str) -> str:
    # RFC 5802 §5.1: "=2C" and "=3D" stand for "," and "=" in saslname; any other "=" is bad.
    out = name.replace("=2C", ",").replace("=3D", "=")
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise DecodeError("SCRAM saslname has a bad '=' escape")
    return out


def identity_from_sasl_init(mechanism: str, initial_response: bytes | None, *,
                            tls_identity: str | None = None) -> SaslIdentity:
    """The identity a sasl-init (Part 5 §5.3.3.2) asks to be authenticated as.

    Args:
        mechanism: the SASL mechanism name (case-insensitive).
        initial_response: the raw initial response (may hold a password; never kept).
        tls_identity: the subject of the TLS client certificate the proxy verified on this
            connection, if any (the identity EXTERNAL authenticates).

    Returns:
        ``user``: PLAIN's authcid; SCRAM-*'s ``n=`` (unescaped); ``"anonymous"`` for
        ANONYMOUS; EXTERNAL's ``tls_identity``; None for other mechanisms. ``authzid``: a
        non-empty PLAIN authzid, SCRAM ``a=`` or EXTERNAL response, else None.

    Raises:
        DecodeError: a PLAIN or SCRAM response that is not well formed, an empty PLAIN
            authcid, or names that are not UTF-8.
    """
    mech = mechanism.upper()
    if mech == "ANONYMOUS":
        return _ANONYMOUS
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
        if not authcid:
            raise DecodeError("PLAIN initial response without an authcid")
        return SaslIdentity(_utf8(authcid, "PLAIN authcid"),
                            _utf8(authzid, "PLAIN authzid") if authzid else None, "PLAIN")
    if mech.startswith("SCRAM-"):
        if not initial_response:
            raise DecodeError("SCRAM sasl-init without client-first-message")
        text = _utf8(bytes(initial_response), "SCRAM client-first-message")
        # gs2-header "n,," / "y,," / "p=cb,"  [a=authzid] ","  then "n=<user>,r=<nonce>,..."
        pieces = text.split(",")
        if len(pieces) < 4 or pieces[0][:1] not in ("n", "y", "p"):
            raise DecodeError("SCRAM client-first-message malformed")
        authz = pieces[1]
        if authz and not authz.startswith("a="):
            raise DecodeError("SCRAM gs2-header authzid malformed")
        if not pieces[2].startswith("n="):
            raise DecodeError("SCRAM client-first-message without n=")
        user = _scram_unescape(pieces[2][2:])
        if not user:
            raise DecodeError("SCRAM client-first-message with an empty n=")
        claimed = _scram_unescape(authz[2:]) if authz else ""
        return SaslIdentity(user, claimed or None, "SCRAM")
    if mech == "EXTERNAL":
        claimed = _utf8(bytes(initial_response), "EXTERNAL authzid") if initial_response else ""
        return SaslIdentity(tls_identity, claimed or None, "EXTERNAL")
    return SaslIdentity(None, None)
