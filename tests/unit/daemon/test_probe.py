"""daemon/probe.py: what a readiness probe sends, per ``[[upstream]] probe``, over real sockets."""

from __future__ import annotations

import asyncio

import pytest

from amqp_policy_proxy.daemon.config import Address, UpstreamConfig
from amqp_policy_proxy.daemon.probe import SASL_HEADER, probe


async def _serve(answer: bytes | None) -> tuple[asyncio.Server, list[bytes]]:
    """A listener that records what each connection sent and answers ``answer`` to a header
    (nothing when None)."""
    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        try:
            async with asyncio.timeout(1.0):
                data = await reader.read(8)
                if data and answer is not None:
                    writer.write(answer)
                    await writer.drain()
                data += await reader.read(100)  # until the probe closes
        except TimeoutError:
            pass
        got.append(data)
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), got


@pytest.mark.parametrize(("kind", "mode", "expected"), [
    ("qdrouterd", "auto", "amqp"), ("other", "auto", "amqp"), ("rabbitmq", "auto", "tcp"),
    ("rabbitmq", "amqp", "amqp"), ("qdrouterd", "tcp", "tcp")])
def test_probe_mode_follows_the_kind_unless_set(kind: str, mode: str, expected: str) -> None:
    assert UpstreamConfig(Address("127.0.0.1", 1), kind=kind, probe=mode).probe_mode() == expected


def test_an_amqp_probe_sends_the_sasl_header_and_wants_an_amqp_answer() -> None:
    async def scenario() -> None:
        server, got = await _serve(SASL_HEADER)
        port = server.sockets[0].getsockname()[1]
        up = UpstreamConfig(Address("127.0.0.1", port), kind="qdrouterd")
        assert await probe(up, None, 2.0) is None
        silent, _ = await _serve(None)
        quiet = UpstreamConfig(Address("127.0.0.1", silent.sockets[0].getsockname()[1]))
        assert "no answer" in (await probe(quiet, None, 0.3) or "")
        await asyncio.sleep(0.1)
        server.close()
        silent.close()
        assert got == [SASL_HEADER]

    asyncio.run(scenario())


def test_a_tcp_probe_sends_nothing() -> None:
    """What RabbitMQ logs nothing for (a header and a close is a WARNING there)."""
    async def scenario() -> None:
        server, got = await _serve(None)
        port = server.sockets[0].getsockname()[1]
        up = UpstreamConfig(Address("127.0.0.1", port), kind="rabbitmq")
        assert await probe(up, None, 2.0) is None
        for _ in range(50):
            if got:
                break
            await asyncio.sleep(0.02)
        server.close()
        assert got == [b""]
        closed = UpstreamConfig(Address("127.0.0.1", port), kind="rabbitmq")
        assert await probe(closed, None, 2.0) is not None  # refused

    asyncio.run(scenario())
