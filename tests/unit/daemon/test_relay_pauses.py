"""daemon/relay.py: a client is read again only when no reason to pause it is left.

Three reasons stop reading a client: its bytes wait for the upstream connect, the
pre-authentication memory budget is spent, the router's write buffer is full. Before they
were bits, a router that drained resumed a client that the budget had paused.
"""

from __future__ import annotations

import asyncio
import socket

from amqp_policy_proxy.daemon.relay import (
    PAUSED_BUDGET,
    PAUSED_CONNECTING,
    ClientProtocol,
    RouterProtocol,
)


async def _client_with_transport() -> tuple[ClientProtocol, asyncio.Transport, socket.socket]:
    ours, theirs = socket.socketpair()
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
        asyncio.Protocol, ours)
    client = ClientProtocol(host=None, listener="127.0.0.1:5672", conn_id="c1")  # type: ignore[arg-type]
    client.transport = transport
    return client, transport, theirs


async def test_router_drain_does_not_resume_a_budget_paused_client() -> None:
    client, transport, peer = await _client_with_transport()
    try:
        router = RouterProtocol(client)
        client.budget_pause()
        router.pause_writing()
        router.resume_writing()
        assert not transport.is_reading()  # the budget still holds it
        client.budget_resume()
        assert transport.is_reading()
    finally:
        transport.close()
        peer.close()


async def test_reasons_add_up_and_resume_in_any_order() -> None:
    client, transport, peer = await _client_with_transport()
    try:
        client.pause(PAUSED_CONNECTING)
        client.pause(PAUSED_BUDGET)
        client.resume(PAUSED_CONNECTING)
        assert not transport.is_reading()
        client.resume(PAUSED_CONNECTING)  # twice: nothing changes
        assert not transport.is_reading()
        client.resume(PAUSED_BUDGET)
        assert transport.is_reading()
    finally:
        transport.close()
        peer.close()
