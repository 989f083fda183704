"""Shell-side. Background event log writer: bounded queue, one thread, batches.

The event loop calls :meth:`EventLogWriter.submit`, which never blocks and never touches the
disk: it puts the record in a bounded queue, or drops and counts it when the queue is full.
A daemon thread takes records in batches, hands each batch to the sink and flushes it, so under
load batches grow and the cost per record falls. :meth:`EventLogWriter.stop` drains everything
submitted before it and closes the sink.

Failures: :meth:`EventLogWriter.start` fails at once when the sink cannot be written (so the
daemon refuses to start instead of losing every record). A write that fails later costs the
batch (counted as dropped) and one error (``on_error``); the log gets at most one line per
``error_log_interval`` seconds, however many records fail. With ``retention_days`` the thread
also deletes day partitions older than that many days, at start and just after each UTC
midnight (docs/observability.md, "Retention").
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from amqp_policy_proxy.eventlog.sinks import EventSink

__all__ = ["EventLogWriter"]

logger = logging.getLogger(__name__)

_STOP: Final = object()
"""Queue sentinel: everything before it is written, then the thread closes the sink and ends."""

_DAY: Final = 86400.0
PRUNE_AFTER_MIDNIGHT: Final = 60.0
"""Seconds after each UTC midnight at which the daily retention pass runs."""
_MAX_WAIT: Final = 3600.0
"""Longest idle wait of the thread when retention is on, so a wall-clock jump is noticed."""


class EventLogWriter:
    """Writes records to a sink from a background thread; the caller never waits on disk.

    Args:
        sink: where records go (:class:`~.sinks.FileEventSink`, :class:`~.sinks.MemoryEventSink`).
            After :meth:`start` only the writer thread uses it; :meth:`stop` closes it.
        max_queue: records that may wait for the thread (at ~0.5 KB each, 10 000 is ~5 MB).
        on_drop: called with the number of records lost, e.g.
            :meth:`~amqp_policy_proxy.metrics.observer.MetricsObserver.event_log_dropped`.
            Called from :meth:`submit`'s thread (queue full, writer stopped) or from the writer
            thread (sink failure), so it must be thread-safe; its exceptions are logged.
        max_batch: most records handed to the sink in one ``write`` call.
        linger: seconds the thread waits after waking up before it takes a batch, so records
            reach the file at most about this much later (plus the write) and the thread
            wakes at most ~1/linger times a second. The queue must absorb
            ``linger`` × peak record rate (20 ms × 100 000/s = 2 000 records).
        on_error: called with 1 for every failed sink operation (a batch that could not be
            written or flushed, a failed retention pass), from the writer thread, e.g.
            :meth:`~amqp_policy_proxy.metrics.observer.MetricsObserver.event_log_errors`.
            Its exceptions are logged.
        error_log_interval: seconds between two log lines about failures (the first failure
            is logged at once; later ones are summed into the next line).
        retention_days: delete the sink's day partitions dated more than this many days
            before the current UTC day (``dt=`` of today and of the last ``retention_days``
            days stay). None keeps everything.
        clock: monotonic seconds, for the log throttle (tests inject a fake one).
        wall_clock: POSIX seconds, for retention (tests inject a fake one).

    Raises:
        ValueError: ``max_queue`` or ``max_batch`` is below 1, ``linger`` or
            ``error_log_interval`` is negative, or ``retention_days`` is below 1.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        max_queue: int = 10000,
        on_drop: Callable[[int], None] | None = None,
        max_batch: int = 1000,
        linger: float = 0.02,
        on_error: Callable[[int], None] | None = None,
        error_log_interval: float = 60.0,
        retention_days: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if linger < 0:
            raise ValueError(f"linger must be >= 0, got {linger}")
        if error_log_interval < 0:
            raise ValueError(f"error_log_interval must be >= 0, got {error_log_interval}")
        if retention_days is not None and retention_days < 1:
            raise ValueError(f"retention_days must be >= 1, got {retention_days}")
        self._linger = linger
        self._on_error = on_error
        self._error_log_interval = error_log_interval
        self._retention_days = retention_days
        self._clock = clock
        self._wall_clock = wall_clock
        # Writer-thread state: failures since the last log line, and when that line was.
        self._errors = 0
        self._unreported_failures = 0
        self._unreported_lost = 0
        self._last_error_log: float | None = None
        self._last_failure: tuple[str, BaseException] = ("write", OSError())
        self._failing = False
        self._recovery_pending = False
        self._next_prune: float | None = None
        self._sink = sink
        self._on_drop = on_drop
        self._max_batch = max_batch
        # A SimpleQueue (in C: a put costs ~0.1 µs against ~2 µs for queue.Queue's condition
        # variables) bounded here by ``max_queue``: only submit() checks the bound, and it is
        # called from one thread at a time under ``_lock``.
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._max_queue = max_queue
        # Orders submit() against stop(): nothing is enqueued after the stop sentinel.
        self._lock = threading.Lock()
        self._closed = False
        self._stop_queued = False
        self._thread: threading.Thread | None = None
        # _dropped_at_submit is guarded by _lock; the other two belong to the writer thread.
        self._dropped_at_submit = 0
        self._dropped_by_sink = 0
        self._written = 0

    @property
    def dropped(self) -> int:
        """Records lost so far: queue full, submitted after :meth:`stop`, or lost by the sink."""
        return self._dropped_at_submit + self._dropped_by_sink

    @property
    def written(self) -> int:
        """Records the sink accepted so far."""
        return self._written

    @property
    def errors(self) -> int:
        """Failed sink operations so far (writes, flushes, retention passes)."""
        return self._errors

    @property
    def queued(self) -> int:
        """Records waiting for the writer thread (approximate while it runs)."""
        return self._queue.qsize()

    def start(self) -> None:
        """Check the sink (``sink.open()``), then start the writer thread.

        Raises:
            OSError: the sink cannot be written, e.g.
                :class:`~amqp_policy_proxy.eventlog.sinks.EventLogDirectoryError`; no thread
                was started and :meth:`start` may be called again.
            RuntimeError: already started, or already stopped.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("event log writer already stopped")
            if self._thread is not None:
                raise RuntimeError("event log writer already started")
            self._sink.open()
            self._start_thread()

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name="eventlog-writer", daemon=True)
        self._thread.start()

    def submit(self, record: Mapping[str, Any]) -> bool:
        """Queue one record for writing; never blocks (thread-safe).

        Records submitted before :meth:`start` wait in the queue.

        Args:
            record: a record from :func:`~amqp_policy_proxy.eventlog.records.to_record`. It must
                not be mutated afterwards (the writer thread reads it later).

        Returns:
            True if queued; False if dropped (queue full, or the writer is stopping/stopped).
            A drop is counted in :attr:`dropped` and reported to ``on_drop(1)``.
        """
        with self._lock:
            if not self._closed and self._queue.qsize() < self._max_queue:
                self._queue.put(record)
                return True
            self._dropped_at_submit += 1
            n = self._dropped_at_submit
        if n & (n - 1) == 0:  # 1, 2, 4, 8, ...: log without flooding
            logger.warning("event log queue full or writer stopped: %d records dropped so far", n)
        self._report_drop(1)
        return False

    def stop(self, timeout: float = 5.0) -> bool:
        """Write everything submitted before this call, flush and close the sink, join the thread.

        Idempotent, and may be called again after a timeout. Later :meth:`submit` calls return
        False. A writer that was never started is started here so queued records are written.

        Args:
            timeout: seconds to wait in total for the queue to drain and the thread to end.

        Returns:
            True if the thread finished; False if it was still writing when ``timeout`` ran
            out (it keeps going in the background, and closes the sink when done).
        """
        with self._lock:
            self._closed = True
            if self._thread is None:
                self._start_thread()
        thread = self._thread
        assert thread is not None
        deadline = time.monotonic() + timeout
        if not self._stop_queued:
            self._queue.put(_STOP)  # after every record submitted before (none can follow)
            self._stop_queued = True
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            logger.error("event log writer still busy after %.1f s", timeout)
            return False
        return True

    def _report_drop(self, n: int) -> None:
        if self._on_drop is None:
            return
        try:
            self._on_drop(n)
        except Exception:
            logger.exception("event log on_drop callback failed")

    def _report_error(self) -> None:
        self._errors += 1
        if self._on_error is None:
            return
        try:
            self._on_error(1)
        except Exception:
            logger.exception("event log on_error callback failed")

    def _failed(self, what: str, exc: BaseException, lost: int) -> None:
        """Count one failed sink operation (``what``: write, retention) and report it."""
        self._report_error()
        self._failing = True
        self._recovery_pending = False
        self._unreported_failures += 1
        self._unreported_lost += lost
        self._last_failure = (what, exc)
        self._report_failures()

    def _succeeded(self) -> None:
        """A write went through: after failures, report the recovery."""
        if self._failing:
            self._failing = False
            self._recovery_pending = True
            self._report_failures()

    def _report_due_in(self) -> float | None:
        """Seconds until a pending report may be logged; None when nothing is pending."""
        if not (self._unreported_failures or self._recovery_pending):
            return None
        if self._last_error_log is None:
            return 0.0
        return max(0.0, self._last_error_log + self._error_log_interval - self._clock())

    def _report_failures(self, force: bool = False) -> None:
        """Log what is pending in one line, unless a line went out less than
        ``error_log_interval`` seconds ago (and not ``force``): at most one line per interval,
        however many records fail."""
        due = self._report_due_in()
        if due is None or (due > 0 and not force):
            return
        failures, lost = self._unreported_failures, self._unreported_lost
        if self._recovery_pending:
            logger.warning("event log writes succeed again (%d more failures, %d more records "
                           "dropped since the last error line)", failures, lost)
        else:
            what, exc = self._last_failure
            if self._last_error_log is None:
                tail = (f"; further failures are logged at most every "
                        f"{self._error_log_interval:.0f} s")
            else:
                tail = f" ({failures} failures since the last error line)"
            dropped = f"; {lost} records dropped" if lost or what == "write" else ""
            logger.error("event log %s failed: %s%s%s", what, exc, dropped, tail,
                         exc_info=(type(exc), exc, exc.__traceback__)
                         if not isinstance(exc, OSError) else None)
        self._last_error_log = self._clock()
        self._unreported_failures = self._unreported_lost = 0
        self._recovery_pending = False

    def _prune(self) -> None:
        """Delete partitions older than the retention; schedule the next pass."""
        assert self._retention_days is not None
        now = self._wall_clock()
        today = dt.datetime.fromtimestamp(now, dt.UTC).date()
        before = today - dt.timedelta(days=self._retention_days)
        self._next_prune = (now // _DAY + 1) * _DAY + PRUNE_AFTER_MIDNIGHT
        try:
            removed = self._sink.prune(before)
        except Exception as exc:
            self._failed("retention", exc, 0)
            return
        if removed:
            logger.info("event log retention (%d days): removed %d day partitions before %s",
                        self._retention_days, removed, before.isoformat())

    def _wait(self) -> float | None:
        """Seconds the idle thread may block: until the next retention pass or pending
        failure report is due (None: until a record arrives)."""
        waits = [w for w in (self._report_due_in(),) if w is not None]
        if self._next_prune is not None:
            waits.append(min(_MAX_WAIT, max(0.0, self._next_prune - self._wall_clock())))
        return min(waits) if waits else None

    def _run(self) -> None:
        """The writer thread: batch, write, flush; on the sentinel close the sink and end."""
        stopping = False
        backlog = False  # the last batch was full: more is waiting, don't linger
        if self._retention_days is not None:
            self._prune()
        while not stopping:
            if self._next_prune is not None and self._wall_clock() >= self._next_prune:
                self._prune()
            self._report_failures()
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                continue
            if self._linger > 0 and not backlog and item is not _STOP:
                # Let a batch accumulate: fewer wake-ups, writes and flushes, and less
                # competition with the event loop for the GIL than one wake-up per record.
                time.sleep(self._linger)
            batch: list[Mapping[str, Any]] = []
            while True:
                if item is _STOP:
                    stopping = True
                    break
                batch.append(item)  # type: ignore[arg-type]
                if len(batch) >= self._max_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            backlog = len(batch) >= self._max_batch
            if batch:
                self._write(batch)
        try:
            self._sink.close()
        except Exception:
            logger.exception("event log sink failed to close")
        self._report_failures(force=True)

    def _write(self, batch: list[Mapping[str, Any]]) -> None:
        try:
            written = self._sink.write(batch)
            self._sink.flush()
        except Exception as exc:
            # The thread must outlive a full disk or a vanished directory: count and go on.
            written = 0
            self._failed("write", exc, len(batch))
        else:
            self._succeeded()
        self._written += written
        lost = len(batch) - written
        if lost > 0:
            self._dropped_by_sink += lost
            self._report_drop(lost)
