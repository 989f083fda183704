"""TLS at the proxy: the contexts of the listeners and upstreams, and what a verified client
certificate says.

TLS ends at the proxy, which must see frames. :class:`TlsContexts` holds one daemon's
contexts: built from the configured files at start (:func:`build_contexts`, off the event
loop), rebuilt all-or-nothing on SIGHUP (:meth:`TlsContexts.reload`), new connections use the
newest successful set and established ones keep theirs. :func:`peer_subject` and
:func:`peer_not_after` read the client certificate the handshake verified.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .settings import ConfigError, DaemonConfig, ListenerConfig, UpstreamConfig

logger = logging.getLogger(__name__)


def _x509() -> ModuleType:
    """cryptography's x509 module, imported on first use: only TLS listeners that verify
    client certificates read one, and the import costs a proxy without them ~8 MB of RSS."""
    from cryptography import x509

    return x509


def peer_subject(transport: Any) -> str | None:
    """The RFC 4514 subject of the client certificate the TLS handshake verified.

    Args:
        transport: an asyncio transport (``get_extra_info("ssl_object")`` is read; asyncio calls
            ``connection_made`` only after the handshake, so the certificate is known then).

    Returns:
        e.g. ``"CN=alice,O=Example"`` (RFC 4514 order: most specific first, as
        ``cryptography``'s ``Name.rfc4514_string`` writes it), or None for a plain TCP
        transport, a TLS client that presented no certificate, or a listener that does not
        verify client certificates. DDS permission grants (docs/dds-permissions.md) match
        against it.
    """
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        # without verification a presented certificate proves nothing: it is not an identity
        # (SASL EXTERNAL and DDS grants must only ever see a certificate the proxy verified)
        return None
    try:
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        return _x509().load_der_x509_certificate(der).subject.rfc4514_string()
    except (ValueError, OSError) as exc:  # an unparsable certificate: no subject, logged
        logger.warning("cannot read the client certificate's subject: %s", exc)
        return None


def peer_not_after(transport: Any) -> float | None:
    """POSIX seconds of the notAfter of the client certificate the TLS handshake verified
    (a connection authenticated by it, SASL EXTERNAL, ends then), or None as for
    :func:`peer_subject`."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    try:
        der = ssl_object.getpeercert(binary_form=True)
        if not der:
            return None
        return _x509().load_der_x509_certificate(der).not_valid_after_utc.timestamp()
    except (ValueError, OSError) as exc:
        logger.warning("cannot read the client certificate's notAfter: %s", exc)
        return None


def upstream_context(upstream: UpstreamConfig) -> ssl.SSLContext | None:
    """Build a client-side TLS context for ``upstream`` from its files.

    TLS 1.2 or later; the router's certificate is verified against ``tls_ca`` (the system
    store when unset) and its name against ``tls_server_name`` (default: the host);
    ``tls_cert``/``tls_key`` are the proxy's client certificate, when the router asks.

    Returns:
        The context, or None when ``upstream.tls`` is false.

    Raises:
        OSError: a file is missing or unreadable; ``ssl.SSLError`` (a subclass) when a file
            is not a valid certificate/key or the key does not match.
    """
    if not upstream.tls:
        return None
    ctx = ssl.create_default_context(cafile=upstream.tls_ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if upstream.tls_cert:
        ctx.load_cert_chain(upstream.tls_cert, upstream.tls_key)
    return ctx


def server_context(listener: ListenerConfig) -> ssl.SSLContext | None:
    """Build the server-side TLS context of a listener from its files.

    TLS 1.2 or later. With ``tls_ca`` client certificates are verified against it (required
    when ``require_client_cert``, else optional).

    Returns:
        The context, or None when the listener has no certificate (plain AMQP).

    Raises:
        OSError: a file is missing or unreadable; ``ssl.SSLError`` (a subclass) when a file
            is not a valid certificate/key or the key does not match.
    """
    if not listener.tls_cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(listener.tls_cert, listener.tls_key)
    if listener.tls_ca:
        ctx.load_verify_locations(listener.tls_ca)
        ctx.verify_mode = (ssl.CERT_REQUIRED if listener.require_client_cert
                           else ssl.CERT_OPTIONAL)
    elif listener.require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


ServerContexts = dict[int, ssl.SSLContext]
"""Listener index -> its server-side context (listeners with TLS only)."""
UpstreamContexts = dict[UpstreamConfig, ssl.SSLContext]
"""Upstream -> its client-side context (upstreams with TLS only)."""


def build_contexts(config: DaemonConfig) -> tuple[ServerContexts, UpstreamContexts]:
    """Build every listener and upstream TLS context of ``config`` from its files.

    Reads files: the daemon runs it off the event loop; ``check`` runs it too (ExecReload
    validates the TLS files a SIGHUP would reload).

    Returns:
        ``(listener index -> server context, upstream -> client context)``.

    Raises:
        ConfigError: naming every listener/upstream whose files do not load.
    """
    servers: ServerContexts = {}
    upstreams: UpstreamContexts = {}
    issues: list[str] = []

    def failed(key: str, i: int, end: ListenerConfig | UpstreamConfig, exc: OSError) -> None:
        issues.append(f"{key}[{i}] {end.address}: TLS files ({end.tls_cert}, "
                      f"{end.tls_key}, {end.tls_ca}): {exc}")

    for i, listener in enumerate(config.listeners):
        try:
            ctx = server_context(listener)
        except OSError as exc:  # ssl.SSLError is an OSError
            failed("listener", i, listener, exc)
            continue
        if ctx is not None:
            servers[i] = ctx
    for i, upstream in enumerate(config.upstreams):
        try:
            ctx = upstream_context(upstream)
        except OSError as exc:
            failed("upstream", i, upstream, exc)
            continue
        if ctx is not None:
            upstreams[upstream] = ctx
    if issues:
        raise ConfigError(issues)
    return servers, upstreams


class TlsContexts:
    """The current TLS contexts of one daemon's listeners and upstreams.

    Attributes:
        reload_failures: SIGHUP reloads whose certificate/key files failed to load (the
            old contexts were kept).
    """

    def __init__(self, config: DaemonConfig) -> None:
        """Empty; :meth:`start` builds the contexts."""
        self.config = config
        self._servers: ServerContexts = {}
        self._upstreams: UpstreamContexts = {}
        self.reload_failures = 0

    async def start(self) -> ServerContexts:
        """Build every context off the event loop; returns the listeners' (their servers
        are created with them, then follow reloads through :meth:`follow_reloads`).

        Raises:
            ConfigError: as :func:`build_contexts`.
        """
        servers, self._upstreams = await asyncio.to_thread(build_contexts, self.config)
        return servers

    def upstream(self, upstream: UpstreamConfig) -> ssl.SSLContext | None:
        """The current client-side TLS context for ``upstream`` (None for plain TCP).

        Built at start and rebuilt on SIGHUP, so each new upstream connection uses the
        certificate files as of the last successful reload and no file is read on the
        connect path.

        Raises:
            OSError: ``ssl.SSLError`` included, only if the context was never built and the
                files do not load.
        """
        if not upstream.tls:
            return None
        ctx = self._upstreams.get(upstream)
        if ctx is None:
            ctx = upstream_context(upstream)
            assert ctx is not None
            self._upstreams[upstream] = ctx
        return ctx

    def follow_reloads(self, index: int, base: ssl.SSLContext) -> ssl.SSLContext:
        """Make ``base`` (the context listener ``index``'s server is created with) follow
        reloads; returns ``base``.

        asyncio and uvloop capture the context given to ``create_server`` for the server's
        life, so a reload cannot replace it. Instead its ``sni_callback``, which OpenSSL runs
        for every ClientHello (with or without SNI), switches the new connection to the
        listener's current context (``SSLObject.context = ...``, OpenSSL
        ``SSL_set_SSL_CTX``): certificate chain and CA store come from the newest successful
        reload; connections already established keep the context they were made with.
        """
        self._servers[index] = base

        def follow(sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
            current = self._servers.get(index)
            if current is not None and current is not ctx:
                sslobj.context = current
            return None

        base.sni_callback = follow
        return base

    async def reload(self, on_failure: Callable[[], None]) -> bool:
        """Re-read every certificate, key and CA file off the event loop, all-or-nothing.

        Swapped on the loop thread, so a handshake sees either all old or all new contexts;
        listeners without TLS at start stay plain (their server was made without TLS).

        Args:
            on_failure: called once when the files do not load (the failure metric).

        Returns:
            True when the new contexts are in force (or there is no TLS at all); False when
            the files did not load (each issue logged, the old contexts kept).
        """
        if not self._servers and not self._upstreams:
            return True
        try:
            servers, upstreams = await asyncio.to_thread(build_contexts, self.config)
        except ConfigError as exc:
            self.reload_failures += 1
            on_failure()
            for issue in exc.issues:
                logger.error("TLS reload rejected, keeping the current certificates: %s", issue)
            return False
        for index in list(self._servers):
            if index in servers:
                self._servers[index] = servers[index]
        self._upstreams = upstreams
        logger.info("TLS certificate, key and CA files reloaded")
        return True
