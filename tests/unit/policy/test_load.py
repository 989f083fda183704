"""policy/load.py: files, directories, formats; QDR's own example policies load unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_policy_proxy.policy.errors import PolicyError
from amqp_policy_proxy.policy.load import load_policy, parse_text, strip_comment_lines
from amqp_policy_proxy.policy.model import PolicySettings

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "policies"
QDR_EXAMPLES = ROOT / ".." / "shared" / "reference" / "qdr-policy-examples"

needs_qdr_examples = pytest.mark.skipif(
    not QDR_EXAMPLES.is_dir(), reason="shared QDR reference examples not present"
)


def _qdr_files() -> list[Path]:
    if not QDR_EXAMPLES.is_dir():
        return []
    return sorted(
        p for p in QDR_EXAMPLES.rglob("*") if p.is_file() and not p.name.endswith(".in")
    )


@needs_qdr_examples
@pytest.mark.parametrize("path", _qdr_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_qdr_example_file_loads(path: Path) -> None:
    patterns = path.parent.name == "policy-8"
    policy = load_policy(path, PolicySettings(enable_vhost_name_patterns=patterns))
    assert policy.vhosts
    assert all(w.severity == "warning" for w in policy.warnings)
    assert policy.files == (str(path),)


@needs_qdr_examples
def test_qdr_example_files_cover_the_appendix() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in _qdr_files()}
    assert {
        "one-router-policy/default.json",
        "policy-1/policy-boardwalk.json",
        "policy-1/policy-safari.json",
        "policy-3/test-sender-receiver-limits.json",
        "policy-7/permissive-default-link-pattern.json",
        "policy-8/management-access.json",
    } <= names


@needs_qdr_examples
def test_policy_1_directory_boardwalk_and_safari() -> None:
    policy = load_policy(QDR_EXAMPLES / "policy-1")
    assert sorted(policy.vhosts) == ["", "0.0.0.0", "boardwalk", "localhost", "safari"]
    assert [Path(f).name for f in policy.files] == [
        "management-access.json", "policy-boardwalk.json", "policy-safari.json",
    ]
    boardwalk = policy.vhosts["boardwalk"]
    assert (boardwalk.max_connections, boardwalk.max_connections_per_user,
            boardwalk.max_connections_per_host) == (10, 2, 5)
    assert boardwalk.allow_unknown_user is True
    assert set(boardwalk.groups) == {"anonymous", "users", "superuser", "$default"}
    anonymous = boardwalk.groups["anonymous"]
    assert anonymous.users == frozenset({"anonymous"})
    assert anonymous.max_frame_size == 111111
    assert anonymous.max_message_size == 111111
    assert anonymous.max_session_window == 111111
    assert (anonymous.max_sessions, anonymous.max_senders, anonymous.max_receivers) == (1, 11, 11)
    assert anonymous.remote_hosts.matches("10.18.200.1")
    assert anonymous.remote_hosts.matches("192.168.255.255")
    assert not anonymous.remote_hosts.matches("10.19.0.0")
    assert anonymous.sources.allows("public", "anonymous")
    assert anonymous.targets.is_empty()  # "targets": "" denies every target
    assert boardwalk.groups["users"].users == frozenset({"u1", "u2", "u3"})
    superuser = boardwalk.groups["superuser"]
    assert superuser.remote_hosts.items == ("127.0.0.1", "72.135.2.9", "::1")
    assert superuser.targets.allows("root", "ellen")
    assert boardwalk.groups["$default"].users == frozenset()
    assert boardwalk.user_groups["u2"] == "users"

    safari = policy.vhosts["safari"]
    guides = safari.groups["guides"]
    assert guides.users == frozenset({"kata", "hapa"})
    assert guides.remote_hosts.matches("10.48.1.1") and guides.remote_hosts.matches("::1")
    assert not safari.groups["clients"].remote_hosts.matches("72.135.2.10")

    management = policy.vhosts[""]
    assert management.groups["$default"].sources.allows("$management", "anyone")


@needs_qdr_examples
def test_policy_3_sender_receiver_limits() -> None:
    policy = load_policy(QDR_EXAMPLES / "policy-3" / "test-sender-receiver-limits.json")
    default = policy.vhosts[""].groups["$default"]
    assert (default.max_senders, default.max_receivers) == (2, 4)
    assert default.users == frozenset()
    override = policy.vhosts["override.host.com"].groups["$default"]
    assert (override.max_senders, override.max_receivers) == (3, 5)
    caps1 = policy.vhosts["capabilities1.host.com"].groups["$default"]
    assert caps1.allow_fallback_links is False and caps1.allow_waypoint_links is True
    assert caps1.allow_dynamic_source is False  # not given: QDR default
    warned = {w.path for w in policy.warnings}
    assert warned == {
        "vhost[capabilities1.host.com].groups.$default.allowWaypointLinks",
        "vhost[capabilities1.host.com].groups.$default.allowFallbackLinks",
        "vhost[capabilities2.host.com].groups.$default.allowWaypointLinks",
        "vhost[capabilities2.host.com].groups.$default.allowFallbackLinks",
    }


@needs_qdr_examples
def test_policy_7_link_patterns_and_policy_authz_defaults() -> None:
    policy = load_policy(QDR_EXAMPLES / "policy-7")
    group = policy.vhosts["$default"].groups["$default"]
    assert group.sources.pattern_mode and group.sources.items == ("#",)
    assert group.targets.allows("any/address.at.all", "u")
    authz = load_policy(QDR_EXAMPLES / "policy-authz").vhosts["$default"].groups["$default"]
    assert authz.sources.is_empty() and authz.targets.is_empty()
    assert (authz.max_senders, authz.max_receivers, authz.max_sessions) == (2147483647,) * 2 + (None,)


@needs_qdr_examples
def test_policy_8_pattern_hostname() -> None:
    from amqp_policy_proxy.policy.lookup import lookup_vhost

    path = QDR_EXAMPLES / "policy-8"
    with_patterns = load_policy(path, PolicySettings(enable_vhost_name_patterns=True))
    assert lookup_vhost(with_patterns, "10.0.0").hostname == "#.0.0"  # type: ignore[union-attr]
    assert lookup_vhost(with_patterns, "0.0").hostname == "#.0.0"  # type: ignore[union-attr]
    assert lookup_vhost(with_patterns, "10.0.1") is None
    without = load_policy(path)
    assert lookup_vhost(without, "10.0.0") is None
    assert lookup_vhost(without, "#.0.0") is not None


@needs_qdr_examples
def test_one_router_policy_allow_admin_status_update_is_a_warning() -> None:
    policy = load_policy(QDR_EXAMPLES / "one-router-policy")
    group = policy.vhosts["$default"].groups["$default"]
    assert group.allow_admin_status_update is False
    assert [(w.path, w.severity) for w in policy.warnings] == [
        ("vhost[$default].groups.$default.allowAdminStatusUpdate", "warning")
    ]


@needs_qdr_examples
def test_policy_2_router_template_other_entities_ignored_with_warnings() -> None:
    # The .in template is not required to load; its vhosts do, other entities are warned about.
    policy = load_policy(QDR_EXAMPLES / "policy-2" / "test-router-with-policy.json.in")
    assert sorted(policy.vhosts) == ["", "0.0.0.0", "localhost", "photoserver"]
    assert [w.path for w in policy.warnings] == ["[0]", "[1]", "[2]", "[3]", "[4]"]
    assert "entity type 'policy' is ignored" in policy.warnings[4].message
    admin = policy.vhosts["photoserver"].groups["admin"]
    assert admin.remote_hosts.matches("192.168.100.7")


def test_directory_loads_json_and_yaml_sorted(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("- hostname: b\n  groups: {}\n")
    (tmp_path / "a.json").write_text('[["vhost", {"hostname": "a"}]]')
    (tmp_path / "c.yml").write_text("vhosts: [{hostname: c}]\n")
    (tmp_path / "d.json.in").write_text("not json {PLACEHOLDER}")
    (tmp_path / ".hidden.json").write_text("garbage")
    (tmp_path / "notes.txt").write_text("garbage")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "e.json").write_text("garbage")
    policy = load_policy(tmp_path)
    assert [Path(f).name for f in policy.files] == ["a.json", "b.yaml", "c.yml"]
    assert sorted(policy.vhosts) == ["a", "b", "c"]


def test_valid_fixture_directory() -> None:
    policy = load_policy(FIXTURES / "valid")
    assert sorted(policy.vhosts) == ["markets", "photoserver"]
    photo = policy.vhosts["photoserver"]
    assert photo.max_connections == 50  # "max-connections" converted to camelCase
    assert photo.aliases == ("antialias", "photos.example.com")
    assert photo.groups["admin"].allow_anonymous_sender is True  # "true" string accepted
    assert photo.groups["admin"].users == frozenset({"alice", "bob"})
    markets = policy.vhosts["markets"]
    assert markets.groups["feeds"].sources.pattern_mode
    assert markets.groups["traders"].remote_hosts.matches("fd00::1")
    assert policy.warnings == ()


def test_duplicate_vhost_across_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('[["vhost", {"hostname": "x"}]]')
    (tmp_path / "b.yaml").write_text("- hostname: x\n")
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    [issue] = info.value.errors
    assert (issue.file, issue.path) == (str(tmp_path / "b.yaml"), "vhost[x]")
    assert issue.message == f"vhost 'x' is defined more than once (first defined in {tmp_path / 'a.json'})"


def test_syntax_errors_in_several_files_are_all_reported(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('# comment\n# another\n[["vhost", {"hostname": "x",}]]\n')
    (tmp_path / "b.yaml").write_text("vhosts:\n  - hostname: [unclosed\n")
    (tmp_path / "c.json").write_text('[["vhost", {"hostname": "ok", "bogus": 1}]]')
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    errors = info.value.errors
    assert [(Path(e.file or "").name, e.path) for e in errors] == [
        ("a.json", ""), ("b.yaml", ""), ("c.json", "vhost[ok].bogus"),
    ]
    assert errors[0].message.startswith("invalid JSON: line 3 column ")  # line numbers kept
    assert errors[1].message.startswith("invalid YAML: line ")


def test_invalid_syntax_fixture() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(FIXTURES / "invalid" / "syntax.json")
    [issue] = info.value.issues
    assert issue.path == ""
    assert issue.message == (
        "invalid JSON: line 2 column 33: Expecting property name enclosed in double quotes"
    )


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "nope")
    assert info.value.issues[0].message == "no such file or directory"
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    assert info.value.issues[0].message == "no policy files (*.json, *.yaml, *.yml) in directory"


def test_duplicate_json_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('[["vhost", {"hostname": "x", "maxConnections": 1, "maxConnections": 2}]]')
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.issues[0].message == "invalid JSON: duplicate key 'maxConnections' in one object"


def test_empty_yaml_file_is_a_warning(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("# nothing yet\n")
    (tmp_path / "b.json").write_text('[["vhost", {"hostname": "b"}]]')
    policy = load_policy(tmp_path)
    assert [(Path(w.file or "").name, w.message) for w in policy.warnings] == [
        ("a.yaml", "the file defines no vhosts")
    ]


def test_comment_stripping_keeps_line_numbers_and_hash_values() -> None:
    text = '  # licence\n[["vhost", {"hostname": "#.0.0"}]]\n\t# trailing\n'
    assert strip_comment_lines(text) == '\n[["vhost", {"hostname": "#.0.0"}]]\n\n'
    content, problem = parse_text(text, yaml_syntax=False)
    assert problem is None
    assert content == [["vhost", {"hostname": "#.0.0"}]]


def test_resolver_is_passed_through(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(
        "- hostname: h\n  groups:\n    g: {users: u, remoteHosts: [db-primary.example]}\n"
    )
    calls: list[str] = []

    def resolver(name: str) -> list[str]:
        calls.append(name)
        return ["10.9.8.7"]

    policy = load_policy(path, resolver=resolver)
    assert calls == ["db-primary.example"]
    assert policy.vhosts["h"].groups["g"].remote_hosts.matches("10.9.8.7")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.errors[0].path == "vhost[h].groups.g.remoteHosts[0]"
    assert "cannot resolve host names without a resolver" in info.value.errors[0].message


@pytest.mark.parametrize("name", ["policy/demo.json", "policy-yaml/markets.yaml",
                                  "policy-topics/markets.json", "policy-topics/plant.yaml",
                                  "policy-topics"])
def test_repository_examples_load(name: str) -> None:
    policy = load_policy(ROOT / "examples" / name)
    assert policy.vhosts
    assert all(not w.is_error for w in policy.warnings)
    if name.startswith("policy-topics"):
        assert not policy.warnings  # the topic examples are clean, not just valid
        assert all(g.topics is not None for v in policy.vhosts.values()
                   for g in v.groups.values())
