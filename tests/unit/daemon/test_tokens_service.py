"""daemon/tokens.py: the JWKS fetch loop against a real local HTTP server (aiohttp on
127.0.0.1), the figures it reports, and the service identities read from their files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web

from amqp_policy_proxy.daemon.config import Address, ConfigError, DaemonConfig, UpstreamConfig
from amqp_policy_proxy.daemon.tokens import TokenService, read_service_login
from amqp_policy_proxy.tokens.config import TokenAuthConfig
from tests.support.issuer import AUDIENCE, ISSUER, Issuer


def config(url: str) -> DaemonConfig:
    auth = TokenAuthConfig.model_validate({
        "issuer": ISSUER, "audience": AUDIENCE, "jwks_url": url, "jwks_retry_seconds": 0.1,
        "jwks_max_retry_seconds": 0.2, "jwks_fetch_timeout_seconds": 5})
    return DaemonConfig(upstreams=(UpstreamConfig(Address("127.0.0.1", 1)),), token_auth=auth)


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/jwks", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/jwks"


def test_a_slow_first_fetch_does_not_hold_the_start_and_still_lands():
    issuer = Issuer()
    gate = asyncio.Event()

    async def jwks(request: web.Request) -> web.Response:
        await gate.wait()
        return web.Response(body=issuer.jwks(), content_type="application/json")

    async def main() -> None:
        runner, url = await serve(jwks)
        loop = asyncio.get_running_loop()
        service = TokenService(config(url), loop.time, dict)
        try:
            await asyncio.wait_for(service.start(first_wait=0.2), 2)
            assert not service.figures().usable
            gate.set()
            for _ in range(100):
                if service.figures().usable:
                    break
                await asyncio.sleep(0.02)
            figures = service.figures()
            assert figures.usable and figures.keys == 2 and figures.failures_total == 0
        finally:
            await service.stop()
            await runner.cleanup()

    asyncio.run(main())


def test_failures_are_counted_and_retried_then_the_keys_come():
    issuer = Issuer()
    answers = [503, 503]

    async def jwks(request: web.Request) -> web.Response:
        if answers:
            return web.Response(status=answers.pop())
        return web.Response(body=issuer.jwks(), content_type="application/json")

    async def main() -> None:
        runner, url = await serve(jwks)
        loop = asyncio.get_running_loop()
        service = TokenService(config(url), loop.time, dict)
        try:
            await service.start(first_wait=1)
            assert service.figures().failures_total >= 1
            for _ in range(100):
                if service.figures().usable:
                    break
                await asyncio.sleep(0.02)
            assert service.figures().usable and service.figures().failures_total == 2
        finally:
            await service.stop()
            await runner.cleanup()

    asyncio.run(main())


def test_service_identities(tmp_path: Path):
    up = UpstreamConfig(Address("127.0.0.1", 1), token_authority="proxy",
                        service_username="svc", service_password_file=str(tmp_path / "pw"))
    with pytest.raises(ConfigError, match="service_password_file: .*cannot read"):
        read_service_login(up)
    (tmp_path / "pw").write_text("s3cret\nignored\n")
    login = read_service_login(up)
    assert login is not None and login.initial_response() == b"\0svc\0s3cret"
    assert "s3cret" not in repr(login)
    external = UpstreamConfig(Address("127.0.0.1", 1), token_authority="proxy", tls=True,
                              tls_cert="c.pem", tls_key="k.pem")
    assert read_service_login(external).mechanism == "EXTERNAL"  # type: ignore[union-attr]
    assert read_service_login(UpstreamConfig(Address("127.0.0.1", 1))) is None
