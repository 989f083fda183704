"""Daemon layer: validate the configuration in a short-lived child, keep the schema out of ``run``.

The TOML schema (:mod:`.config`) is built on pydantic, which with its models holds about 10 MiB
of a process for as long as it lives. The daemon needs it once: a reload re-reads the policy
and the TLS files, never the daemon's own file (a change there needs a restart). So ``run``
forks, validates in the child and takes back the result: the frozen dataclasses of
:mod:`.settings`, pickled through a pipe, or the :class:`~.settings.ConfigError` (every problem,
as ``file: key.path: reason``) to print and exit 2 with, exactly as an in-process validation
would. Only what pickles crosses; the child exits with ``os._exit`` so nothing of the parent
(atexit handlers, buffered output) runs twice.

It validates in-process instead whenever a child would save nothing or would not be safe: the
schema library is already loaded (a test calling ``run`` in its own interpreter), other threads
run (a fork copies their locks but not the threads), or the platform has no ``fork``.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from .settings import ConfigError

__all__ = ["SCHEMA_LIBRARY", "validate_apart"]

SCHEMA_LIBRARY = "pydantic"
"""The top-level module the schema needs and the daemon should not keep loaded."""

_T = TypeVar("_T")


def _in_child_saves_something() -> bool:
    return (hasattr(os, "fork") and SCHEMA_LIBRARY not in sys.modules
            and threading.active_count() == 1)


def validate_apart(func: Callable[..., _T], *args: object) -> _T:
    """Return ``func(*args)`` computed in a forked child (or here, see the module docstring).

    ``func`` runs in the child exactly as it would here (same working directory, user,
    environment and open files: the file checks give the same answers); its return value and
    any exception it raises cross back pickled, so both must pickle (the :mod:`.settings`
    classes and :class:`ConfigError` do).

    Raises:
        Whatever ``func`` raised, re-raised here (its traceback stays in the child).
        ConfigError: the child died before answering (killed, out of memory), with its status.
    """
    if not _in_child_saves_something():
        return func(*args)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe and leave without running anything else
        os.close(read_end)
        status = 0
        try:
            try:
                answer: tuple[bool, object] = (True, func(*args))
            except BaseException as exc:  # noqa: BLE001 - every outcome crosses back
                answer = (False, exc)
            try:
                data = pickle.dumps(answer)
            except Exception as exc:  # noqa: BLE001 - say what did not cross
                data = pickle.dumps((False, RuntimeError(f"validation result does not pickle: "
                                                         f"{exc!r}")))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
        except BaseException:  # noqa: BLE001 - the parent reports the missing answer
            status = 70
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    if not data:
        raise ConfigError([f"the configuration could not be validated: the checking process "
                           f"{_ended(wait_status)} without an answer"])
    ok, value = pickle.loads(data)  # noqa: S301 - our own child, through our own pipe
    if ok:
        return value
    assert isinstance(value, BaseException)
    raise value


def _ended(wait_status: int) -> str:
    code = os.waitstatus_to_exitcode(wait_status)  # negative: the signal that ended it
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
