"""``explain --token FILE``: the token's claims, the [token_auth] mapping, its validity and the
decision for its identity (a local issuer's keys in a jwks_file)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from amqp_policy_proxy.cli import EXIT_CONFIG, EXIT_DENY, EXIT_OK, main
from tests.support.issuer import AUDIENCE, ISSUER, Issuer


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Issuer]:
    issuer = Issuer()
    (tmp_path / "jwks.json").write_bytes(issuer.jwks())
    (tmp_path / "pw").write_text("pw\n")
    (tmp_path / "policy.json").write_text(json.dumps([["vhost", {
        "hostname": "$default", "allowUnknownUser": False,
        "groups": {"senders": {"remoteHosts": "*", "targets": "q.*"}}}]]))
    config = tmp_path / "config.toml"
    config.write_text(f'''[[listener]]
address = "127.0.0.1:5672"
[[upstream]]
address = "127.0.0.1:5673"
token_authority = "proxy"
service_username = "svc"
service_password_file = "pw"
[policy]
path = "policy.json"
[token_auth]
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
jwks_file = "jwks.json"
scope_prefix = "amqp-proxy."
[[token_auth.groups]]
vhost = "$default"
group = "senders"
scopes = ["send"]
''')
    return config, issuer


def explain(config: Path, token_file: Path, *extra: str) -> list[str]:
    return ["explain", "--config", str(config), "--token", str(token_file), "--host",
            "10.1.2.3", *extra]


def test_a_good_token_shows_its_claims_mapping_and_decision(setup, tmp_path, capsys):
    config, issuer = setup
    token = tmp_path / "t.jwt"
    token.write_text(issuer.token(scope="amqp-proxy.send openid") + "\n")
    assert main(explain(config, token, "--address", "q.orders", "--role", "sender")) == EXIT_OK
    out = capsys.readouterr().out
    assert "token: accepted" in out and '"sub": "alice"' in out
    assert "mapping: vhost '$default' -> group 'senders' (scope 'send')" in out
    assert "group: 'senders' from the token (scope 'send'" in out
    assert "RESULT: ALLOW" in out
    assert issuer.token(scope="amqp-proxy.send openid")[:20] not in out.split("claims:")[0]


def test_a_token_without_the_scope_falls_back_to_the_policy(setup, tmp_path, capsys):
    config, issuer = setup
    token = tmp_path / "t.jwt"
    token.write_text(issuer.token(scope="openid"))
    assert main(explain(config, token)) == EXIT_DENY  # alice is in no group of the policy
    assert "no [[token_auth.groups]] rule matches" in capsys.readouterr().out


@pytest.mark.parametrize(("changes", "reason"), [
    ({"exp": int(time.time()) - 100}, "expired"), ({"aud": "other"}, "bad_audience")])
def test_a_refused_token_says_why(setup, tmp_path, capsys, changes, reason):
    config, issuer = setup
    token = tmp_path / "t.jwt"
    token.write_text(issuer.token(**changes))
    assert main(explain(config, token, "--json")) == EXIT_DENY
    out = json.loads(capsys.readouterr().out)
    assert out["accepted"] is False and out["reason"] == reason


def test_token_needs_a_config_with_token_auth(tmp_path, capsys):
    policy = tmp_path / "policy.json"
    policy.write_text("[]")
    token = tmp_path / "t.jwt"
    token.write_text("x.y.z")
    assert main(["explain", "--policy", str(policy), "--token", str(token),
                 "--host", "10.1.2.3"]) == EXIT_CONFIG
    assert "--token needs --config" in capsys.readouterr().out
