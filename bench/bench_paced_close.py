#!/usr/bin/env python3
"""A paced close: N connections closed through the admin socket at R per second
(``connections close --vhost V --rate R``), measured from the clients.

Bench tooling, not part of the package. The bench peer (``bench/peer.py``) as the
upstream, a proxy (ProxyThread, uvloop) with its admin socket, and client processes of at most
500 connections each (one proton Container each: proton's Python reactor uses ``select``,
which stops at file descriptor 1024) record when each connection received the proxy's Close
(``CLOCK_MONOTONIC``, one clock for every process of the machine). Printed: how long the closes took from the
request to the last Close seen by a client, the spread between the first and the last, the
closes seen in each second (the pacing: about R every second, never all at once), the
daemon's own elapsed time for the job, and the largest gap between two closes.

Usage: ``.venv/bin/python bench/bench_paced_close.py [--connections 1000] [--rate 100]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

from amqp_policy_proxy.admin_client import AdminClient  # noqa: E402
from amqp_policy_proxy.daemon.config import AdminConfig, DaemonConfig  # noqa: E402
from tests.support.proxy import ProxyThread  # noqa: E402

PER_PROCESS = 500

POLICY = [["vhost", {"hostname": "bench", "groups": {"all": {
    "users": "bench", "remoteHosts": "*", "sources": "*", "targets": "*"}}}]]


class Clients(MessagingHandler):  # type: ignore[misc]
    """``n`` connections to ``url``; when each saw the proxy's Close (monotonic seconds)."""

    def __init__(self, url: str, n: int) -> None:
        super().__init__()
        self.url, self.n = url, n
        self.opened = 0
        self.closed: list[float] = []
        self.container: Any = None

    def on_start(self, event: Any) -> None:
        self.container = event.container
        for _ in range(self.n):
            event.container.connect(self.url, user="bench", password="secret",
                                    virtual_host="bench", allowed_mechs="PLAIN",
                                    allow_insecure_mechs=True, reconnect=False)

    def on_connection_opened(self, event: Any) -> None:
        self.opened += 1

    def on_connection_remote_close(self, event: Any) -> None:
        self.closed.append(time.monotonic())
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        pass


def client(url: str, n: int) -> int:
    """One client process: open ``n`` connections, say ``opened``, print the Close times as
    JSON once every connection saw one (or after 60 s)."""
    clients = Clients(url, n)
    container = Container(clients)
    threading.Thread(target=container.run, daemon=True).start()
    deadline = time.monotonic() + 120
    while clients.opened < n and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"opened {clients.opened}", flush=True)
    deadline = time.monotonic() + 60
    while len(clients.closed) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps(clients.closed), flush=True)
    container.stop()
    return 0


def main() -> int:
    """Run the bench (see the module docstring); 0 when every connection opened."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--client", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return client(args.client[0], int(args.client[1]))
    work = Path(tempfile.mkdtemp(prefix="pace", dir="/tmp"))
    (work / "policy.json").write_text(json.dumps(POLICY))
    here = Path(__file__).resolve().parent
    peer = subprocess.Popen([sys.executable, str(here / "peer.py"), "--port", "0",
                             "--exit-on-stdin-eof"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert peer.stdout is not None
    host, _, port = peer.stdout.readline().split()[1].rpartition(":")
    config = DaemonConfig(admin=AdminConfig(socket=str(work / "admin.sock")))
    proxy = ProxyThread([(host, int(port))], policy_path=str(work / "policy.json"),
                        config=config, shutdown_grace_seconds=2).start()
    sizes = [min(PER_PROCESS, args.connections - i)
             for i in range(0, args.connections, PER_PROCESS)]
    procs = [subprocess.Popen([sys.executable, __file__, "--client",
                               f"127.0.0.1:{proxy.port}", str(n)], stdout=subprocess.PIPE,
                              text=True) for n in sizes]
    try:
        opened = 0
        for proc in procs:
            assert proc.stdout is not None
            opened += int(proc.stdout.readline().split()[1])
        if opened < args.connections:
            print(f"only {opened} of {args.connections} connections opened")
            return 1
        admin = AdminClient(str(work / "admin.sock"))
        began = time.monotonic()
        job = admin.close(vhost="bench", rate=args.rate, reason="paced")
        while not (progress := admin.close_progress(job["job"]))["done"]:
            time.sleep(0.2)
        seen: list[float] = []
        for proc in procs:
            assert proc.stdout is not None
            seen += json.loads(proc.stdout.readline())
        seen.sort()
        per_second = [sum(1 for t in seen if began + s <= t < began + s + 1)
                      for s in range(int(seen[-1] - began) + 1)]
        gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
        print(f"{args.connections} connections closed at {args.rate:g}/s "
              f"(job {job['job']}, {job['closing']} selected)")
        print(f"  request to the last Close seen by a client: {seen[-1] - began:.2f} s "
              f"(expected about {args.connections / args.rate:.1f} s)")
        print(f"  first to last Close seen: {seen[-1] - seen[0]:.2f} s; the daemon's job: "
              f"{progress['elapsed_seconds']:.2f} s, {progress['closed']} closed, "
              f"{progress['skipped']} gone")
        print(f"  closes seen per second: {per_second}")
        print(f"  largest gap between two closes: {max(gaps) * 1000:.0f} ms; "
              f"clients that saw a Close: {len(seen)}")
    finally:
        for proc in procs:
            proc.kill()
        proxy.stop()
        peer.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
