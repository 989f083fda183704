"""Reading policy files; the rest of loading is :func:`compile_policy` (sans-IO).

The only I/O of the policy package lives here: reading a policy directory or file. Accepted:

* QDR ``policyDir`` JSON (``*.json``): a list of ``[entityType, {attributes}]`` pairs. Lines
  whose first non-blank character is ``#`` are blanked before parsing (as QDR's loader does; line
  numbers in parse errors stay those of the file).
* YAML (``*.yaml``, ``*.yml``, safe loader) or plain JSON with the same keys: the list-of-pairs
  form, a list of vhost mappings, or ``{"vhosts": [...]}``.

A directory contributes every ``*.json``, ``*.yaml`` and ``*.yml`` file directly in it (not
recursive), sorted by name; dotfiles and other names (``*.json.in`` templates, backups) are
skipped. Host-name resolution is injected (``resolver``), never done here.

A vhost's DDS ``permissionsDocument`` / ``permissionsCa`` (docs/dds-permissions.md) are read here too,
relative to the directory of the policy file that names them, by :func:`load_dds_permissions`,
which the compiler calls through its ``dds_loader`` argument.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from amqp_policy_proxy.policy.compile import DdsLoader, Document, Resolver, compile_policy
from amqp_policy_proxy.policy.errors import (
    ERROR,
    WARNING,
    ConfigIssue,
    PolicyError,
    format_issues,
)
from amqp_policy_proxy.policy.model import Policy, PolicySettings
from amqp_policy_proxy.policy.topics.config import DdsLoadError

__all__ = ["load_policy", "compile_policy", "format_issues", "read_documents", "POLICY_SUFFIXES",
           "load_dds_permissions"]

POLICY_SUFFIXES = (".json", ".yaml", ".yml")
"""File name endings read from a policy directory."""


def load_policy(
    path: str | os.PathLike[str],
    settings: PolicySettings | None = None,
    *,
    resolver: Resolver | None = None,
    dds_loader: DdsLoader | None = None,
    allow_empty: bool = False,
) -> Policy:
    """Load, validate and compile a policy directory or file.

    Args:
        path: a directory (every ``*.json``, ``*.yaml``, ``*.yml`` directly in it, by name) or
            a single file (``.yaml``/``.yml`` read as YAML, anything else as JSON).
        settings: the global policy settings (daemon ``[policy]`` section); defaults apply when
            None.
        resolver: resolves ``remoteHosts`` host names at load time (e.g.
            :func:`amqp_policy_proxy.resolver.system_resolver`); without one, host names
            are errors.
        dds_loader: loads DDS permissions documents; default :func:`load_dds_permissions`.
        allow_empty: accept a policy that defines no vhost (a directory without policy files
            included): with vhost policy enabled every connection is then denied. Without it
            such a policy is an error (``check --allow-empty``, ``[policy] allow_empty``).

    Returns:
        The compiled policy; ``policy.warnings`` holds the non-fatal issues.

    Raises:
        PolicyError: unreadable or unparsable files, or any invalid content, or no vhost
            (unless ``allow_empty``); ``issues`` holds every issue of every file.
    """
    documents, read_issues = read_documents(path, allow_empty=allow_empty)
    try:
        policy = compile_policy(documents, settings, resolver=resolver,
                                dds_loader=dds_loader or load_dds_permissions)
    except PolicyError as exc:
        raise PolicyError([*read_issues, *exc.issues]) from None
    if any(i.is_error for i in read_issues):
        raise PolicyError([*read_issues, *policy.warnings])
    if not policy.vhosts and policy.settings.enable_vhost_policy and not allow_empty:
        raise PolicyError([*read_issues, _issue(
            str(path), "defines no vhost: every connection would be denied (no vhost); "
                       "if that is intended, use check --allow-empty or [policy] "
                       "allow_empty = true"), *policy.warnings])
    if read_issues:
        policy = replace(policy, warnings=(*read_issues, *policy.warnings))
    return policy


def load_dds_permissions(policy_file: str | None, document: str, ca: str) -> tuple[Any, str]:
    """Load and verify a vhost's DDS permissions document (the compiler's ``dds_loader``).

    Args:
        policy_file: the policy file naming the document; relative paths are resolved against
            its directory (against the working directory when None).
        document: ``permissionsDocument`` as written (S/MIME-signed XML).
        ca: ``permissionsCa`` as written (PEM).

    Returns:
        ``(permissions, fingerprint)``: the verified, compiled
        ``amqp_policy_proxy.policy.topics.dds.DdsPermissions`` and a SHA-256 of both files
        (so the policy digest changes when a document is replaced).

    Raises:
        DdsLoadError: the files cannot be read, the signature is missing, not by the CA or
            broken, or the XML is invalid; ``reason`` is the DDS loader's precise reason.
    """
    try:
        from amqp_policy_proxy.policy.topics import dds
    except ImportError as exc:  # pragma: no cover - the module ships with the package
        raise DdsLoadError(f"DDS permissions support is not available: {exc}") from None
    base = Path(policy_file).parent if policy_file else Path()
    doc_path, ca_path = base / document, base / ca
    try:
        permissions = dds.load_permissions(doc_path, ca_path)
    except dds.DdsError as exc:
        detail = f" ({exc.detail})" if exc.detail else ""
        raise DdsLoadError(f"{exc.reason}{detail}") from None
    except OSError as exc:
        raise DdsLoadError(f"cannot read: {exc.strerror or exc}") from None
    digest = hashlib.sha256()
    try:
        for path in (doc_path, ca_path):
            digest.update(path.read_bytes())
    except OSError as exc:  # replaced between the load and now
        raise DdsLoadError(f"cannot read: {exc.strerror or exc}") from None
    return permissions, digest.hexdigest()[:16]


def read_documents(path: str | os.PathLike[str], *, allow_empty: bool = False
                   ) -> tuple[list[Document], list[ConfigIssue]]:
    """Read and parse the policy files under ``path`` without compiling them.

    Args:
        path: a policy directory or file.
        allow_empty: a directory without policy files is a warning, not an error.

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
            issues.append(_issue(str(root), "no policy files (*.json, *.yaml, *.yml) in directory",
                                 WARNING if allow_empty else ERROR))
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
        import yaml  # here, not at the top: a daemon with JSON policy never pays for PyYAML

        try:
            return yaml.safe_load(text), None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            if (getattr(exc, "context", None) == "while scanning an alias"
                    or problem.startswith("found undefined alias")):
                problem += (" (a value starting with '*' is a YAML alias: quote it, e.g. "
                            "users: '*' or remoteHosts: '*')")
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

