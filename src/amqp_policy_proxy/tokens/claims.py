"""Sans-IO. From a validated token to the policy's terms: the user, and its group in each vhost.

The identity claim (``identity_claim``, ``sub`` by default) is the policy user everywhere. The
groups come from the token's *scopes*: the strings of every ``scope_claims`` claim (a
space-separated string or a list, at a claim path such as ``realm_access.roles``), each alias
of ``scope_aliases`` replaced by the scopes it stands for (RabbitMQ's ``scope_aliases``), then
only those starting with ``scope_prefix``, with the prefix removed. The ``groups`` rules then
give each vhost its group: for each vhost, the first rule (in configuration order) one of
whose scopes the token holds. QDR gives a user one group per vhost, and so does this.

A vhost no rule decides falls back to the policy's own assignment
(:func:`~amqp_policy_proxy.policy.lookup.resolve_group`: the group listing the user, ``*``,
``$default``), so a policy that lists token users by name keeps working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from ..policy.lookup import resolve_group
from ..policy.model import GroupSettings, Policy, VhostPolicy
from .errors import RejectReason, TokenRejected, shown
from .paths import claim_at, claim_strings
from .validate import ValidatedToken

if TYPE_CHECKING:  # a type only: the schema (pydantic) stays out of the core
    from .config import TokenAuthConfig


@dataclass(frozen=True, slots=True)
class TokenIdentity:
    """Who a token connection is, in the policy's terms."""

    user: str
    """The identity claim's value: the policy user."""
    expires_at: float
    """The token's ``exp`` (seconds since the epoch); a connection is closed at it plus
    ``expiry_grace_seconds`` unless renewed."""
    scopes: frozenset[str] = frozenset()
    """The scopes after aliases and prefix."""
    groups: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Vhost name -> group name, for the vhosts a ``groups`` rule decides."""
    matched: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Vhost name -> the scope that decided its group (for ``explain`` and the audit)."""


class TokenGroup(NamedTuple):
    """The group a token's user has in one vhost, and how it got it."""

    group: GroupSettings
    how: str
    """``"token"`` (a ``groups`` rule), else the policy's own ``"user"``, ``"any_user"`` or
    ``"unknown_user"`` (:class:`~amqp_policy_proxy.policy.lookup.GroupMatch`)."""
    rule: str
    """In words, for the audit trail's ``rule``."""


def token_scopes(claims: Mapping[str, Any], config: TokenAuthConfig) -> frozenset[str]:
    """The scopes of a token (see the module text).

    Args:
        claims: the validated token's claims.
        config: ``scope_claims``, ``scope_aliases`` and ``scope_prefix``.

    Returns:
        The scopes, prefix removed (an empty remainder is left out).
    """
    values: list[str] = []
    for path in config.scope_claims:
        for value in claim_strings(claim_at(claims, path)):
            values.extend(config.scope_aliases.get(value, (value,)))
    prefix = config.scope_prefix
    if not prefix:
        return frozenset(values)
    return frozenset(v[len(prefix):] for v in values if v.startswith(prefix) and len(v) > len(prefix))


def identity_from_token(token: ValidatedToken, config: TokenAuthConfig) -> TokenIdentity:
    """The policy user and its groups per vhost, from a validated token.

    Args:
        token: what :func:`~.validate.validate_token` returned.
        config: the scope settings and the ``groups`` rules.

    Returns:
        The identity; ``groups`` holds the vhosts some rule decides.
    """
    scopes = token_scopes(token.claims, config)
    groups: dict[str, str] = {}
    matched: dict[str, str] = {}
    for rule in config.groups:
        if rule.vhost in groups:
            continue
        hit = next((s for s in rule.scopes if s in scopes), None)
        if hit is not None:
            groups[rule.vhost] = rule.group
            matched[rule.vhost] = hit
    return TokenIdentity(token.subject, token.expires_at, scopes, MappingProxyType(groups),
                         MappingProxyType(matched))


def group_for(vhost: VhostPolicy, identity: TokenIdentity) -> TokenGroup | None:
    """The group of ``identity`` in ``vhost``.

    Args:
        vhost: the vhost the Open resolved to.
        identity: the token connection's identity.

    Returns:
        The group a ``groups`` rule gives (``how`` ``"token"``); else the policy's own
        assignment of the user; None when neither gives one (denied as ``unknown_user``), or
        when the rule names a group the vhost does not define (a configuration error that
        :func:`mapping_issues` reports at load).
    """
    name = identity.groups.get(vhost.hostname)
    if name is not None:
        settings = vhost.groups.get(name)
        if settings is None:
            return None
        return TokenGroup(settings, "token",
                          f"group '{name}' (token scope '{identity.matched[vhost.hostname]}')")
    match = resolve_group(vhost, identity.user)
    if match is None:
        return None
    return TokenGroup(match.group, match.how, f"group '{match.group.name}' (policy, {match.how})")


def seconds_left(identity: TokenIdentity, config: TokenAuthConfig, now: float) -> float:
    """Seconds until a connection with ``identity`` must be closed as expired: ``exp`` plus
    ``expiry_grace_seconds``, less ``now``.

    Args:
        identity: the connection's identity.
        config: ``expiry_grace_seconds``.
        now: wall-clock seconds since the epoch (the claims' clock); add the result to the
            shell's monotonic clock to get the connection's deadline.

    Returns:
        The seconds left (0 or less: close now).
    """
    return identity.expires_at + config.expiry_grace_seconds - now


def check_username(identity_user: str, username: str | None) -> None:
    """The SASL user name a token connection gives must be empty or the token's identity
    (RabbitMQ's convention: the password is the token, the name is not trusted).

    Args:
        identity_user: the validated token's identity claim.
        username: the PLAIN authcid (or OAUTHBEARER's ``a=``); None or ``""`` when absent.

    Raises:
        TokenRejected: ``username_mismatch``, naming neither the token nor the password.
    """
    if username and username != identity_user:
        raise TokenRejected(RejectReason.USERNAME_MISMATCH,
                            f"SASL user '{shown(username)}' is not the token's identity "
                            f"'{shown(identity_user)}'")


def mapping_issues(config: TokenAuthConfig, policy: Policy) -> list[str]:
    """The ``groups`` rules that name a vhost or group the policy does not define.

    Returns:
        One line per problem, ``token_auth.groups[i]: ...``; empty when every rule fits.
    """
    issues = []
    for i, rule in enumerate(config.groups):
        vhost = policy.vhosts.get(rule.vhost)
        if vhost is None:
            issues.append(f"token_auth.groups[{i}]: vhost '{rule.vhost}' is not defined by the "
                          "policy")
        elif rule.group not in vhost.groups:
            issues.append(f"token_auth.groups[{i}]: vhost '{rule.vhost}' has no group "
                          f"'{rule.group}'")
    return issues
