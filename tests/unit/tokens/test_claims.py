"""Claims to the policy's terms: claim paths, scopes (aliases, prefix), the group of each
vhost, the fallback to the policy's own users, the SASL user-name rule."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy
from amqp_policy_proxy.tokens.claims import (
    check_username,
    group_for,
    identity_from_token,
    mapping_issues,
    seconds_left,
    token_scopes,
)
from amqp_policy_proxy.tokens.errors import RejectReason, TokenRejected
from amqp_policy_proxy.tokens.paths import claim_at, claim_strings
from amqp_policy_proxy.tokens.validate import validate_token

from .conftest import NOW, Issuer, make_config

GROUPS = [
    {"vhost": "orders", "group": "admins", "scopes": ["orders.admin"]},
    {"vhost": "orders", "group": "writers", "scopes": ["orders.write", "orders.all"]},
    {"vhost": "orders", "group": "readers", "scopes": ["orders.read"]},
    {"vhost": "audit", "group": "readers", "scopes": ["orders.read", "audit.read"]},
]


def _vhost(name: str, *groups: str, users: dict[str, str] | None = None,
           unknown: bool = False) -> VhostPolicy:
    return VhostPolicy(hostname=name, groups={g: GroupSettings(name=g) for g in groups},
                       user_groups=users or {}, allow_unknown_user=unknown)


def test_claim_paths() -> None:
    claims = {"scope": "a b", "realm_access": {"roles": ["r1", "r2"]},
              "https://example.com/roles": ["x"], "a": {"b.c": 1, "b": {"c": 2}},
              "resource_access": {"amqp": {"roles": ["admin"]}}}
    assert claim_at(claims, "scope") == "a b"
    assert claim_at(claims, "realm_access.roles") == ["r1", "r2"]
    assert claim_at(claims, "https://example.com/roles") == ["x"]
    assert claim_at(claims, "a.b.c") == 1  # the longer member name first
    assert claim_at(claims, "resource_access.amqp.roles") == ["admin"]
    assert claim_at(claims, "realm_access.nope") is None and claim_at(claims, "x.y") is None
    assert claim_at({"scope": "s"}, "scope.x") is None


def test_claim_strings() -> None:
    assert claim_strings("a  b\tc") == ("a", "b", "c")
    assert claim_strings(["a", 1, "", None, "b"]) == ("a", "b")
    assert claim_strings({"a": 1}) == () and claim_strings(None) == () and claim_strings(3) == ()


def test_scopes_from_several_claims_with_prefix_and_aliases() -> None:
    config = make_config(scope_claims=["scope", "roles", "realm_access.roles"],
                         scope_aliases={"ops": ["amqp-proxy.orders.admin", "amqp-proxy.audit.read"],
                                        "amqp-proxy.legacy": "amqp-proxy.orders.read"})
    claims = {"scope": "openid amqp-proxy.orders.write amqp-proxy.",
              "roles": ["ops", "other"], "realm_access": {"roles": ["amqp-proxy.legacy"]}}
    assert token_scopes(claims, config) == {"orders.write", "orders.admin", "audit.read",
                                            "orders.read"}
    assert token_scopes(claims, make_config(scope_prefix="")) == {
        "openid", "amqp-proxy.orders.write", "amqp-proxy."}


def test_groups_per_vhost_first_rule_wins(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS)
    token = validate_token(issuer.token(scope="amqp-proxy.orders.read amqp-proxy.orders.write"),
                           config, issuer.keyset(), NOW)
    ident = identity_from_token(token, config)
    assert ident.user == "alice" and ident.expires_at == NOW + 300
    assert dict(ident.groups) == {"orders": "writers", "audit": "readers"}
    assert dict(ident.matched) == {"orders": "orders.write", "audit": "orders.read"}
    orders = _vhost("orders", "admins", "writers", "readers")
    match = group_for(orders, ident)
    assert match is not None and match.group.name == "writers" and match.how == "token"
    assert "orders.write" in match.rule


def test_a_list_claim_in_a_nested_path(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS, scope_claims=["realm_access.roles"])
    token = validate_token(issuer.token(realm_access={"roles": ["amqp-proxy.orders.admin"]}),
                           config, issuer.keyset(), NOW)
    assert dict(identity_from_token(token, config).groups) == {"orders": "admins"}


def test_no_rule_falls_back_to_the_policys_users(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS)
    token = validate_token(issuer.token(scope="openid"), config, issuer.keyset(), NOW)
    ident = identity_from_token(token, config)
    assert dict(ident.groups) == {}
    listed = _vhost("orders", "writers", "ops", users={"alice": "ops"})
    match = group_for(listed, ident)
    assert match is not None and (match.group.name, match.how) == ("ops", "user")
    anyone = _vhost("orders", "everyone", users={"*": "everyone"})
    match = group_for(anyone, ident)
    assert match is not None and match.how == "any_user"
    assert group_for(_vhost("orders", "writers"), ident) is None
    unknown = _vhost("orders", "$default", unknown=True)
    match = group_for(unknown, ident)
    assert match is not None and match.how == "unknown_user"


def test_a_rule_naming_a_group_the_vhost_lacks_gives_none(issuer: Issuer) -> None:
    config = make_config(groups=GROUPS)
    token = validate_token(issuer.token(scope="amqp-proxy.orders.admin"), config,
                           issuer.keyset(), NOW)
    ident = identity_from_token(token, config)
    # the policy's users list would give "ops", but the rule decides the vhost: no fallback
    vhost = _vhost("orders", "writers", "ops", users={"alice": "ops"})
    assert group_for(vhost, ident) is None


def test_mapping_issues() -> None:
    config = make_config(groups=GROUPS)
    policy = Policy(vhosts={"orders": _vhost("orders", "writers", "readers")})
    assert mapping_issues(config, policy) == [
        "token_auth.groups[0]: vhost 'orders' has no group 'admins'",
        "token_auth.groups[3]: vhost 'audit' is not defined by the policy",
    ]


def test_username_empty_or_the_identity() -> None:
    check_username("alice", None)
    check_username("alice", "")
    check_username("alice", "alice")
    with pytest.raises(TokenRejected) as info:
        check_username("alice", "admin")
    assert info.value.reason is RejectReason.USERNAME_MISMATCH


def test_seconds_left_counts_the_grace(issuer: Issuer) -> None:
    config = make_config(expiry_grace_seconds=5)
    ident = identity_from_token(validate_token(issuer.token(), config, issuer.keyset(), NOW),
                                config)
    assert seconds_left(ident, config, NOW) == 305
    assert seconds_left(ident, config, NOW + 310) == -5
