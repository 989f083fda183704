"""The daemon's own log, end to end: ``amqp-policy-proxy run`` as a subprocess, a raw client,
a recording raw router (issue 15 point 5, issue 14 finding 11).

* A link target address (and container-id) holding ``"\\nFAKE DENY ..."`` does not forge a
  line: the text log escapes it, the JSON log is one object per line.
* One start line (version, listeners, upstreams, policy digest and vhost count, event log,
  metrics) and one stop line (reason, connections drained, seconds).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rawpeer import (
    Close,
    Detach,
    Open,
    RawClient,
    RawUpstream,
    attach_sender,
    begin,
    frame,
)

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).with_name("amqp-policy-proxy")
FORGED = "\nFAKE DENY AMQP Open for user 'root', rhost '10.0.0.1', vhost 'test'"
POLICY = [["vhost", {
    "hostname": "test",
    "groups": {"$default": {"users": "*", "remoteHosts": "*", "targets": "public.*",
                            "sources": "public.*"}},
}]]


class Daemon:
    """``amqp-policy-proxy run`` with its stderr collected line by line."""

    def __init__(self, workdir: Path, upstream: int, *flags: str) -> None:
        (workdir / "policy.json").write_text(json.dumps(POLICY))
        self.proc = subprocess.Popen(
            [str(CLI), "run", *flags, "--listen", "127.0.0.1:0",
             "--upstream", f"127.0.0.1:{upstream}", "--policy", str(workdir / "policy.json"),
             "--metrics", "127.0.0.1:0", "--event-log", str(workdir / "events")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = self._wait_port()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def _wait_port(self) -> int:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
                    return int(m.group(1))
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.kill()
        raise AssertionError("daemon did not listen:\n" + "\n".join(self.lines))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(20)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    with RawUpstream() as up:
        yield up


def forge(port: int) -> RawClient:
    """Open a connection whose container-id and denied link target hold a forged line."""
    client = RawClient(port)
    assert client.sasl_plain("alice") == 0
    client.send(b"AMQP\x00\x01\x00\x00", frame(0, Open(container_id="c1" + FORGED,
                                                        hostname="test")))
    client.read_until(lambda i: isinstance(i.perf, Open))
    client.send(begin(0), attach_sender(0, 0, "secret.q" + FORGED, name="l" + FORGED))
    got = client.read_until(lambda i: isinstance(i.perf, Detach))
    assert any(isinstance(i.perf, Detach) and i.condition == "amqp:unauthorized-access"
               for i in got)
    return client


def drain_with(client: RawClient) -> None:
    """Answer the proxy's forced Close as a well-behaved client would."""
    got = client.read_until(lambda i: isinstance(i.perf, Close), timeout=10)
    assert [i.condition for i in got if isinstance(i.perf, Close)] == ["amqp:connection:forced"]
    client.send(frame(0, Close()))
    client.read_until_closed(5)
    client.close()


def test_text_log_escapes_forged_lines_and_has_one_start_and_one_stop_line(
        tmp_path: Path, upstream: RawUpstream) -> None:
    daemon = Daemon(tmp_path, upstream.port, "--log-format", "text")
    try:
        client = forge(daemon.port)
        time.sleep(0.2)
        stopper = threading.Thread(target=lambda: drain_with(client))
        stopper.start()
        assert daemon.stop() == 0
        stopper.join(10)
    finally:
        daemon.kill()
    lines = daemon.lines
    assert not [line for line in lines if line.startswith("FAKE")], lines
    deny = [line for line in lines if "DENY AMQP Attach" in line]
    assert len(deny) == 1, lines
    assert "secret.q\\nFAKE DENY AMQP Open for user 'root'" in deny[0]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) ", deny[0])

    [start] = [line for line in lines if " started: " in line]
    digest = re.search(r"policy ([0-9a-f]{12}) \(1 vhost from (\S+)\)", start)
    assert digest and digest.group(2) == str(tmp_path / "policy.json")
    assert re.search(r"INFO amqp_policy_proxy\.daemon\.app: amqp-policy-proxy \S+ started: "
                     rf"listening on 127\.0\.0\.1:{daemon.port}; upstreams "
                     rf"127\.0\.0\.1:{upstream.port}; policy ", start)
    assert f"event log {tmp_path / 'events'}; metrics http://127.0.0.1:" in start
    [stop] = [line for line in lines if " stopped (" in line]
    assert re.search(r"stopped \(SIGTERM\): 1 connection drained, 0 cut after the grace "
                     r"period, in \d+\.\d s$", stop), stop


def test_json_log_is_one_object_per_line(tmp_path: Path, upstream: RawUpstream) -> None:
    daemon = Daemon(tmp_path, upstream.port, "--log-format", "json", "--log-level", "debug")
    try:
        forge(daemon.port).close()
        time.sleep(0.2)
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    records = [json.loads(line) for line in daemon.lines]  # every line is one JSON object
    deny = [r for r in records if "DENY AMQP Attach" in r["message"]]
    assert len(deny) == 1 and FORGED in deny[0]["message"]
    [start] = [r for r in records if r.get("event") == "start"]
    assert start["listeners"] == [f"127.0.0.1:{daemon.port}"]
    assert start["vhosts"] == 1 and len(start["policy_digest"]) == 12
    [stop] = [r for r in records if r.get("event") == "stop"]
    assert stop["reason"] == "SIGTERM" and stop["drained"] == 0 and stop["cut"] == 0
