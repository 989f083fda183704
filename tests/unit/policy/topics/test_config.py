"""policy/topics/config.py through the compiler: every topic-key problem, with its key path,
collected in one run; DDS documents wired in through the loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.errors import PolicyError
from amqp_policy_proxy.policy.load import load_policy
from amqp_policy_proxy.policy.topics.config import DdsLoadError, compile_filter
from amqp_policy_proxy.policy.topics.filters import MANY, ONE, USER, TopicSyntax

from .helpers import OPEN, policy, who


def errors(vhost: dict[str, Any], **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        policy(vhost, **kw)
    assert all(i.file == "topics.json" for i in info.value.errors)
    return [(i.path, i.message) for i in info.value.errors]


def test_every_topic_tree_problem_is_reported_with_its_path() -> None:
    found = errors({
        "hostname": "v",
        "topicTree": {
            "model": "nearest",
            "separator": ":",
            "wildcards": "MQTT",
            "systemPrefixes": ["$SYS", "", "$SYS/+", 7],
            "node": {},
            "nodes": {
                "A/+": {"publish": ["*"]},
                "A/b#": {"publish": ["*"]},
                "B": {"publish": ["joe", 3, "@nogroup", "!", "!!x", "@", "@staf"],
                      "subscribe": "*", "persist": ["*"]},
                "C": ["joe"],
                "D": {"publish": None},
            },
        },
        "groups": {"staff": {"users": "*", **OPEN}},
    })
    assert found == [
        ("vhost[v].topicTree.node",
         "unknown topicTree key 'node' (expected model, separator, wildcards, systemPrefixes, "
         "nodes); did you mean 'nodes'?"),
        ("vhost[v].topicTree.model",
         "model must be 'anyAncestor' or 'nearestAcl', not 'nearest'; did you mean 'nearestAcl'?"),
        ("vhost[v].topicTree.separator", "separator must be '/' or '.', not ':'"),
        ("vhost[v].topicTree.wildcards",
         "wildcards must be 'mqtt' or 'amqp', not 'MQTT'; write 'mqtt' (lowercase)"),
        ("vhost[v].topicTree.systemPrefixes[1]",
         "an empty system prefix would exempt every address"),
        ("vhost[v].topicTree.systemPrefixes[2]",
         "system prefix '$SYS/+': token '+' holds a wildcard character ('+' or '#' in mqtt "
         "syntax)"),
        ("vhost[v].topicTree.systemPrefixes[3]", "must be a string, not 7"),
        ("vhost[v].topicTree.nodes['A/+']",
         "node 'A/+': token '+' holds a wildcard character ('+' or '#' in mqtt syntax); node "
         "names cannot hold wildcards"),
        ("vhost[v].topicTree.nodes['A/b#']",
         "node 'A/b#': token 'b#' holds a wildcard character ('+' or '#' in mqtt syntax); node "
         "names cannot hold wildcards"),
        ("vhost[v].topicTree.nodes['B'].publish[1]",
         "principal 3 must be a string (a user name, '@group' or '*', optionally with a leading "
         "'!')"),
        ("vhost[v].topicTree.nodes['B'].publish[2]",
         "principal '@nogroup' names no group of this vhost (groups: staff)"),
        ("vhost[v].topicTree.nodes['B'].publish[3]",
         "'!' must be followed by a user name, '@group' or '*'"),
        ("vhost[v].topicTree.nodes['B'].publish[4]", "principal '!!x' has more than one leading '!'"),
        ("vhost[v].topicTree.nodes['B'].publish[5]",
         "principal '@': '@' must be followed by a group name"),
        ("vhost[v].topicTree.nodes['B'].publish[6]",
         "principal '@staf' names no group of this vhost (groups: staff); did you mean '@staff'?"),
        ("vhost[v].topicTree.nodes['B'].persist",
         "unknown topic node key 'persist' (expected publish, subscribe, persistent); did you "
         "mean 'persistent'?"),
        ("vhost[v].topicTree.nodes['C']",
         "must be a mapping of authority to principals (publish, subscribe, persistent), not "
         "['joe']"),
        ("vhost[v].topicTree.nodes['D'].publish",
         "must be a list of principals (user names, '@group', '*', '!' to deny), not None"),
    ]


def test_model_specific_problems() -> None:
    assert errors({"hostname": "v", "topicTree": {"nodes": {}}}) == [
        ("vhost[v].topicTree.model", "topicTree needs a 'model': 'anyAncestor' (IBM MQ) or "
                                     "'nearestAcl' (WebSphere Message Broker)")]
    assert errors({"hostname": "v", "topicTree": {
        "model": "anyAncestor", "nodes": {"A": {"persistent": ["*"]}}}}) == [
        ("vhost[v].topicTree.nodes['A'].persistent",
         "'persistent' is not an authority of the anyAncestor model (only nearestAcl has "
         "'persistent'; anyAncestor never rewrites durable)")]
    assert errors({"hostname": "v", "topicTree": {
        "model": "nearestAcl", "nodes": {"": {"subscribe": None}}}}) == [
        ("vhost[v].topicTree.nodes[''].subscribe",
         "the root's 'subscribe' cannot be removed, only changed (e.g. [] denies everyone by "
         "default)")]
    assert errors({"hostname": "v", "topicTree": ["A"]}) == [
        ("vhost[v].topicTree", "topicTree must be a mapping with 'model' and 'nodes', not "
                               "['A']")]
    # amqp syntax: '*' and '#' tokens are wildcards, 'a*' is a literal token.
    assert errors({"hostname": "v", "topicTree": {
        "model": "nearestAcl", "separator": ".", "wildcards": "amqp",
        "nodes": {"a.*": {}, "a*.b": {"publish": []}}}}) == [
        ("vhost[v].topicTree.nodes['a.*']", "node 'a.*': token '*' is a wildcard ('*' or '#' "
                                            "in amqp syntax); node names cannot hold wildcards")]


def test_tree_warnings_do_not_reject_the_policy() -> None:
    pol = policy({"hostname": "v", "topicTree": {"model": "anyAncestor", "nodes": {
        "A": {}, "/B": {"publish": ["*"]}}}})
    assert [(w.path, w.message) for w in pol.warnings] == [
        ("vhost[v].topicTree.nodes['A']", "node 'A' defines no authority: it has no effect"),
        ("vhost[v].topicTree.nodes['/B']",
         "node '/B' has an empty token (leading, trailing or doubled '/'): it is a different "
         "node from the one without it"),
    ]


def test_every_permission_problem_is_reported_with_its_path() -> None:
    found = errors({"hostname": "v", "groups": {
        "devices": {"users": "*", **OPEN, "defaultBehaviour": "DENY", "permissions": [
            {"topic": "a/#/b", "activity": "all", "type": "allow"},
            {"topic": "a/b#", "activity": "publish", "type": "allow"},
            {"topic": "x${user}/#", "activity": "read", "type": "permit"},
            {"topic": "", "activity": "all", "type": "deny", "qos": [0, 3, True]},
            {"activity": "all", "qos": 1},
            {"topic": "ok", "activity": "all", "type": "allow", "qos": [], "retain": True},
            "admin/#",
        ]},
        "other": {"users": "bob", **OPEN, "permissions": {"topic": "#"}},
    }})
    base = "vhost[v].groups.devices"
    assert found == [
        (f"{base}.defaultBehaviour",
         "defaultBehaviour must be 'allow' or 'deny', not 'DENY'; write 'deny' (lowercase)"),
        (f"{base}.permissions[0].topic", "'#' must be the last token of 'a/#/b'"),
        (f"{base}.permissions[1].topic",
         "token 'b#' of 'a/b#': a wildcard must be a whole token (separator '/')"),
        (f"{base}.permissions[2].topic", "'${user}' must be a whole token, not part of "
                                         "'x${user}'"),
        (f"{base}.permissions[2].activity",
         "activity must be 'publish' or 'subscribe' or 'all', not 'read'"),
        (f"{base}.permissions[2].type", "type must be 'allow' or 'deny', not 'permit'"),
        (f"{base}.permissions[3].topic", "empty topic filter"),
        (f"{base}.permissions[3].qos[1]", "QoS level must be 0, 1 or 2, not 3"),
        (f"{base}.permissions[3].qos[2]", "QoS level must be 0, 1 or 2, not True"),
        (f"{base}.permissions[4].topic", "a rule needs a 'topic' filter"),
        (f"{base}.permissions[4].type", "a rule needs 'type': 'allow' or 'deny'"),
        (f"{base}.permissions[4].qos", "must be a list of QoS levels (0, 1, 2), not 1"),
        (f"{base}.permissions[5].retain",
         "unknown permission rule key 'retain' (expected topic, activity, qos, type)"),
        (f"{base}.permissions[5].qos",
         "an empty qos list: the rule could never match (leave 'qos' out for every level)"),
        (f"{base}.permissions[6]",
         "a rule must be a mapping {topic, activity, qos, type}, not 'admin/#'"),
        ("vhost[v].groups.other.permissions",
         "must be a list of rules {topic, activity, qos, type}, not {'topic': '#'}"),
    ]


def test_compile_filter() -> None:
    mqtt, amqp = TopicSyntax("/", "mqtt"), TopicSyntax(".", "amqp")
    assert compile_filter("${user}/+/#", mqtt) == ((USER, ONE, MANY), None)
    assert compile_filter("a/*/b", mqtt) == (("a", "*", "b"), None)  # '*' literal in mqtt
    assert compile_filter("a.*.+.#", amqp) == (("a", ONE, ONE, MANY), None)
    assert compile_filter("a*.b", amqp) == (("a*", "b"), None)


def test_no_model_means_no_authorizer_and_a_model_reaches_every_group() -> None:
    plain = policy({"hostname": "v", "groups": {"g": {"users": "*", **OPEN}}})
    assert plain.vhosts["v"].groups["g"].topics is None
    pol = policy({"hostname": "v", "topicTree": {"model": "nearestAcl"}, "groups": {
        "g": {"users": "*", **OPEN}, "h": {"users": "bob", **OPEN, "permissions": []}}})
    g, h = pol.vhosts["v"].groups["g"].topics, pol.vhosts["v"].groups["h"].topics
    assert g is not None and g.models == ("topicTree",)
    assert h is not None and h.models == ("topicTree", "permissions")
    assert g.tree is h.tree  # one tree per vhost
    only_perms = policy({"hostname": "v", "groups": {
        "g": {"users": "*", **OPEN}, "h": {"users": "bob", **OPEN, "permissions": []}}})
    assert only_perms.vhosts["v"].groups["g"].topics is None
    assert only_perms.vhosts["v"].groups["h"].topics is not None


# ---------------------------------------------------------------------------- DDS wiring


class StandIn:
    """Same shape as ``policy.topics.dds.DdsPermissions``."""

    def check(self, subject: str | None, user: str, activity: str, topic: str,
              wall_now: float) -> Any:
        return type("V", (), {"allowed": user == "alice",
                              "decided_by": f"dds grant 'alice' checked for {user}"})()


DDS_VHOST = {"hostname": "v", "permissionsDocument": "dds/p.p7s", "permissionsCa": "dds/ca.pem",
             "groups": {"g": {"users": "*", **OPEN}}}


def test_dds_document_is_loaded_through_the_loader() -> None:
    calls: list[tuple[Any, ...]] = []

    def loader(file: str | None, document: str, ca: str) -> tuple[Any, str]:
        calls.append((file, document, ca))
        return StandIn(), "f1"

    pol = policy(DDS_VHOST, dds_loader=loader)
    assert calls == [("topics.json", "dds/p.p7s", "dds/ca.pem")]
    topics = pol.vhosts["v"].groups["g"].topics
    assert topics is not None and topics.models == ("dds",)
    assert topics.check_publish(who("alice", "g"), "t", qos=1, wall_now=0).allowed
    assert not topics.check_publish(who("bob", "g"), "t", qos=1, wall_now=0).allowed
    # The document's fingerprint is part of the policy digest.
    other = policy(DDS_VHOST, dds_loader=lambda *a: (StandIn(), "f2"))
    assert other.digest != pol.digest


def test_dds_problems_are_policy_issues() -> None:
    def broken(file: str | None, document: str, ca: str) -> tuple[Any, str]:
        raise DdsLoadError("signature does not verify: the document was tampered with")

    assert errors(DDS_VHOST, dds_loader=broken) == [
        ("vhost[v].permissionsDocument",
         "cannot load DDS permissions document 'dds/p.p7s': signature does not verify: the "
         "document was tampered with")]
    assert errors(DDS_VHOST) == [
        ("vhost[v].permissionsDocument",
         "cannot load DDS permissions documents here (no loader: load the policy from files)")]
    no_ca = {k: v for k, v in DDS_VHOST.items() if k != "permissionsCa"}
    assert errors(no_ca, dds_loader=broken) == [
        ("vhost[v].permissionsDocument",
         "permissionsDocument needs permissionsCa: the CA certificate (PEM) that signed the "
         "document")]
    no_doc = {k: v for k, v in DDS_VHOST.items() if k != "permissionsDocument"}
    assert errors(no_doc) == [
        ("vhost[v].permissionsCa", "permissionsCa without permissionsDocument has no effect")]
    assert errors({**DDS_VHOST, "permissionsDocument": 3}, dds_loader=broken) == [
        ("vhost[v].permissionsDocument", "permissionsDocument must be a non-empty file path, "
                                         "not 3")]


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")

DOCUMENT = """<?xml version="1.0" encoding="UTF-8"?>
<dds><permissions>
  <grant name="alice">
    <subject_name>CN=alice</subject_name>
    <validity><not_before>2025-01-01T00:00:00</not_before>
              <not_after>2027-01-01T00:00:00</not_after></validity>
    <allow_rule><domains><id>0</id></domains>
      <publish><topics><topic>sensors/*</topic></topics></publish></allow_rule>
    <default>DENY</default>
  </grant>
</permissions></dds>
"""


@needs_openssl
def test_load_policy_reads_a_signed_document_relative_to_the_policy_file(tmp_path: Path) -> None:
    dds_support = pytest.importorskip("tests.support.dds")
    (tmp_path / "dds").mkdir()
    ca_cert, ca_key = dds_support.make_ca(tmp_path / "dds")
    signed = dds_support.sign_permissions(DOCUMENT, ca_cert, ca_key, tmp_path / "dds" / "p.p7s")
    vhost = {"hostname": "v", "permissionsDocument": "dds/p.p7s",
             "permissionsCa": f"dds/{ca_cert.name}", "groups": {"g": {"users": "*", **OPEN}}}
    policy_file = tmp_path / "v.json"
    policy_file.write_text(json.dumps([["vhost", vhost]]))
    pol = load_policy(policy_file)
    topics = pol.vhosts["v"].groups["g"].topics
    assert topics is not None
    inside, after = 1767225600.0 - 86400 * 200, 1830000000.0  # 2025-06, 2027-12
    assert topics.check_publish(who("alice", "g"), "sensors/t", qos=1, wall_now=inside).allowed
    late = topics.check_publish(who("alice", "g"), "sensors/t", qos=1, wall_now=after)
    assert not late.allowed and late.model == "dds" and "outside validity" in late.decided_by
    # A tampered document is refused, the issue names the key, the reload keeps nothing of it.
    dds_support.tamper(signed)
    with pytest.raises(PolicyError) as info:
        load_policy(policy_file)
    [issue] = info.value.errors
    assert (issue.file, issue.path) == (str(policy_file), "vhost[v].permissionsDocument")
    assert issue.message.startswith("cannot load DDS permissions document 'dds/p.p7s': ")


def test_compile_policy_without_dds_keys_never_calls_the_loader() -> None:
    def loader(*args: Any) -> tuple[Any, str]:
        raise AssertionError("not needed")

    compile_policy([(None, [{"hostname": "v"}])], dds_loader=loader)
