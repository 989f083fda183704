"""Shell-side. Background event log writer: bounded queue, one thread, batches (ARCHITECTURE §4.4).

The event loop calls :meth:`EventLogWriter.submit`, which never blocks and never touches the
disk: it puts the record in a bounded queue, or drops and counts it when the queue is full.
A daemon thread takes records in batches, hands each batch to the sink and flushes it, so under
load batches grow and the cost per record falls. :meth:`EventLogWriter.stop` drains everything
submitted before it and closes the sink.
"""

from __future__ import annotations

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

    Raises:
        ValueError: ``max_queue`` or ``max_batch`` is below 1, or ``linger`` is negative.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        max_queue: int = 10000,
        on_drop: Callable[[int], None] | None = None,
        max_batch: int = 1000,
        linger: float = 0.02,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if linger < 0:
            raise ValueError(f"linger must be >= 0, got {linger}")
        self._linger = linger
        self._sink = sink
        self._on_drop = on_drop
        self._max_batch = max_batch
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
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
    def queued(self) -> int:
        """Records waiting for the writer thread (approximate while it runs)."""
        return self._queue.qsize()

    def start(self) -> None:
        """Start the writer thread.

        Raises:
            RuntimeError: already started, or already stopped.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("event log writer already stopped")
            if self._thread is not None:
                raise RuntimeError("event log writer already started")
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
            if not self._closed:
                try:
                    self._queue.put_nowait(record)
                    return True
                except queue.Full:
                    pass
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
            try:
                # Blocks only while the queue is full, i.e. while the thread is draining it.
                self._queue.put(_STOP, timeout=max(0.0, timeout))
            except queue.Full:
                logger.error("event log writer did not drain within %.1f s", timeout)
                return False
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

    def _run(self) -> None:
        """The writer thread: batch, write, flush; on the sentinel close the sink and end."""
        stopping = False
        backlog = False  # the last batch was full: more is waiting, don't linger
        while not stopping:
            item = self._queue.get()
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

    def _write(self, batch: list[Mapping[str, Any]]) -> None:
        try:
            written = self._sink.write(batch)
            self._sink.flush()
        except Exception:
            # The thread must outlive a full disk or a vanished directory: count and go on.
            logger.exception("event log sink failed; %d records dropped", len(batch))
            written = 0
        self._written += written
        lost = len(batch) - written
        if lost > 0:
            self._dropped_by_sink += lost
            self._report_drop(lost)
