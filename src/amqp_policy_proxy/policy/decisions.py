"""Sans-IO. Pure policy decisions, in QDR's order; denials are values, never exceptions.

* :func:`approve_open`: vhost -> group -> remoteHosts (QDR's order). Connection
  *counts* are the ledger's job (:class:`amqp_policy_proxy.limits.connections.ConnectionLedger`).
* :func:`approve_sender` / :func:`approve_receiver`: link Attach checks (QDR ``qd_policy_approve_amqp_sender_link`` /
  ``..._receiver_link``).
* :func:`approve_relay_target`: an anonymous-relay message's ``to`` (QDR
  ``qd_policy_approve_message_target``).

Every address decision is made on the node the upstream resolves the address to
(:mod:`.naming`, decision 0007): a rule matches the resolved name; a router-internal node needs
a literal grant; an address whose node the proxy cannot be sure of is denied like an address no
rule allows.

The reasons are the enums of :mod:`.reasons` (the ``reason`` labels of docs/observability.md). Whether vhost policy is
enabled at all (``settings.enable_vhost_policy``) is for the caller to check first.
"""

from __future__ import annotations

from typing import NamedTuple

from amqp_policy_proxy.ingress.peer import ClientAddress
from amqp_policy_proxy.policy.addresses import AddressRules
from amqp_policy_proxy.policy.lookup import GroupMatch, VhostMatch, resolve_group, resolve_vhost
from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy
from amqp_policy_proxy.policy.naming import DEFAULT_NAMING, Naming, Node
from amqp_policy_proxy.policy.reasons import ConnectionDenyReason, LinkDenyReason

_C = ConnectionDenyReason
_L = LinkDenyReason


class OpenAllowed(NamedTuple):
    """The Open passed vhost, group and remote-host checks (counts still to be checked)."""

    vhost: VhostPolicy
    group: GroupSettings
    rule: str = ""
    """How the vhost and the group were found (the audit trail's ``rule``)."""


class OpenDenied(NamedTuple):
    """The Open is denied: Open+Close ``amqp:resource-limit-exceeded`` (QDR
    ``qd_policy_private_deny_amqp_connection``)."""

    reason: ConnectionDenyReason
    """``no_vhost``, ``unknown_user`` or ``remote_host``."""
    vhost: VhostPolicy | None
    group: GroupSettings | None
    log: str
    """QDR's INFO log line for the denial."""
    rule: str = ""
    """The rule that denied, in words (the audit trail's ``rule``)."""


def _deny_log(user: str, remote_host: str | ClientAddress, vhost: str, why: str) -> str:
    return f"DENY AMQP Open for user '{user}', rhost '{remote_host}', vhost '{vhost}': {why}"


def approve_open(
    policy: Policy, *, hostname: str | None, user: str, remote_host: str | ClientAddress
) -> OpenAllowed | OpenDenied:
    """Decide an AMQP Open by vhost, group and remote host, in QDR's order.

    Args:
        policy: the policy snapshot for new connections.
        hostname: the Open ``hostname`` (or the listener's ``policyVhost``); None means ``""``.
        user: the authenticated user name (``anonymous`` without SASL).
        remote_host: the client's address, parsed once by the shell
            (:class:`~amqp_policy_proxy.ingress.peer.ClientAddress`), or its normalised IP
            text (:func:`amqp_policy_proxy.ingress.peer.normalise_peer`).

    Returns:
        :class:`OpenAllowed` with the vhost and group, or :class:`OpenDenied` with the first
        failing reason and QDR's log text. The no-vhost log names the requested hostname; the
        others name the resolved vhost (as QDR's ``lookup_user`` does).
    """
    vmatch = resolve_vhost(policy, hostname)
    if vmatch is None:
        default = policy.settings.default_vhost
        return OpenDenied(_C.NO_VHOST, None, None,
                          _deny_log(user, remote_host, hostname or "", "No policy defined for vhost"),
                          f"no vhost, alias or pattern matches '{hostname or ''}' and defaultVhost "
                          f"'{default}' is not defined" if default else
                          f"no vhost, alias or pattern matches '{hostname or ''}' and defaultVhost "
                          "is empty")
    vhost = vmatch.vhost
    gmatch = resolve_group(vhost, user)
    if gmatch is not None and gmatch.group.remote_hosts.matches(remote_host):
        key = (vmatch.how, vmatch.via, gmatch.group.name, gmatch.how)
        rule = vhost.rule_texts.get(key)
        if rule is None:
            rule = vhost.rule_texts[key] = (
                f"{_vhost_words(vmatch)}; {_group_words(gmatch)}; remoteHosts matches")
        return OpenAllowed(vhost, gmatch.group, rule)
    if gmatch is None:
        return OpenDenied(_C.UNKNOWN_USER, vhost, None, _deny_log(
            user, remote_host, vhost.hostname,
            "User is not in a user group and unknown users are denied"),
            f"{_vhost_words(vmatch)}; user in no group's users, no '*', allowUnknownUser false")
    return OpenDenied(_C.REMOTE_HOST, vhost, gmatch.group, _deny_log(
        user, remote_host, vhost.hostname,
        "User is not allowed to connect from this network host"),
        f"{_vhost_words(vmatch)}; {_group_words(gmatch)}; no remoteHosts item of the group "
        "matches the client")


def _vhost_words(vmatch: VhostMatch) -> str:
    """How the vhost was found, for a ``rule``: ``vhost 'v' (alias 'a')``."""
    return f"vhost '{vmatch.vhost.hostname}' ({_FOUND[vmatch.how].format(vmatch.via)})"


def _group_words(gmatch: GroupMatch) -> str:
    """How the user got its group, for a ``rule``: ``group 'g' (user listed)``."""
    return f"group '{gmatch.group.name}' ({_MEMBER[gmatch.how]})"


#: How the vhost was found (``VhostMatch.how``), for the rule text.
_FOUND = {"exact": "exact name", "alias": "alias '{}'", "pattern": "hostname pattern '{}'",
          "default": "defaultVhost '{}'"}
#: How the user got its group (``GroupMatch.how``).
_MEMBER = {"user": "user listed", "any_user": "users '*'",
           "unknown_user": "allowUnknownUser"}


def count_rule(reason: ConnectionDenyReason, vhost: VhostPolicy, group: GroupSettings) -> str:
    """The connection limit behind a ledger denial, in words (the audit trail's ``rule``).

    Args:
        reason: ``vhost_limit``, ``user_limit`` or ``host_limit``; or a connection-rate
            denial (``vhost_rate``, ``user_rate``, ``host_rate``).
        vhost: the vhost (its limits apply unless the group overrides them).
        group: the user's group.

    Returns:
        e.g. ``maxConnectionsPerUser 2 (group 'users') reached``.
    """
    if reason is _C.VHOST_LIMIT:
        return f"maxConnections {vhost.max_connections} (vhost '{vhost.hostname}') reached"
    if reason is _C.VHOST_RATE:
        return (f"maxConnectionRate {vhost.max_connection_rate}/s "
                f"(vhost '{vhost.hostname}') exceeded")
    if reason in (_C.USER_RATE, _C.HOST_RATE):
        per = "User" if reason is _C.USER_RATE else "Host"
        key = f"maxConnectionRatePer{per}"
        attr = f"max_connection_rate_per_{per.lower()}"
        value = getattr(group, attr)
        if value is None:
            return f"{key} {getattr(vhost, attr)}/s (vhost '{vhost.hostname}') exceeded"
        return f"{key} {value}/s (group '{group.name}') exceeded"
    if reason is _C.USER_LIMIT:
        key, value, fallback = ("maxConnectionsPerUser", group.max_connections_per_user,
                                vhost.max_connections_per_user)
    else:
        key, value, fallback = ("maxConnectionsPerHost", group.max_connections_per_host,
                                vhost.max_connections_per_host)
    if value is None:
        return f"{key} {fallback} (vhost '{vhost.hostname}') reached"
    return f"{key} {value} (group '{group.name}') reached"


def node_allowed(rules: AddressRules, node: Node | None, user: str,
                 declared: tuple[str, ...] = ()) -> bool:
    """Whether ``rules`` allow the resolved ``node`` for ``user`` (decision 0007).

    None (the upstream's node is not certain) never is; a router-internal node only by a
    literal grant, unless it lies in a ``declared`` ``$`` tree (:attr:`GroupSettings.
    declared_prefixes`: the name itself, or below it after ``/`` or ``.``), which the rules
    grant like any address.
    """
    if node is None:
        return False
    name = node.name
    if node.internal and not any(
            name == p or (name.startswith(p) and name[len(p)] in "./") for p in declared):
        return rules.allows_literal(name, user)
    return rules.allows(name, user)


def approve_sender(
    group: GroupSettings, *, user: str, target_address: str | None, open_senders: int,
    naming: Naming = DEFAULT_NAMING,
) -> LinkDenyReason | None:
    """Decide a client sender's Attach (the router's incoming link), as QDR's
    ``qd_policy_approve_amqp_sender_link``.

    Order: ``maxSenders`` -> target address rules -> anonymous sender. A sender with a dynamic
    target has no address and so is an anonymous sender.

    Args:
        group: the connection's group settings (snapshot taken at Open).
        user: the authenticated user name, for ``${user}``.
        target_address: the target terminus address; None or ``""`` when there is no target,
            no address, or a dynamic target.
        open_senders: client sender links currently attached on this connection.
        naming: how the upstream resolves the address (:mod:`.naming`).

    Returns:
        None when allowed, else ``"sender_limit"`` (``amqp:resource-limit-exceeded``),
        ``"target"`` or ``"anonymous_sender"`` (``amqp:unauthorized-access``).
    """
    if group.max_senders is not None and open_senders >= group.max_senders:
        return _L.SENDER_LIMIT
    if target_address:
        node = naming.resolve(target_address)
        allowed = node_allowed(group.targets, node, user, group.declared_prefixes)
        return None if allowed else _L.TARGET
    return None if group.allow_anonymous_sender else _L.ANONYMOUS_SENDER


def approve_receiver(
    group: GroupSettings,
    *,
    user: str,
    source_address: str | None,
    dynamic: bool,
    open_receivers: int,
    naming: Naming = DEFAULT_NAMING,
) -> LinkDenyReason | None:
    """Decide a client receiver's Attach (the router's outgoing link), as QDR's
    ``qd_policy_approve_amqp_receiver_link``.

    Order: ``maxReceivers`` -> dynamic source (``allowDynamicSource`` alone decides; sources
    are not consulted) -> source address rules -> no address (always denied).

    Args:
        group: the connection's group settings.
        user: the authenticated user name, for ``${user}``.
        source_address: the source terminus address; None or ``""`` when absent.
        dynamic: the source terminus has ``dynamic=true``.
        open_receivers: client receiver links currently attached on this connection.
        naming: how the upstream resolves the address; a source whose routing key would come
            from each message (RabbitMQ ``/exchange/X``) has no certain node and is denied.

    Returns:
        None when allowed, else ``"receiver_limit"`` (``amqp:resource-limit-exceeded``),
        ``"dynamic_source"``, ``"source"`` or ``"no_source"`` (``amqp:unauthorized-access``).
    """
    if group.max_receivers is not None and open_receivers >= group.max_receivers:
        return _L.RECEIVER_LIMIT
    if dynamic:
        return None if group.allow_dynamic_source else _L.DYNAMIC_SOURCE
    if source_address:
        node = naming.resolve(source_address)
        if node is not None and node.by_subject:
            node = None
        allowed = node_allowed(group.sources, node, user, group.declared_prefixes)
        return None if allowed else _L.SOURCE
    return _L.NO_SOURCE


def approve_relay_target(group: GroupSettings, *, user: str, to: str,
                         naming: Naming = DEFAULT_NAMING) -> bool:
    """Decide one anonymous-relay message's destination, as QDR's
    ``qd_policy_approve_message_target``.

    The caller skips the check for a message without a destination (QDR does); an empty
    ``to`` passed here is denied. A denial is a rejected disposition,
    ``amqp:unauthorized-access`` / ``policy violation on target``.

    Args:
        group: the connection's group settings.
        user: the authenticated user name, for ``${user}``.
        to: the ``x-opt-qd.to`` annotation if honoured, else ``properties.to``, raw.
        naming: how the upstream resolves ``to`` (:mod:`.naming`).

    Returns:
        True when ``targetPattern`` (else ``targets``) allows ``to``; False otherwise,
        including when neither is configured.
    """
    return node_allowed(group.targets, naming.resolve(to), user,
                        group.declared_prefixes)
