"""Sans-IO. Address rules: QDR ``sources``/``targets`` lists and ``sourcePattern``/``targetPattern``.

Compiled once per group at policy load, consulted on every Attach and on every anonymous-relay
message, so matching uses precompiled sets, tuples and plain string operations, no regex.

Rules (QDR's ``_qd_policy_approve_link_name`` and ``_qd_policy_approve_link_name_tree``), with
the fixes listed in docs/qdr-compatibility.md:

* An empty address never matches; an empty rule set denies everything; matching is
  case-sensitive.
* List mode (4.1): ``*`` alone allows every address; an item ending in ``*`` is a plain
  character-prefix match; otherwise exact. ``${user}`` may sit anywhere in an item.
  *Fixed QDR quirk:* the trailing-``*`` test looks at the item text **before** substitution, so a
  user called ``bob*`` never turns ``tmp-${user}`` into a prefix rule.
* Pattern mode (4.2): tokens split on ``.`` or ``/``, leading separators and one trailing
  separator ignored, ``*`` is one token, ``#`` zero or more. ``${user}`` must be the whole first
  or last token. *Fixed QDR quirks:* a pattern that is exactly ``*`` works (one-token wildcard),
  and a client that literally attaches to ``queue.${user}`` does not satisfy ``queue.${user}``
  for another user: ``${user}`` rules are matched on their own, never through a shared tree.
* The user name is substituted as a **literal string**: characters such as ``*``, ``#``, ``.``
  and ``/`` in a user name never act as wildcards or separators inside the rule.
* A ``${user}`` rule never matches when the user name is empty (QDR substituted ``""``).

No I/O, no clock, no imports outside the standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, cast

USER_TOKEN: Final = "${user}"
SEPARATORS: Final = "./"
"""Token separators of address patterns; ``.`` and ``/`` are interchangeable (QDR ADDRESS)."""
ONE_TOKEN: Final = "*"
ANY_TOKENS: Final = "#"

_SEP_TRANS: Final = str.maketrans("/", ".")

MEMO_SIZE: Final = 4096
"""Decisions remembered per rule set (``(user, address)`` pairs) before the memo starts over."""
MEMO_MAX_ADDRESS: Final = 512
"""Longer addresses (or user names) are matched every time, not remembered (bounds the memo)."""


def split_tokens(text: str) -> tuple[str, ...]:
    """Split an address or pattern into tokens the way QDR's parse tree does.

    Leading separators are skipped, one trailing separator is ignored, every other separator
    ends a token (so ``a..b`` has an empty middle token).

    Args:
        text: the address or pattern.

    Returns:
        The tokens; ``()`` for ``""`` or a string made only of separators.
    """
    body = text.lstrip(SEPARATORS)
    if not body:
        return ()
    if body[-1] in SEPARATORS:
        body = body[:-1]
    return tuple(body.translate(_SEP_TRANS).split("."))


def normalise_tokens(tokens: Iterable[str]) -> tuple[str, ...]:
    """Normalise a token pattern as QDR does on insertion: ``#.*`` -> ``*.#``, ``#.#`` -> ``#``.

    Args:
        tokens: pattern tokens from :func:`split_tokens`.

    Returns:
        The canonical token tuple; two patterns that match the same addresses in the same way
        normalise to the same tuple.
    """
    out: list[str] = []
    pending_globs = False
    for tok in tokens:
        if tok == ANY_TOKENS:
            pending_globs = True
        elif tok == ONE_TOKEN:
            out.append(tok)  # a '*' after '#' moves before it
        else:
            if pending_globs:
                out.append(ANY_TOKENS)
                pending_globs = False
            out.append(tok)
    if pending_globs:
        out.append(ANY_TOKENS)
    return tuple(out)


def match_tokens(pattern: tuple[str, ...], tokens: tuple[str, ...]) -> bool:
    """True when ``tokens`` match ``pattern`` (``*`` one token, ``#`` zero or more).

    Linear-time greedy matching with backtracking to the last ``#`` (``*`` behaves like a
    glob's ``?`` and ``#`` like a glob's ``*``, over tokens instead of characters).

    Args:
        pattern: normalised pattern tokens.
        tokens: the address tokens; ``*`` and ``#`` in an address are literal.

    Returns:
        Whether the whole token sequence matches.
    """
    np_, nt = len(pattern), len(tokens)
    pi = ti = 0
    glob_pi = -1
    glob_ti = 0
    while ti < nt:
        if pi < np_:
            p = pattern[pi]
            if p == ANY_TOKENS:
                glob_pi, glob_ti = pi, ti
                pi += 1
                continue
            if p == ONE_TOKEN or p == tokens[ti]:
                pi += 1
                ti += 1
                continue
        if glob_pi < 0:
            return False
        glob_ti += 1
        pi, ti = glob_pi + 1, glob_ti
    while pi < np_ and pattern[pi] == ANY_TOKENS:
        pi += 1
    return pi == np_


def multiple_token_message(item: str) -> str | None:
    """QDR's complaint when an item holds ``${user}`` more than once (QDR's ``PolicyCompiler``).

    Returns:
        The tail of QDR's message (``"item 'X' contains multiple user subtitution tokens"``,
        spelling as in QDR), or None when the item is fine.
    """
    if item.count(USER_TOKEN) > 1:
        return f"item '{item}' contains multiple user subtitution tokens"
    return None


def pattern_item_message(item: str) -> str | None:
    """Why a ``sourcePattern``/``targetPattern`` item is invalid, or None when it is valid.

    ``${user}`` must occur at most once and be the whole first or last token (pattern mode;
    QDR only enforced "string prefix or suffix" and silently never matched partial tokens).

    Args:
        item: one pattern item, trimmed.

    Returns:
        A message tail in QDR's wording (``"item 'X' may contain match pattern '${user}' as a
        prefix or a suffix only."``) or ours for a partial token, or None.
    """
    multiple = multiple_token_message(item)
    if multiple:
        return multiple
    if USER_TOKEN not in item:
        return None
    body = _pattern_body(item)
    if not (body.startswith(USER_TOKEN) or body.endswith(USER_TOKEN)):
        return f"item '{item}' may contain match pattern '{USER_TOKEN}' as a prefix or a suffix only."
    tokens = body.translate(_SEP_TRANS).split(".")
    if tokens[0] != USER_TOKEN and tokens[-1] != USER_TOKEN:
        return (f"item '{item}' must use '{USER_TOKEN}' as a whole token, separated by '.' or '/' "
                "(QDR never matches a partial-token '${user}')")
    return None


def _pattern_body(item: str) -> str:
    body = item.lstrip(SEPARATORS)
    if body and body[-1] in SEPARATORS:
        body = body[:-1]
    return body


def _without_leading_separators(address: str) -> tuple[str, ...]:
    stripped = address.lstrip(SEPARATORS)
    return (address,) if stripped == address else (address, stripped)


def _without_trailing_separator(address: str) -> tuple[str, ...]:
    return (address, address[:-1]) if address[-1] in SEPARATORS else (address,)


class AddressRules:
    """An immutable, precompiled set of address items in list mode or pattern mode.

    Build with :meth:`from_list` (``sources``/``targets``) or :meth:`from_patterns`
    (``sourcePattern``/``targetPattern``); :meth:`deny_all` is the empty rule set.
    """

    __slots__ = (
        "_items", "_pattern_mode", "_allow_all", "_exact", "_prefixes", "_list_user",
        "_exact_tokens", "_wild", "_user_prefix", "_user_suffix", "_entries", "_memo",
    )

    _items: tuple[str, ...]
    _pattern_mode: bool
    _allow_all: bool
    _exact: frozenset[str]
    _prefixes: tuple[str, ...]
    _list_user: tuple[tuple[str, str, bool], ...]
    _exact_tokens: frozenset[tuple[str, ...]]
    _wild: tuple[tuple[str, ...], ...]
    _user_prefix: tuple[tuple[str, ...], ...]
    _user_suffix: tuple[tuple[str, ...], ...]
    _entries: tuple[tuple[str, str, object], ...]
    _memo: dict[tuple[str, str], bool]

    def __init__(self) -> None:
        """Create the empty rule set (denies everything); use the class methods instead."""
        self._set("_items", ())
        self._set("_pattern_mode", False)
        self._set("_allow_all", False)
        self._set("_exact", frozenset())
        self._set("_prefixes", ())
        self._set("_list_user", ())
        self._set("_exact_tokens", frozenset())
        self._set("_wild", ())
        self._set("_user_prefix", ())
        self._set("_user_suffix", ())
        self._set("_entries", ())
        # (user, address) -> decision. A cache, not state: the rules never change, so a
        # remembered decision is the decision. It makes the per-message check of an
        # anonymous-relay sender (one ``to`` after another, usually the same few) a dict
        # lookup instead of tokenising and matching every time.
        self._set("_memo", {})

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        """Refuse mutation: rules are shared by every connection admitted under a policy."""
        raise AttributeError(f"{type(self).__name__} is immutable")

    # ------------------------------------------------------------------ construction

    @classmethod
    def deny_all(cls) -> AddressRules:
        """The empty rule set: every address is denied (QDR: missing or empty list)."""
        return cls()

    @classmethod
    def from_list(cls, items: Iterable[str]) -> AddressRules:
        """Compile ``sources``/``targets`` items (list mode, QDR ``_qd_policy_approve_link_name``).

        Items are trimmed of spaces; empty items are dropped; duplicates are dropped keeping
        the first (QDR lost the order through a ``set``; order only matters for
        :meth:`first_match`).

        Args:
            items: the list items, e.g. ``["public", "tmp-*", "queue.${user}"]``.

        Returns:
            The compiled rules.

        Raises:
            ValueError: an item contains ``${user}`` more than once (QDR's message).
        """
        rules = cls()
        texts = _dedupe(items)
        exact: set[str] = set()
        prefixes: list[str] = []
        list_user: list[tuple[str, str, bool]] = []
        entries: list[tuple[str, str, object]] = []
        allow_all = False
        for item in texts:
            problem = multiple_token_message(item)
            if problem:
                raise ValueError(problem)
            if USER_TOKEN in item:
                pre, post = item.split(USER_TOKEN)
                # The trailing '*' is judged on the item text, before substitution.
                is_prefix = item.endswith("*") and not item.endswith(USER_TOKEN)
                if is_prefix:
                    post = post[:-1]
                rule = (pre, post, is_prefix)
                list_user.append(rule)
                entries.append((item, "user", rule))
            elif item == "*":
                allow_all = True
                entries.append((item, "all", None))
            elif item.endswith("*"):
                prefixes.append(item[:-1])
                entries.append((item, "prefix", item[:-1]))
            else:
                exact.add(item)
                entries.append((item, "exact", item))
        rules._set("_items", texts)
        rules._set("_allow_all", allow_all)
        rules._set("_exact", frozenset(exact))
        rules._set("_prefixes", tuple(prefixes))
        rules._set("_list_user", tuple(list_user))
        rules._set("_entries", tuple(entries))
        return rules

    @classmethod
    def from_patterns(cls, items: Iterable[str]) -> AddressRules:
        """Compile ``sourcePattern``/``targetPattern`` items (QDR ``_qd_policy_approve_link_name_tree``).

        Args:
            items: pattern items, e.g. ``["#"]``, ``["${user}.#", "public.*"]``.

        Returns:
            The compiled rules (pattern mode).

        Raises:
            ValueError: an item uses ``${user}`` more than once, or not as the whole first or
                last token; the message is QDR's where QDR has one.
        """
        rules = cls()
        texts = _dedupe(items)
        exact: set[tuple[str, ...]] = set()
        wild: list[tuple[str, ...]] = []
        user_prefix: list[tuple[str, ...]] = []
        user_suffix: list[tuple[str, ...]] = []
        entries: list[tuple[str, str, object]] = []
        for item in texts:
            problem = pattern_item_message(item)
            if problem:
                raise ValueError(problem)
            if USER_TOKEN in item:
                raw = _pattern_body(item).translate(_SEP_TRANS).split(".")
                if raw[0] == USER_TOKEN:
                    rest = normalise_tokens(raw[1:])
                    user_prefix.append(rest)
                    entries.append((item, "user_prefix", rest))
                else:
                    pre = normalise_tokens(raw[:-1])
                    user_suffix.append(pre)
                    entries.append((item, "user_suffix", pre))
                continue
            tokens = normalise_tokens(split_tokens(item))
            if ONE_TOKEN in tokens or ANY_TOKENS in tokens:
                wild.append(tokens)
                entries.append((item, "wild", tokens))
            else:
                exact.add(tokens)
                entries.append((item, "exact", tokens))
        rules._set("_items", texts)
        rules._set("_pattern_mode", True)
        rules._set("_exact_tokens", frozenset(exact))
        rules._set("_wild", tuple(wild))
        rules._set("_user_prefix", tuple(user_prefix))
        rules._set("_user_suffix", tuple(user_suffix))
        rules._set("_entries", tuple(entries))
        return rules

    # ------------------------------------------------------------------ queries

    @property
    def items(self) -> tuple[str, ...]:
        """The configured items, trimmed and de-duplicated, in file order."""
        return self._items

    @property
    def pattern_mode(self) -> bool:
        """True for ``sourcePattern``/``targetPattern`` rules, False for list rules."""
        return self._pattern_mode

    def is_empty(self) -> bool:
        """True when there are no items, i.e. every address is denied."""
        return not self._items

    def allows(self, address: str, user: str) -> bool:
        """Whether ``user`` may use ``address`` under these rules.

        Decisions are remembered per ``(user, address)`` (at most :data:`MEMO_SIZE` of them
        per rule set, addresses and users up to :data:`MEMO_MAX_ADDRESS` characters), since the rules
        are immutable and an anonymous-relay sender asks again for every message.

        Args:
            address: the terminus address or message ``to``, raw (no ``amqp://`` stripping).
            user: the authenticated user name substituted for ``${user}``.

        Returns:
            True when some item matches; always False for an empty address.
        """
        if not address:
            return False
        if self._allow_all:
            return True
        key = (user, address)
        known = self._memo.get(key)
        if known is not None:
            return known
        if self._pattern_mode:
            result = self._allows_pattern(address, user)
        else:
            result = self._allows_list(address, user)
        if len(address) <= MEMO_MAX_ADDRESS and len(user) <= MEMO_MAX_ADDRESS:
            memo = self._memo
            if len(memo) >= MEMO_SIZE:
                memo.clear()  # start over: churn costs speed, never memory or correctness
            memo[key] = result
        return result

    def allows_literal(self, address: str, user: str) -> bool:
        """Whether an item names ``address`` literally: equal to it after ``${user}``
        substitution, with no wildcard (``*``, ``#``) in the item.

        Router-internal addresses (``$management``, ``_topo/...``; :mod:`.naming`) are allowed
        only this way, never through ``*``, a prefix or a pattern.

        Args:
            address: the resolved node name.
            user: the authenticated user name substituted for ``${user}``.
        """
        if not address:
            return False
        for item in self._items:
            if "*" in item or "#" in item:
                continue
            if USER_TOKEN in item:
                if not user:
                    continue
                item = item.replace(USER_TOKEN, user)
            if item == address:
                return True
        return False

    def wildcard_items(self) -> tuple[str, ...]:
        """The items that match more than one address (``*``, prefixes, patterns with ``*``
        or ``#``), for ``check``'s warnings about router-internal addresses."""
        return tuple(i for i in self._items if "*" in i or "#" in i)

    def _allows_list(self, address: str, user: str) -> bool:
        if address in self._exact:
            return True
        if self._prefixes and address.startswith(self._prefixes):
            return True
        if user:
            for pre, post, is_prefix in self._list_user:
                if _list_user_matches(pre, post, is_prefix, address, user):
                    return True
        return False

    def first_match(self, address: str, user: str) -> str | None:
        """The first item, in file order, that allows ``address`` (for ``explain``).

        Args:
            address: as for :meth:`allows`.
            user: as for :meth:`allows`.

        Returns:
            The item text, or None when :meth:`allows` would return False.
        """
        if not address:
            return None
        tokens = split_tokens(address) if self._pattern_mode else ()
        for item, kind, data in self._entries:
            if _entry_matches(kind, data, address, tokens, user):
                return item
        return None

    def _allows_pattern(self, address: str, user: str) -> bool:
        if self._exact_tokens or self._wild:
            tokens = split_tokens(address)
            if tokens in self._exact_tokens:
                return True
            for pattern in self._wild:
                if match_tokens(pattern, tokens):
                    return True
        if user:
            for rest in self._user_prefix:
                if _user_prefix_matches(rest, address, user):
                    return True
            for pre in self._user_suffix:
                if _user_suffix_matches(pre, address, user):
                    return True
        return False

    def __eq__(self, other: object) -> bool:
        """Rules are equal when mode and items are equal."""
        if not isinstance(other, AddressRules):
            return NotImplemented
        return self._pattern_mode == other._pattern_mode and self._items == other._items

    def __hash__(self) -> int:
        """Hash of mode and items."""
        return hash((self._pattern_mode, self._items))

    def __repr__(self) -> str:
        """``AddressRules.from_list(['a', 'b'])`` style."""
        maker = "from_patterns" if self._pattern_mode else "from_list"
        return f"AddressRules.{maker}({list(self._items)!r})"


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for raw in items:
        item = raw.strip(" ")
        if item:
            seen.setdefault(item, None)
    return tuple(seen)


def _list_user_matches(pre: str, post: str, is_prefix: bool, address: str, user: str) -> bool:
    built = pre + user + post
    return address.startswith(built) if is_prefix else address == built


def _user_prefix_matches(rest: tuple[str, ...], address: str, user: str) -> bool:
    # The address must begin with the literal user name followed by a separator or the end;
    # what follows is matched against the rest of the pattern.
    for candidate in _without_leading_separators(address):
        if candidate.startswith(user):
            tail = candidate[len(user):]
            if not tail or tail[0] in SEPARATORS:
                if match_tokens(rest, split_tokens("x" + tail)[1:]):
                    return True
    return False


def _user_suffix_matches(pre: tuple[str, ...], address: str, user: str) -> bool:
    # The address must end with the literal user name preceded by a separator (or be it).
    for candidate in _without_trailing_separator(address):
        if candidate.endswith(user):
            head = candidate[: len(candidate) - len(user)]
            if not head or head[-1] in SEPARATORS:
                if match_tokens(pre, split_tokens(head + "x")[:-1]):
                    return True
    return False


def _entry_matches(
    kind: str, data: object, address: str, tokens: tuple[str, ...], user: str
) -> bool:
    if kind == "all":
        return True
    if kind == "exact":
        return (tokens == data) if isinstance(data, tuple) else (address == data)
    # each kind's data is what the rules' builders put beside it (str, token tuple, or the
    # (pre, post, is_prefix) of a list user pattern)
    if kind == "prefix":
        return address.startswith(cast(str, data))
    if kind == "wild":
        return match_tokens(cast("tuple[str, ...]", data), tokens)
    if not user:
        return False
    if kind == "user":
        pre, post, is_prefix = cast("tuple[str, str, bool]", data)
        return _list_user_matches(pre, post, is_prefix, address, user)
    if kind == "user_prefix":
        return _user_prefix_matches(cast("tuple[str, ...]", data), address, user)
    return _user_suffix_matches(cast("tuple[str, ...]", data), address, user)
