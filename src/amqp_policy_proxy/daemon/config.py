"""Daemon layer: the TOML configuration file, one typed schema for ``run`` and ``check``.

The file is described once, by the pydantic v2 models below (:class:`ConfigFile` and one model
per table). ``run`` and ``check`` both go through :func:`load_daemon_config` (``run`` through
:func:`config_from_sources`, which lays its command-line flags over the file first), so
``check --config`` accepts exactly what ``run`` starts with. Validation is strict: a TOML string
is never a boolean or a number (``tls = "false"`` is an error, not true), a table is never a
string, unknown keys are errors, and files the daemon will open (TLS certificates, keys and CAs,
the policy path, the event log directory) are checked for existence and access here too.
Every problem is collected into one :class:`ConfigError`, one line each, as
``file: key.path: reason`` (``file: line L column C: invalid TOML: ...`` for syntax errors).

The validated result is the frozen dataclasses :class:`DaemonConfig`, :class:`ListenerConfig`,
:class:`UpstreamConfig` and :class:`Address` of :mod:`.settings` (re-exported here): the rest of
the daemon, the tests and the demo build and ``dataclasses.replace`` those directly, and the
running daemon imports only that module: ``run`` validates in a child (:mod:`.config_child`),
so pydantic is never loaded into it. Nothing is opened, bound or connected here.

Adding a table (as ``[admin]``): write a ``_Table`` subclass with one field per key, ``name:
KeyType = default`` and a docstring below it; the key type (one of the key types of the schema
section, or ``bool``, ``str``, a ``Literal`` of strings) says how the value is checked and what
the reference calls it, the docstring is the key's description (the reference in
``docs/configuration.md`` is generated from both, see :func:`reference_markdown`). Add the table
as a field of :class:`ConfigFile` with a default, and carry its values into
:class:`DaemonConfig` in :meth:`ConfigFile.to_daemon_config`.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import ipaddress
import os
import re
import textwrap
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
)

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from ..fleet.ledger import LedgerSettings
from ..policy.model import PolicySettings
from ..tokens.config import TokenAuthConfig
from .logs import escape_control
from .settings import (
    Address,
    AdminConfig,
    ConfigError,
    DaemonConfig,
    ListenerConfig,
    Network,
    UpstreamConfig,
    parse_address,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Address", "AdminConfig", "ConfigError", "ConfigFile", "DaemonConfig",
           "ListenerConfig", "UpstreamConfig", "admin_socket_from_file", "config_from_mapping",
           "config_from_sources", "format_errors", "load_daemon_config", "read_toml",
           "reference_markdown"]


@dataclass(frozen=True, slots=True)
class _Toml:
    """Marks a key type with what the reference calls it (its ``type`` column), e.g. ``path
    (file)``; see :func:`_toml_type`."""

    name: str


def _address(value: Any) -> Address:
    if not isinstance(value, str):
        raise PydanticCustomError("address_type", "expected a \"HOST:PORT\" string, got {got}",
                                  {"got": describe(value)})
    try:
        return parse_address(value)
    except ValueError as exc:
        raise PydanticCustomError("address", "{reason}", {"reason": str(exc)}) from None


def _resolve(value: str, info: ValidationInfo) -> str:
    """Resolve a path against the config file's directory (``base`` in the context)."""
    base = (info.context or {}).get("base")
    path = Path(value)
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return str(path)


def _checking(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get("check_files", True))


def _exists(path: str | Path) -> bool:
    """Whether ``path`` exists, as this user can tell.

    Raises:
        PydanticCustomError: a directory on the way is not searchable by this user, so
            whether ``path`` exists cannot be known: that is reported as such, not as a
            missing file (``PATH: cannot be reached by this user: DIR is not searchable``).
    """
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        blocked = next((str(d) for d in reversed(Path(path).parents)
                        if d.is_dir() and not os.access(d, os.X_OK)), str(Path(path).parent))
        raise PydanticCustomError(
            "file", "{path}: cannot be reached by this user ({dir} is not searchable)",
            {"path": str(path), "dir": blocked}) from None
    return True


def _readable_file(value: str, info: ValidationInfo) -> str:
    path = _resolve(value, info)
    if _checking(info):
        if not _exists(path):
            raise PydanticCustomError("file", "{path}: no such file", {"path": path})
        if not os.path.isfile(path):
            raise PydanticCustomError("file", "{path}: not a regular file", {"path": path})
        if not os.access(path, os.R_OK):
            raise PydanticCustomError("file", "{path}: not readable by this user", {"path": path})
    return path


def _policy_path(value: str, info: ValidationInfo) -> str:
    path = _resolve(value, info)
    if _checking(info):
        if not _exists(path):
            raise PydanticCustomError("file", "{path}: no such file or directory", {"path": path})
        if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            raise PydanticCustomError("file", "{path}: not readable by this user", {"path": path})
    return path


def _writable_dir(value: str, info: ValidationInfo) -> str:
    path = _resolve(value, info)
    if _checking(info):
        if _exists(path):
            if not os.path.isdir(path):
                raise PydanticCustomError("dir", "{path}: not a directory", {"path": path})
            if not os.access(path, os.W_OK | os.X_OK):
                raise PydanticCustomError("dir", "{path}: not writable by this user",
                                          {"path": path})
        else:  # created at start: the nearest existing parent must let us
            parent = Path(path).parent
            while not _exists(parent) and parent != parent.parent:
                parent = parent.parent
            if not parent.is_dir():
                raise PydanticCustomError(
                    "dir", "{path}: cannot be created ({parent} is not a directory)",
                    {"path": path, "parent": str(parent)})
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PydanticCustomError(
                    "dir", "{path}: does not exist and cannot be created ({parent} is not "
                    "writable by this user)", {"path": path, "parent": str(parent)})
    return path


def _network(value: Any) -> Network:
    if not isinstance(value, str):
        raise PydanticCustomError("network_type", "expected a CIDR string such as "
                                  "\"10.0.0.0/8\", got {got}", {"got": describe(value)})
    try:
        return ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as exc:
        hint = ""
        try:
            hint = f" (did you mean {ipaddress.ip_network(value.strip(), strict=False)}?)"
        except ValueError:
            pass
        raise PydanticCustomError("network", "{reason}{hint}",
                                  {"reason": str(exc), "hint": hint}) from None


def _nonempty(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "must not be empty")
    return value


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _number(kind: type[int] | type[float], *, gt: int | None = None, ge: int | None = None,
            unit: str = "") -> Any:
    """A number key type bounded below (``gt`` or ``ge``), named after its bound in the reference,
    e.g. ``integer >= 0 (bytes)`` or ``number > 0 (seconds)`` (``unit`` in the brackets)."""
    op, bound = (">", gt) if gt is not None else (">=", ge)
    name = f"{'integer' if kind is int else 'number'} {op} {bound}" + (f" ({unit})" if unit else "")
    return Annotated[kind, Field(gt=gt, ge=ge), _Toml(name)]


# The key types: how a value is checked, and what the reference calls it.
AddressKey = Annotated[Address, PlainValidator(_address), _Toml("string HOST:PORT")]
NetworkKey = Annotated[Network, PlainValidator(_network)]
Networks = Annotated[list[NetworkKey], _Toml("array of strings (CIDR)")]
NonEmpty = Annotated[str, AfterValidator(_nonempty)]
ReadableFile = Annotated[NonEmpty, AfterValidator(_readable_file), _Toml("path (file)")]
PolicyPath = Annotated[NonEmpty, AfterValidator(_policy_path), _Toml("path (file or directory)")]
WritableDir = Annotated[NonEmpty, AfterValidator(_writable_dir), _Toml("path (directory)")]
Directory = Annotated[NonEmpty, _Toml("path (directory)")]
"""A directory the daemon makes or finds itself (not checked here)."""
if TYPE_CHECKING:  # what the values are; pydantic reads the bounds made below
    Count = int
    SizeLimit = int
    RateLimit = int
    Records = int
    Days = int
    Processes = int
    Budget = int
    Seconds = float
    CompactSeconds = float
    Milliseconds = float
    ClosesPerSecond = float
else:
    Count = _number(int, ge=0)
    SizeLimit = _number(int, ge=0, unit="bytes")
    RateLimit = _number(int, ge=0, unit="per second")
    Records = _number(int, gt=0, unit="records")
    Days = _number(int, ge=1, unit="days")
    Processes = _number(int, ge=1)
    Budget = _number(int, gt=0, unit="bytes")
    Seconds = _number(float, gt=0, unit="seconds")
    CompactSeconds = _number(float, ge=60, unit="seconds")
    Milliseconds = _number(float, gt=0, unit="milliseconds")
    ClosesPerSecond = _number(float, gt=0, unit="closes per second")


class _Table(BaseModel):
    """One TOML table: strict types, unknown keys are errors, immutable. A key's description is
    the docstring below its field (read by :func:`reference_markdown` only)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True,
                              arbitrary_types_allowed=True)


class ListenerTable(_Table):
    """``[[listener]]``: one listening socket for clients (at least one)."""

    address: AddressKey
    """Address to listen on, e.g. "0.0.0.0:5672" or "[::]:5671"; port 0 lets the kernel
    choose."""
    tls_cert: ReadableFile | None = None
    """PEM certificate chain, leaf first. With it the listener speaks amqps (TLS from the first
    byte). Needs tls_key. Re-read on reload."""
    tls_key: ReadableFile | None = None
    """PEM private key of tls_cert, unencrypted."""
    tls_ca: ReadableFile | None = None
    """CA bundle that signs client certificates; with it client certificates are verified
    (optional unless require_client_cert). Needs tls_cert."""
    require_client_cert: bool = False
    """Refuse clients without a valid certificate signed by tls_ca. Needs tls_cert and tls_ca."""
    proxy_protocol: bool = False
    """Every connection must begin with a PROXY protocol header (v1 or v2, before TLS), and the
    client address it carries is the client's for remoteHosts, per-host limits, logs and the
    event log. Only peers in proxy_protocol_from may connect; a missing, malformed or oversize
    header closes the connection with nothing written (reason proxy_protocol). Needs
    proxy_protocol_from."""
    proxy_protocol_from: Networks = []
    """The load balancers' addresses, e.g. ["10.0.0.0/8", "fd00::/8"]; a bare address is one
    host. Needs proxy_protocol = true."""

    @model_validator(mode="after")
    def _proxy_protocol_keys_go_together(self) -> ListenerTable:
        if self.proxy_protocol and not self.proxy_protocol_from:
            problem = ("proxy_protocol needs proxy_protocol_from (the load balancers' "
                       "addresses: only they may connect)")
        elif self.proxy_protocol_from and not self.proxy_protocol:
            problem = "proxy_protocol_from set but proxy_protocol is false (set proxy_protocol = true)"
        else:
            return self
        raise PydanticCustomError("listener_proxy_protocol", "{problem}", {"problem": problem})

    @model_validator(mode="after")
    def _tls_keys_go_together(self) -> ListenerTable:
        problems = []
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("tls_cert and tls_key must be given together")
        elif self.tls_cert is None and (self.tls_ca is not None or self.require_client_cert):
            problems.append("tls_ca and require_client_cert need tls_cert and tls_key "
                            "(a plain listener cannot verify client certificates)")
        if self.require_client_cert and self.tls_ca is None:
            problems.append("require_client_cert needs tls_ca (the CA that signs client "
                            "certificates)")
        if problems:
            raise PydanticCustomError("listener_tls", "{problems}",
                                      {"problems": "; ".join(problems)})
        return self


class UpstreamTable(_Table):
    """``[[upstream]]``: one router or broker (at least one); tried in order when one refuses."""

    address: AddressKey
    """The router's AMQP address, e.g. "127.0.0.1:5673"."""
    tls: bool = False
    """Connect to the router with TLS (1.2 or later)."""
    tls_ca: ReadableFile | None = None
    """CA bundle to verify the router's certificate; default: the system CA store. Needs tls =
    true."""
    tls_cert: ReadableFile | None = None
    """The proxy's client certificate (PEM), when the router asks for one. Needs tls_key and
    tls = true."""
    tls_key: ReadableFile | None = None
    """PEM private key of tls_cert, unencrypted."""
    tls_server_name: NonEmpty | None = None
    """Name the router's certificate must carry; default: the address's host."""
    kind: Literal["qdrouterd", "rabbitmq", "other"] = "other"
    """What the upstream is, so that the proxy decides on names as it resolves them:
    "qdrouterd" (its address view, Cyrus SASL identities), "rabbitmq" (its AMQP 1.0 address
    formats), "other" (the default: only addresses already in their canonical form pass)."""
    identity: Literal["strict", "canonical"] = "strict"
    """"strict" (default): a user name the upstream's authenticator would change (e.g.
    whitespace Cyrus SASL trims) is refused with SASL outcome auth; "canonical": the changed
    name is the user everywhere."""
    sasl_realm: NonEmpty | None = None
    """A realm the upstream's SASL appends to user names without "@" (Cyrus with a
    user_realm); qdrouterd's listeners append none."""
    token_authority: Literal["proxy", "upstream"] | None = None
    """Its clients authenticate with OAuth 2.0 access tokens checked as [token_auth] says
    (docs/oauth2.md): "proxy" (the proxy completes SASL with the client and logs in to the
    router with service_username, or with tls_cert by SASL EXTERNAL), "upstream" (SASL is
    relayed to a router that checks the token too; admitted only when both accept it). Absent:
    no tokens, SASL is relayed as it came. The same for every [[upstream]]."""
    service_username: NonEmpty | None = None
    """The SASL PLAIN user the proxy logs in to this router as (token_authority = "proxy");
    needs service_password_file."""
    service_password_file: ReadableFile | None = None
    """The file holding service_username's password (one line; a trailing newline is not part
    of it)."""
    probe: Literal["auto", "amqp", "tcp"] = "auto"
    """How readiness probes this upstream every 5 s: "amqp" (a connect and the AMQP SASL
    protocol header, which the upstream must answer as an AMQP 1.0 peer), "tcp" (a connect
    only; nothing is sent) or "auto" (the default: "tcp" for kind = "rabbitmq", which logs a
    warning for each connection that sends a header and leaves, "amqp" for the others)."""

    @model_validator(mode="after")
    def _tls_keys_go_together(self) -> UpstreamTable:
        problems = []
        if (self.tls_cert is None) != (self.tls_key is None):
            problems.append("tls_cert and tls_key must be given together")
        unused = [k for k in ("tls_ca", "tls_cert", "tls_key", "tls_server_name")
                  if getattr(self, k) is not None]
        if unused and not self.tls:
            problems.append(f"{', '.join(unused)} set but tls is false (set tls = true)")
        if (self.service_username is None) != (self.service_password_file is None):
            problems.append("service_username and service_password_file must be given "
                            "together")
        if self.token_authority != "proxy" and self.service_username is not None:
            problems.append("service_username is only for token_authority = \"proxy\"")
        if (self.token_authority == "proxy" and self.service_username is None
                and self.tls_cert is None):
            problems.append("token_authority = \"proxy\" needs the proxy's own identity for "
                            "the router: service_username and service_password_file (SASL "
                            "PLAIN), or tls_cert and tls_key (SASL EXTERNAL)")
        if problems:
            raise PydanticCustomError("upstream_tls", "{problems}",
                                      {"problems": "; ".join(problems)})
        return self


_DEFAULT_SETTINGS = PolicySettings()


class PolicyTable(_Table):
    """``[policy]``: where the policy files are and QDR's global ``policy`` settings."""

    path: PolicyPath
    """Policy directory (every *.json, *.yaml, *.yml directly in it) or one file; QDR policyDir.
    Re-read on reload."""
    max_connections: Count = _DEFAULT_SETTINGS.max_connections
    """Concurrent client connections accepted; 0 refuses all (QDR maxConnections). LimitNOFILE
    must cover twice this."""
    enable_vhost_policy: bool = _DEFAULT_SETTINGS.enable_vhost_policy
    """false: only max_connections applies (QDR enableVhostPolicy; QDR's default is false, the
    proxy's true)."""
    enable_vhost_name_patterns: bool = _DEFAULT_SETTINGS.enable_vhost_name_patterns
    """Vhost hostnames and aliases are address-style patterns (QDR enableVhostNamePatterns)."""
    default_vhost: str = _DEFAULT_SETTINGS.default_vhost
    """Vhost used when the Open hostname matches none; "" disables it (QDR defaultVhost)."""
    max_message_size: SizeLimit = _DEFAULT_SETTINGS.max_message_size
    """Global maximum message size; 0 = unlimited. Vhost and group values override it (QDR
    maxMessageSize)."""
    max_connection_rate: RateLimit = _DEFAULT_SETTINGS.max_connection_rate
    """New client connections accepted per second, checked at TCP accept before any byte
    (burst: one second's worth); over it the socket is closed (reason global_rate). 0 =
    unlimited. An extension over QDR."""
    allow_empty: bool = False
    """Accept a policy that defines no vhost (every connection is then denied); without it such
    a policy is an error at start, reload and check."""
    reevaluate_open: Literal["enforce", "shadow", "off"] = "enforce"
    """After a reload, check every open connection and attached link against the new policy:
    enforce (close the connections it no longer admits with QDR's denial Close, detach the
    links it no longer allows with amqp:unauthorized-access), shadow (log, count and audit
    what enforce would do; nothing changes) or off (QDR's behaviour: a connection keeps the
    decision of its Open). Lowered counts never close what is open."""
    reevaluate_close_rate: ClosesPerSecond | None = None
    """Close the connections a reload no longer admits at this many per second, each at a
    random moment of its 1/rate slot, instead of all at once, so that they do not reconnect as
    one storm; until its turn a connection goes on as before (its links are not re-checked).
    Default: all at once. Link detaches are never paced."""


class MetricsTable(_Table):
    """``[metrics]``: the Prometheus endpoint."""

    address: AddressKey | None = None
    """Serve http://HOST:PORT/metrics; absent: no metrics endpoint. An explicit host, e.g.
    "127.0.0.1:9464"."""


class EventLogTable(_Table):
    """``[event_log]``: the JSON Lines event log for audits and capacity reports."""

    directory: WritableDir | None = None
    """Root of the hourly JSON Lines partitions; created if missing, must be writable. Absent:
    no event log."""
    queue_size: Records = 10000
    """Records buffered for the writer thread; beyond it records are dropped and counted."""
    retention_days: Days | None = None
    """Delete dt=YYYY-MM-DD partitions older than this many days (at start and daily after UTC
    midnight; never the current one). Absent: keep everything."""
    compact_after: CompactSeconds | None = None
    """Turn each hour of JSON Lines into Parquet once it ended this many seconds ago (at least
    60): the daemon runs "amqp-policy-proxy report compact --grace N" in a subprocess a
    minute after it starts and then every hour (needs the spark extra). Absent: never."""

    @model_validator(mode="after")
    def _compact_needs_a_directory(self) -> EventLogTable:
        if self.compact_after is not None and self.directory is None:
            raise PydanticCustomError("event_log_compact", "compact_after needs directory "
                                      "(the event log to compact)", {})
        return self


class TimeoutsTable(_Table):
    """``[timeouts]``: seconds."""

    handshake_seconds: Seconds = 10.0
    """From TCP accept (and the TLS handshake) to the client's Open decision. On a
    proxy_protocol listener the PROXY header must arrive within this time of the accept too,
    before the TLS handshake and the Open get theirs."""
    shutdown_grace_seconds: Seconds = 30.0
    """Drain budget on SIGTERM; keep the unit's TimeoutStopSec above it."""
    connect_seconds: Seconds = 5.0
    """Budget for one TCP (and TLS) connect to an upstream before the next one is tried."""


class LoggingTable(_Table):
    """``[logging]``: the daemon's own log on stderr (the journal under systemd)."""

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = "info"
    """debug, info, warning or error (any case); --log-level overrides it."""
    format: Literal["text", "json"] = "text"
    """text: one line per record, control characters escaped; json: one JSON object per line.
    --log-format overrides it."""


class DaemonTable(_Table):
    """``[daemon]``: the process itself."""

    workers: Processes = 1
    """Processes, each with its own event loop, sharing the listeners (SO_REUSEPORT) so that a
    host uses that many cores; the parent supervises them. More than 1 needs a [ledger] (or
    ledger = "auto") so that limits are shared. --workers overrides it."""
    runtime_directory: Directory | None = None
    """Where ledger = "auto" puts the private redis-server's socket; default:
    $RUNTIME_DIRECTORY (systemd RuntimeDirectory=), else a new directory under /tmp."""
    preauth_buffer_bytes: Budget = 64 * 1024 * 1024
    """Memory budget for what connections not yet admitted hold (partial frames, bytes waiting
    for the upstream), summed over the process. Over it those connections stop being read and
    new ones are refused (reason preauth_memory) until the sum is back to three quarters."""


def _group_exists(value: str, info: ValidationInfo) -> str:
    if _checking(info):
        import grp

        try:
            grp.getgrnam(value)
        except KeyError:
            raise PydanticCustomError("group", "group '{group}' does not exist",
                                      {"group": value}) from None
    return value


SocketPath = Annotated[NonEmpty, AfterValidator(_resolve), _Toml("path (socket)")]
GroupName = Annotated[NonEmpty, AfterValidator(_group_exists), _Toml("string (group name)")]


class AdminTable(_Table):
    """``[admin]``: the admin interface of the connections, vhost and status commands."""

    socket: SocketPath | None = None
    """Unix socket of the admin interface, created at start with mode 0660 (owner and group of
    the service) and removed at exit; e.g. "/run/amqp-policy-proxy/admin.sock"
    (RuntimeDirectory= of the unit). Absent: no socket. --admin-socket overrides it."""
    group: GroupName | None = None
    """Group given to the socket: its members may use the admin commands (the service must be a
    member). Default: the service's own group."""
    address: AddressKey | None = None
    """Also serve the admin interface over TCP (for remote tooling); every request must carry
    Authorization: Bearer TOKEN. Needs token_file. Absent: no TCP listener."""
    token_file: ReadableFile | None = None
    """File holding the bearer token of the TCP listener (read at start; surrounding white space
    ignored; keep it mode 0640 root:amqp-policy-proxy)."""

    @model_validator(mode="after")
    def _tcp_needs_a_token(self) -> AdminTable:
        if self.address is not None and self.token_file is None:
            raise PydanticCustomError("admin_token", "address needs token_file (the TCP admin "
                                      "listener only serves requests with a bearer token)")
        if self.token_file is not None and self.address is None:
            raise PydanticCustomError("admin_token", "token_file without address has no effect "
                                      "(the unix socket is protected by its mode and group)")
        if self.group is not None and self.socket is None:
            raise PydanticCustomError("admin_group", "group without socket has no effect")
        return self


def _ledger_url(value: str) -> str:
    if value == "auto":
        return value
    scheme = value.partition("://")[0] if "://" in value else ""
    if scheme not in ("redis", "rediss", "unix"):
        raise PydanticCustomError(
            "ledger_url", "expected redis://HOST:PORT/DB, rediss://HOST:PORT/DB, "
            "unix:///path/redis.sock or \"auto\", got {got}", {"got": describe(value)})
    if scheme == "unix" and not value[len("unix://"):].startswith("/"):
        raise PydanticCustomError("ledger_url", "unix:// needs an absolute socket path "
                                  "(unix:///run/redis/redis.sock)")
    return value


LedgerUrl = Annotated[str, AfterValidator(_ledger_url), _Toml("string URL")]


class LedgerTable(_Table):
    """``[ledger]``: connection counts shared by a fleet in Redis (docs/fleet.md); without it each process counts only its own."""  # noqa: E501

    url: LedgerUrl
    """redis://HOST:PORT/DB, rediss://HOST:PORT/DB (TLS) or unix:///path/redis.sock; "auto": a
    private redis-server on a unix socket under the runtime directory, started and stopped with
    the daemon (one host only). --ledger overrides it."""
    proxy_id: NonEmpty | None = None
    """This proxy's name in the store, unique in the fleet; default: host name and first
    listener port (workers add /wN). --proxy-id overrides it."""
    lease_seconds: Seconds = 10.0
    """A proxy that stops renewing its lease (crashed, cut off) stops counting after this long;
    each proxy renews it and rewrites its own counts every third of it."""
    timeout_ms: Milliseconds = 1000.0
    """How long the store may stay silent before it counts as unreachable: an Open waits for
    the store's answer up to this long (as it waits for the router); one not answered within it
    is decided by failure_mode, which stays in force until the store answers again. Keep it well
    above the store's worst healthy latency: one late answer must not switch to the fallback."""
    failure_mode: Literal["local-share", "closed", "open"] = "local-share"
    """While the store is unreachable (refused, closed, or silent for timeout_ms): local-share
    (each limit and connection rate divided by the proxies last seen alive, rounded up, against
    this proxy's own counts and buckets, never above a limit with what the others held), closed (deny new connections:
    amqp:resource-limit-exceeded) or open (this proxy's own counts against the full limits).
    --ledger-failure-mode overrides it."""


def _ledger_shorthand(value: Any) -> Any:
    """``ledger = "auto"`` (a top-level key, before any table) is ``[ledger] url = "auto"``."""
    if value == "auto":
        return {"url": "auto"}
    return value


_Carried = TypeVar("_Carried", bound="DataclassInstance")


def _carry(table: _Table, into: type[_Carried], **changes: Any) -> _Carried:
    """The dataclass ``into`` made from the table's keys of its fields' names, ``changes``
    replacing some (a field the table has no key for keeps its default)."""
    keys = type(table).model_fields
    values = {f.name: getattr(table, f.name) for f in fields(into) if f.name in keys}
    return into(**(values | changes))


class ConfigFile(_Table):
    """The whole file. ``[[listener]]``, ``[[upstream]]`` and ``[policy]`` are required."""

    listener: Annotated[list[ListenerTable], Field(min_length=1)]
    """Client listeners."""
    upstream: Annotated[list[UpstreamTable], Field(min_length=1)]
    """Routers or brokers, in order of preference."""
    policy: PolicyTable
    """Policy files and global settings."""
    metrics: MetricsTable = MetricsTable()
    """Prometheus endpoint."""
    event_log: EventLogTable = EventLogTable()
    """JSON Lines event log."""
    timeouts: TimeoutsTable = TimeoutsTable()
    """Timeouts."""
    logging: LoggingTable = LoggingTable()
    """The daemon's log."""
    daemon: DaemonTable = DaemonTable()
    """The process itself."""
    admin: AdminTable = AdminTable()
    """The admin interface."""
    ledger: Annotated[LedgerTable | None, BeforeValidator(_ledger_shorthand)] = None
    """Connection counts shared by a fleet (Redis); ``ledger = "auto"`` is short for ``[ledger]
    url = "auto"``."""
    token_auth: TokenAuthConfig | None = None
    """OAuth 2.0 access tokens (docs/oauth2.md), for the upstreams with token_authority."""

    @field_validator("token_auth")
    @classmethod
    def _jwks_file_readable(cls, auth: TokenAuthConfig | None,
                            info: ValidationInfo) -> TokenAuthConfig | None:
        if auth is not None and auth.jwks_file is not None and _checking(info):
            path = _resolve(auth.jwks_file, info)
            if not _exists(path) or not os.path.isfile(path):
                raise PydanticCustomError("file", "jwks_file {path}: no such file",
                                          {"path": path})
            if not os.access(path, os.R_OK):
                raise PydanticCustomError("file", "jwks_file {path}: not readable by this "
                                          "user", {"path": path})
        return auth

    @model_validator(mode="after")
    def _tokens_fit(self) -> ConfigFile:
        authorities = {up.token_authority for up in self.upstream}
        if len(authorities) > 1:
            raise PydanticCustomError(
                "token_authority", "upstream[*].token_authority differs between upstreams "
                "({got}): the upstreams of one proxy are tried in turn for one client, whose "
                "SASL is decided before one is chosen", {"got": ", ".join(
                    repr(a) if a else "absent" for a in sorted(authorities, key=str))})
        authority = next(iter(authorities))
        auth = self.token_auth
        if authority is not None and auth is None:
            raise PydanticCustomError(
                "token_auth", "upstream token_authority = \"{a}\" needs a [token_auth] table "
                "(issuer, audience, jwks_file or jwks_url)", {"a": authority})
        if auth is not None and authority is None:
            raise PydanticCustomError(
                "token_auth", "[token_auth] is set but no [[upstream]] has token_authority "
                "(\"proxy\" or \"upstream\"): tokens would never be asked for")
        if (auth is not None and "token_authority" in auth.model_fields_set
                and auth.token_authority != authority):
            raise PydanticCustomError(
                "token_auth", "token_auth.token_authority = \"{a}\" differs from the "
                "upstreams' token_authority = \"{b}\" (the upstream's key decides; leave "
                "this one out)", {"a": auth.token_authority, "b": authority})
        return self

    @model_validator(mode="after")
    def _workers_share_a_ledger(self) -> ConfigFile:
        if self.daemon.workers > 1 and self.ledger is None:
            raise PydanticCustomError(
                "workers_ledger", "daemon.workers = {n} needs a [ledger] (url = "
                "\"redis://...\") or ledger = \"auto\": without one each worker would "
                "enforce every limit on its own", {"n": self.daemon.workers})
        return self

    @field_validator("upstream")
    @classmethod
    def _upstreams_name_alike(cls, upstreams: list[UpstreamTable]) -> list[UpstreamTable]:
        first = upstreams[0]
        for i, up in enumerate(upstreams[1:], 1):
            for key in ("kind", "identity", "sasl_realm"):
                if getattr(up, key) != getattr(first, key):
                    raise PydanticCustomError(
                        "upstream_naming", "upstream[{i}].{key} = {b!r} differs from "
                        "upstream[0].{key} = {a!r}: the upstreams of one proxy are tried in "
                        "turn for one client and must resolve names alike",
                        {"i": i, "key": key, "a": getattr(first, key), "b": getattr(up, key)})
        return upstreams

    @field_validator("listener")
    @classmethod
    def _distinct_listeners(cls, listeners: list[ListenerTable]) -> list[ListenerTable]:
        seen: dict[Address, int] = {}
        for i, listener in enumerate(listeners):
            if listener.address.port and listener.address in seen:
                raise PydanticCustomError(
                    "duplicate", "listener[{i}] and listener[{j}] both listen on {addr}",
                    {"i": seen[listener.address], "j": i, "addr": str(listener.address)})
            seen[listener.address] = i
        return listeners

    def to_daemon_config(self, source: str | None) -> DaemonConfig:
        """The validated file as the daemon's frozen dataclasses."""
        pol = self.policy
        return DaemonConfig(
            listeners=tuple(_carry(lt, ListenerConfig,
                                   proxy_protocol_from=tuple(lt.proxy_protocol_from))
                            for lt in self.listener),
            upstreams=tuple(_carry(ut, UpstreamConfig) for ut in self.upstream),
            policy_path=pol.path,
            policy=_carry(pol, PolicySettings),
            allow_empty_policy=pol.allow_empty,
            reevaluate_open=pol.reevaluate_open,
            reevaluate_close_rate=pol.reevaluate_close_rate,
            metrics_address=self.metrics.address,
            event_log_dir=self.event_log.directory,
            event_log_queue=self.event_log.queue_size,
            event_log_retention_days=self.event_log.retention_days,
            event_log_compact_after=self.event_log.compact_after,
            handshake_seconds=self.timeouts.handshake_seconds,
            shutdown_grace_seconds=self.timeouts.shutdown_grace_seconds,
            connect_timeout_seconds=self.timeouts.connect_seconds,
            log_level=self.logging.level,
            log_format=self.logging.format,
            preauth_buffer_bytes=self.daemon.preauth_buffer_bytes,
            admin=self._admin_config(),
            ledger=None if self.ledger is None else _carry(
                self.ledger, LedgerSettings, proxy_id=self.ledger.proxy_id or ""),
            workers=self.daemon.workers,
            runtime_dir=self.daemon.runtime_directory,
            source=source,
            token_auth=self._token_auth(source),
        )

    def _token_auth(self, source: str | None) -> TokenAuthConfig | None:
        """``[token_auth]`` with its ``jwks_file`` resolved against the file's directory and
        ``token_authority`` the upstreams'."""
        auth = self.token_auth
        if auth is None:
            return None
        changes: dict[str, Any] = {"token_authority": self.upstream[0].token_authority}
        if auth.jwks_file is not None and source is not None:
            changes["jwks_file"] = str(Path(source).absolute().parent / auth.jwks_file)
        return auth.model_copy(update=changes)

    def _admin_config(self) -> AdminConfig | None:
        admin = self.admin
        if admin.socket is None and admin.address is None:
            return None
        return _carry(admin, AdminConfig)


# ---------------------------------------------------------------------------------- loading


def load_daemon_config(path: str | Path, *, check_files: bool = True) -> DaemonConfig:
    """Read and validate a TOML daemon config (what ``check --config`` and ``run`` do).

    Args:
        path: the file.
        check_files: also check that the files it names exist with the access the daemon needs.

    Returns:
        The config; relative paths in it are resolved against the file's directory.

    Raises:
        ConfigError: unreadable file, TOML syntax error, or any invalid key or value (all
            collected, ``file: key.path: reason`` each).
    """
    return config_from_sources(path, check_files=check_files)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file.

    Raises:
        ConfigError: unreadable file or TOML syntax error (``file: line L column C: ...``).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{p}: cannot read: not UTF-8 ({exc.reason} at byte "
                           f"{exc.start})"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = ""
        if m := re.search(r"\s*\(at line (\d+), column (\d+)\)$", message):
            where = f"line {m.group(1)} column {m.group(2)}: "
            message = message[:m.start()]
        elif m := re.search(r"\s*\(at end of document\)$", message):
            where = "end of file: "
            message = message[:m.start()]
        message = message[:1].lower() + message[1:]
        raise ConfigError([f"{p}: {where}invalid TOML: {message}"]) from None


def config_from_sources(path: str | Path | None = None, *,
                        overrides: Mapping[str, tuple[str, Any]] | None = None,
                        check_files: bool = True) -> DaemonConfig:
    """Validate the file (if any) with command-line values laid over it.

    Args:
        path: the TOML file, or None for flags only.
        overrides: ``"table.key"`` (or ``"listener"``/``"upstream"``) -> ``(flag, value)``;
            the value replaces the file's. Relative paths in flag values must already be
            absolute (they are relative to the working directory, not the file). Problems in
            an overridden value are reported as ``command line: --flag: reason``.
        check_files: check that the named files exist with the access the daemon needs.

    Returns:
        The validated config.

    Raises:
        ConfigError: every problem, collected.
    """
    raw: dict[str, Any] = read_toml(path) if path is not None else {}
    overrides = overrides or {}
    for dotted, (_flag, value) in overrides.items():
        table, _, key = dotted.partition(".")
        if not key:
            raw[table] = value
        else:
            section = raw.setdefault(table, {})
            if table == "ledger" and section == "auto":
                section = raw[table] = {"url": "auto"}
            if isinstance(section, dict):
                section[key] = value
    source = str(path) if path is not None else None
    return config_from_mapping(raw, source=source,
                               base=Path(path).absolute().parent if path is not None else None,
                               overrides={k: flag for k, (flag, _) in overrides.items()},
                               check_files=check_files)


def config_from_mapping(raw: Mapping[str, Any], *, source: str | None = "<config>",
                        base: Path | None = None, overrides: Mapping[str, str] | None = None,
                        check_files: bool = True) -> DaemonConfig:
    """Validate an already-parsed config mapping; see :func:`config_from_sources`.

    Raises:
        ConfigError: every problem, collected.
    """
    try:
        model = ConfigFile.model_validate(
            raw, context={"base": base, "check_files": check_files})
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, source=source, overrides=overrides or {})
                          ) from None
    return model.to_daemon_config(source)


# ---------------------------------------------------------------------------------- messages

_TABLE_HINTS = {
    "listener": "[[listener]] tables (two brackets), each with address = \"HOST:PORT\"",
    "upstream": "[[upstream]] tables (two brackets), each with address = \"HOST:PORT\"",
    "policy": "table [policy] with path = \"...\"",
    "metrics": "table [metrics] with address = \"HOST:PORT\"",
    "event_log": "table [event_log] with directory = \"...\"",
    "timeouts": "table [timeouts]",
    "logging": "table [logging]",
    "admin": "table [admin] with socket = \"...\"",
    "ledger": "table [ledger] with url = \"redis://HOST:PORT/DB\" (or ledger = \"auto\")",
    "token_auth": "table [token_auth] with issuer, audience and jwks_file or jwks_url",
}
_MISSING = {
    "listener": "missing: at least one [[listener]] with address = \"HOST:PORT\" is required "
                "(or run --listen HOST:PORT)",
    "upstream": "missing: at least one [[upstream]] with address = \"HOST:PORT\" is required "
                "(or run --upstream HOST:PORT)",
    "policy": "missing: a [policy] table with path = \"...\" is required (or run --policy PATH)",
    "policy.path": "missing: the policy file or directory is required (or run --policy PATH)",
}
_EXPECTED = {
    "bool_type": "true or false",
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
}
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="),
           "less_than": ("lt", "<"), "less_than_equal": ("le", "<=")}


def describe(value: Any) -> str:
    """Name a TOML value's type (and show it when short), for error messages."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"a string (\"{shown}\")"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__} ({value})"


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _reason(err: Mapping[str, Any], loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    dotted = ".".join(str(p) for p in loc if not isinstance(p, int))
    if kind == "missing":
        return _MISSING.get(dotted, "missing: required key")
    if kind == "extra_forbidden":
        model: type[BaseModel] = ConfigFile
        for part in loc[:-1]:
            if isinstance(part, int):
                continue
            annotation = model.model_fields[part].annotation
            model = cast("type[BaseModel]", getattr(annotation, "__args__", (annotation,))[0])
        close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1,
                                          cutoff=0.6)
        hint = close[0] if close else None
        return "unknown key" + (f" (did you mean '{hint}'?)" if hint else "")
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {describe(value)}"
    if kind == "int_from_float":
        return f"expected an integer, got {describe(value)}"
    if kind in ("model_type", "dict_type"):
        top = str(loc[0]) if loc else ""
        what = "a table" if len(loc) != 1 else f"a {_TABLE_HINTS.get(top, 'table')}"
        if isinstance(loc[-1], int):
            what = f"a table ({_TABLE_HINTS.get(top, 'table')})"
        return f"expected {what}, got {describe(value)}"
    if kind == "list_type" and len(loc) > 1:  # an array key inside a table
        return f"expected an array, got {describe(value)}"
    if kind == "list_type":
        hint = _TABLE_HINTS.get(str(loc[0]), "an array")
        extra = ""
        if isinstance(value, dict):
            extra = f": write [[{loc[0]}]], not [{loc[0]}]"
        return f"expected an array of {hint}, got {describe(value)}{extra}"
    if kind == "too_short":
        return _MISSING.get(dotted, "must not be empty").removeprefix("missing: ")
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound}, got {describe(value)}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {describe(value)}"
    msg = str(err.get("msg", kind))
    return msg.removeprefix("Value error, ")


def format_errors(exc: ValidationError, *, source: str | None = "<config>",
                  overrides: Mapping[str, str] | None = None) -> list[str]:
    """Turn a schema validation error into ``file: key.path: reason`` lines, in schema order.

    Args:
        exc: the pydantic error.
        source: the file name (None: the values came from the command line only).
        overrides: key paths set from the command line -> flag name; their problems are
            reported as ``command line: --flag: reason``.
    """
    overrides = overrides or {}
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        reason = _reason(err, loc)
        dotted = ".".join(str(p) for p in loc if not isinstance(p, int))
        flag = next((f for k, f in overrides.items()
                     if dotted == k or dotted.startswith(k + ".")), None)
        if flag is not None:
            line = f"command line: {flag}: {reason}"
        elif source is None:
            line = f"{_key_path(loc) or 'config'}: {reason}"
        else:
            line = f"{source}: {_key_path(loc) or '(top level)'}: {reason}"
        lines.append(escape_control(line))  # a key or value holding a newline stays on one line
    return lines


# ---------------------------------------------------------------------------------- reference


def reference_markdown() -> str:
    """The key reference of ``docs/configuration.md``, generated from the schema.

    Returns:
        Markdown: one section per table with a ``key | type | default | description`` table.
        A test compares it with the text between the ``BEGIN/END GENERATED`` markers of the
        document; ``scripts/gen-config-docs.py`` rewrites it. A key's type is named by its key
        type (:func:`_toml_type`), its description is the docstring below its field.

    Raises:
        TypeError: a key without a docstring, or of a type the reference has no name for.
    """
    out: list[str] = []
    for name, top in ConfigFile.model_fields.items():
        annotation = top.annotation
        array = getattr(annotation, "__origin__", None) is list
        if array:
            model: type[BaseModel] = annotation.__args__[0]  # type: ignore[union-attr]
        else:
            members = [a for a in getattr(annotation, "__args__", (annotation,))
                       if isinstance(a, type) and issubclass(a, BaseModel)]
            model = members[0] if members else annotation  # type: ignore[assignment]
        heading = f"[[{name}]]" if array else f"[{name}]"
        required = top.is_required()
        out.append(f"### `{heading}`")
        out.append("")
        doc = (model.__doc__ or "").split(":", 1)[-1].strip().replace("``", "`")
        doc = doc[:1].upper() + doc[1:]
        out.append(f"{doc} {'Required.' if required else 'Optional.'}".strip())
        out.append("")
        out.append("| key | type | default | description |")
        out.append("| --- | --- | --- | --- |")
        docs = _key_docs(model)
        for key, info in model.model_fields.items():
            if key not in docs:
                raise TypeError(f"[{name}] {key} has no description (a docstring below it)")
            default = "required" if info.is_required() else _toml_literal(info.default)
            desc = docs[key].replace("|", "\\|")
            kind = _toml_type(info) if issubclass(model, _Table) else _foreign_type(info)
            out.append(f"| `{key}` | {kind} | {default} | {desc} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _key_docs(model: type[BaseModel]) -> dict[str, str]:
    """A table's key descriptions: the docstring below each field, on one line, read from the
    source (not at import: pydantic's ``use_attribute_docstrings`` parses the source of every
    model when the module is imported, which costs each command line tens of milliseconds)."""
    table = ast.parse(textwrap.dedent(inspect.getsource(model))).body[0]
    assert isinstance(table, ast.ClassDef)
    body = table.body
    return {field.target.id: " ".join(doc.value.value.split())
            for field, doc in zip(body, body[1:], strict=False)
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
            and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)}


def _toml_type(info: FieldInfo) -> str:
    """What the reference calls a key's type: the ``_Toml`` mark of its key type, else
    ``boolean`` or ``string`` for ``bool``, ``str`` and a ``Literal`` of strings.

    Raises:
        TypeError: a key type the reference has no name for.
    """
    kinds = [info.annotation]
    if get_origin(info.annotation) in (Union, UnionType):  # KeyType | None
        kinds = [k for k in get_args(info.annotation) if k is not type(None)]
    marks = [*info.metadata, *(m for k in kinds for m in getattr(k, "__metadata__", ()))]
    for mark in marks:
        if isinstance(mark, _Toml):
            return mark.name
    kind = get_args(kinds[0])[0] if get_origin(kinds[0]) is Annotated else kinds[0]
    if kind is bool:
        return "boolean"
    if kind is str or (get_origin(kind) is Literal
                       and all(isinstance(a, str) for a in get_args(kind))):
        return "string"
    raise TypeError(f"no TOML type name for {info.annotation}: mark its key type with _Toml")


def _foreign_type(info: FieldInfo) -> str:
    """What the reference calls a key's type in a table defined outside this module
    (``[token_auth]``: ``tokens/config.py``, whose key types carry no ``_Toml`` mark): from
    the plain type under its annotations."""
    kinds = [info.annotation]
    if get_origin(info.annotation) in (Union, UnionType):
        kinds = [k for k in get_args(info.annotation) if k is not type(None)]
    kind = get_args(kinds[0])[0] if get_origin(kinds[0]) is Annotated else kinds[0]
    if kind is int:
        return "integer"
    if kind is float:
        return "number"
    if get_origin(kind) is list:
        inner = get_args(kind)[0]
        inner = get_args(inner)[0] if get_origin(inner) is Annotated else inner
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return "array of tables"
        return "array of strings"
    if get_origin(kind) is dict:
        return "table of arrays of strings"
    return _toml_type(info)


def _toml_literal(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def admin_socket_from_file(path: str | Path) -> str | None:
    """The ``[admin] socket`` of a config file, for the admin commands.

    Only the ``[admin]`` table is read and validated (no file checks): a problem elsewhere in
    the file must not keep an on-call engineer from the running daemon.

    Returns:
        The socket path (relative paths resolved against the file's directory), or None when
        the file has no ``[admin] socket``.

    Raises:
        ConfigError: the file cannot be read or parsed, or its ``[admin]`` table is invalid.
    """
    raw = read_toml(path)
    table = raw.get("admin", {})
    try:
        admin = AdminTable.model_validate(
            table, context={"base": Path(path).absolute().parent, "check_files": False})
    except ValidationError as exc:
        lines = format_errors(exc, source=str(path))
        raise ConfigError([line.replace(f"{path}: ", f"{path}: admin.", 1) for line in lines]
                          ) from None
    return admin.socket
