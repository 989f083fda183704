"""policy/compile.py: validation (every issue, exact paths, QDR texts) and compiled values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.errors import PolicyError
from amqp_policy_proxy.policy.load import load_policy
from amqp_policy_proxy.policy.model import PolicySettings

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "policies"


def _errors(name: str) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        load_policy(FIXTURES / "invalid" / name)
    assert all(i.file == str(FIXTURES / "invalid" / name) for i in info.value.issues)
    return [(i.path, i.message) for i in info.value.errors]


def _compile(*vhosts: dict[str, Any], settings: PolicySettings | None = None, **kw: Any):
    return compile_policy([(None, [["vhost", v] for v in vhosts])], settings, **kw)


def _compile_errors(*vhosts: dict[str, Any], **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        _compile(*vhosts, **kw)
    return [(i.path, i.message) for i in info.value.errors]


# ----------------------------------------------------------------- invalid fixtures


def test_unknown_keys_are_errors_with_hints() -> None:
    assert _errors("unknown_key.json") == [
        ("vhost[acme].maxConnection",
         "Policy vhost 'acme' option 'maxConnection' is not a known option (QDR ignores unknown "
         "options; the proxy rejects them); did you mean 'maxConnections'?"),
        ("vhost[acme].groups.$default.maxConnections",
         "Policy vhost 'acme' user group '$default' option 'maxConnections' is not a known option "
         "(QDR ignores unknown options; the proxy rejects them); 'maxConnections' is a "
         "vhost-level option"),
        ("vhost[acme].groups.$default.max-frame-size",
         "Policy vhost 'acme' user group '$default' option 'max-frame-size' is not a known option "
         "(QDR ignores unknown options; the proxy rejects them); did you mean 'maxFrameSize'?"),
    ]


def test_unknown_key_fixture_also_reports_the_not_enforced_warning() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(FIXTURES / "invalid" / "unknown_key.json")
    assert [(w.path, w.message) for w in info.value.warnings] == [
        ("vhost[acme].groups.$default.allowWaypointLinks",
         "'allowWaypointLinks' is accepted for QDR compatibility but is not enforced by the proxy"),
    ]
    text = str(info.value)
    assert text.startswith("invalid policy: 3 errors\n")
    assert "warning: " in text and text.count("error: ") == 3


def test_sources_and_source_pattern_conflict() -> None:
    assert _errors("conflicting_patterns.json") == [
        ("vhost[acme].groups.both",
         "Policy vhost 'acme' user group 'both' specifies conflicting 'sources' and "
         "'sourcePattern' attributes. Use only one or the other."),
        ("vhost[acme].groups.both",
         "Policy vhost 'acme' user group 'both' specifies conflicting 'targets' and "
         "'targetPattern' attributes. Use only one or the other."),
    ]


def test_user_in_two_groups() -> None:
    assert _errors("user_in_two_groups.json") == [
        ("vhost[acme].groups.second.users[1]",
         "Policy vhost 'acme' user 'u2' is in multiple user groups 'first' and 'second'"),
    ]


def test_allow_unknown_user_without_default_group() -> None:
    assert _errors("unknown_user_without_default.json") == [
        ("vhost[acme].allowUnknownUser",
         "Policy vhost 'acme' allows connections by default but default settings are not "
         "defined"),
    ]


def test_user_token_twice_embedded_and_partial() -> None:
    assert _errors("user_token.json") == [
        ("vhost[acme].groups.g.sources[1]",
         "Policy vhost 'acme' user group 'g' policy key 'sources' item '${user}.${user}' "
         "contains multiple user subtitution tokens"),
        ("vhost[acme].groups.g.targetPattern[0]",
         "Policy vhost 'acme' user group 'g' policy key 'targetPattern' item 'a.${user}.b' may "
         "contain match pattern '${user}' as a prefix or a suffix only."),
        ("vhost[acme].groups.g.targetPattern[1]",
         "Policy vhost 'acme' user group 'g' policy key 'targetPattern' item '${user}x.#' must "
         "use '${user}' as a whole token, separated by '.' or '/' (QDR never matches a "
         "partial-token '${user}')"),
    ]


def test_out_of_range_limits() -> None:
    assert _errors("out_of_range.json") == [
        ("vhost[acme].maxConnections",
         "Policy vhost 'acme' option 'maxConnections' has error 'Value '70000' is above maximum "
         "'65535'.'."),
        ("vhost[acme].maxConnectionsPerUser",
         "Policy vhost 'acme' option 'maxConnectionsPerUser' has error 'Value '-1' is below "
         "minimum '0'.'."),
        ("vhost[acme].maxMessageSize",
         "Policy vhost 'acme' option 'maxMessageSize' has error 'Value 'lots' does not resolve "
         "to an integer.'."),
        ("vhost[acme].groups.g.maxConnectionsPerHost",
         "Policy vhost 'acme' user group 'g' option 'maxConnectionsPerHost' has error 'Value "
         "'65536' is above maximum '65535'.'."),
        ("vhost[acme].groups.g.maxSenders",
         "Policy vhost 'acme' user group 'g' option 'maxSenders' has error 'Value '2147483648' "
         "is above maximum '2147483647'.'."),
        ("vhost[acme].groups.g.maxSessions",
         "Policy vhost 'acme' user group 'g' option 'maxSessions' has error 'Value '70000' is "
         "above maximum '65536'.'."),
        ("vhost[acme].groups.g.maxFrameSize",
         "Policy vhost 'acme' user group 'g' option 'maxFrameSize' has error 'Value 'true' does "
         "not resolve to an integer.'."),
    ]


def test_bad_remote_hosts_items() -> None:
    prefix = "Policy vhost 'acme' user group 'g' option 'remoteHosts' connectionOption"
    assert _errors("remote_hosts.json") == [
        ("vhost[acme].groups.g.remoteHosts[1]",
         f"{prefix} '10.0.0.9-10.0.0.1' failed to translate: 'host specs in range must have "
         "lower numeric address first'."),
        ("vhost[acme].groups.g.remoteHosts[2]",
         f"{prefix} '1.2.3.4-::1' failed to translate: 'mixed IPv4 and IPv6 host specs in range "
         "not allowed'."),
        ("vhost[acme].groups.g.remoteHosts[3]",
         f"{prefix} 'my-host' failed to translate: ''my-host' is a host name: cannot resolve "
         "host names without a resolver'."),
        ("vhost[acme].groups.g.remoteHosts[4]",
         f"{prefix} '10.*' failed to translate: ''*' cannot be combined with other text'."),
        ("vhost[acme].groups.g.remoteHosts[5]",
         f"{prefix} '10.0.0.1/8' failed to translate: 'CIDR network has host bits set; did you "
         "mean '10.0.0.0/8'?'."),
        ("vhost[acme].groups.blank.remoteHosts[0]",
         "Policy vhost 'acme' user group 'blank' option 'remoteHosts' connectionOption '' failed "
         "to translate: 'empty host spec: an explicit empty remoteHosts is a configuration error "
         "in QDR; leave remoteHosts out to deny every host'."),
    ]


def test_bool_strings_other_than_lowercase_are_errors() -> None:
    assert _errors("bad_bool.yaml") == [
        ("vhost[acme].allowUnknownUser",
         "Policy vhost 'acme' option 'allowUnknownUser' must be of type 'bool' but is 'str'. "
         "Write true or false (JSON boolean or lowercase string); QDR would silently read "
         "'True' as false."),
        ("vhost[acme].groups.$default.allowAnonymousSender",
         "Policy vhost 'acme' user group '$default' option 'allowAnonymousSender' has illegal "
         "boolean value 'TRUE'. Write true or false (JSON boolean or lowercase string); QDR "
         "would silently read 'TRUE' as false."),
    ]


def test_many_problems_in_one_file_are_all_collected() -> None:
    assert [path for path, _ in _errors("many.json")] == [
        "vhost[one].aliases[1]",
        "vhost[one].maxConnectionsPerHost",
        "vhost[one].groups.g.remoteHosts[0]",
        "vhost[one].groups.g.targets[0]",
        "vhost[two].groups.g.colour",
        "vhost[two].allowUnknownUser",
        "vhost[one]",
        "[3].hostname",
        "vhost[two].aliases[0]",
    ]
    messages = dict(_errors("many.json"))
    assert messages["vhost[two].aliases[0]"] == (
        "Policy for vhost 'two' alias 'uno' conflicts with existing alias for vhost 'one'")
    assert messages["vhost[one].aliases[1]"] == (
        "Policy vhost 'one' option 'aliases' value 'one' duplicates vhost name")
    assert "'300.1.1.1' is not a valid IP address" in messages["vhost[one].groups.g.remoteHosts[0]"]


# ----------------------------------------------------------------- compiled values


def test_qdr_zero_means_unlimited_becomes_none_but_connection_zero_stays() -> None:
    policy = _compile({
        "hostname": "v", "maxConnections": 0, "maxConnectionsPerUser": "0",
        "groups": {"g": {"users": "u", "remoteHosts": "*", "maxSenders": 0, "maxReceivers": 0,
                         "maxSessions": 0, "maxFrameSize": 0, "maxSessionWindow": 0,
                         "maxConnectionsPerHost": 0}},
    })
    vhost = policy.vhosts["v"]
    assert (vhost.max_connections, vhost.max_connections_per_user) == (0, 0)
    g = vhost.groups["g"]
    assert (g.max_senders, g.max_receivers, g.max_sessions) == (None, None, None)
    assert (g.max_frame_size, g.max_session_window) == (None, None)
    assert g.max_connections_per_host == 0
    assert g.max_connections_per_user is None


def test_defaults_applied_like_qdr() -> None:
    g = _compile({"hostname": "v", "groups": {"g": {"users": "u"}}}).vhosts["v"].groups["g"]
    assert (g.max_senders, g.max_receivers) == (2147483647, 2147483647)
    assert (g.allow_dynamic_source, g.allow_anonymous_sender, g.allow_user_id_proxy) == (
        False, False, False)
    assert g.remote_hosts.is_empty() and g.sources.is_empty() and g.targets.is_empty()
    assert g.max_message_size is None


@pytest.mark.parametrize(
    ("global_size", "vhost_attrs", "group_attrs", "expected"),
    [
        (1000, {"maxMessageSize": 500}, {}, 500),
        (1000, {"maxMessageSize": 500}, {"maxMessageSize": 0}, None),
        (1000, {"maxMessageSize": 500}, {"maxMessageSize": 200}, 200),
        (1000, {}, {}, 1000),
        (1000, {"maxMessageSize": 0}, {}, None),
        (0, {}, {}, None),
    ],
)
def test_max_message_size_resolution(
    global_size: int, vhost_attrs: dict[str, Any], group_attrs: dict[str, Any],
    expected: int | None,
) -> None:
    # QDR's own maxMessageSize precedence example (checked against qdrouterd's policy code).
    policy = _compile(
        {"hostname": "v", **vhost_attrs, "groups": {"g": {"users": "u", **group_attrs}}},
        settings=PolicySettings(max_message_size=global_size),
    )
    assert policy.vhosts["v"].groups["g"].max_message_size == expected


def test_groups_without_users_do_not_clash() -> None:
    # QDR quirk 7: two groups without users failed with user '' in multiple groups.
    policy = _compile({"hostname": "v", "groups": {"$default": {}, "$connector": {}}})
    assert policy.vhosts["v"].user_groups == {}


def test_list_values_trimmed_deduplicated_and_empty_items_dropped() -> None:
    g = _compile({"hostname": "v", "groups": {"g": {
        "users": " a , b,a,, ", "sources": "x, y ,x", "targets": ["p", " q "]}}}).vhosts["v"].groups["g"]
    assert g.users == frozenset({"a", "b"})
    assert g.sources.items == ("x", "y")
    assert g.targets.items == ("p", "q")


def test_hyphenated_top_level_keys_converted_but_not_group_keys() -> None:
    policy = _compile({"hostname": "v", "max-connections-per-user": 7,
                       "allow-unknown-user": False, "groups": {}})
    assert policy.vhosts["v"].max_connections_per_user == 7


def test_deprecated_id_is_a_warning_and_both_is_an_error() -> None:
    policy = _compile({"id": "old"})
    assert list(policy.vhosts) == ["old"]
    assert [(w.path, w.message) for w in policy.warnings] == [
        ("vhost[old].id", "'id' is a deprecated synonym of 'hostname'")]
    assert _compile_errors({"id": "a", "hostname": "a"}) == [
        ("vhost[a].id", "giving both 'id' and 'hostname' is an error; use 'hostname'")]


def test_missing_remote_hosts_is_a_warning() -> None:
    policy = _compile({"hostname": "v", "groups": {"g": {"users": "u"}}})
    assert [(w.path, w.severity) for w in policy.warnings] == [("vhost[v].groups.g", "warning")]
    assert "every connection in this group is denied" in policy.warnings[0].message


def test_alias_conflicts_with_vhost_name() -> None:
    errors = _compile_errors({"hostname": "a", "aliases": "b"}, {"hostname": "b"})
    assert errors == [("vhost[a].aliases[0]",
                       "Policy for vhost 'a' defines alias 'b' which conflicts with an existing "
                       "vhost named 'b'")]


def test_hostname_pattern_conflicts_and_empty_name() -> None:
    settings = PolicySettings(enable_vhost_name_patterns=True)
    errors = _compile_errors(
        {"hostname": "#.*.example"}, {"hostname": "x", "aliases": "*.#.example"},
        {"hostname": ""}, settings=settings,
    )
    assert errors == [
        ("vhost[x].aliases[0]",
         "Policy for vhost 'x' alias '*.#.example' optimized pattern conflicts with existing "
         "pattern '#.*.example'"),
        ("vhost[].hostname",
         "vhost name '' cannot be a hostname pattern (no tokens); an empty vhost name is not "
         "possible when enableVhostNamePatterns is true"),
    ]
    # Without patterns the same names are plain, distinct strings.
    assert len(_compile({"hostname": "#.*.example"}, {"hostname": "x", "aliases": "*.#.example"},
                        {"hostname": ""}).vhosts) == 3


def test_session_window_below_frame_size_loads_as_in_qdr_with_a_warning() -> None:
    """QDR's own system tests use maxFrameSize 222222 with maxSessionWindow 9999."""
    policy = _compile({"hostname": "v", "groups": {"g": {
        "remoteHosts": "*", "maxFrameSize": 222222, "maxSessionWindow": 9999}}})
    group = policy.vhosts["v"].groups["g"]
    assert (group.max_frame_size, group.max_session_window) == (222222, 9999)
    assert [(w.severity, w.path, w.message) for w in policy.warnings] == [
        ("warning", "vhost[v].groups.g.maxSessionWindow",
         "maxSessionWindow 9999 is smaller than maxFrameSize 222222: the session window "
         "becomes 1 frame")]


def test_tiny_frame_size_is_raised_to_the_amqp_minimum() -> None:
    policy = _compile({"hostname": "v", "groups": {"g": {"remoteHosts": "*", "maxFrameSize": 100}}})
    assert policy.vhosts["v"].groups["g"].max_frame_size == 512
    assert policy.warnings[0].path == "vhost[v].groups.g.maxFrameSize"


@pytest.mark.parametrize(
    ("content", "path", "message"),
    [
        ({"vhost": []}, "vhost", "unknown top-level key 'vhost' (expected 'vhosts')"),
        ({"vhosts": {}}, "vhosts", "must be a list of vhost mappings"),
        ({"vhosts": ["x"]}, "vhosts[0]", "must be a mapping of vhost attributes"),
        ("text", "", "expected a list of [\"vhost\", {...}] pairs, a list of vhost mappings or "
                     "a mapping with a 'vhosts' list"),
        ([["vhost"]], "[0]", "expected a [\"vhost\", {...}] pair or a mapping of vhost "
                             "attributes"),
        ([{"hostname": 5}], "[0].hostname", "must be a string, not 5"),
        ([{"hostname": "v", "groups": []}], "vhost[v].groups",
         "Policy vhost 'v' option 'groups' must be of type 'dict' but is 'list'"),
        ([{"hostname": "v", "groups": {"g": None}}], "vhost[v].groups.g",
         "Policy vhost 'v' user group 'g' settings must be a mapping, not null"),
        ([{"hostname": "v", "groups": {"g": {"users": 5}}}], "vhost[v].groups.g.users",
         "Policy vhost 'v' user group 'g' option 'users' has illegal value '5'. Type must be "
         "'str' or 'list' but is 'int'"),
        ([{"hostname": "v", "groups": {"g": {"remoteHosts": ["*", 7]}}}],
         "vhost[v].groups.g.remoteHosts[1]",
         "Policy vhost 'v' user group 'g' option 'remoteHosts' item 7 must be a string"),
        ([{"hostname": "v", "maxConnections": 1.5}], "vhost[v].maxConnections",
         "Policy vhost 'v' option 'maxConnections' has error 'Value '1.5' does not resolve to "
         "an integer.'."),
    ],
)
def test_document_shape_errors(content: Any, path: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy([("f.json", content)])
    assert [(i.file, i.path, i.message) for i in info.value.errors] == [("f.json", path, message)]


def test_settings_are_validated() -> None:
    with pytest.raises(PolicyError) as info:
        compile_policy([], PolicySettings(max_connections=-1))
    assert [(i.file, i.path) for i in info.value.errors] == [(None, "policy.maxConnections")]


def test_digest_is_stable_and_content_sensitive() -> None:
    a = _compile({"hostname": "a", "maxConnections": 1}, {"hostname": "b"})
    b = compile_policy([(None, [{"hostname": "b"}]), ("x.yaml", [{"hostname": "a",
                                                                  "maxConnections": 1}])])
    c = _compile({"hostname": "a", "maxConnections": 2}, {"hostname": "b"})
    assert len(a.digest) == 12 and int(a.digest, 16) >= 0
    assert a.digest == b.digest
    assert a.digest != c.digest
    assert b.files == ("x.yaml",)


def test_resolver_called_once_per_name_and_multi_address_rejected() -> None:
    calls: list[str] = []

    def resolver(name: str) -> list[str]:
        calls.append(name)
        if name == "dual.example":
            return ["127.0.0.1", "::1"]
        if name == "gone.example":
            raise LookupError("NXDOMAIN")
        return ["192.0.2.1", "192.0.2.1"]  # duplicates are one address

    ok = {"hostname": "v", "groups": {
        "a": {"users": "a", "remoteHosts": "my-host.example"},
        "b": {"users": "b", "remoteHosts": ["my-host.example", "10.0.0.0/8"]}}}
    policy = _compile(ok, resolver=resolver)
    assert calls == ["my-host.example"]
    assert policy.vhosts["v"].groups["a"].remote_hosts.resolved == {"my-host.example": "192.0.2.1"}

    bad = {"hostname": "w", "groups": {"g": {"remoteHosts": "dual.example, gone.example"}}}
    errors = _compile_errors(bad, resolver=resolver)
    assert [p for p, _ in errors] == ["vhost[w].groups.g.remoteHosts[0]",
                                     "vhost[w].groups.g.remoteHosts[1]"]
    assert "'dual.example' resolves to multiple IP addresses (127.0.0.1, ::1)" in errors[0][1]
    assert "'gone.example' did not resolve to an IP address: NXDOMAIN" in errors[1][1]


def test_raw_is_read_only() -> None:
    vhost = _compile({"hostname": "v", "groups": {"g": {"users": ["a"]}}}).vhosts["v"]
    assert vhost.raw["groups"]["g"]["users"] == ("a",)
    with pytest.raises(TypeError):
        vhost.raw["hostname"] = "x"  # type: ignore[index]


# ----------------------------------------------------------------- rate limits (extension)

_ANY = {"users": "*", "remoteHosts": "*"}


def test_connection_rates_resolve_group_over_vhost_and_zero_is_unlimited() -> None:
    policy = _compile({
        "hostname": "v", "maxConnectionRate": 100, "maxConnectionRatePerUser": 5,
        "maxConnectionRatePerHost": 50, "connectionRateBurst": 20,
        "groups": {"a": {**_ANY, "maxConnectionRatePerHost": 0},
                   "b": {"users": "x", "remoteHosts": "*", "maxConnectionRatePerUser": 2}}})
    vhost = policy.vhosts["v"]
    assert (vhost.max_connection_rate, vhost.max_connection_rate_per_user,
            vhost.max_connection_rate_per_host, vhost.connection_rate_burst) == (100, 5, 50, 20)
    a, b = vhost.groups["a"], vhost.groups["b"]
    assert (a.max_connection_rate_per_user, a.max_connection_rate_per_host) == (5, None)
    assert (b.max_connection_rate_per_user, b.max_connection_rate_per_host) == (2, 50)
    unlimited = _compile({"hostname": "w", "maxConnectionRate": 0, "groups": {"g": _ANY}})
    assert unlimited.vhosts["w"].max_connection_rate is None


def test_message_and_byte_rates_are_group_keys() -> None:
    policy = _compile({"hostname": "v", "groups": {
        "g": {**_ANY, "maxMessageRatePerUser": 100, "maxByteRatePerUser": 0}}})
    group = policy.vhosts["v"].groups["g"]
    assert (group.max_message_rate_per_user, group.max_byte_rate_per_user) == (100, None)
    assert _compile_errors({"hostname": "v", "maxMessageRatePerUser": 5, "groups": {}}) == [
        ("vhost[v].maxMessageRatePerUser",
         "Policy vhost 'v' option 'maxMessageRatePerUser' is not a known option (QDR ignores "
         "unknown options; the proxy rejects them); 'maxMessageRatePerUser' is a group-level "
         "option")]


def test_bad_rate_values_name_the_key() -> None:
    assert _compile_errors({
        "hostname": "v", "maxConnectionRatePerHost": -1, "connectionRateBurst": 0,
        "groups": {"g": {**_ANY, "maxMessageRatePerUser": "fast",
                         "maxConnectionRatePerUser": 2000000}}}) == [
        ("vhost[v].maxConnectionRatePerHost",
         "Policy vhost 'v' option 'maxConnectionRatePerHost' has error 'Value '-1' is below "
         "minimum '0'.'."),
        ("vhost[v].connectionRateBurst",
         "Policy vhost 'v' option 'connectionRateBurst' has error 'Value '0' is below minimum "
         "'1'.'."),
        ("vhost[v].groups.g.maxMessageRatePerUser",
         "Policy vhost 'v' user group 'g' option 'maxMessageRatePerUser' has error 'Value "
         "'fast' does not resolve to an integer.'."),
        ("vhost[v].groups.g.maxConnectionRatePerUser",
         "Policy vhost 'v' user group 'g' option 'maxConnectionRatePerUser' has error 'Value "
         "'2000000' is above maximum '1000000'.'."),
    ]


def test_a_burst_without_a_rate_is_a_warning() -> None:
    policy = _compile({"hostname": "v", "connectionRateBurst": 10, "groups": {"g": _ANY}})
    assert [(w.path, w.message) for w in policy.warnings] == [
        ("vhost[v].connectionRateBurst",
         "connectionRateBurst has no effect: the vhost and its groups set no maxConnectionRate, "
         "maxConnectionRatePerUser or maxConnectionRatePerHost")]


def test_global_connection_rate_is_validated() -> None:
    assert _compile_errors({"hostname": "v", "groups": {}},
                           settings=PolicySettings(max_connection_rate=-5)) == [
        ("policy.max_connection_rate", "must be an integer >= 0, not -5")]


@pytest.mark.parametrize(("key", "item", "warned"), [
    ("targets", "$*", True), ("targets", "_*", True), ("sources", "_local*", True),
    ("targetPattern", "$management.#", True), ("sourcePattern", "_topo.#", True),
    ("targets", "*", False), ("targetPattern", "#", False), ("targets", "$SYS*", True), ("sources", "$manage*", True),
    ("targets", "public.*", False), ("targets", "${user}*", False),
    ("targetPattern", "${user}.#", False),
])
def test_a_wildcard_aimed_at_router_internal_addresses_is_a_warning(key, item, warned) -> None:
    policy = _compile({"hostname": "v", "groups": {"g": {"users": "u", "remoteHosts": "*",
                                                          key: item}}})
    paths = [w.path for w in policy.warnings if "router-internal" in w.message]
    assert paths == ([f"vhost[v].groups.g.{key}[0]"] if warned else [])


# ----------------------------------------------------------------- quarantine (extension)

_Q_GROUPS = {"g": {"users": "*", "remoteHosts": "*"}}


def test_quarantine_compiles_to_the_vhosts_settings() -> None:
    policy = _compile({"hostname": "v", "groups": _Q_GROUPS,
                       "quarantine": {"denials": 5, "withinSeconds": 60, "banSeconds": 1.5}})
    q = policy.vhosts["v"].quarantine
    assert (q.denials, q.within_seconds, q.ban_seconds) == (5, 60.0, 1.5)
    assert _compile({"hostname": "w", "groups": _Q_GROUPS}).vhosts["w"].quarantine is None


@pytest.mark.parametrize(("value", "path", "words"), [
    ([5], "vhost[v].quarantine", "must be an object"),
    ({"denials": 5, "withinSeconds": 60}, "vhost[v].quarantine", "missing 'banSeconds'"),
    ({"denials": 5, "withinSeconds": 60, "banSeconds": 9, "banSecond": 1},
     "vhost[v].quarantine.banSecond", "did you mean 'banSeconds'"),
    ({"denials": 0, "withinSeconds": 60, "banSeconds": 9}, "vhost[v].quarantine.denials",
     "from 1 to"),
    ({"denials": 2.5, "withinSeconds": 60, "banSeconds": 9}, "vhost[v].quarantine.denials",
     "must be an integer"),
    ({"denials": True, "withinSeconds": 60, "banSeconds": 9}, "vhost[v].quarantine.denials",
     "must be an integer"),
    ({"denials": 3, "withinSeconds": "60", "banSeconds": 9},
     "vhost[v].quarantine.withinSeconds", "must be a number of seconds"),
    ({"denials": 3, "withinSeconds": 60, "banSeconds": 0}, "vhost[v].quarantine.banSeconds",
     "more than 0"),
    ({"denials": 3, "withinSeconds": 60, "banSeconds": 1e12},
     "vhost[v].quarantine.banSeconds", "at most 31536000"),
])
def test_a_bad_quarantine_names_its_key_path(value: Any, path: str, words: str) -> None:
    errors = _compile_errors({"hostname": "v", "groups": _Q_GROUPS, "quarantine": value})
    assert any(p == path and words in m for p, m in errors), errors
