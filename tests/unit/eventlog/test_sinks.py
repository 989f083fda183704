"""Sinks: memory sink for tests; partitioned, appended JSON Lines files for production."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import stat
from pathlib import Path

import pytest

from amqp_policy_proxy.eventlog.sinks import (
    EventLogDirectoryError,
    FileEventSink,
    MemoryEventSink,
    dumps_record,
)


def rec(ts: str, conn_id: str = "c1", **extra: object) -> dict[str, object]:
    return {"schema_version": 1, "event": "connection_opened", "ts": ts, "conn_id": conn_id,
            "vhost": "vh", "group": None, "user": "ü", "remote_host": "10.0.0.1",
            "listener": "0.0.0.0:5672", **extra}  # fmt: skip


def read_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]


def relative_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.jsonl"))


def test_partitioned_path(tmp_path):
    sink = FileEventSink(tmp_path, host="node-1.example", pid=4242)
    assert sink.write([rec("2026-11-21T11:42:00.123Z")]) == 1
    sink.close()
    expected = tmp_path / "dt=2026-11-21" / "hour=11" / "events-node-1.example-4242.jsonl"
    assert relative_files(tmp_path) == [str(expected.relative_to(tmp_path))]
    assert read_lines(expected) == [rec("2026-11-21T11:42:00.123Z")]
    assert sink.path_for("2026-11-21T11:59:59.999Z") == expected


def test_hour_and_day_switch_by_record_ts(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    sink.write([rec("2026-11-21T22:59:59.999Z", "a"), rec("2026-11-21T23:00:00.000Z", "b")])
    assert sink.current_path == tmp_path / "dt=2026-11-21/hour=23/events-h-1.jsonl"
    sink.write([rec("2026-11-21T23:30:00.000Z", "c")])
    sink.write([rec("2026-11-22T00:00:00.001Z", "d")])
    sink.close()
    assert sink.current_path is None
    assert relative_files(tmp_path) == [
        "dt=2026-11-21/hour=22/events-h-1.jsonl",
        "dt=2026-11-21/hour=23/events-h-1.jsonl",
        "dt=2026-11-22/hour=00/events-h-1.jsonl",
    ]
    ids = lambda rel: [r["conn_id"] for r in read_lines(tmp_path / rel)]  # noqa: E731
    assert ids("dt=2026-11-21/hour=22/events-h-1.jsonl") == ["a"]
    assert ids("dt=2026-11-21/hour=23/events-h-1.jsonl") == ["b", "c"]
    assert ids("dt=2026-11-22/hour=00/events-h-1.jsonl") == ["d"]


def test_late_record_goes_to_its_own_hour_and_appends(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    sink.write([rec("2026-11-21T10:59:00.000Z", "a")])
    sink.write([rec("2026-11-21T11:00:01.000Z", "b"), rec("2026-11-21T10:59:59.000Z", "late")])
    sink.close()
    # A second process lifetime with the same pid appends rather than truncating.
    again = FileEventSink(tmp_path, host="h", pid=1)
    again.write([rec("2026-11-21T10:59:59.500Z", "next")])
    again.close()
    ten = tmp_path / "dt=2026-11-21/hour=10/events-h-1.jsonl"
    assert [r["conn_id"] for r in read_lines(ten)] == ["a", "late", "next"]


def test_one_json_object_per_line_ascii(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    sink.write([rec("2026-11-21T11:00:00.000Z", "x", address="caf\u00e9\nq")])
    sink.flush()
    path = sink.current_path
    assert path is not None
    raw = path.read_bytes()
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n")
    assert raw.isascii()
    assert json.loads(raw)["address"] == "caf\u00e9\nq"
    sink.close()


def test_flush_makes_lines_visible_before_close(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    sink.write([rec("2026-11-21T11:00:00.000Z")])
    sink.flush()
    assert sink.current_path is not None
    assert len(read_lines(sink.current_path)) == 1
    sink.close()
    sink.close()  # idempotent
    sink.flush()  # no file open: no-op


def test_bad_records_are_skipped(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    written = sink.write([
        rec("2026-11-21T11:00:00.000Z", "ok1"),
        rec("yesterday", "bad-ts"),
        {"event": "x"},
        rec("2026-11-21T11:00:00.000Z", "nan", duration_seconds=math.nan),
        rec("2026-11-21T11:00:00.000Z", "obj", issues=object()),
        rec("2026-11-21T11:00:00.000Z", "ok2"),
    ])  # fmt: skip
    sink.close()
    assert written == 2
    rows = read_lines(tmp_path / "dt=2026-11-21/hour=11/events-h-1.jsonl")
    assert [r["conn_id"] for r in rows] == ["ok1", "ok2"]


def test_path_for_rejects_bad_ts(tmp_path):
    with pytest.raises(ValueError):
        FileEventSink(tmp_path, host="h", pid=1).path_for("21/11/2026 11:00")


def test_defaults_and_host_sanitising(tmp_path):
    sink = FileEventSink(tmp_path)
    assert sink.pid == os.getpid()
    assert sink.host and "/" not in sink.host
    assert FileEventSink(tmp_path, host="a/b c:d").host == "a_b_c_d"
    assert FileEventSink(tmp_path, host="").host == "unknown"


def test_file_and_directory_modes(tmp_path):
    old = os.umask(0o022)
    try:
        sink = FileEventSink(tmp_path / "events", host="h", pid=1)
        sink.write([rec("2026-11-21T11:00:00.000Z")])
        sink.close()
    finally:
        os.umask(old)
    path = tmp_path / "events/dt=2026-11-21/hour=11/events-h-1.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    for directory in (path.parent, path.parent.parent, tmp_path / "events"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o750, directory


def test_io_error_raises(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sink = FileEventSink(blocker, host="h", pid=1)
    with pytest.raises(OSError):
        sink.write([rec("2026-11-21T11:00:00.000Z")])


def test_memory_sink_round_trips_through_json():
    sink = MemoryEventSink()
    assert sink.write([rec("2026-11-21T11:00:00.000Z", issues=("a", "b"))]) == 1
    assert sink.write([rec("2026-11-21T11:00:00.000Z", size=math.inf)]) == 0
    sink.flush()
    sink.close()
    assert sink.records == [rec("2026-11-21T11:00:00.000Z", issues=["a", "b"])]
    assert (sink.flushes, sink.closed) == (1, True)


def test_dumps_record_is_compact():
    assert dumps_record({"a": 1, "b": None, "c": "é"}) == '{"a":1,"b":null,"c":"\\u00e9"}'
    with pytest.raises(ValueError):
        dumps_record({"x": math.nan})


# ------------------------------------------------------------------ open: fail early, say where


def test_open_creates_a_missing_directory_and_leaves_no_probe(tmp_path):
    root = tmp_path / "var" / "events"
    FileEventSink(root, host="h", pid=1).open()
    assert root.is_dir()
    assert list(root.iterdir()) == []
    assert stat.S_IMODE(root.parent.stat().st_mode) == 0o750 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_open_refuses_a_directory_below_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    root = tmp_path / "file" / "events"
    with pytest.raises(EventLogDirectoryError) as caught:
        FileEventSink(root, host="h", pid=1).open()
    assert str(caught.value) == (f"event log directory {root} cannot be created: "
                                 f"[Errno 20] Not a directory: {tmp_path / 'file'}")
    assert caught.value.directory == root


def test_open_refuses_a_file(tmp_path):
    (tmp_path / "events").write_text("x")
    with pytest.raises(EventLogDirectoryError) as caught:
        FileEventSink(tmp_path / "events", host="h", pid=1).open()
    assert str(caught.value) == f"event log directory {tmp_path / 'events'} is not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_open_refuses_a_read_only_directory(tmp_path):
    root = tmp_path / "events"
    root.mkdir(mode=0o555)
    try:
        with pytest.raises(EventLogDirectoryError) as caught:
            FileEventSink(root, host="h", pid=1).open()
    finally:
        root.chmod(0o755)
    assert str(caught.value) == (f"event log directory {root} is not writable: "
                                 "[Errno 13] Permission denied")


def test_a_failed_flush_drops_the_buffered_lines_and_the_next_write_reopens(tmp_path):
    """A real ENOSPC: the hour's file is a symlink to /dev/full, the next hour is a file."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    sink = FileEventSink(tmp_path, host="h", pid=1)
    full = sink.path_for("2026-11-21T11:00:00.000Z")
    full.parent.mkdir(parents=True)
    full.symlink_to("/dev/full")
    assert sink.write([rec("2026-11-21T11:00:00.000Z")]) == 1  # buffered
    with pytest.raises(OSError) as caught:
        sink.flush()
    assert caught.value.errno == 28  # ENOSPC
    assert sink.current_path is None  # the file was dropped with its unwritten line
    sink.flush()  # nothing left to retry
    assert sink.write([rec("2026-11-21T12:00:00.000Z")]) == 1
    sink.close()
    assert read_lines(sink.path_for("2026-11-21T12:00:00.000Z")) == [
        rec("2026-11-21T12:00:00.000Z")]


# ------------------------------------------------------------------ retention


def day_partitions(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_prune_removes_old_day_partitions_only(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    for day in ("2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"):
        sink.write([rec(f"{day}T23:00:00.000Z"), rec(f"{day}T01:00:00.000Z")])
    sink.close()
    (tmp_path / "dt=2026-11-02.tmp").mkdir()  # not a partition name: left alone
    (tmp_path / "dt=2026-13-01").mkdir()  # not a date: left alone
    (tmp_path / "README").write_text("kept")
    (tmp_path / "dt=2026-11-01").write_text("a file, not a partition")
    assert sink.prune(dt.date(2026, 11, 20)) == 2
    assert day_partitions(tmp_path) == [
        "README", "dt=2026-11-01", "dt=2026-11-02.tmp", "dt=2026-11-20", "dt=2026-11-21",
        "dt=2026-13-01"]
    assert relative_files(tmp_path) == [
        "dt=2026-11-20/hour=01/events-h-1.jsonl", "dt=2026-11-20/hour=23/events-h-1.jsonl",
        "dt=2026-11-21/hour=01/events-h-1.jsonl", "dt=2026-11-21/hour=23/events-h-1.jsonl"]


def test_prune_never_removes_the_partition_being_written(tmp_path):
    sink = FileEventSink(tmp_path, host="h", pid=1)
    sink.write([rec("2026-11-01T10:00:00.000Z")])  # a late record: its file is open
    assert sink.prune(dt.date(2026, 11, 21)) == 0
    sink.write([rec("2026-11-01T10:00:01.000Z")])
    sink.close()
    assert len(read_lines(sink.path_for("2026-11-01T10:00:00.000Z"))) == 2
    assert sink.prune(dt.date(2026, 11, 21)) == 1  # closed now: old enough to go
    assert day_partitions(tmp_path) == []


def test_memory_sink_open_and_prune():
    sink = MemoryEventSink()
    sink.open()
    sink.write([rec("2026-11-19T10:00:00.000Z"), rec("2026-11-20T10:00:00.000Z")])
    assert sink.prune(dt.date(2026, 11, 20)) == 1
    assert [r["ts"] for r in sink.records] == ["2026-11-20T10:00:00.000Z"]
    assert sink.opened


def test_every_new_file_starts_with_the_header(tmp_path):
    """Schema 4: the sink writes its header (the daemon's proxy_info record) as the first line
    of every file it creates, with the ts of the file's first record; not when it appends to
    a file that already has lines; header lines are not counted as records written."""
    from amqp_policy_proxy.eventlog.records import proxy_info_record

    def header(ts: str) -> dict[str, object]:
        return proxy_info_record(ts, ledger="fleet", fleet="redis://r:6379/0", proxy_id="p1")

    sink = FileEventSink(tmp_path, host="h", pid=1, header=header)
    assert sink.write([rec("2026-11-21T10:59:59.900Z", "c1"), rec("2026-11-21T11:00:00.100Z", "c2"),
                       rec("2026-11-21T11:00:01.000Z", "c3")]) == 3
    assert sink.write([rec("2026-11-21T11:00:02.000Z", "c4")]) == 1
    sink.close()
    ten = read_lines(tmp_path / "dt=2026-11-21" / "hour=10" / "events-h-1.jsonl")
    eleven = read_lines(tmp_path / "dt=2026-11-21" / "hour=11" / "events-h-1.jsonl")
    assert [(r["event"], r["ts"], r.get("fleet")) for r in ten] == [
        ("proxy_info", "2026-11-21T10:59:59.900Z", "redis://r:6379/0"),
        ("connection_opened", "2026-11-21T10:59:59.900Z", None)]
    assert [r["event"] for r in eleven] == ["proxy_info"] + ["connection_opened"] * 3
    assert eleven[0]["ts"] == "2026-11-21T11:00:00.100Z"
    # a restarted sink appending to the same (non-empty) file writes no second header
    again = FileEventSink(tmp_path, host="h", pid=1, header=header)
    assert again.write([rec("2026-11-21T11:30:00.000Z", "c5")]) == 1
    again.close()
    eleven = read_lines(tmp_path / "dt=2026-11-21" / "hour=11" / "events-h-1.jsonl")
    assert [r["event"] for r in eleven].count("proxy_info") == 1 and len(eleven) == 5
