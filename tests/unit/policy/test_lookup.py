"""policy/lookup.py and policy/hostnames.py: vhost resolution and group assignment, as QDR."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.hostnames import HostnamePatterns
from amqp_policy_proxy.policy.lookup import (
    lookup_group,
    lookup_vhost,
    resolve_group,
    resolve_vhost,
)
from amqp_policy_proxy.policy.model import Policy, PolicySettings


def _policy(*vhosts: dict[str, Any], **settings: Any) -> Policy:
    return compile_policy([(None, list(vhosts))], PolicySettings(**settings))


VHOSTS = (
    {"hostname": "photoserver", "aliases": "antialias, photos"},
    {"hostname": "$default"},
    {"hostname": ""},
    {"hostname": "a.example.com"},
    {"hostname": "*.example.com", "aliases": "*.example.org"},
    {"hostname": "#.example.com"},
    {"hostname": "#"},
)


@pytest.mark.parametrize(
    ("hostname", "expected", "how"),
    [
        ("photoserver", "photoserver", "exact"),
        ("antialias", "photoserver", "alias"),
        ("photos", "photoserver", "alias"),
        ("Photoserver", "$default", "default"),  # case-sensitive
        ("", "", "exact"),
        (None, "", "exact"),
        ("*.example.com", "*.example.com", "exact"),  # a literal name without patterns
        ("b.example.com", "$default", "default"),
    ],
)
def test_without_patterns(hostname: str | None, expected: str, how: str) -> None:
    match = resolve_vhost(_policy(*VHOSTS), hostname)
    assert match is not None
    assert (match.vhost.hostname, match.how) == (expected, how)


@pytest.mark.parametrize(
    ("hostname", "expected", "how", "via"),
    [
        ("a.example.com", "a.example.com", "exact", "a.example.com"),
        ("b.example.com", "*.example.com", "pattern", "*.example.com"),  # * beats #
        ("x.y.example.com", "#.example.com", "pattern", "#.example.com"),
        ("example.com", "#.example.com", "pattern", "#.example.com"),  # # matches zero tokens
        ("b.example.org", "*.example.com", "pattern", "*.example.org"),  # alias pattern
        ("/b/example/com/", "*.example.com", "pattern", "*.example.com"),  # separators
        ("B.EXAMPLE.COM", "#", "pattern", "#"),  # case-sensitive tokens
        ("antialias", "photoserver", "alias", "antialias"),
        ("anything", "#", "pattern", "#"),
    ],
)
def test_with_patterns(hostname: str, expected: str, how: str, via: str) -> None:
    policy = _policy(*(v for v in VHOSTS if v["hostname"]), enable_vhost_name_patterns=True)
    match = resolve_vhost(policy, hostname)
    assert match is not None
    assert (match.vhost.hostname, match.how, match.via) == (expected, how, via)


def test_default_vhost_fallback_and_missing_default() -> None:
    policy = _policy({"hostname": "a"}, {"hostname": "fallback"}, default_vhost="fallback")
    assert lookup_vhost(policy, "zzz").hostname == "fallback"  # type: ignore[union-attr]
    missing = _policy({"hostname": "a"}, default_vhost="fallback")
    assert lookup_vhost(missing, "zzz") is None
    disabled = _policy({"hostname": "a"}, {"hostname": "$default"}, default_vhost="")
    assert lookup_vhost(disabled, "zzz") is None
    assert lookup_vhost(disabled, None) is None  # "" is not a vhost here


def test_pattern_tree_precedence_is_depth_first_exact_star_glob() -> None:
    tree, problems = HostnamePatterns.build(["a.#", "a.b.#", "a.*.c", "#.c", "*.*"])
    assert problems == []
    assert tree.find("a.b.c") == "a.b.#"
    assert tree.find("a.x.c") == "a.*.c"
    assert tree.find("a.x.y") == "a.#"
    assert tree.find("z.c") == "*.*"  # no exact 'z' child: the '*' subtree is searched first
    assert tree.find("z.q.c") == "#.c"
    assert tree.find("z.q.r.c") == "#.c"
    assert tree.find("") is None
    assert len(tree) == 5


def test_pattern_normalisation_conflicts() -> None:
    _, problems = HostnamePatterns.build(["#.*.x", "*.#.x", "a.#.#", "a.#", "", "./"])
    assert problems == [("*.#.x", "#.*.x"), ("a.#", "a.#.#"), ("", "empty"), ("./", "empty")]


GROUPS = {
    "hostname": "v",
    "allowUnknownUser": True,
    "groups": {
        "admins": {"users": "alice, bob"},
        "everyone": {"users": "*"},
        "$default": {"users": "listed-default"},
    },
}


@pytest.mark.parametrize(
    ("user", "group", "how"),
    [
        ("alice", "admins", "user"),
        ("ALICE", "everyone", "any_user"),
        ("listed-default", "$default", "user"),
        ("zed", "everyone", "any_user"),
    ],
)
def test_group_assignment(user: str, group: str, how: str) -> None:
    vhost = _policy(GROUPS).vhosts["v"]
    match = resolve_group(vhost, user)
    assert match is not None
    assert (match.group.name, match.how) == (group, how)


def test_unknown_user_default_or_denied() -> None:
    attrs = {"hostname": "v", "allowUnknownUser": True,
             "groups": {"g": {"users": "u"}, "$default": {}}}
    vhost = _policy(attrs).vhosts["v"]
    assert resolve_group(vhost, "zed").how == "unknown_user"  # type: ignore[union-attr]
    assert lookup_group(vhost, "zed").name == "$default"  # type: ignore[union-attr]
    strict = _policy({**attrs, "allowUnknownUser": False}).vhosts["v"]
    assert lookup_group(strict, "zed") is None
    assert lookup_group(strict, "u").name == "g"  # type: ignore[union-attr]
