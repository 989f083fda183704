"""Run the core with its C accelerator parts (``amqp.accel``) or with the pure-Python code
alone: the client relay scanner, the router-side walker, the Transfer-field, message-head,
Open and SASL readers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import amqp_policy_proxy.core.fastpath as fastpath
from amqp_policy_proxy.amqp import accel

#: Whether the C extension is built (the "c" runs are skipped without it).
BUILT = accel.scan_c is not None


@contextmanager
def scanners(which: str) -> Iterator[None]:
    """``which`` "c": the C parts (as built); "python": none of them."""
    c = which == "c"
    saved = (fastpath._scan, accel.scan_router, accel._message_head, accel._open_head,
             accel._transfer_fields, accel._sasl_init, accel._sasl_mechanisms)
    fastpath._scan = accel.scan_c if c else None
    accel.scan_router = accel.scan_router_c if c else None
    accel._message_head = accel.message_head_c if c else None
    accel._open_head = accel.open_head_c if c else None
    accel._transfer_fields = accel.transfer_fields_c if c else None
    accel._sasl_init = accel.sasl_init_c if c else None
    accel._sasl_mechanisms = accel.sasl_mechanisms_c if c else None
    try:
        yield
    finally:
        (fastpath._scan, accel.scan_router, accel._message_head, accel._open_head,
         accel._transfer_fields, accel._sasl_init, accel._sasl_mechanisms) = saved


@contextmanager
def general_only() -> Iterator[None]:
    """Every admitted client frame takes the general handlers: the fast path forwards nothing
    (the reference the fast path and the C parts are compared with)."""
    saved = fastpath.FastPath.relay
    fastpath.FastPath.relay = lambda self, buf, pos, end, now: pos  # type: ignore[method-assign]
    try:
        yield
    finally:
        fastpath.FastPath.relay = saved  # type: ignore[method-assign]
