"""The state tables of core/state.py: every listed move is allowed, every other one raises."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.core.state import (
    CLIENT_TRANSITIONS,
    CLOSE_TRANSITIONS,
    ROUTER_TRANSITIONS,
    ClientState,
    CloseState,
    IllegalTransition,
    RouterState,
    Sides,
)


def _client_at(state: ClientState) -> Sides:
    """A Sides whose client leg reached ``state`` through legal moves (a path in the table)."""
    path = _path(CLIENT_TRANSITIONS, ClientState.AWAIT_HEADER, state)
    sides = Sides()
    for step in path[1:]:
        sides.to_client(step)
    return sides


def _router_at(state: RouterState) -> Sides:
    path = _path(ROUTER_TRANSITIONS, RouterState.IDLE, state)
    sides = Sides()
    for step in path[1:]:
        sides.to_router(step)
    return sides


def _path(table, start, goal):
    frontier, seen = [[start]], {start}
    while frontier:
        path = frontier.pop(0)
        if path[-1] is goal:
            return path
        for nxt in table[path[-1]]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append([*path, nxt])
    raise AssertionError(f"{goal} cannot be reached from {start}")


def test_every_state_is_in_the_tables_and_reachable():
    assert set(CLIENT_TRANSITIONS) == set(ClientState)
    assert set(ROUTER_TRANSITIONS) == set(RouterState)
    for state in ClientState:
        assert _client_at(state).client is state
    for state in RouterState:
        assert _router_at(state).router is state


@pytest.mark.parametrize("start", list(ClientState))
def test_client_table_is_enforced(start):
    for target in ClientState:
        sides = _client_at(start)
        if target is start or target in CLIENT_TRANSITIONS[start]:
            sides.to_client(target)
            assert sides.client is target
        else:
            with pytest.raises(IllegalTransition):
                sides.to_client(target)
            assert sides.client is start


@pytest.mark.parametrize("start", list(RouterState))
def test_router_table_is_enforced(start):
    for target in RouterState:
        sides = _router_at(start)
        if target is start or target in ROUTER_TRANSITIONS[start]:
            sides.to_router(target)
            assert sides.router is target
        else:
            with pytest.raises(IllegalTransition):
                sides.to_router(target)
            assert sides.router is start


def test_the_ends_are_reachable_from_everywhere_and_final():
    for start in ClientState:
        if start is not ClientState.CLOSED:
            assert ClientState.CLOSED in CLIENT_TRANSITIONS[start]
    assert not CLIENT_TRANSITIONS[ClientState.CLOSED]
    assert not ROUTER_TRANSITIONS[RouterState.CLOSED]


def test_close_exchange_table():
    for to_client in (True, False):
        sides = Sides()
        sides.close_sent(to_client)
        attr = "client_close" if to_client else "router_close"
        assert getattr(sides, attr) is CloseState.SENT
        assert sides.close_received(to_client)
        assert getattr(sides, attr) is CloseState.BOTH
        assert not sides.close_received(to_client)  # a second Close changes nothing
        with pytest.raises(IllegalTransition):
            sides.close_sent(to_client)
    for (state, event), new in CLOSE_TRANSITIONS.items():
        assert event in ("sent", "received") and new is not state
