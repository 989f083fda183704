"""bench/gen_events.py writes the partitioned event log layout with valid records."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

from amqp_policy_proxy.eventlog import schema as ev

GEN = Path(__file__).resolve().parents[2] / "bench" / "gen_events.py"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_events", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generator_layout_and_records(tmp_path):
    gen = _gen()
    out = tmp_path / "ev"
    policy = tmp_path / "policy.json"
    # Tight limits (x0.01) so that every denial reason occurs in a small log.
    assert gen.main(["--out", str(out), "--events", "20000", "--users", "200", "--hosts", "50",
                     "--days", "1", "--proxies", "2", "--seed", "3", "--limit-scale", "0.01",
                     "--policy-out", str(policy)]) == 0
    files = sorted(out.rglob("*.jsonl"))
    names = {f.relative_to(out).as_posix() for f in files}
    assert all(re.fullmatch(r"dt=2026-11-02/hour=\d\d/events-proxy-0[12]-\d+\.jsonl", n)
               for n in names)
    events: Counter = Counter()
    reasons: Counter = Counter()
    conn_ids: dict[str, set] = {}
    n = 0
    for f in files:
        hour = int(f.parent.name[5:])
        last = ""
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            n += 1
            assert set(rec) <= set(ev.ALL_FIELDS) and rec["schema_version"] == ev.SCHEMA_VERSION
            assert int(rec["ts"][11:13]) == hour and rec["ts"] >= last  # right file, in order
            last = rec["ts"]
            events[rec["event"]] += 1
            if rec["event"] == ev.CONNECTION_DENIED:
                reasons[rec["reason"]] += 1
            if rec["event"] == ev.CONNECTION_OPENED:
                conn_ids.setdefault(f.name, set()).add(rec["conn_id"])
    assert abs(n - 20000) < 20000 * 0.02
    assert set(events) == set(ev.EVENT_NAMES)
    assert set(reasons) == {"global_limit", "no_vhost", "unknown_user", "remote_host",
                            "vhost_limit", "user_limit", "host_limit", "handshake_timeout"}
    a, b = conn_ids.values()
    assert a & b  # conn_ids restart in every proxy process
    assert json.loads("\n".join(
        line for line in policy.read_text().splitlines() if not line.startswith("#")))


def test_generator_is_fleet_like(tmp_path):
    """Thousands of users and hosts, a diurnal curve, a reconnect burst, and denials."""
    gen = _gen()
    out = tmp_path / "ev"
    assert gen.main(["--out", str(out), "--events", "60000", "--users", "3000", "--hosts",
                     "2000", "--days", "1", "--proxies", "2", "--seed", "5"]) == 0
    users, hosts = set(), set()
    per_hour: Counter = Counter()
    per_minute: Counter = Counter()
    attempts = denied = 0
    for f in out.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["event"] == ev.CONNECTION_OPENED:
                users.add(rec["user"])
                hosts.add(rec["remote_host"])
                per_hour[int(rec["ts"][11:13])] += 1
                per_minute[rec["ts"][:16]] += 1
            if rec["event"] in (ev.CONNECTION_OPENED, ev.CONNECTION_DENIED):
                attempts += 1
                denied += rec["event"] == ev.CONNECTION_DENIED
    assert len(users) >= 1000 and len(hosts) >= 1000
    quiet = min(range(24), key=lambda h: per_hour[h])
    assert quiet < 7 and max(per_hour.values()) >= 4 * per_hour[quiet]  # night vs afternoon
    median = sorted(per_minute.values())[len(per_minute) // 2]
    assert sum(n > 4 * median for n in per_minute.values()) >= 3  # the 5-minute burst
    assert 0.01 < denied / attempts < 0.2
