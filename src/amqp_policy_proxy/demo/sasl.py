"""Cyrus SASL configuration for the embedded broker: a config dir and a sasldb with users.

Proton links Cyrus SASL when python-qpid-proton was built with libsasl2-dev present
(``proton.SASL.extended()``). Server-side PLAIN then needs ``pwcheck_method: auxprop`` with
the sasldb plugin; ``saslpasswd2`` (Debian ``sasl2-bin``) creates the database.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class SaslConfig:
    """Where proton's Cyrus SASL finds its configuration."""

    config_dir: str
    config_name: str
    sasldb_path: str


def make_sasl_config(directory: str | Path, users: dict[str, str], *,
                     name: str = "proxy-test-broker",
                     mechs: tuple[str, ...] = ("PLAIN", "ANONYMOUS")) -> SaslConfig:
    """Write ``<directory>/<name>.conf`` and a sasldb holding ``users`` (name -> password).

    Users are created in the host's default realm (``saslpasswd2 -u $(hostname)``), which is
    the realm Cyrus uses for a PLAIN authcid without ``@``, so clients log in as plain
    ``alice`` and the broker sees ``alice``.

    Raises:
        RuntimeError: ``saslpasswd2`` is missing (install Debian's ``sasl2-bin``) or fails.
    """
    tool = shutil.which("saslpasswd2") or "/usr/sbin/saslpasswd2"
    if not Path(tool).exists():
        raise RuntimeError("saslpasswd2 not found: install the Debian package sasl2-bin")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    db = d / f"{name}.sasldb"
    realm = socket.gethostname()
    for user, password in users.items():
        proc = subprocess.run(
            [tool, "-c", "-p", "-f", str(db), "-u", realm, user],
            input=password.encode(), capture_output=True, check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"saslpasswd2 failed for {user}: {proc.stderr.decode().strip()}")
    (d / f"{name}.conf").write_text(
        "pwcheck_method: auxprop\n"
        "auxprop_plugin: sasldb\n"
        f"sasldb_path: {db}\n"
        f"mech_list: {' '.join(mechs)}\n"
    )
    return SaslConfig(str(d), name, str(db))
