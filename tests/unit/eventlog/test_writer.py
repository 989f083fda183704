"""EventLogWriter: never blocks the caller, drops and counts when full, stop drains everything."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionClosed
from amqp_policy_proxy.eventlog.records import to_record
from amqp_policy_proxy.eventlog.sinks import (
    EventLogDirectoryError,
    FileEventSink,
    MemoryEventSink,
)
from amqp_policy_proxy.eventlog.writer import EventLogWriter

WAIT = 5.0  # generous upper bound for thread hand-offs; tests finish far sooner


def rec(i: int, ts: str = "2026-11-21T11:00:00.000Z") -> dict[str, Any]:
    return {"event": "connection_opened", "ts": ts, "conn_id": f"c{i}"}


class BlockingSink(MemoryEventSink):
    """A memory sink whose first write waits until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[int] = []

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        self.entered.set()
        assert self.release.wait(WAIT), "test never released the sink"
        self.batches.append(len(records))
        return super().write(records)


class FailingSink(MemoryEventSink):
    """Raises OSError on the batches whose first record's conn_id is in ``fail``."""

    def __init__(self, fail: set[str]) -> None:
        super().__init__()
        self.fail = fail

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        if records[0]["conn_id"] in self.fail:
            raise OSError(28, "No space left on device")
        return super().write(records)


def test_everything_written_to_files_and_read_back(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=7)
    writer = EventLogWriter(sink, max_queue=100_000)
    writer.start()
    offset = 1795261320.0 - 1000.0  # loop time 1000.0 is 2026-11-21T11:42:00Z
    submitted = 0
    for i in range(5000):
        at = 1000.0 + i  # spans two UTC hours (11:42 .. 13:05)
        for event in (
            ConnectionApproved(conn_id=f"c{i}", at=at, vhost="vh", user="u"),
            ConnectionClosed(
                conn_id=f"c{i}", at=at + 0.5, vhost="vh", user="u", opened_at=at,
                duration_seconds=0.5, bytes_in=1, bytes_out=2, transfers_in=0, transfers_out=0,
                max_sessions=1, max_senders=0, max_receivers=0, close_reason="client_close",
            ),
        ):  # fmt: skip
            record = to_record(event, wall_offset=offset)
            assert record is not None
            assert writer.submit(record)
            submitted += 1
    assert writer.stop() is True
    assert (writer.written, writer.dropped) == (submitted, 0)

    files = sorted(tmp_path.rglob("*.jsonl"))
    assert [str(f.relative_to(tmp_path)) for f in files] == [
        "dt=2026-11-21/hour=11/events-h-7.jsonl",
        "dt=2026-11-21/hour=12/events-h-7.jsonl",
        "dt=2026-11-21/hour=13/events-h-7.jsonl",
    ]
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len(rows) == submitted
    assert [r["conn_id"] for r in rows[:4]] == ["c0", "c0", "c1", "c1"]
    assert [r["event"] for r in rows[:2]] == ["connection_opened", "connection_closed"]
    for f in files:
        hour = f.parent.name.removeprefix("hour=")
        assert all(json.loads(line)["ts"][11:13] == hour for line in f.read_text().splitlines())


def test_full_queue_drops_and_counts_without_blocking():
    sink = BlockingSink()
    drops: list[int] = []
    writer = EventLogWriter(sink, max_queue=5, on_drop=drops.append)
    writer.start()
    assert writer.submit(rec(0))
    assert sink.entered.wait(WAIT)  # the thread holds record 0 inside the blocked sink
    for i in range(1, 6):
        assert writer.submit(rec(i)), i  # fills the queue
    started = time.perf_counter()
    results = [writer.submit(rec(i)) for i in range(6, 106)]
    elapsed = time.perf_counter() - started
    assert results == [False] * 100
    assert elapsed < 0.5  # 100 refused submits: no waiting on the blocked sink
    assert writer.dropped == 100
    assert drops == [1] * 100
    assert writer.queued == 5

    sink.release.set()
    assert writer.stop() is True
    assert [r["conn_id"] for r in sink.records] == [f"c{i}" for i in range(6)]
    assert (writer.written, writer.dropped) == (6, 100)
    assert sink.closed


def test_stop_flushes_and_closes_and_is_idempotent():
    sink = MemoryEventSink()
    writer = EventLogWriter(sink)
    writer.start()
    for i in range(10):
        writer.submit(rec(i))
    assert writer.stop(timeout=WAIT) is True
    assert len(sink.records) == 10
    assert sink.flushes >= 1
    assert sink.closed
    assert writer.stop() is True


def test_submit_after_stop_is_dropped_and_counted():
    drops: list[int] = []
    writer = EventLogWriter(MemoryEventSink(), on_drop=drops.append)
    writer.start()
    writer.stop()
    assert writer.submit(rec(1)) is False
    assert (writer.dropped, drops) == (1, [1])
    with pytest.raises(RuntimeError):
        writer.start()


def test_records_submitted_before_start_are_written_in_batches():
    sink = BlockingSink()
    sink.release.set()
    writer = EventLogWriter(sink, max_batch=10)
    for i in range(25):
        assert writer.submit(rec(i))
    writer.start()
    with pytest.raises(RuntimeError):
        writer.start()
    assert writer.stop() is True
    assert sink.batches == [10, 10, 5]
    assert [r["conn_id"] for r in sink.records] == [f"c{i}" for i in range(25)]


def test_stop_without_start_still_writes_queued_records():
    sink = MemoryEventSink()
    writer = EventLogWriter(sink)
    writer.submit(rec(1))
    assert writer.stop() is True
    assert [r["conn_id"] for r in sink.records] == ["c1"]
    assert sink.closed


def test_stop_times_out_on_a_stuck_sink_then_finishes_in_background():
    sink = BlockingSink()
    writer = EventLogWriter(sink, max_queue=1)
    writer.start()
    writer.submit(rec(0))
    assert sink.entered.wait(WAIT)
    writer.submit(rec(1))  # the queue is now full
    started = time.perf_counter()
    assert writer.stop(timeout=0.2) is False  # cannot even enqueue the stop sentinel
    assert time.perf_counter() - started < 2.0
    sink.release.set()
    # A second stop now gets the sentinel in and joins.
    assert writer.stop(timeout=WAIT) is True
    assert [r["conn_id"] for r in sink.records] == ["c0", "c1"]
    assert sink.closed


def test_sink_failure_counts_the_batch_and_keeps_going():
    sink = FailingSink(fail={"bad"})
    drops: list[int] = []
    writer = EventLogWriter(sink, on_drop=drops.append, max_batch=1)
    writer.submit(rec(0))
    writer.submit({"event": "x", "ts": "t", "conn_id": "bad"})
    writer.submit(rec(2))
    writer.start()
    assert writer.stop() is True
    assert [r["conn_id"] for r in sink.records] == ["c0", "c2"]
    assert (writer.written, writer.dropped, drops) == (2, 1, [1])


def test_unserialisable_records_count_as_dropped():
    drops: list[int] = []
    writer = EventLogWriter(MemoryEventSink(), on_drop=drops.append)
    writer.submit({"ts": "2026-11-21T11:00:00.000Z", "x": object()})
    writer.submit(rec(1))
    writer.start()
    writer.stop()
    assert (writer.written, writer.dropped, drops) == (1, 1, [1])


def test_on_drop_exceptions_do_not_escape():
    def broken(n: int) -> None:
        raise RuntimeError("metrics broken")

    writer = EventLogWriter(MemoryEventSink(), max_queue=1, on_drop=broken)
    assert writer.submit(rec(0))
    assert writer.submit(rec(1)) is False
    assert writer.dropped == 1
    writer.stop()


def test_concurrent_submitters_lose_nothing_uncounted():
    sink = MemoryEventSink()
    writer = EventLogWriter(sink, max_queue=50)
    writer.start()
    accepted = [0] * 4

    def produce(n: int) -> None:
        for i in range(2000):
            accepted[n] += writer.submit(rec(n * 10_000 + i))

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert writer.stop() is True
    assert writer.written == sum(accepted) == len(sink.records)
    assert writer.written + writer.dropped == 8000


@pytest.mark.parametrize("kwargs", [{"max_queue": 0}, {"max_batch": 0},
                                    {"error_log_interval": -1}, {"retention_days": 0}])
def test_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        EventLogWriter(MemoryEventSink(), **kwargs)


def wait_until(predicate, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ start fails early


def test_start_fails_at_once_on_an_unusable_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    writer = EventLogWriter(FileEventSink(tmp_path / "file" / "events", host="h", pid=1))
    with pytest.raises(EventLogDirectoryError, match=r"event log directory .*/file/events "
                                                     r"cannot be created"):
        writer.start()
    assert writer._thread is None  # nothing started
    (tmp_path / "file").unlink()
    writer.start()  # fixed: may be started after all
    assert writer.submit(rec(1))
    assert writer.stop() is True
    assert writer.written == 1


# ------------------------------------------------------------------ failures: one log line a minute


class SwitchSink(MemoryEventSink):
    """Fails every write with ENOSPC while ``broken`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def write(self, records: Sequence[Mapping[str, Any]]) -> int:
        if self.broken:
            raise OSError(28, "No space left on device")
        return super().write(records)


def event_log_lines(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records
            if r.name == "amqp_policy_proxy.eventlog.writer"]


def test_write_failures_log_one_line_per_interval_and_count_each_failure(caplog):
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy.eventlog.writer")
    clock = FakeClock(1000.0)
    sink = SwitchSink()
    errors: list[int] = []
    drops: list[int] = []
    writer = EventLogWriter(sink, linger=0, max_batch=1, on_error=errors.append,
                            on_drop=drops.append, clock=clock)
    writer.start()

    def submit_and_wait(i: int) -> None:
        before = writer.errors + writer.written
        writer.submit(rec(i))
        wait_until(lambda: writer.errors + writer.written > before, f"record {i}")

    for i in range(50):  # 50 failed batches within the same second
        submit_and_wait(i)
    assert writer.errors == 50 and errors == [1] * 50
    assert writer.dropped == 50 and drops == [1] * 50
    assert event_log_lines(caplog) == [
        "event log write failed: [Errno 28] No space left on device; 1 records dropped; "
        "further failures are logged at most every 60 s"]

    clock.now += 59.0
    submit_and_wait(50)
    assert len(event_log_lines(caplog)) == 1
    clock.now += 1.0  # a minute after the first line: the next failure reports the sum
    submit_and_wait(51)
    assert event_log_lines(caplog)[1:] == [
        "event log write failed: [Errno 28] No space left on device; 51 records dropped "
        "(51 failures since the last error line)"]

    sink.broken = False
    clock.now += 10.0
    submit_and_wait(52)  # works again, but the last line is only 10 s old: not yet said
    assert len(event_log_lines(caplog)) == 2
    clock.now += 50.0
    submit_and_wait(53)  # the fake clock cannot wake the idle thread: a record does
    wait_until(lambda: len(event_log_lines(caplog)) == 3, "the recovery line")
    assert event_log_lines(caplog)[2] == (
        "event log writes succeed again (0 more failures, 0 more records dropped since the "
        "last error line)")
    assert writer.stop() is True
    assert (writer.written, writer.errors) == (2, 52)
    assert len(event_log_lines(caplog)) == 3


def test_a_real_disk_full_file_is_counted_and_logged_once(tmp_path, caplog):
    """/dev/full behind the hour's file: every batch fails with ENOSPC; one log line."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy.eventlog.writer")
    sink = FileEventSink(tmp_path, host="h", pid=1)
    target = sink.path_for(rec(0)["ts"])
    target.parent.mkdir(parents=True)
    target.symlink_to("/dev/full")
    errors: list[int] = []
    writer = EventLogWriter(sink, linger=0, max_batch=10, on_error=errors.append)
    writer.start()
    for i in range(100):
        writer.submit(rec(i))
        if i % 10 == 9:
            wait_until(lambda: writer.queued == 0, "the queue to drain")
    assert writer.stop() is True
    assert writer.written == 0 and writer.dropped == 100
    assert writer.errors == len(errors) >= 1
    lines = event_log_lines(caplog)
    assert lines[0].startswith("event log write failed: [Errno 28] No space left on device; ")
    assert len([line for line in lines if "failed" in line]) <= 2  # first + the one at stop


# ------------------------------------------------------------------ retention


def make_days(root: Path, days: list[str]) -> None:
    for day in days:
        d = root / f"dt={day}" / "hour=00"
        d.mkdir(parents=True)
        (d / "events-old-1.jsonl").write_text("{}\n")


def days_left(root: Path) -> list[str]:
    return sorted(p.name.removeprefix("dt=") for p in root.glob("dt=*"))


def test_retention_at_start_and_after_each_utc_midnight(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy.eventlog.writer")
    # 2026-11-21T10:00:00Z
    wall = FakeClock(dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC).timestamp())
    make_days(tmp_path, [f"2026-11-{d:02d}" for d in range(14, 22)])
    writer = EventLogWriter(FileEventSink(tmp_path, host="h", pid=1), retention_days=3,
                            linger=0, wall_clock=wall)
    writer.start()
    wait_until(lambda: len(days_left(tmp_path)) == 4, "the pass at start")
    assert days_left(tmp_path) == ["2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"]
    assert "removed 4 day partitions before 2026-11-18" in "\n".join(event_log_lines(caplog))

    wall.now = dt.datetime(2026, 11, 21, 23, 59, tzinfo=dt.UTC).timestamp()
    writer.submit(rec(1, ts="2026-11-21T23:59:00.000Z"))
    wait_until(lambda: writer.written == 1, "a write before midnight")
    assert len(days_left(tmp_path)) == 4  # not due yet
    wall.now = dt.datetime(2026, 11, 22, 0, 1, 1, tzinfo=dt.UTC).timestamp()
    writer.submit(rec(2, ts="2026-11-22T00:01:01.000Z"))  # wakes the thread
    wait_until(lambda: "2026-11-18" not in days_left(tmp_path), "the pass after midnight")
    assert days_left(tmp_path) == ["2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22"]
    assert writer.stop() is True
    assert writer.errors == 0


def test_retention_never_removes_today_even_with_one_day(tmp_path):
    wall = FakeClock(dt.datetime(2026, 11, 21, 0, 0, 30, tzinfo=dt.UTC).timestamp())
    make_days(tmp_path, ["2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22"])
    writer = EventLogWriter(FileEventSink(tmp_path, host="h", pid=1), retention_days=1,
                            wall_clock=wall)
    writer.start()
    wait_until(lambda: "2026-11-19" not in days_left(tmp_path), "the pass at start")
    assert writer.stop() is True
    # yesterday, today, and a partition from the future (clock skew) stay
    assert days_left(tmp_path) == ["2026-11-20", "2026-11-21", "2026-11-22"]


class PruneFailsSink(MemoryEventSink):
    def prune(self, before: dt.date) -> int:
        raise PermissionError(13, "Permission denied")


def test_a_failed_retention_pass_is_counted_and_writing_goes_on(caplog):
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy.eventlog.writer")
    errors: list[int] = []
    sink = PruneFailsSink()
    writer = EventLogWriter(sink, retention_days=7, on_error=errors.append)
    writer.start()
    writer.submit(rec(1))
    assert writer.stop() is True
    assert errors == [1] and writer.written == 1
    assert event_log_lines(caplog)[0] == (
        "event log retention failed: [Errno 13] Permission denied; further failures are logged at most every 60 s")
