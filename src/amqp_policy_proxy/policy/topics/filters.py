"""Sans-IO. Topic names and topic filters: splitting, wildcard matching, filter coverage.

A *topic* is an AMQP address read as a list of tokens split on the vhost's separator (``/`` or
``.``, exactly one of them per vhost: docs/topic-authorization.md). The split is literal: ``"A/B"`` is
``("A", "B")``, ``"/A"`` is ``("", "A")`` and ``""`` is the root ``()``; the other separator
character is an ordinary character.

A *filter* is a tuple of tokens where a wildcard token is one of the sentinels :data:`ONE`
(exactly one token: MQTT ``+``, AMQP ``*``) or :data:`MANY` (zero or more tokens: ``#``), and
the ``${user}`` token is :data:`USER`. Only a whole token is a wildcard: ``a+`` or ``a*`` is a
literal token (as in QDR address patterns; MQTT forbids such tokens in filters, and the policy
compiler rejects them in configured filters).

Three operations, all precompiled-tuple and plain-string work, no regex:

* :func:`matches`: does a concrete topic match a filter (publish, per-delivery checks).
* :func:`covers`: is every topic matched by one filter also matched by another (a wildcard
  subscription is allowed by a rule only when the rule's filter covers it: HiveMQ semantics).
* :func:`instantiate`: substitute the user name for ``${user}`` without letting a user name
  that contains a separator or a wildcard character gain wildcard power.

No I/O, no clock, no imports outside the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

USER_TOKEN: Final = "${user}"
"""The substitution token of permission filters; only valid as a whole token."""
MQTT: Final = "mqtt"
"""Wildcard syntax: ``+`` one token, ``#`` zero or more (last)."""
AMQP: Final = "amqp"
"""Wildcard syntax: ``*`` one token, ``#`` zero or more."""
WILDCARD_SYNTAXES: Final = (MQTT, AMQP)
SEPARATORS: Final = ("/", ".")
"""The token separators a vhost may choose."""
MANY_TOKEN: Final = "#"
ONE_TOKEN_BY_SYNTAX: Final = {MQTT: "+", AMQP: "*"}
UNSAFE_USER_CHARACTERS: Final = frozenset("+#*")
"""Characters that make a user name unusable as a ``${user}`` token value."""


class _Wildcard:
    """A filter sentinel (compared by identity)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ONE: Final = _Wildcard("ONE")
"""Filter token matching exactly one topic token."""
MANY: Final = _Wildcard("MANY")
"""Filter token matching zero or more topic tokens."""
USER: Final = _Wildcard("USER")
"""Filter token standing for the user name (``${user}``), before :func:`instantiate`."""

Token = str | _Wildcard
Filter = tuple[Token, ...]


@dataclass(frozen=True, slots=True)
class TopicSyntax:
    """How a vhost splits topics and spells wildcards.

    Attributes:
        separator: ``"/"`` or ``"."``.
        wildcards: ``"mqtt"`` (``+``, ``#``) or ``"amqp"`` (``*``, ``#``).
    """

    separator: str = "/"
    wildcards: str = MQTT

    @property
    def one(self) -> str:
        """The one-token wildcard of this syntax: ``+`` (mqtt) or ``*`` (amqp)."""
        return ONE_TOKEN_BY_SYNTAX[self.wildcards]

    def split(self, topic: str) -> tuple[str, ...]:
        """Split a topic or filter into tokens (literal split; ``""`` is the root ``()``)."""
        return tuple(topic.split(self.separator)) if topic else ()

    def join(self, tokens: tuple[str, ...]) -> str:
        """The topic text of ``tokens`` (inverse of :meth:`split`)."""
        return self.separator.join(tokens)

    def subscription(self, topic: str) -> Filter:
        """A client's subscription address as a filter: whole-token wildcards of this syntax.

        Args:
            topic: the receiver's source address.

        Returns:
            The tokens, with this syntax's one-token wildcard as :data:`ONE` and ``#`` as
            :data:`MANY`; every other token (including ``a+``, ``a*``, ``${user}``) is literal.
        """
        one = self.one
        return tuple(
            ONE if tok == one else MANY if tok == MANY_TOKEN else tok for tok in self.split(topic)
        )


def has_wildcard(pattern: Filter) -> bool:
    """True when the filter has a :data:`ONE` or :data:`MANY` token."""
    return any(tok is ONE or tok is MANY for tok in pattern)


def fixed_prefix(pattern: Filter) -> tuple[str, ...]:
    """The tokens before the first wildcard (IBM MQ's "fully qualified prefix").

    ``SEC/COMB/*/GOOD`` -> ``("SEC", "COMB")``; a filter without wildcards is returned whole.
    """
    out: list[str] = []
    for tok in pattern:
        if not isinstance(tok, str):
            break
        out.append(tok)
    return tuple(out)


def render(pattern: Filter, syntax: TopicSyntax) -> str:
    """The filter as text in ``syntax`` (``ONE`` as ``+``/``*``, ``MANY`` as ``#``)."""
    names = {ONE: syntax.one, MANY: MANY_TOKEN, USER: USER_TOKEN}
    return syntax.separator.join(tok if isinstance(tok, str) else names[tok] for tok in pattern)


def is_safe_user(user: str, separator: str) -> bool:
    """True when ``user`` can stand for ``${user}`` as one literal token.

    A user name that is empty, contains the separator, or contains ``+``, ``#`` or ``*`` is
    unsafe: substituted as text it would span several tokens or act as a wildcard.
    """
    return bool(user) and separator not in user and UNSAFE_USER_CHARACTERS.isdisjoint(user)


def instantiate(pattern: Filter, user: str, separator: str, *, fail_closed_as: Token | None
                ) -> Filter | None:
    """Substitute the user name for every :data:`USER` token.

    A safe user name (see :func:`is_safe_user`) becomes one literal token, compared by string
    equality, so it never acts as a wildcard. For an unsafe name the ``${user}`` token cannot be
    a literal: with ``fail_closed_as=None`` the filter matches nothing (the function returns
    None: use this for rules that grant), otherwise the token is replaced by ``fail_closed_as``
    (``MANY`` for rules that deny, so a strange user name denies more, never less).

    Args:
        pattern: a compiled filter, possibly with :data:`USER` tokens.
        user: the authenticated user name.
        separator: the vhost's separator.
        fail_closed_as: replacement of ``${user}`` for an unsafe user name, or None.

    Returns:
        The filter without :data:`USER` tokens, or None when it can match nothing.
    """
    if USER not in pattern:
        return pattern
    if is_safe_user(user, separator):
        return tuple(user if tok is USER else tok for tok in pattern)
    if fail_closed_as is None:
        return None
    return tuple(fail_closed_as if tok is USER else tok for tok in pattern)


def matches(pattern: Filter, topic: tuple[str, ...]) -> bool:
    """Does the concrete ``topic`` match ``pattern`` (no :data:`USER` tokens left)?

    ``ONE`` matches exactly one token (possibly empty), ``MANY`` zero or more tokens anywhere
    in the filter; so ``A/#`` matches ``A`` itself, as in MQTT. Greedy matching with
    backtracking to the last ``MANY``: linear for the usual filters.

    Args:
        pattern: the filter.
        topic: the topic's tokens.

    Returns:
        True when the whole topic matches the whole filter.
    """
    if MANY not in pattern:
        if len(pattern) != len(topic):
            return False
        for p, t in zip(pattern, topic, strict=True):
            if p is not ONE and p != t:
                return False
        return True
    n, m = len(pattern), len(topic)
    i = j = 0
    star_i, star_j = -1, 0
    while j < m:
        if i < n and pattern[i] is MANY:
            star_i, star_j = i, j
            i += 1
        elif i < n and (pattern[i] is ONE or pattern[i] == topic[j]):
            i += 1
            j += 1
        elif star_i >= 0:
            star_j += 1
            i, j = star_i + 1, star_j
        else:
            return False
    while i < n and pattern[i] is MANY:
        i += 1
    return i == n


def covers(outer: Filter, inner: Filter) -> bool:
    """Is every topic matched by ``inner`` also matched by ``outer``?

    Exact language containment for filters of literal tokens, ``ONE`` and ``MANY`` (``MANY``
    anywhere). ``outer`` is read as a nondeterministic automaton whose states are positions in
    it; ``inner`` is walked token by token while keeping every *set* of states the automaton
    could be in for some topic of ``inner`` so far. A ``ONE`` or ``MANY`` of ``inner`` stands
    for any token: it is enough to try each literal of ``outer`` plus one token that is none of
    them. ``inner`` is covered when every reachable set contains the final state.

    Args:
        outer: the covering filter (e.g. a permission rule), no :data:`USER` tokens.
        inner: the covered filter (e.g. a subscription), no :data:`USER` tokens.

    Returns:
        True when ``inner`` is a subset of ``outer``. A filter covers itself.
    """
    n = len(outer)
    literals = {tok for tok in outer if isinstance(tok, str)}
    alphabet: list[str | None] = [*literals, None]  # None: a token unlike every literal

    def close(states: frozenset[int]) -> frozenset[int]:
        out = set(states)
        for s in states:
            while s < n and outer[s] is MANY:
                s += 1
                out.add(s)
        return frozenset(out)

    def step(states: frozenset[int], token: str | None) -> frozenset[int]:
        nxt: set[int] = set()
        for s in states:
            if s == n:
                continue
            tok = outer[s]
            if tok is MANY:
                nxt.add(s)
            elif tok is ONE or (token is not None and tok == token):
                nxt.add(s + 1)
        return close(frozenset(nxt))

    current: set[frozenset[int]] = {close(frozenset({0}))}
    for tok in inner:
        nxt: set[frozenset[int]] = set()
        if isinstance(tok, str):
            for states in current:
                nxt.add(step(states, tok))
        elif tok is ONE:
            for states in current:
                nxt.update(step(states, a) for a in alphabet)
        else:  # MANY: every set reachable through zero or more arbitrary tokens
            frontier = list(current)
            nxt.update(current)
            while frontier:
                states = frontier.pop()
                for a in alphabet:
                    reached = step(states, a)
                    if reached not in nxt:
                        nxt.add(reached)
                        frontier.append(reached)
        current = nxt
        if frozenset() in current:  # some topic of inner already fell out of outer
            return False
    return all(n in states for states in current)
