"""Sans-IO. A group's ordered permission list (``permissions``; HiveMQ default permissions).

Each rule is ``{topic, activity, qos, type}``. A rule matches a request when its activity
covers the request (``all`` covers both), its QoS list holds the link's QoS
(:func:`~.outcomes.qos_of`), and its topic filter matches the address:

* publish, and a subscription without wildcards: the concrete address must match the filter;
* a subscription with wildcards: the subscription must be **covered** by the rule's filter
  (every topic it can receive is matched by the filter: HiveMQ semantics). A deny rule is
  matched the same way, so ``a/secret`` deny does not stop an ``a/#`` subscription that a later
  allow rule covers; use ``a/#`` deny, or a ``nearestAcl`` tree, to filter deliveries.

The first matching rule decides. No match: ``defaultBehaviour`` (default: allow when the list
is empty, deny once any rule exists). ``${user}`` is one literal token; a user name that is
empty or holds the separator, ``+``, ``#`` or ``*`` never satisfies a ``${user}`` token of an
allow rule, and turns the token of a deny rule into ``#`` (any number of levels): a strange user
name makes deny rules deny more, never less.

No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from amqp_policy_proxy.policy.topics.filters import (
    MANY,
    USER,
    Filter,
    TopicSyntax,
    covers,
    has_wildcard,
    instantiate,
    is_safe_user,
    matches,
    render,
)
from amqp_policy_proxy.policy.topics.outcomes import PUBLISH, SUBSCRIBE, Principal

ALL: Final = "all"
ACTIVITIES: Final = (PUBLISH, SUBSCRIBE, ALL)
ALLOW: Final = "allow"
DENY: Final = "deny"
TYPES: Final = (ALLOW, DENY)
QOS_LEVELS: Final = (0, 1, 2)
MODEL_NAME: Final = "permissions"
USER_MEMO_SIZE: Final = 1024
"""User names whose substituted rules are kept per permission list."""


@dataclass(frozen=True, slots=True)
class PermissionRule:
    """One compiled rule."""

    index: int
    """Position in the ``permissions`` list (0-based, as in key paths)."""
    topic: str
    """The filter as written."""
    filter: Filter
    activity: str
    """``publish``, ``subscribe`` or ``all``."""
    qos: frozenset[int]
    allow: bool

    def applies_to(self, activity: str, qos: int) -> bool:
        """True when the rule's activity and QoS list cover the request."""
        return (self.activity == ALL or self.activity == activity) and qos in self.qos

    def describe(self, user: str, syntax: TopicSyntax) -> str:
        """``permissions[1] (topic '${user}/#' = 'alice/#', activity all, qos [0, 1], allow)``."""
        topic = f"'{self.topic}'"
        if USER in self.filter:
            got = instantiate(self.filter, user, syntax.separator,
                              fail_closed_as=None if self.allow else MANY)
            if got is None:
                topic += f" (never matches user name '{user}')"
            elif is_safe_user(user, syntax.separator):
                topic += f" = '{render(got, syntax)}'"
            else:
                topic += (f" = '{render(got, syntax)}' (user name '{user}' cannot be one token: "
                          "a deny rule widens ${user} to '#')")
        return (f"permissions[{self.index}] (topic {topic}, activity {self.activity}, "
                f"qos {sorted(self.qos)}, {ALLOW if self.allow else DENY})")


class PermissionList:
    """A group's compiled permission list; immutable, safe to share between threads."""

    __slots__ = ("rules", "default_allow", "default_explicit", "syntax", "_per_user")

    def __init__(self, rules: tuple[PermissionRule, ...], syntax: TopicSyntax,
                 default_behaviour: str | None = None) -> None:
        """Build the list.

        Args:
            rules: compiled rules in order.
            syntax: the vhost's separator and wildcard syntax (the tree's, else ``/`` + mqtt).
            default_behaviour: ``"allow"``, ``"deny"``, or None for the default (allow when
                ``rules`` is empty, else deny).
        """
        self.rules = rules
        self.syntax = syntax
        self.default_explicit = default_behaviour is not None
        self.default_allow = (not rules) if default_behaviour is None else (
            default_behaviour == ALLOW)
        self._per_user: dict[str, tuple[tuple[PermissionRule, Filter, str], ...]] = {}

    def for_user(self, user: str) -> tuple[tuple[PermissionRule, Filter, str], ...]:
        """The rules that can match for ``user``: ``(rule, instantiated filter, description)``.

        Computed once per user name (bounded memo, cleared when full): ``${user}`` substituted,
        allow rules that can never match this user dropped.
        """
        found = self._per_user.get(user)
        if found is None:
            out = []
            for rule in self.rules:
                flt = instantiate(rule.filter, user, self.syntax.separator,
                                  fail_closed_as=None if rule.allow else MANY)
                if flt is not None:
                    out.append((rule, flt, rule.describe(user, self.syntax)))
            found = tuple(out)
            if len(self._per_user) >= USER_MEMO_SIZE:
                self._per_user.clear()
            self._per_user[user] = found
        return found

    def check(self, principal: Principal, activity: str, address: str, qos: int
              ) -> tuple[bool, str]:
        """Decide a publish or subscribe request.

        Args:
            principal: who asks (only the user name is used, for ``${user}``).
            activity: ``"publish"`` or ``"subscribe"``.
            address: the target / relay ``to`` (publish) or the source address (subscribe;
                wildcards in the vhost's syntax).
            qos: the link's QoS (0, 1 or 2).

        Returns:
            ``(allowed, text naming the deciding rule or the default behaviour)``.
        """
        syntax = self.syntax
        user = principal.user
        wild: Filter | None = None
        if activity == SUBSCRIBE:
            pattern = syntax.subscription(address)
            if has_wildcard(pattern):
                wild = pattern
        tokens = syntax.split(address) if wild is None else ()
        for rule, flt, description in self.for_user(user):
            if not rule.applies_to(activity, qos):
                continue
            hit = matches(flt, tokens) if wild is None else covers(flt, wild)
            if hit:
                verb = "allows" if rule.allow else "denies"
                return rule.allow, (f"{MODEL_NAME} {description} {verb} "
                                    f"{activity} '{address}' at qos {qos}")
        verdict = ALLOW if self.default_allow else DENY
        if self.default_explicit:
            why = f"defaultBehaviour {verdict}"
        else:
            why = f"default {verdict} ({'no rules' if not self.rules else 'rules exist'})"
        how = "covers" if wild is not None else "matches"
        return self.default_allow, (f"{MODEL_NAME}: no rule {how} {activity} '{address}' at qos "
                                    f"{qos} for {user}; {why}")
