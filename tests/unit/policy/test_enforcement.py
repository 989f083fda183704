"""The ``enforcement`` key (shadow mode): compiled per vhost and per group, validated with file,
key path and reason, shown by ``check`` and ``explain``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amqp_policy_proxy.cli import EXIT_DENY, EXIT_OK, main
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.errors import PolicyError
from amqp_policy_proxy.policy.explain import explain
from amqp_policy_proxy.policy.keys import Enforcement

SHADOW, ENFORCE = Enforcement.SHADOW, Enforcement.ENFORCE


def _vhosts() -> list[dict[str, Any]]:
    return [
        {"hostname": "trial", "enforcement": "shadow", "groups": {
            "users": {"users": "alice", "remoteHosts": "10.0.0.0/8"},
            "ops": {"users": "bob", "remoteHosts": "*", "enforcement": "enforce"}}},
        {"hostname": "prod", "groups": {
            "$default": {"users": "carol", "remoteHosts": "*"},
            "new": {"users": "dave", "remoteHosts": "10.0.0.0/8", "enforcement": "shadow",
                    "maxSessions": 1}}},
    ]


def _policy():
    return compile_policy([(None, _vhosts())])


def test_group_inherits_the_vhost_enforcement_unless_it_has_its_own() -> None:
    policy = _policy()
    trial, prod = policy.vhosts["trial"], policy.vhosts["prod"]
    assert (trial.enforcement, prod.enforcement) == (SHADOW, ENFORCE)
    assert trial.groups["users"].enforcement is SHADOW and trial.groups["users"].shadow
    assert trial.groups["ops"].enforcement is ENFORCE and not trial.groups["ops"].shadow
    assert prod.groups["$default"].enforcement is ENFORCE
    assert prod.groups["new"].enforcement is SHADOW
    assert policy.shadowed() == [("prod", ENFORCE, ("new",)), ("trial", SHADOW, ("users",))]


def test_enforcement_is_part_of_the_digest() -> None:
    base = _vhosts()
    other = _vhosts()
    del other[0]["enforcement"]
    assert compile_policy([(None, base)]).digest != compile_policy([(None, other)]).digest


@pytest.mark.parametrize(("value", "hint"), [("Shadow", " (write 'shadow')"), ("off", ""),
                                             (True, ""), (["shadow"], "")])
def test_a_bad_value_is_an_error_with_its_key_path(value: Any, hint: str) -> None:
    vhosts = _vhosts()
    vhosts[1]["groups"]["new"]["enforcement"] = value
    vhosts[0]["enforcement"] = value
    with pytest.raises(PolicyError) as info:
        compile_policy([("p.json", vhosts)])
    shown = value if isinstance(value, str) else json.dumps(value)
    assert [(i.file, i.path, i.message) for i in info.value.errors] == [
        ("p.json", "vhost[trial].enforcement",
         f"Policy vhost 'trial' option 'enforcement' has illegal value '{shown}': must be "
         f"'enforce' or 'shadow'{hint}"),
        ("p.json", "vhost[prod].groups.new.enforcement",
         f"Policy vhost 'prod' user group 'new' option 'enforcement' has illegal value "
         f"'{shown}': must be 'enforce' or 'shadow'{hint}"),
    ]


def test_check_names_the_vhosts_and_groups_in_shadow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_vhosts()))
    assert main(["check", "--policy", str(path)]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: 2 vhost(s): prod, trial;")
    assert out[1:] == [
        "shadow: vhost 'prod' (enforcement enforce); groups in shadow: 'new'",
        "shadow: vhost 'trial' (enforcement shadow); groups in shadow: 'users'",
    ]


def test_check_of_a_policy_without_shadow_prints_no_shadow_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    vhosts = _vhosts()[1:]
    del vhosts[0]["groups"]["new"]["enforcement"]
    path.write_text(json.dumps(vhosts))
    assert main(["check", "--policy", str(path)]) == EXIT_OK
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_explain_says_a_shadow_denial_is_not_enforced() -> None:
    result = explain(_policy(), user="alice", host="192.168.1.1", vhost="trial")
    assert not result.allowed and result.reason == "remote_host"
    assert result.enforcement is SHADOW
    assert result.lines[-2] == (
        "enforcement: shadow (group 'users'): this denial is not enforced: the proxy allows "
        "it, logs it as SHADOW DENY and counts it in amqp_proxy_shadow_denials_total")
    assert result.lines[-1] == "RESULT: DENY (remote_host)"


def test_explain_of_an_unknown_user_uses_the_vhost_enforcement() -> None:
    result = explain(_policy(), user="mallory", host="10.1.1.1", vhost="trial")
    assert result.reason == "unknown_user" and result.enforcement is SHADOW
    assert "(vhost 'trial')" in result.lines[-2]
    enforced = explain(_policy(), user="mallory", host="10.1.1.1", vhost="prod")
    assert enforced.enforcement is ENFORCE
    assert not any(line.startswith("enforcement:") for line in enforced.lines)


def test_explain_allowed_in_shadow_says_so_and_enforced_group_says_nothing() -> None:
    result = explain(_policy(), user="dave", host="10.1.1.1", vhost="prod")
    assert result.allowed and result.enforcement is SHADOW
    assert result.lines[-2].startswith("enforcement: shadow (group 'new'): nothing here is denied")
    ops = explain(_policy(), user="bob", host="10.1.1.1", vhost="trial")
    assert ops.enforcement is ENFORCE and ops.lines[-1] == "RESULT: ALLOW"
    assert not any(line.startswith("enforcement:") for line in ops.lines)


def test_explain_json_carries_the_enforcement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_vhosts()))
    assert main(["explain", "--policy", str(path), "--user", "alice", "--host", "192.168.1.1",
                 "--vhost", "trial", "--json"]) == EXIT_DENY
    result = json.loads(capsys.readouterr().out)
    assert (result["enforcement"], result["reason"]) == ("shadow", "remote_host")
    assert main(["explain", "--policy", str(path), "--user", "x", "--host", "1.2.3.4",
                 "--vhost", "nope", "--json"]) == EXIT_DENY
    assert json.loads(capsys.readouterr().out)["enforcement"] == "enforce"
