"""spark_reports.limits: the connection limits of a policy loaded as `check` loads it. No Spark."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.cli import main as cli_main
from amqp_policy_proxy.spark_reports.limits import (
    DEFAULT_LIMIT,
    LimitsError,
    load_checked_limits,
    load_limits,
)

# Modelled on QDR's tests/policy-1 files: licence-style '#' lines, CSV user lists, groups
# that override the per-user/per-host limits, keys the reader ignores.
QDR_FILE = """\
##
## A comment block, as in QDR's policy files
##
[
    # The safari policy ruleset
    ["vhost",
        {
            "hostname": "safari",
            "aliases": "zoo, jungle",
            "maxConnections": 10,
            "maxConnectionsPerUser": 2,
            "allowUnknownUser": true,
            "groups": {
                "anonymous": {"users": "anonymous", "remoteHosts": "*", "maxSessions": 1},
                "clients": {"users": "moja, mbili", "remoteHosts": "72.135.2.9",
                            "maxConnectionsPerUser": 5, "maxConnectionsPerHost": "3"},
                "$default": {"remoteHosts": "*"}
            }
        }
    ],
    ["listener", {"port": 5672}]
]
"""

YAML_FILE = """\
# the same keys in YAML
- - vhost
  - hostname: ""
    max-connections: 50
    maxConnectionsPerHost: 4
    groups:
      everyone: {users: "*", remoteHosts: "*", maxConnectionsPerUser: 7}
"""


def test_qdr_file_with_comments_groups_and_defaults(tmp_path):
    p = tmp_path / "safari.json"
    p.write_text(QDR_FILE)
    lim = load_limits(p)
    v = lim.vhosts["safari"]
    assert (v.max_connections, v.max_connections_per_user, v.max_connections_per_host) == (
        10, 2, DEFAULT_LIMIT)
    assert v.aliases == ("zoo", "jungle")
    assert v.groups["clients"].users == frozenset({"moja", "mbili"})
    assert (v.user_limit("clients"), v.host_limit("clients")) == (5, 3)
    assert (v.user_limit("anonymous"), v.host_limit("anonymous")) == (2, DEFAULT_LIMIT)
    assert v.user_limit(None) == 2 and v.user_limit("no-such-group") == 2
    assert lim.lookup_vhost("jungle") is v and lim.lookup_vhost("zebra") is None
    assert lim.sources == (str(p),)


def test_lookup_group_follows_qdr_order(tmp_path):
    p = tmp_path / "safari.json"
    p.write_text(QDR_FILE)
    v = load_limits(p).vhosts["safari"]
    assert v.lookup_group("mbili") == "clients"  # listed
    assert v.lookup_group("stranger") == "$default"  # allowUnknownUser
    star = load_limits(_write(tmp_path, "y.yaml", YAML_FILE)).vhosts[""]
    assert star.lookup_group("anyone") == "everyone"  # the '*' group
    no_default = QDR_FILE.replace('"allowUnknownUser": true', '"allowUnknownUser": false')
    v2 = load_limits(_write(tmp_path, "n.json", no_default)).vhosts["safari"]
    assert v2.lookup_group("stranger") is None


def test_yaml_directory_and_rows(tmp_path):
    _write(tmp_path, "a.json", QDR_FILE)
    _write(tmp_path, "b.yaml", YAML_FILE)
    _write(tmp_path, "notes.txt", "not a policy")
    lim = load_limits(tmp_path)
    assert sorted(lim.vhosts) == ["", "safari"]
    empty = lim.vhosts[""]
    assert (empty.max_connections, empty.max_connections_per_host) == (50, 4)  # camelCased
    assert ("", "", 50, DEFAULT_LIMIT, 4, "everyone", None) in lim.vhost_rows()
    assert ("jungle", "safari", 10, 2, DEFAULT_LIMIT, None, "$default") in lim.vhost_rows()
    assert ("safari", "clients", 5, 3, 5, 3) in lim.group_rows()
    assert ("safari", "anonymous", 2, DEFAULT_LIMIT, None, None) in lim.group_rows()
    assert ("safari", "moja", "clients") in lim.member_rows()
    assert all(u != "*" for _, u, _ in lim.member_rows())


@pytest.mark.parametrize(("text", "message"), [
    ('[["vhost", {"hostname": "a", "maxConnections": 70000}]]', "is above maximum '65535'"),
    ('[["vhost", {"hostname": "a", "maxConnections": "lots"}]]', "maxConnections"),
    ('[["vhost", {"hostname": "a", "maxConnections": true}]]', "maxConnections"),
    ('[["vhost", {"hostname": "a", "groups": {"x": {"users": "u"}, "y": {"users": ["u"]}}}]]',
     "in multiple user groups"),
    ('[["vhost", {"hostname": "a"}], ["vhost", {"hostname": "b", "aliases": "a"}]]', "'a'"),
    ('[["vhost", {"maxConnections": 1}]]', "hostname"),
    ('{"hostname": "a"}', "expected 'vhosts'"),
    ("[nonsense", "JSON"),
    ('[["vhost", {"hostname": "a", "maxConections": 1}]]', "maxConections"),  # unknown key
])
def test_invalid_policies_are_refused_with_checks_text(tmp_path, capsys, text, message):
    path = _write(tmp_path, "p.json", text)
    with pytest.raises(LimitsError, match=message) as caught:
        load_limits(path)
    assert cli_main(["check", "--policy", str(path)]) == 2
    assert str(caught.value) == capsys.readouterr().out.strip()
    assert caught.value.issues


def test_missing_paths(tmp_path, capsys):
    for path in (tmp_path / "absent", tmp_path):
        with pytest.raises(LimitsError) as caught:
            load_limits(path)
        assert cli_main(["check", "--policy", str(path)]) == 2
        assert str(caught.value) == capsys.readouterr().out.strip()


def test_warnings_are_returned_as_check_prints_them(tmp_path, capsys):
    path = _write(tmp_path, "safari.json", QDR_FILE)
    limits, warnings = load_checked_limits(path)
    assert set(limits.vhosts) == {"safari"}
    assert cli_main(["check", "--policy", str(path)]) == 0
    assert warnings and warnings in capsys.readouterr().out


def _write(d, name, text):
    p = d / name
    p.write_text(text)
    return p
