"""``[event_log] compact_after``: run ``report compact`` on the event log, in a subprocess.

Shell-side. The compaction (``amqp-policy-proxy report compact``, Spark) runs in its own
process, started with :func:`asyncio.create_subprocess_exec`, so the event loop only waits
for it asynchronously and never blocks: a minute after the daemon starts, then every hour,
one run at a time. A failed run (no Spark installed, a disk error) logs one warning with the
command's last line and the next run tries again. On stop a running compaction gets SIGTERM
(the compaction is safe to interrupt at any point: a later run finishes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["Compactor", "compact_command"]

logger = logging.getLogger(__name__)

FIRST_DELAY = 60.0
"""Seconds after the start before the first run (the daemon's own start comes first)."""
INTERVAL = 3600.0
"""Seconds between the starts of two runs."""


def compact_command(directory: str, grace: float) -> list[str]:
    """Return the command line of one compaction run.

    Args:
        directory: ``[event_log] directory``.
        grace: ``[event_log] compact_after`` (seconds after its end an hour is compacted).

    Returns:
        This interpreter running ``amqp_policy_proxy report compact`` on one local core.
    """
    return [sys.executable, "-m", "amqp_policy_proxy", "report", "compact", "--events",
            directory, "--grace", f"{grace:g}", "--master", "local[1]"]


class Compactor:
    """Runs a command now and then in a subprocess, never two at once, never blocking the loop.

    Args:
        command: the command line (:func:`compact_command`).
        first_delay: seconds before the first run.
        interval: seconds between the starts of two runs.
    """

    def __init__(self, command: Sequence[str], *, first_delay: float = FIRST_DELAY,
                 interval: float = INTERVAL) -> None:
        self.command = list(command)
        self.first_delay = first_delay
        self.interval = interval
        self.runs = 0
        """Runs finished so far."""
        self.failures = 0
        """Runs that exited with a non-zero code so far."""
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None

    def start(self) -> None:
        """Start the schedule on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="compactor")

    async def stop(self) -> None:
        """Stop the schedule; a running compaction gets SIGTERM and is waited for."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def run_once(self) -> int:
        """Run the command once and wait for it (asynchronously); return its exit code."""
        proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        self._proc = proc
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
            raise
        finally:
            self._proc = None
        self.runs += 1
        code = proc.returncode if proc.returncode is not None else -1
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        if code == 0:
            logger.info("event log compaction done%s",
                        f": {lines[-1]}" if lines else "")
        else:
            self.failures += 1
            logger.warning("event log compaction failed (exit code %d)%s", code,
                           f": {lines[-1]}" if lines else "")
        return code

    async def _run(self) -> None:
        await asyncio.sleep(self.first_delay)
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await self.run_once()
            except OSError as exc:  # the interpreter cannot be started
                self.failures += 1
                logger.warning("event log compaction could not start: %s", exc)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - began)))
