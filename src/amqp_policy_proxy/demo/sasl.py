"""Cyrus SASL configurations (config file + sasldb) for the demo/test broker.

A proton server checks SASL PLAIN (and SCRAM) passwords through Cyrus SASL when proton was built
with it (``proton.SASL.extended()``). Cyrus needs a config directory holding ``<name>.conf``::

    pwcheck_method: auxprop
    auxprop_plugin: sasldb
    sasldb_path: <dir>/<name>.sasldb
    mech_list: PLAIN ANONYMOUS

and a sasldb made with ``saslpasswd2`` (Debian ``sasl2-bin``; the PLAIN/SCRAM plugins come from
``libsasl2-modules``).

Realms and user names (observed with Cyrus SASL 2.1.28 and proton 0.40 on these machines):

- proton's Cyrus server passes no realm, so Cyrus uses the host name (``gethostname()``) as the
  default realm. ``saslpasswd2`` without ``-u`` stores users under that same realm
  (``sasldblistusers2`` shows ``alice@<hostname>``). A client logging in as ``alice`` is found, and
  the authenticated name the server reports (``Transport.user``) is plain ``alice``. Logging in
  as ``alice@<hostname>`` also works and is reported as ``alice@<hostname>``.
- With ``realm="R"`` (``saslpasswd2 -u R``) the user is ``alice@R``: the client must send
  ``alice@R`` (plain ``alice`` fails) and the server reports ``alice@R``.
- So: no realm (the default here) gives plain user names, which is what policy files expect.

Process-wide caveat: proton initialises the Cyrus *server* library once per process, with the
config path/name of the first server transport that does SASL; later ``config_path`` /
``config_name`` calls are silently ignored, while users added to that first sasldb later are
seen at once (the db is read at each authentication). :func:`shared_sasl_config` is the one
config every in-process broker can share; add users to it rather than making new configs.
"""

from __future__ import annotations

import atexit
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SHARED_MECHS",
    "SaslConfig",
    "SaslSetupError",
    "add_sasl_users",
    "load_sasl_config",
    "make_sasl_config",
    "mirror_sasl_users",
    "remove_sasl_users",
    "saslpasswd2_path",
    "shared_sasl_config",
]

#: Mechanisms of :func:`shared_sasl_config` (all checked against its sasldb, except ANONYMOUS).
SHARED_MECHS: tuple[str, ...] = ("PLAIN", "ANONYMOUS", "SCRAM-SHA-1", "SCRAM-SHA-256")

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MECH_RE = re.compile(r"^[A-Z0-9_-]+$")

_shared_lock = threading.Lock()
_shared: SaslConfig | None = None
_mirrors: dict[tuple[Path, str], list[SaslConfig]] = {}


class SaslSetupError(RuntimeError):
    """A SASL config or sasldb could not be made (``saslpasswd2`` missing or failing)."""


@dataclass(frozen=True)
class SaslConfig:
    """A Cyrus SASL server configuration on disk.

    Attributes:
        config_dir: the directory to give proton (``SASL.config_path``).
        config_name: the config file's base name (``SASL.config_name``); the file is
            ``config_dir / (config_name + ".conf")``.
        sasldb_path: the sasldb file holding the users' passwords.
        mechs: the ``mech_list`` written to the config file.
        realm: the realm users were created in (``None``: the host name, giving plain names).
        users: user name -> password of the users made through this module (kept so a broker
            can merge them into the process's active sasldb, see :mod:`.broker`); ``None``
            when unknown (a config loaded with :func:`load_sasl_config`). Not shown in repr.
    """

    config_dir: Path
    config_name: str
    sasldb_path: Path
    mechs: tuple[str, ...] = ("PLAIN", "ANONYMOUS")
    realm: str | None = None
    users: dict[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def config_file(self) -> Path:
        """The ``<config_name>.conf`` file."""
        return self.config_dir / f"{self.config_name}.conf"


def saslpasswd2_path() -> str:
    """Return the path of ``saslpasswd2``.

    Raises:
        SaslSetupError: when it is not installed (Debian package ``sasl2-bin``).
    """
    for candidate in (shutil.which("saslpasswd2"), "/usr/sbin/saslpasswd2"):
        if candidate and Path(candidate).exists():
            return candidate
    raise SaslSetupError(
        "saslpasswd2 not found: install the Debian package sasl2-bin "
        "(and libsasl2-modules for the PLAIN/SCRAM mechanisms)"
    )


def _check_user(user: str, password: str) -> None:
    if not user or any(ch in user for ch in "\0\r\n@"):
        raise ValueError(f"invalid SASL user name {user!r} (no '@', NUL or newlines)")
    if any(ch in password for ch in "\0\r\n"):
        raise ValueError(f"password of {user!r} contains NUL or a newline")


def add_sasl_users(config: SaslConfig, users: Mapping[str, str]) -> None:
    """Create or update users in ``config``'s sasldb (``saslpasswd2 -c -p``).

    Takes effect at once, also for running brokers using ``config``.

    Args:
        config: the configuration whose sasldb to change.
        users: user name -> password. Names carry no realm (``config.realm`` is applied).

    Raises:
        ValueError: for a user name containing ``@``, NUL or a newline, or a password with
            NUL or a newline.
        SaslSetupError: when ``saslpasswd2`` is missing or fails.
    """
    tool = saslpasswd2_path()
    for user, password in users.items():
        _check_user(user, password)
    targets = [config, *_mirrors_of(config)]
    for target in targets:
        _saslpasswd2_add(tool, target, users)
        if target.users is not None:
            target.users.update(users)


def _saslpasswd2_add(tool: str, config: SaslConfig, users: Mapping[str, str]) -> None:
    for user, password in users.items():
        cmd = [tool, "-c", "-p", "-f", str(config.sasldb_path)]
        if config.realm is not None:
            cmd += ["-u", config.realm]
        cmd.append(user)
        proc = subprocess.run(cmd, input=password.encode(), capture_output=True, check=False)
        if proc.returncode != 0:
            raise SaslSetupError(
                f"saslpasswd2 failed for user {user!r} (status {proc.returncode}): "
                f"{proc.stderr.decode(errors='replace').strip()}"
            )


def mirror_sasl_users(source: SaslConfig, target: SaslConfig) -> None:
    """From now on, also add users given to :func:`add_sasl_users` for ``source`` to ``target``.

    The broker uses this when ``source`` was merged into the process's active config
    ``target`` (the users ``source`` had then were copied already).
    """
    if _same_file(source, target):
        return
    with _shared_lock:
        _mirrors.setdefault(_key(source), [])
        if not any(_same_file(t, target) for t in _mirrors[_key(source)]):
            _mirrors[_key(source)].append(target)


def _key(config: SaslConfig) -> tuple[Path, str]:
    return (Path(config.config_dir).resolve(), config.config_name)


def _same_file(a: SaslConfig, b: SaslConfig) -> bool:
    return _key(a) == _key(b)


def _mirrors_of(config: SaslConfig) -> list[SaslConfig]:
    with _shared_lock:
        return list(_mirrors.get(_key(config), ()))


def load_sasl_config(config_dir: str | Path, config_name: str) -> SaslConfig:
    """Describe an existing Cyrus config ``<config_dir>/<config_name>.conf``.

    Reads ``mech_list`` (default: PLAIN ANONYMOUS) and ``sasldb_path`` (default:
    ``<config_dir>/<config_name>.sasldb``). The users are unknown (``users=None``).

    Raises:
        FileNotFoundError: when the config file does not exist.
    """
    directory = Path(config_dir).resolve()
    text = (directory / f"{config_name}.conf").read_text()
    options: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.lstrip().startswith("#"):
            options[key.strip()] = value.strip()
    mechs = tuple(m.upper() for m in options.get("mech_list", "PLAIN ANONYMOUS").split())
    sasldb = Path(options.get("sasldb_path", str(directory / f"{config_name}.sasldb")))
    return SaslConfig(directory, config_name, sasldb, mechs)


def remove_sasl_users(config: SaslConfig, users: Iterable[str]) -> None:
    """Delete users from ``config``'s sasldb (``saslpasswd2 -d``); absent users are ignored.

    Raises:
        SaslSetupError: when ``saslpasswd2`` is missing or fails.
    """
    tool = saslpasswd2_path()
    for user in users:
        cmd = [tool, "-d", "-f", str(config.sasldb_path)]
        if config.realm is not None:
            cmd += ["-u", config.realm]
        cmd.append(user)
        proc = subprocess.run(cmd, capture_output=True, check=False)
        if proc.returncode != 0:
            raise SaslSetupError(
                f"saslpasswd2 -d failed for {user!r}: {proc.stderr.decode(errors='replace')}"
            )


def make_sasl_config(
    directory: str | Path,
    users: Mapping[str, str],
    *,
    name: str = "proxy-test-broker",
    mechs: Iterable[str] = ("PLAIN", "ANONYMOUS"),
    realm: str | None = None,
) -> SaslConfig:
    """Write ``<directory>/<name>.conf`` and a sasldb ``<directory>/<name>.sasldb`` with users.

    Remember the process-wide caveat (module docstring): only the first config a process's
    brokers use is effective; prefer :func:`shared_sasl_config` inside test processes.

    Args:
        directory: where to write (created if missing).
        users: user name -> password (plain names, see ``realm``).
        name: config name (file base name: letters, digits, ``_.-``).
        mechs: mechanisms for ``mech_list`` (e.g. ``PLAIN``, ``ANONYMOUS``, ``SCRAM-SHA-256``).
        realm: create users in this realm (``saslpasswd2 -u``), so that clients log in as
            ``user@realm`` and are reported so. ``None`` (default) uses the host name, the
            server's default realm, so clients log in and are reported as plain ``user``.

    Returns:
        The :class:`SaslConfig`.

    Raises:
        ValueError: for a bad name, mechanism, user name or password.
        SaslSetupError: when ``saslpasswd2`` is missing (and ``users`` is not empty) or fails.
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid SASL config name {name!r}")
    mech_list = tuple(m.upper() for m in mechs)
    if not mech_list or not all(_MECH_RE.match(m) for m in mech_list):
        raise ValueError(f"invalid mechanism list {mechs!r}")
    if realm is not None and (not realm or any(ch in realm for ch in "\0\r\n@ ")):
        raise ValueError(f"invalid realm {realm!r}")
    if users:
        saslpasswd2_path()  # fail before writing anything
    config_dir = Path(directory).resolve()
    config_dir.mkdir(parents=True, exist_ok=True)
    config = SaslConfig(
        config_dir=config_dir,
        config_name=name,
        sasldb_path=config_dir / f"{name}.sasldb",
        mechs=mech_list,
        realm=realm,
        users={},
    )
    config.config_file.write_text(
        "pwcheck_method: auxprop\n"
        "auxprop_plugin: sasldb\n"
        f"sasldb_path: {config.sasldb_path}\n"
        f"mech_list: {' '.join(mech_list)}\n"
    )
    # saslpasswd2 creates the db with the first user; make an empty one when there is none so
    # that PLAIN fails cleanly ("authentication failed") instead of with a missing-file error.
    if config.sasldb_path.exists():
        config.sasldb_path.unlink()  # a fresh db: exactly ``users``
    if users:
        add_sasl_users(config, users)
    # With no users there is no db file yet: Cyrus then fails every password check cleanly
    # (ANONYMOUS still works), and saslpasswd2 creates the file with the first user.
    return config


def shared_sasl_config(users: Mapping[str, str] | None = None) -> SaslConfig:
    """The process-wide SASL config of in-process brokers, created on first use; adds ``users``.

    Lives in a temporary directory removed at exit. Mechanisms: :data:`SHARED_MECHS`; no realm
    (plain user names). Brokers built without an explicit SASL config use it, so any number of
    brokers and tests in one process can authenticate against it in any order.

    Args:
        users: user name -> password to create or update (optional).

    Returns:
        The shared :class:`SaslConfig`.

    Raises:
        SaslSetupError: when ``saslpasswd2`` is missing or fails.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            directory = Path(tempfile.mkdtemp(prefix="amqp-proxy-sasl-"))
            atexit.register(shutil.rmtree, directory, True)
            _shared = make_sasl_config(directory, {}, name="amqp-proxy-shared", mechs=SHARED_MECHS)
        config = _shared
    if users:
        add_sasl_users(config, users)
    return config
