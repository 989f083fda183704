"""Smoke test of the real-router bench's pure-Python parts (bench/realrouter.py & co).

Never starts qdrouterd, HAProxy, the proxy or the C load client: the bench itself is not run
by the suite, so CI does not depend on qdrouterd. Checks the refusal when qdrouterd is
absent, the summaries and tables from synthetic samples, the py-spy summary and the policy
documents of the decision bench.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(scope="module")
def rr():
    return _load("realrouter")


def test_refuses_without_qdrouterd(rr, monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("QDR_HOME", raising=False)
    code = rr.main(["--qdr-env", str(tmp_path / "absent.sh"), "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot run" in err
    assert "qdrouterd" in err or "haproxy" in err
    assert not list(tmp_path.iterdir())


def test_find_qdr_reads_env_file_and_checks_binary(rr, monkeypatch, tmp_path):
    monkeypatch.delenv("QDR_HOME", raising=False)
    home = tmp_path / "qdr"
    env = tmp_path / "qdr-env.sh"
    env.write_text(f"# generated\nexport QDR_HOME={home}\nexport QDR_PYTHONPATH=/x:/y  # c\n")
    assert rr.read_env_file(env) == {"QDR_HOME": str(home), "QDR_PYTHONPATH": "/x:/y"}
    with pytest.raises(rr.Unavailable) as exc:
        rr.find_qdr(env)
    assert "qdrouterd not found at" in exc.value.message
    (home / "sbin").mkdir(parents=True)
    binary = home / "sbin" / "qdrouterd"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    found = rr.find_qdr(env)
    assert found.qdrouterd == binary and found.pythonpath == "/x:/y"


def _sample(rate_key, rate, cpu, ok=True, **extra):
    return {"ok": ok, rate_key: rate, "cpu": cpu, **extra}


def test_summary_ratios_goals_and_cpu_table(rr):
    cpu = {"router": 0.5, "haproxy": 0.2, "proxy": 0.4, "sender": 0.1, "receiver": 0.1,
           "machine": 1.5, "irq": 0.1, "steal": 0.0, "other": 0.05}
    results = {
        "tput-100B": {
            "direct": [_sample("msgs_per_s", v, cpu) for v in (200.0, 210.0, 190.0)],
            "haproxy": [_sample("msgs_per_s", v, cpu) for v in (100.0, 120.0, 110.0)],
            "proxy": [_sample("msgs_per_s", v, cpu) for v in (100.0, 90.0, None)],
        },
        "connect": {
            t: [_sample("conn_per_s", 1000.0, cpu, open_ms={"p50": 2.0, "p99": 5.0})]
            for t in ("direct", "haproxy", "proxy")
        },
    }
    results["tput-100B"]["proxy"][2]["ok"] = False
    summ = rr.summarize(results)
    row = summ["100 B unsettled, msgs/s"]
    assert row["proxy"]["median"] == 95.0 and row["proxy"]["values"][2] is None
    assert row["proxy/haproxy"]["ratio"] == pytest.approx(95.0 / 110.0)
    assert row["proxy/haproxy"]["paired_min"] == pytest.approx(0.75)
    cpu_s = rr.cpu_summary(results)
    # median of the per-sample figures (0.4 core at 100 and at 90 msgs/s)
    assert cpu_s["tput-100B"]["proxy"]["us_per_op"]["proxy"] == pytest.approx(
        (4000.0 + 4444.44) / 2, abs=0.01)
    doc = {"summary": summ, "cpu": cpu_s, "disturbed": ["x"],
           "meta": {"targets": list(rr.TARGETS), "started": "s", "finished": "f",
                    "proxy": {"commit": "abc1234"}, "rounds": 3, "loadavg_start": [0.1],
                    "loadavg_end": [0.2], "nproc": 2, "disturbed_threshold": 0.25}}
    md = rr.render_markdown(doc)
    assert "| 100 B unsettled, msgs/s | 200 (190–210) | 110 (100–120) | 95 (90–100) |" in md
    assert ">= 0.95: missed" in md and ">= 0.90: met" in md
    assert "abc1234" in md and "| tput-100B | proxy |" in md
    assert "(disturbed): x 1 of 9." in md


def test_headline_has_cpu_per_connection_and_memory_at_rest(rr):
    """Issue 34's headline figures: CPU µs per connection (ratio goal 1.5) and RSS at rest
    (the proxy's own figure against 40 MiB)."""
    results = {
        "connect": {
            "haproxy": [{"ok": True, "conn_per_s": 2000.0, "front_us_per_conn": 160.0,
                         "open_ms": {"p50": 2.0, "p99": 4.0}}],
            "proxy": [{"ok": True, "conn_per_s": 1000.0, "front_us_per_conn": 480.0,
                       "open_ms": {"p50": 4.0, "p99": 8.0}}],
        },
        "idle": {
            "haproxy": [{"ok": True, "front_kib_per_conn": 3.3, "front_rest_mib": 15.0}],
            "proxy": [{"ok": True, "front_kib_per_conn": 7.0, "front_rest_mib": 38.5}],
        },
    }
    summ = rr.summarize(results)
    assert summ["connect: front CPU per connection, µs"]["proxy/haproxy"]["ratio"] == 3.0
    doc = {"summary": summ, "cpu": rr.cpu_summary(results), "disturbed": [],
           "meta": {"targets": ["haproxy", "proxy"], "started": "s", "finished": "f",
                    "proxy": {"commit": "abc1234"}, "rounds": 1, "loadavg_start": [0.1],
                    "loadavg_end": [0.2], "nproc": 2, "disturbed_threshold": 0.25}}
    md = rr.render_markdown(doc)
    assert "| connect: front CPU per connection, µs | 160 (160–160) | 480 (480–480) |" in md
    assert "<= 1.50: missed" in md
    assert "| RSS at rest, MiB (front process, fresh start) | 15.0 (15.0–15.0) | 38.5" in md
    assert "proxy <= 40.0 MiB: met" in md


def test_cpu_sampler_interpolates_and_computes_other(rr):
    s = rr.CpuSampler({})
    s.samples = [(0.0, {"machine": 0.0, "_tasks": 0.0, "irq": 0.0, "steal": 0.0, "p": 0.0}),
                 (1.0, {"machine": 2.0, "_tasks": 1.8, "irq": 0.2, "steal": 0.0, "p": 1.0})]
    out = s.between(0.5, 1.0)
    assert out["p"] == pytest.approx(1.0) and out["machine"] == pytest.approx(2.0)
    assert out["other"] == pytest.approx(0.8) and "_tasks" not in out


def test_collapsed_profile_summary(rr, tmp_path):
    raw = tmp_path / "p.txt"
    raw.write_text(
        "run (uvloop/loop.pyx:1);data_received (amqp_policy_proxy/daemon/relay.py:10);"
        "receive_data (amqp_policy_proxy/core/connection.py:5) 6\n"
        "run (uvloop/loop.pyx:1);send (libc.so.6) 3\n"
        "run (uvloop/loop.pyx:1);inc (prometheus_client/metrics.py:3) 1\n"
        "run (uvloop/loop.pyx:1);uv__io_poll (linux.c:1);epoll_pwait (libc.so.6) 50\n")
    summ = rr.summarize_collapsed(raw)
    assert summ["samples"] == 10 and summ["idle_samples"] == 50
    assert summ["by_area"]["core (sans-IO state machine)"] == 60.0
    assert summ["by_area"]["system calls"] == 30.0
    assert summ["by_area"]["metrics"] == 10.0
    assert summ["own_top"][0][1] == 60.0
    assert summ["by_function"][0] == ("receive_data (core/connection.py)", 60.0)


def test_scaling_summary_table():
    sc = _load("realrouter_scaling")
    cpu = {"router": 0.3, "proxy": 0.5, "haproxy": 0.2, "other": 0.0}
    samples = {"connect-100": {t: [{"ok": True, "conn_per_s": 1000.0, "cpu": cpu,
                                   "open_ms": {"p50": 3.0, "p99": 9.0}}]
                               for t in ("direct", "haproxy", "proxy")}}
    summ = sc.summarize(samples)
    assert summ["connect-100"]["proxy"]["front_us"]["median"] == pytest.approx(500.0)
    md = sc.render({"summary": summ, "meta": {"started": "s", "finished": "f", "proxy": {},
                                              "rounds": 1, "loadavg_start": [0],
                                              "loadavg_end": [0]}})
    assert "| connect-100 | proxy | 1,000 (1,000–1,000) | 3.00 / 9.0 | 300 | 500 (500–500)" in md


def test_decision_bench_policy_loads_with_the_real_loader(tmp_path):
    pd = _load("bench_policy_decision")
    doc = pd.policy_document(30)
    groups = doc[0][1]["groups"]
    assert len(groups) == pd.GROUPS
    assert len(groups["group1"]["remoteHosts"].split(", ")) == pd.RANGES
    # measure() loads it with load_policy and checks every user is listed
    row = pd.measure(10, iterations=50, repeat=1, tmp=tmp_path)
    assert row["ledger_connections"] == 10 and row["open+admit"]["median"] > 0
