#!/usr/bin/env python3
"""The Open decision's cost against policy size: 10, 1,000 and 10,000 users, 100 remoteHosts.

Bench tooling, not part of the package (issue 17, part 4). In-process, no sockets: for each
size a QDR policy file is written to a temporary directory and loaded with the real loader
(:func:`amqp_policy_proxy.policy.load.load_policy`, the daemon's path), then the decision the
core makes on every client Open (``core/connection.py`` ``_decide_open``) is timed:
:func:`amqp_policy_proxy.policy.decisions.approve_open` (vhost, group, remoteHosts) followed by
:meth:`amqp_policy_proxy.limits.connections.ConnectionLedger.try_admit` (vhost, per-user and
per-host counts) and, to keep the ledger's size fixed, ``release``.

The policy: one vhost ``bench`` (plus 9 other vhosts so the vhost lookup is not the only
entry), 10 groups, the users spread evenly over them and listed by name, and every group with
100 ``remoteHosts`` items: 100 IPv4 ranges ``10.G.I.0-10.G.I.200`` (I = 0..99), so a client
address has to be found among 100 ranges (in the last one for the "last range" case). The
ledger holds one admitted connection per user (up to 10,000) while it is measured, so a
larger user population also means a larger ledger.

Cases (µs per decision, CPU time, median of ``--repeat`` runs of ``--iterations`` decisions,
users taken in a shuffled order):

- ``open+admit``: a listed user from an address in its group's last range (the address
  cache warm: clients reconnect from few addresses);
- ``open+admit, new address``: the same with the client addresses of a whole group in turn
  (20,000 of them, more than the 4,096 the address cache keeps: one ``ipaddress`` parse per
  decision);
- ``approve_open only`` and ``try_admit+release only``: the two halves;
- ``denied (remote host)``: an address in no range (QDR's ``remote_host`` denial).

Usage: ``.venv/bin/python bench/bench_policy_decision.py [--users 10,1000,10000]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from amqp_policy_proxy.limits.connections import ConnectionLedger  # noqa: E402
from amqp_policy_proxy.policy import decisions  # noqa: E402
from amqp_policy_proxy.policy.load import load_policy  # noqa: E402

GROUPS = 10
RANGES = 100
OTHER_VHOSTS = 9


def policy_document(users: int) -> list[Any]:
    """The QDR policyDir document for ``users`` users (see the module docstring)."""
    names = [f"user{i:05d}" for i in range(users)]
    groups: dict[str, Any] = {}
    for g in range(GROUPS):
        members = names[g::GROUPS]
        groups[f"group{g}"] = {
            "users": ", ".join(members) if members else f"nobody{g}",
            "remoteHosts": ", ".join(f"10.{g}.{i}.0-10.{g}.{i}.200" for i in range(RANGES)),
            "maxSenders": 100, "maxReceivers": 100, "sources": "*", "targets": "*",
        }
    vhost = {"hostname": "bench", "maxConnections": 65535, "maxConnectionsPerUser": 100,
             "maxConnectionsPerHost": 65535, "allowUnknownUser": False, "groups": groups}
    doc: list[Any] = [["vhost", vhost]]
    for v in range(OTHER_VHOSTS):
        doc.append(["vhost", {"hostname": f"other{v}", "allowUnknownUser": True,
                              "groups": {"$default": {"remoteHosts": "*"}}}])
    return doc


def cpu_us_per_call(fn: Callable[[int], Any], iterations: int, repeat: int) -> dict[str, float]:
    """Median and best CPU µs per call of ``fn(i)`` over ``repeat`` runs (GC off)."""
    runs = []
    for _ in range(repeat):
        gc.disable()
        t0 = time.process_time_ns()
        for i in range(iterations):
            fn(i)
        t1 = time.process_time_ns()
        gc.enable()
        runs.append((t1 - t0) / iterations / 1000.0)
    return {"median": round(statistics.median(runs), 3), "best": round(min(runs), 3)}


def measure(users: int, iterations: int, repeat: int, tmp: Path) -> dict[str, Any]:
    """Every case for one policy size."""
    path = tmp / f"policy-{users}.json"
    path.write_text(json.dumps(policy_document(users)))
    t0 = time.perf_counter()
    policy = load_policy(path)
    load_s = time.perf_counter() - t0
    vhost = policy.vhosts["bench"]
    assert len(vhost.user_groups) == users, len(vhost.user_groups)
    rng = random.Random(17)
    names = [f"user{i:05d}" for i in range(users)]
    order = [names[rng.randrange(users)] for _ in range(4096)]
    # each user's address: in the last range of its group (g = index % GROUPS)
    addr_of = {n: f"10.{int(n[4:]) % GROUPS}.{RANGES - 1}.7" for n in names}
    ledger = ConnectionLedger(1_000_000)
    # the ledger holds one connection per user while measuring
    for i, n in enumerate(names):
        d = decisions.approve_open(policy, hostname="bench", user=n, remote_host=addr_of[n])
        assert isinstance(d, decisions.OpenAllowed), d
        assert ledger.try_admit(f"held-{i}", vhost=d.vhost, group=d.group, user=n,
                                remote_host=addr_of[n]) is None
    mask = len(order) - 1

    def open_admit(i: int) -> None:
        user = order[i & mask]
        d = decisions.approve_open(policy, hostname="bench", user=user,
                                   remote_host=addr_of[user])
        ledger.try_admit("c", vhost=d.vhost, group=d.group, user=user,
                         remote_host=addr_of[user])
        ledger.release("c")

    def open_admit_new_address(i: int) -> None:
        user = order[i & mask]
        # 20,000 addresses in turn, more than the 4,096 the address cache keeps
        host = f"10.{int(user[4:]) % GROUPS}.{(i // 200) % RANGES}.{i % 200}"
        d = decisions.approve_open(policy, hostname="bench", user=user, remote_host=host)
        ledger.try_admit("c", vhost=d.vhost, group=d.group, user=user, remote_host=host)
        ledger.release("c")

    def open_only(i: int) -> None:
        user = order[i & mask]
        decisions.approve_open(policy, hostname="bench", user=user, remote_host=addr_of[user])

    group0 = vhost.groups["group0"]

    def admit_only(i: int) -> None:
        user = order[i & mask]
        ledger.try_admit("c", vhost=vhost, group=group0, user=user, remote_host=addr_of[user])
        ledger.release("c")

    def denied(i: int) -> None:
        user = order[i & mask]
        decisions.approve_open(policy, hostname="bench", user=user, remote_host="192.0.2.1")

    assert isinstance(decisions.approve_open(policy, hostname="bench", user=names[0],
                                             remote_host="192.0.2.1"), decisions.OpenDenied)
    cases = {
        "open+admit": open_admit,
        "open+admit, new address": open_admit_new_address,
        "approve_open only": open_only,
        "try_admit+release only": admit_only,
        "denied (remote host)": denied,
    }
    out: dict[str, Any] = {"users": users, "load_s": round(load_s, 3),
                           "ledger_connections": ledger.active()}
    for name, fn in cases.items():
        fn(0)
        out[name] = cpu_us_per_call(fn, iterations, repeat)
    return out


def render(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: one column per policy size."""
    cases = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    head = "| µs per decision, median (best) | " + " | ".join(
        f"{r['users']:,} users" for r in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for c in cases:
        lines.append(f"| {c} | " + " | ".join(
            f"{r[c]['median']:.2f} ({r[c]['best']:.2f})" for r in rows) + " |")
    lines.append("| policy load time, s | " + " | ".join(f"{r['load_s']:.2f}" for r in rows)
                 + " |")
    lines.append("| connections held in the ledger | " + " | ".join(
        f"{r['ledger_connections']:,}" for r in rows) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every size; print the table and JSON."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", default="10,1000,10000")
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="policy-decision-") as tmp:
        rows = [measure(int(u), a.iterations, a.repeat, Path(tmp))
                for u in a.users.split(",") if u]
    print(render(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
