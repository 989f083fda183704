"""policy/topics/filters.py: splitting, wildcard matching, coverage, ${user} substitution."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.policy.topics.filters import (
    MANY,
    ONE,
    USER,
    TopicSyntax,
    covers,
    fixed_prefix,
    has_wildcard,
    instantiate,
    is_safe_user,
    matches,
    render,
)

MQTT = TopicSyntax("/", "mqtt")
AMQP_DOT = TopicSyntax(".", "amqp")


def f(text: str, syntax: TopicSyntax = MQTT) -> tuple[object, ...]:
    return syntax.subscription(text)


def test_split_is_literal_on_the_one_separator() -> None:
    assert MQTT.split("") == ()
    assert MQTT.split("A/B") == ("A", "B")
    assert MQTT.split("/A/") == ("", "A", "")
    assert MQTT.split("a.b/c") == ("a.b", "c")
    assert AMQP_DOT.split("a.b/c") == ("a", "b/c")


def test_subscription_wildcards_are_whole_tokens_of_the_syntax() -> None:
    assert f("A/+/#") == ("A", ONE, MANY)
    assert f("A/*/b+") == ("A", "*", "b+")  # '*' and 'b+' are literal in mqtt syntax
    assert f("a.*.#", AMQP_DOT) == ("a", ONE, MANY)
    assert f("a.+", AMQP_DOT) == ("a", "+")
    assert has_wildcard(f("A/+")) and not has_wildcard(f("A/B"))
    assert fixed_prefix(f("SEC/COMB/*/GOOD", TopicSyntax("/", "amqp"))) == ("SEC", "COMB")
    assert fixed_prefix(f("#")) == ()
    assert render(("a", ONE, MANY, USER), AMQP_DOT) == "a.*.#.${user}"


@pytest.mark.parametrize(("pattern", "topic", "expected"), [
    ("A/B", "A/B", True),
    ("A/B", "A/B/C", False),
    ("A/+", "A/B", True),
    ("A/+", "A", False),
    ("A/+", "A/", True),          # an empty token is a token
    ("A/#", "A", True),           # MQTT: '#' matches the parent level too
    ("A/#", "A/B/C", True),
    ("#", "", True),
    ("#", "x/y", True),
    ("+/B/#", "x/B", True),
    ("+/B/#", "x/C", False),
    ("A/#/C", "A/C", True),       # '#' anywhere (amqp-style subscriptions)
    ("A/#/C", "A/x/y/C", True),
    ("A/#/C", "A/x/y/D", False),
    ("#/+/Z", "Z", False),
    ("#/+/Z", "a/Z", True),
])
def test_matches(pattern: str, topic: str, expected: bool) -> None:
    assert matches(f(pattern), MQTT.split(topic)) is expected


@pytest.mark.parametrize(("outer", "inner", "expected"), [
    ("A/#", "A/+", True),
    ("A/#", "A/B/#", True),
    ("A/#", "A/#", True),
    ("A/+", "A/#", False),        # A/# also receives A and A/B/C
    ("A/+", "A/+", True),
    ("A/+/C", "A/B/C", True),
    ("A/B/C", "A/+/C", False),
    ("#", "#", True),
    ("+/#", "#", False),          # '#' includes the empty topic
    ("+/#", "A/#", True),
    ("#/+", "A/#", True),         # every topic of A/# has at least one token
    ("+/#", "#/A", True),         # '#' anywhere in the inner filter
    ("A/+/#", "A/#", False),
    ("public/+/status", "public/#", False),
    ("public/+/status", "public/+/status", True),
])
def test_covers(outer: str, inner: str, expected: bool) -> None:
    assert covers(f(outer), f(inner)) is expected


def test_instantiate_user_as_one_literal_token() -> None:
    pattern = (USER, MANY)
    assert instantiate(pattern, "alice", "/", fail_closed_as=None) == ("alice", MANY)
    assert instantiate(("x",), "alice", "/", fail_closed_as=None) == ("x",)
    for unsafe in ("", "a/b", "+", "#", "*", "ev+il", "x#"):
        assert not is_safe_user(unsafe, "/")
        assert instantiate(pattern, unsafe, "/", fail_closed_as=None) is None
        assert instantiate(pattern, unsafe, "/", fail_closed_as=MANY) == (MANY, MANY)
    assert is_safe_user("a.b", "/") and not is_safe_user("a.b", ".")


# ------------------------------------------------------------------------ properties

TOKENS = st.sampled_from(["a", "b", "c"])
FILTER_TOKEN = st.one_of(TOKENS, st.just(ONE), st.just(MANY))
filters = st.lists(FILTER_TOKEN, max_size=4).map(tuple)
topics = st.lists(st.sampled_from(["a", "b", "c", "zz"]), max_size=5).map(tuple)


def _expansions(pattern: tuple[object, ...], outer: tuple[object, ...], limit: int
                ) -> set[tuple[str, ...]]:
    """Topics of ``pattern`` up to ``limit`` tokens; a wildcard of ``pattern`` stands for the
    literals of ``outer`` or one fresh token (any other token behaves like the fresh one)."""
    alphabet = sorted({t for t in outer if isinstance(t, str)}) + ["zz"]
    collapsed: list[object] = []
    for tok in pattern:  # '#/#' is '#'
        if not (tok is MANY and collapsed and collapsed[-1] is MANY):
            collapsed.append(tok)
    out: set[tuple[str, ...]] = {()}
    for tok in collapsed:
        nxt: set[tuple[str, ...]] = set()
        for prefix in out:
            if tok is ONE:
                options = [(x,) for x in alphabet]
            elif tok is MANY:
                options = [tuple(p) for n in range(4) for p in itertools.product(alphabet, repeat=n)]
            else:
                options = [(tok,)]
            nxt.update(prefix + o for o in options if len(prefix) + len(o) <= limit)
        out = nxt
    return out


def _regex_match(pattern: tuple[object, ...], topic: tuple[str, ...]) -> bool:
    import re

    parts = []
    for tok in pattern:
        parts.append("(?:[^/]*/)" if tok is ONE else "(?:[^/]*/)*" if tok is MANY
                     else re.escape(f"{tok}/"))
    return re.fullmatch("".join(parts), "".join(f"{t}/" for t in topic)) is not None


@settings(max_examples=200, deadline=None)
@given(filters, topics)
def test_matches_agrees_with_a_regex(pattern: tuple[object, ...], topic: tuple[str, ...]) -> None:
    assert matches(pattern, topic) is _regex_match(pattern, topic)


small_filters = st.lists(FILTER_TOKEN, max_size=3).map(tuple)


@settings(max_examples=120, deadline=None)
@given(small_filters, small_filters)
def test_covers_agrees_with_enumeration(outer: tuple[object, ...], inner: tuple[object, ...]
                                        ) -> None:
    # With filters of at most 3 tokens, a topic outside ``outer`` (if any) is found among
    # topics where each '#' of ``inner`` stands for at most 3 tokens of a, b, c or a fresh one.
    enumerated = all(matches(outer, topic) for topic in _expansions(inner, outer, limit=9))
    assert covers(outer, inner) is enumerated
    # A filter always covers itself, and '#' covers everything.
    assert covers(inner, inner)
    assert covers((MANY,), inner)
