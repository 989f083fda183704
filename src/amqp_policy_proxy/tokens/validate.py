"""Sans-IO. Is this token one the issuer signed for us, and valid now? (RFC 7519, RFC 8725)

:func:`validate_token` checks a compact JWS (the JWT a client gives as its SASL password, in
OAUTHBEARER, or in a renewal) in the order that spends the least on a hostile one:

1. its size (``max_token_bytes``), before anything is decoded;
2. its shape: three base64url segments, a header that is a JSON object;
3. the header: ``alg`` in the allow-list (never ``none``, never HMAC: the allow-list has no
   such value); no key of its own (``jwk``, ``jku``, ``x5u``, ``x5c``) and no critical
   extensions (``crit``, ``b64``): the key comes only from the configured JWKS, by ``kid``;
4. the key: the JWKS's key for the ``kid`` (``unknown_kid`` otherwise), which must be allowed
   to verify that ``alg`` (its family, its curve, its own ``alg``);
5. the signature, by PyJWT with that key object and that one algorithm;
6. the claims, a JSON object without repeated names: ``exp`` (required), ``nbf`` and ``iat``
   against ``now`` with the clock skew; ``iss`` equal to the issuer; ``aud`` naming one of the
   audiences; the identity claim a non-empty string; the ``required_claims`` present.

Every refusal is a :class:`~.errors.TokenRejected` with its reason; nothing else escapes, for
any input. ``now`` is wall-clock seconds since the epoch (the claims' clock).
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .errors import RejectReason, TokenRejected, shown
from .jwks import MAX_KID_CHARS, JwkSet
from .paths import claim_at

if TYPE_CHECKING:  # a type only: the schema (pydantic) stays out of the core
    from .config import TokenAuthConfig

_R = RejectReason
#: A compact JWS: three base64url segments (no padding, no white space); the signature may be
#: empty here so that ``alg: none`` is refused for its algorithm.
_COMPACT = re.compile(rb"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
#: Header parameters that would bring a key, or semantics, of the token's own choosing.
FORBIDDEN_HEADERS = ("jwk", "jku", "x5u", "x5c", "crit", "b64")
_JWS_OPTIONS: Any = {"verify_signature": True, "enforce_minimum_key_length": True}


@cache
def _jws() -> Any:
    """The one PyJWS: verification only, with the algorithm the checks above chose.

    PyJWT (and the parts of cryptography it loads, ~10 MB of RSS) is imported here, when the
    first token is checked, so a proxy without token listeners never loads it.
    """
    from jwt.api_jws import PyJWS

    return PyJWS()


@dataclass(frozen=True, slots=True)
class ValidatedToken:
    """A token that passed every check: what the rest of the proxy needs of it."""

    subject: str
    """The identity claim's value: the policy user."""
    expires_at: float
    """``exp``, seconds since the epoch."""
    issuer: str
    """``iss``."""
    algorithm: str
    """The header's ``alg``."""
    kid: str | None
    """The header's ``kid``."""
    size: int
    """The token's length in bytes."""
    not_before: float | None = None
    """``nbf``, if present."""
    issued_at: float | None = None
    """``iat``, if present."""
    claims: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    """Every claim (read-only), for the group mapping and ``explain``."""


def validate_token(token: str | bytes | bytearray | memoryview, config: TokenAuthConfig,
                   keys: JwkSet | None, now: float) -> ValidatedToken:
    """Validate a JWT against the configuration and the JWKS keys.

    Args:
        token: the compact JWS as the client sent it (str, or bytes of ASCII).
        config: issuer, audiences, algorithms, clock skew, size limit, identity claim.
        keys: the JWKS's keys (:meth:`.jwks.JwksCache.keys`); None when there are none to
            trust.
        now: wall-clock seconds since the epoch.

    Returns:
        The token's identity, times and claims.

    Raises:
        TokenRejected: the first check that fails, with its reason (never any other
            exception; its text never contains the token). For ``unknown_kid`` its ``kid``
            is set, for :meth:`.jwks.JwksCache.unknown_kid`.
    """
    raw = _as_bytes(token, config.max_token_bytes)
    if _COMPACT.fullmatch(raw) is None:
        dots = raw.count(b".")
        raise TokenRejected(_R.MALFORMED, "not a compact JWS (three base64url segments)"
                            if dots != 4 else "an encrypted token (JWE) is not accepted")
    header = _json_object(raw.split(b".", 1)[0], "header")
    alg, kid = _check_header(header, config)
    if keys is None or not len(keys):
        raise TokenRejected(_R.JWKS_UNAVAILABLE, "no JWKS keys to check the token with")
    key = keys.find(kid)
    if key is None:
        raise TokenRejected(_R.UNKNOWN_KID, "no JWKS key has kid " + (
            f"'{shown(kid)}'" if kid is not None else "(none; the JWKS has several keys)"),
            kid=kid)
    if alg not in key.algorithms:
        raise TokenRejected(_R.ALGORITHM_NOT_ALLOWED, f"alg '{alg}' is not one the {key.kty} "
                            f"key '{shown(kid)}' may verify")
    from jwt.exceptions import InvalidSignatureError, PyJWTError

    try:
        decoded = _jws().decode_complete(raw, key.key, algorithms=[alg], options=_JWS_OPTIONS)
    except InvalidSignatureError:
        raise TokenRejected(_R.BAD_SIGNATURE, f"the signature does not verify with key "
                            f"'{shown(kid)}'") from None
    except (PyJWTError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise TokenRejected(_R.MALFORMED, f"cannot verify ({type(exc).__name__})") from None
    claims = _json_object(decoded["payload"], "payload", encoded=False)
    return _check_claims(claims, config, now, alg=alg, kid=kid, size=len(raw))


def unverified_header(token: str | bytes, max_bytes: int = 8192) -> Mapping[str, Any]:
    """The header of a token, not verified: for ``explain --token`` only.

    Raises:
        TokenRejected: oversized or malformed.
    """
    raw = _as_bytes(token, max_bytes)
    if _COMPACT.fullmatch(raw) is None:
        raise TokenRejected(_R.MALFORMED, "not a compact JWS (three base64url segments)")
    return MappingProxyType(_json_object(raw.split(b".", 1)[0], "header"))


def _as_bytes(token: Any, limit: int) -> bytes:
    if isinstance(token, str):
        if len(token) > limit:
            raise TokenRejected(_R.OVERSIZED, f"{len(token)} characters, more than the {limit} "
                                "allowed")
        try:
            raw = token.encode("ascii")
        except UnicodeEncodeError:
            raise TokenRejected(_R.MALFORMED, "not ASCII") from None
    elif isinstance(token, bytes | bytearray | memoryview):
        raw = bytes(token)
    else:
        raise TokenRejected(_R.MALFORMED, f"a {type(token).__name__}, not a string")
    if len(raw) > limit:
        raise TokenRejected(_R.OVERSIZED, f"{len(raw)} bytes, more than the {limit} allowed")
    if not raw:
        raise TokenRejected(_R.MALFORMED, "empty")
    return raw


def _json_object(segment: bytes, what: str, *, encoded: bool = True) -> dict[str, Any]:
    """A base64url segment (or the decoded payload) as a JSON object without repeated names."""
    try:
        data = binascii.a2b_base64(segment.replace(b"-", b"+").replace(b"_", b"/")
                                   + b"=" * (-len(segment) % 4), strict_mode=True) \
            if encoded else segment
        value = json.loads(data, object_pairs_hook=_unique, parse_constant=_no_constant)
    except (ValueError, RecursionError, binascii.Error, UnicodeDecodeError):
        raise TokenRejected(_R.MALFORMED, f"the {what} is not base64url JSON") from None
    if not isinstance(value, dict):
        raise TokenRejected(_R.MALFORMED, f"the {what} is not a JSON object")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError("repeated name")
        out[name] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_header(header: dict[str, Any], config: TokenAuthConfig) -> tuple[str, str | None]:
    alg = header.get("alg")
    if not isinstance(alg, str):
        raise TokenRejected(_R.MALFORMED, "the header has no alg string")
    if alg not in config.algorithms:
        raise TokenRejected(_R.ALGORITHM_NOT_ALLOWED, f"alg '{shown(alg, 16)}' is not in "
                            "algorithms")
    own = [name for name in FORBIDDEN_HEADERS if name in header]
    if own:
        raise TokenRejected(_R.FORBIDDEN_HEADER, f"the header carries {', '.join(own)} (keys "
                            "come only from the configured JWKS)")
    kid = header.get("kid")
    if kid is not None and (not isinstance(kid, str) or not kid or len(kid) > MAX_KID_CHARS):
        raise TokenRejected(_R.MALFORMED, "kid is not a string of 1 to 256 characters")
    return alg, kid


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TokenRejected(_R.MALFORMED, f"{name} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise TokenRejected(_R.MALFORMED, f"{name} is out of range") from None


def _check_claims(claims: dict[str, Any], config: TokenAuthConfig, now: float, *, alg: str,
                  kid: str | None, size: int) -> ValidatedToken:
    skew = config.clock_skew_seconds
    exp = _number(claims, "exp")
    if exp is None:
        raise TokenRejected(_R.MISSING_CLAIM, "no exp (a token must expire)")
    if now >= exp + skew:
        raise TokenRejected(_R.EXPIRED, f"exp is {now - exp:.0f} s past")
    nbf = _number(claims, "nbf")
    if nbf is not None and now + skew < nbf:
        raise TokenRejected(_R.NOT_YET_VALID, f"nbf is {nbf - now:.0f} s ahead")
    iat = _number(claims, "iat")
    if iat is not None and now + skew < iat:
        raise TokenRejected(_R.NOT_YET_VALID, f"iat is {iat - now:.0f} s ahead")
    iss = claims.get("iss")
    if iss is None:
        raise TokenRejected(_R.MISSING_CLAIM, "no iss")
    if iss != config.issuer:
        raise TokenRejected(_R.BAD_ISSUER, f"iss '{shown(iss)}' is not the issuer")
    aud = claims.get("aud")
    if aud is None:
        raise TokenRejected(_R.MISSING_CLAIM, "no aud")
    auds = [aud] if isinstance(aud, str) else aud
    if not isinstance(auds, list) or not all(isinstance(a, str) for a in auds):
        raise TokenRejected(_R.MALFORMED, "aud is not a string or a list of strings")
    if not set(auds) & set(config.audience):
        raise TokenRejected(_R.BAD_AUDIENCE, "aud names none of the audiences")
    subject = claim_at(claims, config.identity_claim)
    if not isinstance(subject, str) or not subject:
        raise TokenRejected(_R.MISSING_CLAIM, f"no {config.identity_claim} string (the "
                            "identity claim)")
    for name in config.required_claims:
        if claim_at(claims, name) is None:
            raise TokenRejected(_R.MISSING_CLAIM, f"no {name} (a required claim)")
    return ValidatedToken(subject=subject, expires_at=exp, issuer=iss, algorithm=alg, kid=kid,
                          size=size, not_before=nbf, issued_at=iat,
                          claims=MappingProxyType(claims))
