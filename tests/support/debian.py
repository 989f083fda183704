"""The Debian package on this machine: build, install and purge helpers for the package tests.

``tests/integration/debian/`` builds the .deb once (its conftest), installs it with ``dpkg -i``,
runs the packaging tests and the deploy guide against the installed files, then purges it.
The helpers here run commands without this checkout on ``PYTHONPATH`` (:func:`clean_env`), so
the installed copy imports its own code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["BIN", "CONFIG", "DOC", "ETC", "PACKAGE", "ROOT", "UNIT", "VENV", "clean_env",
           "dpkg", "only", "output", "package_installed", "run", "why_no_deb"]

ROOT = Path(__file__).resolve().parents[2]
"""The checkout."""
PACKAGE = "amqp-policy-proxy"
VENV = Path("/opt/venvs/amqp-policy-proxy")
ETC = Path("/etc/amqp-policy-proxy")
BIN = Path("/usr/bin/amqp-policy-proxy")
UNIT = Path("/lib/systemd/system/amqp-policy-proxy.service")
DOC = Path("/usr/share/doc/amqp-policy-proxy")
CONFIG = ETC / "config.toml"

# Build tools the package needs (scripts/install-system-deps.sh installs them).
BUILD_TOOLS = {"dpkg-buildpackage": "dpkg-dev", "dh": "debhelper",
               "dh_virtualenv": "dh-virtualenv", "systemd-analyze": "systemd"}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONPATH/PYTHONHOME (which would make an installed
    copy import this checkout's sources instead of its own), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def run(*args: str | Path, timeout: float = 120, env: dict[str, str] | None = None,
        **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command (no shell) in :func:`clean_env`, capturing its output as text."""
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env=clean_env() if env is None else env, **kwargs)


def output(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr of ``result``, for assertion messages."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def dpkg(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``dpkg ARGS``, waiting (up to ``timeout``) while another process holds dpkg's lock."""
    deadline = time.monotonic() + timeout
    while True:
        result = run("dpkg", *args, timeout=timeout,
                     env=clean_env(DEBIAN_FRONTEND="noninteractive"))
        locked = result.returncode != 0 and "lock" in result.stderr
        if not locked or time.monotonic() > deadline:
            return result
        time.sleep(2)


def package_installed() -> bool:
    """Whether dpkg knows the package as installed (any state but not-installed)."""
    result = run("dpkg-query", "-W", "-f=${db:Status-Status}", PACKAGE)
    return result.returncode == 0 and result.stdout.strip() not in ("", "not-installed")


def why_no_deb() -> str | None:
    """Why the package cannot be built and installed here, or ``None`` when it can."""
    if shutil.which("dpkg") is None:
        return "dpkg is not installed (not a Debian system)"
    if os.geteuid() != 0:
        return "installing a Debian package with dpkg -i needs root"
    for tool, package in BUILD_TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} not found: install {package} (scripts/install-system-deps.sh)"
    if package_installed():
        return f"the {PACKAGE} package is already installed on this machine: not touching it"
    for path in (ETC, BIN, VENV):
        if path.exists() or path.is_symlink():
            return f"{path} exists without the package (a hand-made install): not touching it"
    return None


def only(directory: Path, pattern: str) -> Path:
    """The one file in ``directory`` matching ``pattern``."""
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, found
    return found[0]


