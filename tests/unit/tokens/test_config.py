"""TokenAuthConfig: what it accepts and each refusal's message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from amqp_policy_proxy.tokens.config import TokenAuthConfig

BASE = {"issuer": "https://idp.test", "audience": "amqp", "jwks_file": "/etc/jwks.json"}


def test_defaults_and_a_single_audience() -> None:
    c = TokenAuthConfig.model_validate(BASE)
    assert c.audience == ["amqp"] and c.algorithms == ["RS256", "ES256"]
    assert (c.identity_claim, c.token_authority, c.max_token_bytes) == ("sub", "proxy", 8192)
    assert c.scope_claims == ["scope"] and c.groups == [] and c.clock_skew_seconds == 30


def test_a_full_table() -> None:
    c = TokenAuthConfig.model_validate(BASE | {
        "jwks_file": None, "jwks_url": "https://idp.test/certs", "audience": ["a", "b"],
        "algorithms": ["PS256", "EdDSA"], "scope_claims": ["scope", "realm_access.roles"],
        "scope_prefix": "amqp-proxy.", "scope_aliases": {"admin": "amqp-proxy.ops"},
        "groups": [{"vhost": "orders", "group": "writers", "scopes": ["orders.write"]}],
        "token_authority": "upstream", "jwks_refresh_seconds": 600, "expiry_grace_seconds": 5})
    assert c.scope_aliases == {"admin": ["amqp-proxy.ops"]}
    assert c.groups[0].scopes == ["orders.write"] and c.token_authority == "upstream"


@pytest.mark.parametrize(("change", "message"), [
    ({"jwks_file": None}, "exactly one of jwks_file and jwks_url"),
    ({"jwks_url": "https://idp.test/certs"}, "exactly one of jwks_file and jwks_url"),
    ({"jwks_file": None, "jwks_url": "http://idp.test/certs"}, "loopback"),
    ({"jwks_file": None, "jwks_url": "ftp://idp.test/certs"}, "https://"),
    ({"algorithms": ["HS256"]}, "algorithms.0"),
    ({"algorithms": ["none"]}, "algorithms.0"),
    ({"algorithms": []}, "at least 1"),
    ({"audience": []}, "at least 1"),
    ({"issuer": " "}, "must not be empty"),
    ({"identity_claim": "a..b"}, "claim name or a dotted path"),
    ({"max_token_bytes": "8192"}, "valid integer"),
    ({"clock_skew_seconds": -1}, "greater than or equal to 0"),
    ({"token_authority": "both"}, "'proxy' or 'upstream'"),
    ({"jwks_retry_seconds": 10, "jwks_max_retry_seconds": 5}, "below jwks_retry_seconds"),
    ({"surprise": 1}, "Extra inputs"),
    ({"groups": [{"vhost": "v", "group": "g", "scopes": []}]}, "at least 1"),
])
def test_refusals(change, message) -> None:
    with pytest.raises(ValidationError) as info:
        TokenAuthConfig.model_validate(BASE | change)
    assert message in str(info.value), str(info.value)


def test_http_for_a_loopback_jwks_url() -> None:
    for host in ("127.0.0.1", "localhost", "[::1]"):
        TokenAuthConfig.model_validate(BASE | {"jwks_file": None,
                                               "jwks_url": f"http://{host}:8080/jwks"})


def test_the_algorithm_type_spells_the_allow_list() -> None:
    """`[token_auth] algorithms` accepts exactly jwks.ALGORITHMS (the type and the tuple live
    apart so the core's token checks need no pydantic)."""
    from typing import get_args

    from amqp_policy_proxy.tokens.config import Algorithm
    from amqp_policy_proxy.tokens.jwks import ALGORITHMS

    assert get_args(Algorithm) == ALGORITHMS
