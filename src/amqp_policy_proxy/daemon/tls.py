"""TLS facts about an accepted client transport: TLS ends at the proxy, which must see frames."""

from __future__ import annotations

import logging
import ssl
from typing import Any

from cryptography import x509

logger = logging.getLogger(__name__)


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
        return x509.load_der_x509_certificate(der).subject.rfc4514_string()
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
        return x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
    except (ValueError, OSError) as exc:
        logger.warning("cannot read the client certificate's notAfter: %s", exc)
        return None
