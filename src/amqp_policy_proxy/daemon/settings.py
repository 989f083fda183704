"""Daemon layer: the validated configuration ``run`` starts with, as plain frozen dataclasses.

:class:`DaemonConfig` (with :class:`ListenerConfig`, :class:`UpstreamConfig`,
:class:`AdminConfig` and :class:`Address`) is what the rest of the daemon, the tests and the demo
build and ``dataclasses.replace``; :class:`ConfigError` is how every configuration problem is
reported (``file: key.path: reason``, one line each, exit 2).

The TOML file's schema that produces these lives in :mod:`.config` and needs pydantic; this
module does not, so a running daemon (which validated its file once, at start) never loads
the schema library: ``run`` validates in a short-lived child process (:mod:`.config_child`)
and only this module's classes cross back. Everything here pickles.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..fleet.ledger import FAILURE_MODES, LedgerSettings
from ..policy.model import PolicySettings
from ..policy.naming import Naming

if TYPE_CHECKING:
    from ..tokens.config import TokenAuthConfig

__all__ = ["DEFAULT_ADMIN_SOCKET", "LEDGER_FAILURE_MODES", "LOG_FORMATS", "LOG_LEVELS",
           "Address", "AdminConfig", "BindError", "ConfigError", "DaemonConfig",
           "ListenerConfig", "Network", "UpstreamConfig", "parse_address"]

class ConfigError(Exception):
    """Invalid daemon configuration; ``issues`` lists every problem as ``file: path: reason``."""

    def __init__(self, issues: list[str]) -> None:
        """Create the error from its issues (one line each)."""
        super().__init__("\n".join(issues))
        self.issues = issues

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[str]]]:
        """Pickle by the issues (``run`` validates in a child: :mod:`.config_child`)."""
        return type(self), (self.issues,)


class BindError(ConfigError):
    """A listener or the metrics endpoint cannot bind its configured address (exit 2)."""

    @staticmethod
    def line(source: str | None, key: str, address: object, exc: OSError) -> str:
        """The issue line: ``file: key: cannot listen on ADDRESS: reason`` (the reason is
        the errno's text, e.g. "Address already in use", whatever wording the event loop
        used; a name that does not resolve gives the resolver's)."""
        if exc.errno and exc.errno > 0:
            reason = os.strerror(exc.errno)
        else:  # socket.gaierror's errno is an EAI_* code (negative)
            reason = exc.strerror or str(exc)
        where = f"{source}: " if source else ""
        return f"{where}{key}: cannot listen on {address}: {reason}"

    @classmethod
    def of(cls, source: str | None, key: str, address: object, exc: OSError) -> BindError:
        """The error of one address that cannot be bound (:meth:`line`)."""
        return cls([cls.line(source, key, address, exc)])


# ---------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Address:
    """A ``HOST:PORT`` pair; IPv6 hosts are written ``[::1]:5672``."""

    host: str
    port: int

    def __str__(self) -> str:
        """Render as ``HOST:PORT`` (brackets around IPv6 hosts)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str) -> Address:
    """Parse ``HOST:PORT`` / ``[V6]:PORT``.

    Raises:
        ValueError: no port, a port outside 0..65535, or an empty host.
    """
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"bad address {text!r}: expected [HOST]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"bad address {text!r}: expected HOST:PORT")
    if not host:
        raise ValueError(f"bad address {text!r}: empty host")
    if not port_text.isdigit():
        raise ValueError(f"bad address {text!r}: port is not a number")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"bad address {text!r}: port out of range 0..65535")
    return Address(host, port)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One listening socket. With ``tls_cert`` it speaks amqps (TLS from the first byte)."""

    address: Address
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    """CA bundle for verifying client certificates."""
    require_client_cert: bool = False
    proxy_protocol: bool = False
    """Every connection begins with a PROXY protocol header (before TLS) whose address is the
    client's; only peers in ``proxy_protocol_from`` may connect."""
    proxy_protocol_from: tuple[Network, ...] = ()
    """The load balancers' networks (non-empty when ``proxy_protocol``)."""


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """One router/broker; several are tried in order when one refuses."""

    address: Address
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    kind: str = "other"
    """How it resolves names: ``qdrouterd``, ``rabbitmq`` or ``other`` (decision 0007)."""
    identity: str = "strict"
    """``strict``: refuse an identity its authenticator would change; ``canonical``: take
    the changed one."""
    sasl_realm: str | None = None
    """A realm its SASL appends to user names without ``@``."""
    token_authority: str | None = None
    """``proxy`` or ``upstream``: its clients authenticate with OAuth 2.0 tokens
    (docs/oauth2.md); None: SASL is relayed as it came (no tokens)."""
    service_username: str | None = None
    """The proxy's own SASL PLAIN user for this router (``token_authority = "proxy"``)."""
    service_password_file: str | None = None
    """The file holding that user's password (read at start and at each reload)."""
    probe: str = "auto"
    """How readiness probes it: ``amqp`` (connect, the SASL protocol header, its answer),
    ``tcp`` (connect only, no byte sent) or ``auto`` (``tcp`` for ``rabbitmq``, which logs a
    WARNING for every connection that sends bytes and closes before its handshake, and
    nothing for one that sends none; ``amqp`` for the others)."""

    def probe_mode(self) -> str:
        """``amqp`` or ``tcp``: what :attr:`probe` means for this upstream."""
        if self.probe != "auto":
            return self.probe
        return "tcp" if self.kind == "rabbitmq" else "amqp"

    def naming(self) -> Naming:
        """The :class:`~amqp_policy_proxy.policy.naming.Naming` of this upstream."""
        return Naming(self.kind, identity_mode=self.identity, realm=self.sasl_realm)


LOG_LEVELS = ("debug", "info", "warning", "error")
"""Accepted ``[logging] level`` / ``--log-level`` values (any case)."""
LEDGER_FAILURE_MODES = FAILURE_MODES
"""Accepted ``[ledger] failure_mode`` / ``--ledger-failure-mode`` values."""
LOG_FORMATS = ("text", "json")
"""Accepted ``[logging] format`` / ``--log-format`` values."""


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """Everything ``run`` needs. Times in seconds."""

    listeners: tuple[ListenerConfig, ...] = ()
    upstreams: tuple[UpstreamConfig, ...] = ()
    policy_path: str | None = None
    policy: PolicySettings = field(default_factory=PolicySettings)
    metrics_address: Address | None = None
    event_log_dir: str | None = None
    event_log_queue: int = 10000
    event_log_retention_days: int | None = None
    """Delete event log day partitions older than this many days; None keeps them all."""
    event_log_compact_after: float | None = None
    """``[event_log] compact_after``: compact hours (``report compact``) once they ended this
    many seconds ago; None: never."""
    handshake_seconds: float = 10.0
    shutdown_grace_seconds: float = 30.0
    connect_timeout_seconds: float = 5.0
    preauth_buffer_bytes: int = 64 * 1024 * 1024
    """Budget (bytes) for what connections not yet admitted hold, process-wide."""
    source: str | None = None
    """The config file this came from, if any."""
    allow_empty_policy: bool = False
    """``[policy] allow_empty``: a policy without any vhost is accepted (everyone is denied)."""
    reevaluate_open: str = "enforce"
    """``[policy] reevaluate_open``: ``enforce``, ``shadow`` or ``off``."""
    reevaluate_close_rate: float | None = None
    """``[policy] reevaluate_close_rate``: closes per second of the connections a reload
    revokes (paced, with jitter); None: all at once."""
    log_level: str = "info"
    """``[logging] level``: one of :data:`LOG_LEVELS`."""
    log_format: str = "text"
    """``[logging] format``: one of :data:`LOG_FORMATS`."""
    admin: AdminConfig | None = None
    """``[admin]``: the admin interface; None: no admin endpoint."""
    ledger: LedgerSettings | None = None
    """``[ledger]``: the fleet's shared counts; None: the in-process ledger. Its ``url`` is
    ``"auto"`` for a private redis-server (started by ``run``); its ``proxy_id`` is ``""``
    until ``run`` names it (host name and first listener port)."""
    workers: int = 1
    """``[daemon] workers``: event-loop processes sharing the listeners."""
    runtime_dir: str | None = None
    """``[daemon] runtime_directory``: where ``ledger = "auto"`` puts its socket."""
    reuse_port: bool = False
    """Listen with ``SO_REUSEPORT`` (a worker: its siblings listen on the same ports)."""
    worker: int | None = None
    """This process's number when it is a worker of ``--workers N`` (daemon/workers.py)."""
    token_auth: TokenAuthConfig | None = None
    """``[token_auth]``: how token connections are checked (its ``jwks_file`` resolved
    against the config file's directory); None: no upstream takes tokens."""


DEFAULT_ADMIN_SOCKET = "/run/amqp-policy-proxy/admin.sock"
"""Where the packaged configuration puts the admin socket (``RuntimeDirectory=`` of the unit),
and where the admin commands look when no configuration names one."""


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin interface (docs/operations.md): a unix socket, and optionally TCP with a
    bearer token."""

    socket: str | None = None
    """Path of the unix socket (mode 0660); None: no socket."""
    group: str | None = None
    """Group the socket is given (its members may use it); None: the daemon's group."""
    address: Address | None = None
    """``HOST:PORT`` of the TCP listener; None: none."""
    token_file: str | None = None
    """File holding the bearer token the TCP listener requires."""
    forwarded_peer: bool = False
    """A worker's private socket under ``--workers N`` (never from the file): the operator's
    credentials come from the parent's ``X-Admin-Peer`` header."""


# ---------------------------------------------------------------------------------- schema
