"""Run the core with its C accelerator parts (``amqp.accel``) or with the pure-Python code
alone: the client relay scanner, the router-side walker, the Transfer-field, message-head,
Open and SASL readers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import amqp_policy_proxy.core.fastpath as fastpath
from amqp_policy_proxy.amqp import accel

#: Whether the C extension is built (the "c" runs are skipped without it).
BUILT = accel.BUILT


@contextmanager
def scanners(which: str) -> Iterator[None]:
    """``which`` "c": the C parts (as built); "python": none of them (``accel.use``)."""
    was = accel.in_use()
    accel.use(which == "c")
    try:
        yield
    finally:
        accel.use(was)


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
