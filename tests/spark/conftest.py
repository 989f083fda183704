"""One shared local SparkSession for the capacity report tests (one JVM for the whole session: starting one costs seconds).

The whole directory is skipped when pyspark is not installed. Tests that use Spark take the
``spark`` fixture and carry the ``spark`` marker (added here to every test of this directory
that uses the fixture, so ``-m "not spark"`` deselects them).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

# pyspark warns (FutureWarning) that it does not fully support pandas >= 3 when it imports its
# pandas helpers, which it does lazily from inside tests; the project runs with
# filterwarnings=error. Only that message is ignored, only for these tests.
PANDAS3_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                            category=FutureWarning)
    pytest.importorskip("pyspark")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eventlog"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of this directory that use Spark, and filter pyspark's pandas warning."""
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.filterwarnings(PANDAS3_WARNING))
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run: local[2], 2 shuffle partitions, no UI, UTC, 2 GiB
    of driver memory (what the job uses by default: with 1 GiB the broadcast joins late in the
    tier, after the planted 15-day log, ran out of memory)."""
    from pyspark.sql import SparkSession

    # Python workers (the what-if replay) must run this interpreter, whose venv has pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("amqp-policy-proxy-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")  # the job's default; 1g ran out late in the tier
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fixtures() -> Path:
    """The golden event log directory ``tests/fixtures/eventlog``."""
    return FIXTURES


@pytest.fixture(scope="session")
def overlap(spark, fixtures):
    """``overlap.jsonl`` over [10:00, 10:05), 1-minute grid (see tests/spark/golden.py).

    Yields ``(events, sweep, conc, window)``: the prepared events, the persisted sweep inputs
    and the concurrency table (persisted), computed once for the whole run.
    """
    from amqp_policy_proxy.spark_reports.concurrency import concurrency
    from amqp_policy_proxy.spark_reports.events import prepare_sweep
    from tests.spark.golden import load, window

    w = window("10:00", "10:05")
    events = load(spark, fixtures / "overlap.jsonl", w).persist()
    sweep = prepare_sweep(events, w).persist(events)
    conc = concurrency(sweep).persist()
    yield events, sweep, conc, w
    conc.unpersist()
    sweep.unpersist()
    events.unpersist()
