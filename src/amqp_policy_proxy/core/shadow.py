"""Sans-IO. Shadow mode: whether a denial is enforced or only reported.

A vhost or group with ``"enforcement": "shadow"`` (docs/policy.md, "Shadow mode") has every
decision computed as usual, but a would-be denial is allowed: the room that found it logs the
denial's own INFO line with ``SHADOW DENY`` in place of ``DENY`` (:func:`verb`) and goes on as
if nothing was denied, and :func:`shadowed` emits :class:`~.events.ShadowDenied`, which the
metrics observer counts in ``amqp_proxy_shadow_denials_total{vhost,kind,reason}`` and the event
log writes as ``shadow_denied``.

Whose enforcement applies: the connection's group (its own key, else its vhost's: resolved at
compile time), and before a group is known (an unknown user) the vhost's. A connection with no
vhost, and an operator's pause, are always enforced.
"""

from __future__ import annotations

from ..policy.keys import SHADOW
from ..policy.reasons import DenialKind
from .context import Context
from .events import ShadowDenied

DENY = "DENY"
"""The first word of a denial's log line when it is enforced."""
SHADOW_DENY = "SHADOW DENY"
"""... and when shadow mode lets it through."""


def in_shadow(ctx: Context) -> bool:
    """True when the denials of this connection are reported, not enforced: its group's
    enforcement, else (no group yet) its vhost's; False without a vhost."""
    scope = ctx.group if ctx.group is not None else ctx.vhost
    return scope is not None and scope.enforcement is SHADOW


def shadowed(
    ctx: Context,
    kind: DenialKind,
    reason: str,
    now: float,
    *,
    role: str | None = None,
    address: str | None = None,
) -> bool:
    """The one question every denial point asks: let this denial through?

    Args:
        ctx: the connection.
        kind: what would be denied (``connection``, ``session``, ``link``, ``message``).
        reason: the denial's reason (the value its own metric and event use).
        now: loop-clock seconds.
        role: for a link, ``sender`` or ``receiver``.
        address: for a link or message, its address.

    Returns:
        True in shadow mode: :class:`~.events.ShadowDenied` is emitted and the caller allows
        what it would have denied (logging its line with :data:`SHADOW_DENY`). False: the
        caller denies as usual.
    """
    if not in_shadow(ctx):
        return False
    ctx.wire.emit(
        ShadowDenied(
            *ctx.who(now), kind=str(kind), reason=str(reason), role=role,
            address=address,
        )
    )
    return True


def verb(shadow: bool) -> str:
    """``SHADOW DENY`` or ``DENY``: the first word of a denial's log line."""
    return SHADOW_DENY if shadow else DENY
