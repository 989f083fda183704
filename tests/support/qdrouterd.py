"""A private, real qdrouterd 1.19 (Qpid Dispatch Router) with no policy of its own, for tests.

The router is built once by ``scripts/install-qdrouterd.sh`` (``make test`` runs it) into a
cache directory; its ``qdr-env.sh`` says where the binary, its Python modules and the
Cyrus-enabled proton library are. :func:`qdr_env` finds that file (``$AMQP_PROXY_QDR_ENV``,
``$AMQP_PROXY_QDR_PREFIX/qdr-env.sh``, ``~/.cache/amqp-policy-proxy/qdr-1.19.0/qdr-env.sh``,
``/opt/qdr-env.sh``).

:class:`Qdrouterd` writes a config directory of its own: a Cyrus SASL config ``qdrouterd.conf``
and a sasldb whose users live in the realm ``QDR.test`` (so a client logs in as
``alice@QDR.test`` and the router records that name, as on a production router with a realm),
and a router config with two listeners on 127.0.0.1:

* ``port``: the client listener the proxy points at: ``authenticatePeer: yes``, SASL PLAIN and
  SCRAM from the sasldb, no ``policy`` section (the router enforces nothing);
* ``admin_port``: a test-only listener without authentication that the tests use as the oracle
  (management ``QUERY`` of links, addresses and connections, and receivers that see where a
  message really arrives). Production routers never have it.

Every process it starts binds 127.0.0.1 only and ends with the test process (``atexit`` and a
detached watchdog). Typical use::

    with Qdrouterd({"alice": "secret"}) as router:
        router.port             # for the proxy's upstream
        router.query("org.apache.qpid.dispatch.router.link", ["owningAddr", "linkDir"])

Quirks: about 0.3-1 s from start to an accepting listener on the 2-core test machines; the
router logs to ``workdir/qdrouterd.log`` (:meth:`Qdrouterd.log_tail` in failures).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from amqp_policy_proxy.demo.sasl import make_sasl_config

from . import spawn_watchdog, stop_watchdog
from .ports import free_port

__all__ = ["REALM", "Management", "Qdrouterd", "QdrouterdError", "RouterRecord", "qdr_env",
           "router_command", "unavailable_reason"]

#: The SASL realm of the router's users: a client logs in as ``name@QDR.test``.
REALM = "QDR.test"

_LIVE: weakref.WeakSet[Qdrouterd] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


class QdrouterdError(RuntimeError):
    """The router could not be started or queried; the message carries the tail of its log."""


def _env_candidates() -> list[Path]:
    out: list[Path] = []
    if os.environ.get("AMQP_PROXY_QDR_ENV"):
        out.append(Path(os.environ["AMQP_PROXY_QDR_ENV"]))
    if os.environ.get("AMQP_PROXY_QDR_PREFIX"):
        out.append(Path(os.environ["AMQP_PROXY_QDR_PREFIX"]) / "qdr-env.sh")
    out.append(Path.home() / ".cache" / "amqp-policy-proxy" / "qdr-1.19.0" / "qdr-env.sh")
    out.append(Path("/opt/qdr-env.sh"))
    return out


def qdr_env() -> dict[str, str] | None:
    """The variables of the first ``qdr-env.sh`` found (``export K=V`` lines), or ``None``."""
    for path in _env_candidates():
        if not path.is_file():
            continue
        env: dict[str, str] = {}
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("export ") and "=" in line:
                key, _, value = line[len("export "):].partition("=")
                env[key.strip()] = value.strip().strip('"')
        if env.get("QDR_HOME") and Path(env["QDR_HOME"], "sbin", "qdrouterd").exists():
            return env
    return None


def unavailable_reason() -> str | None:
    """Say in one line why a real qdrouterd cannot run here, or ``None`` when it can."""
    if qdr_env() is None:
        return ("no qdrouterd build (run scripts/install-qdrouterd.sh; it needs the "
                "qdrouterd release sources of the shared material)")
    if shutil.which("saslpasswd2") is None:
        return "saslpasswd2 (Debian sasl2-bin) is not installed"
    return None


def router_command(conf: Path) -> tuple[list[str], dict[str, str]]:
    """The argument list and environment that run this machine's qdrouterd build on the
    config file ``conf`` (``qdrouterd -c conf``, with the build's Python modules and
    Cyrus-enabled proton library).

    Raises:
        QdrouterdError: no build (see :func:`unavailable_reason`).
    """
    env_vars = qdr_env()
    if env_vars is None:
        raise QdrouterdError(unavailable_reason() or "no qdrouterd")
    env = dict(os.environ)
    env["PYTHONPATH"] = env_vars.get("QDR_PYTHONPATH", "")
    env["LD_LIBRARY_PATH"] = env_vars.get("QDR_LD_LIBRARY_PATH", "")
    binary = Path(env_vars["QDR_HOME"], "sbin", "qdrouterd")
    return [str(binary), "-c", str(conf)], env


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        routers = list(_LIVE)
    for router in routers:
        with contextlib.suppress(Exception):
            router.stop()


atexit.register(_stop_all_at_exit)


class Qdrouterd:
    """One private qdrouterd on 127.0.0.1 with a client listener and a test-only admin listener.

    Args:
        users: plain user name -> password; each is created as ``name@QDR.test``.
        realm: the users' realm; None: Cyrus's default realm (the host name), so that clients
            log in, and the router records them, with plain names.
        mechs: the client listener's SASL mechanisms.
        extra_config: more qdrouterd config sections, appended verbatim (e.g. ``address``).
        router_id: the router's id (also the ``_topo`` area/router name).

    Attributes:
        port: the client listener (authenticated, the proxy's upstream).
        admin_port: the unauthenticated test-only listener (oracle queries).
        workdir: the private directory (config, sasldb, log) while the router exists.
        start_seconds: wall-clock seconds the last :meth:`start` took.
    """

    def __init__(
        self,
        users: Mapping[str, str],
        *,
        mechs: Sequence[str] = ("PLAIN", "SCRAM-SHA-1", "SCRAM-SHA-256"),
        extra_config: str = "",
        router_id: str = "QDR.test",
        realm: str | None = REALM,
    ) -> None:
        self.users = dict(users)
        self.realm = realm
        self.mechs = tuple(mechs)
        self.extra_config = extra_config
        self.router_id = router_id
        self.port = free_port("127.0.0.1")
        self.admin_port = free_port("127.0.0.1")
        self.workdir: Path | None = None
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        """The client listener as ``(host, port)``."""
        return ("127.0.0.1", self.port)

    @property
    def admin_url(self) -> str:
        """The test-only unauthenticated listener as an AMQP URL."""
        return f"amqp://127.0.0.1:{self.admin_port}"

    def _write_config(self, workdir: Path) -> Path:
        sasl_dir = workdir / "sasl"
        sasl_dir.mkdir()
        # ANONYMOUS only for the admin listener (each listener narrows the list)
        make_sasl_config(sasl_dir, self.users, name="qdrouterd",
                         mechs=(*self.mechs, "ANONYMOUS"), realm=self.realm)
        conf = workdir / "qdrouterd.conf"
        conf.write_text(f"""\
router {{
    mode: standalone
    id: {self.router_id}
    saslConfigDir: {sasl_dir}
    saslConfigName: qdrouterd
}}
listener {{
    host: 127.0.0.1
    port: {self.port}
    role: normal
    authenticatePeer: yes
    saslMechanisms: {' '.join(self.mechs)}
}}
listener {{
    host: 127.0.0.1
    port: {self.admin_port}
    role: normal
    authenticatePeer: no
    saslMechanisms: ANONYMOUS
}}
address {{
    prefix: multicast
    distribution: multicast
}}
log {{
    module: DEFAULT
    enable: info+
    outputFile: {workdir / 'qdrouterd.log'}
}}
{self.extra_config}
""")
        return conf

    def start(self, timeout: float = 30.0) -> Qdrouterd:
        """Write the config, start the router and wait until both listeners accept.

        Raises:
            QdrouterdError: no build (see :func:`unavailable_reason`), or the router exited or
                did not listen within ``timeout`` seconds (with the tail of its log).
        """
        if qdr_env() is None:
            raise QdrouterdError(unavailable_reason() or "no qdrouterd")
        started = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix="amqp-proxy-qdr-"))
        argv, env = router_command(self._write_config(self.workdir))
        self._proc = subprocess.Popen(
            argv, env=env, cwd=self.workdir,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "stderr.log", "wb"),  # noqa: SIM115 - child keeps it
        )
        self._watchdog = spawn_watchdog(
            f"kill -9 {self._proc.pid} 2>/dev/null; rm -rf {shlex.quote(str(self.workdir))}")
        with _LIVE_LOCK:
            _LIVE.add(self)
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise QdrouterdError(f"qdrouterd exited with {self._proc.returncode}:\n{tail}")
            if all(_accepts(p) for p in (self.port, self.admin_port)):
                self.start_seconds = time.monotonic() - started
                return self
            time.sleep(0.05)
        tail = self.log_tail()
        self.stop()
        raise QdrouterdError(f"qdrouterd did not listen within {timeout} s:\n{tail}")

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the router's log and stderr (for failure messages)."""
        if self.workdir is None:
            return ""
        out = []
        for name in ("stderr.log", "qdrouterd.log"):
            path = self.workdir / name
            if path.exists():
                out += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    def log_text(self) -> str:
        """The router's whole log so far."""
        if self.workdir is None:
            return ""
        path = self.workdir / "qdrouterd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop the router (SIGTERM, then SIGKILL after 5 s) and remove its directory."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            stop_watchdog(self._watchdog)
            self._watchdog = None
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> Qdrouterd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the oracle ------------------------------------------------------------------------

    def query(self, entity_type: str, attributes: Sequence[str] = (),
              timeout: float = 10.0) -> list[dict[str, Any]]:
        """Run a management ``QUERY`` over the admin listener; one dict per entity.

        Args:
            entity_type: e.g. ``org.apache.qpid.dispatch.router.link``,
                ``org.apache.qpid.dispatch.router.address``, ``org.apache.qpid.dispatch.connection``.
            attributes: the attribute names to return (all when empty).

        Raises:
            QdrouterdError: the agent answered with a status other than 200.
        """
        with self.management(timeout) as agent:
            return agent.query(entity_type, attributes)

    def management(self, timeout: float = 10.0) -> Management:
        """A management client on one admin connection, for many queries (close it)."""
        return Management(self.admin_url, timeout)

    def _client_connection_ids(self) -> set[Any]:
        rows = self.query("org.apache.qpid.dispatch.connection", ["identity", "user", "role"])
        # the oracle's own connections are the unauthenticated ones (user "anonymous")
        return {r["identity"] for r in rows if r["role"] == "normal" and r["user"] != "anonymous"}

    def link_addresses(self, direction: str | None = None) -> list[str]:
        """The ``owningAddr`` of every endpoint link of client connections (hash form, e.g.
        ``M0secret.a``), optionally only ``in`` or ``out`` links (the router's view).

        The oracle's own links (admin listener) are left out.
        """
        clients = self._client_connection_ids()
        rows = self.query("org.apache.qpid.dispatch.router.link",
                          ["linkType", "linkDir", "owningAddr", "connectionId"])
        return [r["owningAddr"] for r in rows
                if r["linkType"] == "endpoint" and r["connectionId"] in clients
                and r["owningAddr"]
                and (direction is None or r["linkDir"] == direction)]

    def connection_users(self) -> list[str]:
        """The ``user`` the router recorded for each authenticated client connection."""
        rows = self.query("org.apache.qpid.dispatch.connection", ["user", "role"])
        return [r["user"] for r in rows if r["role"] == "normal" and r["user"] != "anonymous"]


class RouterRecord:
    """What a real router received since a baseline, in the in-tree broker's terms (the
    ``broker`` of the end-to-end tests): ``opens()``, ``attaches()``, ``received(address)``,
    ``wait_until()``. Read from the router's log (``Connection Opened``, ``Link attached``) and
    its management counters (``deliveriesIngress`` per address)."""

    _OPEN = "Connection Opened: dir=in"
    _ATTACH = "Link attached: dir="

    def __init__(self, router: Qdrouterd) -> None:
        self.router = router
        self._agent = router.management()
        self._log_start = len(router.log_text())
        self._base_total, self._base = self._counters()

    def _counters(self) -> tuple[int, dict[str, int]]:
        total = int(self._agent.query("org.apache.qpid.dispatch.router",
                                      ["deliveriesIngress"])[0]["deliveriesIngress"])
        per = {r["key"]: int(r["deliveriesIngress"]) for r in self._agent.query(
            "org.apache.qpid.dispatch.router.address", ["key", "deliveriesIngress"])}
        return total, per

    def _log(self) -> list[str]:
        return self.router.log_text()[self._log_start:].splitlines()

    def opens(self) -> list[str]:
        """The router's ``Connection Opened`` lines since the baseline (one per client Open)."""
        return [line for line in self._log() if self._OPEN in line]

    def attaches(self) -> list[Any]:
        """Links the router attached since the baseline: objects with ``source``, ``target``,
        ``address`` (the terminus address the router logged) and ``name`` (None: not logged)."""
        import re
        from types import SimpleNamespace

        out = []
        for line in self._log():
            if self._ATTACH not in line:
                continue
            found = re.search(r"source=\{(.*?) expire.*target=\{(.*?) expire", line)
            source, target = (found.groups() if found else ("", ""))
            source = None if source == "<none>" else source
            target = None if target == "<none>" else target
            out.append(SimpleNamespace(name=None, source=source, target=target,
                                       address=target or source))
        return out

    def received(self, address: str) -> int:
        """Deliveries the router took in for ``address`` since the baseline, plus every
        delivery to an address it had no entry for (it keeps no count for an address nobody
        subscribes to): an upper bound, so ``received(a) == 0`` proves nothing reached it;
        a test that needs an exact count subscribes first."""
        total, per = self._counters()
        known = sum(v - self._base.get(k, 0) for k, v in per.items())
        unknown = (total - self._base_total) - known
        key = "M0" + address
        return per.get(key, 0) - self._base.get(key, 0) + max(unknown, 0)

    def wait_until(self, predicate: Any, timeout: float = 5.0, interval: float = 0.05) -> bool:
        """Poll ``predicate`` until true or ``timeout`` seconds; its last value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())

    def close(self) -> None:
        """Close the management connection."""
        self._agent.close()


class Management:
    """A management client (request/response to ``$management``) on one admin connection."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        from proton.utils import BlockingConnection, SyncRequestResponse

        self.connection = BlockingConnection(url, timeout=timeout)
        self._client = SyncRequestResponse(self.connection, "$management")

    def query(self, entity_type: str, attributes: Sequence[str] = ()) -> list[dict[str, Any]]:
        """As :meth:`Qdrouterd.query`."""
        from proton import Message

        response = self._client.call(Message(
            body={"attributeNames": list(attributes)},
            properties={"operation": "QUERY", "type": "org.amqp.management",
                        "entityType": entity_type, "name": "self"}))
        status = (response.properties or {}).get("statusCode")
        if status != 200:
            raise QdrouterdError(f"QUERY {entity_type}: status {status}: {response.properties}")
        names = response.body["attributeNames"]
        return [dict(zip(names, row, strict=True)) for row in response.body["results"]]

    def close(self) -> None:
        """Close the admin connection."""
        self.connection.close()

    def __enter__(self) -> Management:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Subscriber:
    """A receiver on the router's test-only admin listener that accepts every message in a
    thread of its own (so a blocking sender in the test gets its disposition).

    ``with Subscriber(router.admin_url, "orders.x") as sub: ...; sub.bodies()``.
    """

    def __init__(self, url: str, address: str, credit: int = 100) -> None:
        import threading

        from proton.handlers import MessagingHandler
        from proton.reactor import Container

        self.received: list[Any] = []
        ready = threading.Event()
        owner = self

        class _Handler(MessagingHandler):
            def __init__(self) -> None:
                super().__init__(prefetch=credit)
                self.connection: Any = None

            def on_start(self, event: Any) -> None:
                self.connection = event.container.connect(url)
                event.container.create_receiver(self.connection, address)

            def on_link_opened(self, event: Any) -> None:
                ready.set()

            def on_message(self, event: Any) -> None:
                owner.received.append(event.message.body)

        self._handler = _Handler()
        self._container = Container(self._handler)
        self._thread = threading.Thread(target=self._container.run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise QdrouterdError(f"subscriber on {address} did not attach")
        time.sleep(0.1)  # the router has propagated the address before the test sends

    def bodies(self, quiet: float = 0.5, timeout: float = 5.0) -> list[Any]:
        """The bodies received, once nothing new arrived for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline and seen != len(self.received):
            seen = len(self.received)
            time.sleep(quiet)
        return list(self.received)

    def close(self) -> None:
        """Close the connection and stop the thread."""
        self._container.schedule(0, _Closer(self._handler))
        self._thread.join(5)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Closer:
    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def on_timer_task(self, event: Any) -> None:
        if self.handler.connection is not None:
            self.handler.connection.close()
        event.container.stop()
