"""Sans-IO. The ban list: users and client addresses refused at the Open until their ban
expires or is lifted (docs/operations.md, "Bans").

A ban is an operator's decision (``amqp-policy-proxy ban``) or a quarantine's
(:mod:`.quarantine`, the vhost key ``quarantine``), not a policy decision: it applies in every
vhost, whatever the policy says (also with ``enableVhostPolicy`` false), and is never shadowed.
A user ban names the user as the upstream records it (the daemon canonicalises the operator's
text with :meth:`~amqp_policy_proxy.policy.naming.Naming.identity`, so ``" alice"`` bans
``alice``); a host ban names an address or a CIDR network
(:func:`~amqp_policy_proxy.ingress.networks.canonical_network`).

Times are the caller's clock (the daemon's loop clock), passed in as ``now``: an expired ban
refuses nobody even before :meth:`BanList.expire` removes it. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..ingress.networks import NetworkSet, canonical_network

__all__ = ["HOST", "KINDS", "OPERATOR", "QUARANTINE", "USER", "Ban", "BanList"]

USER: Final = "user"
HOST: Final = "host"
KINDS: Final = (USER, HOST)
"""What a ban names: a user or a client address (network)."""
OPERATOR: Final = "operator"
QUARANTINE: Final = "quarantine"
"""Who made a ban (:attr:`Ban.source`)."""


@dataclass(frozen=True, slots=True)
class Ban:
    """One ban.

    Attributes:
        kind: :data:`USER` or :data:`HOST`.
        value: the canonical user name, or the canonical address or network.
        reason: the operator's words, or the quarantine's (shown in ``bans list``, the audit
            trail and the Close of the connections it ends).
        created_at: when it was made (the caller's clock, seconds).
        expires_at: when it ends (same clock), or None: until it is lifted.
        source: :data:`OPERATOR` or :data:`QUARANTINE`.
        by: who made it: the admin client (``uid 0 pid 42``) or ``quarantine of vhost V``.
    """

    kind: str
    value: str
    reason: str
    created_at: float
    expires_at: float | None = None
    source: str = OPERATOR
    by: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, value)``: what the ban is stored, listed and lifted under."""
        return (self.kind, self.value)

    def active(self, now: float) -> bool:
        """Whether the ban refuses connections at ``now``."""
        return self.expires_at is None or now < self.expires_at

    def rule(self) -> str:
        """The audit trail's rule text of an Open this ban refused."""
        who = f"user '{self.value}'" if self.kind == USER else f"host {self.value}"
        by = "an operator" if self.source == OPERATOR else "quarantine"
        return f"{who} banned by {by}: {self.reason}"


class BanList:
    """The bans in force in one process (see the module docstring)."""

    __slots__ = ("_users", "_hosts", "_networks")

    def __init__(self) -> None:
        """No ban."""
        self._users: dict[str, Ban] = {}
        self._hosts: dict[str, Ban] = {}
        self._networks = NetworkSet()

    def __len__(self) -> int:
        """Bans held (expired ones not removed yet included)."""
        return len(self._users) + len(self._hosts)

    @staticmethod
    def canonical(kind: str, value: str) -> str:
        """The canonical value of a host ban (a user's is the caller's, see the module).

        Raises:
            ValueError: an unknown kind, or not an address or network.
        """
        if kind == HOST:
            return canonical_network(value)
        if kind == USER:
            return value
        raise ValueError(f"unknown ban kind {kind!r} (user or host)")

    def add(self, ban: Ban) -> Ban | None:
        """Put ``ban`` in force, replacing one of the same key.

        Returns:
            The ban it replaced, or None.

        Raises:
            ValueError: a host ban whose value is not canonical, or an unknown kind.
        """
        if ban.kind == HOST:
            if canonical_network(ban.value) != ban.value:
                raise ValueError(f"'{ban.value}' is not a canonical address or network")
            previous = self._hosts.get(ban.value)
            self._hosts[ban.value] = ban
            self._networks.add(ban.value)
            return previous
        if ban.kind != USER:
            raise ValueError(f"unknown ban kind {ban.kind!r} (user or host)")
        previous = self._users.get(ban.value)
        self._users[ban.value] = ban
        return previous

    def remove(self, kind: str, value: str) -> Ban | None:
        """Lift the ban of ``(kind, value)`` (canonical value).

        Returns:
            The ban lifted, or None when there was none.
        """
        if kind == HOST:
            ban = self._hosts.pop(value, None)
            if ban is not None:
                self._networks.discard(value)
            return ban
        return self._users.pop(value, None)

    def get(self, kind: str, value: str) -> Ban | None:
        """The ban held under ``(kind, value)``, expired or not."""
        return (self._hosts if kind == HOST else self._users).get(value)

    def match(self, user: str | None, remote_host: str, now: float) -> Ban | None:
        """The ban in force at ``now`` that refuses ``user`` connecting from ``remote_host``:
        the user's ban first, then the host's own, then the first network containing it.

        Args:
            user: the authenticated (canonical) user name, or None before one is known.
            remote_host: the client's address (normalised here).
            now: the caller's clock.
        """
        if user is not None and self._users:
            ban = self._users.get(user)
            if ban is not None and ban.active(now):
                return ban
        if self._hosts:
            for name in self._networks.matches(remote_host):
                ban = self._hosts[name]
                if ban.active(now):
                    return ban
        return None

    def banned(self, user: str | None, remote_host: str, now: float) -> str | None:
        """The admission's question (``core.admission.AdmissionBans``): the rule text of the
        ban that refuses this Open, or None."""
        if not self._users and not self._hosts:
            return None
        ban = self.match(user, remote_host, now)
        return None if ban is None else ban.rule()

    def expire(self, now: float) -> list[Ban]:
        """Remove the bans expired at ``now``; they are returned (oldest expiry first)."""
        gone = [b for b in (*self._users.values(), *self._hosts.values())
                if not b.active(now)]
        for ban in gone:
            self.remove(ban.kind, ban.value)
        return sorted(gone, key=lambda b: b.expires_at or 0.0)

    def next_expiry(self) -> float | None:
        """When the next ban expires, or None (no ban with an expiry)."""
        times = [b.expires_at for b in (*self._users.values(), *self._hosts.values())
                 if b.expires_at is not None]
        return min(times) if times else None

    def active(self, now: float) -> list[Ban]:
        """The bans in force at ``now``: users first, then hosts, each by value."""
        return sorted((b for b in (*self._users.values(), *self._hosts.values())
                       if b.active(now)), key=lambda b: (b.kind != USER, b.value))

    def counts(self, now: float) -> dict[str, int]:
        """Bans in force at ``now`` per kind (``amqp_proxy_bans_active{kind}``)."""
        out = dict.fromkeys(KINDS, 0)
        for ban in self.active(now):
            out[ban.kind] += 1
        return out
