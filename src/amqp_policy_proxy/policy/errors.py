"""Sans-IO. Configuration issues and the exception that carries them.

A policy problem is never reported one at a time: the compiler collects every issue it finds
(QDR stops at the first error of a vhost) and raises a single :class:`PolicyError` at the end.
Denials of connections, sessions, links and messages are *not* errors: they are values returned
by :mod:`amqp_policy_proxy.policy.decisions`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ERROR = "error"
"""Severity of an issue that makes the policy unusable."""
WARNING = "warning"
"""Severity of an issue that is reported but does not stop the policy from loading."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigIssue:
    """One problem found while loading or compiling a policy.

    ``str(issue)`` is ``"FILE: PATH: MESSAGE"``, leaving out the parts that are empty, e.g.
    ``policy.d/a.json: vhost[photoserver].groups.admins.remoteHosts[2]: ...``.
    """

    file: str | None
    """The policy file the issue is in, as given to the loader; None for in-memory input."""
    path: str
    """Key path inside the file, e.g. ``vhost[photoserver].groups.admins.remoteHosts[2]``;
    empty when the issue concerns the whole file."""
    message: str
    """Human-readable description; QDR's own wording where QDR has one."""
    severity: str = ERROR
    """``"error"`` (the policy is rejected) or ``"warning"`` (reported, policy still loads)."""

    @property
    def is_error(self) -> bool:
        """True when the issue has severity ``"error"``."""
        return self.severity == ERROR

    def __str__(self) -> str:
        """Render as ``FILE: PATH: MESSAGE`` (missing parts left out)."""
        parts = [p for p in (self.file, self.path) if p]
        parts.append(self.message)
        return ": ".join(parts)


def format_issues(issues: Iterable[ConfigIssue]) -> str:
    """Render issues one per line, each prefixed with its severity.

    Args:
        issues: the issues, in the order they should be printed.

    Returns:
        Lines such as ``error: policy.d/a.json: vhost[x].maxConnections: ...``, joined with
        newlines; the empty string when there are no issues.
    """
    return "\n".join(f"{issue.severity}: {issue}" for issue in issues)


class PolicyError(Exception):
    """The policy is invalid; ``issues`` holds every issue found (errors and warnings).

    ``str(exc)`` names the number of errors and lists every one of them, then the warnings.
    """

    issues: tuple[ConfigIssue, ...]

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        """Build the exception.

        Args:
            issues: every issue collected while loading; at least one should be an error.
        """
        self.issues = tuple(issues)
        super().__init__(self._render())

    @property
    def errors(self) -> tuple[ConfigIssue, ...]:
        """The issues with severity ``"error"``."""
        return tuple(i for i in self.issues if i.is_error)

    @property
    def warnings(self) -> tuple[ConfigIssue, ...]:
        """The issues with severity ``"warning"``."""
        return tuple(i for i in self.issues if not i.is_error)

    def _render(self) -> str:
        errors = self.errors
        warnings = self.warnings
        noun = "error" if len(errors) == 1 else "errors"
        lines = [f"invalid policy: {len(errors)} {noun}"]
        lines.extend(format_issues(errors).splitlines())
        lines.extend(format_issues(warnings).splitlines())
        return "\n".join(lines)
