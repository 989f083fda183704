"""The suite's tiers: how ``tests/conftest.py`` splits the tests into pytest-xdist work units,
and what ``make test-fast`` selects."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import scope_of

ROOT = Path(__file__).resolve().parents[2]


def test_unit_and_property_tests_are_one_scope_each() -> None:
    for nodeid in ("tests/unit/core/test_flows.py::test_a[c]",
                   "tests/property/test_codec.py::test_b"):
        assert scope_of(nodeid) == nodeid


def test_other_modules_are_one_scope_and_spark_and_debian_one_for_their_tier() -> None:
    assert scope_of("tests/integration/test_drain.py::test_x") == "tests/integration/test_drain.py"
    # the package tests share one build and install of the .deb
    for module in ("test_packaging.py", "test_deploy_guide.py"):
        assert scope_of(f"tests/integration/debian/{module}::test_y") == (
            "tests/integration/debian")
    assert scope_of("tests/integration/qdrouterd/test_limits.py::test_x[a::b]") == (
        "tests/integration/qdrouterd/test_limits.py")
    assert scope_of("tests/spark/test_job.py::test_y") == "tests/spark"
    assert scope_of("tests/spark/test_html.py::test_z") == "tests/spark"


def test_make_test_fast_is_unit_and_property_minus_slow_and_make_test_the_whole_suite() -> None:
    makefile = (ROOT / "Makefile").read_text()
    fast = re.search(r"^test-fast:.*\n\t(.*)$", makefile, re.M)
    assert fast and '-m "not slow" tests/unit tests/property' in fast.group(1)
    whole = re.search(r"^test:.*\n(?:\t.*\n)*?\t(\$\(BIN\)/python -m pytest .*)$", makefile, re.M)
    assert whole and whole.group(1) == "$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)"
    assert "make test\n" in (ROOT / ".ci" / "run").read_text()
