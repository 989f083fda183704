"""Sans-IO. Principal lists of topic ACLs (docs/topic-authorization.md).

An entry is a user name, ``@group`` (a policy group of the vhost), or ``*`` (everyone); a
leading ``!`` makes it a negative entry. Evaluation: any matching negative entry means "not
granted"; otherwise any matching positive entry grants; otherwise not granted. So ``["*",
"!nat"]`` grants everyone except ``nat``, and the order of entries does not matter.

``@group`` matches a connection whose policy group is that group, and also a user listed by
name in that group's ``users``. A listed user always gets that group (QDR ``lookup_user``), so the
second test only matters for a principal built by hand (``explain``, tests) and costs nothing.

No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from amqp_policy_proxy.policy.topics.outcomes import Principal

EVERYONE: Final = "*"
NOT: Final = "!"
GROUP_PREFIX: Final = "@"


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    """As written, e.g. ``!@HR``."""
    negative: bool
    everyone: bool
    group: str | None
    members: frozenset[str]
    """Users listed by name in ``group``'s ``users`` (without ``*``)."""
    user: str | None

    def matches(self, principal: Principal) -> bool:
        if self.everyone:
            return True
        if self.group is not None:
            return principal.group == self.group or principal.user in self.members
        return principal.user == self.user


@dataclass(frozen=True, slots=True)
class PrincipalList:
    """A compiled principal list; immutable.

    Build it with :meth:`compile` from entries already validated by
    :func:`amqp_policy_proxy.policy.topics.config.principal_problem`.
    """

    entries: tuple[_Entry, ...]
    negatives: tuple[_Entry, ...]
    positives: tuple[_Entry, ...]

    @classmethod
    def compile(cls, items: Iterable[str], members: Mapping[str, frozenset[str]]
                ) -> PrincipalList:
        """Compile entries.

        Args:
            items: entries such as ``joe``, ``@HR``, ``*``, ``!nat``.
            members: group name -> users listed by name in that group (for ``@group``);
                a group missing from the mapping has no listed users.

        Returns:
            The compiled list.
        """
        entries: list[_Entry] = []
        for text in items:
            negative = text.startswith(NOT)
            body = text[1:] if negative else text
            group = body[1:] if body.startswith(GROUP_PREFIX) else None
            entries.append(_Entry(
                text=text, negative=negative, everyone=body == EVERYONE, group=group,
                members=members.get(group, frozenset()) if group is not None else frozenset(),
                user=None if group is not None or body == EVERYONE else body,
            ))
        return cls(
            entries=tuple(entries),
            negatives=tuple(e for e in entries if e.negative),
            positives=tuple(e for e in entries if not e.negative),
        )

    @property
    def texts(self) -> tuple[str, ...]:
        """The entries as written."""
        return tuple(e.text for e in self.entries)

    def evaluate(self, principal: Principal) -> tuple[bool, str | None]:
        """Whether the list grants ``principal``, and the entry that decided.

        Returns:
            ``(True, entry)`` when a positive entry matches and no negative one does;
            ``(False, entry)`` when a negative entry matches (the first one written);
            ``(False, None)`` when nothing matches.
        """
        for entry in self.negatives:
            if entry.matches(principal):
                return False, entry.text
        for entry in self.positives:
            if entry.matches(principal):
                return True, entry.text
        return False, None

    def grants(self, principal: Principal) -> bool:
        """True when the list grants ``principal`` (see :meth:`evaluate`)."""
        for entry in self.negatives:
            if entry.matches(principal):
                return False
        for entry in self.positives:
            if entry.matches(principal):
                return True
        return False
