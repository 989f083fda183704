"""Suite-wide rule of how pytest-xdist spreads the tests over its workers.

``make test`` and ``make test-fast`` run pytest with ``-n auto --dist loadscope``; with
``loadscope`` the work units are the scopes :func:`pytest_xdist_make_scheduler` defines here:

* a unit or property test (``tests/unit``, ``tests/property``) is a scope of its own: these
  tests are independent, so any worker takes any of them, one by one;
* every other test module (the integration tiers, the bench smoke tests) is one scope: its
  tests run on one worker, in file order (the packaging tests install, check, then purge the
  .deb) and its module- and session-scoped peers start once;
* the Spark tier is one scope, so one worker starts one SparkSession.

xdist hands out the largest scopes first (``loadscope`` orders by test count), so the single
unit tests fill the gaps at the end. ``xdist_group`` marks and ``--dist loadgroup`` are not used:
pytest 9.2 broke their grouping (pytest-xdist issue 1386). Without ``-n`` (or with ``-n 0``)
nothing here applies.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Tiers whose tests are independent: one scope per test.
FREE_TIERS = ("unit", "property")


def scope_of(nodeid: str) -> str:
    """The xdist work unit of the test ``nodeid`` (relative to the repository root, as
    pytest writes it): the nodeid itself in :data:`FREE_TIERS`, ``tests/spark`` for the
    Spark tier, else the test's file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests":
        if parts[1] in FREE_TIERS:
            return nodeid
        if parts[1] == "spark":
            return "tests/spark"
    return path


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadscope``, xdist's scope scheduler with :func:`scope_of` as its
    scopes; any other ``--dist`` mode is xdist's own (None)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        """``loadscope`` whose scopes are :func:`scope_of`'s."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return TierScheduling(config, log)
