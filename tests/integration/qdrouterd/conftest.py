"""The real-router tier: the proxy in front of a real qdrouterd 1.19 with no policy of its own.

One router per test session (:class:`tests.support.qdrouterd.Qdrouterd`), users
``<name>@QDR.test`` with password ``secret``. Without a qdrouterd build the whole tier is
skipped with one reason (``make test`` builds it when the sources are there); with
``AMQP_PROXY_REQUIRE_QDR=1`` (``.ci/run``) a missing router fails the tier instead.
"""

from __future__ import annotations

import os

import pytest

from tests.support import qdrouterd as qdr

USERS = {u: "secret" for u in ("alice", "bob", "carol", "admin", "mallory", "hr1", "eve")}
REALM = qdr.REALM


def user(name: str) -> str:
    """The name a client logs in with and the router records: ``name@QDR.test``."""
    return f"{name}@{REALM}"


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration/qdrouterd" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.qdrouterd)


@pytest.fixture(scope="session")
def router():
    """The session's real qdrouterd (skipped, or failed under AMQP_PROXY_REQUIRE_QDR=1,
    when there is no build)."""
    reason = qdr.unavailable_reason()
    if reason is not None:
        if os.environ.get("AMQP_PROXY_REQUIRE_QDR") == "1":
            pytest.fail(f"real-router tier required but {reason}")
        pytest.skip(f"real-router tier: {reason}")
    r = qdr.Qdrouterd(USERS).start()
    yield r
    r.stop()
