"""Daemon layer: bind the configured ``[[listener]]`` sockets, not yet serving.

One server per listener: an ``asyncio.Server`` whose protocol is a relayed
:class:`~.relay.ClientProtocol`, or a :class:`~.proxy_listener.ProxyProtocolServer` for a
listener with ``proxy_protocol`` (the PROXY header is read before TLS and before the relay).
TLS listeners get the context :class:`~.tls.TlsContexts` built for them, made to follow reloads.
The servers are created with ``start_serving=False``: the daemon starts them once everything
else is up, so no client is accepted before the readiness probes have run.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Mapping
from typing import Protocol

from .proxy_listener import ProxyListenerHost, ProxyProtocolServer
from .relay import ClientProtocol, RelayHost
from .settings import BindError, DaemonConfig
from .tls import TlsContexts

__all__ = ["LISTEN_BACKLOG", "ListenerHost", "bind_listeners"]

#: Pending connections the kernel queues on a listener before accept (``listen`` backlog).
LISTEN_BACKLOG = 4096


class ListenerHost(RelayHost, ProxyListenerHost, Protocol):
    """The daemon as both kinds of listener see it: the relay's host and the PROXY
    listener's."""


async def bind_listeners(host: ListenerHost, config: DaemonConfig, tls: TlsContexts,
                         server_ssl: Mapping[int, ssl.SSLContext],
                         ) -> list[asyncio.Server | ProxyProtocolServer]:
    """Bind every listener of ``config`` in order, none serving yet.

    Args:
        host: the daemon (each accepted connection's host).
        config: listeners, ``handshake_seconds`` (the TLS and PROXY-header budget, seconds),
            ``reuse_port`` (``--workers N``), ``source`` (the file named in errors).
        tls: the TLS contexts, so each TLS listener follows reloads.
        server_ssl: listener index -> its server context (TLS listeners only).

    Returns:
        The servers, in the listeners' order.

    Raises:
        BindError: a listener cannot bind its address (``file: listener[N].address: cannot
            listen on ADDRESS: reason``); the listeners bound before it are closed.
    """
    servers: list[asyncio.Server | ProxyProtocolServer] = []
    try:
        for index, listener in enumerate(config.listeners):
            base = server_ssl.get(index)
            ctx = tls.follow_reloads(index, base) if base is not None else None
            name = str(listener.address)
            try:
                server: asyncio.Server | ProxyProtocolServer
                if listener.proxy_protocol:
                    server = ProxyProtocolServer(
                        host, listener, name,
                        protocol_factory=functools.partial(ClientProtocol, host, name),
                        ssl_context=ctx, backlog=LISTEN_BACKLOG,
                        handshake_seconds=config.handshake_seconds,
                        reuse_port=config.reuse_port)
                    await server.start(start_serving=False)
                else:
                    server = await host.loop.create_server(
                        lambda name=name: ClientProtocol(host, name, host.next_conn_id()),
                        listener.address.host, listener.address.port, ssl=ctx,
                        backlog=LISTEN_BACKLOG, reuse_address=True,
                        reuse_port=config.reuse_port or None, start_serving=False,
                        # a TLS handshake must finish within the Open-decision budget
                        ssl_handshake_timeout=config.handshake_seconds if ctx else None,
                    )
            except OSError as exc:
                raise BindError.of(config.source, f"listener[{index}].address",
                                   listener.address, exc) from None
            servers.append(server)
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers
