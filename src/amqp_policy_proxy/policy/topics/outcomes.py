"""Sans-IO. The values the topic authorizer takes and returns, and QoS from settle modes.

Denials are values (:class:`TopicDecision` with ``allowed=False``), never exceptions.
No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PUBLISH: Final = "publish"
"""Authority of a client sender's target address and of each anonymous-relay message's ``to``."""
SUBSCRIBE: Final = "subscribe"
"""Authority of a client receiver's source address."""
PERSISTENT: Final = "persistent"
"""Authority to receive durable messages as durable (``nearestAcl`` only)."""

SND_SETTLED: Final = 1
"""AMQP 1.0 Part 2 §2.8.2 sender-settle-mode ``settled`` (0 unsettled, 2 mixed)."""
SND_MIXED: Final = 2
RCV_SECOND: Final = 1
"""AMQP 1.0 Part 2 §2.8.3 receiver-settle-mode ``second`` (0 first)."""


def qos_of(snd_settle_mode: int | None, rcv_settle_mode: int | None) -> int:
    """The MQTT-style QoS of a link, from its Attach settle modes (docs/topic-authorization.md).

    ``snd-settle-mode`` settled (1) -> 0 (at most once); else ``rcv-settle-mode`` second (1)
    -> 2 (exactly once); else -> 1 (at least once: unsettled with first, or mixed).

    Args:
        snd_settle_mode: the Attach ``snd-settle-mode``; None = absent = the spec default
            ``mixed`` (2).
        rcv_settle_mode: the Attach ``rcv-settle-mode``; None = absent = the spec default
            ``first`` (0).

    Returns:
        0, 1 or 2. Values outside the spec's enumerations are read as the defaults.
    """
    if snd_settle_mode == SND_SETTLED:
        return 0
    if rcv_settle_mode == RCV_SECOND:
        return 2
    return 1


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the authenticated user, their policy group, and their TLS identity."""

    user: str
    """The authenticated user name (``anonymous`` without SASL)."""
    group: str | None
    """The connection's policy group name (None outside a vhost)."""
    subject: str | None = None
    """RFC 4514 subject of a verified TLS client certificate, else None (DDS grants)."""


@dataclass(frozen=True, slots=True)
class TopicDecision:
    """The outcome of a publish or subscribe check."""

    allowed: bool
    decided_by: str
    """Human text naming the model and the node or rule that decided, e.g.
    ``topicTree(anyAncestor) node 'SEC/GOOD' grants subscribe to usr1``; when several models
    passed, their texts joined with ``"; "``."""
    model: str
    """``"topicTree"``, ``"permissions"``, ``"dds"`` or ``""``. When denied: the model that
    denied. When allowed: the one model consulted, or ``""`` when several (or none) were."""
    per_delivery: bool = False
    """Subscribe only: a ``nearestAcl`` wildcard subscription; check every delivery with
    :meth:`TopicAuthorizer.check_delivery`."""
    strip_durable: bool = False
    """Subscribe only, when not ``per_delivery``: the principal may not receive persistent
    messages on this address; deliver durable messages as non-durable."""


@dataclass(frozen=True, slots=True)
class DeliveryDecision:
    """The outcome of one delivery on a per-delivery (wildcard ``nearestAcl``) link."""

    visible: bool
    """False: withhold the delivery from the client (settle it toward the router)."""
    strip_durable: bool
    """True: rewrite the header's ``durable`` to false before delivering."""
    decided_by: str
    """Human text naming the node(s) that decided."""
