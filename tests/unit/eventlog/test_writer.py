"""EventLogWriter: never blocks the caller, drops and counts when full, stop drains everything."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionClosed
from amqp_policy_proxy.eventlog.records import to_record
from amqp_policy_proxy.eventlog.sinks import FileEventSink, MemoryEventSink
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


@pytest.mark.parametrize("kwargs", [{"max_queue": 0}, {"max_batch": 0}])
def test_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        EventLogWriter(MemoryEventSink(), **kwargs)
