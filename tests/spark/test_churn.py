"""spark_reports.churn: the HighConnectionChurn rule per vhost and per client host."""

from __future__ import annotations

import datetime as dt
import json

from amqp_policy_proxy.spark_reports.churn import ChurnRule, churn_periods, churn_rates
from tests.spark.golden import load, window

T0 = dt.datetime(2026, 11, 21, 10)  # naive UTC, as Spark returns timestamps


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _write(path, vhost_minutes: dict[str, int]) -> None:
    """Per vhost: 150 long connections from host `long` opened at 10:00, and from 10:02 on,
    for the given number of minutes, 20 connections per second from host `churn`, each
    open for two seconds."""
    lines = []
    n = 0

    def conn(vhost, host, t_open, t_close):
        nonlocal n
        n += 1
        base = {"schema_version": 3, "conn_id": str(n), "vhost": vhost, "group": "g",
                "user": f"u{n % 7}", "remote_host": host, "listener": "0.0.0.0:5672"}
        lines.append((t_open, {**base, "event": "connection_opened", "ts": _iso(t_open)}))
        if t_close is not None:
            lines.append((t_close, {**base, "event": "connection_closed", "ts": _iso(t_close),
                                    "opened_ts": _iso(t_open),
                                    "duration_seconds": (t_close - t_open).total_seconds()}))

    for vhost, minutes in vhost_minutes.items():
        for _ in range(150):
            conn(vhost, "long", T0, None)
        start = T0 + dt.timedelta(minutes=2)
        for s in range(minutes * 60):
            for k in range(20):
                t = start + dt.timedelta(seconds=s, milliseconds=k * 10)
                conn(vhost, "churn", t, t + dt.timedelta(seconds=2))
    lines.sort(key=lambda x: x[0])
    path.write_text("".join(json.dumps(r) + "\n" for _, r in lines))


def test_churn_is_flagged_when_sustained_and_above_the_minimum(spark, tmp_path):
    _write(tmp_path / "events-h-1.jsonl", {"v": 14, "w": 9})
    w = window("10:00", "10:30")
    events = load(spark, tmp_path / "events-h-1.jsonl", w)
    rates = churn_rates(events, w).persist()
    try:
        v = {r["window_start"].minute: r for r in rates.where(
            "scope = 'vhost' AND key = 'v'").collect()}
        # 10:05: 1200 opens + 1200 closes in the minute = 40/s against the 150 + 40
        # connections open at the minute's end
        assert v[5]["opens"] == 1200 and v[5]["closes"] == 1200
        assert v[5]["connections"] == 190 and abs(v[5]["churn_per_s"] - 40.0) < 1e-9
        assert v[5]["over"] and v[5]["flagged"]
        assert not v[0]["over"]  # 150 opens in one minute: 2.5/s < 15
        periods = {(r["scope"], r["key"]): r for r in churn_periods(rates).collect()}
        # v churns 14 minutes (10:02-10:16): flagged; w only 9: over the ratio, not sustained
        assert set(periods) == {("vhost", "v")}
        p = periods[("vhost", "v")]
        assert p["start"] == T0 + dt.timedelta(minutes=2)
        # 10:16 has only the last 40 closes (0.7/s): the period is 10:02-10:16
        assert p["end"] == T0 + dt.timedelta(minutes=16) and p["minutes"] == 14
        assert rates.where("key = 'w' AND over").count() >= 9
        # host `churn` has only 40 connections open: ignored under the minimum
        assert rates.where("scope = 'remote_host' AND over").count() == 0
        # ... unless the minimum is lowered
        low = churn_rates(events, w, ChurnRule(min_connections=5))
        hosts = {r["vhost"] for r in churn_periods(low).where("scope = 'remote_host'").collect()}
        assert hosts == {"v"}
    finally:
        rates.unpersist()
