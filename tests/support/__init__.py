"""Test support: private real peers (RabbitMQ, HAProxy) and small helpers such as free ports.

Every server started from here binds 127.0.0.1 only and stops itself: at interpreter exit
(``atexit``) and, should the test process die without running ``atexit`` (SIGKILL, SIGTERM),
through a small detached watchdog (:func:`spawn_watchdog`) that runs the server's cleanup once
the test process is gone.
"""

from __future__ import annotations

import os
import pwd
import subprocess

__all__ = ["ME", "spawn_watchdog", "stop_watchdog"]

ME = pwd.getpwuid(os.geteuid()).pw_name
"""This process's user name. Tests pass ``check --as-user ME``: run as root, ``check`` would
otherwise check the files as the service user (when it exists on the machine), who cannot
read a test's private temporary directory."""

_WATCHDOG = r"""
p={pid}
alive() {{
    s=$(sed -e 's/^.*) //' -e 's/ .*//' /proc/$p/stat 2>/dev/null) || return 1
    [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}}
while alive; do sleep 0.5; done
{cleanup}
"""


def spawn_watchdog(cleanup: str, *, pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start a detached ``/bin/sh`` that runs ``cleanup`` once process ``pid`` has exited.

    The watchdog lives in its own session, so signals aimed at the test process group do not
    reach it. Kill it (``proc.kill(); proc.wait()``) after a normal shutdown.

    Args:
        cleanup: shell commands to run when ``pid`` is gone (quote arguments with
            :func:`shlex.quote`).
        pid: the process to watch; this process by default.

    Returns:
        The watchdog process.
    """
    script = _WATCHDOG.format(pid=os.getpid() if pid is None else pid, cleanup=cleanup)
    return subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def stop_watchdog(proc: subprocess.Popen[bytes] | None) -> None:
    """Kill a watchdog from :func:`spawn_watchdog` without running its cleanup.

    Args:
        proc: the watchdog, or ``None`` (nothing to do).
    """
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
