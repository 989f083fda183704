"""Forecast of the daily peak connections per vhost and group, and the days until a limit.
Imports statsmodels and numpy (lazily, in :func:`forecast_series`), no Spark.

Layer: the capacity reports (``report capacity``), never imported by the daemon. Runs on the
**driver** on a small series: the job reduces the ``timeline`` table (vhost and group
samples per grid bucket) to one peak per key and hour with Spark and collects that (keys x
hours of the window: about 4 000 values for 24 keys and a week); nothing here scales with
the number of events.

The model (statsmodels ``UnobservedComponents``, a structural time series fitted by maximum
likelihood with the Kalman filter): a local linear trend (level and slope that drift) plus
two trigonometric seasonal components, daily (period 24 h, 4 harmonics) and weekly (period
168 h, 3 harmonics; only with at least :data:`WEEKLY_MIN_HOURS` of history), on
``log(1 + peak)`` of the hourly peaks (so weekly and daily swings and growth are relative, and
the forecast never goes below 0). A day's peak is a maximum over its hours, whose
distribution is not the maximum of the hourly intervals: the model simulates
:data:`SIMULATIONS` future paths from the end of the history (``simulate(anchor="end")``,
with a fixed seed: the same input gives the same forecast), and each forecast day reports the
median of the paths' daily maxima (``peak``) and their 10-90 % and 2.5-97.5 % quantiles (the
80 % and 95 % intervals).

**Days until the limit**: the first forecast day whose peak forecast reaches the limit
(``limit_date``, ``days_until_limit`` counted from the last day of history; ``None`` when it
does not within the horizon), and the same for the upper 95 % bound
(``days_until_limit_upper95``: the earliest the limit could be reached).
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Hourly points needed for a forecast at all (two days).
MIN_HOURS = 48
#: Hourly points needed for the weekly seasonal component (two weeks).
WEEKLY_MIN_HOURS = 2 * 168
#: Harmonics of the daily and weekly trigonometric seasonal components.
DAILY_HARMONICS = 4
WEEKLY_HARMONICS = 3
#: Simulated future paths per key (their daily maxima give the forecast and its intervals).
SIMULATIONS = 500


@dataclass(frozen=True)
class DayForecast:
    """One day of a forecast (or of the history it was fitted on)."""

    date: dt.date
    """The UTC day."""
    kind: str
    """``actual`` (history: the observed daily peak) or ``forecast``."""
    peak: float
    """The observed daily peak, or the forecast's (median of the simulated daily maxima)."""
    lower80: float | None = None
    """Lower bound of the 80 % interval (forecast days only)."""
    upper80: float | None = None
    """Upper bound of the 80 % interval."""
    lower95: float | None = None
    """Lower bound of the 95 % interval."""
    upper95: float | None = None
    """Upper bound of the 95 % interval."""


@dataclass(frozen=True)
class KeyForecast:
    """The forecast of one key and when it reaches its limit."""

    scope: str
    """``vhost`` or ``group``."""
    vhost: str
    """The vhost."""
    key: str
    """The vhost, or the group name."""
    days: list[DayForecast] = field(default_factory=list)
    """History then forecast, one entry per day, in date order."""
    limit: int | None = None
    """The configured limit compared with (vhost ``maxConnections``), or ``None``."""
    model: str = ""
    """What was fitted, e.g. ``local linear trend + daily + weekly seasonal``."""
    limit_date: dt.date | None = None
    """First forecast day whose peak forecast reaches ``limit``, or ``None``."""
    days_until_limit: int | None = None
    """Days from the last day of history to ``limit_date``, or ``None``."""
    days_until_limit_upper95: int | None = None
    """Days until the upper 95 % bound reaches ``limit``, or ``None``."""


def forecast_series(hours: Sequence[dt.datetime], peaks: Sequence[float], horizon_days: int,
                    limit: int | None = None) -> tuple[list[DayForecast], str, int | None,
                                                        int | None, dt.date | None]:
    """Fit the model to an hourly peak series and forecast the daily peaks.

    Args:
        hours: the start of every hour of the history, consecutive (UTC, aware or naive UTC);
            missing hours must be filled by the caller (with 0: no connection).
        peaks: the peak concurrency of each hour (same length as ``hours``).
        horizon_days: how many whole UTC days after the last day of history to forecast
            (>= 1). The forecast starts at the hour after the last one; a partial last day of
            history is completed by the forecast but reported as ``actual``.
        limit: the limit to look for in the forecast, or ``None``.

    Returns:
        ``(days, model, days_until_limit, days_until_limit_upper95, limit_date)``: the days
        (history, then ``horizon_days`` forecast days) and the model description.

    Raises:
        ValueError: fewer than :data:`MIN_HOURS` points, lengths differ, or a horizon < 1.
    """
    import numpy as np
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    if len(hours) != len(peaks):
        raise ValueError("hours and peaks differ in length")
    if len(hours) < MIN_HOURS:
        raise ValueError(f"a forecast needs at least {MIN_HOURS} hours of history")
    if horizon_days < 1:
        raise ValueError("the forecast horizon must be at least one day")
    y = np.asarray(peaks, dtype=float)
    if (y < 0).any() or not np.isfinite(y).all():
        raise ValueError("the peaks must be finite and not negative")
    seasonal = [{"period": 24, "harmonics": DAILY_HARMONICS}]
    model = "local linear trend + daily seasonal"
    if len(y) >= WEEKLY_MIN_HOURS:
        seasonal.append({"period": 168, "harmonics": WEEKLY_HARMONICS})
        model += " + weekly seasonal"
    last = hours[-1]
    last_day = last.date()
    end = dt.datetime.combine(last_day + dt.timedelta(days=horizon_days + 1), dt.time(),
                              tzinfo=last.tzinfo)
    steps = int((end - last) / dt.timedelta(hours=1)) - 1
    with warnings.catch_warnings():  # convergence chatter of the optimiser
        warnings.simplefilter("ignore")
        fitted = UnobservedComponents(np.log1p(y), level="local linear trend",
                                      freq_seasonal=seasonal).fit(disp=False)
        paths = np.asarray(fitted.simulate(steps, repetitions=SIMULATIONS, anchor="end",
                                           rng=np.random.default_rng(0)))
    # (steps, 1, repetitions) or (steps, repetitions): one column per path
    paths = np.expm1(np.clip(paths.reshape(steps, -1), None, 50.0))
    history: dict[dt.date, float] = {}
    for h, v in zip(hours, y, strict=True):
        history[h.date()] = max(history.get(h.date(), 0.0), float(v))
    days = [DayForecast(d, "actual", p) for d, p in sorted(history.items())]
    per_day: dict[dt.date, list[int]] = {}
    for i in range(steps):
        d = (last + dt.timedelta(hours=i + 1)).date()
        if d > last_day:
            per_day.setdefault(d, []).append(i)
    until = until95 = None
    limit_date = None
    for n, (d, idx) in enumerate(sorted(per_day.items()), start=1):
        daily_max = paths[idx].max(axis=0)
        q = [max(0.0, float(v)) for v in np.quantile(daily_max, [0.5, 0.1, 0.9, 0.025, 0.975])]
        day = DayForecast(d, "forecast", q[0], q[1], q[2], q[3], q[4])
        days.append(day)
        if limit is not None:
            if until is None and day.peak >= limit:
                until, limit_date = n, d
            if until95 is None and (day.upper95 or 0.0) >= limit:
                until95 = n
    return days, model, until, until95, limit_date


def forecast_keys(series: dict[tuple[str, str, str], tuple[list[dt.datetime], list[float]]],
                  horizon_days: int, limits: dict[str, int] | None = None,
                  ) -> tuple[list[KeyForecast], list[str]]:
    """Forecast every key of a set of hourly peak series.

    Args:
        series: ``(scope, vhost, key)`` -> (hour starts, hourly peaks), as for
            :func:`forecast_series` (consecutive hours).
        horizon_days: days to forecast (>= 1).
        limits: vhost -> ``maxConnections`` (compared with the ``vhost`` scope; groups have no
            connection limit of their own).

    Returns:
        ``(forecasts, notes)``: one :class:`KeyForecast` per key that could be fitted, in
        key order, and the notes: one for all the keys with too short a history, one per key
        the model failed on.
    """
    out: list[KeyForecast] = []
    notes: list[str] = []
    short = [k for k, (h, _) in series.items() if len(h) < MIN_HOURS]
    if short:
        notes.append(f"No forecast for {len(short)} key(s): fewer than {MIN_HOURS} hours of "
                     "history.")
    for (scope, vhost, key), (hours, peaks) in sorted(series.items()):
        if len(hours) < MIN_HOURS:
            continue
        limit = (limits or {}).get(vhost) if scope == "vhost" else None
        try:
            days, model, until, until95, when = forecast_series(hours, peaks, horizon_days,
                                                                limit)
        except (ValueError, np_linalg_error()) as e:
            notes.append(f"No forecast for {scope} {vhost}/{key}: {e}")
            continue
        if not all(math.isfinite(d.peak) for d in days):
            notes.append(f"No forecast for {scope} {vhost}/{key}: the model diverged")
            continue
        out.append(KeyForecast(scope, vhost, key, days, limit, model, when, until, until95))
    return out, notes


def np_linalg_error() -> type[Exception]:
    """Return numpy's ``LinAlgError`` (the optimiser's failure on a degenerate series)."""
    import numpy as np

    return np.linalg.LinAlgError
