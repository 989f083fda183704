"""Every core test runs twice: with the C relay scanner (``amqp.accel``, when built) and with
the pure-Python relay loop alone, so both implementations meet the same expectations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import amqp_policy_proxy.core.fastpath as core
from amqp_policy_proxy.amqp import accel


@pytest.fixture(autouse=True, params=[
    pytest.param("c", marks=pytest.mark.skipif(accel.scan_c is None,
                                               reason="C extension not built")),
    "python",
])
def relay_scanner(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scanner the relay loop uses in this test: "c" or "python" (None: no scanner)."""
    saved = core._scan
    core._scan = accel.scan_c if request.param == "c" else None
    try:
        yield request.param
    finally:
        core._scan = saved
