"""Sans-IO. The issuer's public keys: a JWKS parsed into keys by ``kid``, and the cache that says
when to fetch it.

:func:`parse_jwks` turns a JWKS document (RFC 7517) into a :class:`JwkSet`: each usable
signing key by its ``kid``, with the algorithms it may verify (the configured allow-list, the
key's family and curve, and its own ``alg`` when it names one). Keys that cannot sign tokens
for the proxy (``use`` other than ``sig``, symmetric ``oct`` keys, private key material, RSA
keys shorter than 2048 bits, unknown types or curves, a repeated ``kid``) are left out and
listed in :attr:`JwkSet.skipped` for the log.

:class:`JwksCache` is a state machine the shell drives: it says when a fetch is due
(:meth:`~JwksCache.due`, :meth:`~JwksCache.next_fetch_at`), the shell fetches (HTTP for
``jwks_url``, a read for ``jwks_file``) and reports the bytes or the failure; an unknown
``kid`` asks for an early fetch, at most once per ``jwks_min_refresh_seconds``; failures back
off exponentially while the cached keys stay in use, their age reported for a metric and an
alert. Its ``now`` is the shell's monotonic clock, in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

#: The signature algorithms a token may use: asymmetric ones only. HMAC (``HS*``) would need a
#: secret shared with every proxy, and with a public key as its secret it is the classic
#: algorithm-confusion forgery; ``none`` is no signature at all. ``[token_auth] algorithms``
#: chooses among these (``tokens/config.py``).
ALGORITHMS: tuple[str, ...] = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                               "ES256", "ES384", "ES512", "ES256K", "EdDSA")

#: The algorithms of each key family: RSA keys verify RS* and PS*; an EC key only the
#: algorithm of its curve; an OKP key (Ed25519, Ed448) EdDSA.
_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALGORITHMS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512", "secp256k1": "ES256K"}
_OKP_CURVES = frozenset({"Ed25519", "Ed448"})
#: RSA keys shorter than this are refused (NIST SP 800-131A; PyJWT warns below it too).
MIN_RSA_BITS = 2048
#: The longest ``kid`` kept (longer ones are refused as malformed tokens too).
MAX_KID_CHARS = 256


class JwksError(ValueError):
    """A JWKS document that cannot be used: not JSON, not ``{"keys": [...]}``, too large, or
    without one usable signing key. The text says why (and names the source when known)."""


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """One public key of the JWKS, ready to verify signatures."""

    kid: str | None
    """The key's ``kid``; None for a key without one."""
    kty: str
    """``RSA``, ``EC`` or ``OKP``."""
    algorithms: frozenset[str]
    """The algorithms this key may verify (never empty)."""
    key: Any = field(repr=False)
    """The ``cryptography`` public key object."""


@dataclass(frozen=True, slots=True)
class JwkSet:
    """The usable keys of one JWKS document."""

    keys: Mapping[str, VerificationKey] = field(default_factory=lambda: MappingProxyType({}))
    """Keys by ``kid``."""
    unnamed: tuple[VerificationKey, ...] = ()
    """Keys without a ``kid``."""
    skipped: tuple[str, ...] = ()
    """One line per key left out, saying why (no key material in it)."""

    def __len__(self) -> int:
        """The number of usable keys."""
        return len(self.keys) + len(self.unnamed)

    def find(self, kid: str | None) -> VerificationKey | None:
        """The key a token's ``kid`` names.

        Args:
            kid: the token header's ``kid``, or None when it has none.

        Returns:
            The key with that ``kid``; for a token without one, the only key of the set (None
            when the set holds several: the token does not say which); None when no key fits.
        """
        if kid is not None:
            return self.keys.get(kid)
        if len(self) == 1:
            return next(iter(self.keys.values())) if self.keys else self.unnamed[0]
        return None


def parse_jwks(document: bytes | str, *, algorithms: Iterable[str] = ALGORITHMS,
               max_bytes: int = 1024 * 1024, source: str = "JWKS") -> JwkSet:
    """Parse a JWKS document into its usable signing keys.

    Args:
        document: the JSON text of ``{"keys": [JWK, ...]}``.
        algorithms: the configured allow-list; a key verifies only algorithms in it.
        max_bytes: the largest document accepted.
        source: what to call the document in errors (a path or URL).

    Returns:
        The keys; ``skipped`` says which were left out and why.

    Raises:
        JwksError: the document is too large, not JSON, not an object with a ``keys`` list,
            or has no usable key.
    """
    if len(document) > max_bytes:
        raise JwksError(f"{source}: {len(document)} bytes, more than the {max_bytes} allowed")
    try:
        data = json.loads(document, parse_constant=_no_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise JwksError(f"{source}: not JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise JwksError(f"{source}: not a JWKS (expected an object with a \"keys\" list)")
    allowed = frozenset(algorithms)
    keys: dict[str, VerificationKey] = {}
    unnamed: list[VerificationKey] = []
    skipped: list[str] = []
    for index, jwk in enumerate(data["keys"]):
        try:
            key = _verification_key(jwk, allowed)
        except JwksError as exc:
            skipped.append(f"key {index}: {exc}")
            continue
        if key.kid is None:
            unnamed.append(key)
        elif key.kid in keys:
            skipped.append(f"key {index}: kid {key.kid!r} repeated (the first one is used)")
        else:
            keys[key.kid] = key
    if not keys and not unnamed:
        why = "; ".join(skipped) if skipped else "the keys list is empty"
        raise JwksError(f"{source}: no usable signing key ({why})")
    return JwkSet(MappingProxyType(keys), tuple(unnamed), tuple(skipped))


def read_jwks_file(path: str | Path, *, algorithms: Iterable[str] = ALGORITHMS,
                   max_bytes: int = 1024 * 1024) -> JwkSet:
    """Read and parse a JWKS file (``jwks_file``): for ``check``, ``explain --token`` and the
    shell's file source.

    Raises:
        JwksError: the file cannot be read (the OS's reason), or :func:`parse_jwks` refuses
            it; the text starts with the path.
    """
    try:
        with open(path, "rb") as f:
            document = f.read(max_bytes + 1)
    except OSError as exc:
        raise JwksError(f"{path}: {exc.strerror or exc}") from None
    return parse_jwks(document, algorithms=algorithms, max_bytes=max_bytes, source=str(path))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _verification_key(jwk: Any, allowed: frozenset[str]) -> VerificationKey:
    """One JWK as a verification key, or :class:`JwksError` saying why it is left out."""
    if not isinstance(jwk, dict):
        raise JwksError("not an object")
    kid = jwk.get("kid")
    if kid is not None and (not isinstance(kid, str) or not kid or len(kid) > MAX_KID_CHARS):
        raise JwksError("kid is not a string of 1 to 256 characters")
    named = f"kid {kid!r}" if kid is not None else "no kid"
    kty = jwk.get("kty")
    use = jwk.get("use")
    if use is not None and use != "sig":
        raise JwksError(f"{named}: use {use!r} is not sig")
    ops = jwk.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        raise JwksError(f"{named}: key_ops does not allow verify")
    if "d" in jwk:
        raise JwksError(f"{named}: holds private key material (a JWKS publishes public keys)")
    if kty == "RSA":
        family = _RSA_ALGORITHMS
    elif kty == "EC":
        crv = jwk.get("crv")
        if crv not in _EC_ALGORITHMS:
            raise JwksError(f"{named}: unsupported EC curve {crv!r}")
        family = frozenset({_EC_ALGORITHMS[crv]})
    elif kty == "OKP":
        if jwk.get("crv") not in _OKP_CURVES:
            raise JwksError(f"{named}: unsupported OKP curve {jwk.get('crv')!r}")
        family = frozenset({"EdDSA"})
    elif kty == "oct":
        raise JwksError(f"{named}: symmetric (oct) keys are not accepted")
    else:
        raise JwksError(f"{named}: unsupported kty {kty!r}")
    declared = jwk.get("alg")
    if declared is not None:
        if not isinstance(declared, str) or declared not in family:
            raise JwksError(f"{named}: alg {declared!r} does not fit a {kty} key")
        family = frozenset({declared})
    usable = family & allowed
    if not usable:
        raise JwksError(f"{named}: none of its algorithms ({', '.join(sorted(family))}) is "
                        "in algorithms")
    # PyJWT is imported on the first JWKS read (a proxy without tokens never loads it)
    from jwt import PyJWK
    from jwt.exceptions import PyJWTError

    try:
        # PyJWK picks an algorithm only to build the key; which ones it may verify is ours
        material = PyJWK(jwk, algorithm=min(usable)).key
    except (PyJWTError, ValueError, TypeError, KeyError) as exc:
        raise JwksError(f"{named}: not a valid {kty} key ({type(exc).__name__})") from None
    if kty == "RSA" and material.key_size < MIN_RSA_BITS:
        raise JwksError(f"{named}: RSA key of {material.key_size} bits (at least "
                        f"{MIN_RSA_BITS} needed)")
    return VerificationKey(kid, kty, usable, material)


# ---------------------------------------------------------------------------- the cache


@dataclass(frozen=True, slots=True)
class JwksStatus:
    """What the cache reports for metrics, the alert and the status line."""

    keys: int
    """Usable keys held."""
    age_seconds: float | None
    """Seconds since the last successful fetch (None: never fetched): the staleness gauge."""
    failures: int
    """Fetches failed in a row since the last success."""
    last_error: str | None
    """Why the last fetch failed (None after a success)."""
    usable: bool
    """Tokens can be checked: keys are held and not older than ``max_stale_seconds``."""


class JwksCache:
    """When to fetch the JWKS, and the keys from the last good fetch (sans-IO).

    The shell calls :meth:`due` (or sleeps until :meth:`next_fetch_at`), then
    :meth:`fetch_started`, fetches, and reports :meth:`fetched` with the bytes or
    :meth:`fetch_failed` with the reason. A token with an unknown ``kid`` calls
    :meth:`unknown_kid`, which makes a fetch due at once unless one was started less than
    ``min_refresh_seconds`` ago. After a failure the next fetch waits ``retry_seconds``,
    doubled after every further failure up to ``max_retry_seconds``; the keys of the last good
    fetch stay in use (:meth:`keys`) until they are older than ``max_stale_seconds`` (never,
    when None). A good fetch schedules the next one ``refresh_seconds`` later. All times are
    the shell's monotonic clock in seconds.
    """

    def __init__(self, *, refresh_seconds: float = 3600.0, min_refresh_seconds: float = 30.0,
                 retry_seconds: float = 5.0, max_retry_seconds: float = 300.0,
                 max_stale_seconds: float | None = None, algorithms: Iterable[str] = ALGORITHMS,
                 max_bytes: int = 1024 * 1024, source: str = "JWKS") -> None:
        """Create an empty cache; the first fetch is due at once.

        Args:
            refresh_seconds: the interval between good fetches.
            min_refresh_seconds: the least time between the start of one fetch and an early
                fetch asked for by an unknown ``kid``.
            retry_seconds: the wait after the first failure (doubled after each further one).
            max_retry_seconds: the longest wait after failures.
            max_stale_seconds: keys older than this are no longer used; None: always used.
            algorithms: the configured allow-list (:func:`parse_jwks`).
            max_bytes: the largest JWKS document accepted.
            source: the URL or path, for errors and the log.

        Raises:
            ValueError: an interval that is not positive.
        """
        for name, value in (("refresh_seconds", refresh_seconds),
                            ("min_refresh_seconds", min_refresh_seconds),
                            ("retry_seconds", retry_seconds),
                            ("max_retry_seconds", max_retry_seconds)):
            if not value > 0:
                raise ValueError(f"{name} must be more than 0, got {value}")
        self.refresh_seconds = refresh_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max(max_retry_seconds, retry_seconds)
        self.max_stale_seconds = max_stale_seconds
        self.algorithms = frozenset(algorithms)
        self.max_bytes = max_bytes
        self.source = source
        self._keys: JwkSet | None = None
        self._loaded_at: float | None = None
        self._next: float | None = None  # None: due at once (nothing fetched yet)
        self._in_flight = False
        self._started_at: float | None = None
        self._failures = 0
        self._last_error: str | None = None

    @classmethod
    def from_config(cls, config: Any) -> JwksCache:
        """A cache with the intervals of a :class:`~.config.TokenAuthConfig`."""
        return cls(refresh_seconds=config.jwks_refresh_seconds,
                   min_refresh_seconds=config.jwks_min_refresh_seconds,
                   retry_seconds=config.jwks_retry_seconds,
                   max_retry_seconds=config.jwks_max_retry_seconds,
                   max_stale_seconds=config.jwks_max_stale_seconds,
                   algorithms=config.algorithms, max_bytes=config.jwks_max_bytes,
                   source=config.jwks_url or config.jwks_file or "JWKS")

    # -- when to fetch

    @property
    def in_flight(self) -> bool:
        """A fetch was started and has not been reported yet."""
        return self._in_flight

    def next_fetch_at(self) -> float | None:
        """When the next fetch is due (monotonic seconds; a time in the past means now), or
        None while a fetch is under way."""
        if self._in_flight:
            return None
        return float("-inf") if self._next is None else self._next

    def due(self, now: float) -> bool:
        """Whether the shell should start a fetch now."""
        at = self.next_fetch_at()
        return at is not None and now >= at

    def fetch_started(self, now: float) -> None:
        """The shell started a fetch (no other one is due until it is reported)."""
        self._in_flight = True
        self._started_at = now

    def fetched(self, document: bytes | str, now: float) -> JwkSet:
        """The shell's fetch returned ``document``: parse it and, if good, use its keys.

        Returns:
            The new keys (the next fetch is then due ``refresh_seconds`` later).

        Raises:
            JwksError: the document is unusable; counted as a failed fetch (back-off), the
                keys held before stay in use.
        """
        try:
            keys = parse_jwks(document, algorithms=self.algorithms, max_bytes=self.max_bytes,
                              source=self.source)
        except JwksError as exc:
            self.fetch_failed(str(exc), now)
            raise
        self._keys = keys
        self._loaded_at = now
        self._in_flight = False
        self._failures = 0
        self._last_error = None
        self._next = now + self.refresh_seconds
        return keys

    def fetch_failed(self, error: str, now: float) -> None:
        """The shell's fetch failed (refused, timed out, an HTTP error, an unusable
        document): back off, keep the keys held.

        Args:
            error: why, for the status and the log (no secrets in it).
            now: monotonic seconds.
        """
        self._in_flight = False
        self._failures += 1
        self._last_error = error
        wait = min(self.retry_seconds * 2 ** min(self._failures - 1, 62), self.max_retry_seconds)
        self._next = now + wait

    def unknown_kid(self, kid: str | None, now: float) -> bool:
        """A token named a ``kid`` the keys do not have: fetch early if allowed.

        An early fetch is allowed when no fetch was started in the last
        ``min_refresh_seconds`` and the URL is not failing (then the back-off decides).

        Args:
            kid: the token's ``kid`` (not kept: any random string may come here).
            now: monotonic seconds.

        Returns:
            True when a fetch is under way or now due (the caller may hold the connection and
            validate again after :meth:`fetched`); False when the token is to be refused now.
        """
        del kid
        if self._in_flight:
            return True
        if self._failures:
            return self.due(now)
        if self._started_at is not None and now - self._started_at < self.min_refresh_seconds:
            return False
        self._next = now
        return True

    # -- the keys

    def keys(self, now: float) -> JwkSet | None:
        """The keys to check tokens with, or None when there are none to trust (never
        fetched, or older than ``max_stale_seconds``)."""
        if self._keys is None or self._loaded_at is None:
            return None
        if self.max_stale_seconds is not None and now - self._loaded_at > self.max_stale_seconds:
            return None
        return self._keys

    def age(self, now: float) -> float | None:
        """Seconds since the last good fetch (None: never): the staleness metric."""
        return None if self._loaded_at is None else max(0.0, now - self._loaded_at)

    def status(self, now: float) -> JwksStatus:
        """The figures for metrics, the alert and ``status``."""
        held = self._keys
        return JwksStatus(len(held) if held is not None else 0, self.age(now), self._failures,
                          self._last_error, self.keys(now) is not None)
