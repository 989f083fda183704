"""Every core test runs twice: with the C accelerator parts (``amqp.accel``, when built: the
client relay scanner, the router-side walker, the message-head reader) and with the
pure-Python code alone, so both implementations meet the same expectations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.scanners import BUILT, scanners


@pytest.fixture(autouse=True, params=[
    pytest.param("c", marks=pytest.mark.skipif(not BUILT, reason="C extension not built")),
    "python",
])
def relay_scanner(request: pytest.FixtureRequest) -> Iterator[str]:
    """The accelerator parts the core uses in this test: "c" (the C relay scanner, router
    walker and head reader) or "python" (none)."""
    with scanners(request.param):
        yield request.param
