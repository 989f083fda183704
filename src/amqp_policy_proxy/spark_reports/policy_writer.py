"""Write recommended limits as policy files and a diff against the current policy. No Spark.

Layer: the capacity reports (driver side only). Here: the policy package's own reader
(:func:`amqp_policy_proxy.policy.load.read_documents` and :func:`~.load.parse_text`, so the
files are found and parsed exactly as ``check`` finds and parses them) and the standard
library (``json``, ``difflib``); PyYAML for YAML files.

:func:`write_policy` writes ``OUT/policy/``, a copy of the ``--policy`` file or directory
with the recommended limits set, the same files under the same names:

- **QDR JSON** files are edited in place: only the number of a changed key is replaced (a
  key the vhost or group does not set yet is inserted before its first key, with the same
  indentation), so comment lines, order, spacing and every other byte stay as written and the
  diff shows exactly the changed limits.
- **YAML** files are written again from their parsed content (PyYAML keeps no comments): the
  leading comment lines are kept, other comments are lost.

Without ``--policy`` (:func:`new_policy`) it writes ``OUT/policy/recommended.json``: one vhost per
vhost of the log with the recommended vhost limits and one group per group of the log
(its users as logged, ``remoteHosts: "*"``): a starting point to review, not a policy to
apply as it is. ``OUT/policy.diff`` is the unified diff of every changed file (``diff -u``
of the current file and the written one).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The settings a recommendation may change, all integers in the policy (vhost and group
#: keys), and where they may appear.
VHOST_SETTINGS = ("maxConnections", "maxConnectionsPerUser", "maxConnectionsPerHost",
                  "maxConnectionRate", "maxConnectionRatePerUser", "maxConnectionRatePerHost")
GROUP_SETTINGS = ("maxConnectionsPerUser", "maxConnectionsPerHost",
                  "maxConnectionRatePerUser", "maxConnectionRatePerHost")
#: Connection rates are an extension over QDR: they are changed only where the policy
#: already sets them (a recommendation never makes a QDR policy unloadable by QDR).
RATE_SETTINGS = frozenset({"maxConnectionRate", "maxConnectionRatePerUser",
                           "maxConnectionRatePerHost"})
NEW_POLICY_FILE = "recommended.json"


@dataclass(frozen=True)
class Change:
    """One recommended setting (a row of ``recommendations.csv``)."""

    vhost: str
    group: str
    """``""`` for a vhost setting."""
    setting: str
    recommended: int
    current: int | None = None
    """The configured value (``None`` when the policy does not set it)."""


@dataclass
class Written:
    """What :func:`write_policy` wrote."""

    directory: str
    """``OUT/policy``."""
    files: list[str] = field(default_factory=list)
    """Every file written (changed or copied), relative to ``directory``."""
    changed: list[str] = field(default_factory=list)
    """The files with a change."""
    applied: list[Change] = field(default_factory=list)
    """The changes made (rates the policy does not set, and values already equal, are not)."""
    diff: str = ""
    """The unified diff of the changed files."""


class PolicyWriteError(ValueError):
    """A policy file could not be read back or edited; ``str()`` names the file and why."""


# --------------------------------------------------------------------------------------------
# Positions of the values in a JSON text


@dataclass
class _Node:
    start: int
    end: int
    children: dict[str, _Node] | list[_Node] | None = None
    key_starts: dict[str, int] = field(default_factory=dict)
    """For objects: where each key's string starts."""


_WS = re.compile(r"[ \t\n\r]*")


def _blank_comments(text: str) -> str:
    # QDR's comment lines, replaced by spaces: the positions stay those of the file.
    return "\n".join(" " * len(line) if line.lstrip().startswith("#") else line
                     for line in text.split("\n"))


def _parse_node(s: str, i: int) -> _Node:
    dec = json.JSONDecoder()
    i = _WS.match(s, i).end()  # type: ignore[union-attr]
    c = s[i]
    if c == "{":
        node = _Node(i, i, {})
        j = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        if s[j] == "}":
            node.end = j + 1
            return node
        while True:
            j = _WS.match(s, j).end()  # type: ignore[union-attr]
            key, k_end = json.decoder.scanstring(s, j + 1)  # type: ignore[attr-defined]
            node.key_starts[key] = j
            j = _WS.match(s, k_end).end()  # type: ignore[union-attr]
            assert s[j] == ":"
            child = _parse_node(s, j + 1)
            assert isinstance(node.children, dict)
            node.children[key] = child
            j = _WS.match(s, child.end).end()  # type: ignore[union-attr]
            if s[j] == "}":
                node.end = j + 1
                return node
            j += 1  # ","
    if c == "[":
        node = _Node(i, i, [])
        j = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        if s[j] == "]":
            node.end = j + 1
            return node
        while True:
            child = _parse_node(s, j)
            assert isinstance(node.children, list)
            node.children.append(child)
            j = _WS.match(s, child.end).end()  # type: ignore[union-attr]
            if s[j] == "]":
                node.end = j + 1
                return node
            j += 1
    _, end = dec.raw_decode(s, i)
    return _Node(i, end)


def _vhost_entries(content: Any, root: _Node | None) -> list[tuple[dict[str, Any],
                                                                   _Node | None]]:
    """The vhost mappings of a parsed policy file, with their JSON nodes (QDR list of pairs,
    a list of mappings, or ``{"vhosts": [...]}``)."""
    out: list[tuple[dict[str, Any], _Node | None]] = []
    items, nodes = content, root
    if isinstance(content, dict) and isinstance(content.get("vhosts"), list):
        items = content["vhosts"]
        nodes = root.children["vhosts"] if root is not None and isinstance(
            root.children, dict) else None
    if not isinstance(items, list):
        return out
    kids = nodes.children if nodes is not None and isinstance(nodes.children, list) else None
    for n, item in enumerate(items):
        node = kids[n] if kids is not None else None
        if isinstance(item, list) and len(item) == 2 and item[0] == "vhost" \
                and isinstance(item[1], dict):
            sub = node.children[1] if node is not None and isinstance(node.children,
                                                                      list) else None
            out.append((item[1], sub))
        elif isinstance(item, dict) and "hostname" in item:
            out.append((item, node))
    return out


# --------------------------------------------------------------------------------------------
# Writing


def _edits_for(entry: dict[str, Any], node: _Node | None, changes: Sequence[Change],
               text: str, applied: list[Change]) -> list[tuple[int, int, str]]:
    """The text edits (start, end, replacement) setting ``changes`` in one vhost entry (and
    the same changes made to ``entry`` itself, for YAML)."""
    edits: list[tuple[int, int, str]] = []
    inserts: dict[int, list[str]] = {}
    for ch in changes:
        target, tnode = entry, node
        if ch.group:
            groups = entry.get("groups")
            if not isinstance(groups, dict) or not isinstance(groups.get(ch.group), dict):
                continue
            target = groups[ch.group]
            tnode = None
            if node is not None and isinstance(node.children, dict):
                gnode = node.children.get("groups")
                if gnode is not None and isinstance(gnode.children, dict):
                    tnode = gnode.children.get(ch.group)
        present = ch.setting in target
        if ch.setting in RATE_SETTINGS and not present:
            continue
        if present and target[ch.setting] == ch.recommended:
            continue
        target[ch.setting] = ch.recommended
        applied.append(ch)
        if tnode is None or not isinstance(tnode.children, dict):
            continue
        if present:
            v = tnode.children[ch.setting]
            edits.append((v.start, v.end, str(ch.recommended)))
        else:
            inserts.setdefault(tnode.start, []).append(f'"{ch.setting}": {ch.recommended}')
            if not tnode.children:
                continue
    for brace, items in inserts.items():
        # before the object's first key, with the spacing that precedes it
        obj = _find(node, brace)
        if obj is None or not isinstance(obj.children, dict):
            continue
        if obj.key_starts:
            first = min(obj.key_starts.values())
            gap = text[brace + 1:first]
            sep = gap if "\n" in gap else " "  # one key per line, or all on one line
            edits.append((first, first, "".join(f"{it},{sep}" for it in items)))
        else:
            edits.append((brace + 1, brace + 1, ", ".join(items)))
    return edits


def _find(node: _Node | None, start: int) -> _Node | None:
    if node is None:
        return None
    if node.start == start and isinstance(node.children, dict):
        return node
    kids = node.children.values() if isinstance(node.children, dict) else (node.children or [])
    for k in kids:
        found = _find(k, start)
        if found is not None:
            return found
    return None


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _yaml_text(original: str, content: Any) -> str:
    import yaml

    head = []
    for line in original.split("\n"):
        if line.lstrip().startswith("#") or not line.strip():
            head.append(line)
        else:
            break
    body = yaml.safe_dump(content, sort_keys=False, default_flow_style=False,
                          allow_unicode=True)
    return "\n".join(head).rstrip("\n") + ("\n" if any(h.strip() for h in head) else "") \
        + body


def unified_diff(old: str, new: str, name: str) -> str:
    """``diff -u a/NAME b/NAME`` of two texts, as ``patch -p1`` reads it (a last line
    without a newline is marked ``\\ No newline at end of file``)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    # difflib.unified_diff's matcher treats lines repeated in more than 1 % of a file of 200+
    # lines as junk ("remoteHosts": "*" in every group), and then shows unchanged lines as
    # changed: match without that heuristic, then format the hunks as diff -u does.
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out = [f"--- a/{name}\n", f"+++ b/{name}\n"]
    for group in matcher.get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += [" " + line for line in a[x1:x2]]
                continue
            out += ["-" + line for line in a[x1:x2]]
            out += ["+" + line for line in b[y1:y2]]
    if len(out) == 2:
        return ""
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in out)


def _range(start: int, stop: int) -> str:
    # a hunk's line range as diff -u writes it (1-based; an empty range names the line before)
    n = stop - start
    first = start + 1 if n else start
    return str(first) if n == 1 else f"{first},{n}"


def write_policy(policy_path: str | os.PathLike[str], changes: Iterable[Change],
                 out_dir: str | os.PathLike[str]) -> Written:
    """Write a copy of the policy at ``policy_path`` with ``changes`` applied.

    Args:
        policy_path: the ``--policy`` file or directory (it loaded: ``check`` accepted it).
        changes: the recommendations; those equal to the configured value, rates the policy
            does not set, and groups it does not define are skipped.
        out_dir: the report's output directory: ``OUT/policy/`` (replaced) and
            ``OUT/policy.diff`` are written.

    Returns:
        What was written.

    Raises:
        PolicyWriteError: a file that does not parse any more (changed since the load).
    """
    from amqp_policy_proxy.policy.load import parse_text, read_documents

    src = Path(policy_path)
    dest = Path(out_dir) / "policy"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    documents, issues = read_documents(src)
    if any(i.is_error for i in issues):
        raise PolicyWriteError("; ".join(f"{i.file}: {i.message}" for i in issues))
    by_vhost: dict[str, list[Change]] = {}
    for ch in changes:
        by_vhost.setdefault(ch.vhost, []).append(ch)
    result = Written(str(dest))
    diffs = []
    for name, _ in documents:
        if name is None:  # (in-memory documents only; read_documents names every file)
            continue
        path = Path(name)
        rel = path.name
        text = path.read_text(encoding="utf-8")
        is_yaml = path.suffix in (".yaml", ".yml")
        content, problem = parse_text(text, yaml_syntax=is_yaml)
        if problem is not None:
            raise PolicyWriteError(f"{name}: {problem}")
        root = None if is_yaml else _parse_node(_blank_comments(text), 0)
        edits: list[tuple[int, int, str]] = []
        before = len(result.applied)
        for entry, node in _vhost_entries(content, root):
            mine = by_vhost.get(str(entry.get("hostname")), [])
            if mine:
                edits += _edits_for(entry, node, mine, text, result.applied)
        changed = len(result.applied) > before
        new = (_yaml_text(text, content) if is_yaml else _apply(text, edits)) if changed \
            else text
        (dest / rel).write_text(new, encoding="utf-8")
        result.files.append(rel)
        if changed:
            result.changed.append(rel)
            diffs.append(unified_diff(text, new, rel))
    result.diff = "".join(diffs)
    Path(out_dir, "policy.diff").write_text(result.diff, encoding="utf-8")
    return result


def new_policy(changes: Iterable[Change], groups: Mapping[str, Mapping[str, Sequence[str]]],
               out_dir: str | os.PathLike[str]) -> Written:
    """Write a new policy with the recommended vhost limits (no ``--policy``).

    Args:
        changes: the vhost-level recommendations (group and rate rows are ignored: there is
            no group override and no rate without a policy).
        groups: per vhost, per group name as logged, its users as logged.
        out_dir: the report's output directory (``OUT/policy/recommended.json`` and an
            empty ``OUT/policy.diff``).

    Returns:
        What was written.
    """
    dest = Path(out_dir) / "policy"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    vhosts: dict[str, dict[str, Any]] = {}
    applied = []
    for ch in changes:
        if ch.group or ch.setting in RATE_SETTINGS or ch.setting not in VHOST_SETTINGS:
            continue
        vhosts.setdefault(ch.vhost, {"hostname": ch.vhost})[ch.setting] = ch.recommended
        applied.append(ch)
    entries = []
    for name in sorted(vhosts):
        v = vhosts[name]
        gs = groups.get(name, {})
        v["groups"] = {g: {"users": sorted(users), "remoteHosts": "*"}
                       for g, users in sorted(gs.items())} or {
            "$default": {"remoteHosts": "*"}}
        if not gs:
            v["allowUnknownUser"] = True
        entries.append(["vhost", v])
    text = ("# Recommended by amqp-policy-proxy report capacity (no --policy): vhost limits\n"
            "# from the event log; groups and users as logged, remoteHosts '*'. Review it.\n"
            + json.dumps(entries, indent=4) + "\n")
    (dest / NEW_POLICY_FILE).write_text(text, encoding="utf-8")
    Path(out_dir, "policy.diff").write_text("", encoding="utf-8")
    return Written(str(dest), [NEW_POLICY_FILE], [NEW_POLICY_FILE], applied, "")


def with_rate_currents(rows: list[dict[str, Any]], policy: Any) -> list[dict[str, Any]]:
    """Fill ``current`` and ``change`` of the connection-rate rows from the policy.

    Args:
        rows: recommendation rows (``vhost``, ``group``, ``setting``, ``current``,
            ``recommended``, ``change``); rate rows have no current value yet (the limit
            tables carry only the counts).
        policy: the compiled ``--policy`` (:class:`~amqp_policy_proxy.policy.model.Policy`),
            or None.

    Returns:
        The rows; a rate the vhost does not set keeps ``current`` empty (no rate: unlimited).
    """
    if policy is None:
        return rows
    attrs = {"maxConnectionRate": "max_connection_rate",
             "maxConnectionRatePerUser": "max_connection_rate_per_user",
             "maxConnectionRatePerHost": "max_connection_rate_per_host"}
    for r in rows:
        attr = attrs.get(r["setting"])
        v = policy.vhosts.get(r["vhost"]) if attr is not None else None
        if attr is None or v is None:
            continue
        cur = getattr(v, attr)
        r["current"] = cur
        rec = r["recommended"]
        r["change"] = None if cur is None else (
            "lower" if rec < cur else "raise" if rec > cur else "keep")
    return rows
