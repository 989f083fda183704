"""``amqp-policy-proxy demo``: the embedded broker, the proxy with the demo policy, demo clients.

It shows one approved connection with messages flowing and three different denials, each with
the exact condition and description a client sees. With ``--keep-running`` the proxy and the
broker stay up until Ctrl-C and it prints how to connect your own client; without it, it says
that they have stopped. The proton reactor's INFO lines (the broker and the demo clients) are
held back, so the narration on stdout and the proxy's own log lines on stderr are all there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached

DEMO_USERS = {"alice": "alice-secret", "bob": "bob-secret", "mallory": "mallory-secret"}


def _policy_path() -> Path:
    """The demo policy, shipped inside the package (``demo/policy.json``, package data), so
    ``demo`` works from an installed wheel or the Debian package as well as from a checkout."""
    return Path(__file__).resolve().with_name("policy.json")


class _ProxyRunner:
    """The real daemon on its own uvloop in a background thread."""

    def __init__(self, config: Any) -> None:
        from ..daemon.app import Daemon

        self.daemon = Daemon(config)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="proxy", daemon=True)

    def _main(self) -> None:
        from ..daemon.loop import loop_factory

        loop = loop_factory()()
        self._loop = loop

        async def body() -> None:
            try:
                await self.daemon.start()
            except BaseException as exc:  # reported to the caller of start()
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self.daemon.serve()

        try:
            loop.run_until_complete(body())
        finally:
            loop.close()

    def start(self) -> int:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self.daemon.listen_addresses[0][1]

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(
                    functools.partial(self.daemon.request_stop, reason="demo finished"))
            except RuntimeError:
                pass
        self._thread.join(15)


def _connect(port: int, user: str | None, password: str | None = None,
             vhost: str = "demo") -> BlockingConnection:
    kwargs: dict[str, Any] = {"virtual_host": vhost, "allow_insecure_mechs": True}
    if user is None:
        kwargs["allowed_mechs"] = "ANONYMOUS"
    else:
        kwargs.update(user=user, password=password, allowed_mechs="PLAIN")
    return BlockingConnection(f"127.0.0.1:{port}", timeout=10, **kwargs)


def _say(text: str = "") -> None:
    print(text, flush=True)


def run_clients(port: int) -> int:
    """Run the demo clients against the proxy on ``port``; return the number of surprises."""
    surprises = 0
    _say("1) alice (SASL PLAIN, group 'traders') sends 3 orders and reads them back")
    conn = _connect(port, "alice", DEMO_USERS["alice"])
    sender = conn.create_sender("orders.eu")
    receiver = conn.create_receiver("orders.eu")
    bodies = [f"order {i}: 100 x ACME @ 42.{i}" for i in range(3)]
    for body in bodies:
        sender.send(Message(body=body))
    got = []
    for _ in bodies:
        msg = receiver.receive(timeout=10)
        got.append(msg.body)
        receiver.accept()
    conn.close()
    _say(f"   approved; received {len(got)} messages intact: {got == bodies}")
    surprises += got != bodies

    _say("2) mallory authenticates, but is in no group of vhost 'demo' (allowUnknownUser false)")
    try:
        _connect(port, "mallory", DEMO_USERS["mallory"]).close()
        _say("   UNEXPECTED: admitted")
        surprises += 1
    except ConnectionException as exc:
        _say(f"   denied at Open: {exc}")

    _say("3) alice asks for a receiver on 'payroll.salaries' (not in her sources)")
    conn = _connect(port, "alice", DEMO_USERS["alice"])
    try:
        conn.create_receiver("payroll.salaries")
        _say("   UNEXPECTED: attached")
        surprises += 1
    except LinkDetached as exc:
        _say(f"   link denied: {exc}")
    sender = conn.create_sender("alice.inbox")
    sender.send(Message(body="the connection is still usable"))
    _say("   ...and the same connection still sends to alice.inbox")
    conn.close()

    _say("4) alice sends a 100 KiB message (group maxMessageSize is 64 KiB)")
    conn = _connect(port, "alice", DEMO_USERS["alice"])
    sender = conn.create_sender("orders.bulk")
    try:
        sender.send(Message(body=b"x" * 102400))
        conn.create_sender("orders.more")
        _say("   UNEXPECTED: accepted")
        surprises += 1
    except Exception as exc:  # the delivery is rejected and the connection closed
        _say(f"   refused: {type(exc).__name__}: {exc}")
    try:
        conn.close()
    except Exception:
        pass
    return surprises


def _interrupt(signum: int, frame: object) -> None:
    """Signal handler: stop the demo as Ctrl-C does."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stopped_by_ctrl_c() -> Iterator[None]:
    """Make Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt while the demo keeps running,
    whatever the demo inherited: a process started in the background by a non-interactive
    shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt for it. The
    previous handlers are put back afterwards."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(*, keep_running: bool = False) -> int:
    """Run the whole demo; return 0 when every step behaved as expected."""
    from ..daemon.settings import Address, DaemonConfig, ListenerConfig, UpstreamConfig
    from ..policy.model import PolicySettings
    from .broker import Broker
    from .sasl import make_sasl_config

    # The embedded broker's and the demo clients' proton reactors log every connection at
    # INFO and every reset at ERROR ("Couldn't recv: ConnectionResetError": the proxy drops
    # the upstream side of a denied client). Both are expected here; the demo checks each
    # outcome itself and says so.
    logging.getLogger("proton").setLevel(logging.CRITICAL)
    workdir = Path(tempfile.mkdtemp(prefix="amqp-policy-proxy-demo-"))
    sasl = make_sasl_config(workdir / "sasl", DEMO_USERS)
    broker = Broker(sasl=sasl)
    broker.start()
    policy = _policy_path()
    config = DaemonConfig(
        listeners=(ListenerConfig(Address("127.0.0.1", 0)),),
        upstreams=(UpstreamConfig(Address("127.0.0.1", broker.port)),),
        policy_path=str(policy),
        policy=PolicySettings(),
        metrics_address=Address("127.0.0.1", 0),
        event_log_dir=str(workdir / "events"),
        shutdown_grace_seconds=3.0,
    )
    proxy = _ProxyRunner(config)
    try:
        port = proxy.start()
        metrics_port = proxy.daemon.metrics_server.port
        _say(f"embedded broker on 127.0.0.1:{broker.port}; proxy on 127.0.0.1:{port} "
             f"with policy {policy}")
        _say()
        surprises = run_clients(port)
        time.sleep(0.2)
        proxy.daemon.publish_now()
        _say()
        _say("demo finished: " + ("everything behaved as expected" if not surprises
                                  else f"{surprises} unexpected result(s)"))
        _say(f"event log: {workdir / 'events'}")
        if keep_running:
            try:
                _say()
                _say(f"the proxy is still running on 127.0.0.1:{port} (broker on "
                     f"127.0.0.1:{broker.port})")
                _say(f"metrics:   curl -s http://127.0.0.1:{metrics_port}/metrics "
                     "| grep amqp_proxy_")
                _say("connect your own client, e.g. with python-qpid-proton:")
                _say(f"   BlockingConnection('127.0.0.1:{port}', virtual_host='demo', "
                     f"user='alice', password='{DEMO_USERS['alice']}', allowed_mechs='PLAIN', "
                     "allow_insecure_mechs=True)")
                _say("   users: alice, bob (group traders); anonymous may read public.*")
                _say("press Ctrl-C to stop it.")
                with _stopped_by_ctrl_c():
                    while True:
                        time.sleep(1)
            except KeyboardInterrupt:
                _say()
        return 0 if not surprises else 1
    finally:
        proxy.stop()
        broker.stop()
        if not keep_running:
            shutil.rmtree(workdir, ignore_errors=True)
            _say("the proxy and the embedded broker have stopped; run "
                 "`amqp-policy-proxy demo --keep-running` to keep them up and connect your own "
                 "client.")
        else:
            _say(f"the proxy and the embedded broker have stopped; their files (SASL "
                 f"configuration, event log) stay in {workdir} for a look (remove it when done).")
