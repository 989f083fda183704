"""``amqp-policy-proxy run`` in one process: the daemon from start to exit.

With ``--workers N`` the supervising parent (:mod:`.workers`) runs instead and each worker
runs this.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from .app import Daemon
from .settings import ConfigError, DaemonConfig

__all__ = ["run_daemon"]


async def run_daemon(config: DaemonConfig) -> int:
    """Run until stopped; return the process exit code (0 clean, 1 runtime failure).

    With ``ledger = "auto"`` a private redis-server is started first and stopped last.

    Raises:
        ConfigError: ``ledger = "auto"`` and redis-server does not start.
    """
    private = None
    if config.ledger is not None and config.ledger.url == "auto":
        from ..fleet.private_redis import PrivateRedis, PrivateRedisError
        from .workers import die_with_parent

        # started from the main thread (before anything is served), so that it ends with
        # this process however it ends
        private = PrivateRedis(config.runtime_dir, preexec_fn=die_with_parent)
        try:
            url = private.start()
        except PrivateRedisError as exc:
            raise ConfigError([f"ledger: {exc}"]) from None
        config = replace(config, ledger=replace(config.ledger, url=url))
    try:
        daemon = Daemon(config)
        await daemon.start(announce=False)
        daemon.install_signal_handlers()
        daemon.announce_ready()
        await daemon.serve()
        return 0
    finally:
        if private is not None:
            await asyncio.to_thread(private.stop)
