"""Sans-IO. The vhost hostname pattern tree (``enableVhostNamePatterns``).

QDR's ``parse_tree.c`` of type ADDRESS: tokens separated by ``.`` or ``/``, ``*`` for one token,
``#`` for zero or more. Built once per policy by the compiler; :mod:`.lookup` searches it.
No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from amqp_policy_proxy.policy.addresses import (
    ANY_TOKENS,
    ONE_TOKEN,
    normalise_tokens,
    split_tokens,
)


class _Node:
    __slots__ = ("children", "star", "glob", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.glob: _Node | None = None
        self.value: str | None = None

    def child(self, token: str) -> _Node:
        if token == ONE_TOKEN:
            if self.star is None:
                self.star = _Node()
            return self.star
        if token == ANY_TOKENS:
            if self.glob is None:
                self.glob = _Node()
            return self.glob
        node = self.children.get(token)
        if node is None:
            node = self.children[token] = _Node()
        return node


class HostnamePatterns:
    """The vhost hostname pattern tree (QDR ``parse_tree.c``, type ADDRESS).

    Tokens are separated by ``.`` or ``/``; leading separators and one trailing separator are
    ignored; ``*`` matches one token and ``#`` zero or more. When several patterns match, the
    winner is found depth-first with exact tokens before ``*`` before ``#``.
    Built once by :meth:`build`; read-only afterwards.
    """

    __slots__ = ("_root", "_patterns")

    def __init__(self) -> None:
        """An empty tree; use :meth:`build`."""
        self._root = _Node()
        self._patterns: dict[tuple[str, ...], str] = {}

    @classmethod
    def build(cls, patterns: Iterable[str]) -> tuple[HostnamePatterns, list[tuple[str, str]]]:
        """Insert patterns in order.

        Args:
            patterns: vhost names and aliases, in load order.

        Returns:
            The tree and a list of ``(pattern, problem)`` for patterns that were not added:
            ``"empty"`` (no tokens: ``""`` cannot be a pattern) or the text of the earlier
            pattern it normalises to (QDR: "optimized pattern conflicts with existing pattern").
        """
        tree = cls()
        problems: list[tuple[str, str]] = []
        for pattern in patterns:
            tokens = normalise_tokens(split_tokens(pattern))
            if not tokens:
                problems.append((pattern, "empty"))
                continue
            existing = tree._patterns.get(tokens)
            if existing is not None:
                problems.append((pattern, existing))
                continue
            tree._patterns[tokens] = pattern
            node = tree._root
            for token in tokens:
                node = node.child(token)
            node.value = pattern
        return tree, problems

    def find(self, hostname: str) -> str | None:
        """The best pattern matching ``hostname``, as written in the policy, or None."""
        return _find(self._root, split_tokens(hostname), 0)

    def __len__(self) -> int:
        """Number of patterns in the tree."""
        return len(self._patterns)


def _find(node: _Node, tokens: tuple[str, ...], i: int) -> str | None:
    if i == len(tokens):
        if node.value is not None:
            return node.value
        return _find_glob(node.glob, tokens, i) if node.glob is not None else None
    child = node.children.get(tokens[i])
    if child is not None:
        found = _find(child, tokens, i + 1)
        if found is not None:
            return found
    if node.star is not None:
        found = _find(node.star, tokens, i + 1)
        if found is not None:
            return found
    if node.glob is not None:
        return _find_glob(node.glob, tokens, i)
    return None


def _find_glob(glob: _Node, tokens: tuple[str, ...], i: int) -> str | None:
    # '#' consumes zero tokens first, then one more at a time.
    for j in range(i, len(tokens) + 1):
        found = _find(glob, tokens, j)
        if found is not None:
            return found
    return None
