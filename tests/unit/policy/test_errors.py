"""policy/errors.py: issue rendering and PolicyError."""

from __future__ import annotations

from amqp_policy_proxy.policy.errors import ConfigIssue, PolicyError, format_issues
from amqp_policy_proxy.policy.load import format_issues as load_format_issues


def test_issue_str() -> None:
    issue = ConfigIssue(file="policy.d/a.json",
                        path="vhost[photoserver].groups.admins.remoteHosts[2]",
                        message="bad host", severity="error")
    assert str(issue) == "policy.d/a.json: vhost[photoserver].groups.admins.remoteHosts[2]: bad host"
    assert str(ConfigIssue(file=None, path="p", message="m", severity="warning")) == "p: m"
    assert str(ConfigIssue(file="f", path="", message="m", severity="error")) == "f: m"


def test_policy_error_lists_every_error() -> None:
    issues = [
        ConfigIssue(file="a", path="x", message="one", severity="error"),
        ConfigIssue(file="a", path="y", message="careful", severity="warning"),
        ConfigIssue(file="b", path="z", message="two", severity="error"),
    ]
    exc = PolicyError(issues)
    assert exc.issues == tuple(issues)
    assert [i.message for i in exc.errors] == ["one", "two"]
    assert str(exc) == ("invalid policy: 2 errors\nerror: a: x: one\nerror: b: z: two\n"
                        "warning: a: y: careful")
    assert format_issues(issues[:2]) == "error: a: x: one\nwarning: a: y: careful"
    assert load_format_issues is format_issues
    assert format_issues([]) == ""
