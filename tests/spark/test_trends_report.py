"""The capacity report finds what bench/gen_events.py plants: a connection storm, an
over-limit tenant and a growth trend; and its page, loaded in headless Chromium, has every
section and chart."""

from __future__ import annotations

import collections
import csv
import datetime as dt
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from amqp_policy_proxy.spark_reports.jobs.capacity import main
from tests.support.logs import LoggerLines

GEN = Path(__file__).resolve().parents[2] / "bench" / "gen_events.py"
STORM_AT = dt.datetime(2026, 11, 10, 2, 30, tzinfo=dt.UTC)  # a Tuesday night: no burst hour
HELD_BACK = "2026-11-16"  # the last day of the log, left out of the report
TENANT = "tenant-over"
CHROMIUM = "/usr/bin/chromium"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_events", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _daily_peaks(root: Path, day: str) -> dict[str, int]:
    """The peak concurrency per vhost on ``day``, straight from the generated files."""
    changes: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for f in root.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["event"] == "connection_opened":
                changes[r["vhost"]].append((r["ts"], 1))
            elif r["event"] == "connection_closed":
                changes[r["vhost"]].append((r["ts"], -1))
                if r["opened_ts"] < "2026-11-02":  # open before the log starts
                    changes[r["vhost"]].append(("2026-11-02T00:00:00.000Z", 1))
    peaks = {}
    for vhost, c in changes.items():
        c.sort()  # closes (-1) before opens at the same instant
        level = peak = 0
        for ts, d in c:
            level += d
            if ts.startswith(day):
                peak = max(peak, level)
        peaks[vhost] = peak
    return peaks


# The machine the tests run on may be shared: the fixture's report gets more than the default
# timeout (about 40 s of it alone on a quiet 2-core machine).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def planted(spark, tmp_path_factory):
    """A 15-day log with a storm, an over-limit tenant and 20 %/week growth; the report of
    its first 14 days (the 15th held back) with a one-day forecast."""
    tmp = tmp_path_factory.mktemp("planted")
    events, policy, out = tmp / "ev", tmp / "policy.json", tmp / "out"
    assert _gen().main([
        "--out", str(events), "--events", "60000", "--users", "400", "--hosts", "150",
        "--days", "15", "--proxies", "2", "--seed", "7", "--policy-out", str(policy),
        "--storm-at", STORM_AT.isoformat(), "--storm-size", "3000", "--storm-seconds", "60",
        "--over-limit-user", TENANT, "--over-limit-vhost", "billing", "--growth", "20"]) == 0
    # The job reports a failure in a log line only: catch its lines on its own logger, so
    # the assertion shows them whatever the root logger's handlers are.
    with LoggerLines("amqp_policy_proxy.spark_reports") as log:
        rc = main(["--events", str(events), "--policy", str(policy), "--out", str(out),
                   "--to", HELD_BACK, "--forecast-days", "1", "--forecast-keys", "6",
                   "--churn-for", "1m", "--churn-min-connections", "10"])
    assert rc == 0, log.messages[-20:]
    return events, out


def test_the_report_finds_the_planted_storm(planted):
    _, out = planted
    storms = _rows(out / "storms.csv")
    near = [s for s in storms if abs(dt.datetime.fromisoformat(s["start"].replace("Z", "+00:00"))
                                     - STORM_AT) <= dt.timedelta(minutes=1)]
    assert len(near) == 1, storms
    s = near[0]
    assert s["vhost"] == "iot" and s["top_host"] == _gen().STORM_HOST
    assert s["top_user"].startswith("storm-")
    assert int(s["peak_opens_per_s"]) >= 30 and int(s["opens"]) >= 2500
    limits = {r["setting"]: r for r in _rows(out / "storm_limits.csv")
              if r["storm_id"] == s["storm_id"]}
    assert set(limits) == {"maxConnectionRate", "maxConnectionRatePerUser",
                           "maxConnectionRatePerHost"}
    for r in limits.values():  # each rate would have capped the storm's peak
        assert 1 <= int(r["recommended"]) < int(r["storm_peak_per_s"])
        assert int(r["over_rate_opens"]) > 0
    assert json.loads((out / "storms.json").read_text())[0]["storm_id"] == storms[0]["storm_id"]
    # the storm is also a churn spike (with --churn-for 1m --churn-min-connections 10)
    assert any(p["scope"] == "vhost" and p["vhost"] == "iot" and p["start"][:16] == "2026-11-10T02:30"
               for p in _rows(out / "churn_periods.csv"))


def test_the_report_finds_the_over_limit_tenant(planted):
    _, out = planted
    top = _rows(out / "top_denied.csv")
    users = [r for r in top if r["scope"] == "user"]
    assert users[0]["key"] == TENANT and users[0]["vhost"] == "billing"
    assert users[0]["top_reason"] == "user_limit" and int(users[0]["count"]) > 100
    head = [r for r in _rows(out / "headroom.csv") if r["scope"] == "user" and r["key"] == TENANT]
    assert head and float(head[0]["utilisation"]) == 1.0  # always at its limit


def test_the_forecast_holds_the_held_back_day(planted):
    events, out = planted
    actual = _daily_peaks(events, HELD_BACK)
    fc = {r["vhost"]: r for r in _rows(out / "forecast.csv")
          if r["scope"] == "vhost" and r["date"] == HELD_BACK}
    assert fc["iot"]["kind"] == "forecast"
    lo, hi = float(fc["iot"]["lower95"]), float(fc["iot"]["upper95"])
    assert lo <= actual["iot"] <= hi, (actual["iot"], lo, hi)
    limits = {r["vhost"]: r for r in _rows(out / "forecast_limits.csv")}
    assert limits["iot"]["limit"] == "5000" and limits["iot"]["days_until_limit"] == ""
    js = {(r["scope"], r["key"]): r for r in json.loads((out / "forecast.json").read_text())}
    last = js[("vhost", "iot")]["days"][-1]  # the JSON has the CSV's figures
    assert (last["date"], last["kind"]) == (HELD_BACK, "forecast")
    assert last["lower95"] == pytest.approx(lo, abs=1e-3)
    assert last["upper95"] == pytest.approx(hi, abs=1e-3)


def _chromium_or_skip():
    required = bool(os.environ.get("AMQP_PROXY_REQUIRE_CHROMIUM"))
    missing = None
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "the playwright package is not installed (pip install playwright)"
    if missing:
        if required:
            pytest.fail(f"AMQP_PROXY_REQUIRE_CHROMIUM is set but {missing}")
        pytest.skip(missing)
    return CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")


def test_the_page_in_headless_chromium(planted):
    exe = _chromium_or_skip()
    from playwright.sync_api import sync_playwright

    _, out = planted
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto((out / "report.html").resolve().as_uri())
            page.wait_for_load_state("load")
            headings = page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
            for h in ("1. Concurrency", "2. Headroom", "3. Denials", "4. Traffic",
                      "5. Recommendations", "7. Connection churn", "8. Connection storms",
                      "9. Forecast"):
                assert h in headings, headings
            for section in ("churn-periods", "storms", "forecast"):
                assert page.locator(f"section#{section} h2").count() == 1
            for chart in ("chart-churn_periods", "chart-storms", "chart-forecast_0"):
                assert page.locator(f"img#{chart}").count() == 1, chart
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.getAttribute('src'), e.complete, e.naturalWidth])")
            srcs = {src for src, _, _ in images}
            assert {"img/concurrency.png", "img/headroom.png", "img/storms.png",
                    "img/churn_periods.png", "img/forecast_0.png"} <= srcs
            broken = [src for src, done, width in images if not done or width <= 0]
            assert not broken, broken
            assert len(page.eval_on_selector_all("section#forecast img", "els => els")) == 6
        finally:
            browser.close()


def test_without_chromium_the_browser_test_skips_unless_required(monkeypatch):
    import tests.spark.test_trends_report as me

    monkeypatch.setattr(me, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(me.shutil, "which", lambda name: None)
    monkeypatch.delenv("AMQP_PROXY_REQUIRE_CHROMIUM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="is not installed"):
        me._chromium_or_skip()
    monkeypatch.setenv("AMQP_PROXY_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception, match="AMQP_PROXY_REQUIRE_CHROMIUM is set"):
        me._chromium_or_skip()


@pytest.mark.parametrize("extra", [
    ["--churn-for", "90s"], ["--churn-for", "0m"], ["--churn-ratio", "0"],
    ["--churn-min-connections", "-1"], ["--storm-factor", "-2"], ["--storm-floor", "0"],
    ["--storm-gap", "5x"], ["--forecast-days", "0"], ["--forecast-keys", "0"],
])
def test_bad_trend_options_exit_2(fixtures, tmp_path, capsys, extra):
    assert main(["--events", str(fixtures), "--out", str(tmp_path), *extra]) == 2
    assert "error" in capsys.readouterr().err
