"""How long a reload's re-evaluation holds the event loop (``[policy] reevaluate_open``).

10,000 admitted connections, each with one session and 10 attached sender links (100,000
links), are built through the core's public interface from raw frames (no sockets: the figure
is the core's work, which is what holds the loop). The reload's new policy narrows every
group's targets so that one link in ten is revoked. The connections are re-checked as the
daemon does (``daemon/reevaluation.py``: ``SLICE`` seconds at a time, then the loop runs): the
figures are the longest time the loop is held at once and the total.

Run: ``.venv/bin/python bench/bench_reevaluate.py [CONNECTIONS] [LINKS_PER_CONNECTION]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amqp_policy_proxy.daemon.reevaluation import SLICE  # noqa: E402
from tests.unit.core.helpers import (  # noqa: E402
    Attach,
    Script,
    Source,
    Target,
    frame,
    make_policy,
)


def build(n: int, links: int) -> list[Script]:
    """``n`` connections of alice with ``links`` sender links each, attached on both legs."""
    before = make_policy({"staff": {"users": "alice", "remoteHosts": "*", "sources": "*",
                                    "targets": "public.*, orders.*"}})
    scripts = []
    for i in range(n):
        s = Script(before, conn_id=f"c{i}")
        s.open(user="alice")
        s.begin(0, router_channel=0)
        for h in range(links):
            address = "orders.x" if h == 0 else f"public.{h}"
            s.client(frame(0, Attach(name=f"l{h}", handle=h, role=False,
                                     source=Source(address="c"), target=Target(address=address),
                                     initial_delivery_count=0)))
            s.router(frame(0, Attach(name=f"l{h}", handle=h, role=True,
                                     source=Source(address="c"),
                                     target=Target(address=address))))
        for buf in s.sent.values():
            buf.clear()
        scripts.append(s)
    return scripts


def main(argv: list[str]) -> None:
    """Build the connections, re-evaluate them all against a narrower policy, print figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("connections", type=int, nargs="?", default=10_000)
    ap.add_argument("links", type=int, nargs="?", default=10, help="links per connection")
    args = ap.parse_args(argv)
    n, links = args.connections, args.links
    t0 = time.perf_counter()
    scripts = build(n, links)
    print(f"built {n} connections x {links} links in {time.perf_counter() - t0:.1f} s")
    after = make_policy({"staff": {"users": "alice", "remoteHosts": "*", "sources": "*",
                                   "targets": "public.*"}})
    longest = 0.0
    start = b0 = time.perf_counter()
    for s in scripts:
        s._run(s.conn.reevaluate(after, 100.0))
        held = time.perf_counter() - b0
        if held >= SLICE:  # the daemon lets the loop run here
            longest = max(longest, held)
            b0 = time.perf_counter()
    longest = max(longest, time.perf_counter() - b0)
    total = time.perf_counter() - start
    revoked = sum(s.conn.figures.active_senders == links - 1 for s in scripts)
    print(f"re-evaluated {n} connections / {n * links} links in {total * 1000:.0f} ms; "
          f"the loop held at most {longest * 1000:.2f} ms at once; connections with one link "
          f"revoked: {revoked}")


if __name__ == "__main__":
    main(sys.argv[1:])
