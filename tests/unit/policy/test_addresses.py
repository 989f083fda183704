"""policy/addresses.py: QDR address pattern matching (sourcePattern, targetPattern, ...), with the injection fixes (a user name is matched as one literal token)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_policy_proxy.policy.addresses import (
    AddressRules,
    match_tokens,
    normalise_tokens,
    split_tokens,
)

# ----------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("a.b/c", ("a", "b", "c")),
        ("/a/b/", ("a", "b")),
        ("..a", ("a",)),
        ("a..", ("a", "")),
        ("a..b", ("a", "", "b")),
        ("", ()),
        ("./", ()),
    ],
)
def test_split_tokens(text: str, tokens: tuple[str, ...]) -> None:
    assert split_tokens(text) == tokens


@pytest.mark.parametrize(
    ("pattern", "normal"),
    [("#.*", "*.#"), ("#.#", "#"), ("a.#.*.#.b", "a.*.#.b"), ("*.*", "*.*"), ("#.a.#", "#.a.#")],
)
def test_normalise(pattern: str, normal: str) -> None:
    assert normalise_tokens(split_tokens(pattern)) == split_tokens(normal)


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("#", "", True),
        ("#", "a.b.c", True),
        ("*", "a", True),
        ("*", "a.b", False),
        ("*", "", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("a.#.c", "a.x.y.d", False),
        ("#.b.#", "b", True),
        ("#.b.#", "x.b.y.b", True),
        ("*.#", "", False),
        ("a", "A", False),
        ("a*", "abc", False),  # '*' inside a token is literal
        ("a*", "a*", True),
    ],
)
def test_match_tokens(pattern: str, address: str, expected: bool) -> None:
    assert match_tokens(normalise_tokens(split_tokens(pattern)), split_tokens(address)) is expected


# ----------------------------------------------------------------- list mode (4.1)


@pytest.mark.parametrize(
    ("items", "address", "user", "expected"),
    [
        (["*"], "anything/at.all", "u", True),
        (["*"], "", "u", False),  # empty address never matches
        ([], "q", "u", False),
        (["public"], "public", "u", True),
        (["public"], "Public", "u", False),
        (["public"], "public.x", "u", False),
        (["temp*"], "temp", "u", True),
        (["temp*"], "temporary", "u", True),
        (["temp*"], "temp/x", "u", True),
        (["temp*"], "tem", "u", False),
        (["a*b"], "a*b", "u", True),  # '*' not at the end is literal
        (["a*b"], "axb", "u", False),
        (["queue.${user}"], "queue.bob", "bob", True),
        (["queue.${user}"], "queue.alice", "bob", False),
        (["${user}"], "bob", "bob", True),
        (["e-${user}-f"], "e-bob-f", "bob", True),
        (["tmp-${user}*"], "tmp-bob", "bob", True),
        (["tmp-${user}*"], "tmp-bobby", "bob", True),
        (["tmp-${user}*"], "tmp-bo", "bob", False),
        (["tmp-${user}"], "tmp-", "", False),  # empty user never matches a ${user} item
        # QDR quirk fixed: the trailing '*' comes from the user, not the item
        (["tmp-${user}"], "tmp-bob", "*", False),
        (["tmp-${user}"], "tmp-*", "*", True),
        (["tmp-${user}"], "tmp-bob", "b*", False),
        # a literal "${user}" address is just a string
        (["queue.${user}", "other"], "queue.${user}", "bob", False),
    ],
)
def test_list_mode(items: list[str], address: str, user: str, expected: bool) -> None:
    rules = AddressRules.from_list(items)
    assert rules.allows(address, user) is expected
    assert (rules.first_match(address, user) is not None) is expected


# ----------------------------------------------------------------- pattern mode (4.2)


@pytest.mark.parametrize(
    ("items", "address", "user", "expected"),
    [
        (["#"], "a/b.c", "u", True),
        (["#"], "", "u", False),
        (["*"], "single", "u", True),  # QDR quirk fixed: '*' alone works
        (["*"], "two.tokens", "u", False),
        (["*"], "/single/", "u", True),
        (["public.*"], "public/x", "u", True),
        (["public.*"], "public.x.y", "u", False),
        (["a.b"], "/a/b/", "u", True),
        (["a.b"], "a.b.", "u", True),
        (["a.b"], "a.b..", "u", False),
        (["${user}.#"], "alice", "alice", True),
        (["${user}.#"], "alice.x.y", "alice", True),
        (["${user}.#"], "/alice/x", "alice", True),
        (["${user}.#"], "alicex.y", "alice", False),
        (["${user}.#"], "bob.x", "alice", False),
        (["${user}.*"], "alice.x", "alice", True),
        (["${user}.*"], "alice", "alice", False),
        (["${user}"], "alice", "alice", True),
        (["${user}"], "alice.x", "alice", False),
        (["#.${user}"], "x.y.alice", "alice", True),
        (["#.${user}"], "alice", "alice", True),
        (["#.${user}"], "x.alice.", "alice", True),
        (["#.${user}"], "xalice", "alice", False),
        (["q.${user}"], "q.alice", "alice", True),
        (["q.${user}"], "r.alice", "alice", False),
        (["/${user}/#"], "alice/x", "alice", True),  # leading separators ignored in patterns
        (["${user}.#"], "x", "", False),  # empty user never matches
        # QDR quirk fixed: a literal "queue.${user}" address does not pass for another user
        (["queue.${user}", "other"], "queue.${user}", "bob", False),
        (["queue.${user}", "other"], "queue.bob", "bob", True),
        # user names with wildcard or separator characters stay literal
        (["${user}.#"], "a.x", "a.b", False),
        (["${user}.#"], "a.b.x", "a.b", True),
        (["${user}.#"], "bob.x", "*", False),
        (["${user}.#"], "*.x", "*", True),
        (["${user}.#"], "anything", "#", False),
        (["#.${user}"], "x.bob", "*", False),
        (["#.${user}"], "x.b", "a/b", False),
        (["#.${user}"], "x.a/b", "a/b", True),
    ],
)
def test_pattern_mode(items: list[str], address: str, user: str, expected: bool) -> None:
    rules = AddressRules.from_patterns(items)
    assert rules.allows(address, user) is expected
    assert (rules.first_match(address, user) is not None) is expected


def test_first_match_is_in_file_order() -> None:
    rules = AddressRules.from_patterns(["#", "a.*", "${user}.#"])
    assert rules.first_match("a.b", "a") == "#"
    rules = AddressRules.from_list(["x*", "xy", "*"])
    assert rules.first_match("xy", "u") == "x*"
    assert rules.first_match("zz", "u") == "*"


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["${user}.${user}"], "item '${user}.${user}' contains multiple user subtitution tokens"),
        (["a.${user}.b"], "item 'a.${user}.b' may contain match pattern '${user}' as a prefix or "
                          "a suffix only."),
        (["x${user}"], "item 'x${user}' must use '${user}' as a whole token, separated by '.' or "
                       "'/' (QDR never matches a partial-token '${user}')"),
    ],
)
def test_pattern_compile_errors(items: list[str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        AddressRules.from_patterns(items)
    assert str(info.value) == message


def test_list_compile_error_and_embedded_allowed() -> None:
    with pytest.raises(ValueError, match="multiple user subtitution tokens"):
        AddressRules.from_list(["${user}-${user}"])
    assert AddressRules.from_list(["a.${user}.b"]).allows("a.u.b", "u")


def test_rules_are_immutable_deduplicated_and_comparable() -> None:
    rules = AddressRules.from_list([" a ", "b", "a", ""])
    assert rules.items == ("a", "b")
    assert not rules.is_empty() and AddressRules.deny_all().is_empty()
    assert rules == AddressRules.from_list(["a", "b"])
    assert rules != AddressRules.from_patterns(["a", "b"])
    assert hash(rules) == hash(AddressRules.from_list(["a", "b"]))
    assert repr(rules) == "AddressRules.from_list(['a', 'b'])"
    with pytest.raises(AttributeError):
        rules.foo = 1  # type: ignore[attr-defined]


# ----------------------------------------------------------------- properties

_NAME_CHARS = "ab*#./$"
_users = st.text(alphabet=_NAME_CHARS, min_size=1, max_size=6)
_tails = st.text(alphabet=_NAME_CHARS + "xy", max_size=6)
_SEPS = "./"


def _in_prefix_namespace(address: str, user: str) -> bool:
    for candidate in {address, address.lstrip(_SEPS)}:
        if candidate == user or any(candidate.startswith(user + s) for s in _SEPS):
            return True
    return False


def _in_suffix_namespace(address: str, user: str) -> bool:
    candidates = {address} | ({address[:-1]} if address[-1:] in (".", "/") else set())
    return any(c == user or any(c.endswith(s + user) for s in _SEPS) for c in candidates)


PREFIX_RULES = AddressRules.from_patterns(["${user}.#", "${user}/*", "${user}"])
SUFFIX_RULES = AddressRules.from_patterns(["#.${user}", "*/${user}"])
LIST_RULES = AddressRules.from_list(["queue.${user}", "tmp-${user}", "pre-${user}*"])


@settings(max_examples=300, deadline=None)
@given(user=_users, other=_users, sep=st.sampled_from(["", ".", "/"]), tail=_tails,
       lead=st.sampled_from(["", "queue.", "tmp-", "pre-", "/", "x."]))
def test_user_rules_never_reach_another_users_namespace(
    user: str, other: str, sep: str, tail: str, lead: str
) -> None:
    # Addresses built from another user's name (and arbitrary tails) are allowed only when
    # they literally lie in this user's own namespace, whatever '*#./$' the names contain.
    for address in (lead + other + sep + tail, tail + sep + other, lead + other):
        if not address:
            continue
        if PREFIX_RULES.allows(address, user):
            assert _in_prefix_namespace(address, user), (address, user)
        if SUFFIX_RULES.allows(address, user):
            assert _in_suffix_namespace(address, user), (address, user)
        if LIST_RULES.allows(address, user):
            assert address in (f"queue.{user}", f"tmp-{user}") or address.startswith(
                f"pre-{user}"), (address, user)


@settings(max_examples=200, deadline=None)
@given(user=_users, tail=st.text(alphabet="xy", min_size=1, max_size=4))
def test_own_namespace_is_allowed(user: str, tail: str) -> None:
    assert PREFIX_RULES.allows(f"{user}.{tail}", user)
    assert SUFFIX_RULES.allows(f"{tail}.{user}", user)
    assert LIST_RULES.allows(f"queue.{user}", user)
    assert LIST_RULES.allows(f"pre-{user}{tail}", user)
    assert not LIST_RULES.allows(f"tmp-{user}{tail}", user)


# ----------------------------------------------------------------- the decision memo

_MEMO_ITEMS = (["${user}.#", "audit.*.in", "tenant.*.orders.#", "a"],
               ["queue.${user}", "tmp-*", "exact"])
_SHARED = [AddressRules.from_patterns(_MEMO_ITEMS[0]), AddressRules.from_list(_MEMO_ITEMS[1])]


@settings(max_examples=300, deadline=None)
@given(address=st.text(alphabet="ab.*#/${}user-", max_size=12),
       user=st.sampled_from(["", "alice", "bob", "a", "${user}"]))
def test_remembered_decision_is_the_fresh_decision(address: str, user: str) -> None:
    fresh = [AddressRules.from_patterns(_MEMO_ITEMS[0]), AddressRules.from_list(_MEMO_ITEMS[1])]
    for shared, new in zip(_SHARED, fresh, strict=True):
        first = shared.allows(address, user)
        assert first == new.allows(address, user)
        assert shared.allows(address, user) == first  # now from the memo


def test_memo_is_per_user() -> None:
    rules = AddressRules.from_patterns(["${user}.#"])
    assert rules.allows("alice.x", "alice")
    assert not rules.allows("alice.x", "bob")
    assert rules.allows("alice.x", "alice")


def test_memo_is_bounded() -> None:
    from amqp_policy_proxy.policy import addresses

    rules = AddressRules.from_patterns(["q.*"])
    for i in range(addresses.MEMO_SIZE + 10):
        assert rules.allows(f"q.{i}", "u")
    assert len(rules._memo) <= addresses.MEMO_SIZE
    long = "q." + "x" * addresses.MEMO_MAX_ADDRESS
    before = len(rules._memo)
    assert rules.allows(long, "u") and len(rules._memo) == before
    assert rules == AddressRules.from_patterns(["q.*"])  # the memo is not part of equality
