"""daemon/config.py: one strict schema for ``check --config`` and ``run`` (issue 15, point 2).

Each broken configuration is checked for its exact message lines and exit code 2: all of them
through ``check --config`` in-process, a subset through the real console script as a
subprocess, for ``check`` and for ``run`` alike (``run`` must refuse exactly what ``check``
refuses, with the same lines on stderr, and no traceback).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_OK, main
from amqp_policy_proxy.daemon.config import (
    Address,
    AdminConfig,
    ConfigError,
    DaemonConfig,
    ListenerConfig,
    UpstreamConfig,
    admin_socket_from_file,
    config_from_mapping,
    config_from_sources,
    load_daemon_config,
)
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import ME

CLI = Path(sys.executable).with_name("amqp-policy-proxy")
ROOT = Path(__file__).resolve().parents[3]

LISTENER = '[[listener]]\naddress = "127.0.0.1:5672"\n'
UPSTREAM = '[[upstream]]\naddress = "127.0.0.1:25672"\n'
POLICY = '[policy]\npath = "policy.d"\n'
BASE = LISTENER + UPSTREAM + POLICY
TLS_LISTENER = ('[[listener]]\naddress = "127.0.0.1:5671"\ntls_cert = "server.crt"\n'
                'tls_key = "server.key"\ntls_ca = "ca.pem"\n')

# (id, config text, expected lines after "error: <file>: "; {d} is the config's directory)
CASES: list[tuple[str, str, list[str]]] = [
    ("tls-string", BASE.replace('25672"\n', '25672"\ntls = "false"\n'),
     ['upstream[0].tls: expected true or false, got a string ("false")']),
    ("require-client-cert-string",
     TLS_LISTENER + 'require_client_cert = "false"\n' + UPSTREAM + POLICY,
     ['listener[0].require_client_cert: expected true or false, got a string ("false")']),
    ("metrics-string", 'metrics = "127.0.0.1:9464"\n' + BASE,
     ['metrics: expected a table [metrics] with address = "HOST:PORT", got a string '
      '("127.0.0.1:9464")']),
    ("queue-size-string", BASE + '[event_log]\nqueue_size = "big"\n',
     ['event_log.queue_size: expected an integer, got a string ("big")']),
    ("tls-cert-integer",
     '[[listener]]\naddress = "127.0.0.1:5671"\ntls_cert = 1\ntls_key = "server.key"\n'
     + UPSTREAM + POLICY,
     ["listener[0].tls_cert: expected a string, got an integer (1)"]),
    ("listener-string", 'listener = "0.0.0.0:5672"\n' + UPSTREAM + POLICY,
     ['listener: expected an array of [[listener]] tables (two brackets), each with address = '
      '"HOST:PORT", got a string ("0.0.0.0:5672")']),
    ("listener-single-table", '[listener]\naddress = "0.0.0.0:5672"\n' + UPSTREAM + POLICY,
     ['listener: expected an array of [[listener]] tables (two brackets), each with address = '
      '"HOST:PORT", got a table: write [[listener]], not [listener]']),
    ("listener-array-of-strings", 'listener = ["0.0.0.0:5672"]\n' + UPSTREAM + POLICY,
     ['listener[0]: expected a table ([[listener]] tables (two brackets), each with address = '
      '"HOST:PORT"), got a string ("0.0.0.0:5672")']),
    ("no-listener", UPSTREAM + POLICY,
     ['listener: missing: at least one [[listener]] with address = "HOST:PORT" is required '
      "(or run --listen HOST:PORT)"]),
    ("empty-listener-array", "listener = []\n" + UPSTREAM + POLICY,
     ['listener: at least one [[listener]] with address = "HOST:PORT" is required '
      "(or run --listen HOST:PORT)"]),
    ("no-upstream", LISTENER + POLICY,
     ['upstream: missing: at least one [[upstream]] with address = "HOST:PORT" is required '
      "(or run --upstream HOST:PORT)"]),
    ("no-policy", LISTENER + UPSTREAM,
     ['policy: missing: a [policy] table with path = "..." is required (or run --policy PATH)']),
    ("no-policy-path", LISTENER + UPSTREAM + "[policy]\nmax_connections = 10\n",
     ["policy.path: missing: the policy file or directory is required (or run --policy PATH)"]),
    ("policy-path-missing", LISTENER + UPSTREAM + '[policy]\npath = "nope.d"\n',
     ["policy.path: {d}/nope.d: no such file or directory"]),
    ("unknown-table", BASE + '[metric]\naddress = "127.0.0.1:9464"\n',
     ["metric: unknown key (did you mean 'metrics'?)"]),
    ("unknown-key", BASE.replace('25672"\n', '25672"\ntsl = true\n'),
     ["upstream[0].tsl: unknown key (did you mean 'tls'?)"]),
    ("address-without-port", BASE.replace('"127.0.0.1:5672"', '"127.0.0.1"'),
     ["listener[0].address: bad address '127.0.0.1': expected HOST:PORT"]),
    ("port-out-of-range", BASE.replace('"127.0.0.1:5672"', '"127.0.0.1:70000"'),
     ["listener[0].address: bad address '127.0.0.1:70000': port out of range 0..65535"]),
    ("address-integer", BASE.replace('"127.0.0.1:25672"', "25672"),
     ['upstream[0].address: expected a "HOST:PORT" string, got an integer (25672)']),
    ("ipv6-without-brackets", BASE.replace('"127.0.0.1:25672"', '"[::1:25672"'),
     ["upstream[0].address: bad address '[::1:25672': expected [HOST]:PORT"]),
    ("max-connections-negative", BASE + "max_connections = -1\n",
     ["policy.max_connections: must be >= 0, got an integer (-1)"]),
    ("max-connections-float", BASE + "max_connections = 1.5\n",
     ["policy.max_connections: expected an integer, got a float (1.5)"]),
    ("enable-vhost-policy-string", BASE + 'enable_vhost_policy = "yes"\n',
     ['policy.enable_vhost_policy: expected true or false, got a string ("yes")']),
    ("default-vhost-integer", BASE + "default_vhost = 5\n",
     ["policy.default_vhost: expected a string, got an integer (5)"]),
    ("handshake-zero", BASE + "[timeouts]\nhandshake_seconds = 0\n",
     ["timeouts.handshake_seconds: must be > 0, got an integer (0)"]),
    ("connect-seconds-string", BASE + '[timeouts]\nconnect_seconds = "5"\n',
     ['timeouts.connect_seconds: expected a number, got a string ("5")']),
    ("timeouts-array", "timeouts = [1]\n" + BASE,
     ["timeouts: expected a table [timeouts], got an array"]),
    ("log-level", BASE + '[logging]\nlevel = "verbose"\n',
     ["logging.level: must be 'debug', 'info', 'warning' or 'error', got a string "
      '("verbose")']),
    ("log-format", BASE + '[logging]\nformat = "xml"\n',
     ["logging.format: must be 'text' or 'json', got a string (\"xml\")"]),
    ("tls-cert-without-key",
     '[[listener]]\naddress = "127.0.0.1:5671"\ntls_cert = "server.crt"\n' + UPSTREAM + POLICY,
     ["listener[0]: tls_cert and tls_key must be given together"]),
    ("client-cert-without-ca",
     '[[listener]]\naddress = "127.0.0.1:5671"\ntls_cert = "server.crt"\n'
     'tls_key = "server.key"\nrequire_client_cert = true\n' + UPSTREAM + POLICY,
     ["listener[0]: require_client_cert needs tls_ca (the CA that signs client certificates)"]),
    ("client-cert-on-plain-listener",
     LISTENER + 'tls_ca = "ca.pem"\n' + UPSTREAM + POLICY,
     ["listener[0]: tls_ca and require_client_cert need tls_cert and tls_key (a plain listener "
      "cannot verify client certificates)"]),
    ("upstream-tls-files-without-tls", LISTENER + UPSTREAM + 'tls_ca = "ca.pem"\n' + POLICY,
     ["upstream[0]: tls_ca set but tls is false (set tls = true)"]),
    ("tls-cert-missing",
     '[[listener]]\naddress = "127.0.0.1:5671"\ntls_cert = "missing.crt"\n'
     'tls_key = "server.key"\n' + UPSTREAM + POLICY,
     ["listener[0].tls_cert: {d}/missing.crt: no such file"]),
    ("tls-ca-is-a-directory", LISTENER + UPSTREAM + 'tls = true\ntls_ca = "policy.d"\n' + POLICY,
     ["upstream[0].tls_ca: {d}/policy.d: not a regular file"]),
    ("event-log-dir-is-a-file", BASE + '[event_log]\ndirectory = "server.crt"\n',
     ["event_log.directory: {d}/server.crt: not a directory"]),
    ("duplicate-listeners", LISTENER + BASE,
     ["listener: listener[0] and listener[1] both listen on 127.0.0.1:5672"]),
    ("admin-unknown-group", BASE + '[admin]\nsocket = "a.sock"\ngroup = "no-such-group"\n',
     ["admin.group: group 'no-such-group' does not exist"]),
    ("admin-address-without-token", BASE + '[admin]\naddress = "127.0.0.1:9465"\n',
     ["admin: address needs token_file (the TCP admin listener only serves requests with a "
      "bearer token)"]),
    ("admin-token-without-address", BASE + '[admin]\nsocket = "a.sock"\n'
     'token_file = "server.key"\n',
     ["admin: token_file without address has no effect (the unix socket is protected by its "
      "mode and group)"]),
    ("admin-token-missing", BASE + '[admin]\naddress = "127.0.0.1:9465"\n'
     'token_file = "nope.token"\n',
     ["admin.token_file: {d}/nope.token: no such file"]),
    ("admin-socket-integer", BASE + "[admin]\nsocket = 1\n",
     ["admin.socket: expected a string, got an integer (1)"]),
    ("toml-syntax", '[[listener]]\naddress = 127.0.0.1:5672\n' + UPSTREAM + POLICY,
     ["line 2 column 16: invalid TOML: expected newline or end of document after a "
      "statement"]),
    ("proxy-protocol-without-from", LISTENER + "proxy_protocol = true\n" + UPSTREAM + POLICY,
     ["listener[0]: proxy_protocol needs proxy_protocol_from (the load balancers' addresses: "
      "only they may connect)"]),
    ("proxy-protocol-from-without-switch",
     LISTENER + 'proxy_protocol_from = ["10.0.0.0/8"]\n' + UPSTREAM + POLICY,
     ["listener[0]: proxy_protocol_from set but proxy_protocol is false (set proxy_protocol = "
      "true)"]),
    ("proxy-protocol-from-host-bits",
     LISTENER + 'proxy_protocol = true\nproxy_protocol_from = ["10.0.0.1/8", "lb.example"]\n'
     + UPSTREAM + POLICY,
     ["listener[0].proxy_protocol_from[0]: 10.0.0.1/8 has host bits set (did you mean "
      "10.0.0.0/8?)",
      "listener[0].proxy_protocol_from[1]: 'lb.example' does not appear to be an IPv4 or IPv6 "
      "network"]),
    ("proxy-protocol-from-string",
     LISTENER + 'proxy_protocol = true\nproxy_protocol_from = "10.0.0.0/8"\n' + UPSTREAM + POLICY,
     ['listener[0].proxy_protocol_from: expected an array, got a string ("10.0.0.0/8")']),
    ("every-problem-at-once",
     'metrics = "127.0.0.1:9464"\n' + LISTENER + UPSTREAM + 'tls = "false"\n' + POLICY
     + '[event_log]\nqueue_size = "big"\n',
     ['upstream[0].tls: expected true or false, got a string ("false")',
      'metrics: expected a table [metrics] with address = "HOST:PORT", got a string '
      '("127.0.0.1:9464")',
      'event_log.queue_size: expected an integer, got a string ("big")']),
]

# run as subprocesses too (check and run): the issue's own examples and a few others
SUBPROCESS = {"tls-string", "require-client-cert-string", "metrics-string", "queue-size-string",
              "tls-cert-integer", "listener-string", "toml-syntax", "every-problem-at-once"}


@pytest.fixture
def confdir(tmp_path: Path) -> Path:
    """A directory with a valid policy.d and dummy TLS files (content is checked later)."""
    (tmp_path / "policy.d").mkdir()
    (tmp_path / "policy.d" / "10-shop.json").write_text(json.dumps(
        [["vhost", {"hostname": "shop", "groups": {"g": {"users": "*", "remoteHosts": "*"}}}]]))
    for name in ("server.crt", "server.key", "ca.pem"):
        (tmp_path / name).write_text("PEM\n")
    return tmp_path


def write(confdir: Path, text: str) -> Path:
    path = confdir / "config.toml"
    path.write_text(text)
    return path


def test_there_are_at_least_25_broken_configurations() -> None:
    assert len(CASES) >= 25
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_check_reports_every_problem(name: str, text: str, expected: list[str], confdir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write(confdir, text)
    assert main(["check", "--as-user", ME, "--config", str(path)]) == EXIT_CONFIG
    out = capsys.readouterr()
    assert out.out.splitlines() == [f"error: {path}: {e.format(d=confdir)}" for e in expected]
    assert "Traceback" not in out.out + out.err


@pytest.mark.slow
@pytest.mark.parametrize(("name", "text", "expected"), [c for c in CASES if c[0] in SUBPROCESS],
                         ids=sorted(SUBPROCESS, key=[c[0] for c in CASES].index))
@pytest.mark.parametrize("command", ["check", "run"])
def test_real_cli_run_and_check_refuse_alike(command: str, name: str, text: str,
                                             expected: list[str], confdir: Path) -> None:
    path = write(confdir, text)
    as_me = ["--as-user", ME] if command == "check" else []
    result = subprocess.run([str(CLI), command, *as_me, "--config", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == EXIT_CONFIG
    shown = result.stdout if command == "check" else result.stderr
    assert shown.splitlines() == [f"error: {path}: {e.format(d=confdir)}" for e in expected]
    assert "Traceback" not in result.stdout + result.stderr


def test_a_valid_file_becomes_the_daemon_dataclasses(confdir: Path) -> None:
    path = write(confdir, TLS_LISTENER + "require_client_cert = true\n"
                 + '[[listener]]\naddress = "[::1]:0"\n'
                 + UPSTREAM + 'tls = true\ntls_server_name = "router"\n'
                 + POLICY + "max_connections = 7\nallow_empty = true\n"
                 + '[metrics]\naddress = "127.0.0.1:9464"\n'
                 + '[event_log]\ndirectory = "events"\nqueue_size = 5\n'
                 + "[timeouts]\nhandshake_seconds = 2\nshutdown_grace_seconds = 1.5\n"
                 + "connect_seconds = 3\n[logging]\nlevel = \"DEBUG\"\nformat = \"json\"\n")
    config = load_daemon_config(path)
    assert config == DaemonConfig(
        listeners=(ListenerConfig(Address("127.0.0.1", 5671), str(confdir / "server.crt"),
                                  str(confdir / "server.key"), str(confdir / "ca.pem"), True),
                   ListenerConfig(Address("::1", 0))),
        upstreams=(UpstreamConfig(Address("127.0.0.1", 25672), tls=True,
                                  tls_server_name="router"),),
        policy_path=str(confdir / "policy.d"),
        policy=PolicySettings(max_connections=7),
        allow_empty_policy=True,
        metrics_address=Address("127.0.0.1", 9464),
        event_log_dir=str(confdir / "events"), event_log_queue=5,
        handshake_seconds=2.0, shutdown_grace_seconds=1.5, connect_timeout_seconds=3.0,
        log_level="debug", log_format="json", source=str(path),
    )
    # the dataclasses stay plain frozen dataclasses for tests and the demo
    assert replace(config, handshake_seconds=9).handshake_seconds == 9


def test_the_shipped_example_is_valid_without_its_files() -> None:
    config = load_daemon_config(ROOT / "examples" / "etc" / "amqp-policy-proxy" / "config.toml",
                                check_files=False)
    assert [str(lc.address) for lc in config.listeners] == ["0.0.0.0:5672"]


def test_mapping_without_file_names_no_file() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"listener": [{"address": "x"}]}, source=None, check_files=False)
    assert info.value.issues == [
        "listener[0].address: bad address 'x': expected HOST:PORT",
        'upstream: missing: at least one [[upstream]] with address = "HOST:PORT" is required '
        "(or run --upstream HOST:PORT)",
        'policy: missing: a [policy] table with path = "..." is required (or run --policy PATH)',
    ]


def test_command_line_values_are_blamed_on_their_flags(confdir: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    path = write(confdir, BASE)
    code = main(["run", "--config", str(path), "--policy", str(confdir / "gone"),
                 "--max-connections", "-3"])
    assert code == EXIT_CONFIG
    assert capsys.readouterr().err.splitlines() == [
        f"error: command line: --policy: {confdir}/gone: no such file or directory",
        "error: command line: --max-connections: must be >= 0, got an integer (-3)",
    ]


def test_flags_complete_a_file_that_lacks_listeners(confdir: Path) -> None:
    """`run --config f --listen ...`: the merged result is validated, not the file alone."""
    from amqp_policy_proxy.cli import build_parser, config_from_args

    path = write(confdir, UPSTREAM + POLICY)
    args = build_parser().parse_args(["run", "--config", str(path), "--listen", "127.0.0.1:0"])
    config = config_from_args(args)
    assert config.listeners == (ListenerConfig(Address("127.0.0.1", 0)),)


def test_proxy_protocol_keys_become_the_listener_config(confdir: Path) -> None:
    import ipaddress

    path = write(confdir, LISTENER + 'proxy_protocol = true\nproxy_protocol_from = '
                 '["10.0.0.0/8", "fd00::/8", "192.0.2.7"]\n' + UPSTREAM + POLICY)
    (listener,) = load_daemon_config(path).listeners
    assert listener.proxy_protocol
    assert listener.proxy_protocol_from == (ipaddress.ip_network("10.0.0.0/8"),
                                            ipaddress.ip_network("fd00::/8"),
                                            ipaddress.ip_network("192.0.2.7/32"))


def test_proxy_protocol_from_flag_turns_it_on_for_every_listen(confdir: Path) -> None:
    import ipaddress

    from amqp_policy_proxy.cli import build_parser, config_from_args

    path = write(confdir, BASE)
    args = build_parser().parse_args([
        "run", "--config", str(path), "--listen", "127.0.0.1:0", "--listen", "[::1]:0",
        "--proxy-protocol-from", "127.0.0.1/32", "--proxy-protocol-from", "::1"])
    nets = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128"))
    assert [(lc.proxy_protocol, lc.proxy_protocol_from) for lc in
            config_from_args(args).listeners] == [(True, nets), (True, nets)]


def test_proxy_protocol_from_flag_needs_listen(confdir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(confdir, BASE)
    assert main(["run", "--config", str(path), "--proxy-protocol-from", "10.0.0.0/8"]) == (
        EXIT_CONFIG)
    assert capsys.readouterr().err.splitlines() == [
        "error: command line: --proxy-protocol-from: applies to the --listen addresses; give "
        "--listen too, or set proxy_protocol and proxy_protocol_from in the [[listener]] tables"]
    assert main(["run", "--listen", "127.0.0.1:0", "--proxy-protocol-from", "10.0.0.1/8"]) == (
        EXIT_CONFIG)
    assert "argument --proxy-protocol-from: 10.0.0.1/8 has host bits set" in (
        capsys.readouterr().err)


def test_bad_listen_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--listen", "nowhere"]) == EXIT_CONFIG
    assert "argument --listen: bad address 'nowhere': expected HOST:PORT" in (
        capsys.readouterr().err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_event_log_directory_must_be_writable(confdir: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    locked = confdir / "locked"
    locked.mkdir(mode=0o500)
    path = write(confdir, BASE + '[event_log]\ndirectory = "locked/events"\n')
    assert main(["check", "--as-user", ME, "--config", str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {path}: event_log.directory: {locked}/events: does not exist and cannot be "
        f"created ({locked} is not writable by this user)"]


def test_event_log_directory_that_can_be_created_is_fine(confdir: Path) -> None:
    path = write(confdir, BASE + '[event_log]\ndirectory = "new/events"\n')
    assert load_daemon_config(path).event_log_dir == str(confdir / "new" / "events")


# ---------------------------------------------------------------------------------- binding


def busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["listener", "metrics"])
def test_a_port_in_use_names_the_address_and_exits_2(what: str, confdir: Path) -> None:
    sock, port = busy_port()
    try:
        listener = port if what == "listener" else 0
        metrics = port if what == "metrics" else 0
        path = write(confdir, f'[[listener]]\naddress = "127.0.0.1:{listener}"\n' + UPSTREAM
                     + POLICY + f'[metrics]\naddress = "127.0.0.1:{metrics}"\n')
        result = subprocess.run([str(CLI), "run", "--config", str(path)], capture_output=True,
                                text=True, timeout=60)
    finally:
        sock.close()
    assert result.returncode == EXIT_CONFIG
    key = "listener[0].address" if what == "listener" else "metrics.address"
    assert (f"error: {path}: {key}: cannot listen on 127.0.0.1:{port}: Address already in use"
            in result.stderr.splitlines())
    assert "Traceback" not in result.stderr and "[Errno" not in result.stderr


# ---------------------------------------------------------------------------------- docs


def test_admin_table_and_its_flag(confdir: Path) -> None:
    path = write(confdir, BASE + '[admin]\nsocket = "run/admin.sock"\ngroup = "nogroup"\n'
                                 'address = "127.0.0.1:0"\ntoken_file = "server.key"\n')
    admin = load_daemon_config(path).admin
    assert admin == AdminConfig(socket=str(confdir / "run" / "admin.sock"), group="nogroup",
                                address=Address("127.0.0.1", 0),
                                token_file=str(confdir / "server.key"))
    assert load_daemon_config(write(confdir, BASE)).admin is None
    # run --admin-socket replaces the file's (relative to the working directory)
    config = config_from_sources(path, overrides={"admin.socket": ("--admin-socket", "/x.sock")})
    assert config.admin is not None and config.admin.socket == "/x.sock"


def test_admin_socket_from_file_reads_only_the_admin_table(confdir: Path) -> None:
    # the rest of the file is broken: the admin commands must still find the socket
    path = write(confdir, 'listener = "nonsense"\n[admin]\nsocket = "admin.sock"\n')
    assert admin_socket_from_file(path) == str(confdir / "admin.sock")
    assert admin_socket_from_file(write(confdir, BASE)) is None
    with pytest.raises(ConfigError) as info:
        admin_socket_from_file(write(confdir, BASE + "[admin]\nsocket = 1\n"))
    assert info.value.issues == [
        f"{confdir / 'config.toml'}: admin.socket: expected a string, got an integer (1)"]


def test_configuration_reference_is_generated_from_the_schema() -> None:
    from amqp_policy_proxy.daemon.config import reference_markdown

    text = (ROOT / "docs" / "configuration.md").read_text()
    begin, end = "<!-- BEGIN GENERATED: keys -->\n", "<!-- END GENERATED: keys -->"
    assert begin in text and end in text
    section = text.split(begin, 1)[1].split(end, 1)[0]
    assert section.strip() == reference_markdown().strip(), (
        "docs/configuration.md is out of date: run scripts/gen-config-docs.py")
    for key in ("connect_seconds", "queue_size", "allow_empty", "require_client_cert"):
        assert f"`{key}`" in section


def test_reference_names_a_key_from_its_key_type_and_its_docstring() -> None:
    """The reference's type column comes from the key type, the description from the docstring
    below the field; a key with neither a docstring nor a type name it knows is a schema
    mistake, not a blank cell."""
    from amqp_policy_proxy.daemon import config as schema

    class Demo(schema._Table):
        """``[demo]``: a table of this test."""

        wait: schema.Seconds = 1.0
        """How long, in
        seconds."""
        name: schema.NonEmpty | None = None
        mode: Literal["a", "b"] = "a"
        """Which."""
        odd: int = 0

    assert schema._key_docs(Demo) == {"wait": "How long, in seconds.", "mode": "Which."}
    fields = Demo.model_fields
    assert schema._toml_type(fields["wait"]) == "number > 0 (seconds)"
    assert schema._toml_type(fields["name"]) == "string"
    assert schema._toml_type(fields["mode"]) == "string"
    with pytest.raises(TypeError, match="no TOML type name"):
        schema._toml_type(fields["odd"])


def test_check_accepts_the_example_it_ships(confdir: Path) -> None:
    """The example from docs/configuration.md validates (files made relative to confdir)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    example = example.replace("/var/log/amqp-policy-proxy/events", "events")
    path = write(confdir, example)
    assert main(["check", "--as-user", ME, "--config", str(path)]) == EXIT_OK


# ---------------------------------------------------------------------------------- property

_SCALARS = st.one_of(st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=False),
                     st.text(max_size=12), st.just("a\nb"), st.sampled_from(["127.0.0.1:0", "[::1]:1", "policy.d"]))
_KEYS = st.sampled_from(["new\nline", "listener", "upstream", "policy", "metrics", "event_log", "timeouts",
                         "logging", "address", "tls", "tls_cert", "path", "queue_size",
                         "connect_seconds", "level", "format", "max_connections", "x"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_any_toml_shaped_input_is_valid_or_a_config_error(raw: dict) -> None:
    """No input makes validation raise anything but ConfigError, and every issue is one line."""
    try:
        config_from_mapping(raw, source="f.toml", check_files=False)
    except ConfigError as exc:
        assert exc.issues
        assert all(issue.startswith("f.toml: ") and "\n" not in issue for issue in exc.issues)


MINIMAL = ('[[listener]]\naddress = "127.0.0.1:0"\n[[upstream]]\naddress = "127.0.0.1:1"\n'
           '[policy]\npath = "p.json"\n')


@pytest.mark.parametrize("text, expected", [
    ('[daemon]\nworkers = 2\n',
     "daemon.workers = 2 needs a [ledger] (url = \"redis://...\") or ledger = \"auto\""),
    ('[ledger]\nurl = "http://x"\n', "ledger.url: expected redis://HOST:PORT/DB"),
    ('[ledger]\nurl = "unix://relative.sock"\n', "ledger.url: unix:// needs an absolute"),
    ('[ledger]\nurl = "redis://r:6379/0"\nfailure_mode = "fail-open"\n',
     "ledger.failure_mode: must be 'local-share', 'closed' or 'open'"),
    ('[ledger]\nurl = "redis://r:6379/0"\nlease_seconds = 0\n',
     "ledger.lease_seconds: must be > 0"),
])
def test_ledger_and_workers_are_checked(confdir: Path, text: str, expected: str) -> None:
    (confdir / "p.json").write_text("[]")
    path = confdir / "c.toml"
    path.write_text(MINIMAL + text)
    with pytest.raises(ConfigError) as err:
        load_daemon_config(path, check_files=False)
    assert any(expected in issue for issue in err.value.issues), err.value.issues


def test_ledger_auto_shorthand_and_workers(confdir: Path) -> None:
    path = confdir / "c.toml"
    path.write_text('ledger = "auto"\n' + MINIMAL + '[daemon]\nworkers = 3\n')
    config = load_daemon_config(path, check_files=False)
    assert config.workers == 3
    assert config.ledger is not None and config.ledger.url == "auto"
    assert (config.ledger.lease_seconds, config.ledger.timeout_ms,
            config.ledger.failure_mode, config.ledger.proxy_id) == (10.0, 1000.0, "local-share", "")
    # flags lay over the shorthand
    config = config_from_sources(path, overrides={
        "ledger.proxy_id": ("--proxy-id", "edge-1"),
        "ledger.failure_mode": ("--ledger-failure-mode", "closed")}, check_files=False)
    assert config.ledger is not None
    assert (config.ledger.url, config.ledger.proxy_id, config.ledger.failure_mode) == (
        "auto", "edge-1", "closed")


def test_check_refuses_workers_without_a_ledger(confdir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (confdir / "p.json").write_text(json.dumps([["vhost", {"hostname": "$default"}]]))
    path = confdir / "c.toml"
    path.write_text(MINIMAL + "[daemon]\nworkers = 2\n")
    assert main(["check", "--as-user", ME, "--config", str(path)]) == EXIT_CONFIG
    assert "needs a [ledger]" in capsys.readouterr().out


def test_event_log_compact_after(confdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """[event_log] compact_after: off by default, seconds (at least 60), needs a directory."""
    assert load_daemon_config(write(confdir, BASE)).event_log_compact_after is None
    path = write(confdir, BASE + '[event_log]\ndirectory = "ev"\ncompact_after = 900\n')
    assert load_daemon_config(path).event_log_compact_after == 900.0
    for text, said in (('directory = "ev"\ncompact_after = 30\n', "compact_after"),
                       ("compact_after = 900\n", "compact_after needs directory")):
        bad = write(confdir, BASE + "[event_log]\n" + text)
        assert main(["check", "--as-user", ME, "--config", str(bad)]) == EXIT_CONFIG
        out = capsys.readouterr().out
        assert said in out and "event_log" in out, out
