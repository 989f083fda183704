"""The event log's files on disk: JSON Lines hours and compacted (Parquet) hours. No Spark.

Layer: the capacity reports (``report capacity``, ``report compact``), never imported by the
daemon. Imports only the standard library and :mod:`amqp_policy_proxy.eventlog.schema`.

The daemon writes ``DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl``.
``report compact`` (:mod:`.jobs.compact`) turns closed hours into Parquet files in the same
hour directory and records what it did in the hour's marker, :data:`MARKER`
(``_compacted.json``: the Parquet files that hold the hour, and the JSON Lines files they
replace). The marker decides what an hour holds, so a reader never sees a record twice or
misses one, whatever moment a compaction was interrupted at:

- no marker: the hour is its ``*.jsonl`` files (Parquet files there are the leftovers of an
  interrupted compaction, not yet committed: ignored);
- a marker: the hour is the Parquet files it lists plus the ``*.jsonl`` files it does not
  list (a file the proxy created after the compaction); listed ``*.jsonl`` files still
  present are about to be deleted: ignored.

Spark ignores files and directories whose names start with ``_`` or ``.``, so neither the
marker nor the compaction's temporary directory is ever read as data.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MARKER = "_compacted.json"
"""The marker of a compacted hour (JSON: ``parquet``, ``jsonl``: lists of file names)."""
JSONL_SUFFIX = ".jsonl"
PARQUET_SUFFIX = ".parquet"
_DAY = re.compile(r"dt=(\d{4}-\d{2}-\d{2})")
_HOUR = re.compile(r"hour=(\d{1,2})")


@dataclass
class Hour:
    """One ``dt=``/``hour=`` directory and what it holds."""

    path: str
    """The directory (local path)."""
    day: dt.date
    """Its UTC day."""
    hour: int
    """Its UTC hour, 0..23."""
    jsonl: list[str] = field(default_factory=list)
    """Names of the ``*.jsonl`` files in it."""
    parquet_files: list[str] = field(default_factory=list)
    """Names of the ``*.parquet`` files in it (committed or not)."""
    marker: dict[str, list[str]] | None = None
    """The parsed marker, or None (not compacted)."""

    @property
    def start(self) -> dt.datetime:
        """The hour's first instant (UTC)."""
        return dt.datetime(self.day.year, self.day.month, self.day.day, self.hour,
                           tzinfo=dt.UTC)

    @property
    def compacted_jsonl(self) -> set[str]:
        """The JSON Lines files the marker says are in Parquet now."""
        return set(self.marker["jsonl"]) if self.marker else set()

    @property
    def live_jsonl(self) -> list[str]:
        """The ``*.jsonl`` files readers read: all of them without a marker, else those the
        marker does not list."""
        done = self.compacted_jsonl
        return [n for n in self.jsonl if n not in done]

    @property
    def live_parquet(self) -> list[str]:
        """The Parquet files readers read: those the marker lists (none without one)."""
        if not self.marker:
            return []
        return [n for n in self.marker["parquet"] if n in self.parquet_files]


def is_local(root: str) -> bool:
    """Whether ``root`` is a local path (no scheme, or ``file:``), which this module lists."""
    scheme = urlsplit(root).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter


def local_path(root: str) -> str:
    """Return the local path of ``root`` (``file:///x`` -> ``/x``)."""
    return urlsplit(root).path if root.startswith("file:") else root


def read_marker(path: str) -> dict[str, list[str]] | None:
    """Read an hour's marker; None when it is absent.

    Raises:
        ValueError: the marker exists but is not a JSON object with ``parquet`` and
            ``jsonl`` lists (the file ``path`` is named).
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable compaction marker: {exc}") from None
    if not (isinstance(data, dict) and isinstance(data.get("parquet"), list)
            and isinstance(data.get("jsonl"), list)):
        raise ValueError(f"{path}: compaction marker without 'parquet' and 'jsonl' lists")
    return {"parquet": [str(n) for n in data["parquet"]],
            "jsonl": [str(n) for n in data["jsonl"]]}


def list_hours(root: str) -> list[Hour]:
    """List the ``dt=YYYY-MM-DD/hour=HH`` directories of a local event log, oldest first.

    Args:
        root: the event log root (a local path or ``file:`` URL).

    Returns:
        One :class:`Hour` per hour directory with its files and marker; empty when ``root``
        has no ``dt=`` directories (a flat directory or a single file).

    Raises:
        ValueError: a marker is unreadable.
    """
    base = local_path(root)
    if not os.path.isdir(base):
        return []
    hours = []
    with os.scandir(base) as days:
        day_dirs = sorted(e.path for e in days if e.is_dir() and _DAY.fullmatch(e.name))
    for day_dir in day_dirs:
        match = _DAY.fullmatch(os.path.basename(day_dir))
        assert match is not None
        try:
            day = dt.date.fromisoformat(match.group(1))
        except ValueError:
            continue
        with os.scandir(day_dir) as entries:
            hour_dirs = [e for e in entries if e.is_dir() and _HOUR.fullmatch(e.name)]
        for entry in hour_dirs:
            h = int(entry.name[5:])
            if h > 23:
                continue
            with os.scandir(entry.path) as files:
                names = sorted(f.name for f in files if f.is_file())
            hours.append(Hour(
                path=entry.path, day=day, hour=h,
                jsonl=[n for n in names if n.endswith(JSONL_SUFFIX)],
                parquet_files=[n for n in names if n.endswith(PARQUET_SUFFIX)],
                marker=read_marker(os.path.join(entry.path, MARKER)) if MARKER in names
                else None))
    hours.sort(key=lambda x: (x.day, x.hour))
    return hours


def in_range(hour: Hour, first: tuple[dt.date, int] | None,
             last: tuple[dt.date, int] | None) -> bool:
    """Whether ``hour`` is within ``[first, last]`` (each a (day, hour); None: unbounded)."""
    key = (hour.day, hour.hour)
    return (first is None or key >= first) and (last is None or key <= last)
