"""Real proxy processes for the fleet tests: ``amqp-policy-proxy run`` as a subprocess (the
console script of the venv running the tests), its ports read from its start line, its
metrics and probes read over HTTP; stopped (or killed) by the test."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from proton.utils import BlockingConnection

CLI = Path(sys.executable).with_name("amqp-policy-proxy")


class ProxyProcess:
    """One ``amqp-policy-proxy run`` process.

    Args:
        workdir: where its config file goes.
        upstream: the router's ``(host, port)``.
        policy: the policy file.
        name: a name for the config file (and the default proxy id).
        ledger: the ``[ledger]`` keys as TOML text, or None.
        flags: more command-line flags.
        kind: the upstream's ``kind`` (e.g. ``qdrouterd``), or None for the default.
        admin: the ``[admin] socket`` path, or None (no admin interface).
    """

    def __init__(self, workdir: Path, upstream: tuple[str, int], policy: Path, *, name: str,
                 ledger: str | None = None, flags: list[str] | None = None,
                 kind: str | None = None, admin: str | None = None) -> None:
        text = ('[[listener]]\naddress = "127.0.0.1:0"\n'
                f'[[upstream]]\naddress = "{upstream[0]}:{upstream[1]}"\n'
                + (f'kind = "{kind}"\n' if kind else "") +
                f'[policy]\npath = "{policy}"\n'
                '[metrics]\naddress = "127.0.0.1:0"\n'
                '[timeouts]\nshutdown_grace_seconds = 2\n')
        if admin is not None:
            text += f'[admin]\nsocket = "{admin}"\n'
        if ledger is not None:
            text += "[ledger]\n" + ledger
        self.config = workdir / f"{name}.toml"
        self.config.write_text(text)
        self.args = [str(CLI), "run", "--config", str(self.config), *(flags or [])]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port, self.metrics_port = self._wait_ports()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def log(self) -> str:
        """Everything it logged so far."""
        return "".join(self.lines)

    def problems(self, limit: int = 2000) -> str:
        """What a failing test should show of its log: the WARNING and ERROR lines with the
        tracebacks under them (at most ``limit`` characters), or ``"(none)"``."""
        out: list[str] = []
        keep = False
        for line in self.lines:
            head = re.match(r"\d{4}-\d\d-\d\d [\d:,]+ (\w+) ", line)
            if head is not None:
                keep = head.group(1) in ("WARNING", "ERROR", "CRITICAL")
            if keep:
                out.append(line)
        text = "".join(out)
        return text[:limit] if text else "(none)"

    def _wait_ports(self, timeout: float = 30.0) -> tuple[int, int]:
        deadline = time.monotonic() + timeout
        workers = "--workers" in self.args
        while time.monotonic() < deadline:
            if workers:  # the parent's metrics (the sum of the workers') come first
                text = self.log()
                ready = re.search(r"all \d+ workers listening on ports (\d+)", text)
                served = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/", text)
                if ready and served:
                    return int(ready.group(1)), int(served.group(1))
            for line in [] if workers else list(self.lines):
                m = re.search(r"started: listening on 127\.0\.0\.1:(\d+).*metrics "
                              r"http://127\.0\.0\.1:(\d+)/metrics", line)
                if m:
                    return int(m.group(1)), int(m.group(2))
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.kill()
        raise AssertionError("proxy did not start:\n" + self.log())

    def get(self, path: str) -> tuple[int, str]:
        """``GET path`` on its metrics listener: ``(status, body)``."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}",
                                        timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``."""
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def signal(self, sig: int) -> None:
        """Send ``sig``."""
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (nothing cleaned up, as a crash)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait (SIGKILL on timeout); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def connect(port: int, user: str, *, vhost: str, password: str = "secret",
            timeout: float = 15) -> BlockingConnection:
    """A proton client with SASL PLAIN to ``vhost`` through the proxy on ``port``."""
    return BlockingConnection(f"127.0.0.1:{port}", timeout=timeout, virtual_host=vhost,
                              user=user, password=password, allowed_mechs="PLAIN",
                              allow_insecure_mechs=True)


def connect_many(targets: list[tuple[int, str, str]]) -> tuple[list[BlockingConnection],
                                                                list[str]]:
    """Connect every ``(port, user, vhost)`` at once (one thread each).

    Returns:
        ``(admitted connections, denial texts)``.
    """
    admitted: list[BlockingConnection] = []
    denied: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(len(targets))

    def one(port: int, user: str, vhost: str) -> None:
        start.wait()
        try:
            conn = connect(port, user, vhost=vhost)
        except Exception as exc:  # noqa: BLE001 - a denial is an exception in proton
            with lock:
                denied.append(str(exc))
            return
        with lock:
            admitted.append(conn)

    threads = [threading.Thread(target=one, args=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return admitted, denied


def close_all(conns: list[BlockingConnection]) -> None:
    """Close every connection (errors ignored)."""
    for conn in conns:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


def wait_for(pred, timeout: float = 10.0, interval: float = 0.05) -> bool:  # noqa: ANN001
    """Poll ``pred`` until true or ``timeout``; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())
