"""Shell-side. Where event log records go: memory (tests) or partitioned JSON Lines files.

The writer thread (:mod:`amqp_policy_proxy.eventlog.writer`) calls a sink; the event loop never
does. A test sink and the production sink have the same interface (as aioquic's ``QuicLogger``
and ``QuicFileLogger``), so tests exercise the writer exactly as the daemon runs it.

File layout (docs/observability.md, "Files and partitioning"):
``DIR/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl``, UTC, partitioned by each record's own
``ts`` (not the time of writing), appended to, one JSON object per line. One process writes its
own files only (pid in the name), so lines never interleave. Retention removes whole
``dt=YYYY-MM-DD`` directories (:meth:`FileEventSink.prune`).
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from amqp_policy_proxy.eventlog import schema

__all__ = [
    "EventLogDirectoryError",
    "EventSink",
    "FileEventSink",
    "MemoryEventSink",
    "dumps_record",
]

logger = logging.getLogger(__name__)

_TS = re.compile(r"(\d{4}-\d{2}-\d{2})T(\d{2}):")
_UNSAFE_HOST_CHARS = re.compile(r"[^A-Za-z0-9._-]")
# One encoder for every record: json.dumps with non-default options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_FILE_MODE = 0o640  # records name users and client addresses: not world-readable
_DIR_MODE = 0o750
_DAY_PARTITION = re.compile(r"dt=(\d{4}-\d{2}-\d{2})")


class EventLogDirectoryError(OSError):
    """The event log directory cannot be created or is not writable.

    Raised by :meth:`FileEventSink.open` (so by
    :meth:`~amqp_policy_proxy.eventlog.writer.EventLogWriter.start`) before anything runs.
    ``str()`` names the directory and the reason, e.g. ``event log directory
    /var/log/amqp-policy-proxy/events is not writable: [Errno 13] Permission denied``.

    Attributes:
        directory: the configured directory.
    """

    def __init__(self, directory: Path, reason: str, errno: int | None = None) -> None:
        super().__init__(errno, f"event log directory {directory} {reason}")
        self.directory = directory

    def __str__(self) -> str:
        """The message alone (OSError would prefix ``[Errno N]``)."""
        return str(self.strerror)


def dumps_record(record: Mapping[str, Any]) -> str:
    """Serialise one record as one compact JSON line (without the newline).

    Args:
        record: a record from :func:`~amqp_policy_proxy.eventlog.records.to_record`.

    Returns:
        ASCII-only JSON (non-ASCII escaped, so no encoding error is possible).

    Raises:
        TypeError: a value is not JSON-serialisable.
        ValueError: a float is NaN or infinite (not valid JSON).
    """
    return _ENCODER.encode(record)


class EventSink(Protocol):
    """What :class:`~amqp_policy_proxy.eventlog.writer.EventLogWriter` needs from a sink.

    Calls come from one thread at a time (the writer's), except :meth:`open`, which
    :meth:`~amqp_policy_proxy.eventlog.writer.EventLogWriter.start` calls before the thread runs.
    """

    def open(self) -> None:
        """Check that records can be written (create what is missing); raise OSError if not."""
        ...

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Append a batch of records in order; return how many were written.

        Records that cannot be serialised are skipped (and not counted); I/O failures raise.
        """
        ...

    def flush(self) -> None:
        """Push buffered records to the operating system."""
        ...

    def close(self) -> None:
        """Flush and release resources."""
        ...

    def prune(self, before: dt.date) -> int:
        """Delete the records of UTC days before ``before``; return how many days went."""
        ...


class MemoryEventSink:
    """Keeps records in a list (tests). Records go through JSON like a file sink's would.

    Attributes:
        records: every record written, as parsed back from its JSON line.
        flushes: number of :meth:`flush` calls.
        closed: whether :meth:`close` was called.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.flushes = 0
        self.closed = False
        self.opened = False

    def open(self) -> None:
        """Mark the sink opened (memory is always writable)."""
        self.opened = True

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Append ``records``; see :meth:`EventSink.write`.

        Args:
            records: schema records in order.

        Returns:
            The number of records kept (unserialisable ones are skipped).
        """
        written = 0
        for record in records:
            try:
                line = dumps_record(record)
            except (TypeError, ValueError):
                logger.error("event log record not serialisable, dropped: %r", record)
                continue
            self.records.append(json.loads(line))
            written += 1
        return written

    def flush(self) -> None:
        """Count the flush (nothing is buffered)."""
        self.flushes += 1

    def close(self) -> None:
        """Mark the sink closed; records stay readable."""
        self.closed = True

    def prune(self, before: dt.date) -> int:
        """Forget the records whose ``ts`` is on a UTC day before ``before``.

        Returns:
            The number of distinct days removed.
        """
        cutoff = before.isoformat()
        days = {r["ts"][:10] for r in self.records if str(r.get("ts", ""))[:10] < cutoff}
        self.records = [r for r in self.records if str(r.get("ts", ""))[:10] >= cutoff]
        return len(days)


def _safe_host(host: str) -> str:
    """Make a host name safe for a file name: keep ``[A-Za-z0-9._-]``, replace the rest."""
    return _UNSAFE_HOST_CHARS.sub("_", host) or "unknown"


def _reason(exc: OSError, directory: Path) -> str:
    """``[Errno 13] Permission denied`` from an OSError; the file name only when it is not
    ``directory`` itself (e.g. the parent that is a file)."""
    if exc.errno is None or not exc.strerror:
        return str(exc)
    where = f": {exc.filename}" if exc.filename and str(exc.filename) != str(directory) else ""
    return f"[Errno {exc.errno}] {exc.strerror}{where}"


def _make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each with :data:`_DIR_MODE` (less the umask).

    ``Path.mkdir(parents=True)`` gives intermediate directories the default mode instead.
    """
    missing = []
    while not path.is_dir():
        if path.exists():  # a file where a directory should be
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=_DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise


class FileEventSink:
    """Appends records to hourly JSON Lines files, partitioned by each record's ``ts``.

    One file is open at a time; a record whose ``ts`` falls in another UTC hour (or day) closes
    it and opens (appending) that hour's file, creating ``dt=``/``hour=`` directories as needed.
    Files are created with mode 0640 and directories 0750 (less the umask): records name users
    and client addresses. After a failed write or flush the file is closed and its unwritten
    lines are discarded (they are counted as lost by the writer), so the next batch starts
    from a fresh ``open`` instead of retrying stale buffered data.

    Args:
        directory: the event log root (``[event_log] directory``); created if missing.
        host: host name for the file name; default :func:`socket.gethostname`. Characters
            outside ``[A-Za-z0-9._-]`` become ``_``.
        pid: process id for the file name; default :func:`os.getpid`.
        header: called with the ``ts`` of a file's first record when this sink creates the
            file (or finds it empty), returning the record written before it: the daemon's
            ``proxy_info`` record (schema 4, :func:`~.records.proxy_info_record`), so every
            file says how its writer enforces limits. Header lines are not counted as
            written records. None: no header.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        host: str | None = None,
        pid: int | None = None,
        header: Callable[[str], Mapping[str, Any]] | None = None,
    ) -> None:
        self.directory = Path(directory)
        """The event log root."""
        self.host = _safe_host(socket.gethostname() if host is None else host)
        """The host part of the file names."""
        self.pid = os.getpid() if pid is None else int(pid)
        """The pid part of the file names."""
        self._file: IO[str] | None = None
        self._partition: tuple[str, str] | None = None
        self._header = header

    def path_for(self, ts: str) -> Path:
        """Return the file a record with this ``ts`` goes to.

        Args:
            ts: the record's ``ts`` (``YYYY-MM-DDTHH:MM:SS.mmmZ``).

        Returns:
            ``directory/dt=YYYY-MM-DD/hour=HH/events-<host>-<pid>.jsonl``.

        Raises:
            ValueError: ``ts`` does not start with an RFC 3339 date and hour.
        """
        dt, hour = self._partition_of(ts)
        return self.directory / schema.partition_path(dt, int(hour), self.host, self.pid)

    def open(self) -> None:
        """Create the event log root if missing and check that files can be created in it.

        The check creates and removes an empty probe file (``.write-test-<pid>``): permission
        bits alone say nothing for root, nor about read-only mounts.

        Raises:
            EventLogDirectoryError: the root (or a parent) cannot be created, is not a
                directory, or does not accept new files; the message names the directory.
        """
        directory = self.directory
        if directory.exists() and not directory.is_dir():
            raise EventLogDirectoryError(directory, "is not a directory")
        try:
            _make_dirs(directory)
        except OSError as exc:
            raise EventLogDirectoryError(directory, f"cannot be created: {_reason(exc, directory)}",
                                         exc.errno) from exc
        probe = directory / f".write-test-{self.pid}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        except FileExistsError:  # left by a crashed process with the same pid: reuse it
            fd = None
        except OSError as exc:
            raise EventLogDirectoryError(directory, f"is not writable: {_reason(exc, directory)}",
                                         exc.errno) from exc
        if fd is not None:
            os.close(fd)
        try:
            probe.unlink()
        except OSError as exc:
            raise EventLogDirectoryError(directory, f"is not writable: {_reason(exc, directory)}",
                                         exc.errno) from exc

    def prune(self, before: dt.date) -> int:
        """Delete the day partitions ``dt=YYYY-MM-DD`` dated before ``before`` (UTC).

        Only directories directly under the root whose name is exactly ``dt=`` and a valid
        date are considered; anything else (other files, malformed names) is left alone. The
        partition of the file currently open is never deleted, whatever its date.

        Args:
            before: the first day to keep.

        Returns:
            The number of day partitions deleted.

        Raises:
            OSError: the root cannot be listed, or a partition cannot be deleted (partitions
                deleted before the failure stay deleted).
        """
        keep = self._partition[0] if self._partition is not None else None
        removed = 0
        with os.scandir(self.directory) as entries:
            names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        for name in names:
            match = _DAY_PARTITION.fullmatch(name)
            if match is None or match.group(1) == keep:
                continue
            try:
                day = dt.date.fromisoformat(match.group(1))
            except ValueError:
                continue
            if day < before:
                shutil.rmtree(self.directory / name)
                removed += 1
                logger.info("event log retention: removed %s", self.directory / name)
        return removed

    @property
    def current_path(self) -> Path | None:
        """The file currently open for appending, or None."""
        if self._partition is None:
            return None
        dt, hour = self._partition
        return self.directory / schema.partition_path(dt, int(hour), self.host, self.pid)

    @staticmethod
    def _partition_of(ts: object) -> tuple[str, str]:
        match = _TS.match(ts) if isinstance(ts, str) else None
        if match is None:
            raise ValueError(f"record ts is not RFC 3339: {ts!r}")
        return match.group(1), match.group(2)

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Append ``records`` to their hourly files, in order; see :meth:`EventSink.write`.

        A record without a valid ``ts`` or that cannot be serialised is skipped and logged.

        Args:
            records: schema records.

        Returns:
            The number of records written.

        Raises:
            OSError: a directory or file cannot be created or written.
        """
        written = 0
        lines: list[str] = []
        partition: tuple[str, str] | None = None
        first_ts = ""
        for record in records:
            try:
                record_partition = self._partition_of(record.get("ts"))
                line = dumps_record(record)
            except (TypeError, ValueError):
                logger.error("event log record rejected (bad ts or not serialisable): %r", record)
                continue
            if partition is not None and record_partition != partition:
                written += self._append(partition, lines, first_ts)
                lines = []
            if not lines:
                first_ts = record["ts"]
            partition = record_partition
            lines.append(line)
        if partition is not None:
            written += self._append(partition, lines, first_ts)
        return written

    def _append(self, partition: tuple[str, str], lines: list[str], first_ts: str) -> int:
        try:
            if partition != self._partition or self._file is None:
                self._switch(partition)
            assert self._file is not None
            if self._header is not None and self._file.tell() == 0:
                self._file.write(dumps_record(self._header(first_ts)) + "\n")
            self._file.write("\n".join(lines) + "\n")
        except OSError:
            self._discard_file()
            raise
        return len(lines)

    def _switch(self, partition: tuple[str, str]) -> None:
        self._close_file()
        dt, hour = partition
        path = self.directory / schema.partition_path(dt, int(hour), self.host, self.pid)
        _make_dirs(path.parent)
        # Kept open across batches until the hour changes.
        self._file = open(
            path,
            "a",
            encoding="ascii",
            newline="\n",
            opener=lambda p, flags: os.open(p, flags, _FILE_MODE),
        )
        self._partition = partition
        logger.debug("event log now appending to %s", path)

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None
                self._partition = None

    def _discard_file(self) -> None:
        """Close the open file after a failure, dropping lines it could not write."""
        try:
            self._close_file()
        except OSError:
            pass  # close() released the descriptor; the lost lines are already counted

    def flush(self) -> None:
        """Push buffered lines of the open file to the operating system (no fsync).

        Raises:
            OSError: the write-back failed (e.g. disk full).
        """
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                self._discard_file()
                raise

    def close(self) -> None:
        """Flush and close the open file. A later :meth:`write` opens it again.

        Raises:
            OSError: the final write-back failed.
        """
        self._close_file()
