"""Sans-IO. Why a token is refused: one fixed set of reasons, and the one error that carries it.

The reasons are the ``reason`` label of ``amqp_proxy_token_rejections_total`` and the words of
the one log line a refusal gets, so they are a closed set (:class:`RejectReason`). A
:class:`TokenRejected` never holds the token: its text names the reason and what was wrong
(a claim's name, a bounded and escaped ``kid`` or ``alg``), never a segment of the token.
"""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    """Why a token (or a renewal with one) was refused."""

    MALFORMED = "malformed"
    """Not a compact JWS of three base64url segments with JSON objects, or a registered claim
    of the wrong type (``exp`` that is not a number, ``aud`` that is not a string or list)."""
    OVERSIZED = "oversized"
    """Longer than ``max_token_bytes``; refused before anything of it is decoded."""
    ALGORITHM_NOT_ALLOWED = "algorithm_not_allowed"
    """``alg`` is ``none``, HMAC, not in ``algorithms``, or not one the key may verify (an
    ``ES256`` token for an RSA key, ``RS384`` for a JWK whose ``alg`` is ``RS256``)."""
    FORBIDDEN_HEADER = "forbidden_header"
    """The header names a key of its own (``jwk``, ``jku``, ``x5u``, ``x5c``) or critical
    extensions (``crit``, ``b64``): keys come only from the configured JWKS."""
    UNKNOWN_KID = "unknown_kid"
    """No key of the JWKS has the token's ``kid`` (or the token has none and the JWKS holds
    more than one key)."""
    JWKS_UNAVAILABLE = "jwks_unavailable"
    """No keys to check against: the JWKS was never fetched, or is older than
    ``jwks_max_stale_seconds``."""
    BAD_SIGNATURE = "bad_signature"
    """The signature does not verify with the key (a tampered header or payload, another
    issuer's key)."""
    EXPIRED = "expired"
    """``exp`` (plus the clock skew) is past."""
    NOT_YET_VALID = "not_yet_valid"
    """``nbf`` or ``iat`` (less the clock skew) is in the future."""
    BAD_ISSUER = "bad_issuer"
    """``iss`` is not the configured issuer."""
    BAD_AUDIENCE = "bad_audience"
    """No ``aud`` value is one of the configured audiences."""
    MISSING_CLAIM = "missing_claim"
    """``exp``, ``iss``, ``aud``, the identity claim or a ``required_claims`` entry is absent
    (or the identity claim is not a non-empty string)."""
    USERNAME_MISMATCH = "username_mismatch"
    """SASL PLAIN (or OAUTHBEARER's ``a=``) names a user other than the token's identity."""
    SUBJECT_CHANGED = "subject_changed"
    """A renewal's token is for another identity than the connection's."""
    NOT_NEWER = "not_newer"
    """A renewal's token expires before the connection's current token."""


class TokenRejected(Exception):
    """A token was refused; ``reason`` is the metric label, ``str()`` the log text.

    The text never contains the token or any part of it.
    """

    def __init__(self, reason: RejectReason, detail: str, *, kid: str | None = None) -> None:
        """Create the refusal.

        Args:
            reason: the label (:class:`RejectReason`).
            detail: what was wrong, in words; must not contain the token.
            kid: the token's ``kid`` when the reason is ``unknown_kid`` (so the caller can ask
                the JWKS cache for a refresh), else None.
        """
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.kid = kid


def shown(value: object, limit: int = 64) -> str:
    """A peer-chosen value (a ``kid``, an ``alg``) made safe for a log line: ASCII-escaped
    and cut to ``limit`` characters (with ``...`` when cut)."""
    text = ascii(value)[1:-1] if isinstance(value, str) else ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."
