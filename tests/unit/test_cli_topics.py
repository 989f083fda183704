"""cli.py ``check`` and ``explain`` with the topic keys (docs/topic-authorization.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_DENY, EXIT_OK, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policy-topics"


@pytest.mark.parametrize("name", ["markets.json", "plant.yaml"])
def test_check_passes_on_the_topic_examples(name: str, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    assert main(["check", "--policy", str(EXAMPLES / name)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("ok: 1 vhost(s): ") and "warning" not in out


def test_check_prints_every_topic_issue(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([["vhost", {
        "hostname": "v",
        "topicTree": {"model": "anyAncestor", "nodes": {"A/#": {"publish": ["@nope"]}}},
        "permissionsCa": "ca.pem",
        "groups": {"g": {"users": "*", "remoteHosts": "*", "permissions": [
            {"topic": "#/x", "activity": "all", "type": "allow"}]}},
    }]]))
    assert main(["check", "--policy", str(path)]) == EXIT_CONFIG
    assert capsys.readouterr().out.splitlines() == [
        f"error: {path}: vhost[v].topicTree.nodes['A/#']: node 'A/#': token '#' holds a "
        "wildcard character ('+' or '#' in mqtt syntax); node names cannot hold wildcards",
        f"error: {path}: vhost[v].permissionsCa: permissionsCa without permissionsDocument has "
        "no effect",
        f"error: {path}: vhost[v].groups.g.permissions[0].topic: '#' must be the last token of "
        "'#/x'",
    ]


def test_check_reports_a_missing_dds_document(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dds.json"
    path.write_text(json.dumps([["vhost", {
        "hostname": "v", "permissionsDocument": "missing.p7s", "permissionsCa": "ca.pem"}]]))
    assert main(["check", "--policy", str(path)]) == EXIT_CONFIG
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"error: {path}: vhost[v].permissionsDocument: cannot load DDS "
                           "permissions document 'missing.p7s': ")


def test_explain_names_the_rule_and_the_delivery(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--policy", str(EXAMPLES / "markets.json"), "--vhost", "markets",
            "--user", "dev7", "--host", "10.1.1.1"]
    assert main([*args, "--address", "telemetry/dev7/temp", "--role", "sender",
                 "--qos", "2"]) == EXIT_DENY
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "topic: permissions: no rule matches publish 'telemetry/dev7/temp' at qos 2 for dev7; "
        "defaultBehaviour deny",
        "RESULT: DENY (topic)",
    ]
    assert main([*args, "--address", "telemetry/dev7/temp", "--role", "sender",
                 "--qos", "0", "--at", "2026-03-01T00:00:00Z"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == "RESULT: ALLOW"
    assert main(["explain", "--policy", str(EXAMPLES / "markets.json"), "--vhost", "markets",
                 "--user", "rita", "--host", "10.10.0.9", "--address", "orders/#",
                 "--role", "receiver", "--delivery-address", "orders/42"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[-2] == (
        "delivery: message to 'orders/42' is delivered unchanged: topicTree(nearestAcl) node "
        "'orders' defines subscribe: granted to rita via '@risk'; topicTree(nearestAcl) node "
        "'' (root) defines persistent: granted to rita via '*'")


def test_explain_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--policy", str(EXAMPLES / "markets.json"), "--vhost", "markets",
            "--user", "tina", "--host", "10.10.1.2"]
    assert main([*args, "--address", "x", "--role", "sender", "--at", "yesterday"]) == (
        EXIT_CONFIG)
    assert "is not an ISO 8601 time" in capsys.readouterr().out
    assert main([*args, "--address", "x", "--role", "sender",
                 "--delivery-address", "x"]) == EXIT_CONFIG
    assert "--delivery-address needs --address and --role receiver" in capsys.readouterr().out
    assert main([*args, "--address", "x", "--role", "sender", "--qos", "3"]) == EXIT_CONFIG
