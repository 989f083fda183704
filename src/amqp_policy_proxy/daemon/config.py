"""Daemon configuration: the TOML file (docs/configuration.md), overridden by CLI flags.

``load_daemon_config`` only parses and validates; nothing is opened or bound here. Errors are
collected into one :class:`ConfigError` naming the file and the key path of each problem.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..policy.model import PolicySettings


class ConfigError(Exception):
    """Invalid daemon configuration; ``issues`` lists every problem as ``file: path: reason``."""

    def __init__(self, issues: list[str]) -> None:
        """Create the error from its issues (one line each)."""
        super().__init__("\n".join(issues))
        self.issues = issues


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
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad address {text!r}: port is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"bad address {text!r}: port out of range")
    return Address(host, port)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One listening socket. With ``tls_cert`` it speaks amqps (TLS from the first byte)."""

    address: Address
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    """CA bundle for verifying client certificates."""
    require_client_cert: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """One router/broker; several are tried in order when one refuses."""

    address: Address
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None


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
    handshake_seconds: float = 10.0
    shutdown_grace_seconds: float = 30.0
    connect_timeout_seconds: float = 5.0
    source: str | None = None
    """The config file this came from, if any."""


_TOP_KEYS = {"listener", "upstream", "policy", "metrics", "event_log", "timeouts"}
_POLICY_KEYS = {
    "path", "max_connections", "enable_vhost_policy", "enable_vhost_name_patterns",
    "default_vhost", "max_message_size",
}


def load_daemon_config(path: str | Path) -> DaemonConfig:
    """Read and validate a TOML daemon config.

    Args:
        path: the file.

    Returns:
        The config; relative paths in it are resolved against the file's directory.

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown keys or bad values (all
            collected).
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{p}: TOML syntax error: {exc}"]) from None
    return config_from_mapping(raw, source=str(p), base=p.parent)


def config_from_mapping(raw: dict[str, Any], *, source: str = "<config>",
                        base: Path | None = None) -> DaemonConfig:
    """Validate an already-parsed config mapping; see :func:`load_daemon_config`."""
    issues: list[str] = []

    def issue(key: str, msg: str) -> None:
        issues.append(f"{source}: {key}: {msg}")

    def rel(value: str | None) -> str | None:
        if value is None or base is None:
            return value
        pv = Path(value)
        return str(pv if pv.is_absolute() else base / pv)

    for key in raw:
        if key not in _TOP_KEYS:
            issue(key, "unknown key")
    listeners = []
    for i, item in enumerate(_as_list(raw.get("listener", []))):
        key = f"listener[{i}]"
        unknown = set(item) - {"address", "tls_cert", "tls_key", "tls_ca", "require_client_cert"}
        for k in sorted(unknown):
            issue(f"{key}.{k}", "unknown key")
        try:
            addr = parse_address(str(item.get("address", "")))
        except ValueError as exc:
            issue(f"{key}.address", str(exc))
            continue
        if bool(item.get("tls_cert")) != bool(item.get("tls_key")):
            issue(key, "tls_cert and tls_key must be given together")
        listeners.append(ListenerConfig(
            addr, rel(item.get("tls_cert")), rel(item.get("tls_key")), rel(item.get("tls_ca")),
            bool(item.get("require_client_cert", False)),
        ))
    upstreams = []
    for i, item in enumerate(_as_list(raw.get("upstream", []))):
        key = f"upstream[{i}]"
        unknown = set(item) - {"address", "tls", "tls_ca", "tls_cert", "tls_key",
                               "tls_server_name"}
        for k in sorted(unknown):
            issue(f"{key}.{k}", "unknown key")
        try:
            addr = parse_address(str(item.get("address", "")))
        except ValueError as exc:
            issue(f"{key}.address", str(exc))
            continue
        upstreams.append(UpstreamConfig(
            addr, bool(item.get("tls", False)), rel(item.get("tls_ca")), rel(item.get("tls_cert")),
            rel(item.get("tls_key")), item.get("tls_server_name"),
        ))
    pol = raw.get("policy", {})
    for k in sorted(set(pol) - _POLICY_KEYS):
        issue(f"policy.{k}", "unknown key")
    settings = PolicySettings()
    kwargs: dict[str, Any] = {}
    for k in ("max_connections", "max_message_size"):
        if k in pol:
            v = pol[k]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                issue(f"policy.{k}", "must be an integer >= 0")
            else:
                kwargs[k] = v
    for k in ("enable_vhost_policy", "enable_vhost_name_patterns"):
        if k in pol:
            if not isinstance(pol[k], bool):
                issue(f"policy.{k}", "must be true or false")
            else:
                kwargs[k] = pol[k]
    if "default_vhost" in pol:
        kwargs["default_vhost"] = str(pol["default_vhost"])
    settings = replace(settings, **kwargs)
    metrics = raw.get("metrics", {})
    metrics_address = None
    for k in sorted(set(metrics) - {"address"}):
        issue(f"metrics.{k}", "unknown key")
    if metrics.get("address"):
        try:
            metrics_address = parse_address(str(metrics["address"]))
        except ValueError as exc:
            issue("metrics.address", str(exc))
    ev = raw.get("event_log", {})
    for k in sorted(set(ev) - {"directory", "queue_size", "retention_days"}):
        issue(f"event_log.{k}", "unknown key")
    retention = ev.get("retention_days")
    if retention is not None and (not isinstance(retention, int) or isinstance(retention, bool)
                                  or retention < 1):
        issue("event_log.retention_days", "must be an integer >= 1 (days)")
    timeouts = raw.get("timeouts", {})
    for k in sorted(set(timeouts) - {"handshake_seconds", "shutdown_grace_seconds",
                                     "connect_seconds"}):
        issue(f"timeouts.{k}", "unknown key")
    tvals: dict[str, float] = {}
    for k, name in (("handshake_seconds", "handshake_seconds"),
                    ("shutdown_grace_seconds", "shutdown_grace_seconds"),
                    ("connect_seconds", "connect_timeout_seconds")):
        if k in timeouts:
            v = timeouts[k]
            if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
                issue(f"timeouts.{k}", "must be a number > 0")
            else:
                tvals[name] = float(v)
    if issues:
        raise ConfigError(issues)
    return DaemonConfig(
        listeners=tuple(listeners),
        upstreams=tuple(upstreams),
        policy_path=rel(pol.get("path")),
        policy=settings,
        metrics_address=metrics_address,
        event_log_dir=rel(ev.get("directory")),
        event_log_queue=int(ev.get("queue_size", 10000)),
        event_log_retention_days=retention,
        source=source,
        **tvals,
    )


def _as_list(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)]
