"""[event_log] compact_after: the compaction runs in a subprocess; the event loop never waits."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from amqp_policy_proxy.daemon.compaction import Compactor, compact_command

# A stand-in for one compaction run: a real subprocess that takes a while and logs a line.
SLOW = ("import sys, time; open(sys.argv[1], 'a').write('start\\n'); time.sleep(0.4); "
        "open(sys.argv[1], 'a').write('end\\n'); print('compacted 3 hours', file=sys.stderr)")


def test_the_command_is_report_compact_with_the_grace():
    cmd = compact_command("/var/log/amqp/events", 900.0)
    assert cmd[0] == sys.executable
    assert cmd[1:] == ["-m", "amqp_policy_proxy", "report", "compact", "--events",
                       "/var/log/amqp/events", "--grace", "900", "--master", "local[1]"]


def test_runs_in_a_subprocess_one_at_a_time_without_blocking_the_loop(tmp_path: Path):
    trace = tmp_path / "trace"

    async def scenario() -> tuple[int, int, int]:
        compactor = Compactor([sys.executable, "-c", SLOW, str(trace)], first_delay=0.0,
                              interval=0.1)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.get_running_loop().create_task(tick())
        compactor.start()
        while compactor.runs < 2:
            await asyncio.sleep(0.02)
        await compactor.stop()
        ticker.cancel()
        return ticks, compactor.runs, compactor.failures

    ticks, runs, failures = asyncio.run(scenario())
    assert runs >= 2 and failures == 0
    assert ticks > 40  # the loop went on ticking during the >= 0.8 s of runs
    lines = trace.read_text().split()
    # never two at once: start, end, start, end, ... (the last may be cut by the stop)
    assert lines[:4] == ["start", "end", "start", "end"]


def test_stop_terminates_a_running_compaction_and_failures_are_counted(tmp_path: Path):
    async def scenario() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        failing = Compactor([sys.executable, "-c", "import sys; sys.exit(3)"])
        assert await failing.run_once() == 3 and failing.failures == 1
        hung = Compactor([sys.executable, "-c", "import time; time.sleep(60)"],
                         first_delay=0.0)
        hung.start()
        await asyncio.sleep(0.3)
        began = loop.time()
        await hung.stop()
        return failing.failures, loop.time() - began

    failures, stopped_in = asyncio.run(scenario())
    assert failures == 1 and stopped_in < 5
