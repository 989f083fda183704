"""The one "may the fast path take this frame" value per link, session and router side
(core/eligibility.py): its truth table, and two structural checks that make a new per-frame
feature feed it.

* Every attribute the fast loops (``FastPath.relay``, ``RouterSide.relay``) read on a link,
  session, the sessions or the rules is declared: an input of a computed value, or per-frame
  state. A loop that starts reading a new flag fails here until the flag is classified (and,
  if it is a feature, fed into the predicate).
* Every assignment to an input anywhere in ``core/`` happens in a function that calls the
  matching refresh; every ``rules.govern(...)`` (which sets the user-id check) is followed by
  ``refresh_links``. A feature that attaches without refreshing fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from amqp_policy_proxy.core import eligibility as E
from amqp_policy_proxy.core.records import LinkRecord

CORE = Path(__file__).resolve().parents[3] / "src" / "amqp_policy_proxy" / "core"
RECEIVERS = {"link", "session", "sessions", "all_sessions", "rules"}
REFRESH = {
    **{name: {"refresh_link", "refresh_links"} for name in E.LINK_INPUTS},
    **{name: {"refresh_session"} for name in E.SESSION_INPUTS},
    **{name: {"refresh_router", "refresh_links"} for name in E.ROUTER_INPUTS},
}
#: Where an input is set as a record's initial value (before any refresh can matter) or by
#: the rules themselves (their callers refresh: the govern check below).
INITIAL = {("records.py", "__init__"), ("sessions.py", "__init__"), ("rules.py", "__init__"),
           ("rules.py", "govern"), ("shaping.py", "__init__")}
#: Same name, another thing: a session's own ``shaping`` (its ShapedSession, which the router
#: side's Flow handler reads) is not the connection's ``Sessions.shaping`` input.
NOT_AN_INPUT = {("sessions.py", "on_client_begin", "shaping")}


def link(is_sender: bool = True, address: str | None = "q") -> LinkRecord:
    return LinkRecord("l", 0, is_sender, address)


@pytest.mark.parametrize(("setup", "uid", "expected"), [
    (lambda lk: None, None, E.FAST),
    (lambda lk: setattr(lk, "is_sender", False), None, E.NOT_FAST),
    (lambda lk: setattr(lk, "client_detached", True), None, E.NOT_FAST),
    (lambda lk: setattr(lk, "shaper", object()), None, E.NOT_FAST),
    (lambda lk: setattr(lk, "inspect", True), None, E.NOT_FAST),
    (lambda lk: setattr(lk, "inspect", True), b"alice", E.FAST_USER_ID),
    (lambda lk: (setattr(lk, "inspect", True), setattr(lk, "anonymous", True)), b"alice",
     E.NOT_FAST),
    (lambda lk: (setattr(lk, "inspect", True), setattr(lk, "by_subject", True)), b"alice",
     E.NOT_FAST),
    (lambda lk: (setattr(lk, "inspect", True), setattr(lk, "shaper", object())), b"alice",
     E.NOT_FAST),
])
def test_link_value(setup, uid: bytes | None, expected: int) -> None:
    lk = link()
    setup(lk)
    E.refresh_link(lk, uid)
    assert lk.fast == expected


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _calls(fn: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            out.append(f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else "")
    return out


@pytest.mark.parametrize(("module", "cls"), [("fastpath.py", "FastPath"),
                                             ("router_side.py", "RouterSide")])
def test_the_fast_loops_read_only_declared_flags(module: str, cls: str) -> None:
    tree = ast.parse((CORE / module).read_text())
    [relay] = [fn for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == cls
               for fn in c.body if isinstance(fn, ast.FunctionDef) and fn.name == "relay"]
    read = {node.attr for node in ast.walk(relay)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in RECEIVERS and isinstance(node.ctx, ast.Load)}
    declared = E.LINK_INPUTS | E.SESSION_INPUTS | E.ROUTER_INPUTS | E.PER_FRAME_STATE
    assert read - declared == set(), (
        f"{module} {cls}.relay reads {sorted(read - declared)}: a per-frame feature feeds "
        "core/eligibility.py (an input of a computed value), or per-frame state is declared "
        "in PER_FRAME_STATE")
    # and it does use the computed values
    assert "fast" in read or "router_fast" in read


def test_every_input_set_in_core_is_followed_by_its_refresh() -> None:
    missing = []
    for path in sorted(CORE.glob("*.py")):
        if path.name == "eligibility.py":
            continue
        tree = ast.parse(path.read_text())
        for fn in _functions(tree):
            if (path.name, fn.name) in INITIAL:
                continue
            calls = set(_calls(fn))
            for node in ast.walk(fn):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                           else [])
                for target in targets:
                    for t in ast.walk(target):
                        if (isinstance(t, ast.Attribute) and t.attr in REFRESH
                                and (path.name, fn.name, t.attr) not in NOT_AN_INPUT
                                and not calls & REFRESH[t.attr]):
                            missing.append(f"{path.name}:{t.lineno} {fn.name} sets "
                                           f".{t.attr} without {sorted(REFRESH[t.attr])}")
            if "govern" in calls and "refresh_links" not in calls:
                missing.append(f"{path.name} {fn.name} governs the rules without refresh_links")
    assert missing == []
