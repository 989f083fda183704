"""A local issuer for the token tests: RSA and EC keys made here, tokens signed with PyJWT (the
library the proxy validates with), its JWKS as bytes."""

from __future__ import annotations

import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from amqp_policy_proxy.tokens.config import TokenAuthConfig
from amqp_policy_proxy.tokens.jwks import JwkSet, parse_jwks

ISSUER = "https://idp.test/realms/amqp"
AUDIENCE = "amqp-proxy"
#: A fixed wall clock (2026-12-01T00:00:00Z) for the claims' times.
NOW = 1_796_083_200.0

_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_EC_KEY = ec.generate_private_key(ec.SECP256R1())


class Issuer:
    """Signs tokens with its keys and publishes them as a JWKS."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {"rsa-1": _RSA_KEY, "ec-1": _EC_KEY}

    def add_rsa(self, kid: str, bits: int = 2048) -> None:
        """A new RSA key (rotation)."""
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=bits)

    def jwk(self, kid: str) -> dict[str, Any]:
        """The public JWK of ``kid``."""
        key = self.keys[kid]
        algo = RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else ECAlgorithm
        out = json.loads(algo.to_jwk(key.public_key()))
        out["kid"] = kid
        out["use"] = "sig"
        return out

    def jwks(self, *kids: str) -> bytes:
        """The JWKS document of ``kids`` (default: every key)."""
        return json.dumps({"keys": [self.jwk(k) for k in (kids or self.keys)]}).encode()

    def keyset(self, *kids: str) -> JwkSet:
        """The parsed JWKS."""
        return parse_jwks(self.jwks(*kids))

    def claims(self, **changes: Any) -> dict[str, Any]:
        """Good claims, with ``changes`` (a value None removes the claim)."""
        claims: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice",
                                  "exp": NOW + 300, "iat": NOW - 10, "nbf": NOW - 10,
                                  "scope": "amqp-proxy.send amqp-proxy.receive openid"}
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, kid: str = "rsa-1", alg: str | None = None,
              headers: dict[str, Any] | None = None, **changes: Any) -> str:
        """A token signed with ``kid`` (RS256 for RSA keys, ES256 for EC ones)."""
        key = self.keys[kid]
        alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
        return jwt.encode(self.claims(**changes), key, algorithm=alg,
                          headers={"kid": kid, **(headers or {})})


@pytest.fixture
def issuer() -> Issuer:
    """The local issuer (its two keys are made once per test run: RSA key generation is slow)."""
    return Issuer()


def make_config(**changes: Any) -> TokenAuthConfig:
    """A configuration for the local issuer, with ``changes``."""
    base: dict[str, Any] = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_file": "jwks.json",
                            "algorithms": ["RS256", "PS256", "ES256"],
                            "scope_prefix": "amqp-proxy."}
    base.update(changes)
    return TokenAuthConfig.model_validate(base)


@pytest.fixture
def config() -> TokenAuthConfig:
    """The default configuration for the local issuer."""
    return make_config()
