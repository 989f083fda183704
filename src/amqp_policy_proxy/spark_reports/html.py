"""The capacity report as one HTML page with PNG charts. Imports matplotlib (Agg), no Spark.

Everything here works on small, already-aggregated Python values (:class:`ReportData`, filled
by the job); nothing scales with the number of events. The page references its charts as
``img/<name>.png`` next to it and loads nothing else (no scripts, fonts or style sheets from
the network), so the output directory can be copied and opened offline.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede any pyplot import elsewhere in the process

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Series = tuple[list[dt.datetime], list[float]]

#: Admin actions shown on the page at most (the newest); admin_actions.csv has them all.
ADMIN_ROWS = 500
#: The chart sections of the page, in page order; see :func:`draw_section`.
SECTIONS: tuple[str, ...] = ("concurrency", "headroom", "denials", "traffic", "whatif",
                             "storms", "forecast")
# matplotlib is not thread-safe (shared font and text caches): one chart at a time.
_DRAW_LOCK = threading.Lock()


#: The default :attr:`ReportData.limit_scope`: every proxy enforces its limits alone.
PER_PROXY_LIMITS = ("Limits apply per proxy process (each counts its own connections), so "
                    "headroom and recommendations use per-proxy peaks.")


@dataclass
class ReportData:
    """The small extracts the page and its charts are made of."""

    grid: str = "1m"
    """The ``--grid`` label."""
    source: str = ""
    """The event log path."""
    window_start: str | None = None
    """Window start, RFC 3339, or ``None`` with no events."""
    window_end: str | None = None
    """Window end (exclusive), RFC 3339."""
    notes: list[str] = field(default_factory=list)
    """Warnings shown at the top."""
    limit_scope: str = PER_PROXY_LIMITS
    """Which peaks the limits were compared with (per proxy process, or fleet-wide), shown at
    the top and in the headroom section."""
    concurrency_top: list[dict[str, Any]] = field(default_factory=list)
    """Concurrency rows (vhost, user, host scopes) with the highest peaks."""
    concurrency_all: dict[str, int] = field(default_factory=dict)
    """Number of keys per scope."""
    vhost_rows: list[dict[str, Any]] = field(default_factory=list)
    """Concurrency rows of the vhost and group scopes."""
    timeline: dict[str, Series] = field(default_factory=dict)
    """Per vhost: bin starts and the maximum concurrency in each bin."""
    headroom_top: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per scope, the headroom rows with the highest utilisation."""
    denials: dict[str, Series] = field(default_factory=dict)
    """Per reason: bin starts and connection denials in each bin."""
    denial_totals: dict[str, int] = field(default_factory=dict)
    """Connection denials per reason."""
    top_denied: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per scope (user, remote_host), the most denied keys."""
    traffic: list[dict[str, Any]] = field(default_factory=list)
    """Traffic rows per vhost and group."""
    durations: list[tuple[str, float, int]] = field(default_factory=list)
    """Duration histogram: (label, upper bound seconds, connections)."""
    churn: list[tuple[dt.datetime, int, float]] = field(default_factory=list)
    """Opens per minute: (bin start, maximum per minute, mean per minute)."""
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    """Rows of recommendations.csv."""
    recommendation_rule: str = "ceil(p99.9 of the per-bucket peak x 1.25)"
    """The rule the recommendations follow, in words."""
    policy_diff: str = ""
    """The unified diff of the recommended policy against ``--policy`` (policy.diff)."""
    policy_files: list[str] = field(default_factory=list)
    """The files of the recommended policy (``policy/``)."""
    whatif: list[dict[str, Any]] | None = None
    """What-if rows with the most denials, or ``None`` without ``--whatif``."""
    whatif_total: int = 0
    """Connections the what-if policy would have denied."""
    whatif_replayed: list[str] = field(default_factory=list)
    """Vhosts that needed a replay."""
    whatif_reasons: dict[str, int] = field(default_factory=dict)
    """Connections the what-if policy would have denied, per reason (QDR's words)."""
    admin_actions: list[dict[str, Any]] = field(default_factory=list)
    """Rows of admin_actions.csv: the operators' changes through the admin interface, oldest
    first (``targets`` joined with spaces)."""
    charts: dict[str, str | None] = field(default_factory=dict)
    """Charts drawn so far (:func:`draw_section`): name -> path relative to the page, or
    ``None`` when there was nothing to draw."""
    drawn: set[str] = field(default_factory=set)
    """The sections whose charts are in ``charts``."""
    churn_periods: list[dict[str, Any]] = field(default_factory=list)
    """Rows of churn_periods.csv (``start``/``end`` RFC 3339 strings), oldest first."""
    churn_rule: str = ""
    """The churn rule in words."""
    storms: list[dict[str, Any]] = field(default_factory=list)
    """Rows of storms.csv (``start``/``end``/``peak_ts`` RFC 3339 strings), oldest first."""
    storm_limits: list[dict[str, Any]] = field(default_factory=list)
    """Rows of storm_limits.csv."""
    storm_rule: str = ""
    """The storm rule in words."""
    forecasts: list[Any] = field(default_factory=list)
    """:class:`~.forecast.KeyForecast` per forecast key (history and forecast days)."""
    forecast_limits: list[dict[str, Any]] = field(default_factory=list)
    """Rows of forecast_limits.csv."""
    forecast_days: int | None = None
    """The forecast horizon in days; ``None``: no forecast (``--no-forecast`` or not run)."""


def _fig(width: float = 9.0, height: float = 3.6) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, img_dir: str, name: str) -> str:
    fig.tight_layout()
    fig.savefig(os.path.join(img_dir, f"{name}.png"), format="png")
    return f"img/{name}.png"


def chart_lines(series: dict[str, Series], title: str, ylabel: str, img_dir: str,
                name: str, stacked: bool = False) -> str | None:
    """Draw one line (or stacked area) per series over time.

    Args:
        series: label -> (times, values).
        title: chart title.
        ylabel: y axis label.
        img_dir: directory of the PNG files.
        name: file name without ``.png``.
        stacked: stack the series (they must share the time axis; missing points are 0).

    Returns:
        The image path relative to the page, or ``None`` when there is nothing to draw.
    """
    if not series:
        return None
    fig = _fig()
    ax = fig.add_subplot()
    if stacked:
        xs = sorted({x for s in series.values() for x in s[0]})
        ys = []
        for xsi, ysi in series.values():
            m = dict(zip(xsi, ysi, strict=True))
            ys.append([m.get(x, 0) for x in xs])
        # matplotlib's stubs leave out the datetimes its date units convert
        ax.stackplot(xs, *ys, labels=list(series), step="post")  # type: ignore[arg-type]
    else:
        for label, (x, y) in series.items():
            ax.step(x, y, where="post", label=label, linewidth=1)  # type: ignore[arg-type]
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.autofmt_xdate()
    return _save(fig, img_dir, name)


def chart_bars(labels: list[str], values: list[float], title: str, xlabel: str, img_dir: str,
               name: str, limit_line: float | None = None) -> str | None:
    """Draw a horizontal bar chart, first label at the top.

    Args:
        labels: bar labels.
        values: bar lengths.
        title: chart title.
        xlabel: x axis label.
        img_dir: directory of the PNG files.
        name: file name without ``.png``.
        limit_line: draw a dashed vertical line at this value (e.g. 100 %).

    Returns:
        The image path relative to the page, or ``None`` when there are no bars.
    """
    if not labels:
        return None
    fig = _fig(9.0, max(2.0, 0.28 * len(labels) + 1.0))
    ax = fig.add_subplot()
    pos = list(range(len(labels)))[::-1]
    ax.barh(pos, values, color="#4477aa")
    ax.set_yticks(pos, [s[:40] for s in labels], fontsize=7)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if limit_line is not None:
        ax.axvline(limit_line, color="#cc3311", linestyle="--", linewidth=1)
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, img_dir, name)


def _esc(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, int):
        return f"{v:,}"
    return html.escape(str(v))


def _table(rows: list[dict[str, Any]], cols: list[str], pct: tuple[str, ...] = (),
           row_class: Callable[[dict[str, Any]], str | None] | None = None) -> str:
    if not rows:
        return "<p class=empty>No rows.</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            text = f"{v * 100:.1f} %" if c in pct and v is not None else _esc(v)
            cells.append(f"<td>{text}</td>")
        cls = row_class(r) if row_class is not None else None
        tr = f"<tr class={cls}>" if cls else "<tr>"
        body.append(tr + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _lowers(row: dict[str, Any]) -> str | None:
    """The row class of a recommendation below the configured limit."""
    return "lower" if row.get("change") == "lower" else None


def _img(path: str | None, alt: str) -> str:
    if path is None:
        return f"<p class=empty>No data for: {html.escape(alt)}.</p>"
    return f'<img src="{html.escape(path)}" alt="{html.escape(alt)}">'


_CSS = """
body{font-family:sans-serif;margin:2em;max-width:70em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
img{max-width:100%;display:block;margin:.5em 0}.empty{color:#888}
.note{background:#fff4e0;border-left:4px solid #e69500;padding:.4em .8em}
tr.lower td,span.lower{background:#fde8e8;color:#a40000;font-weight:bold}
"""


def _section_charts(data: ReportData, img_dir: str, section: str) -> dict[str, str | None]:
    if section == "concurrency":
        return {"concurrency": chart_lines(
            data.timeline, "Concurrent connections per vhost (max per bin)", "connections",
            img_dir, "concurrency")}
    if section == "headroom":
        top = _headroom_top(data)
        return {"headroom": chart_bars(
            [f"{r['scope']} {r['vhost']}/{r['key']}" for r in top],
            [100 * (r.get("utilisation") or 0) for r in top],
            "Closest to their limits (peak / limit)", "utilisation %", img_dir,
            "headroom", limit_line=100.0)}
    if section == "denials":
        out = {"denials": chart_lines(data.denials, "Connection denials by reason",
                                      "denials per bin", img_dir, "denials", stacked=True)}
        for s, rows in data.top_denied.items():
            out[f"top_denied_{s}"] = chart_bars(
                [f"{r['vhost'] or '-'}/{r['key'] or '(none)'}" for r in rows],
                [r["count"] for r in rows], f"Most denied ({s})", "denials", img_dir,
                f"top_denied_{s}")
        return out
    if section == "traffic":
        per_vhost = _traffic_per_vhost(data)
        names = sorted(per_vhost, key=lambda k: -sum(per_vhost[k]))
        churn: dict[str, Series]
        if data.churn:
            xs = [c[0] for c in data.churn]
            churn = {"max opens/min": (xs, [c[1] for c in data.churn]),
                     "mean opens/min": (xs, [c[2] for c in data.churn])}
        else:
            churn = {}
        return {
            "traffic": chart_bars(names, [sum(per_vhost[k]) / 1e6 for k in names],
                                  "Bytes per vhost (in + out, closed connections)", "MB",
                                  img_dir, "traffic"),
            "durations": chart_bars([d[0] for d in data.durations],
                                    [d[2] for d in data.durations], "Connection durations",
                                    "connections", img_dir, "durations"),
            "churn": chart_lines(churn, "Churn: connection opens per minute", "opens/min",
                                 img_dir, "churn"),
        }
    if section in ("storms", "forecast"):
        return _trend_charts(data, img_dir, section)
    if section == "whatif":
        if data.whatif is None:
            return {}
        top_w = data.whatif[:20]
        return {"whatif": chart_bars([f"{r['scope']} {r['vhost']}/{r['key']}" for r in top_w],
                                     [r["would_deny"] for r in top_w], "Would be denied",
                                     "connections", img_dir, "whatif")}
    raise ValueError(f"unknown chart section {section!r}")


def _headroom_top(data: ReportData) -> list[dict[str, Any]]:
    rows = [r for s in ("vhost", "user", "remote_host") for r in data.headroom_top.get(s, [])]
    return sorted(rows, key=lambda r: -(r.get("utilisation") or 0))[:20]


def _traffic_per_vhost(data: ReportData) -> dict[str, list[float]]:
    # vhost -> [bytes in, bytes out] of its groups.
    per_vhost: dict[str, list[float]] = {}
    for r in data.traffic:
        acc = per_vhost.setdefault(str(r["vhost"]), [0.0, 0.0])
        acc[0] += r["bytes_in"] or 0
        acc[1] += r["bytes_out"] or 0
    return per_vhost


def draw_section(out_dir: str, data: ReportData, section: str) -> None:
    """Draw the charts of one section of the page now, from the fields it uses.

    Lets the caller draw a section as soon as its data is there (from any thread; drawing
    is serialised), while it computes the rest; :func:`write_report` draws the sections not
    drawn yet. The fields a section uses must not change afterwards.

    Args:
        out_dir: the report directory (charts go to ``out_dir/img/``, created if needed).
        data: the extracts; ``data.charts`` and ``data.drawn`` are updated.
        section: one of :data:`SECTIONS`: ``concurrency`` (``timeline``), ``headroom``
            (``headroom_top``), ``denials`` (``denials``, ``top_denied``), ``traffic``
            (``traffic``, ``durations``, ``churn``), ``whatif`` (``whatif``).

    Raises:
        ValueError: an unknown section.
        OSError: the image directory cannot be written.
    """
    img_dir = os.path.join(out_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    with _DRAW_LOCK:
        charts = _section_charts(data, img_dir, section)
        data.charts.update(charts)
        data.drawn.add(section)


def write_report(out_dir: str, data: ReportData) -> str:
    """Draw the charts not drawn yet into ``out_dir/img/`` and write ``out_dir/report.html``.

    PNG files in ``out_dir/img/`` that are not charts of this report (an earlier run's) are
    deleted.

    Args:
        out_dir: the report directory (created if needed).
        data: the extracts to show (sections already drawn by :func:`draw_section` are kept).

    Returns:
        The path of ``report.html``.
    """
    img_dir = os.path.join(out_dir, "img")
    os.makedirs(img_dir, exist_ok=True)
    current = {os.path.basename(p) for p in data.charts.values() if p is not None}
    for f in os.listdir(img_dir):  # stale charts of an earlier run
        if f.endswith(".png") and f not in current:
            os.remove(os.path.join(img_dir, f))
    for section in SECTIONS:
        if section not in data.drawn:
            draw_section(out_dir, data, section)
    charts = data.charts
    parts: list[str] = []
    add = parts.append
    add("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        "<title>AMQP policy proxy: capacity report</title>"
        f"<style>{_CSS}</style></head><body>")
    add("<h1>AMQP policy proxy: capacity report</h1>")
    add(f"<p>Event log <code>{_esc(data.source)}</code>; window {_esc(data.window_start)} "
        f"to {_esc(data.window_end)} (end exclusive, UTC); grid {_esc(data.grid)}. "
        "Percentiles are nearest-rank over every grid bucket of the window (zero buckets "
        "included); a bucket's sample is the maximum concurrency within it. "
        f"{_esc(data.limit_scope)}</p>")
    for n in data.notes:
        add(f"<p class=note>{_esc(n)}</p>")

    add("<h2>1. Concurrency</h2>")
    add(_img(charts.get("concurrency"), "concurrency over time"))
    counts = ", ".join(f"{k}: {v:,}" for k, v in data.concurrency_all.items())
    add(f"<p>Keys per scope: {_esc(counts)}. Full table: <code>concurrency.csv</code>.</p>")
    add("<h3>Vhosts and groups</h3>")
    cols = ["scope", "vhost", "key", "peak", "p50", "p95", "p99", "peak_ts"]
    add(_table(data.vhost_rows, cols))
    add("<h3>Highest peaks (vhosts, users, hosts)</h3>")
    add(_table(data.concurrency_top[:30], cols))

    add("<h2>2. Headroom</h2>")
    add(f"<p class=limits>{_esc(data.limit_scope)}</p>")
    add(_img(charts.get("headroom"), "headroom"))
    for s, rows in data.headroom_top.items():
        add(f"<h3>{_esc(s)}</h3>")
        add(_table(rows, ["vhost", "key", "limit", "peak", "utilisation"], pct=("utilisation",)))

    add("<h2>3. Denials</h2>")
    totals = ", ".join(f"{k}: {v:,}" for k, v in sorted(data.denial_totals.items()))
    add(f"<p>Connection denials by reason: {_esc(totals) or 'none'}.</p>")
    add(_img(charts.get("denials"), "denials over time"))
    for s, rows in data.top_denied.items():
        add(f"<h3>Most denied: {_esc(s)}</h3>")
        add(_img(charts.get(f"top_denied_{s}"), f"most denied {s}"))
        add(_table(rows, ["vhost", "key", "count", "top_reason"]))

    add("<h2>4. Traffic</h2>")
    add(_img(charts.get("traffic"), "traffic per vhost"))
    add(_table(data.traffic, ["vhost", "group", "connections", "bytes_in", "bytes_out",
                              "transfers_in", "transfers_out", "duration_p50", "duration_p95",
                              "duration_p99", "duration_max"]))
    add(_img(charts.get("durations"), "duration distribution"))
    add(_img(charts.get("churn"), "churn"))

    add("<h2>5. Recommendations</h2>")
    add(f"<p>recommended = {_esc(data.recommendation_rule)}, at least 1, at most 65535 "
        "(connection rates: 1000000), of the samples the limit is checked against (per "
        "proxy process or fleet-wide, as for the headroom); each row names the key that "
        "decided it (<i>basis</i>), its percentile, its peak and when (see "
        "docs/spark-reports.md).</p>")
    lowered = sum(1 for r in data.recommendations if r.get("change") == "lower")
    if lowered:
        add(f"<p class=note>{lowered} recommendation(s) would <b>lower</b> a configured limit "
            "(marked <span class=lower>lower</span>): the observed peak needs less, but "
            "lowering leaves less headroom for growth and bursts the log did not see. Check "
            "them before applying.</p>")
    add(_table(data.recommendations,
               ["vhost", "group", "setting", "current", "recommended", "change", "basis",
                "percentile", "peak", "peak_ts"],
               row_class=_lowers))
    if data.policy_files:
        add("<p>Recommended policy, ready for <code>amqp-policy-proxy check --policy "
            "policy/</code>: " + ", ".join(f"<code>policy/{_esc(f)}</code>"
                                           for f in data.policy_files) + ".</p>")
    if data.policy_diff:
        add("<p>Its diff against the current policy (<code>policy.diff</code>):</p>")
        add(f"<pre class=diff>{html.escape(data.policy_diff)}</pre>")
    add("<h2>6. Admin actions</h2>")
    add("<p>Changes operators made through the admin interface (connections closed, vhosts "
        "paused and resumed), with the peer credentials of the admin client (uid and pid on "
        "the unix socket; the address over TCP). Full table: <code>admin_actions.csv</code>."
        "</p>")
    shown = data.admin_actions[-ADMIN_ROWS:]
    if len(data.admin_actions) > len(shown):
        add(f"<p class=note>{len(data.admin_actions):,} admin actions: the last "
            f"{len(shown):,} are shown.</p>")
    add(_table(shown, ["ts", "action", "vhost", "selector", "targets", "count", "result", "uid",
                       "pid", "peer", "description"]))
    parts += trend_sections(data, charts)
    if data.whatif is not None:
        add("<h2>What-if replay</h2>")
        add(f"<p>{data.whatif_total:,} connections would have been denied. Vhosts replayed "
            f"(the others could not have been denied): "
            f"{_esc(', '.join(data.whatif_replayed)) or 'none'}.</p>")
        if data.whatif_reasons:
            add(_table([{"reason": k, "denied": v} for k, v in data.whatif_reasons.items()],
                       ["reason", "denied"]))
        add("<p>Every denied connection (time, user, host, vhost, limit and reason): "
            "<code>whatif_denied.csv</code>; totals: <code>whatif_totals.csv</code>, "
            "<code>whatif_summary.json</code>.</p>")
        add(_img(charts.get("whatif"), "what-if denials"))
        add(_table(data.whatif, ["vhost", "scope", "key", "would_deny"]))
    add("</body></html>\n")
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as page:
        page.write("\n".join(parts))
    return path


# --------------------------------------------------------------------------------------------
# Churn, storms and forecasts: their charts and page sections.

#: Forecast charts drawn at most (the vhosts first, then the groups, as the job ranks them).
FORECAST_CHARTS = 8
#: Rows of the churn-period and storm tables shown on the page (the CSV files have them all).
TREND_ROWS = 50


def _parse_ts(v: Any) -> dt.datetime | None:
    """A datetime from an RFC 3339 string (the CSV rows) or a datetime; ``None`` otherwise."""
    if isinstance(v, dt.datetime):
        return v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
    if isinstance(v, str) and v:
        return dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    return None


def _window(data: ReportData) -> tuple[dt.datetime, dt.datetime] | None:
    a, b = _parse_ts(data.window_start), _parse_ts(data.window_end)
    return (a, b) if a is not None and b is not None else None


def chart_storms(storms: list[dict[str, Any]], span: tuple[dt.datetime, dt.datetime] | None,
                 img_dir: str, name: str = "storms") -> str | None:
    """Draw the storms on a time line: one stem per storm at its start, as high as its peak
    opens per second, one colour per vhost; the five highest are labelled with their top host.

    Args:
        storms: rows of storms.csv (``vhost``, ``start``, ``peak_opens_per_s``, ``top_host``).
        span: the report window (the x axis), or ``None`` for the storms' own range.
        img_dir: directory of the PNG files.
        name: file name without ``.png``.

    Returns:
        The image path relative to the page, or ``None`` when there is no storm.
    """
    if not storms:
        return None
    fig = _fig()
    ax = fig.add_subplot()
    by_vhost: dict[str, tuple[list[dt.datetime], list[float]]] = {}
    for r in storms:
        x = _parse_ts(r["start"])
        if x is None:
            continue
        xs, ys = by_vhost.setdefault(str(r["vhost"]), ([], []))
        xs.append(x)
        ys.append(float(r["peak_opens_per_s"]))
    for i, (vhost, (xs, ys)) in enumerate(sorted(by_vhost.items())):
        colour = f"C{i % 10}"
        ax.vlines(xs, 0, ys, colors=colour, linewidth=1.5)  # type: ignore[arg-type]
        ax.plot(xs, ys, "o", color=colour, label=vhost, markersize=4)  # type: ignore[arg-type]
    for r in sorted(storms, key=lambda r: -float(r["peak_opens_per_s"]))[:5]:
        x = _parse_ts(r["start"])
        ax.annotate(str(r.get("top_host") or ""), (x, float(r["peak_opens_per_s"])),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")
    if span is not None:
        ax.set_xlim(*span)  # type: ignore[arg-type]
    ax.set_ylim(bottom=0)
    ax.set_title("Connection storms: peak opens per second, at their start")
    ax.set_ylabel("opens/s")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.autofmt_xdate()
    return _save(fig, img_dir, name)


def chart_periods(periods: list[dict[str, Any]], span: tuple[dt.datetime, dt.datetime] | None,
                  img_dir: str, name: str = "churn_periods", rows: int = 20) -> str | None:
    """Draw flagged churn periods as bars on a time line, one row per key.

    Args:
        periods: rows of churn_periods.csv (``scope``, ``vhost``, ``key``, ``start``, ``end``).
        span: the report window (the x axis), or ``None``.
        img_dir: directory of the PNG files.
        name: file name without ``.png``.
        rows: keys shown at most (those with the most flagged minutes).

    Returns:
        The image path relative to the page, or ``None`` when there is no period. Periods
        shorter than 1/300 of the axis are drawn that wide, to stay visible.
    """
    if not periods:
        return None
    per_key: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {}
    minutes: dict[str, float] = {}
    for r in periods:
        a, b = _parse_ts(r["start"]), _parse_ts(r["end"])
        if a is None or b is None:
            continue
        label = r["vhost"] if r["scope"] == "vhost" else f"{r['vhost']}/{r['key']}"
        per_key.setdefault(str(label), []).append((a, b))
        minutes[str(label)] = minutes.get(str(label), 0.0) + (b - a).total_seconds() / 60
    if not per_key:
        return None
    keys = sorted(per_key, key=lambda k: -minutes[k])[:rows]
    lo = span[0] if span else min(a for k in keys for a, _ in per_key[k])
    hi = span[1] if span else max(b for k in keys for _, b in per_key[k])
    least = max((hi - lo) / 300, dt.timedelta(minutes=1))
    fig = _fig(9.0, max(2.0, 0.3 * len(keys) + 1.2))
    ax = fig.add_subplot()
    for i, k in enumerate(keys):
        bars = [(a, max(b - a, least)) for a, b in per_key[k]]
        ax.broken_barh(bars, (len(keys) - 1 - i - 0.4, 0.8), color="#cc3311")  # type: ignore[arg-type]
    ax.set_yticks(range(len(keys))[::-1], [k[:40] for k in keys], fontsize=7)
    ax.set_xlim(lo, hi)  # type: ignore[arg-type]
    ax.set_title("High connection churn: flagged periods")
    ax.grid(True, axis="x", alpha=0.3)
    fig.autofmt_xdate()
    return _save(fig, img_dir, name)


def chart_forecast(fc: Any, img_dir: str, name: str) -> str | None:
    """Draw one key's daily peaks, its forecast with 80 % and 95 % bands and its limit (a
    line, or a note when it is more than twice the chart's highest value).

    Args:
        fc: a :class:`~.forecast.KeyForecast`.
        img_dir: directory of the PNG files.
        name: file name without ``.png``.

    Returns:
        The image path relative to the page, or ``None`` when it has no days.
    """
    if not fc.days:
        return None
    fig = _fig(9.0, 3.2)
    ax = fig.add_subplot()
    hist = [d for d in fc.days if d.kind == "actual"]
    fut = [d for d in fc.days if d.kind == "forecast"]
    ax.plot([d.date for d in hist], [d.peak for d in hist], "-o", color="#4477aa",
            markersize=3, label="daily peak")
    if fut:
        xs = [d.date for d in fut]
        ax.fill_between(xs, [d.lower95 for d in fut], [d.upper95 for d in fut],
                        color="#ee7733", alpha=0.18, label="95 % interval")
        ax.fill_between(xs, [d.lower80 for d in fut], [d.upper80 for d in fut],
                        color="#ee7733", alpha=0.32, label="80 % interval")
        ax.plot(xs, [d.peak for d in fut], "--", color="#ee7733", label="forecast")
    title = f"{fc.scope} {fc.vhost}" + ("" if fc.scope == "vhost" else f"/{fc.key}")
    top = max([d.peak for d in fc.days] + [d.upper95 or 0.0 for d in fut] + [1.0])
    if fc.limit is not None:
        if fc.limit <= 2 * top:
            ax.axhline(fc.limit, color="#cc3311", linestyle="--", linewidth=1,
                       label=f"maxConnections {fc.limit:,}")
        else:  # far above: drawing it would flatten the series and its bands
            ax.set_ylim(0, top * 1.3)
            ax.text(0.99, 0.95, f"maxConnections {fc.limit:,}: above the chart",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8,
                    color="#cc3311")
        until = fc.days_until_limit
        title += (f": limit reached in {until} days" if until is not None
                  else ": limit not reached within the horizon")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("connections")
    if ax.get_ylim()[0] != 0:
        ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=3)
    fig.autofmt_xdate()
    return _save(fig, img_dir, name)


def _trend_charts(data: ReportData, img_dir: str, section: str) -> dict[str, str | None]:
    if section == "storms":
        span = _window(data)
        return {"storms": chart_storms(data.storms, span, img_dir),
                "churn_periods": chart_periods(data.churn_periods, span, img_dir)}
    out: dict[str, str | None] = {}
    for i, fc in enumerate(data.forecasts[:FORECAST_CHARTS]):
        out[f"forecast_{i}"] = chart_forecast(fc, img_dir, f"forecast_{i}")
    return out


def trend_sections(data: ReportData, charts: dict[str, str | None]) -> list[str]:
    """Return the HTML of the churn, storm and forecast sections (ids ``churn-periods``,
    ``storms``, ``forecast``; their charts ``img#chart-...``).

    Args:
        data: the extracts (``churn_*``, ``storm*``, ``forecast*`` fields).
        charts: the drawn charts (name -> path or ``None``).

    Returns:
        The page parts, in order.
    """
    def img(key: str, alt: str) -> str:
        path = charts.get(key)
        if path is None:
            return f"<p class=empty>No data for: {html.escape(alt)}.</p>"
        return (f'<img id="chart-{html.escape(key)}" src="{html.escape(path)}" '
                f'alt="{html.escape(alt)}">')

    p: list[str] = []
    p.append('<section id="churn-periods"><h2>7. Connection churn</h2>')
    p.append(f"<p>Rule (RabbitMQ cluster-operator <code>HighConnectionChurn</code>): "
             f"{_esc(data.churn_rule)}; per vhost and per client host of a vhost, per minute. "
             f"{len(data.churn_periods):,} flagged period(s). Tables: "
             "<code>churn_rates.csv</code>, <code>churn_periods.csv</code>, "
             "<code>churn_periods.json</code>.</p>")
    p.append(img("churn_periods", "flagged churn periods"))
    p.append(_table(data.churn_periods[:TREND_ROWS],
                    ["scope", "vhost", "key", "start", "end", "minutes", "opens", "closes",
                     "peak_churn_per_s", "peak_ratio", "max_connections"]))
    p.append("</section>")

    p.append('<section id="storms"><h2>8. Connection storms</h2>')
    p.append(f"<p>Rule: {_esc(data.storm_rule)}. {len(data.storms):,} storm(s). Rates that "
             "would have smoothed each storm: the p99 of the hour before it (vhost: over all "
             "seconds; user and host: over the seconds they opened connections), at least 1 "
             "per second. Tables: <code>storms.csv</code>, <code>storm_limits.csv</code> "
             "(and <code>.json</code>).</p>")
    p.append(img("storms", "storms on a time line"))
    p.append(_table(data.storms[:TREND_ROWS],
                    ["vhost", "start", "end", "opens", "peak_opens_per_s", "baseline_per_s",
                     "top_users", "top_hosts"]))
    shown = {r["storm_id"] for r in data.storms[:TREND_ROWS]}
    p.append("<h3>Connection rates that would have smoothed them</h3>")
    p.append(_table([r for r in data.storm_limits if r["storm_id"] in shown],
                    ["storm_id", "setting", "recommended", "pre_storm_p99_per_s",
                     "storm_peak_per_s", "over_rate_opens"]))
    p.append("</section>")

    p.append('<section id="forecast"><h2>9. Forecast</h2>')
    if data.forecast_days is None:
        p.append("<p class=empty>No forecast (<code>--no-forecast</code>, or no events).</p>")
    else:
        p.append(f"<p>Daily peak connections per vhost and group, {data.forecast_days} days "
                 "ahead: a structural time-series model (local linear trend, daily and weekly "
                 "seasonality; statsmodels) on the hourly peaks of the timeline, with 80 % and "
                 "95 % intervals. Days until the limit: the first day the forecast peak "
                 "reaches the vhost's <code>maxConnections</code> (upper 95 %: the earliest "
                 "it could). Tables: <code>forecast.csv</code>, "
                 "<code>forecast_limits.csv</code>, <code>forecast.json</code>.</p>")
        for i, fc in enumerate(data.forecasts[:FORECAST_CHARTS]):
            label = fc.vhost if fc.scope == "vhost" else f"{fc.vhost}/{fc.key}"
            p.append(img(f"forecast_{i}", f"forecast {fc.scope} {label}"))
        if not data.forecasts:
            p.append("<p class=empty>No key could be forecast.</p>")
        p.append(_table(data.forecast_limits,
                        ["scope", "vhost", "key", "limit", "last_peak", "forecast_peak_max",
                         "limit_date", "days_until_limit", "days_until_limit_upper95"]))
    p.append("</section>")
    return p
