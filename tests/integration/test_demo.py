"""``amqp-policy-proxy demo`` as a user runs it (``make demo``): its output (issue 15 point 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).with_name("amqp-policy-proxy")


def test_demo_output_has_no_proton_lines_and_says_the_proxy_stopped(tmp_path) -> None:
    result = subprocess.run([str(CLI), "demo"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    everything = result.stdout + result.stderr
    assert " proton: " not in everything
    assert "demo finished: everything behaved as expected" in result.stdout
    assert "BlockingConnection(" not in result.stdout  # no invitation to a stopped proxy
    assert result.stdout.rstrip().splitlines()[-1] == (
        "the proxy and the embedded broker have stopped; run `amqp-policy-proxy demo "
        "--keep-running` to keep them up and connect your own client.")
    assert len([line for line in result.stderr.splitlines() if " started: " in line]) == 1
    assert list(tmp_path.iterdir()) == []  # its working directory is gone


@pytest.mark.parametrize("inherited", ["default", "ignored"])
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_demo_keep_running_stays_up_until_ctrl_c(inherited: str, stop_signal: int,
                                                 tmp_path) -> None:
    """Ctrl-C (or SIGTERM) stops the demo, also when it was started with SIGINT ignored (a
    background job of a non-interactive shell: Python then raises no KeyboardInterrupt
    unless the demo asks for it)."""
    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen([str(CLI), "demo", "--keep-running"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)},
                            preexec_fn=ignore_sigint if inherited == "ignored" else None)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("press Ctrl-C to stop it"):
                break
        assert any(line.startswith("press Ctrl-C to stop it") for line in lines), "".join(lines)
        time.sleep(0.5)
        assert proc.poll() is None  # still serving
        proc.send_signal(stop_signal)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    text = "".join(lines) + out
    assert "connect your own client" in text
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("the proxy and the embedded broker have stopped; their files (SASL "
                           f"configuration, event log) stay in {tmp_path}/"), last
    (workdir,) = tmp_path.iterdir()  # kept for a look, as the line says
    assert (workdir / "events").is_dir()
    assert " proton: " not in err
