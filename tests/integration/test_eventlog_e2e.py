"""The event log of a running daemon: an unusable directory stops `run` with exit 2, a disk
that fails later is counted and logged once a minute, and retention deletes old partitions."""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proton import ConnectionException

from tests.support import ME
from tests.support.proxy import ProxyThread

from .test_observability_e2e import scrape, value
from .test_proxy_e2e import connect, wait_for

pytestmark = pytest.mark.integration

POLICY = Path(__file__).resolve().parent / "policies" / "e2e.json"
CLI = [sys.executable, "-m", "amqp_policy_proxy"]


def test_run_refuses_an_event_log_directory_it_cannot_create(tmp_path):
    (tmp_path / "file").write_text("x")
    events = tmp_path / "file" / "events"
    result = subprocess.run(
        [*CLI, "run", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
         "--policy", str(POLICY), "--event-log", str(events)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    # the configuration check catches it before anything starts (the writer's own check at
    # start, tests/unit/eventlog, is the second line of defence)
    assert (f"error: command line: --event-log: {events}: cannot be created "
            f"({tmp_path / 'file'} is not a directory)") in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stderr  # nothing was bound


def test_a_disk_that_fails_later_is_counted_and_logged_once(broker_address, tmp_path, caplog):
    """Every write goes to /dev/full (ENOSPC): connections work, each failed batch counts."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    caplog.set_level(logging.INFO, logger="amqp_policy_proxy.eventlog.writer")
    events = tmp_path / "events"
    now = dt.datetime.now(dt.UTC)
    for t in (now, now + dt.timedelta(hours=1)):  # this hour's file, and the next in case
        hour_dir = events / f"dt={t:%Y-%m-%d}" / f"hour={t:%H}"
        hour_dir.mkdir(parents=True, exist_ok=True)
        (hour_dir / f"events-{socket.gethostname()}-{os.getpid()}.jsonl").symlink_to("/dev/full")
    with ProxyThread([broker_address], policy_path=str(POLICY), metrics=True,
                     event_log_dir=str(events)) as proxy:
        for _ in range(3):
            connect(proxy.port, "alice").close()
            with pytest.raises(ConnectionException):
                connect(proxy.port, "mallory")
        assert wait_for(lambda: proxy.daemon.writer.errors >= 1
                        and proxy.daemon.writer.queued == 0)
        samples, _ = scrape(proxy)
        errors = value(samples, "amqp_proxy_event_log_errors_total")
        dropped = value(samples, "amqp_proxy_event_log_dropped_total")
        assert errors >= 1 and dropped >= errors
        assert value(samples, "amqp_proxy_connections_approved_total",
                     vhost="e2e", group="traders") == 3
    failures = [r.getMessage() for r in caplog.records
                if r.name == "amqp_policy_proxy.eventlog.writer" and r.levelname == "ERROR"]
    assert failures[0].startswith("event log write failed: [Errno 28] No space left on device")
    assert len(failures) <= 2  # the first, and the summary at stop: not one per record


def test_retention_days_removes_old_partitions_at_start(tmp_path):
    events = tmp_path / "events"
    today = dt.datetime.now(dt.UTC).date()
    days = [today - dt.timedelta(days=n) for n in range(6)]
    for day in days:
        hour_dir = events / f"dt={day.isoformat()}" / "hour=00"
        hour_dir.mkdir(parents=True)
        (hour_dir / "events-old-1.jsonl").write_text("{}\n")
    config = tmp_path / "config.toml"
    config.write_text(
        '[[listener]]\naddress = "127.0.0.1:0"\n[[upstream]]\naddress = "127.0.0.1:1"\n'
        f'[policy]\npath = "{POLICY}"\n'
        '[event_log]\ndirectory = "events"\nretention_days = 2\n')
    check = subprocess.run([*CLI, "check", "--as-user", ME, "--config", str(config)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    daemon = subprocess.Popen([*CLI, "run", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        kept = [f"dt={d.isoformat()}" for d in days[:3]]  # today and the 2 days before
        while sorted(p.name for p in events.iterdir()) != sorted(kept):
            assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
            assert time.monotonic() < deadline, sorted(p.name for p in events.iterdir())
            time.sleep(0.1)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr
    assert f"removed 3 day partitions before {days[2].isoformat()}" in stderr


@pytest.mark.parametrize("value_text", ["0", "-1", '"7"', "true", "1.5"])
def test_check_rejects_a_bad_retention_days(tmp_path, value_text):
    config = tmp_path / "config.toml"
    config.write_text(
        '[[listener]]\naddress = "127.0.0.1:5672"\n[[upstream]]\naddress = "127.0.0.1:1"\n'
        f'[policy]\npath = "{POLICY}"\n'
        f'[event_log]\ndirectory = "events"\nretention_days = {value_text}\n')
    result = subprocess.run([*CLI, "check", "--as-user", ME, "--config", str(config)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "event_log.retention_days" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
