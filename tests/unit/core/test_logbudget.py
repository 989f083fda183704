"""The denial-line budget of one connection (issue 28, denial floods)."""

from __future__ import annotations

import logging

from amqp_policy_proxy.core.logbudget import BURST, INTERVAL, LogBudget

LOGGER = logging.getLogger("amqp_policy_proxy.core.test")


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER.name]


def test_the_first_lines_are_logged_in_full_then_one_summary_per_interval(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    budget = LogBudget()
    for i in range(1000):
        budget.log(LOGGER, "c1", i * 0.01, "[c1] DENY %d", i)
    got = lines(caplog)
    assert got[:BURST] == [f"[c1] DENY {i}" for i in range(BURST)]
    summaries = got[BURST:]
    # 1000 denials over ~10 s: at most one summary per INTERVAL seconds.
    assert len(summaries) <= 1 + int(10 / INTERVAL)
    assert all("more denial lines" in s for s in summaries)


def test_the_summary_counts_every_line_left_out_and_the_end_flushes_the_rest(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    budget = LogBudget()
    n = BURST + 25
    for i in range(n):
        budget.log(LOGGER, "c2", 1.0, "[c2] DENY %d", i)
    budget.flush(LOGGER, "c2", 3.0)
    got = lines(caplog)
    assert len(got) == BURST + 1
    assert got[-1].startswith("[c2] 25 more denial lines")
    # Nothing left out: a second flush is silent.
    budget.flush(LOGGER, "c2", 4.0)
    assert len(lines(caplog)) == BURST + 1


def test_a_long_flood_logs_a_bounded_number_of_lines(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    budget = LogBudget()
    seconds = 120
    for i in range(100_000):
        budget.log(LOGGER, "c3", i * seconds / 100_000, "[c3] DENY")
    budget.flush(LOGGER, "c3", float(seconds))
    got = lines(caplog)
    assert len(got) <= BURST + seconds / INTERVAL + 2
    left_out = sum(int(s.split()[1]) for s in got[BURST:])
    assert left_out == 100_000 - BURST
