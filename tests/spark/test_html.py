"""spark_reports.html: the offline HTML page and its PNG charts. No Spark."""

from __future__ import annotations

import datetime as dt
import re

from amqp_policy_proxy.spark_reports import html


def test_report_references_its_charts_and_nothing_online(tmp_path):
    t0 = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC)
    xs = [t0 + dt.timedelta(minutes=i) for i in range(5)]
    data = html.ReportData(
        grid="1m", source="/logs", window_start="2026-11-21T10:00:00.000Z",
        window_end="2026-11-21T10:05:00.000Z", notes=["a <note> & more"],
        timeline={"v1": (xs, [2, 2, 3, 2, 2])},
        headroom_top={"user": [{"scope": "user", "vhost": "v1", "key": "alice", "limit": 3,
                                "peak": 2, "utilisation": 2 / 3}]},
        denials={"user_limit": (xs[:1], [2]), "host_limit": (xs[3:4], [1])},
        denial_totals={"user_limit": 2, "host_limit": 1},
        top_denied={"user": [{"vhost": "v1", "key": "alice", "count": 2,
                              "top_reason": "user_limit"}]},
        traffic=[{"vhost": "v1", "group": "g1", "connections": 3, "bytes_in": 600,
                  "bytes_out": 6000, "transfers_in": 6, "transfers_out": 60,
                  "duration_p50": 60.0, "duration_p95": 210.0, "duration_p99": 210.0,
                  "duration_max": 210.0}],
        durations=[("10 s-1 min", 60.0, 1), ("1-10 min", 600.0, 2)],
        churn=[(x, 2, 1.5) for x in xs],
        whatif=[{"vhost": "v1", "scope": "user", "key": "alice", "would_deny": 1}],
        whatif_total=1,
    )
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "stale.png").write_bytes(b"old")
    path = html.write_report(str(tmp_path), data)
    page = open(path, encoding="utf-8").read()
    images = re.findall(r'<img src="([^"]+)"', page)
    assert {"img/concurrency.png", "img/headroom.png", "img/denials.png",
            "img/top_denied_user.png", "img/traffic.png", "img/durations.png",
            "img/churn.png", "img/whatif.png"} <= set(images)
    for src in images:
        assert (tmp_path / src).read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "img" / "stale.png").exists()
    assert "a &lt;note&gt; &amp; more" in page  # escaped
    assert not re.search(r"(src|href)=\"(https?:)?//", page)


def test_empty_report_has_no_images(tmp_path):
    page = open(html.write_report(str(tmp_path), html.ReportData(notes=["No events."])),
                encoding="utf-8").read()
    assert "<img" not in page and "No events." in page and "No data for" in page


def test_admin_actions_table_newest_rows_and_escaping(tmp_path, monkeypatch):
    rows = [{"ts": f"2026-11-21T10:0{i}:00.000Z", "action": "connections_close", "vhost": None,
             "selector": f"user=u{i}", "targets": f"c{i}", "count": 1, "result": "ok",
             "uid": "0", "pid": "31337", "peer": "unix", "description": "<why>"}
            for i in range(3)]
    monkeypatch.setattr(html, "ADMIN_ROWS", 2)
    page = open(html.write_report(str(tmp_path), html.ReportData(admin_actions=rows)),
                encoding="utf-8").read()
    assert "<h2>6. Admin actions</h2>" in page
    assert "3 admin actions: the last 2 are shown." in page
    assert "user=u0" not in page and "user=u1" in page and "user=u2" in page
    assert ("<tr><td>2026-11-21T10:02:00.000Z</td><td>connections_close</td><td></td>"
            "<td>user=u2</td><td>c2</td><td>1</td><td>ok</td><td>0</td><td>31337</td>"
            "<td>unix</td><td>&lt;why&gt;</td></tr>") in page
    empty = open(html.write_report(str(tmp_path / "e"), html.ReportData()), encoding="utf-8").read()
    assert "<h2>6. Admin actions</h2>" in empty and "No rows." in empty


def test_churn_storm_and_forecast_sections(tmp_path):
    from amqp_policy_proxy.spark_reports.forecast import DayForecast, KeyForecast

    d0 = dt.date(2026, 11, 21)
    days = [DayForecast(d0 + dt.timedelta(days=i), "actual", 100.0 + i) for i in range(7)]
    days += [DayForecast(d0 + dt.timedelta(days=7 + i), "forecast", 108.0 + i, 100.0 + i,
                         116.0 + i, 95.0 + i, 125.0 + i) for i in range(3)]
    fc = KeyForecast("vhost", "v1", "v1", days, limit=120, model="m",
                     limit_date=None, days_until_limit=None, days_until_limit_upper95=2)
    data = html.ReportData(
        window_start="2026-11-21T00:00:00.000Z", window_end="2026-11-28T00:00:00.000Z",
        churn_rule="rule", storm_rule="storm rule",
        churn_periods=[{"scope": "vhost", "vhost": "v1", "key": "v1",
                        "start": "2026-11-22T10:00:00.000Z", "end": "2026-11-22T10:12:00.000Z",
                        "minutes": 12, "opens": 9000, "closes": 9000, "peak_churn_per_s": 30.0,
                        "peak_ratio": 0.2, "max_connections": 150, "min_connections": 140}],
        storms=[{"storm_id": "v1@2026-11-23T02:30:00Z", "vhost": "v1",
                 "start": "2026-11-23T02:30:00.000Z", "end": "2026-11-23T02:31:00.000Z",
                 "opens": 3000, "peak_opens_per_s": 70, "baseline_per_s": 0.5,
                 "top_users": "a:10 <b>:5", "top_hosts": "10.0.0.1:3000",
                 "top_host": "10.0.0.1"}],
        storm_limits=[{"storm_id": "v1@2026-11-23T02:30:00Z", "setting": "maxConnectionRate",
                       "recommended": 3, "pre_storm_p99_per_s": 3.0, "storm_peak_per_s": 70,
                       "over_rate_opens": 2800}],
        forecasts=[fc], forecast_days=3,
        forecast_limits=[{"scope": "vhost", "vhost": "v1", "key": "v1", "limit": 120}])
    page = open(html.write_report(str(tmp_path), data), encoding="utf-8").read()
    for section in ('<section id="churn-periods">', '<section id="storms">',
                    '<section id="forecast">'):
        assert section in page
    for img in ("churn_periods", "storms", "forecast_0"):
        assert f'<img id="chart-{img}" src="img/{img}.png"' in page
        assert (tmp_path / "img" / f"{img}.png").read_bytes()[:4] == b"\x89PNG"
    assert "a:10 &lt;b&gt;:5" in page and "maxConnectionRate" in page
    off = open(html.write_report(str(tmp_path / "off"), html.ReportData()),
               encoding="utf-8").read()
    assert "--no-forecast" in off and "No data for: storms on a time line" in off
