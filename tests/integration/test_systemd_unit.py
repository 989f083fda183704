"""The shipped systemd unit: ``systemd-analyze verify`` passes, the directives the README
promises are there, and the example ``/etc/amqp-policy-proxy`` layout validates.

``verify`` insists that ``ExecStart`` binaries exist, so it runs on a temporary copy whose
``/usr/bin/amqp-policy-proxy`` is replaced by this venv's console script; the shipped unit
keeps the packaged path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import ME

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "amqp-policy-proxy.service"
EXAMPLE = ROOT / "examples" / "etc" / "amqp-policy-proxy"
CLI = Path(sys.executable).with_name("amqp-policy-proxy")
SHIPPED_BIN = "/usr/bin/amqp-policy-proxy"

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze not installed (apt-get install systemd)")


def directives(text: str) -> dict[str, list[str]]:
    """``Key`` -> every value it is given, in order (repeatable keys like ExecReload)."""
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    """Run ``systemd-analyze verify`` on ``unit``."""
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60)


def local_copy(tmp_path: Path, text: str) -> Path:
    """Write ``text`` as a unit file whose binary is this venv's console script."""
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(SHIPPED_BIN, str(CLI)))
    return unit


@needs_analyze
def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    result = verify(local_copy(tmp_path, UNIT.read_text()))
    assert result.returncode == 0, result.stderr
    # unknown or unparsable directives are only warnings: there must be none for our unit
    ours = [line for line in (result.stdout + result.stderr).splitlines()
            if UNIT.name in line]
    assert ours == []


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    # guards the test above: what is wrong is reported (as a warning naming our unit)
    broken = UNIT.read_text().replace("Type=notify", "Type=notify-or-else")
    result = verify(local_copy(tmp_path, broken))
    assert result.returncode != 0 or f"{UNIT.name}:" in result.stderr


def test_unit_declares_what_the_readme_promises() -> None:
    d = directives(UNIT.read_text())
    assert d["Type"] == ["notify"]
    assert d["ExecStart"] == [f"{SHIPPED_BIN} run --config /etc/amqp-policy-proxy/config.toml"]
    # validate first, then signal: a failing check stops the reload before the SIGHUP
    assert d["ExecReload"] == [f"{SHIPPED_BIN} check --no-bind-test --config "
                               "/etc/amqp-policy-proxy/config.toml",
                               "/bin/kill -HUP $MAINPID"]
    assert d["Restart"] == ["on-failure"]
    assert d["RestartPreventExitStatus"] == ["2"]
    assert d["KillMode"] == ["mixed"]
    assert "WatchdogSec" in d
    for key, value in {
        "User": "amqp-policy-proxy", "Group": "amqp-policy-proxy",
        "ConfigurationDirectory": "amqp-policy-proxy",
        "StateDirectory": "amqp-policy-proxy", "LogsDirectory": "amqp-policy-proxy",
        "RuntimeDirectory": "amqp-policy-proxy", "RuntimeDirectoryMode": "0750",
        "ProtectSystem": "strict", "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "CAP_NET_BIND_SERVICE",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter": "@system-service",
    }.items():
        assert d[key] == [value], key
    # the Debian package's system user (postinst), not a transient one: key files and the
    # event log belong to a stable uid/gid, and LogsDirectory= stays /var/log/amqp-policy-proxy
    assert "DynamicUser" not in d

    config = tomllib.loads((EXAMPLE / "config.toml").read_text())
    # two descriptors per proxied connection (client + upstream)
    assert int(d["LimitNOFILE"][0]) >= 2 * config["policy"]["max_connections"]
    # systemd must not SIGKILL a drain that is still within its grace period
    grace = config["timeouts"]["shutdown_grace_seconds"]
    assert int(d["TimeoutStopSec"][0].removesuffix("s")) > grace
    # the event log lives under LogsDirectory=, the only writable place besides StateDirectory=
    assert config["event_log"]["directory"].startswith("/var/log/amqp-policy-proxy/")
    # the admin socket under RuntimeDirectory=, where the admin commands look by default
    assert config["admin"]["socket"] == "/run/amqp-policy-proxy/admin.sock"


def test_example_configuration_checks_ok() -> None:
    result = subprocess.run([str(CLI), "check", "--as-user", ME, "--config", str(EXAMPLE / "config.toml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: 2 vhost(s): $default, shop;")


def test_reload_check_rejects_unloadable_tls_files(tmp_path: Path) -> None:
    # ExecReload's check also loads the TLS files the SIGHUP would reload
    (tmp_path / "policy.d").mkdir()
    shutil.copy(EXAMPLE / "policy.d" / "10-shop.json", tmp_path / "policy.d")
    (tmp_path / "server.crt").write_text("-----BEGIN CERTIFICATE-----\nnot a cert\n")
    (tmp_path / "server.key").write_text("not a key\n")
    (tmp_path / "config.toml").write_text(
        '[[listener]]\naddress = "127.0.0.1:5671"\n'
        'tls_cert = "server.crt"\ntls_key = "server.key"\n'
        '[[upstream]]\naddress = "127.0.0.1:25672"\n'
        '[policy]\npath = "policy.d"\n')
    result = subprocess.run([str(CLI), "check", "--as-user", ME, "--config", str(tmp_path / "config.toml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "listener[0] 127.0.0.1:5671" in result.stdout
    assert str(tmp_path / "server.crt") in result.stdout
