"""A local OAuth 2.0 issuer for token tests beyond the tokens package: keys made here, tokens
signed with PyJWT (the library the proxy validates with), the JWKS as bytes or served over HTTP
on 127.0.0.1 by a real aiohttp server in a thread of its own (started and stopped by the test)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ISSUER = "https://idp.test/realms/amqp"
AUDIENCE = "amqp-proxy"

_RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
_EC_KEY = ec.generate_private_key(ec.SECP256R1())


class Issuer:
    """Signs tokens with its keys and publishes the public ones as a JWKS."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {"rsa-1": _RSA_KEY, "ec-1": _EC_KEY}
        self.published: list[str] = ["rsa-1", "ec-1"]
        """The kids the JWKS names (a rotation adds a key here)."""

    def add_rsa(self, kid: str) -> None:
        """A new RSA key, not published yet."""
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self, kid: str) -> dict[str, Any]:
        """The public JWK of ``kid``."""
        key = self.keys[kid]
        algo = RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else ECAlgorithm
        out: dict[str, Any] = json.loads(algo.to_jwk(key.public_key()))
        out["kid"] = kid
        out["use"] = "sig"
        return out

    def jwks(self) -> bytes:
        """The JWKS document of the published keys."""
        return json.dumps({"keys": [self.jwk(k) for k in self.published]}).encode()

    def claims(self, now: float | None = None, **changes: Any) -> dict[str, Any]:
        """Good claims at ``now`` (default: this host's clock), with ``changes`` (a value
        None removes the claim)."""
        at = time.time() if now is None else now
        claims: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice",
                                  "exp": int(at) + 300, "iat": int(at) - 10,
                                  "scope": "amqp-proxy.send amqp-proxy.receive openid"}
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, kid: str = "rsa-1", alg: str | None = None, now: float | None = None,
              headers: dict[str, Any] | None = None, **changes: Any) -> str:
        """A token signed with ``kid`` (RS256 for RSA keys, ES256 for EC ones)."""
        key = self.keys[kid]
        alg = alg or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
        return jwt.encode(self.claims(now, **changes), key, algorithm=alg,
                          headers={"kid": kid, **(headers or {})})

    def unsigned(self, now: float | None = None, **changes: Any) -> str:
        """An ``alg: none`` token (no signature)."""
        return jwt.encode(self.claims(now, **changes), None, algorithm="none")

    def hs256_with_public_key(self, now: float | None = None) -> str:
        """The algorithm-confusion forgery: HS256 with the RSA public key's PEM as secret."""
        from cryptography.hazmat.primitives import serialization

        pem = _RSA_KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        header = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}
        import base64
        import hashlib
        import hmac

        def b64(data: bytes) -> bytes:
            return base64.urlsafe_b64encode(data).rstrip(b"=")

        signing = b64(json.dumps(header).encode()) + b"." + b64(
            json.dumps(self.claims(now)).encode())
        sig = hmac.new(pem, signing, hashlib.sha256).digest()
        return (signing + b"." + b64(sig)).decode()


class JwksServer:
    """The issuer's JWKS endpoint on 127.0.0.1: ``GET /jwks`` answers the issuer's current
    JWKS (or 503 while ``down``); ``fetches`` counts the requests."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self.down = False
        self.fetches = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The JWKS URL."""
        return f"http://127.0.0.1:{self.port}/jwks"

    async def _jwks(self, request: web.Request) -> web.Response:
        self.fetches += 1
        if self.down:
            return web.Response(status=503, text="down")
        return web.Response(body=self.issuer.jwks(), content_type="application/json")

    def start(self) -> None:
        """Serve in a thread of its own until :meth:`stop`."""
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/jwks", self._jwks)
            runner = self._runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="jwks-server", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the JWKS server did not start"

    def stop(self) -> None:
        """Stop serving."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


@contextmanager
def jwks_server(issuer: Issuer) -> Iterator[JwksServer]:
    """A :class:`JwksServer` for the block."""
    server = JwksServer(issuer)
    server.start()
    try:
        yield server
    finally:
        server.stop()
