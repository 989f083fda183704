"""Sans-IO. Validate and compile the topic keys of a policy file (docs/topic-authorization.md).

``topicTree`` (vhost), ``permissions`` and ``defaultBehaviour`` (group). Every problem is
collected as ``(severity, key path, message)`` with the key path relative to the key's owner
(the caller prefixes the vhost or group path and adds the file), so ``check`` can report all of
them at once. Loading the DDS ``permissionsDocument`` is I/O and is done by an injected loader
(see :mod:`amqp_policy_proxy.policy.load`); the errors it raises are :class:`DdsLoadError`.

No I/O, no clock.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Final

from amqp_policy_proxy.policy.topics.filters import (
    AMQP,
    MANY,
    MANY_TOKEN,
    MQTT,
    ONE,
    SEPARATORS,
    USER,
    USER_TOKEN,
    WILDCARD_SYNTAXES,
    Filter,
    TopicSyntax,
)
from amqp_policy_proxy.policy.topics.permissions import (
    ACTIVITIES,
    QOS_LEVELS,
    TYPES,
    PermissionList,
    PermissionRule,
)
from amqp_policy_proxy.policy.topics.principals import (
    EVERYONE,
    GROUP_PREFIX,
    NOT,
    PrincipalList,
)
from amqp_policy_proxy.policy.topics.tree import (
    ANY_ANCESTOR,
    AUTHORITIES_BY_MODEL,
    MODELS,
    NEAREST_ACL,
    TopicTree,
    TreeNode,
)

ERROR: Final = "error"
WARNING: Final = "warning"

Issue = tuple[str, str, str]
"""``(severity, relative key path, message)``; the path starts with ``.`` or ``[``."""

TREE_KEYS: Final = ("model", "separator", "wildcards", "systemPrefixes", "nodes")
NODE_KEYS: Final = ("publish", "subscribe", "persistent")
RULE_KEYS: Final = ("topic", "activity", "qos", "type")
DEFAULT_BEHAVIOURS: Final = ("allow", "deny")
ROOT_DEFAULT: Final = (EVERYONE,)
"""The ``nearestAcl`` root's default list for every authority: everyone."""


class DdsLoadError(Exception):
    """A DDS permissions document (or its CA) could not be loaded; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        """Args: reason: precise cause (unsigned, tampered, bad XML with element path...)."""
        super().__init__(reason)
        self.reason = reason


def _show(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else f"'{value}'"


def _hint(value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        if value.lower() in choices:
            return f"; write '{value.lower()}' (lowercase)"
        guess = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        if guess:
            return f"; did you mean '{guess[0]}'?"
    return ""


def _choice(value: Any, choices: tuple[str, ...], what: str, path: str,
            issues: list[Issue]) -> str | None:
    if isinstance(value, str) and value in choices:
        return value
    options = " or ".join(f"'{c}'" for c in choices)
    issues.append((ERROR, path, f"{what} must be {options}, not {_show(value)}"
                   f"{_hint(value, choices)}"))
    return None


def _unknown(key: Any, known: tuple[str, ...], where: str) -> str:
    message = f"unknown {where} key {_show(key)} (expected {', '.join(known)})"
    if isinstance(key, str):
        guess = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if guess:
            message += f"; did you mean '{guess[0]}'?"
    return message


def syntax_of(tree: Any) -> TopicSyntax:
    """The vhost's topic syntax: the ``topicTree``'s valid separator/wildcards, else ``/``+mqtt.

    Args:
        tree: the raw ``topicTree`` value (or None when the vhost has none).
    """
    if not isinstance(tree, Mapping):
        return TopicSyntax()
    sep = tree.get("separator", "/")
    wild = tree.get("wildcards", MQTT)
    return TopicSyntax(separator=sep if sep in SEPARATORS else "/",
                       wildcards=wild if wild in WILDCARD_SYNTAXES else MQTT)


def name_problem(name: str, syntax: TopicSyntax) -> str | None:
    """Why ``name`` cannot be a topic node name or system prefix, or None when it can.

    Wildcards are not allowed: in mqtt syntax no token may contain ``+`` or ``#`` (MQTT 4.7.1:
    topic names hold no wildcard characters); in amqp syntax no token may be ``*`` or ``#``
    (``a*`` is a literal token there, as in QDR address patterns).
    """
    for tok in syntax.split(name):
        if syntax.wildcards == MQTT and ("+" in tok or MANY_TOKEN in tok):
            return f"token '{tok}' holds a wildcard character ('+' or '#' in mqtt syntax)"
        if syntax.wildcards == AMQP and tok in ("*", MANY_TOKEN):
            return f"token '{tok}' is a wildcard ('*' or '#' in amqp syntax)"
    return None


def principal_problem(text: Any, groups: Mapping[str, frozenset[str]]) -> str | None:
    """Why ``text`` is not a valid principal entry, or None.

    Valid: a user name, ``@group`` naming a group of the vhost, ``*``; each with an optional
    single leading ``!``.

    Args:
        text: the entry as loaded.
        groups: the vhost's group names (-> listed users).
    """
    if not isinstance(text, str):
        return (f"principal {_show(text)} must be a string (a user name, '@group' or '*', "
                "optionally with a leading '!')")
    body = text[1:] if text.startswith(NOT) else text
    if not body:
        return ("empty principal" if not text else
                "'!' must be followed by a user name, '@group' or '*'")
    if body.startswith(NOT):
        return f"principal '{text}' has more than one leading '!'"
    if body.startswith(GROUP_PREFIX):
        group = body[1:]
        if not group:
            return f"principal '{text}': '@' must be followed by a group name"
        if group not in groups:
            names = ", ".join(sorted(groups)) or "none"
            message = f"principal '{text}' names no group of this vhost (groups: {names})"
            guess = difflib.get_close_matches(group, list(groups), n=1, cutoff=0.6)
            return f"{message}; did you mean '@{guess[0]}'?" if guess else message
    return None


def _principals(value: Any, groups: Mapping[str, frozenset[str]], path: str,
                issues: list[Issue]) -> PrincipalList | None:
    if isinstance(value, str):
        items: list[Any] = [x.strip() for x in value.split(",")]
        items = [x for x in items if x]
    elif isinstance(value, list):
        items = list(value)
    else:
        issues.append((ERROR, path, f"must be a list of principals (user names, '@group', '*', "
                                    f"'!' to deny), not {_show(value)}"))
        return None
    ok = True
    for i, item in enumerate(items):
        problem = principal_problem(item, groups)
        if problem is not None:
            issues.append((ERROR, f"{path}[{i}]", problem))
            ok = False
    return PrincipalList.compile(items, groups) if ok else None


def compile_topic_tree(value: Any, *, groups: Mapping[str, frozenset[str]]
                       ) -> tuple[TopicTree | None, list[Issue]]:
    """Validate and compile a vhost's ``topicTree``.

    Args:
        value: the raw ``topicTree`` value.
        groups: the vhost's group names -> users listed by name (``*`` excluded), for
            ``@group`` entries.

    Returns:
        ``(tree or None when there are errors, issues)``; issue paths are relative to
        ``topicTree`` (``.model``, ``.nodes['A/B'].publish[1]``).
    """
    issues: list[Issue] = []
    if not isinstance(value, Mapping):
        issues.append((ERROR, "", f"topicTree must be a mapping with 'model' and 'nodes', not "
                                  f"{_show(value)}"))
        return None, issues
    for key in value:
        if key not in TREE_KEYS:
            issues.append((ERROR, f".{key}", _unknown(key, TREE_KEYS, "topicTree")))
    model = None
    if "model" not in value:
        issues.append((ERROR, ".model", "topicTree needs a 'model': 'anyAncestor' (IBM MQ) or "
                                        "'nearestAcl' (WebSphere Message Broker)"))
    else:
        model = _choice(value["model"], MODELS, "model", ".model", issues)
    separator = _choice(value.get("separator", "/"), SEPARATORS, "separator", ".separator",
                        issues)
    wildcards = _choice(value.get("wildcards", MQTT), WILDCARD_SYNTAXES, "wildcards",
                        ".wildcards", issues)
    syntax = syntax_of(value)

    prefixes: list[tuple[str, ...]] = []
    raw_prefixes = value.get("systemPrefixes", [])
    if isinstance(raw_prefixes, str):
        raw_prefixes = [x.strip() for x in raw_prefixes.split(",") if x.strip()]
    if not isinstance(raw_prefixes, list):
        issues.append((ERROR, ".systemPrefixes", f"must be a list of address prefixes, not "
                                                 f"{_show(raw_prefixes)}"))
        raw_prefixes = []
    for i, item in enumerate(raw_prefixes):
        path = f".systemPrefixes[{i}]"
        if not isinstance(item, str):
            issues.append((ERROR, path, f"must be a string, not {_show(item)}"))
        elif not item:
            issues.append((ERROR, path, "an empty system prefix would exempt every address"))
        elif (problem := name_problem(item, syntax)) is not None:
            issues.append((ERROR, path, f"system prefix '{item}': {problem}"))
        else:
            prefixes.append(syntax.split(item))

    authorities = AUTHORITIES_BY_MODEL.get(model or NEAREST_ACL, NODE_KEYS)
    nodes: dict[tuple[str, ...], TreeNode] = {}
    raw_nodes = value.get("nodes", {})
    if not isinstance(raw_nodes, Mapping):
        issues.append((ERROR, ".nodes", f"must be a mapping of node name to ACL, not "
                                        f"{_show(raw_nodes)}"))
        raw_nodes = {}
    if not raw_nodes and model == ANY_ANCESTOR:
        issues.append((WARNING, ".nodes", "no nodes: anyAncestor grants nothing to anyone"))
    for name, acl in raw_nodes.items():
        path = f".nodes[{_show(name)}]"
        if not isinstance(name, str):
            issues.append((ERROR, path, f"node names must be strings, not {_show(name)}"))
            continue
        problem = name_problem(name, syntax)
        if problem is not None:
            issues.append((ERROR, path, f"node '{name}': {problem}; node names cannot hold "
                                        "wildcards"))
            continue
        if name and "" in syntax.split(name):
            issues.append((WARNING, path, f"node '{name}' has an empty token (leading, trailing "
                                          f"or doubled '{syntax.separator}'): it is a different "
                                          "node from the one without it"))
        if not isinstance(acl, Mapping):
            issues.append((ERROR, path, f"must be a mapping of authority to principals "
                                        f"({', '.join(authorities)}), not {_show(acl)}"))
            continue
        lists: dict[str, PrincipalList] = {}
        good = True
        for key, entries in acl.items():
            kpath = f"{path}.{key}"
            if key not in NODE_KEYS:
                issues.append((ERROR, kpath, _unknown(key, NODE_KEYS, "topic node")))
                good = False
                continue
            if key not in authorities:
                issues.append((ERROR, kpath, f"'{key}' is not an authority of the {model} model "
                                             "(only nearestAcl has 'persistent'; anyAncestor "
                                             "never rewrites durable)"))
                good = False
                continue
            if entries is None and not name and model == NEAREST_ACL:
                issues.append((ERROR, kpath, f"the root's '{key}' cannot be removed, only "
                                             "changed (e.g. [] denies everyone by default)"))
                good = False
                continue
            compiled = _principals(entries, groups, kpath, issues)
            if compiled is None:
                good = False
            else:
                lists[key] = compiled
        if not acl:
            issues.append((WARNING, path, f"node '{name}' defines no authority: it has no "
                                          "effect"))
        if good:
            nodes[syntax.split(name)] = TreeNode(name=name, acls=lists)

    if any(sev == ERROR for sev, _, _ in issues) or model is None or separator is None \
            or wildcards is None:
        return None, issues
    if model == NEAREST_ACL:
        root = nodes.get(())
        acls = dict(root.acls) if root is not None else {}
        for authority in AUTHORITIES_BY_MODEL[NEAREST_ACL]:
            if authority not in acls:
                acls[authority] = PrincipalList.compile(ROOT_DEFAULT, groups)
        nodes[()] = TreeNode(name="", acls=acls)
    return TopicTree(model=model, syntax=syntax, nodes=nodes,
                     system_prefixes=tuple(prefixes)), issues


def compile_filter(topic: str, syntax: TopicSyntax) -> tuple[Filter | None, str | None]:
    """Compile a permission rule's topic filter.

    MQTT ``+`` and ``#`` are wildcards in every vhost; with amqp wildcards ``*`` is a one-token
    wildcard too. ``#`` must be the last token; a wildcard must be a whole token (``a#`` is an
    error); ``${user}`` must be a whole token.

    Returns:
        ``(filter, None)`` or ``(None, problem)``.
    """
    if not topic:
        return None, "empty topic filter"
    ones = {"+", syntax.one}
    tokens = syntax.split(topic)
    out: list[Any] = []
    for i, tok in enumerate(tokens):
        if tok == MANY_TOKEN:
            if i != len(tokens) - 1:
                return None, f"'#' must be the last token of '{topic}'"
            out.append(MANY)
        elif tok in ones:
            out.append(ONE)
        elif tok == USER_TOKEN:
            out.append(USER)
        elif USER_TOKEN in tok:
            return None, f"'{USER_TOKEN}' must be a whole token, not part of '{tok}'"
        elif "+" in tok or MANY_TOKEN in tok:
            return None, (f"token '{tok}' of '{topic}': a wildcard must be a whole token "
                          f"(separator '{syntax.separator}')")
        else:
            out.append(tok)
    return tuple(out), None


def compile_permissions(rules: Any, default: Any, *, has_rules: bool, has_default: bool,
                        syntax: TopicSyntax) -> tuple[PermissionList | None, list[Issue]]:
    """Validate and compile a group's ``permissions`` and ``defaultBehaviour``.

    Args:
        rules: the raw ``permissions`` value (ignored unless ``has_rules``).
        default: the raw ``defaultBehaviour`` value (ignored unless ``has_default``).
        has_rules: the group has a ``permissions`` key.
        has_default: the group has a ``defaultBehaviour`` key.
        syntax: the vhost's separator and wildcard syntax (:func:`syntax_of`).

    Returns:
        ``(list or None, issues)``; the list is None when there are errors or neither key is
        present. Issue paths are relative to the group (``.permissions[1].qos[0]``).
    """
    issues: list[Issue] = []
    if not has_rules and not has_default:
        return None, issues
    behaviour = None
    if has_default:
        behaviour = _choice(default, DEFAULT_BEHAVIOURS, "defaultBehaviour", ".defaultBehaviour",
                            issues)
    compiled: list[PermissionRule] = []
    if has_rules and not isinstance(rules, list):
        issues.append((ERROR, ".permissions", f"must be a list of rules {{topic, activity, qos, "
                                              f"type}}, not {_show(rules)}"))
        rules = []
    for index, rule in enumerate(rules if has_rules else []):
        path = f".permissions[{index}]"
        if not isinstance(rule, Mapping):
            issues.append((ERROR, path, f"a rule must be a mapping {{topic, activity, qos, type}}, "
                                        f"not {_show(rule)}"))
            continue
        before = len(issues)
        for key in rule:
            if key not in RULE_KEYS:
                issues.append((ERROR, f"{path}.{key}", _unknown(key, RULE_KEYS, "permission rule")))
        flt = None
        if "topic" not in rule:
            issues.append((ERROR, f"{path}.topic", "a rule needs a 'topic' filter"))
        elif not isinstance(rule["topic"], str):
            issues.append((ERROR, f"{path}.topic", f"must be a string, not {_show(rule['topic'])}"))
        else:
            flt, problem = compile_filter(rule["topic"], syntax)
            if problem is not None:
                issues.append((ERROR, f"{path}.topic", problem))
        activity = kind = None
        for key, choices, target in (("activity", ACTIVITIES, "activity"), ("type", TYPES, "type")):
            if key not in rule:
                issues.append((ERROR, f"{path}.{key}",
                               f"a rule needs '{key}': " + " or ".join(f"'{c}'" for c in choices)))
                continue
            got = _choice(rule[key], choices, target, f"{path}.{key}", issues)
            if key == "activity":
                activity = got
            else:
                kind = got
        qos = frozenset(QOS_LEVELS)
        if "qos" in rule:
            raw = rule["qos"]
            if not isinstance(raw, list):
                issues.append((ERROR, f"{path}.qos", f"must be a list of QoS levels (0, 1, 2), "
                                                     f"not {_show(raw)}"))
            elif not raw:
                issues.append((ERROR, f"{path}.qos", "an empty qos list: the rule could never "
                                                     "match (leave 'qos' out for every level)"))
            else:
                levels: set[int] = set()
                for i, level in enumerate(raw):
                    if isinstance(level, bool) or level not in QOS_LEVELS:
                        issues.append((ERROR, f"{path}.qos[{i}]",
                                       f"QoS level must be 0, 1 or 2, not {_show(level)}"))
                    else:
                        levels.add(level)
                qos = frozenset(levels)
        if len(issues) == before and flt is not None and activity and kind:
            compiled.append(PermissionRule(index=index, topic=rule["topic"], filter=flt,
                                           activity=activity, qos=qos, allow=kind == "allow"))
    if any(sev == ERROR for sev, _, _ in issues):
        return None, issues
    return PermissionList(tuple(compiled), syntax, behaviour), issues
