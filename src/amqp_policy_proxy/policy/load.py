"""Reading policy files; the rest of loading is :func:`compile_policy` (sans-IO).

The only I/O of the policy package lives here: reading a policy directory or file. Accepted:

* QDR ``policyDir`` JSON (``*.json``): a list of ``[entityType, {attributes}]`` pairs. Lines
  whose first non-blank character is ``#`` are blanked before parsing (QDR-POLICY 1.6; line
  numbers in parse errors stay those of the file).
* YAML (``*.yaml``, ``*.yml``, safe loader) or plain JSON with the same keys: the list-of-pairs
  form, a list of vhost mappings, or ``{"vhosts": [...]}``.

A directory contributes every ``*.json``, ``*.yaml`` and ``*.yml`` file directly in it (not
recursive), sorted by name; dotfiles and other names (``*.json.in`` templates, backups) are
skipped. Host-name resolution is injected (``resolver``), never done here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from amqp_policy_proxy.policy.compile import Document, Resolver, compile_policy
from amqp_policy_proxy.policy.errors import (
    ERROR,
    ConfigIssue,
    PolicyError,
    format_issues,
)
from amqp_policy_proxy.policy.model import Policy, PolicySettings

__all__ = ["load_policy", "compile_policy", "format_issues", "read_documents", "POLICY_SUFFIXES"]

POLICY_SUFFIXES = (".json", ".yaml", ".yml")
"""File name endings read from a policy directory."""


def load_policy(
    path: str | os.PathLike[str],
    settings: PolicySettings | None = None,
    *,
    resolver: Resolver | None = None,
) -> Policy:
    """Load, validate and compile a policy directory or file.

    Args:
        path: a directory (every ``*.json``, ``*.yaml``, ``*.yml`` directly in it, by name) or
            a single file (``.yaml``/``.yml`` read as YAML, anything else as JSON).
        settings: the global policy settings (daemon ``[policy]`` section); defaults apply when
            None.
        resolver: resolves ``remoteHosts`` host names at load time (e.g.
            :func:`amqp_policy_proxy.daemon.resolver.system_resolver`); without one, host names
            are errors.

    Returns:
        The compiled policy; ``policy.warnings`` holds the non-fatal issues.

    Raises:
        PolicyError: unreadable or unparsable files, or any invalid content; ``issues`` holds
            every issue of every file.
    """
    documents, read_issues = read_documents(path)
    try:
        policy = compile_policy(documents, settings, resolver=resolver)
    except PolicyError as exc:
        raise PolicyError([*read_issues, *exc.issues]) from None
    if any(i.is_error for i in read_issues):
        raise PolicyError([*read_issues, *policy.warnings])
    if read_issues:
        policy = replace(policy, warnings=(*read_issues, *policy.warnings))
    return policy


def read_documents(path: str | os.PathLike[str]) -> tuple[list[Document], list[ConfigIssue]]:
    """Read and parse the policy files under ``path`` without compiling them.

    Args:
        path: a policy directory or file.

    Returns:
        ``(documents, issues)``: the parsed ``(file name, content)`` pairs of every file that
        could be parsed, and the issues of the others (file missing, unreadable, bad syntax).
    """
    root = Path(path)
    issues: list[ConfigIssue] = []
    documents: list[Document] = []
    if root.is_dir():
        try:
            files = sorted(
                p for p in root.iterdir()
                if p.is_file() and not p.name.startswith(".") and p.name.endswith(POLICY_SUFFIXES)
            )
        except OSError as exc:
            issues.append(_issue(str(root), f"cannot list directory: {exc.strerror or exc}"))
            return documents, issues
        if not files:
            issues.append(_issue(str(root), "no policy files (*.json, *.yaml, *.yml) in directory"))
    elif root.exists():
        files = [root]
    else:
        issues.append(_issue(str(root), "no such file or directory"))
        files = []
    for file in files:
        name = str(file)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            issues.append(_issue(name, f"cannot read: {exc}"))
            continue
        content, problem = parse_text(text, yaml_syntax=file.suffix in (".yaml", ".yml"))
        if problem is not None:
            issues.append(_issue(name, problem))
            continue
        documents.append((name, content))
    return documents, issues


def parse_text(text: str, *, yaml_syntax: bool) -> tuple[Any, str | None]:
    """Parse one policy file's text.

    Args:
        text: the file content.
        yaml_syntax: True for YAML (safe loader); False for QDR JSON, whose ``#`` comment
            lines are blanked first.

    Returns:
        ``(content, None)`` on success, ``(None, message)`` on a syntax error; the message
        names the line and column.
    """
    if yaml_syntax:
        try:
            return yaml.safe_load(text), None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            return None, f"invalid YAML: {where}{problem}"
    try:
        return json.loads(strip_comment_lines(text), object_pairs_hook=_no_duplicates), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
    except _DuplicateKey as exc:
        return None, f"invalid JSON: duplicate key '{exc.args[0]}' in one object"


def strip_comment_lines(text: str) -> str:
    """Blank every line whose first non-blank character is ``#`` (QDR's config loader).

    Lines are blanked, not removed, so JSON error positions still match the file.
    """
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.split("\n"))


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _issue(file: str, message: str, severity: str = ERROR) -> ConfigIssue:
    return ConfigIssue(file=file, path="", message=message, severity=severity)

