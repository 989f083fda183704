"""Sans-IO. The vhost topic tree (``topicTree``): IBM MQ and WebSphere Message Broker models.

Addresses are topics split on the tree's separator (:class:`~.filters.TopicSyntax`).
Administrative nodes carry principal lists per authority (``publish``, ``subscribe``,
``persistent``). A check walks from the address's node up to the root ``""``; a node that
does not exist is not an error: the walk starts at the nearest existing ancestor.

* ``anyAncestor`` (IBM MQ topic security): granted when **any** node on the path grants the
  authority. A node's negative entries (``!name``) only stop that node from granting: IBM MQ
  authorities are cumulative and an ancestor's grant still applies. A subscription with
  wildcards is checked at the node of its fully qualified prefix (the tokens before the first
  wildcard: ``SEC/COMB/*/GOOD`` at ``SEC/COMB``). ``persistent`` is not an authority here.
* ``nearestAcl`` (WebSphere Message Broker topic ACLs): per authority, the **nearest** node on
  the path that defines that authority decides, allowing or denying. The root always defines
  all three authorities (everyone ``["*"]`` unless ``nodes[""]`` changes it). A wildcard
  subscription is accepted and every delivery is checked against the message's concrete
  address (:meth:`TopicTree.check_delivery`); a principal without ``persistent`` receives
  durable messages as non-durable.

Addresses under a ``systemPrefixes`` item (whole tokens: ``$SYS`` covers ``$SYS`` and
``$SYS/x``, not ``$SYSTEM``) are exempt from the tree in both models.

No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from amqp_policy_proxy.policy.topics.filters import (
    MANY,
    ONE,
    TopicSyntax,
    fixed_prefix,
    has_wildcard,
)
from amqp_policy_proxy.policy.topics.outcomes import (
    PERSISTENT,
    PUBLISH,
    SUBSCRIBE,
    Principal,
)
from amqp_policy_proxy.policy.topics.principals import PrincipalList

ANY_ANCESTOR: Final = "anyAncestor"
NEAREST_ACL: Final = "nearestAcl"
MODELS: Final = (ANY_ANCESTOR, NEAREST_ACL)
AUTHORITIES_BY_MODEL: Final = {
    ANY_ANCESTOR: (PUBLISH, SUBSCRIBE),
    NEAREST_ACL: (PUBLISH, SUBSCRIBE, PERSISTENT),
}
MODEL_NAME: Final = "topicTree"


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One administrative node."""

    name: str
    """As written in ``nodes`` (``""`` for the root)."""
    acls: Mapping[str, PrincipalList]
    """Authority -> principal list, only for the authorities this node defines."""

    @property
    def label(self) -> str:
        """The node as shown in decisions: ``'A/B'`` or ``'' (root)``."""
        return f"'{self.name}'" if self.name else "'' (root)"


@dataclass(frozen=True, slots=True)
class TreeVerdict:
    """The tree's part of a decision."""

    allowed: bool
    text: str
    per_delivery: bool = False
    strip_durable: bool = False


def _via(principal: Principal, entry: str | None) -> str:
    return "" if entry is None or entry == principal.user else f" via '{entry}'"


class TopicTree:
    """A compiled ``topicTree``; immutable, safe to share between threads and groups."""

    __slots__ = ("model", "syntax", "nodes", "system_prefixes")

    def __init__(self, *, model: str, syntax: TopicSyntax,
                 nodes: Mapping[tuple[str, ...], TreeNode],
                 system_prefixes: tuple[tuple[str, ...], ...] = ()) -> None:
        """Build a tree from compiled nodes (see :mod:`.config` for validation).

        Args:
            model: ``"anyAncestor"`` or ``"nearestAcl"``.
            syntax: separator and wildcard syntax.
            nodes: node tokens -> node. For ``nearestAcl`` the root ``()`` must define
                ``publish``, ``subscribe`` and ``persistent``.
            system_prefixes: token prefixes exempt from the tree.

        Raises:
            ValueError: unknown model, or a ``nearestAcl`` root that does not define every
                authority.
        """
        if model not in MODELS:
            raise ValueError(f"unknown topicTree model {model!r}")
        if model == NEAREST_ACL:
            root = nodes.get(())
            if root is None or any(a not in root.acls for a in AUTHORITIES_BY_MODEL[model]):
                raise ValueError("a nearestAcl root must define publish, subscribe and persistent")
        self.model = model
        self.syntax = syntax
        self.nodes = nodes
        self.system_prefixes = system_prefixes

    @property
    def title(self) -> str:
        """``topicTree(anyAncestor)`` or ``topicTree(nearestAcl)``."""
        return f"{MODEL_NAME}({self.model})"

    # ------------------------------------------------------------------ public checks

    def check_publish(self, principal: Principal, address: str) -> TreeVerdict:
        """Decide publishing to ``address`` (a sender target or a relay ``to``)."""
        tokens = self.syntax.split(address)
        exempt = self._exempt(address, tokens)
        if exempt is not None:
            return exempt
        return self._check(principal, PUBLISH, tokens, address)

    def check_subscribe(self, principal: Principal, address: str) -> TreeVerdict:
        """Decide subscribing to ``address`` (a receiver source, possibly with wildcards).

        ``anyAncestor``: a wildcard subscription is checked at its fully qualified prefix.
        ``nearestAcl``: a wildcard subscription is accepted with ``per_delivery``; otherwise
        ``subscribe`` decides and ``persistent`` sets ``strip_durable``.
        """
        pattern = self.syntax.subscription(address)
        wild = has_wildcard(pattern)
        tokens = fixed_prefix(pattern)
        exempt = self._exempt(address, tokens)
        if exempt is not None:
            return exempt
        if self.model == ANY_ANCESTOR:
            if not wild:
                return self._check(principal, SUBSCRIBE, tokens, address)
            lead = (f"subscription '{address}' is checked at its fully qualified prefix "
                    f"'{self.syntax.join(tokens)}': ")
            verdict = self._check(principal, SUBSCRIBE, tokens, self.syntax.join(tokens))
            return TreeVerdict(verdict.allowed, lead + verdict.text)
        if wild:
            return TreeVerdict(True, f"{self.title}: wildcard subscription '{address}' is "
                                     "accepted; each delivery is checked against the message's "
                                     "address", per_delivery=True)
        return self._delivery(principal, tokens, address)

    def check_delivery(self, principal: Principal, address: str) -> TreeVerdict:
        """Decide one delivery of a message whose concrete address is ``address``.

        ``nearestAcl``: the nearest ``subscribe`` definition decides visibility and the nearest
        ``persistent`` definition decides ``strip_durable``. ``anyAncestor`` has no per-delivery
        check (visible, durable kept).
        """
        tokens = self.syntax.split(address)
        exempt = self._exempt(address, tokens)
        if exempt is not None:
            return exempt
        if self.model == ANY_ANCESTOR:
            return TreeVerdict(True, f"{self.title} has no per-delivery check")
        return self._delivery(principal, tokens, address)

    def check_unknown_delivery(self, principal: Principal, subscription: str) -> TreeVerdict:
        """Decide a delivery on ``subscription`` whose concrete address is unknown.

        A broker that does not set ``to`` on the copies it delivers to a wildcard subscriber
        (RabbitMQ 3.10 on ``/topic/`` addresses) leaves the proxy unable to tell which topic a
        message was published to. It is visible only if the subscriber could see *every*
        topic the subscription can match: for ``nearestAcl``, the nearest node defining
        ``subscribe`` at or above the subscription's fixed prefix, and every node below that
        prefix on a path the subscription can match, grant ``subscribe``. ``strip_durable`` is
        set when any of those nodes' nearest ``persistent`` definition does not grant it.
        ``anyAncestor`` has no per-delivery check.
        """
        pattern = self.syntax.subscription(subscription)
        prefix = fixed_prefix(pattern)
        exempt = self._exempt(subscription, prefix)
        if exempt is not None:
            return exempt
        if self.model == ANY_ANCESTOR:
            return TreeVerdict(True, f"{self.title} has no per-delivery check")
        regions = [prefix] + sorted(
            tokens for tokens in self.nodes
            if len(tokens) > len(prefix) and tokens[:len(prefix)] == prefix
            and _may_lead_to_match(pattern, tokens))
        strip = False
        for tokens in regions:
            sub = self._nearest(principal, SUBSCRIBE, tokens)
            if not sub.allowed:
                return TreeVerdict(False, f"{self.title}: a delivery on '{subscription}' "
                                          f"without a 'to' may come from "
                                          f"'{self.syntax.join(tokens)}': {sub.text}")
            strip = strip or not self._nearest(principal, PERSISTENT, tokens).allowed
        text = (f"{self.title}: {principal.user} may see every topic '{subscription}' "
                f"matches")
        return TreeVerdict(True, text, strip_durable=strip)

    # ------------------------------------------------------------------ walks

    def path(self, tokens: tuple[str, ...]) -> list[TreeNode]:
        """The existing nodes from the address's node (or nearest ancestor) up to the root."""
        nodes = self.nodes
        out: list[TreeNode] = []
        for i in range(len(tokens), -1, -1):
            node = nodes.get(tokens[:i])
            if node is not None:
                out.append(node)
        return out

    def _exempt(self, address: str, tokens: tuple[str, ...]) -> TreeVerdict | None:
        for prefix in self.system_prefixes:
            if tokens[:len(prefix)] == prefix:
                return TreeVerdict(True, f"{self.title}: '{address}' is under system prefix "
                                         f"'{self.syntax.join(prefix)}' (exempt from topic checks)")
        return None

    def _check(self, principal: Principal, authority: str, tokens: tuple[str, ...],
               shown: str) -> TreeVerdict:
        if self.model == ANY_ANCESTOR:
            return self._any_ancestor(principal, authority, tokens, shown)
        return self._nearest(principal, authority, tokens)

    def _any_ancestor(self, principal: Principal, authority: str, tokens: tuple[str, ...],
                      shown: str) -> TreeVerdict:
        user = principal.user
        defining: list[str] = []
        excluded: list[str] = []
        for node in self.path(tokens):
            acl = node.acls.get(authority)
            if acl is None:
                continue
            granted, entry = acl.evaluate(principal)
            if granted:
                return TreeVerdict(True, f"{self.title} node {node.label} grants {authority} "
                                         f"to {user}{_via(principal, entry)}")
            defining.append(node.label)
            if entry is not None:
                excluded.append(f"node {node.label} excludes {user} ('{entry}')")
        where = (f"nodes defining {authority}: {', '.join(defining)}" if defining
                 else f"no node on the path defines {authority}")
        text = (f"{self.title}: no node from '{shown}' up to the root grants {authority} to "
                f"{user} ({where})")
        if excluded:
            text += "; " + "; ".join(excluded)
        return TreeVerdict(False, text)

    def _nearest(self, principal: Principal, authority: str, tokens: tuple[str, ...]
                 ) -> TreeVerdict:
        user = principal.user
        for node in self.path(tokens):
            acl = node.acls.get(authority)
            if acl is None:
                continue
            granted, entry = acl.evaluate(principal)
            head = f"{self.title} node {node.label} defines {authority}"
            if granted:
                return TreeVerdict(True, f"{head}: granted to {user}{_via(principal, entry)}")
            if entry is not None:
                return TreeVerdict(False, f"{head}: {user} is denied by '{entry}'")
            return TreeVerdict(False, f"{head} as {list(acl.texts)}: not granted to {user}")
        raise AssertionError("unreachable: the nearestAcl root defines every authority")

    def _delivery(self, principal: Principal, tokens: tuple[str, ...], address: str
                  ) -> TreeVerdict:
        sub = self._nearest(principal, SUBSCRIBE, tokens)
        if not sub.allowed:
            return sub
        persistent = self._nearest(principal, PERSISTENT, tokens)
        if persistent.allowed:
            return TreeVerdict(True, f"{sub.text}; {persistent.text}")
        return TreeVerdict(True, f"{sub.text}; {persistent.text} -> durable messages on "
                                 f"'{address}' are delivered as non-durable",
                           strip_durable=True)


def _may_lead_to_match(pattern: tuple[object, ...], tokens: tuple[str, ...]) -> bool:
    """True when some topic starting with ``tokens`` can match the filter ``pattern``."""
    for i, token in enumerate(tokens):
        if i >= len(pattern):
            return False
        want = pattern[i]
        if want is MANY:
            return True
        if want is not ONE and want != token:
            return False
    return True
