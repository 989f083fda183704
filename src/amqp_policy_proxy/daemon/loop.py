"""Event loop selection: uvloop when importable, else the stdlib loop (uvicorn ``loops/auto``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """Return a factory for uvloop's loop, or asyncio's default when uvloop is missing."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh (uv)loop and return its result."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
