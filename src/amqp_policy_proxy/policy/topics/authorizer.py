"""Sans-IO. :class:`TopicAuthorizer`: every topic model of one (vhost, group), combined.

A request must pass every model configured for the connection (docs/topic-authorization.md), in this
order: the vhost's ``topicTree``, the group's ``permissions``, the vhost's DDS
``permissionsDocument``. The first model that denies decides; the QDR address rules
(``sources``/``targets``) are checked by the caller before any of them.

Cost: ``check_publish`` runs for every anonymous-relay message and ``check_delivery`` for every
delivery on a wildcard ``nearestAcl`` link, so the tree and permission parts of each answer are
memoised per (principal, request) in a small bounded dict (cleared when full). The DDS part
depends on the time (validity windows) and is evaluated on every call.

No I/O, no clock: the wall-clock time comes in as ``wall_now``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from amqp_policy_proxy.policy.topics.outcomes import (
    PUBLISH,
    SUBSCRIBE,
    DeliveryDecision,
    Principal,
    TopicDecision,
)
from amqp_policy_proxy.policy.topics.permissions import MODEL_NAME as PERMISSIONS
from amqp_policy_proxy.policy.topics.permissions import PermissionList
from amqp_policy_proxy.policy.topics.tree import MODEL_NAME as TOPIC_TREE
from amqp_policy_proxy.policy.topics.tree import TopicTree

DDS: Final = "dds"
"""Model name of the DDS Security permissions document."""
MEMO_SIZE: Final = 4096
"""Entries kept per authorizer before the memo is cleared."""


class DdsVerdictLike(Protocol):
    """What :meth:`DdsPermissionsLike.check` returns (``policy.topics.dds.DdsVerdict``)."""

    @property
    def allowed(self) -> bool: ...  # pragma: no cover - protocol

    @property
    def decided_by(self) -> str: ...  # pragma: no cover - protocol


class DdsPermissionsLike(Protocol):
    """A loaded DDS permissions document (``policy.topics.dds.DdsPermissions``)."""

    def check(self, subject: str | None, user: str, activity: str, topic: str,
              wall_now: float) -> DdsVerdictLike: ...  # pragma: no cover - protocol


class TopicAuthorizer:
    """The topic checks of one (vhost, group); immutable and thread-safe to read.

    Built by the policy compiler and stored as ``GroupSettings.topics`` (None when no model
    applies to the group, so the core pays nothing).
    """

    __slots__ = ("vhost", "group", "tree", "permissions", "dds", "_memo")

    def __init__(self, *, vhost: str, group: str, tree: TopicTree | None = None,
                 permissions: PermissionList | None = None,
                 dds: DdsPermissionsLike | None = None) -> None:
        """Combine the models.

        Args:
            vhost: the vhost name (for texts).
            group: the group name (for texts).
            tree: the vhost's compiled ``topicTree``, if any.
            permissions: the group's compiled ``permissions``, if any.
            dds: the vhost's loaded DDS permissions document, if any.
        """
        self.vhost = vhost
        self.group = group
        self.tree = tree
        self.permissions = permissions
        self.dds = dds
        self._memo: dict[tuple[object, ...], _Static | DeliveryDecision] = {}

    @property
    def models(self) -> tuple[str, ...]:
        """The names of the configured models, in evaluation order."""
        out = []
        if self.tree is not None:
            out.append(TOPIC_TREE)
        if self.permissions is not None:
            out.append(PERMISSIONS)
        if self.dds is not None:
            out.append(DDS)
        return tuple(out)

    def __repr__(self) -> str:
        return f"TopicAuthorizer(vhost={self.vhost!r}, group={self.group!r}, models={self.models})"

    # ------------------------------------------------------------------ the core's API

    def check_publish(self, principal: Principal, address: str, *, qos: int,
                      wall_now: float) -> TopicDecision:
        """Decide publishing to ``address``: a sender's target, or a relay message's ``to``.

        Args:
            principal: the connection's user, group and TLS subject.
            address: the concrete address.
            qos: the link's QoS, from :func:`~.outcomes.qos_of`.
            wall_now: POSIX seconds (DDS validity windows).

        Returns:
            The decision; when denied, ``model`` names the model that denied.
        """
        return self._decide(principal, PUBLISH, address, qos, wall_now)[0]

    def check_subscribe(self, principal: Principal, address: str, *, qos: int,
                        wall_now: float) -> TopicDecision:
        """Decide a receiver's source ``address`` (wildcards in the vhost's syntax).

        Returns:
            The decision. With a ``nearestAcl`` tree, ``per_delivery`` is set for a wildcard
            subscription (then call :meth:`check_delivery` for each delivery) and
            ``strip_durable`` for an address where ``persistent`` is not granted.
        """
        return self._decide(principal, SUBSCRIBE, address, qos, wall_now)[0]

    def check_delivery(self, principal: Principal, subscription: str, address: str, *,
                       wall_now: float) -> DeliveryDecision:
        """Decide one delivery on a ``per_delivery`` link.

        Args:
            principal: the connection's principal.
            subscription: the link's source address (for texts; the decision depends only on
                ``address``).
            address: the message's concrete address: its ``to``, else the link's source.
            wall_now: POSIX seconds (unused by the tree; kept for symmetry and future models).

        Returns:
            Visibility (``subscribe`` at the nearest defining node) and ``strip_durable``
            (``persistent`` at the nearest defining node). Without a ``nearestAcl`` tree every
            delivery is visible and keeps its durability.
        """
        return self._delivery(("delivery", principal, address), TopicTree.check_delivery,
                              principal, address)

    def check_unknown_delivery(self, principal: Principal, subscription: str, *,
                               wall_now: float) -> DeliveryDecision:
        """Decide a delivery on a ``per_delivery`` link whose concrete address is unknown.

        The message has no (readable) ``to``: visible only when the principal may see every
        topic ``subscription`` can match (:meth:`TopicTree.check_unknown_delivery`), so a
        broker that drops ``to`` cannot leak a restricted topic to a wildcard subscriber.

        Args:
            principal: the connection's principal.
            subscription: the link's source address (a wildcard subscription).
            wall_now: POSIX seconds (unused by the tree).

        Returns:
            Visibility and ``strip_durable``; without a ``nearestAcl`` tree, visible.
        """
        return self._delivery(("unknown", principal, subscription),
                              TopicTree.check_unknown_delivery, principal, subscription)

    def _delivery(self, key: tuple[str, Principal, str],
                  ask: Callable[[TopicTree, Principal, str], Any], principal: Principal,
                  address: str) -> DeliveryDecision:
        """The per-delivery decision memoised under ``key``, else ``ask(tree, principal,
        address)``'s verdict (visible without a ``nearestAcl`` tree), memoised."""
        memo = self._memo
        found = memo.get(key)
        if found is not None:
            return cast(DeliveryDecision, found)
        if self.tree is None:
            answer = DeliveryDecision(True, False, "no per-delivery topic model")
        else:
            verdict = ask(self.tree, principal, address)
            answer = DeliveryDecision(verdict.allowed, verdict.strip_durable, verdict.text)
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[key] = answer
        return answer

    # ------------------------------------------------------------------ explain

    def explain_check(self, principal: Principal, activity: str, address: str, *, qos: int,
                      wall_now: float) -> tuple[TopicDecision, tuple[tuple[str, bool, str], ...]]:
        """The decision and each model's step, for ``explain``.

        Args:
            principal: the principal.
            activity: ``"publish"`` or ``"subscribe"``.
            address: the address.
            qos: the link's QoS.
            wall_now: POSIX seconds.

        Returns:
            ``(decision, steps)``; each step is ``(model, allowed, text)``, in evaluation
            order, up to and including the first denial.

        Raises:
            ValueError: ``activity`` is neither publish nor subscribe.
        """
        if activity not in (PUBLISH, SUBSCRIBE):
            raise ValueError(f"activity must be 'publish' or 'subscribe', not {activity!r}")
        return self._decide(principal, activity, address, qos, wall_now, memo=False)

    # ------------------------------------------------------------------ internals

    def _decide(self, principal: Principal, activity: str, address: str, qos: int,
                wall_now: float, *, memo: bool = True
                ) -> tuple[TopicDecision, tuple[tuple[str, bool, str], ...]]:
        key = (activity, principal, address, qos)
        cache = self._memo
        static = cast("_Static | None", cache.get(key)) if memo else None
        if static is None:
            static = self._static(principal, activity, address, qos)
            if memo:
                if len(cache) >= MEMO_SIZE:
                    cache.clear()
                cache[key] = static
        if not static.decision.allowed or self.dds is None:
            return static.decision, static.steps
        verdict = self.dds.check(principal.subject, principal.user, activity, address, wall_now)
        text = verdict.decided_by
        if not text.startswith(DDS):
            text = f"{DDS}: {text}"
        steps = (*static.steps, (DDS, bool(verdict.allowed), text))
        if not verdict.allowed:
            return TopicDecision(False, text, DDS), steps
        models = [m for m, _, _ in steps]
        decision = static.decision
        return TopicDecision(
            True, "; ".join(t for _, _, t in steps), models[0] if len(models) == 1 else "",
            per_delivery=decision.per_delivery, strip_durable=decision.strip_durable,
        ), steps

    def _static(self, principal: Principal, activity: str, address: str, qos: int) -> _Static:
        steps: list[tuple[str, bool, str]] = []
        per_delivery = strip = False
        if self.tree is not None:
            if activity == PUBLISH:
                verdict = self.tree.check_publish(principal, address)
            else:
                verdict = self.tree.check_subscribe(principal, address)
            steps.append((TOPIC_TREE, verdict.allowed, verdict.text))
            if not verdict.allowed:
                return _Static(TopicDecision(False, verdict.text, TOPIC_TREE), tuple(steps))
            per_delivery, strip = verdict.per_delivery, verdict.strip_durable
        if self.permissions is not None:
            allowed, text = self.permissions.check(principal, activity, address, qos)
            steps.append((PERMISSIONS, allowed, text))
            if not allowed:
                return _Static(TopicDecision(False, text, PERMISSIONS), tuple(steps))
        n_models = len(steps) + (1 if self.dds is not None else 0)
        if not steps:
            text = "no topic model decides before DDS" if self.dds is not None else (
                "no topic model configured")
            return _Static(TopicDecision(True, text, ""), ())
        model = steps[0][0] if n_models == 1 else ""
        return _Static(TopicDecision(True, "; ".join(t for _, _, t in steps), model,
                                     per_delivery=per_delivery, strip_durable=strip),
                       tuple(steps))


class _Static:
    """The memoised, time-independent part of a decision (tree and permissions)."""

    __slots__ = ("decision", "steps")

    def __init__(self, decision: TopicDecision,
                 steps: tuple[tuple[str, bool, str], ...]) -> None:
        self.decision = decision
        self.steps = steps
