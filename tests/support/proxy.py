"""Run a real proxy :class:`Daemon` on its own uvloop in a background thread (tests, demo, bench)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from amqp_policy_proxy.daemon.app import Daemon
from amqp_policy_proxy.daemon.config import (
    Address,
    DaemonConfig,
    ListenerConfig,
    UpstreamConfig,
)
from amqp_policy_proxy.daemon.loop import loop_factory
from amqp_policy_proxy.policy.load import load_policy
from amqp_policy_proxy.policy.model import PolicySettings


class ProxyThread:
    """A proxy listening on 127.0.0.1 (port 0 unless given), stopped by :meth:`stop`."""

    def __init__(
        self,
        upstreams: list[tuple[str, int]],
        *,
        policy_path: str | None = None,
        policy: Any = None,
        settings: PolicySettings | None = None,
        listen: list[tuple[str, int]] | None = None,
        metrics: bool = False,
        event_log_dir: str | None = None,
        handshake_seconds: float = 10.0,
        shutdown_grace_seconds: float = 5.0,
        config: DaemonConfig | None = None,
        kind: str = "other",
        identity: str = "strict",
    ) -> None:
        """Configure the proxy; nothing runs until :meth:`start`. ``kind`` and ``identity``
        are the upstreams' ``[[upstream]]`` keys of the same names."""
        settings = settings or PolicySettings()
        if policy is None and policy_path is not None:
            policy = load_policy(policy_path, settings)
        base = config or DaemonConfig()
        self.config = replace(
            base,
            listeners=base.listeners or tuple(
                ListenerConfig(Address(h, p)) for h, p in (listen or [("127.0.0.1", 0)])),
            upstreams=base.upstreams or tuple(
                UpstreamConfig(Address(h, p), kind=kind, identity=identity)
                for h, p in upstreams),
            policy_path=policy_path or base.policy_path,
            policy=settings,
            metrics_address=Address("127.0.0.1", 0) if metrics else base.metrics_address,
            event_log_dir=event_log_dir or base.event_log_dir,
            handshake_seconds=handshake_seconds,
            shutdown_grace_seconds=shutdown_grace_seconds,
        )
        self.events: list[Any] = []
        self._events_lock = threading.Lock()
        self.daemon = Daemon(self.config, policy=policy, event_sink=self._record)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = 0

    def _record(self, event: Any) -> None:
        with self._events_lock:
            self.events.append(event)

    def events_of(self, cls: type) -> list[Any]:
        """Events of one type seen so far (thread-safe copy)."""
        with self._events_lock:
            return [e for e in self.events if isinstance(e, cls)]

    def start(self) -> ProxyThread:
        """Start the loop thread and wait until the listeners are bound."""
        self._thread = threading.Thread(target=self._main, name="proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("proxy did not start")
        if self._error is not None:
            raise self._error
        self.port = self.daemon.listen_addresses[0][1]
        return self

    def _main(self) -> None:
        loop = loop_factory()()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def body() -> None:
            try:
                await self.daemon.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self.daemon.serve()

        try:
            loop.run_until_complete(body())
        finally:
            loop.close()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run ``fn`` on the proxy loop and return its result (coroutines are awaited)."""
        assert self._loop is not None

        async def wrapper() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(timeout)

    def reload(self) -> bool:
        """Reload the policy from ``policy_path`` as SIGHUP would."""
        return bool(self.call(self.daemon.reload))

    @property
    def metrics_port(self) -> int:
        """The bound metrics port."""
        server = self.daemon.metrics_server
        return int(server.port) if server is not None else 0

    def stop(self, timeout: float = 20.0) -> None:
        """Drain and stop; joins the thread. Idempotent."""
        if self._thread is None:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.daemon.request_stop)
            except RuntimeError:
                pass
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
