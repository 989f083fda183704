"""Suite-wide rules: the C extension CI requires, and how pytest-xdist spreads the tests.

With ``AMQP_PROXY_REQUIRE_ACCEL`` set (``.ci/run`` sets it), a run whose
``amqp_policy_proxy.amqp._relayscan`` does not import stops before the first test
(:func:`pytest_configure`): every "c" variant of the core and accelerator tests would
otherwise be skipped and the suite pass on the pure-Python code alone. The hypothesis profile
``sanitize`` is the one ``make sanitize`` runs under.

``make test`` and ``make test-fast`` run pytest with ``-n auto --dist loadscope``; with
``loadscope`` the work units are the scopes :func:`pytest_xdist_make_scheduler` defines here:

* a unit or property test (``tests/unit``, ``tests/property``) is a scope of its own: these
  tests are independent, so any worker takes any of them, one by one;
* every other test module (the integration tiers, the bench smoke tests) is one scope: its
  tests run on one worker, in file order (the packaging tests install, check, then purge the
  .deb) and its module- and session-scoped peers start once;
* the Spark tier is one scope, so one worker starts one SparkSession;
* ``tests/integration/debian`` is one scope: the .deb is built and installed once for the
  deploy guide's and the packaging tests (package-scoped fixtures), then purged.

xdist hands out the largest scopes first (``loadscope`` orders by test count), so the single
unit tests fill the gaps at the end. ``xdist_group`` marks and ``--dist loadgroup`` are not used:
pytest 9.2 broke their grouping (pytest-xdist issue 1386). Without ``-n`` (or with ``-n 0``)
nothing here applies.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
from hypothesis import settings

#: Environment variable that makes a missing C extension an error (as in setup.py).
REQUIRE_ACCEL_ENV = "AMQP_PROXY_REQUIRE_ACCEL"

#: Tiers whose tests are independent: one scope per test.
FREE_TIERS = ("unit", "property")


#: ``HYPOTHESIS_PROFILE=sanitize`` (``make sanitize``): no per-example deadline, since the
#: sanitized build with ``PYTHONMALLOC=malloc`` runs several times slower.
settings.register_profile("sanitize", deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE") == "sanitize":
    settings.load_profile("sanitize")


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to run without the C extension when :data:`REQUIRE_ACCEL_ENV` is set.

    Raises:
        pytest.UsageError: the variable is set (not "" or "0") and the extension does not
            import; the message carries the import error.
    """
    if os.environ.get(REQUIRE_ACCEL_ENV, "") in ("", "0"):
        return
    try:
        import amqp_policy_proxy.amqp._relayscan  # noqa: F401
    except ImportError as exc:
        raise pytest.UsageError(
            f"{REQUIRE_ACCEL_ENV} is set and the C extension amqp_policy_proxy.amqp._relayscan "
            f"does not import ({exc}): build it (make setup, or pip install -e .) or unset "
            f"{REQUIRE_ACCEL_ENV} to run the pure-Python code alone") from exc


def scope_of(nodeid: str) -> str:
    """The xdist work unit of the test ``nodeid`` (relative to the repository root, as
    pytest writes it): the nodeid itself in :data:`FREE_TIERS`, ``tests/spark`` for the
    Spark tier, ``tests/integration/debian`` for the package tests, else the test's file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests":
        if parts[1] in FREE_TIERS:
            return nodeid
        if parts[1] == "spark":
            return "tests/spark"
        if parts[1:3] == ["integration", "debian"] and len(parts) > 3:
            return "tests/integration/debian"
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


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """Each test leaves the root logger as it found it: a command run in-process (``run``,
    ``check``...) configures logging as the daemon does, its own handler on the root (writing
    to that test's captured stderr) and the root's level, and both outlived the test, for
    every later test on the same worker."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
