"""Capacity report job: ``amqp-policy-proxy report capacity`` and ``spark-submit`` entry point.

Shell layer: parses argv, loads the policies, builds (or reuses) the SparkSession, reads the
event log, calls the report modules (:mod:`..events`, :mod:`..concurrency`, :mod:`..headroom`,
:mod:`..whatif`, :mod:`..traffic`), writes the tables, CSV files and the HTML report, stops
the session it built. Never imported by the daemon.

Run on one machine (``--master`` defaults to ``local[*]``)::

    amqp-policy-proxy report capacity --events /var/log/amqp-policy-proxy/events \
        --policy /etc/amqp-policy-proxy/policy.d --out /tmp/capacity

or on a cluster, in client mode, straight from a checkout (the file finds its package next
to it and ships it to the executors itself; the driver's Python needs matplotlib)::

    PYSPARK_PYTHON=/path/to/venv/bin/python spark-submit --master yarn \
        src/amqp_policy_proxy/spark_reports/jobs/capacity.py \
        --events hdfs:///logs/amqp-proxy --out /shared/capacity

``--out`` must be a directory both the driver (CSV, HTML, PNG) and the executors (Parquet)
can write. In cluster deploy mode the driver runs elsewhere: add
``--py-files amqp_policy_proxy.zip`` (a zip of ``src/amqp_policy_proxy``). See
docs/spark-reports.md.

Exit codes (as every ``amqp-policy-proxy`` subcommand): 0 ok, 1 runtime failure, 2 bad usage
or configuration. A ``--policy`` or ``--whatif`` policy is loaded as ``amqp-policy-proxy check``
loads it: one ``check`` rejects is refused with ``check``'s messages (exit 2).

Progress: one INFO line per stage with its own and the total elapsed seconds. Spark's console
progress bar is shown only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if __package__ in (None, ""):  # run as a file by spark-submit: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from amqp_policy_proxy.spark_reports.limits import (
    ConnectionLimits,
    LimitsError,
    limits_from_policy,
    load_checked_limits,
    load_checked_policy,
)
from amqp_policy_proxy.spark_reports.rule import Rule, RuleError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from amqp_policy_proxy.policy.model import Policy
    from amqp_policy_proxy.spark_reports.common import ReportWindow

logger = logging.getLogger("amqp_policy_proxy.spark_reports.capacity")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_MASTER = "local[*]"
#: How far before ``--from`` the job reads ``connection_opened`` records, to find connections
#: opened earlier and still open at the window start that have no close before ``--to``
#: (connections that do close in the window are found from their close's ``opened_ts``).
#: Override with the Spark conf ``spark.amqpPolicyProxy.lookbackHours``.
DEFAULT_LOOKBACK_HOURS = 24
#: Refuse grids that would make more buckets than this (use a coarser ``--grid``).
MAX_BUCKETS = 2_000_000
_GRID_UNITS = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
#: Runtime SQL settings the report sets on its session (measured on 10M events, local[2]).
RUNTIME_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # The cached sweep inputs (three numeric columns, about 17 bytes per change) fit in
    # memory and are read a few times, then dropped: compressing them would only cost CPU.
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    # Window partitions (one key's changes) up to this many rows stay in memory before the
    # window buffer switches to its spillable form: about 40 MB per task, 2x faster sweeps.
    "spark.sql.windowExec.buffer.in.memory.threshold": "1000000",
    # The work table is partitioned by event (3 values): one open writer per partition and
    # task instead of sorting every record by event first.
    "spark.sql.maxConcurrentOutputFileWriters": "4",
}
#: Parquet options of the work table of prepared events (read back a few times, then
#: deleted). Plain encoding, no compression: dictionary encoding and compression cost more
#: CPU than reading the bigger file back (LZ4 made it 3x smaller for the same CPU: the page
#: cache, not the disk, serves it). No statistics, size statistics or page checksums: only
#: this job reads the table, and never skips a page; they cost about 0.6 s of CPU per
#: million events.
WORK_TABLE_OPTIONS = {
    "compression": "none",
    "parquet.enable.dictionary": "false",
    "parquet.column.statistics.enabled": "false",
    "parquet.size.statistics.enabled": "false",
    "parquet.page.write-checksum.enabled": "false",
}
#: Set only while the concurrency table is computed: the aggregation right after the sweep's
#: window gets its input sorted already, so it streams instead of hashing (about 15 % off the
#: user/host sweep); elsewhere it made string aggregations slower.
SWEEP_CONF = {"spark.sql.execution.replaceHashWithSortAgg": "true"}


#: JVM options of a local run (``spark.driver.extraJavaOptions``). Only effective when this
#: process launches the JVM.
#:
#: - Every query generates new classes and the JIT's C2 compiler spent about 20 % of the
#:   JVM's CPU on them (72 of 346 CPU seconds on 10M events, measured per thread); compiling
#:   only methods that are really hot (invocation/back-edge thresholds 40x the default) cut
#:   that to 28 s with no slower task code.
#: - The parallel (throughput) collector instead of G1: a batch job has no use for short
#:   pauses, and G1's write barriers and concurrent marking cost more: 23 s less CPU and
#:   10 s less wall time on 10M events (mean of 4 paired runs).
#: - A metaspace big enough for Spark's classes from the start: no full collections while
#:   the JVM loads them.
LOCAL_JAVA_OPTIONS = ("-XX:+UseParallelGC -XX:MetaspaceSize=256m"
                      " -XX:Tier4InvocationThreshold=200000 -XX:Tier4MinInvocationThreshold=100000"
                      " -XX:Tier4CompileThreshold=250000 -XX:Tier4BackEdgeThreshold=1000000")


class UsageError(Exception):
    """Bad arguments or configuration (exit code 2)."""


class PolicyRejected(UsageError):
    """``--policy`` or ``--whatif`` does not load; ``str()`` is what ``check`` prints."""


@dataclass(frozen=True)
class Options:
    """Parsed and validated command line options."""

    events: str
    """Event log root (``DIR/dt=.../hour=.../*.jsonl``), a flat directory or one file."""
    out: str
    """Output directory (created)."""
    policy: ConnectionLimits | None
    """Connection limits of ``--policy``, or ``None``."""
    whatif: ConnectionLimits | None
    """Connection limits of ``--whatif``, or ``None``."""
    start_us: int | None
    """``--from`` in microseconds since the epoch (whole milliseconds), or ``None``."""
    end_us: int | None
    """``--to`` (exclusive), or ``None``."""
    grid_us: int
    """``--grid`` in microseconds."""
    grid_label: str
    """``--grid`` as given."""
    master: str | None
    """``--master`` as given, or ``None`` (default ``local[*]`` unless under spark-submit)."""
    whatif_policy: Policy | None = None
    """The whole compiled ``--whatif`` policy (the exact replay decides with it)."""
    policy_path: str | None = None
    """``--policy`` as given (the recommended policy is a copy of it)."""
    policy_whole: Policy | None = None
    """The whole compiled ``--policy`` (its connection rates, for the recommendations)."""
    rule: Rule = field(default_factory=lambda: Rule())
    """``--percentile`` and ``--headroom``: how limits are recommended."""
    fleet: bool = False
    """``--fleet``: every proxy of the log enforces its limits with the others (one fleet)."""
    trends: TrendOptions = field(default_factory=lambda: TrendOptions())
    """Churn, storm and forecast options (:class:`TrendOptions`)."""


def parse_timestamp(text: str) -> int:
    """Parse a ``--from``/``--to`` value into epoch microseconds, truncated to milliseconds.

    Args:
        text: ISO 8601 / RFC 3339, e.g. ``2026-11-21``, ``2026-11-21T11:00``,
            ``2026-11-21T11:00:00.123Z``, ``2026-11-21T12:00:00+01:00``; no offset = UTC.

    Returns:
        Microseconds since the epoch, a whole number of milliseconds.

    Raises:
        UsageError: not a date or timestamp.
    """
    try:
        d = dt.datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    except ValueError:
        raise UsageError(f"not an ISO 8601 timestamp: {text!r}") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    delta = d - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return us - us % 1000


def parse_grid(text: str) -> int:
    """Parse a ``--grid`` value.

    Args:
        text: a positive integer and a unit: ``s``, ``m``, ``h`` or ``d`` (``30s``, ``1m``,
            ``15m``, ``1h``).

    Returns:
        The width in microseconds.

    Raises:
        UsageError: malformed or zero.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", text)
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"--grid must be a positive number with a unit s, m, h or d: {text!r}")
    return int(m.group(1)) * _GRID_UNITS[m.group(2)]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``report capacity`` (also used by spark-submit)."""
    p = argparse.ArgumentParser(
        prog="amqp-policy-proxy report capacity",
        description="Capacity report from the connection event log (PySpark).")
    p.add_argument("--events", required=True, metavar="DIR",
                   help="event log root (DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl)")
    p.add_argument("--policy", metavar="PATH",
                   help="policy file or directory with the configured limits (headroom, "
                        "current values; the recommended policy/ is a copy of it)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--from", dest="start", metavar="TS",
                   help="window start, inclusive (ISO 8601, UTC if no offset); "
                        "default: the first event")
    p.add_argument("--to", dest="end", metavar="TS",
                   help="window end, exclusive; default: just after the last event")
    p.add_argument("--grid", default="1m",
                   help="percentile sampling grid: N s|m|h|d (default 1m)")
    p.add_argument("--whatif", metavar="POLICY",
                   help="replay every connection of the window through the daemon's own "
                        "decisions under this candidate policy (vhost resolution, groups, "
                        "remoteHosts, then the counts maxConnections, "
                        "maxConnectionsPerUser, maxConnectionsPerHost and the connection "
                        "rates, in Open order); writes whatif_denied.csv (each connection "
                        "it would deny: time, proxy, conn_id, vhost, group, user, "
                        "remote_host, reason, limit, enforcement, the daemon's log line), "
                        "whatif_totals.csv and whatif_summary.json (per reason and vhost) "
                        "and whatif.csv (per vhost, user and host)")
    p.add_argument("--percentile", default="99.9", metavar="P",
                   help="recommendation rule: the P-th nearest-rank percentile (0 < P <= 100) "
                        "of each key's per-bucket peaks (--grid; default 1m: per-minute) over "
                        "the window, per proxy process; default 99.9")
    p.add_argument("--headroom", default="1.25", metavar="FACTOR",
                   help="recommendation rule: recommended = ceil(percentile x FACTOR), at "
                        "least 1 (default 1.25). The recommendations are written as "
                        "recommendations.csv (each setting with its evidence: the key that "
                        "decided, its percentile, its peak and when), policy/ (a copy of "
                        "--policy with the changed limits, same files; without --policy a "
                        "new policy/recommended.json) and policy.diff (unified diff against "
                        "--policy)")
    p.add_argument("--master", metavar="URL",
                   help=f"Spark master (default {DEFAULT_MASTER}; under spark-submit, "
                        "spark-submit's --master)")
    p.add_argument("--fleet", action="store_true",
                   help="limits are fleet-wide: sum all the proxies of the log before "
                        "comparing with a limit (headroom, recommendations). Default: as "
                        "the event log records it (schema 4 proxy_info: proxies sharing a "
                        "[ledger] are summed per fleet, the others count alone; logs "
                        "without it: per proxy process)")
    add_trend_arguments(p)
    return p


def parse_options(argv: list[str]) -> Options:
    """Parse and validate argv, loading the policy files.

    Args:
        argv: the arguments after ``capacity``.

    Returns:
        The options.

    Raises:
        SystemExit: from argparse, for malformed arguments or ``--help``.
        UsageError: invalid values, unreadable policy, missing event directory.
    """
    a = build_parser().parse_args(argv)
    start = parse_timestamp(a.start) if a.start else None
    end = parse_timestamp(a.end) if a.end else None
    if start is not None and end is not None and end <= start:
        raise UsageError("--to must be after --from")
    grid = parse_grid(a.grid)
    if "://" not in a.events and not os.path.exists(a.events):
        raise UsageError(f"--events {a.events}: no such file or directory")
    try:
        rule = Rule.parse(a.percentile, a.headroom)
    except RuleError as e:
        raise UsageError(str(e)) from None
    policy_whole = _load_whole_policy(a.policy) if a.policy else None
    policy = limits_from_policy(policy_whole) if policy_whole is not None else None
    whatif_policy = _load_whole_policy(a.whatif) if a.whatif else None
    whatif = limits_from_policy(whatif_policy) if whatif_policy is not None else None
    return Options(events=a.events, out=a.out, policy=policy, whatif=whatif, start_us=start,
                   end_us=end, grid_us=grid, grid_label=a.grid.strip(), master=a.master,
                   whatif_policy=whatif_policy, policy_path=a.policy,
                   policy_whole=policy_whole, rule=rule, fleet=a.fleet,
                   trends=trend_options(a))


def _load_policy(path: str) -> ConnectionLimits:
    """Load a policy as ``amqp-policy-proxy check --policy PATH`` does; its warnings go to
    stderr as ``check`` prints them.

    Raises:
        PolicyRejected: the policy does not load (the message is ``check``'s output).
    """
    try:
        limits, warnings = load_checked_limits(path)
    except LimitsError as e:
        raise PolicyRejected(str(e)) from None
    if warnings:
        print(warnings, file=sys.stderr)
    return limits


def _load_whole_policy(path: str) -> Policy:
    """:func:`_load_policy` keeping the whole compiled policy (for the exact what-if).

    Raises:
        PolicyRejected: the policy does not load (the message is ``check``'s output).
    """
    try:
        policy, warnings = load_checked_policy(path)
    except LimitsError as e:
        raise PolicyRejected(str(e)) from None
    if warnings:
        print(warnings, file=sys.stderr)
    return policy


# --------------------------------------------------------------------------------------------
# Reading and writing


def _date_hour(us: int) -> tuple[dt.date, int]:
    d = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return d.date(), d.hour


def read_events(spark: SparkSession, path: str, scan_from_us: int | None = None,
                scan_to_us: int | None = None) -> DataFrame:
    """Read the event log with the explicit schema, pruning ``dt``/``hour`` partitions.

    A local partitioned log is listed hour by hour (:mod:`..layout`): a compacted hour
    (``report compact``) is read from its Parquet files, every other hour from its JSON Lines
    files, with the same columns and the same rows either way. Any other path (a flat
    directory, one file, ``hdfs://``, ``s3a://``) is read as JSON Lines as a whole.

    Args:
        spark: the session.
        path: event log root (partitioned layout), a flat directory or a file.
        scan_from_us: first instant needed (partitions wholly before its hour are skipped).
        scan_to_us: first instant not needed (partitions from its hour on are skipped when it
            is on an hour boundary, else from the next hour).

    Returns:
        The raw records (every field of the schema, ``dt``, ``hour``) plus ``proxy``:
        ``<host>-<pid>`` from the file name ``events-<host>-<pid>.jsonl`` (for compacted
        hours, stored with each record), ``""`` for files not named that way (they count as
        one proxy).

    Raises:
        UsageError: a compaction marker of the log is unreadable.
    """
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import layout
    from amqp_policy_proxy.spark_reports.schemas import event_log_schema

    first = last = None
    dtc, hour = F.col("dt"), F.col("hour")
    cond = None
    if scan_from_us is not None:
        d0, h0 = _date_hour(scan_from_us)
        first = (d0, h0)
        cond = (dtc > F.lit(d0)) | ((dtc == F.lit(d0)) & (hour.isNull() | (hour >= h0)))
    if scan_to_us is not None:
        d1, h1 = _date_hour(scan_to_us - 1)
        last = (d1, h1)
        c = (dtc < F.lit(d1)) | ((dtc == F.lit(d1)) & (hour.isNull() | (hour <= h1)))
        cond = c if cond is None else cond & c
    try:
        hours = layout.list_hours(path) if layout.is_local(path) else []
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not hours:
        df = _with_proxy(spark.read.schema(event_log_schema()).json(path))
    else:
        root = layout.local_path(path)
        wanted = [h for h in hours if layout.in_range(h, first, last)]
        jsonl = [os.path.join(h.path, n) for h in wanted for n in h.live_jsonl]
        parquet = [os.path.join(h.path, n) for h in wanted for n in h.live_parquet]
        parts = []
        if jsonl:
            parts.append(_with_proxy(spark.read.schema(event_log_schema())
                                     .option("basePath", root).json(jsonl)))
        if parquet:
            parts.append(spark.read.schema(compacted_schema()).option("basePath", root)
                         .parquet(*parquet))
        if not parts:
            from amqp_policy_proxy.spark_reports.common import local_table

            return local_table(spark, [], compacted_schema())
        df = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    if cond is not None:
        df = df.where(dtc.isNull() | cond)
    return df


def compacted_schema() -> Any:
    """The columns of :func:`read_events`: the event log schema (``dt``, ``hour`` last) with
    ``proxy`` before the partition columns, as compacted hours store them."""
    from pyspark.sql import types as T

    from amqp_policy_proxy.spark_reports.schemas import event_log_schema

    fields = event_log_schema(partitions=False).fields + [
        T.StructField("proxy", T.StringType(), True)]
    return T.StructType(fields + event_log_schema().fields[-2:])


def _with_proxy(df: DataFrame) -> DataFrame:
    # JSON Lines: the proxy comes from the file name; columns in compacted_schema() order.
    from pyspark.sql import functions as F

    return df.withColumn("proxy", proxy_from_file_name(F.col("_metadata.file_name"))).select(
        *compacted_schema().fieldNames())


def proxy_from_file_name(name: Any) -> Any:
    """Return the Spark expression ``<host>-<pid>`` of ``events-<host>-<pid>.jsonl``, else ``""``.

    The same as ``regexp_extract(name, '^events-(.+)\\.jsonl$', 1)``, with plain string
    functions: it runs once per record, where a regular expression costs measurably more.

    Args:
        name: a string column holding a file name (no directory).

    Returns:
        A string column, never null for a non-null name.
    """
    from pyspark.sql import functions as F

    prefix, suffix = "events-", ".jsonl"
    ok = (name.startswith(prefix) & name.endswith(suffix)
          & (F.length(name) > len(prefix) + len(suffix)))
    inner = name.substr(F.lit(len(prefix) + 1), F.length(name) - len(prefix) - len(suffix))
    return F.when(ok, inner).otherwise(F.lit(""))


def _iso(col: Any) -> Any:
    from pyspark.sql import functions as F

    return F.date_format(col, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")


def write_csv(df: DataFrame, path: str, order: list[Any],
              keep: list[dict[str, Any]] | None = None, large: bool = False) -> int:
    """Write a DataFrame to one CSV file on the driver, timestamps as RFC 3339.

    An aggregated table (at most one row per key) is gathered into one partition and fetched
    in one job. A ``large`` one (a row per connection) is fetched one sorted partition at a
    time, so no single result has to fit the driver's ``spark.driver.maxResultSize``.

    Args:
        df: the table.
        path: the CSV file to write.
        order: sort columns.
        keep: if given, also append each row (as a dict) to this list.
        large: stream the sorted partitions (one job each) instead of one.

    Returns:
        The number of data rows written.
    """
    from pyspark.sql import types as T

    cols = [_iso(df[f.name]).alias(f.name) if isinstance(f.dataType, T.TimestampType)
            else df[f.name] for f in df.schema.fields]
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(df.columns)
        rows = df.orderBy(*order).select(*cols)
        for row in (rows if large else rows.coalesce(1)).toLocalIterator():
            w.writerow(["" if v is None else v for v in row])
            if keep is not None:
                keep.append(row.asDict())
            n += 1
    return n


def _write_parquet(df: DataFrame, out: str, name: str) -> DataFrame:
    path = os.path.join(out, name)
    df.write.mode("overwrite").parquet(path)
    return _read_parquet(df.sparkSession, path, df.schema)


def _ship_package(spark: SparkSession) -> str:
    """Zip this package and add it to the executors' Python path; return the temp dir.

    Needed under spark-submit when the package is not installed on the workers (the what-if
    replay runs Python code on the executors); harmless otherwise.
    """
    pkg = Path(__file__).resolve().parents[2]
    tmp = tempfile.mkdtemp(prefix="amqp-policy-proxy-pyfiles-")
    path = os.path.join(tmp, "amqp_policy_proxy.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(pkg.rglob("*.py")):
            z.write(p, p.relative_to(pkg.parent))
    spark.sparkContext.addPyFile(path)
    return tmp


# --------------------------------------------------------------------------------------------
# The report


#: What each stage of :func:`run_report` does, for the progress lines in the log.
STAGES = {
    "read": "read and prepare the event log",
    "sweep_inputs": "sweep inputs",
    "dense_timeline": "vhost and group timeline",
    "sweeps": "concurrency sweeps",
    "concurrency": "concurrency table",
    "whatif": "what-if replay",
    "branches_wait": "wait for the side tables",
    "html": "HTML report",
    "denials_traffic": "denials, traffic, durations, churn and admin actions",
    "html_concurrency": "concurrency charts",
    "headroom": "headroom and recommendations",
    "html_whatif": "what-if charts",
    "trends": "churn and storms",
    "forecast": "forecast",
}


def _log_stage(name: str, seconds: float, elapsed: float, branch: bool = False) -> None:
    """Log one progress line: the stage, its own wall time and the time since the start."""
    logger.info("%s %s: %.1f s (%.1f s elapsed)", "stage" if not branch else "branch",
                STAGES.get(name, name), seconds, elapsed)


class _Branches:
    """Independent parts of the report, run on driver threads next to the main chain.

    On two cores the main chain alone leaves a core idle at every stage tail, every small
    query and every gap the driver spends planning; jobs submitted from other threads fill
    those. Each branch runs under :func:`pyspark.inheritable_thread_target` (the local
    properties of the caller's thread, pinned-thread mode); :meth:`join` waits for all of
    them and raises the first failure.
    """

    def __init__(self, spark: SparkSession, timings: dict[str, float]) -> None:
        from pyspark import inheritable_thread_target

        self._wrap = inheritable_thread_target(spark)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="report-branch")
        self._futures: list[Future] = []
        self._timings = timings
        self._t0 = time.monotonic()

    def start(self, name: str, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a branch thread; its wall time goes to the timings as ``name``.

        Returns:
            The future of its result.
        """
        def timed() -> Any:
            t = time.monotonic()
            try:
                return fn(*args)
            finally:
                now = time.monotonic()
                self._timings[name] = round(now - t, 2)
                _log_stage(name, self._timings[name], now - self._t0, branch=True)

        f = self._pool.submit(self._wrap(timed))
        self._futures.append(f)
        return f

    def join(self, raise_error: bool = True) -> None:
        """Wait for every branch.

        Args:
            raise_error: raise the first exception a branch raised (in start order).
        """
        self._pool.shutdown(wait=True)
        errors = [f.exception() for f in self._futures]
        error = next((e for e in errors if e is not None), None)
        if error is not None and raise_error:
            raise error


def _side_session(spark: SparkSession) -> SparkSession:
    """A session sharing ``spark``'s context and cache but not its SQL conf (see SWEEP_CONF)."""
    side = spark.newSession()
    for key, value in RUNTIME_CONF.items():
        side.conf.set(key, value)
    return side


def run_report(spark: SparkSession, opts: Options) -> dict[str, Any]:
    """Compute and write every output of the report into ``opts.out``.

    The main chain (key table, sweeps, concurrency, what-if) runs on the calling thread;
    the tables that need only the events (denials, traffic, durations, churn), the headroom
    and recommendations, and the extracts and charts of the HTML page run on driver threads
    beside it (:class:`_Branches`), so that Spark always has tasks for every core.

    Args:
        spark: a session (its SQL time zone is set to UTC for the run).
        opts: validated options.

    Returns:
        A summary: ``window`` (start/end ISO strings, or ``None`` with no events), ``rows``
        per table and ``seconds`` per stage (stages of the main chain in order; the
        branches' own wall times overlap them).

    Raises:
        Exception: Spark and I/O errors propagate (the caller maps them to exit code 1).
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html, schemas
    from amqp_policy_proxy.spark_reports.common import ReportWindow, local_table
    from amqp_policy_proxy.spark_reports.concurrency import (
        DENSE_SCOPES,
        SPARSE_SCOPES,
        bucket_samples,
        concurrency,
        concurrency_stats,
        limit_peaks,
        name_keys,
        sweep_points,
        timeline,
    )
    from amqp_policy_proxy.spark_reports.events import (
        event_time_range_columns,
        key_groups,
        name_ids,
        prepare_events,
        prepare_sweep,
        proxy_columns,
    )
    from amqp_policy_proxy.spark_reports.fleet import limit_scope

    for key, value in RUNTIME_CONF.items():
        spark.conf.set(key, value)
    out = opts.out
    os.makedirs(os.path.join(out, "img"), exist_ok=True)
    if opts.whatif is None:  # a what-if of an earlier run would look like this run's
        for name in WHATIF_OUTPUTS:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
    timings: dict[str, float] = {}
    t_first = t_start = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t_start
        now = time.monotonic()
        timings[name] = round(now - t_start, 2)
        t_start = now
        if name != "whatif" or opts.whatif is not None:
            _log_stage(name, timings[name], now - t_first)

    # (a default given: a str, though pyspark's stub says str | None)
    lookback_h = float(cast(str, spark.conf.get("spark.amqpPolicyProxy.lookbackHours",
                                                str(DEFAULT_LOOKBACK_HOURS))))
    scan_from = None if opts.start_us is None else opts.start_us - int(lookback_h * 3.6e9)
    raw = read_events(spark, opts.events, scan_from, opts.end_us)
    # Parse the JSON once: every later query reads the prepared columns back from Parquet
    # (columnar, only the columns it needs), not from an in-memory cache that would not fit
    # in a 2 GB heap and would spill to disk as slow serialised blocks.
    work = os.path.join(out, "_work")
    shutil.rmtree(work, ignore_errors=True)
    # the exact what-if resolves each connection's vhost from its Open hostname
    prepared = prepare_events(raw, drop_unparsed=False, hostnames=opts.whatif is not None)
    events_path = os.path.join(work, "events")
    # The time range comes with the write (an observed metric), not from a second scan.
    observed = Observation("event_time_range")
    prepared = prepared.observe(observed, *event_time_range_columns())
    # One directory per event: a query of one event reads only its records (the denials
    # are 2 % of them) and compares no event names.
    (prepared.write.mode("overwrite").options(**WORK_TABLE_OPTIONS).partitionBy("event")
     .parquet(events_path))
    events_schema = prepared.schema
    events = _work_events(spark, events_path, events_schema)

    start, end = opts.start_us, opts.end_us
    r = observed.get
    skipped = int(r["skipped"] or 0)
    if skipped:
        logger.warning("%d records of the event log skipped: not JSON objects, or no "
                       "parsable ts", skipped)
    if start is None or end is None:
        if r["min_us"] is not None:
            start = r["min_us"] - r["min_us"] % 1000 if start is None else start
            end = r["max_us"] - r["max_us"] % 1000 + 1000 if end is None else end
    lap("read")
    report = html.ReportData(grid=opts.grid_label, source=opts.events)
    summary: dict[str, Any] = {"rows": {}, "seconds": timings, "skipped_records": skipped}
    if skipped:
        report.notes.append(f"{skipped} records of the event log were skipped: lines that "
                            "are not JSON objects, or connection events without a parsable "
                            "ts. Everything else is counted.")
    if start is None or end is None or end <= start:  # empty
        logger.warning("no connection events in the window: writing an empty report")
        for name, schema in (("concurrency", schemas.CONCURRENCY), ("headroom", schemas.HEADROOM),
                             ("denials", schemas.DENIALS)):
            _write_parquet(local_table(spark, [], schema), out, name)
        write_csv(local_table(spark, [], schemas.CONCURRENCY), os.path.join(
            out, "concurrency.csv"), ["scope"])
        write_csv(local_table(spark, [], schemas.RECOMMENDATIONS), os.path.join(
            out, "recommendations.csv"), ["vhost"])
        if opts.whatif is not None:
            _write_parquet(local_table(spark, [], schemas.WHATIF), out, "whatif")
        report.notes.append("No connection events in the window.")
        html.write_report(out, report)
        shutil.rmtree(work, ignore_errors=True)
        summary["window"] = None
        return summary

    window = ReportWindow(start, end, opts.grid_us)
    if window.buckets > MAX_BUCKETS:
        raise UsageError(f"--grid {opts.grid_label} makes {window.buckets} buckets over the "
                         f"window (more than {MAX_BUCKETS}): use a coarser grid")
    report.window_start = _fmt_us(start)
    report.window_end = _fmt_us(end)
    summary["window"] = {"start": report.window_start, "end": report.window_end,
                         "buckets": window.buckets}

    branches = _Branches(spark, timings)
    sweep = None
    cached: list[DataFrame] = []
    try:
        # Denials, traffic, durations and churn need only the events: their own branch, in
        # their own session (the main chain changes SQL conf for a while, SWEEP_CONF).
        side = _side_session(spark)
        branches.start("denials_traffic", _side_tables, side, events_path, events_schema,
                       window, out, report, summary)
        # Churn and storms need only the events too.
        trends = branches.start("trends", _trend_tables, _side_session(spark), opts,
                                events_path, events_schema, window, out, report, summary)

        # Which proxies are summed before a limit: per proxy, per recorded fleet, --fleet.
        scope = limit_scope(spark, events, opts.fleet)
        report.limit_scope = scope.text
        summary["limits"] = scope.summary
        # Without --from the window starts at the first event: nothing can precede it.
        sweep = prepare_sweep(events, window, carried=opts.start_us is not None,
                              domains=scope.domains, fleet=scope.fleet).persist(events)
        sweep.keyed.count()
        lap("sweep_inputs")

        # Dense scopes: keep the per-bucket samples for the timeline.
        dense = bucket_samples(
            sweep_points(sweep.keyed, sweep.keys, window, DENSE_SCOPES, by_bucket=True),
            window, dense=True, nprox=proxy_columns(sweep.keys, DENSE_SCOPES)).persist()
        cached.append(dense)
        tl = _write_parquet(name_ids(timeline(dense, window), sweep.keys, DENSE_SCOPES), out,
                            "timeline")
        conc_dense = name_keys(concurrency_stats(dense, window), sweep.keys, DENSE_SCOPES)
        forecast = branches.start("forecast", _forecast_tables, opts, out, report, summary,
                                  tl)
        lap("dense_timeline")
        conc_sparse = concurrency(sweep, SPARSE_SCOPES)
        saved = {k: spark.conf.get(k, None) for k in SWEEP_CONF}
        for key, value in SWEEP_CONF.items():
            spark.conf.set(key, value)
        try:
            full = _write_parquet(conc_dense.unionByName(conc_sparse), out, "_work/concurrency")
        finally:
            for key, before in saved.items():
                if before is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, before)
        dense.unpersist()
        lap("sweeps")
        conc = _write_parquet(full.select(*schemas.CONCURRENCY.fieldNames()), out,
                              "concurrency")
        branches.start("html_concurrency", _concurrency_extracts, out, report, window, conc, tl)
        summary["rows"]["concurrency"] = write_csv(
            conc, os.path.join(out, "concurrency.csv"),
            ["scope", "vhost", F.col("peak").desc(), "key"])
        bad = full.where(F.col("low") < 0).count()
        notes_bad = [] if not bad else [
            f"{bad} keys have connection_closed records without their connection_opened "
            "(dropped by the writer?): their concurrency is undercounted after those closes."]
        peaks = limit_peaks(full).persist()
        pairs = key_groups(sweep.keys).persist()
        cached += [peaks, pairs]
        lap("concurrency")

        headroom = branches.start("headroom", _headroom_tables, spark, opts, out, report,
                                  summary, conc, peaks, pairs, sweep, events)
        notes_whatif: list[str] = []
        if opts.whatif_policy is not None:
            notes_whatif = _whatif_tables(out, report, summary, branches, sweep, events,
                                          opts, conc, peaks)
        lap("whatif")
        branches.join()
        lap("branches_wait")
        report.notes += notes_bad + headroom.result() + notes_whatif + trends.result() \
            + forecast.result()
    finally:
        branches.join(raise_error=False)  # after a failure: let the branches end first
        for df in cached:
            df.unpersist()
        if sweep is not None:
            sweep.unpersist()
    shutil.rmtree(work, ignore_errors=True)
    html.write_report(out, report)
    lap("html")
    return summary


def _read_parquet(spark: SparkSession, path: str, schema: Any) -> DataFrame:
    # With the schema given, Spark does not run a job to read it from a file footer.
    return spark.read.schema(schema).parquet(path)


def _work_events(spark: SparkSession, path: str, schema: Any) -> DataFrame:
    # The prepared events of the work table, without the skipped records (no t_us).
    from pyspark.sql import functions as F

    return _read_parquet(spark, path, schema).where(F.col("t_us").isNotNull())


def _side_tables(spark: SparkSession, events_path: str, events_schema: Any,
                 window: ReportWindow, out: str, report: Any, summary: dict[str, Any]) -> None:
    """Write denials, top_denied, traffic, durations, churn and admin_actions.csv; fill and
    draw their sections.

    Runs on a branch thread with its own session; reads the events from the work table.
    """
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html
    from amqp_policy_proxy.spark_reports.traffic import (
        admin_actions,
        churn,
        denials,
        durations,
        top_denied,
        traffic,
    )

    events = _work_events(spark, events_path, events_schema)
    # Denials are a few % of the records, in their own partition of the work table.
    den = _write_parquet(denials(events, window), out, "denials")
    td = _write_parquet(top_denied(events, window), out, "top_denied")
    summary["rows"]["top_denied"] = write_csv(
        td, os.path.join(out, "top_denied.csv"), [F.col("count").desc(), "scope", "key"])
    trf = _write_parquet(traffic(events, window), out, "traffic")
    summary["rows"]["traffic"] = write_csv(trf, os.path.join(out, "traffic.csv"),
                                           ["vhost", "group"])
    dur = _write_parquet(durations(events, window), out, "durations")
    ch = _write_parquet(churn(events, window), out, "churn")
    # a table for people: targets joined, credentials as plain numbers (no 1,234)
    admin = (admin_actions(events, window)
             .withColumn("targets", F.array_join("targets", " "))
             .withColumn("uid", F.col("uid").cast("string"))
             .withColumn("pid", F.col("pid").cast("string")))
    admin_rows: list[dict[str, Any]] = []
    summary["rows"]["admin_actions"] = write_csv(
        admin, os.path.join(out, "admin_actions.csv"), ["ts", "action"], admin_rows)
    report.admin_actions = admin_rows

    bin_us = _series_bin_us(window)
    dser = (den.groupBy("reason", _binned("window_start", bin_us))
            .agg(F.sum("count").alias("y")).orderBy("reason", "x").collect())
    report.denials = _group_series(dser, "reason")
    report.denial_totals = {k: int(sum(ys)) for k, (_, ys) in report.denials.items()}
    report.top_denied = _top_per_scope(td, [F.col("count").desc(), "vhost", "key"])
    html.draw_section(out, report, "denials")
    report.traffic = [r.asDict() for r in trf.orderBy("vhost", "group").collect()]
    report.durations = [(r["label"], r["le_seconds"], r["n"]) for r in dur.groupBy(
        "label", "le_seconds").agg(F.sum("count").alias("n")).orderBy("le_seconds").collect()]
    per_min = ch.groupBy("window_start").agg(F.sum("opens").alias("opens"))
    cser = (per_min.groupBy(_binned("window_start", bin_us)).agg(
        F.max("opens").alias("max"), F.sum("opens").alias("sum")).orderBy("x").collect())
    minutes_per_bin = max(1, bin_us // 60_000_000)
    report.churn = [(_dt(r["x"]), r["max"], r["sum"] / minutes_per_bin) for r in cser]
    html.draw_section(out, report, "traffic")


def _headroom_tables(spark: SparkSession, opts: Options, out: str, report: Any,
                     summary: dict[str, Any], conc: DataFrame, peaks: DataFrame,
                     pairs: DataFrame, sweep: Any, events: DataFrame) -> list[str]:
    """Write headroom (table and CSV), recommendations.csv, the recommended policy and its
    diff; fill and draw the headroom section. Returns the notes for the page."""
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html, schemas
    from amqp_policy_proxy.spark_reports.common import local_table
    from amqp_policy_proxy.spark_reports.headroom import headroom, limit_tables

    notes = []
    lt = limit_tables(spark, opts.policy) if opts.policy is not None else None
    if lt is not None:
        hr = _write_parquet(headroom(peaks, pairs, lt), out, "headroom")
        summary["rows"]["headroom"] = write_csv(
            hr, os.path.join(out, "headroom.csv"),
            [F.col("utilisation").desc_nulls_last(), "scope", "vhost", "key"])
        missing = _vhosts_not_in(conc, lt)
        if missing:
            notes.append("Vhosts in the log but not in the policy (no headroom): "
                         + ", ".join(missing))
    else:
        hr = _write_parquet(local_table(spark, [], schemas.HEADROOM), out, "headroom")
        notes.append("No --policy: no headroom; recommendations have no current value.")
    notes += _recommendation_outputs(opts, out, report, summary, pairs, sweep, events)
    report.headroom_top = _top_per_scope(
        hr, [F.col("utilisation").desc_nulls_last(), "vhost", "key"])
    html.draw_section(out, report, "headroom")
    return notes


def _recommendation_outputs(opts: Options, out: str, report: Any, summary: dict[str, Any],
                            pairs: DataFrame, sweep: Any, events: DataFrame) -> list[str]:
    """Recommend every setting by ``opts.rule`` (:mod:`..advice`), write
    recommendations.csv, ``policy/`` and policy.diff (:mod:`..policy_writer`). Returns the
    notes for the page."""
    from amqp_policy_proxy.spark_reports import policy_writer as pw
    from amqp_policy_proxy.spark_reports.advice import key_percentiles, open_rates, recommend
    from amqp_policy_proxy.spark_reports.headroom import limit_tables

    spark = pairs.sparkSession
    fleet = opts.fleet  # --fleet; recorded fleets are the sweep's limit domains
    lt = limit_tables(spark, opts.policy) if opts.policy is not None else None
    values = key_percentiles(sweep, opts.rule, fleet)
    rates = open_rates(events, sweep.window, opts.rule, fleet)
    rows = [r.asDict() for r in recommend(values, pairs, lt, opts.rule, rates)
            .orderBy("vhost", "group", "setting").collect()]
    values.unpersist()
    rates.unpersist()
    rows = pw.with_rate_currents(rows, opts.policy_whole)
    for r in rows:
        if r["peak_ts"] is not None:
            r["peak_ts"] = _fmt_us(int(r["peak_ts"].timestamp() * 1_000_000))
    cols = list(RECOMMENDATION_COLUMNS)
    with open(os.path.join(out, "recommendations.csv"), "w", newline="",
              encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r[c] is None else r[c] for c in cols])
    summary["rows"]["recommendations"] = len(rows)
    report.recommendations = rows
    report.recommendation_rule = opts.rule.text()
    changes = [pw.Change(r["vhost"], r["group"], r["setting"], int(r["recommended"]),
                         r["current"]) for r in rows]
    if opts.policy_path is not None:
        written = pw.write_policy(opts.policy_path, changes, out)
    else:
        written = pw.new_policy(changes, _logged_groups(pairs), out)
    report.policy_diff = written.diff
    report.policy_files = written.files
    summary["rows"]["policy_changes"] = len(written.applied)
    return []


def _logged_groups(pairs: DataFrame) -> dict[str, dict[str, list[str]]]:
    """Per vhost, per group, the users the log shows connected under it."""
    from pyspark.sql import functions as F

    out: dict[str, dict[str, list[str]]] = {}
    for r in (pairs.where(F.col("group").isNotNull() & F.col("user").isNotNull())
              .groupBy("vhost", "group").agg(F.collect_set("user").alias("users")).collect()):
        out.setdefault(r["vhost"], {})[r["group"]] = sorted(r["users"])
    return out


#: Columns of recommendations.csv: the contract's six, then the evidence.
RECOMMENDATION_COLUMNS = ("vhost", "group", "setting", "current", "recommended", "change",
                          "rule", "basis_scope", "basis", "percentile", "peak", "peak_ts")


#: What ``--whatif`` writes (removed by a run without it, so that no stale what-if remains).
WHATIF_OUTPUTS = ("whatif", "whatif.csv", "whatif_denied", "whatif_denied.csv",
                  "whatif_totals.csv", "whatif_summary.json")


def _whatif_tables(out: str, report: Any, summary: dict[str, Any], branches: _Branches,
                   sweep: Any, events: DataFrame, opts: Options, conc: DataFrame,
                   peaks: DataFrame) -> list[str]:
    """Run the exact what-if (:func:`replay.replay`) and write its outputs; start the
    what-if charts on a branch. Returns the notes for the page."""
    import json

    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports.replay import denied_totals, replay, whatif_keys

    assert opts.whatif_policy is not None
    # Fleet-wide limits (one shared ledger) replay per vhost across the proxies and compare
    # with fleet-wide peaks; per-process limits per (proxy, vhost). Only --fleet makes the
    # replay fleet-wide (fleets recorded in the log are still replayed per proxy process).
    fleet = opts.fleet
    if fleet:
        peaks = conc.where(F.col("scope").isin("vhost", "user", "remote_host")).select(
            "scope", "vhost", "key", "peak")
    denied, replayed = replay(sweep, events, opts.whatif_policy, peaks, fleet=fleet)
    dn = _write_parquet(denied, out, "whatif_denied")
    summary["rows"]["whatif_denied"] = write_csv(
        dn, os.path.join(out, "whatif_denied.csv"), ["ts", "vhost", "proxy", "conn_id"],
        large=True)
    wi = _write_parquet(whatif_keys(dn), out, "whatif")
    branches.start("html_whatif", _whatif_extracts, out, report, wi)
    summary["rows"]["whatif"] = write_csv(
        wi, os.path.join(out, "whatif.csv"),
        [F.col("would_deny").desc(), "vhost", "scope", "key"])
    totals: list[dict[str, Any]] = []
    write_csv(denied_totals(dn), os.path.join(out, "whatif_totals.csv"),
              ["vhost", "enforcement", F.col("denied").desc(), "reason"], totals)
    enforced = [t for t in totals if t["enforcement"] == "enforce"]
    by_reason: dict[str, int] = {}
    by_vhost: dict[str, int] = {}
    for t in enforced:
        by_reason[t["reason"]] = by_reason.get(t["reason"], 0) + int(t["denied"])
        by_vhost[t["vhost"]] = by_vhost.get(t["vhost"], 0) + int(t["denied"])
    doc = {"policy": list(opts.whatif_policy.files), "fleet_wide": fleet,
           "replayed_vhosts": replayed, "denied": sum(by_reason.values()),
           "by_reason": dict(sorted(by_reason.items())),
           "by_vhost": dict(sorted(by_vhost.items())),
           "shadow": sum(int(t["denied"]) for t in totals if t["enforcement"] == "shadow"),
           "totals": totals}
    with open(os.path.join(out, "whatif_summary.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    report.whatif_replayed = replayed
    report.whatif_reasons = doc["by_reason"]
    notes = []
    if doc["shadow"]:
        notes.append(f"What-if: {doc['shadow']} connection(s) of groups in shadow mode would "
                     "only be reported (SHADOW DENY), not denied.")
    return notes


def _fmt_us(us: int) -> str:
    d = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


#: Rows per scope in the page's "most denied" and headroom lists.
_TOP_N = 15


def _series_bin_us(window: ReportWindow, points: int = 1500) -> int:
    """A chart bin width: a whole number of grid buckets giving at most ``points`` bins."""
    per = max(1, -(-window.buckets // points))
    return per * window.grid_us


def _binned(col: str, bin_us: int) -> Any:
    from pyspark.sql import functions as F

    us = F.unix_micros(F.col(col))
    return (us - F.pmod(us, F.lit(bin_us))).alias("x")


def _top(df: DataFrame, by: str, order: list[Any], n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of each ``by`` group in ``order``, in one query."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    rank = F.row_number().over(Window.partitionBy(by).orderBy(*order))
    rows = df.select("*", rank.alias("_rank")).where(F.col("_rank") <= n) \
        .orderBy(by, "_rank").drop("_rank").collect()
    return [r.asDict() for r in rows]


def _top_per_scope(df: DataFrame, order: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The first :data:`_TOP_N` rows of each scope in ``order``, as scope -> rows."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in _top(df, "scope", order, _TOP_N):
        grouped.setdefault(r["scope"], []).append(r)
    return grouped


def _vhosts_not_in(conc: DataFrame, limits: Any) -> list[str]:
    """The vhosts of the concurrency table that ``limits`` (LimitTables) has no entry for."""
    from pyspark.sql import functions as F

    rows = (conc.where(F.col("scope") == "vhost").select("vhost")
            .join(limits.vhosts, F.col("vhost") == F.col("name"), "left_anti").collect())
    return sorted(str(r[0]) for r in rows)


def _concurrency_extracts(out: str, report: Any, window: ReportWindow, conc: DataFrame,
                          tl: DataFrame) -> None:
    """Fill and draw the concurrency section (small extracts: one query per table)."""
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html

    report.concurrency_all = {r["scope"]: r["count"] for r in conc.groupBy("scope").count()
                              .collect()}
    dense = [r.asDict() for r in conc.where(F.col("scope").isin("vhost", "group")).collect()]
    report.vhost_rows = sorted(dense, key=lambda r: (r["vhost"], r["scope"] != "vhost",
                                                     r["key"]))
    top = _top(conc.where(F.col("scope").isin("user", "remote_host")), "scope",
               [F.col("peak").desc(), "vhost", "key"], 30)
    report.concurrency_top = sorted([r for r in dense if r["scope"] == "vhost"] + top,
                                    key=lambda r: -r["peak"])
    vhosts = [r["key"] for r in report.concurrency_top if r["scope"] == "vhost"][:8]
    series = (tl.where((F.col("scope") == "vhost") & F.col("key").isin(*vhosts))
              .groupBy("key", _binned("window_start", _series_bin_us(window)))
              .agg(F.max("concurrent").alias("y")).orderBy("key", "x").collect())
    report.timeline = _group_series(series, "key")
    html.draw_section(out, report, "concurrency")


def _whatif_extracts(out: str, report: Any, wi: DataFrame) -> None:
    """Fill and draw the what-if section: the 50 keys with the most denials and the total."""
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html

    # The total as a plain aggregation: a window over the whole table (a constant partition
    # key is optimised away) would run on one task and log a WindowExec warning.
    report.whatif_total = int(wi.agg(F.sum("would_deny")).collect()[0][0] or 0)
    rows_w = (wi.orderBy(F.col("would_deny").desc(), "vhost", "scope", "key").limit(50)
              .collect())
    report.whatif = [r.asDict() for r in rows_w]
    html.draw_section(out, report, "whatif")


def _dt(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)


def _group_series(rows: list[Any], by: str) -> dict[str, tuple[list[dt.datetime], list[int]]]:
    out: dict[str, tuple[list[dt.datetime], list[int]]] = {}
    for r in rows:
        xs, ys = out.setdefault(str(r[by]), ([], []))
        xs.append(_dt(r["x"]))
        ys.append(r["y"])
    return out

# --------------------------------------------------------------------------------------------
# Churn, storms and forecasts: options and the one stage that runs them. The
# computations are in ..churn, ..storms and ..forecast; the page sections in ..html.

#: ``--churn-for`` and ``--storm-gap`` values: N and a unit.
_DURATION = re.compile(r"\s*(\d+)\s*([smh])\s*")


@dataclass(frozen=True)
class TrendOptions:
    """The churn, storm and forecast options of ``report capacity``."""

    churn_ratio: float = 0.1
    """``--churn-ratio``: opens + closes per second above this fraction of open connections."""
    churn_minutes: int = 10
    """``--churn-for``, in whole minutes."""
    churn_min_connections: int = 100
    """``--churn-min-connections``."""
    storm_factor: float = 5.0
    """``--storm-factor``: times the baseline opens per second."""
    storm_floor: int = 20
    """``--storm-floor``: opens per second at least."""
    storm_gap_seconds: int = 30
    """``--storm-gap``, in seconds."""
    forecast_days: int | None = 30
    """``--forecast-days``; ``None`` with ``--no-forecast``."""
    forecast_keys: int = 24
    """``--forecast-keys``: keys forecast at most (vhosts first, then groups by peak)."""


def add_trend_arguments(p: argparse.ArgumentParser) -> None:
    """Add the churn, storm and forecast options to the ``report capacity`` parser."""
    g = p.add_argument_group(
        "churn, storms and forecasts",
        "Churn follows the HighConnectionChurn rule: (opens + closes) per second above "
        "RATIO x open connections for DURATION, ignored under MIN open connections, per vhost "
        "and per client host. A storm is opens per second of a vhost at least FACTOR x the "
        "median of the hour before and at least FLOOR, merged across gaps under GAP. "
        "Outputs: churn_rates, churn_periods, storms, storm_limits (Parquet, CSV, JSON), "
        "forecast.csv, forecast_limits.csv, forecast.json (docs/spark-reports.md).")
    g.add_argument("--churn-ratio", type=float, default=0.1, metavar="RATIO",
                   help="churn threshold: (opens + closes)/s above RATIO x open connections "
                        "(default 0.1)")
    g.add_argument("--churn-for", default="10m", metavar="DURATION",
                   help="churn must last this long, whole minutes: N m|h (default 10m)")
    g.add_argument("--churn-min-connections", type=int, default=100, metavar="MIN",
                   help="ignore churn while fewer connections are open (default 100)")
    g.add_argument("--storm-factor", type=float, default=5.0, metavar="FACTOR",
                   help="a storm second has FACTOR x the baseline opens/s (default 5)")
    g.add_argument("--storm-floor", type=int, default=20, metavar="FLOOR",
                   help="... and at least FLOOR opens/s (default 20)")
    g.add_argument("--storm-gap", default="30s", metavar="GAP",
                   help="storm seconds closer than GAP are one storm: N s|m (default 30s)")
    g.add_argument("--forecast-days", type=int, default=30, metavar="N",
                   help="forecast the daily peak per vhost and group N days ahead, with 80/95 %% "
                        "intervals and the days until each vhost's maxConnections (default 30)")
    g.add_argument("--forecast-keys", type=int, default=24, metavar="K",
                   help="forecast at most K keys: the vhosts first, then the groups with the "
                        "highest peaks (default 24; each takes a few seconds on the driver)")
    g.add_argument("--no-forecast", action="store_true",
                   help="no forecast (statsmodels not needed)")


def _duration_s(text: str, flag: str) -> int:
    m = _DURATION.fullmatch(text)
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"{flag} must be a positive number with a unit s, m or h: {text!r}")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def trend_options(a: argparse.Namespace) -> TrendOptions:
    """Validate the churn, storm and forecast options of parsed arguments.

    Raises:
        UsageError: a value out of range (ratio and factor > 0, minimum >= 0, floor >= 1,
            ``--churn-for`` whole minutes, ``--forecast-days`` 1..365).
    """
    churn_s = _duration_s(a.churn_for, "--churn-for")
    if churn_s % 60:
        raise UsageError(f"--churn-for must be whole minutes: {a.churn_for!r}")
    if not a.churn_ratio > 0:
        raise UsageError(f"--churn-ratio must be positive: {a.churn_ratio}")
    if a.churn_min_connections < 0:
        raise UsageError("--churn-min-connections must not be negative")
    if not a.storm_factor > 0:
        raise UsageError(f"--storm-factor must be positive: {a.storm_factor}")
    if a.storm_floor < 1:
        raise UsageError("--storm-floor must be at least 1")
    if not 1 <= a.forecast_days <= 365:
        raise UsageError(f"--forecast-days must be 1..365: {a.forecast_days}")
    if a.forecast_keys < 1:
        raise UsageError(f"--forecast-keys must be at least 1: {a.forecast_keys}")
    return TrendOptions(
        churn_ratio=a.churn_ratio, churn_minutes=churn_s // 60,
        churn_min_connections=a.churn_min_connections, storm_factor=a.storm_factor,
        storm_floor=a.storm_floor, storm_gap_seconds=_duration_s(a.storm_gap, "--storm-gap"),
        forecast_days=None if a.no_forecast else a.forecast_days,
        forecast_keys=a.forecast_keys)


def _write_json(path: str, rows: list[dict[str, Any]]) -> None:
    """Write rows as a JSON array; datetimes as RFC 3339 (UTC, ms), dates as YYYY-MM-DD."""
    import json

    def conv(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            v = v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
            return _fmt_us(int((v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC))
                               / dt.timedelta(microseconds=1)))
        if isinstance(v, dt.date):
            return v.isoformat()
        raise TypeError(f"not JSON serialisable: {v!r}")

    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f, default=conv, indent=1)
        f.write("\n")


def _trend_tables(spark: SparkSession, opts: Options, events_path: str, events_schema: Any,
                  window: ReportWindow, out: str, report: Any, summary: dict[str, Any],
                  ) -> list[str]:
    """Write the churn and storm outputs and fill and draw their page section.

    Runs on a branch thread with its own session, from the work table (beside the main
    chain, from its start). Returns the notes for the page.
    """
    from pyspark.sql import functions as F

    from amqp_policy_proxy.spark_reports import html
    from amqp_policy_proxy.spark_reports.churn import ChurnRule, churn_periods, churn_rates
    from amqp_policy_proxy.spark_reports.storms import StormRule, storm_limits, storms

    t = opts.trends
    notes: list[str] = []
    t0 = time.monotonic()

    def part(name: str) -> None:  # the parts' own times, in the summary's seconds
        nonlocal t0
        now = time.monotonic()
        summary["seconds"][f"trends_{name}"] = round(now - t0, 2)
        logger.debug("trends part %s: %.1f s", name, now - t0)
        t0 = now

    events = _work_events(spark, events_path, events_schema)
    rule = ChurnRule(t.churn_ratio, t.churn_minutes, t.churn_min_connections)
    rates = _write_parquet(churn_rates(events, window, rule, carried=opts.start_us is not None),
                           out, "churn_rates")
    summary["rows"]["churn_rates"] = write_csv(
        rates.where((F.col("scope") == "vhost") | F.col("over")),
        os.path.join(out, "churn_rates.csv"), ["scope", "vhost", "key", "window_start"])
    periods = _write_parquet(churn_periods(rates), out, "churn_periods")
    period_rows: list[dict[str, Any]] = []
    summary["rows"]["churn_periods"] = write_csv(
        periods, os.path.join(out, "churn_periods.csv"), ["start", "scope", "vhost", "key"],
        period_rows)
    _write_json(os.path.join(out, "churn_periods.json"), period_rows)
    report.churn_periods = period_rows
    part("churn")
    report.churn_rule = (f"(opens + closes)/s > {t.churn_ratio:g} x open connections for "
                         f"{t.churn_minutes} min, at least {t.churn_min_connections} open")

    srule = StormRule(factor=t.storm_factor, floor=t.storm_floor,
                      gap_seconds=t.storm_gap_seconds)
    found = _write_parquet(storms(events, window, srule), out, "storms")
    storm_rows: list[dict[str, Any]] = []
    summary["rows"]["storms"] = write_csv(found, os.path.join(out, "storms.csv"),
                                          ["start", "vhost"], storm_rows)
    _write_json(os.path.join(out, "storms.json"), storm_rows)
    lim_df = storm_limits(events, window, found)
    if not storm_rows:  # nothing to look for: an empty table (the schema costs no job)
        from amqp_policy_proxy.spark_reports.common import local_table

        lim_df = local_table(spark, [], lim_df.schema)
    lim = _write_parquet(lim_df, out, "storm_limits")
    lim_rows: list[dict[str, Any]] = []
    summary["rows"]["storm_limits"] = write_csv(
        lim, os.path.join(out, "storm_limits.csv"), ["storm_id", "setting"], lim_rows)
    _write_json(os.path.join(out, "storm_limits.json"), lim_rows)
    report.storms = storm_rows
    report.storm_limits = lim_rows
    report.storm_rule = (f"opens/s >= {t.storm_factor:g} x the median of the hour before and "
                         f">= {t.storm_floor}, gaps under {t.storm_gap_seconds} s merged")
    html.draw_section(out, report, "storms")
    part("storms")
    return notes


def _forecast_tables(opts: Options, out: str, report: Any, summary: dict[str, Any],
                     tl: DataFrame) -> list[str]:
    """Write forecast.csv, forecast_limits.csv and forecast.json (unless ``--no-forecast``);
    fill and draw the forecast section. Returns the notes for the page.

    Runs on a branch thread as soon as the timeline is written: Spark reduces it to hourly
    peaks, the model runs on the driver (:mod:`..forecast`).
    """
    from amqp_policy_proxy.spark_reports import html

    report.forecast_days = opts.trends.forecast_days
    for name in ("forecast.csv", "forecast_limits.csv", "forecast.json"):
        if os.path.exists(os.path.join(out, name)):  # an earlier run's
            os.remove(os.path.join(out, name))
    notes = [] if opts.trends.forecast_days is None else _forecast(opts, out, report,
                                                                   summary, tl)
    html.draw_section(out, report, "forecast")
    return notes


def _forecast(opts: Options, out: str, report: Any, summary: dict[str, Any],
              tl: DataFrame) -> list[str]:
    """Forecast the vhosts and groups; write forecast.csv, forecast_limits.csv, forecast.json."""
    from pyspark.sql import functions as F

    hour_us = 3_600_000_000
    if opts.grid_us > hour_us or hour_us % opts.grid_us:
        return [f"No forecast: the grid ({opts.grid_label}) does not divide an hour."]
    try:
        from amqp_policy_proxy.spark_reports.forecast import forecast_keys
    except ImportError as e:  # statsmodels missing
        return [f"No forecast: {e} (pip install 'amqp-policy-proxy[spark]')."]
    us = F.unix_micros("window_start")
    hourly = tl.groupBy("scope", "vhost", "key", (us - F.pmod(us, F.lit(hour_us))).alias("h")) \
        .agg(F.max("concurrent").alias("peak"))
    peaks = hourly.groupBy("scope", "vhost", "key").agg(F.max("peak").alias("top")).collect()
    ranked = sorted(peaks, key=lambda r: (r["scope"] != "vhost", -r["top"], r["vhost"], r["key"]))
    chosen = {(r["scope"], r["vhost"], r["key"]) for r in ranked[:opts.trends.forecast_keys]}
    series: dict[tuple[str, str, str], tuple[list[dt.datetime], list[float]]] = {}
    for r in hourly.orderBy("scope", "vhost", "key", "h").collect():
        k = (r["scope"], r["vhost"], r["key"])
        if k in chosen:
            xs, ys = series.setdefault(k, ([], []))
            xs.append(_dt(r["h"]))
            ys.append(float(r["peak"]))
    notes = []
    if len(peaks) > len(chosen):
        notes.append(f"Forecast for the {len(chosen)} keys with the highest peaks (vhosts "
                     f"first) of {len(peaks)}.")
    limits: dict[str, int] = {}
    if opts.policy is not None:
        for vh in {k[1] for k in series}:
            v = opts.policy.lookup_vhost(vh)
            if v is not None:
                limits[vh] = v.max_connections
    forecasts, failed = forecast_keys(series, cast(int, opts.trends.forecast_days), limits)
    notes += failed
    day_rows = [{"scope": f.scope, "vhost": f.vhost, "key": f.key, "date": d.date,
                 "kind": d.kind, "peak": d.peak, "lower80": d.lower80, "upper80": d.upper80,
                 "lower95": d.lower95, "upper95": d.upper95} for f in forecasts for d in f.days]
    limit_rows = [{"scope": f.scope, "vhost": f.vhost, "key": f.key, "limit": f.limit,
                   "model": f.model,
                   "last_peak": next((d.peak for d in reversed(f.days) if d.kind == "actual"),
                                     None),
                   "forecast_peak_max": max((d.peak for d in f.days if d.kind == "forecast"),
                                            default=None),
                   "limit_date": f.limit_date, "days_until_limit": f.days_until_limit,
                   "days_until_limit_upper95": f.days_until_limit_upper95}
                  for f in forecasts]
    _write_rows_csv(os.path.join(out, "forecast.csv"), day_rows,
                    ["scope", "vhost", "key", "date", "kind", "peak", "lower80", "upper80",
                     "lower95", "upper95"])
    _write_rows_csv(os.path.join(out, "forecast_limits.csv"), limit_rows,
                    ["scope", "vhost", "key", "limit", "model", "last_peak",
                     "forecast_peak_max", "limit_date", "days_until_limit",
                     "days_until_limit_upper95"])
    _write_json(os.path.join(out, "forecast.json"), [
        {**lr, "days": [{k: v for k, v in d.items() if k not in ("scope", "vhost", "key")}
                        for d in day_rows if (d["scope"], d["vhost"], d["key"])
                        == (lr["scope"], lr["vhost"], lr["key"])]} for lr in limit_rows])
    summary["rows"]["forecast"] = len(day_rows)
    report.forecasts = forecasts
    report.forecast_limits = limit_rows
    return notes


def _write_rows_csv(path: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Write driver-side rows (the forecast) as CSV; floats with 3 decimals, None empty."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r[c] is None else f"{r[c]:.3f}" if isinstance(r[c], float)
                        else r[c] for c in cols])


# --------------------------------------------------------------------------------------------
# Entry point


def _build_session(master: str | None) -> tuple[SparkSession, bool]:
    """Return (session, created_here): reuse an active session, else build one."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    b = SparkSession.builder.appName("amqp-policy-proxy capacity report")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not under_submit:
        master = DEFAULT_MASTER
    if master is not None:
        b = b.master(master)
    if master is not None and master.startswith("local"):
        # One machine: few shuffle partitions, which AQE coalesces to about 16 MB each (the
        # sweeps' sorts then fit in memory instead of spilling); bigger driver heap and fewer
        # C2 compilations (LOCAL_JAVA_OPTIONS). The last two only take effect when this
        # process launches the JVM, not under spark-submit.
        b = (b.config("spark.sql.shuffle.partitions", "16")
             .config("spark.sql.adaptive.advisoryPartitionSizeInBytes", "16m")
             .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
             .config("spark.driver.extraJavaOptions", LOCAL_JAVA_OPTIONS))
        # Python workers run this interpreter (its venv has pyarrow), not PATH's python3;
        # pyspark reads only the environment variable.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (b.config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
         .config("spark.ui.showConsoleProgress", console_progress(sys.stderr)))
    return b.getOrCreate(), True


#: The JVM's exit status when an uncaught ``OutOfMemoryError`` ended it (Spark's ``SparkExitCode.OOM``).
JVM_OOM_EXIT = 52


def jvm_failure_hint(spark: Any, exc: BaseException) -> str | None:
    """What to do when the report failed because the JVM under ``spark`` ran out of memory or
    is gone, for a session this process launched (``local[...]``); None for other failures.

    A week of tens of millions of events can outgrow the default 2 GiB driver heap: the JVM
    then stops its SparkContext or exits, and what reaches Python is a Py4J error about a
    stopped context or a missing class, not the ``OutOfMemoryError`` above it in the log.
    """
    text = str(exc)
    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc", None)
    status = proc.poll() if proc is not None else None
    heap = os.environ.get("SPARK_DRIVER_MEMORY", "2g")
    advice = (f"give the driver more heap (SPARK_DRIVER_MEMORY, now {heap}; e.g. 4g for 30 "
              "million events on local[2]) or submit the job to a cluster (docs/spark-reports.md)")
    if status is not None:
        why = ("out of memory" if status == JVM_OOM_EXIT
               else f"killed by signal {-status}" if status < 0 else f"exit status {status}")
        return f"the Spark JVM ended during the report ({why}): {advice}"
    if "OutOfMemoryError" in text:
        return f"the Spark JVM ran out of memory: {advice}"
    try:
        stopped = bool(spark.sparkContext._jsc.sc().isStopped())
    except Exception:  # noqa: BLE001 - the JVM cannot answer: it is going away
        stopped = True
    if stopped:
        return ("the SparkContext was stopped during the report (look above for "
                f"java.lang.OutOfMemoryError): {advice}")
    return None


def console_progress(stream: Any) -> str:
    """``spark.ui.showConsoleProgress`` for a session whose console is ``stream``.

    Spark's progress bar redraws one line with carriage returns: useful on a terminal,
    thousands of garbage lines in a log file or the journal. The stage lines of
    :func:`_log_stage` say the same thing once per stage.

    Returns:
        ``"true"`` when ``stream`` is a terminal, else ``"false"``.
    """
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        tty = False
    return "true" if tty else "false"


def main(argv: list[str] | None = None) -> int:
    """Run the capacity report.

    Args:
        argv: arguments after ``capacity`` (default ``sys.argv[1:]``): ``--events DIR
            [--policy PATH] --out DIR [--from TS --to TS] [--grid 1m] [--whatif POLICY]
            [--master URL]``.

    Returns:
        0 on success, 1 on a runtime failure (Spark, I/O), 2 on bad usage or configuration
        (including an unreadable policy or a missing event directory).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per Py4J call
    try:
        opts = parse_options(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as e:  # argparse: usage error (2) or --help (0)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except PolicyRejected as e:  # check's own lines, unchanged
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    except UsageError as e:
        print(f"amqp-policy-proxy report capacity: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("amqp-policy-proxy report capacity: error: pyspark is not installed "
              "(pip install 'amqp-policy-proxy[spark]')", file=sys.stderr)
        return EXIT_FAILURE
    spark = None
    created = False
    shipped = None
    try:
        spark, created = _build_session(opts.master)
        if created:
            shipped = _ship_package(spark)
        t0 = time.monotonic()
        summary = run_report(spark, opts)
        logger.info("capacity report written to %s in %.1f s (%s)", opts.out,
                    time.monotonic() - t0, summary["seconds"])
        return EXIT_OK
    except UsageError as e:
        print(f"amqp-policy-proxy report capacity: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # Spark/Py4J/I-O failures: report, exit 1
        logger.error("capacity report failed: %s", e, exc_info=logger.isEnabledFor(logging.DEBUG))
        hint = jvm_failure_hint(spark, e) if created else None
        if hint is not None:
            logger.error("%s", hint)
        return EXIT_FAILURE
    finally:
        if spark is not None and created:
            try:
                spark.stop()
            except Exception as e:  # noqa: BLE001 - a JVM that died cannot be stopped
                logger.debug("stopping the Spark session failed: %s", e)
        if shipped is not None:
            shutil.rmtree(shipped, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
