"""cli.py: ``explain`` exit codes, ``--json`` and ``--config``; ``check``'s placeholder,
empty-policy and YAML ``*`` errors; logging flags before and after the subcommand (issue 15)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_DENY, EXIT_OK, build_parser, main
from amqp_policy_proxy.daemon.logs import JsonFormatter, TextFormatter
from tests.support import ME

POLICY = [["vhost", {
    "hostname": "shop",
    "groups": {
        "buyers": {"users": "alice", "remoteHosts": "10.0.0.0/8", "targets": "orders.${user}"},
    },
}]]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    return path


@pytest.fixture(autouse=True)
def _restore_root_logger():
    """main() installs its own handler on the root logger: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


# ---------------------------------------------------------------------------------- explain


def explain_args(policy: Path, *more: str) -> list[str]:
    return ["explain", "--policy", str(policy), "--vhost", "shop", "--user", "alice", *more]


def test_explain_exits_0_when_allowed_and_3_when_denied(policy_file: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(explain_args(policy_file, "--host", "10.1.2.3")) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT: ALLOW"
    assert main(explain_args(policy_file, "--host", "192.168.1.1")) == EXIT_DENY
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT: DENY (remote_host)"
    assert main(explain_args(policy_file, "--host", "10.1.2.3", "--address", "orders.bob",
                             "--role", "sender")) == EXIT_DENY


def test_explain_json(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain_args(policy_file, "--host", "10.1.2.3", "--address", "orders.alice",
                             "--role", "sender", "--json")) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["allowed"] is True and out["reason"] is None
    assert out["steps"][-1] == "RESULT: ALLOW"
    assert (out["user"], out["host"], out["vhost"], out["address"], out["role"]) == (
        "alice", "10.1.2.3", "shop", "orders.alice", "sender")
    assert main(explain_args(policy_file, "--host", "192.168.1.1", "--json")) == EXIT_DENY
    out = json.loads(capsys.readouterr().out)
    assert (out["allowed"], out["reason"]) == (False, "remote_host")


@pytest.mark.parametrize("host", ["alice-laptop", "10.1.2", "", "10.0.0.1:5672"])
def test_explain_invalid_host_is_a_usage_error(host: str, policy_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(explain_args(policy_file, "--host", host)) == EXIT_CONFIG
    assert "argument --host: " in capsys.readouterr().err


@pytest.mark.parametrize("host", ["::1", "[::ffff:10.1.2.3]", "fe80::1%eth0"])
def test_explain_accepts_socket_layer_addresses(host: str, policy_file: Path) -> None:
    assert main(explain_args(policy_file, "--host", host)) in (EXIT_OK, EXIT_DENY)


def test_explain_with_a_daemon_config_uses_its_policy_settings(
        tmp_path: Path, policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[listener]]\naddress = "0.0.0.0:5672"\n'
                      '[[upstream]]\naddress = "127.0.0.1:25672"\n'
                      '[policy]\npath = "policy.json"\ndefault_vhost = "shop"\n'
                      # files explain does not need may be absent on the operator's machine
                      '[event_log]\ndirectory = "/nonexistent/events"\n')
    args = ["explain", "--config", str(config), "--user", "alice", "--host", "10.1.2.3",
            "--vhost", "unknown.example"]
    assert main(args) == EXIT_OK  # the config's default_vhost applies
    assert "defaultVhost 'shop'" in capsys.readouterr().out
    assert main(["explain", "--policy", str(policy_file), "--user", "alice", "--host",
                 "10.1.2.3", "--vhost", "unknown.example"]) == EXIT_DENY
    capsys.readouterr()
    config.write_text('[[listener]]\naddress = "0.0.0.0:5672"\n')
    assert main(args) == EXIT_CONFIG
    assert capsys.readouterr().out.startswith(f"error: {config}: upstream: missing")


def test_explain_help_documents_the_exit_codes() -> None:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["explain"]  # type: ignore[union-attr]
    assert "Exit 0: allowed, 3: denied, 2: usage or policy error." in " ".join(
        sub.format_help().split())


# ---------------------------------------------------------------------------------- check


def test_check_rejects_an_unknown_placeholder(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps([["vhost", {"hostname": "v", "groups": {"g": {
        "users": "*", "remoteHosts": "*", "targets": "ok.${user}, tmp.${usr}"}}}]]))
    assert main(["check", "--policy", str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {path}: vhost[v].groups.g.targets[1]: Policy vhost 'v' user group 'g' policy "
        "key 'targets' item 'tmp.${usr}' holds unknown placeholder '${usr}': only '${user}' is "
        "substituted (QDR would match it literally)"]


def test_check_rejects_a_policy_without_vhost_unless_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "policy.d"
    empty.mkdir()
    assert main(["check", "--policy", str(empty)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {empty}: no policy files (*.json, *.yaml, *.yml) in directory"]
    assert main(["check", "--policy", str(empty), "--allow-empty"]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("ok: 0 vhost(s): (none);")
    (empty / "00-comments.json").write_text("# only a comment\n[]\n")
    assert main(["check", "--policy", str(empty)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {empty}: defines no vhost: every connection would be denied (no vhost); if "
        "that is intended, use check --allow-empty or [policy] allow_empty = true"]
    assert main(["check", "--policy", str(empty), "--allow-empty"]) == EXIT_OK


def test_check_config_honours_allow_empty(tmp_path: Path) -> None:
    (tmp_path / "policy.d").mkdir()
    config = tmp_path / "config.toml"
    text = ('[[listener]]\naddress = "127.0.0.1:5672"\n'
            '[[upstream]]\naddress = "127.0.0.1:25672"\n[policy]\npath = "policy.d"\n')
    config.write_text(text)
    assert main(["check", "--as-user", ME, "--config", str(config)]) == EXIT_CONFIG
    config.write_text(text + "allow_empty = true\n")
    assert main(["check", "--as-user", ME, "--config", str(config)]) == EXIT_OK


def test_check_knows_the_rate_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    vhost = {"hostname": "v", "maxConnectionRatePerHost": 50, "connectionRateBurst": 10,
             "groups": {"g": {"users": "*", "remoteHosts": "*", "maxMessageRatePerUser": 100,
                              "maxByteRatePerUser": 1000000, "maxConnectionRatePerUser": 5}}}
    path.write_text(json.dumps([["vhost", vhost]]))
    assert main(["check", "--policy", str(path)]) == EXIT_OK
    capsys.readouterr()
    vhost["groups"]["g"]["maxByteRatePerUser"] = -1
    vhost["maxMessageRatePerUser"] = 1
    path.write_text(json.dumps([["vhost", vhost]]))
    assert main(["check", "--policy", str(path)]) == EXIT_CONFIG
    out = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[2] for line in out] == [
        "vhost[v].maxMessageRatePerUser", "vhost[v].groups.g.maxByteRatePerUser"]
    config = tmp_path / "config.toml"
    path.write_text(json.dumps([["vhost", {"hostname": "v", "groups": {}}]]))
    config.write_text('[[listener]]\naddress = "127.0.0.1:5672"\n[[upstream]]\n'
                      'address = "127.0.0.1:25672"\n[policy]\npath = "p.json"\n'
                      'max_connection_rate = -3\n')
    assert main(["check", "--as-user", ME, "--config", str(config)]) == EXIT_CONFIG
    assert (f"error: {config}: policy.max_connection_rate: must be >= 0"
            in capsys.readouterr().out)


def test_check_hints_to_quote_a_bare_star_in_yaml(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("- hostname: v\n  groups:\n    g:\n      users: *\n"
                    "      remoteHosts: '*'\n")
    assert main(["check", "--policy", str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {path}: invalid YAML: line 4 column 15: expected alphabetic or numeric "
        "character, but found '\\n' (a value starting with '*' is a YAML alias: quote it, "
        "e.g. users: '*' or remoteHosts: '*')"]


# ---------------------------------------------------------------------------------- logging


@pytest.mark.parametrize("argv", [
    ["--log-level", "debug", "--log-format", "json", "check", "--policy", "x"],
    ["check", "--log-level", "DEBUG", "--log-format", "json", "--policy", "x"],
    ["--log-level", "info", "check", "--log-level", "debug", "--log-format", "json",
     "--policy", "x"],
])
def test_logging_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.log_level, args.log_format) == ("debug", "json")


def test_logging_flags_default_to_none_so_the_config_can_decide() -> None:
    args = build_parser().parse_args(["run", "--listen", "127.0.0.1:0"])
    assert (args.log_level, args.log_format) == (None, None)


def test_main_installs_the_chosen_formatter(policy_file: Path) -> None:
    main(["check", "--log-format", "json", "--policy", str(policy_file)])
    assert isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)
    main(["check", "--policy", str(policy_file), "--log-level", "warning"])
    root = logging.getLogger()
    assert isinstance(root.handlers[0].formatter, TextFormatter)
    assert root.level == logging.WARNING
    assert logging.getLogger("proton").level == logging.WARNING
