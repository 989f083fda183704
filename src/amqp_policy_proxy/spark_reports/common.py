"""What every capacity report shares: time units, scopes, the report window. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. This
module is the bottom of the report modules: ``events`` (the per-connection work table), then
``concurrency``, ``headroom``, ``whatif`` and ``traffic`` import it; it imports none of them.

Time is carried as ``long`` microseconds since the epoch (``*_us`` columns) and turned back
into timestamps only in the output tables (:func:`micros_to_timestamp`). The report window is
half-open ``[start_us, end_us)``. Grid buckets are aligned to the epoch
(``floor(ts / grid)``, :func:`bucket_index`); the window's first and last buckets may be
partial and count as whole buckets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

US_PER_SECOND = 1_000_000
US_PER_MS = 1_000
US_PER_MINUTE = 60 * US_PER_SECOND

#: Concurrency scopes, and the interval column that is the key of each.
SCOPES: tuple[str, ...] = ("vhost", "group", "user", "remote_host")
#: Scopes with a connection limit (QDR maxConnections / PerUser / PerHost).
LIMIT_SCOPES: tuple[str, ...] = ("vhost", "user", "remote_host")
#: An instant of the window, in milliseconds from its start, fits in this many bits: the
#: concurrency sweep packs it with the level into one long (``concurrency._peak_code``) and
#: the what-if replay packs it into its sort key.
WINDOW_MS_BITS = 37
#: The longest window the packing allows (2^37 ms, about 4.3 years).
MAX_WINDOW_US = ((1 << WINDOW_MS_BITS) - 1) * US_PER_MS


@dataclass(frozen=True)
class ReportWindow:
    """The time window of a report and its grid."""

    start_us: int
    """Inclusive start, microseconds since the epoch (a whole millisecond)."""
    end_us: int
    """Exclusive end, microseconds since the epoch (a whole millisecond)."""
    grid_us: int
    """Grid bucket width in microseconds (buckets are aligned to the epoch)."""

    def __post_init__(self) -> None:
        if self.grid_us <= 0:
            raise ValueError("grid must be positive")
        if self.end_us <= self.start_us:
            raise ValueError("the window end must be after its start")
        if self.end_us - self.start_us > MAX_WINDOW_US:
            raise ValueError("the window is longer than 4 years")

    @property
    def first_bucket(self) -> int:
        """Index of the bucket holding ``start_us``."""
        return self.start_us // self.grid_us

    @property
    def last_bucket(self) -> int:
        """Index of the bucket holding the last instant of the window."""
        return (self.end_us - 1) // self.grid_us

    @property
    def buckets(self) -> int:
        """Number of grid buckets in the window, partial ones included."""
        return self.last_bucket - self.first_bucket + 1


def bucket_index(col: Column, grid_us: int) -> Column:
    """Return the epoch-aligned bucket index ``floor(col / grid_us)`` of a microsecond column.

    Args:
        col: a ``long`` column of microseconds since the epoch.
        grid_us: the bucket width in microseconds (> 0).

    Returns:
        A ``long`` column, computed in exact integer arithmetic (``t - pmod(t, g)`` is a
        multiple of ``g``).
    """
    g = F.lit(grid_us)
    return ((col - F.pmod(col, g)) / g).cast("long")


def micros_to_timestamp(us: Column) -> Column:
    """Return a ``timestamp`` column from a ``long`` column of microseconds since the epoch."""
    return F.timestamp_micros(us)


def local_table(spark: SparkSession, rows: Iterable[tuple], schema: T.StructType) -> DataFrame:
    """Return a small DataFrame of driver-side rows that the JVM alone can evaluate.

    ``spark.createDataFrame(list)`` builds a Python RDD: every query that reads it (again)
    starts Python workers to re-serialise the rows, which costs seconds per query on a busy
    machine. Here the rows travel as one JSON string literal that the JVM parses
    (``from_json``) and expands (``inline``): no Python worker, ever. Used for the policy's
    limit tables, the what-if's replay groups and the job's empty tables.

    Args:
        spark: the session.
        rows: tuples in ``schema``'s field order; only strings, integers, floats and
            ``None`` (a few thousand rows at most: they become one literal in the plan).
        schema: a flat ``StructType``.

    Returns:
        The rows as a DataFrame with exactly ``schema`` (all fields nullable).
    """
    names = schema.fieldNames()
    text = json.dumps([dict(zip(names, r, strict=True)) for r in rows])
    parsed = F.from_json(F.lit(text), T.ArrayType(schema))
    return spark.range(1).select(F.inline(parsed)).select(
        *[F.col(f.name).cast(f.dataType) for f in schema.fields])
