"""Sans-IO. ``amqp-policy-proxy explain``: a static, step-by-step account of a decision.

It follows the same order and uses the same lookups as the live decisions
(:mod:`amqp_policy_proxy.policy.decisions`) and names the rule that decided each step: how the
vhost was found, why the user got its group, which ``remoteHosts`` item matched, and, with an
address and a role, which ``sources``/``targets`` item or pattern allowed the link, then each
topic model of the group (docs/topic-authorization.md: ``topicTree`` node, ``permissions`` rule, DDS grant
and rule) and, for a per-delivery subscription, the decision for one message's address.
Live counts (connections, sessions, links) and the rate buckets are not considered; the output
says so, and names the connection rates (with the denial reason each would give) and the
message and byte rates that shape the user's sending links, when any applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from amqp_policy_proxy.ingress.peer import normalise_peer
from amqp_policy_proxy.policy.addresses import USER_TOKEN, AddressRules
from amqp_policy_proxy.policy.keys import Enforcement
from amqp_policy_proxy.policy.lookup import resolve_group, resolve_vhost
from amqp_policy_proxy.policy.model import GroupSettings, Policy, VhostPolicy
from amqp_policy_proxy.policy.reasons import ConnectionDenyReason, LinkDenyReason
from amqp_policy_proxy.policy.topics import PUBLISH, SUBSCRIBE, Principal

ROLES = ("sender", "receiver")
"""The client's side of the link: ``sender`` checks targets, ``receiver`` checks sources."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    """The outcome and the reasoning behind it."""

    allowed: bool
    lines: tuple[str, ...]
    """One line per step, ending with ``RESULT: ALLOW`` or ``RESULT: DENY (<reason>)``."""
    reason: str | None = None
    """The denial reason (a metrics ``reason`` label value), None when allowed."""
    enforcement: Enforcement = Enforcement.ENFORCE
    """The enforcement that applies (the group's, else the vhost's): in ``shadow`` a denial
    is reported (``SHADOW DENY``), not enforced."""

    def render(self) -> str:
        """The lines joined with newlines (what the CLI prints)."""
        return "\n".join(self.lines)


def explain(
    policy: Policy,
    *,
    user: str,
    host: str,
    vhost: str | None = None,
    address: str | None = None,
    role: str | None = None,
    qos: int = 1,
    subject: str | None = None,
    wall_now: float | None = None,
    delivery_address: str | None = None,
) -> Explanation:
    """Explain whether ``user`` connecting from ``host`` to ``vhost`` is allowed.

    Args:
        policy: the policy to explain.
        user: the authenticated user name.
        host: the client IP address (normalised like live traffic: ``::ffff:a.b.c.d`` is IPv4).
        vhost: the Open hostname; None means no hostname (``""``).
        address: optionally, a link address to check (``""`` = no address: anonymous sender,
            or a receiver without source).
        role: ``"sender"`` (client sends: targets) or ``"receiver"`` (client receives:
            sources); required with ``address``.
        qos: the link's QoS for ``permissions`` rules (0, 1 or 2; see
            :func:`amqp_policy_proxy.policy.topics.qos_of`).
        subject: the TLS client certificate subject (RFC 4514) for DDS grants, else None.
        wall_now: POSIX seconds at which DDS validity windows are evaluated; required when
            the group's topic checks include a DDS document.
        delivery_address: with a receiver, the concrete address of one message (its ``to``)
            to show the per-delivery decision and the durable rewrite.

    Returns:
        The explanation. Counts are not considered.

    Raises:
        ValueError: ``role`` is not ``sender``/``receiver``, ``address`` is given without
            a role, ``delivery_address`` without the receiver role, ``qos`` is not 0, 1 or 2,
            or a DDS check is needed and ``wall_now`` is None.
    """
    if role is not None and role not in ROLES:
        raise ValueError(f"role must be 'sender' or 'receiver', not {role!r}")
    if address is not None and role is None:
        raise ValueError("an address needs a role ('sender' or 'receiver')")
    if delivery_address is not None and role != "receiver":
        raise ValueError("a delivery address needs the 'receiver' role")
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
    rhost = normalise_peer(host)
    lines: list[str] = []
    requested = vhost or ""
    # whose enforcement decides: the group's once known, else the vhost's
    scope: tuple[str, Enforcement] | None = None

    def done(allowed: bool, reason: str | None = None) -> Explanation:
        enforcement = Enforcement.ENFORCE if scope is None else scope[1]
        if scope is not None and enforcement is Enforcement.SHADOW:
            lines.append(_shadow_line(scope[0], allowed))
        lines.append("RESULT: ALLOW" if allowed else f"RESULT: DENY ({reason})")
        return Explanation(allowed=allowed, lines=tuple(lines), reason=reason,
                           enforcement=enforcement)

    if not policy.settings.enable_vhost_policy:
        rate = policy.settings.max_connection_rate
        also = f" and max_connection_rate ({rate}/s)" if rate else ""
        lines.append("vhost policy is disabled (enableVhostPolicy false): only the global "
                     f"maxConnections ({policy.settings.max_connections}){also} applies")
        return done(True)

    vmatch = resolve_vhost(policy, vhost)
    if vmatch is None:
        lines.append(_no_vhost_line(policy, requested))
        return done(False, ConnectionDenyReason.NO_VHOST)
    chosen = vmatch.vhost
    how = {
        "exact": "exact name",
        "alias": f"alias '{vmatch.via}'",
        "pattern": f"hostname pattern '{vmatch.via}'",
        "default": f"no vhost, alias or pattern matched; defaultVhost '{vmatch.via}'",
    }[vmatch.how]
    where = f" from {chosen.source_file}" if chosen.source_file else ""
    lines.append(f"vhost: Open hostname '{requested}' -> vhost '{chosen.hostname}' "
                 f"({how}){where}")

    scope = (f"vhost '{chosen.hostname}'", chosen.enforcement)
    gmatch = resolve_group(chosen, user)
    if gmatch is None:
        lines.append(f"group: user '{user}' is in no group's users, no group lists '*', and "
                     f"allowUnknownUser is false")
        return done(False, ConnectionDenyReason.UNKNOWN_USER)
    group = gmatch.group
    lines.append(_group_line(user, group, gmatch.how))
    scope = (f"group '{group.name}'", group.enforcement)

    if not _remote_host_step(group, host, rhost, lines):
        return done(False, ConnectionDenyReason.REMOTE_HOST)

    lines.append(_counts_line(chosen, group))
    lines.append(_settings_line(group))
    lines.extend(_rate_lines(policy, chosen, group))

    if role is not None:
        reason = _link_step(group, user, address or "", role, lines)
        if reason is None:
            principal = Principal(user=user, group=group.name, subject=subject)
            reason = _topic_step(group, principal, address or "", role, qos, wall_now,
                                 delivery_address, lines)
        if reason is not None:
            return done(False, reason)
    return done(True)


def _shadow_line(whose: str, allowed: bool) -> str:
    if allowed:
        return (f"enforcement: shadow ({whose}): nothing here is denied; a denial (counts, "
                "sessions, messages) would be logged as SHADOW DENY and counted, not enforced")
    return (f"enforcement: shadow ({whose}): this denial is not enforced: the proxy allows it, "
            "logs it as SHADOW DENY and counts it in amqp_proxy_shadow_denials_total")


def _no_vhost_line(policy: Policy, requested: str) -> str:
    tried = ["no vhost of that name", "no alias"]
    if policy.settings.enable_vhost_name_patterns:
        tried.append("no hostname pattern")
    default = policy.settings.default_vhost
    if not default:
        tried.append("defaultVhost is empty")
    else:
        tried.append(f"defaultVhost '{default}' is not defined")
    return f"vhost: Open hostname '{requested}': " + ", ".join(tried)


def _group_line(user: str, group: GroupSettings, how: str) -> str:
    if how == "user":
        return f"group: user '{user}' is listed in the users of group '{group.name}'"
    if how == "any_user":
        return f"group: user '{user}' is not listed by name; group '{group.name}' lists '*'"
    return (f"group: user '{user}' is in no group and no group lists '*'; allowUnknownUser is "
            f"true -> group '{group.name}'")


def _remote_host_step(group: GroupSettings, host: str, rhost: str, lines: list[str]) -> bool:
    shown = rhost if rhost == host else f"{rhost} (from '{host}')"
    hosts = group.remote_hosts
    if hosts.is_empty():
        lines.append(f"remoteHosts: group '{group.name}' has no remoteHosts: every host is denied")
        return False
    item = hosts.first_match(rhost)
    if item is None:
        lines.append(f"remoteHosts: {shown} matches none of {list(hosts.items)} "
                     f"(group '{group.name}')")
        return False
    resolved = hosts.resolved.get(item)
    note = f" (host name resolved at load time to {resolved})" if resolved else ""
    lines.append(f"remoteHosts: {shown} matches item '{item}'{note}")
    return True


def _counts_line(vhost: VhostPolicy, group: GroupSettings) -> str:
    per_user = group.max_connections_per_user
    per_host = group.max_connections_per_host
    user_src = "group" if per_user is not None else "vhost"
    host_src = "group" if per_host is not None else "vhost"
    return ("counts: not considered (explain is static); at Open the proxy also checks "
            f"maxConnections {vhost.max_connections} (vhost), "
            f"maxConnectionsPerUser {vhost.max_connections_per_user if per_user is None else per_user}"
            f" ({user_src}), "
            f"maxConnectionsPerHost {vhost.max_connections_per_host if per_host is None else per_host}"
            f" ({host_src})")


def _settings_line(group: GroupSettings) -> str:
    def show(value: int | None, none: str = "unlimited") -> str:
        return none if value is None else str(value)

    return (f"settings: maxFrameSize {show(group.max_frame_size, 'not set')}, "
            f"maxSessions {show(group.max_sessions, 'not set')}, "
            f"maxSessionWindow {show(group.max_session_window, 'not set')}, "
            f"maxMessageSize {show(group.max_message_size)}, "
            f"maxSenders {show(group.max_senders)}, maxReceivers {show(group.max_receivers)}")


def _rate_lines(policy: Policy, vhost: VhostPolicy, group: GroupSettings) -> list[str]:
    """The connection rates and the shaping rates (extensions over QDR), if any applies."""
    lines = []
    raw_groups = vhost.raw.get("groups")
    raw_group = raw_groups.get(group.name, {}) if isinstance(raw_groups, Mapping) else {}
    burst = vhost.connection_rate_burst
    rates = []
    for key, value, reason in (
        ("maxConnectionRate", vhost.max_connection_rate, ConnectionDenyReason.VHOST_RATE),
        ("maxConnectionRatePerUser", group.max_connection_rate_per_user,
         ConnectionDenyReason.USER_RATE),
        ("maxConnectionRatePerHost", group.max_connection_rate_per_host,
         ConnectionDenyReason.HOST_RATE),
    ):
        if value:
            where = "group" if key in raw_group else "vhost"
            rates.append(f"{key} {value}/s burst {burst or value} ({where}; over it: {reason})")
    global_rate = policy.settings.max_connection_rate
    if global_rate:
        rates.append(f"[policy] max_connection_rate {global_rate}/s at TCP accept (over it: "
                     f"{ConnectionDenyReason.GLOBAL_RATE})")
    if rates:
        lines.append("rates: not considered (explain is static); after the counts the proxy "
                     "also checks " + ", ".join(rates))
    messages, nbytes = group.max_message_rate_per_user, group.max_byte_rate_per_user
    if messages or nbytes:
        shown = [f"maxMessageRatePerUser {messages}/s" if messages else
                 "maxMessageRatePerUser unlimited",
                 f"maxByteRatePerUser {nbytes} B/s" if nbytes else
                 "maxByteRatePerUser unlimited"]
        lines.append(f"shaping: {', '.join(shown)}: the user's sending links get link-credit as "
                     "the user's buckets allow (shared by the user's connections on this "
                     "proxy); a faster sender waits, nothing is refused")
    return lines


def _link_step(group: GroupSettings, user: str, address: str, role: str,
               lines: list[str]) -> str | None:
    if role == "sender":
        if not address:
            if group.allow_anonymous_sender:
                lines.append("link: sender without a target address (anonymous relay) is allowed "
                             "by allowAnonymousSender; each message's 'to' is then checked "
                             "against the targets")
                return None
            lines.append("link: sender without a target address (anonymous relay) is denied: "
                         "allowAnonymousSender is false")
            return LinkDenyReason.ANONYMOUS_SENDER
        return _address_step(group.targets, "targetPattern", "targets", user, address,
                             "sender target", LinkDenyReason.TARGET, lines)
    if not address:
        lines.append("link: receiver without a source address is always denied; a dynamic "
                     f"source would be {'allowed' if group.allow_dynamic_source else 'denied'} "
                     "(allowDynamicSource)")
        return LinkDenyReason.NO_SOURCE
    return _address_step(group.sources, "sourcePattern", "sources", user, address,
                         "receiver source", LinkDenyReason.SOURCE, lines)


def _address_step(rules: AddressRules, pattern_key: str, list_key: str, user: str,
                  address: str, what: str, reason: str, lines: list[str]) -> str | None:
    key = pattern_key if rules.pattern_mode else list_key
    item = rules.first_match(address, user)
    if item is not None:
        subst = f" with {USER_TOKEN} = '{user}'" if USER_TOKEN in item else ""
        lines.append(f"link: {what} '{address}' is allowed by {key} item '{item}'{subst}")
        return None
    if rules.is_empty():
        lines.append(f"link: {what} '{address}' is denied: the group has no {list_key} or "
                     f"{pattern_key} (deny all)")
    else:
        lines.append(f"link: {what} '{address}' is denied: no {key} item matches "
                     f"{list(rules.items)} for user '{user}'")
    return reason


def _topic_step(group: GroupSettings, principal: Principal, address: str, role: str, qos: int,
                wall_now: float | None, delivery_address: str | None,
                lines: list[str]) -> str | None:
    """The topic models' lines; the denial reason or None."""
    topics = group.topics
    if topics is None:
        if delivery_address is not None:
            lines.append("delivery: no topic model: every delivery is visible and keeps its "
                         "durability")
        return None
    models = ", ".join(topics.models)
    if not address:
        if role == "sender":
            lines.append(f"topic: each relay message's 'to' is also checked by the topic models "
                         f"({models})")
        return None
    if topics.dds is not None and wall_now is None:
        raise ValueError("the topic check includes a DDS permissions document: give wall_now")
    activity = PUBLISH if role == "sender" else SUBSCRIBE
    who = f"user '{principal.user}' (group '{principal.group}'"
    who += f", subject '{principal.subject}')" if principal.subject else ")"
    lines.append(f"topic: {activity} '{address}' at qos {qos} by {who}; models: {models}")
    decision, steps = topics.explain_check(principal, activity, address, qos=qos,
                                           wall_now=wall_now if wall_now is not None else 0.0)
    lines.extend(f"topic: {text}" for _, _, text in steps)
    if not decision.allowed:
        return LinkDenyReason.TOPIC
    if delivery_address is not None:
        if decision.per_delivery:
            delivery = topics.check_delivery(principal, address, delivery_address,
                                             wall_now=wall_now if wall_now is not None else 0.0)
            if not delivery.visible:
                outcome = "withheld from the client (settled toward the router)"
            elif delivery.strip_durable:
                outcome = "delivered, durable rewritten to false"
            else:
                outcome = "delivered unchanged"
            lines.append(f"delivery: message to '{delivery_address}' is {outcome}: "
                         f"{delivery.decided_by}")
        else:
            durable = ("durable messages are delivered as non-durable" if decision.strip_durable
                       else "durable messages stay durable")
            lines.append(f"delivery: not checked per delivery (decided at attach); {durable}")
    return None
