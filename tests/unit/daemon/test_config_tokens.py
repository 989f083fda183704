"""[token_auth] and the upstreams' token_authority in the daemon's config: what a token setup
needs, checked together, every problem one line naming the file, the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_policy_proxy.cli import EXIT_CONFIG, main
from amqp_policy_proxy.daemon.config import ConfigError, load_daemon_config
from tests.support import ME

BASE = '''[[listener]]
address = "127.0.0.1:5672"
[[upstream]]
address = "127.0.0.1:5673"
{upstream}
[policy]
path = "policy.json"
{tables}
'''
TOKEN_AUTH = '''[token_auth]
issuer = "https://idp.test"
audience = "amqp-proxy"
jwks_file = "jwks.json"
'''
PROXY = 'token_authority = "proxy"\nservice_username = "svc"\nservice_password_file = "pw"'


def write(tmp_path: Path, upstream: str = PROXY, tables: str = TOKEN_AUTH) -> Path:
    (tmp_path / "policy.json").write_text("[]")
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    (tmp_path / "pw").write_text("secret\n")
    path = tmp_path / "config.toml"
    path.write_text(BASE.format(upstream=upstream, tables=tables))
    return path


def test_a_proxy_authority_setup_loads_with_its_files_resolved(tmp_path):
    config = load_daemon_config(write(tmp_path))
    up = config.upstreams[0]
    assert (up.token_authority, up.service_username) == ("proxy", "svc")
    assert up.service_password_file == str(tmp_path / "pw")
    assert config.token_auth is not None
    assert config.token_auth.jwks_file == str(tmp_path / "jwks.json")
    assert config.token_auth.token_authority == "proxy"


def test_no_token_keys_no_tokens(tmp_path):
    config = load_daemon_config(write(tmp_path, upstream="", tables=""))
    assert config.token_auth is None and config.upstreams[0].token_authority is None


@pytest.mark.parametrize(("upstream", "tables", "message"), [
    (PROXY, "", "(top level): upstream token_authority = \"proxy\" needs a [token_auth]"),
    ("", TOKEN_AUTH, "[token_auth] is set but no [[upstream]] has token_authority"),
    ('token_authority = "proxy"', TOKEN_AUTH,
     "upstream[0]: token_authority = \"proxy\" needs the proxy's own identity"),
    ('token_authority = "upstream"\nservice_username = "svc"\nservice_password_file = "pw"',
     TOKEN_AUTH, "upstream[0]: service_username is only for token_authority = \"proxy\""),
    ('token_authority = "sometimes"', TOKEN_AUTH, "upstream[0].token_authority: "),
    (PROXY, TOKEN_AUTH.replace('"jwks.json"', '"missing.json"'),
     "token_auth: jwks_file "),
    (PROXY, TOKEN_AUTH + 'algorithms = ["HS256"]\n', "token_auth.algorithms[0]: "),
    (PROXY, TOKEN_AUTH + 'token_authority = "upstream"\n',
     "token_auth.token_authority = \"upstream\" differs from the upstreams'"),
])
def test_bad_token_setups_are_one_line_each(tmp_path, upstream, tables, message):
    path = write(tmp_path, upstream, tables)
    with pytest.raises(ConfigError) as info:
        load_daemon_config(path)
    assert any(issue.startswith(f"{path}: ") and message in issue
               for issue in info.value.issues), info.value.issues


def test_check_exits_2_on_a_bad_token_setup(tmp_path, capsys):
    assert main(["check", "--as-user", ME, "--config", str(write(tmp_path, tables=""))]) == EXIT_CONFIG
    assert "needs a [token_auth]" in capsys.readouterr().out
