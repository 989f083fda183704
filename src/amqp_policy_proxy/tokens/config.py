"""Sans-IO. The configuration of token authentication: one pydantic model, checked on load.

:class:`TokenAuthConfig` is what a ``[token_auth]`` table of the daemon's TOML file holds
(the daemon mounts it; keys are snake_case, and each key's description is the docstring below
its field, as the daemon's reference generator reads them). It is strict like the daemon's own
tables: unknown keys are errors, a string is never a number, and the keys that go together are
checked together (exactly one of ``jwks_file`` and ``jwks_url``; no HMAC or ``none`` in
``algorithms``). File paths are not opened here.

Two clocks are involved: token times (``exp``, ``nbf``, ``iat``) are compared with wall-clock
seconds since the epoch; the JWKS refresh intervals are durations on the shell's monotonic
clock.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

#: The signature algorithms a token may use: :data:`.jwks.ALGORITHMS` spelled as a type (a test
#: holds the two equal).
Algorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                    "ES256", "ES384", "ES512", "ES256K", "EdDSA"]

TokenAuthority = Literal["proxy", "upstream"]


def _nonempty(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "must not be empty")
    return value


def _one_or_many(value: Any) -> Any:
    """A single string is a list of one (``audience = "amqp"``)."""
    return [value] if isinstance(value, str) else value


def _claim_path(value: str) -> str:
    if not value or value.startswith(".") or value.endswith(".") or ".." in value:
        raise PydanticCustomError(
            "claim_path", "expected a claim name or a dotted path such as "
            "\"realm_access.roles\", got {got!r}", {"got": value})
    return value


def _jwks_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise PydanticCustomError("jwks_url", "expected an https:// URL, got {got!r}",
                                  {"got": value})
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise PydanticCustomError(
            "jwks_url", "http:// only for a loopback host (the keys that decide who is "
            "authenticated must come over TLS); use https://")
    return value


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


NonEmpty = Annotated[str, AfterValidator(_nonempty)]
ClaimPath = Annotated[str, AfterValidator(_claim_path)]
Audiences = Annotated[list[NonEmpty], BeforeValidator(_one_or_many), Field(min_length=1)]
JwksUrl = Annotated[str, AfterValidator(_jwks_url)]
Seconds = Annotated[float, Field(gt=0)]
Skew = Annotated[float, Field(ge=0)]
ByteLimit = Annotated[int, Field(gt=0)]


class _Model(BaseModel):
    """Strict, unknown keys are errors, immutable (as the daemon's tables)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class GroupRule(_Model):
    """One ``[[token_auth.groups]]`` entry: holders of any of ``scopes`` are in ``group`` of
    ``vhost``. For each vhost the first matching entry, in file order, decides."""

    vhost: NonEmpty
    """The vhost's name as the policy defines it (not an alias)."""
    group: NonEmpty
    """A group of that vhost (its ``groups`` key in the policy)."""
    scopes: Annotated[list[NonEmpty], BeforeValidator(_one_or_many), Field(min_length=1)]
    """Scopes (after the aliases and with scope_prefix removed) any one of which puts the
    token's user in the group."""


class TokenAuthConfig(_Model):
    """``[token_auth]``: OAuth 2.0 access tokens (JWT) as client credentials."""

    issuer: NonEmpty
    """The issuer (iss) every token must carry, exactly, e.g. "https://idp.example/realms/x"."""
    audience: Audiences
    """The audience (aud) a token must name: one string or a list, any one of which must be
    among the token's aud values."""
    algorithms: Annotated[list[Algorithm], Field(min_length=1)] = ["RS256", "ES256"]
    """The signature algorithms accepted (asymmetric only: RS*, PS*, ES*, EdDSA; never HS* or
    none)."""
    jwks_file: NonEmpty | None = None
    """A JWKS file (JSON, {"keys": [...]}) with the issuer's public keys; re-read every
    jwks_refresh_seconds. Exactly one of jwks_file and jwks_url."""
    jwks_url: JwksUrl | None = None
    """The issuer's JWKS endpoint (https://; http:// for a loopback host only), fetched at start,
    every jwks_refresh_seconds, and when a token names an unknown kid."""
    jwks_refresh_seconds: Seconds = 3600.0
    """How often the JWKS is fetched (or the file re-read) when all is well."""
    jwks_min_refresh_seconds: Seconds = 30.0
    """At most one fetch for unknown kids per this many seconds, so that tokens with random
    kids cannot make the proxy fetch on every connection."""
    jwks_retry_seconds: Seconds = 5.0
    """The first wait after a failed fetch; doubled after each further failure, up to
    jwks_max_retry_seconds. The cached keys stay in use meanwhile."""
    jwks_max_retry_seconds: Seconds = 300.0
    """The longest wait between two failed fetches."""
    jwks_max_stale_seconds: Seconds | None = None
    """Refuse tokens (reason jwks_unavailable) once the last good JWKS is older than this;
    absent: cached keys are used for as long as the URL is down (the staleness is reported)."""
    jwks_max_bytes: ByteLimit = 1024 * 1024
    """The largest JWKS document accepted (bytes)."""
    jwks_fetch_timeout_seconds: Seconds = 10.0
    """How long one fetch of jwks_url may take before it counts as failed."""
    clock_skew_seconds: Skew = 30.0
    """Leeway for exp, nbf and iat against this host's clock."""
    max_token_bytes: ByteLimit = 8192
    """The longest token accepted (bytes); a longer one is refused before it is decoded."""
    expiry_grace_seconds: Skew = 0.0
    """A connection whose token was not renewed is closed this long after exp."""
    identity_claim: ClaimPath = "sub"
    """The claim whose value is the policy user (counts, ledger, rates, user-id checks, audit,
    metrics, event log): "sub", or e.g. "preferred_username", "client_id", a dotted path."""
    required_claims: list[ClaimPath] = []
    """Claims a token must carry besides exp, iss, aud and the identity claim (e.g. "iat",
    "jti")."""
    scope_claims: Annotated[list[ClaimPath], Field(min_length=1)] = ["scope"]
    """The claims whose values are scopes: a space-separated string or a list of strings each,
    e.g. ["scope", "roles", "groups", "realm_access.roles"]."""
    scope_prefix: str = ""
    """Only scopes starting with this prefix count, and it is removed (e.g. "amqp-proxy."); ""
    takes every scope as it is."""
    scope_aliases: dict[NonEmpty, Annotated[list[NonEmpty], BeforeValidator(_one_or_many)]] = {}
    """A claim value that stands for scopes (RabbitMQ's scope_aliases), e.g. {"admin" =
    ["amqp-proxy.ops"]}; the alias is replaced by its scopes before scope_prefix applies."""
    groups: list[GroupRule] = []
    """Which scopes put a token's user in which group of each vhost (see [[token_auth.groups]]);
    a vhost no entry decides falls back to the policy's own users lists, "*" and $default."""
    token_authority: TokenAuthority = "proxy"
    """"proxy": the proxy validates the token, completes SASL with the client itself and
    authenticates to the router with its service identity; "upstream": the SASL exchange is
    relayed to a router that validates tokens itself, and the proxy admits only when both
    accept the token (docs/decisions/0008-token-authority.md)."""

    @model_validator(mode="after")
    def _one_jwks_source(self) -> TokenAuthConfig:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise PydanticCustomError(
                "jwks_source", "exactly one of jwks_file and jwks_url is needed (the issuer's "
                "public keys)")
        if self.jwks_max_retry_seconds < self.jwks_retry_seconds:
            raise PydanticCustomError(
                "jwks_retry", "jwks_max_retry_seconds ({high}) is below jwks_retry_seconds "
                "({low})", {"high": self.jwks_max_retry_seconds, "low": self.jwks_retry_seconds})
        return self
