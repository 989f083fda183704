"""A ledger that answers later (``LEDGER_PENDING``): the decision waits in DECIDING, with the
client's pipelined frames and the router's frames held, and finishes exactly as an immediate
answer would once ``ProxyConnection.ledger_answered`` feeds it (docs/decisions/0006)."""

from __future__ import annotations

from typing import Any

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.admission import LEDGER_PENDING
from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionDenied
from amqp_policy_proxy.core.state import ClientState
from amqp_policy_proxy.policy.reasons import ConnectionDenyReason

from .helpers import Begin, Open, Script, frame, make_policy

POLICY = make_policy({"$default": {"users": "*", "remoteHosts": "*", "sources": "*",
                                   "targets": "*"}}, allowUnknownUser=True)


class LaterLedger:
    """Answers every admission later; records what was asked and released."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.released: list[str] = []

    def try_admit(self, conn_id: str, **kw: Any) -> Any:
        self.asked.append({"conn_id": conn_id, **kw})
        return LEDGER_PENDING

    def release(self, conn_id: str) -> bool:
        self.released.append(conn_id)
        return True


def waiting() -> tuple[Script, LaterLedger]:
    ledger = LaterLedger()
    s = Script(POLICY, ledger=ledger)  # type: ignore[arg-type]
    s.sasl_plain("alice")
    s.client(C.AMQP_HEADER)
    s.router(C.AMQP_HEADER)
    s.take(Side.ROUTER), s.take(Side.CLIENT)
    s.client(frame(0, Open(container_id="x", hostname="test"))
             + frame(0, Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)))
    return s, ledger


def test_pending_answer_holds_everything_then_admits_in_order() -> None:
    s, ledger = waiting()
    assert [a["user"] for a in ledger.asked] == ["alice"]
    assert s.conn.sides.client is ClientState.DECIDING
    assert not s.conn.view.decided  # the handshake deadline still runs
    assert s.conn.get_timer() == 10.0
    assert s.take(Side.ROUTER) == []  # neither the Open nor the Begin went out
    s.router(frame(0, Open(container_id="r")))  # the router's Open is held too
    assert s.take(Side.CLIENT) == []
    s._run(s.conn.ledger_answered(None, 0.5))
    assert [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)] == ["Open", "Begin"]
    assert [type(p).__name__ for _, p, _ in s.take(Side.CLIENT)] == ["Open"]
    assert any(isinstance(e, ConnectionApproved) for e in s.events)
    assert s.conn.view.decided
    s._run(s.conn.connection_lost(Side.CLIENT, 1.0))
    assert ledger.released == ["c1"]


def test_pending_denial_is_qdrs_denial_naming_the_scope() -> None:
    s, ledger = waiting()
    s._run(s.conn.ledger_answered(ConnectionDenyReason.USER_LIMIT, 0.5))
    frames = s.take(Side.CLIENT)
    assert [(type(p).__name__, getattr(getattr(p, "error", None), "description", None))
            for _, p, _ in frames] == [("Open", None),
                                       ("Close", "connection disallowed by local policy")]
    assert s.take(Side.ROUTER) == []
    assert [str(e.reason) for e in s.events if isinstance(e, ConnectionDenied)] == ["user_limit"]
    s._run(s.conn.connection_lost(Side.CLIENT, 1.0))
    assert ledger.released == []  # a denied connection was never counted


def test_client_gone_while_pending_releases_and_a_late_answer_is_ignored() -> None:
    s, ledger = waiting()
    s._run(s.conn.connection_lost(Side.CLIENT, 0.2))
    assert ledger.released == ["c1"]  # the ledger uncounts it when its answer comes
    assert s.conn.ledger_answered(None, 0.5) == []
    assert not any(isinstance(e, ConnectionApproved) for e in s.events)


def test_handshake_timeout_while_pending_refuses_and_ignores_the_answer() -> None:
    s, ledger = waiting()
    s._run(s.conn.handle_timer(10.0))
    assert [str(e.reason) for e in s.events if isinstance(e, ConnectionDenied)] == [
        "handshake_timeout"]
    assert s.conn.ledger_answered(None, 10.1) == []
    s._run(s.conn.connection_lost(Side.CLIENT, 10.2))
    assert ledger.released == ["c1"]


def test_pending_answer_in_shadow_mode_admits_and_reports_the_would_be_denial() -> None:
    """In a shadow vhost the ledger is asked with ``enforce=False``; its later answer naming
    a limit admits the connection (counted: released at the end) and reports it shadowed."""
    from amqp_policy_proxy.core.events import OpenDecided, ShadowDenied

    ledger = LaterLedger()
    shadow_policy = make_policy({"$default": {"users": "*", "remoteHosts": "*"}},
                                allowUnknownUser=True, enforcement="shadow")
    s = Script(shadow_policy, ledger=ledger)  # type: ignore[arg-type]
    s.sasl_plain("alice")
    s.client(C.AMQP_HEADER)
    s.router(C.AMQP_HEADER)
    s.take(Side.ROUTER), s.take(Side.CLIENT)
    s.client(frame(0, Open(container_id="x", hostname="test")))
    assert ledger.asked[0]["enforce"] is False
    s._run(s.conn.ledger_answered(ConnectionDenyReason.USER_LIMIT, 0.5))
    assert [type(p).__name__ for _, p, _ in s.take(Side.ROUTER)] == ["Open"]
    assert [(e.kind, str(e.reason)) for e in s.events if isinstance(e, ShadowDenied)] == [
        ("connection", "user_limit")]
    assert [(e.decision, e.reason, e.enforcement) for e in s.events
            if isinstance(e, OpenDecided)] == [("allow", "user_limit", "shadow")]
    s._run(s.conn.connection_lost(Side.CLIENT, 1.0))
    assert ledger.released == ["c1"]
