"""Compaction job: ``amqp-policy-proxy report compact``: closed hours of JSON Lines to Parquet.

Shell layer: parses argv, lists the hours (:mod:`..layout`), converts the closed ones with
Spark in one job, commits them hour by hour, stops the session it built. Never imported by
the daemon (the daemon runs this command in a subprocess, ``[event_log] compact_after``).

Each closed hour's ``*.jsonl`` files become Parquet files in the same ``dt=``/``hour=``
directory, with the explicit schema's types (:func:`.capacity.compacted_schema`: every field
of ``eventlog/schema.py``, plus ``proxy`` from the file name). Lines that are not JSON
objects are kept as all-null rows, so a report counts them as skipped exactly as it does on
the JSON Lines. Commit of one hour, in this order (a crash anywhere leaves a state readers
read correctly and a rerun completes):

1. Spark writes the Parquet of every hour to a temporary directory ``DIR/_compact_tmp/``
   (ignored by readers: its name starts with ``_``);
2. per hour: its Parquet files are renamed into the hour directory (not yet read: no
   marker lists them), then the marker ``_compacted.json`` is written (to a temporary name,
   fsync, renamed over: atomic) listing them and the JSON Lines files they replace: from
   then on readers read the Parquet and ignore those JSON Lines files;
3. the replaced JSON Lines files are deleted.

A rerun deletes the temporary directory and uncommitted Parquet files, finishes step 3 for
committed hours and compacts what is left. Only local directories are supported.

Exit codes: 0 ok, 1 runtime failure, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from amqp_policy_proxy.spark_reports import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger("amqp_policy_proxy.spark_reports.compact")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_GRACE_SECONDS = 900.0
"""An hour is closed once it ended this long ago (the daemon writes a record within seconds
of its ``ts``: its queue holds seconds of records)."""
TMP_DIR = "_compact_tmp"
"""The temporary directory under the event log root (ignored by readers)."""
PAUSE_ENV = "AMQP_POLICY_PROXY_COMPACT_PAUSE"
"""Seconds to sleep after each committed hour: lets a test kill a run half-way."""
#: Parquet options of the compacted hours: read many times, so compressed (snappy) with
#: dictionaries and statistics, unlike the report's scratch work table.
PARQUET_OPTIONS = {"compression": "snappy"}


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``report compact``."""
    p = argparse.ArgumentParser(
        prog="amqp-policy-proxy report compact",
        description="Turn closed hours of the JSON Lines event log into Parquet partitions "
                    "(same dt=/hour= layout; idempotent; safe while the proxy writes the "
                    "current hour). Every report reads Parquet where it exists and JSON "
                    "Lines elsewhere, with the same results.")
    p.add_argument("--events", required=True, metavar="DIR",
                   help="event log root (DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl); "
                        "a local directory")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help="an hour is closed (compacted) once it ended this many seconds ago "
                        f"(default {DEFAULT_GRACE_SECONDS:.0f}; at least 60)")
    p.add_argument("--master", metavar="URL",
                   help="Spark master (default local[*]; under spark-submit, spark-submit's "
                        "--master)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the hours that would be compacted, change nothing")
    return p


def _write_marker(hour_dir: str, parquet: list[str], jsonl: list[str]) -> None:
    """Write the hour's marker atomically (temporary name, fsync, rename over)."""
    tmp = os.path.join(hour_dir, f".{layout.MARKER}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"parquet": sorted(parquet), "jsonl": sorted(jsonl)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(hour_dir, layout.MARKER))
    _fsync_dir(hour_dir)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete_replaced(hour: layout.Hour) -> int:
    """Step 3: delete the JSON Lines files the marker lists; return how many."""
    n = 0
    for name in sorted(hour.compacted_jsonl & set(hour.jsonl)):
        try:
            os.remove(os.path.join(hour.path, name))
            n += 1
        except FileNotFoundError:
            pass
    return n


def _clean(root: str, hours: list[layout.Hour]) -> None:
    """Remove what an interrupted run left uncommitted: the temporary directory, Parquet
    files no marker lists, temporary markers."""
    shutil.rmtree(os.path.join(root, TMP_DIR), ignore_errors=True)
    for h in hours:
        live = set(h.live_parquet)
        for name in h.parquet_files:
            if name not in live:
                os.remove(os.path.join(h.path, name))
        for name in os.listdir(h.path):
            if name.startswith(f".{layout.MARKER}."):
                os.remove(os.path.join(h.path, name))


def closed_hours(hours: list[layout.Hour], now: float, grace: float) -> list[layout.Hour]:
    """The hours to compact: ended at least ``grace`` seconds before ``now`` (POSIX seconds),
    with JSON Lines files no marker lists."""
    cutoff = now - grace
    return [h for h in hours
            if h.start.timestamp() + 3600 <= cutoff and h.live_jsonl]


def compact(spark: SparkSession, root: str, grace: float = DEFAULT_GRACE_SECONDS,
            now: float | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Compact the closed hours of the event log at ``root``.

    Args:
        spark: the session.
        root: event log root (local).
        grace: seconds after its end from which an hour counts as closed.
        now: the current POSIX time (default: the clock).
        dry_run: only list what would be compacted.

    Returns:
        ``hours`` (compacted, as ``dt=.../hour=...``), ``files`` (JSON Lines files
        replaced), ``finished`` (hours of an interrupted run whose JSON Lines files were
        deleted now).

    Raises:
        ValueError: a marker is unreadable.
        Exception: Spark and I/O errors.
    """
    from amqp_policy_proxy.spark_reports.jobs.capacity import compacted_schema

    base = layout.local_path(root)
    hours = layout.list_hours(base)
    todo = closed_hours(hours, time.time() if now is None else now, grace)
    names = [f"dt={h.day.isoformat()}/hour={h.hour:02d}" for h in todo]
    summary: dict[str, Any] = {"hours": names, "files": 0, "finished": 0}
    if dry_run:
        return summary
    _clean(base, hours)
    for h in hours:  # step 3 of hours committed by an interrupted run
        if h.marker and h.compacted_jsonl & set(h.jsonl):
            summary["finished"] += 1
            _delete_replaced(h)
    if not todo:
        return summary
    tmp = os.path.join(base, TMP_DIR, uuid.uuid4().hex)
    files = [os.path.join(h.path, n) for h in todo for n in h.live_jsonl]
    # exactly the files listed now (a file created later stays JSON Lines until the next run)
    picked = _read_listed(spark, base, files).select(*compacted_schema().fieldNames())
    (picked.write.mode("overwrite").options(**PARQUET_OPTIONS).partitionBy("dt", "hour")
     .parquet(tmp))
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    for h, name in zip(todo, names, strict=True):
        part = os.path.join(tmp, f"dt={h.day.isoformat()}", f"hour={h.hour}")
        produced = sorted(n for n in os.listdir(part) if n.endswith(layout.PARQUET_SUFFIX)) \
            if os.path.isdir(part) else []
        moved = []
        tag = uuid.uuid4().hex[:8]
        for i, n in enumerate(produced):
            target = f"compacted-{tag}-{i:03d}{layout.PARQUET_SUFFIX}"
            os.replace(os.path.join(part, n), os.path.join(h.path, target))
            moved.append(target)
        _fsync_dir(h.path)
        _write_marker(h.path, h.live_parquet + moved, sorted(h.compacted_jsonl
                                                             | set(h.live_jsonl)))
        h.marker = layout.read_marker(os.path.join(h.path, layout.MARKER))
        summary["files"] += _delete_replaced(h)
        logger.info("compacted %s: %d JSON Lines files into %d Parquet files", name,
                    len(h.jsonl), len(moved))
        if pause:
            time.sleep(pause)
    shutil.rmtree(os.path.join(base, TMP_DIR), ignore_errors=True)
    return summary


def _read_listed(spark: SparkSession, root: str, files: list[str]) -> Any:
    """The records of exactly ``files`` (JSON Lines), with ``proxy``, ``dt`` and ``hour``."""
    from amqp_policy_proxy.spark_reports.jobs.capacity import _with_proxy
    from amqp_policy_proxy.spark_reports.schemas import event_log_schema

    return _with_proxy(spark.read.schema(event_log_schema()).option("basePath", root)
                       .json(files))


def main(argv: list[str] | None = None) -> int:
    """Run the compaction.

    Args:
        argv: arguments after ``compact`` (default ``sys.argv[1:]``).

    Returns:
        0 on success, 1 on a runtime failure, 2 on bad usage (missing or non-local
        directory, grace below 60 s, unreadable marker).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    prog = "amqp-policy-proxy report compact"
    try:
        a = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if not layout.is_local(a.events):
        print(f"{prog}: error: --events {a.events}: only local directories can be compacted",
              file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isdir(layout.local_path(a.events)):
        print(f"{prog}: error: --events {a.events}: no such directory", file=sys.stderr)
        return EXIT_USAGE
    if not a.grace >= 60:
        print(f"{prog}: error: --grace must be at least 60 seconds: {a.grace}", file=sys.stderr)
        return EXIT_USAGE
    if a.dry_run:
        try:
            hours = layout.list_hours(a.events)
        except ValueError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for h in closed_hours(hours, time.time(), a.grace):
            print(f"dt={h.day.isoformat()}/hour={h.hour:02d}: {len(h.live_jsonl)} files")
        return EXIT_OK
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(f"{prog}: error: pyspark is not installed (pip install 'amqp-policy-proxy[spark]')",
              file=sys.stderr)
        return EXIT_FAILURE
    from amqp_policy_proxy.spark_reports.jobs.capacity import _build_session

    spark = None
    created = False
    try:
        spark, created = _build_session(a.master)
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        t0 = time.monotonic()
        summary = compact(spark, a.events, a.grace)
        logger.info("compacted %d hours (%d JSON Lines files) in %.1f s%s",
                    len(summary["hours"]), summary["files"], time.monotonic() - t0,
                    f"; finished {summary['finished']} interrupted hours"
                    if summary["finished"] else "")
        return EXIT_OK
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        logger.error("compaction failed: %s", exc, exc_info=logger.isEnabledFor(logging.DEBUG))
        return EXIT_FAILURE
    finally:
        if spark is not None and created:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
