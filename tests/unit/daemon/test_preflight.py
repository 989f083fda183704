"""``check``'s preflight (daemon/preflight.py): the bind test, and the files as another user.

The ``--as-user`` tests need root (to become ``nobody``) and skip otherwise; they work in a
0755 temporary directory of their own, since pytest's base directory is 0700.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_OK, main
from amqp_policy_proxy.daemon.config import load_daemon_config
from amqp_policy_proxy.daemon.preflight import SERVICE_USER, bind_test, service_user
from tests.support import ME
from tests.support.ports import free_port

POLICY = ('[["vhost", {"hostname": "shop", "groups": {"g": {"users": "alice", '
          '"remoteHosts": "*"}}}]]\n')


def write_config(directory: Path, listener: int, metrics: int | None = None,
                 extra: str = "", policy: str = "policy.json") -> Path:
    """A minimal config in ``directory`` with its policy; returns the config's path."""
    (directory / "policy.json").write_text(POLICY)
    text = (f'[[listener]]\naddress = "127.0.0.1:{listener}"\n'
            f'[[upstream]]\naddress = "127.0.0.1:5673"\n'
            f'[policy]\npath = "{policy}"\n')
    if metrics is not None:
        text += f'[metrics]\naddress = "127.0.0.1:{metrics}"\n'
    path = directory / "config.toml"
    path.write_text(text + extra)
    return path


@pytest.fixture
def held() -> Iterator[int]:
    """A port some other socket listens on (as qdrouterd would, still on the old port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_bind_test_names_each_address_that_cannot_be_bound(tmp_path: Path, held: int) -> None:
    config = load_daemon_config(write_config(tmp_path, listener=held, metrics=held))
    assert bind_test(config) == [
        f"{tmp_path / 'config.toml'}: listener[0].address: cannot listen on 127.0.0.1:{held}: "
        f"Address already in use",
        f"{tmp_path / 'config.toml'}: metrics.address: cannot listen on 127.0.0.1:{held}: "
        f"Address already in use",
    ]
    free = load_daemon_config(write_config(tmp_path, listener=free_port(), metrics=0))
    assert bind_test(free) == []


def test_bind_test_reports_an_address_not_on_this_host(tmp_path: Path) -> None:
    path = write_config(tmp_path, listener=free_port())
    path.write_text(path.read_text().replace("127.0.0.1:", "198.51.100.254:", 1))
    (problem,) = bind_test(load_daemon_config(path))
    assert problem.endswith("Cannot assign requested address"), problem


def test_check_fails_on_a_port_in_use_unless_told_not_to_bind(
        tmp_path: Path, held: int, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, listener=held)
    assert main(["check", "--as-user", ME, "--config", str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {path}: listener[0].address: cannot listen on 127.0.0.1:{held}: "
        f"Address already in use"]
    # the unit's ExecReload: the running daemon holds its own ports
    assert main(["check", "--as-user", ME, "--no-bind-test", "--config", str(path)]) == EXIT_OK
    assert capsys.readouterr().out.startswith("ok: 1 vhost(s): shop; digest ")


def test_service_user_defaults_to_the_package_user_only_for_root() -> None:
    assert service_user(ME) is None                        # oneself: no child process
    with pytest.raises(LookupError, match="no such user 'no-such-user-x'"):
        service_user("no-such-user-x")
    default = service_user(None)
    if os.geteuid() != 0:
        assert default is None
    else:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            assert default is None
        else:
            assert default is not None and default.pw_name == SERVICE_USER


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temporary directory every user may enter (0755), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="amqp-policy-proxy-preflight-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_as_user_reports_a_policy_file_only_root_can_read(
        shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(shared_dir, listener=free_port())
    (shared_dir / "policy.json").chmod(0o600)
    assert main(["check", "--as-user", "nobody", "--config", str(path)]) == EXIT_CONFIG
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"error: {path}: policy.path: {shared_dir / 'policy.json'}: not readable by this user",
        "error: the checks above ran as user nobody, as the service will (--as-user); give "
        "that user access to the files named"]
    # root itself can read it: checked as root only, it passes
    assert main(["check", "--as-user", "root", "--config", str(path)]) == EXIT_OK
    (shared_dir / "policy.json").chmod(0o644)
    assert main(["check", "--as-user", "nobody", "--config", str(path)]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1].endswith("; files checked as user nobody")


@needs_root
def test_as_user_says_a_directory_is_not_searchable_not_that_a_file_is_missing(
        shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private = shared_dir / "private"
    private.mkdir(mode=0o700)
    (private / "policy.json").write_text(POLICY)
    path = write_config(shared_dir, listener=free_port(), policy="private/policy.json")
    assert main(["check", "--as-user", "nobody", "--config", str(path)]) == EXIT_CONFIG
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"error: {path}: policy.path: {private / 'policy.json'}: cannot be reached "
                     f"by this user ({private} is not searchable)")


@needs_root
def test_as_user_checks_the_event_log_directory_as_run_will_create_it(
        shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = shared_dir / "log"
    logs.mkdir(mode=0o755)     # root's, as /var/log: the service user cannot create in it
    path = write_config(shared_dir, listener=free_port(),
                        extra=f'[event_log]\ndirectory = "{logs}/events"\n')
    assert main(["check", "--as-user", "nobody", "--config", str(path)]) == EXIT_CONFIG
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"error: {path}: event_log.directory: {logs}/events: does not exist and "
                     f"cannot be created ({logs} is not writable by this user)")
    # made for the service user, as the package's postinst does: fine
    (logs / "events").mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(logs / "events", nobody.pw_uid, nobody.pw_gid)
    assert main(["check", "--as-user", "nobody", "--config", str(path)]) == EXIT_OK
