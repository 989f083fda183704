"""daemon/relay.py: the connection's one timer, armed on a real uvloop loop.

uvloop's ``call_at`` for a deadline already past returns a plain ``Handle`` (no ``when()``),
where asyncio's returns a ``TimerHandle``. The relay once asked the handle for its deadline
when re-arming; under load a shaping deadline is often past by the time it is armed, so the
next re-arm raised outside the relay's containment and asyncio aborted the client. These tests
arm past and future deadlines on uvloop and check that nothing escapes and the timer fires.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

from amqp_policy_proxy.daemon.relay import ClientProtocol


class _Conn:
    """The two calls the timer path makes on the core: ``get_timer`` and ``handle_timer``."""

    def __init__(self, deadlines: list[float]) -> None:
        self.deadlines = deadlines
        self.fired: list[float] = []

    def get_timer(self) -> float | None:
        return self.deadlines[0] if self.deadlines else None

    def handle_timer(self, now: float) -> list[Any]:
        self.fired.append(now)
        self.deadlines.pop(0)
        return []


class _Host:
    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self.errors = 0

    def internal_error(self, _client: Any) -> None:
        self.errors += 1


def _client(loop: Any, conn: _Conn) -> ClientProtocol:
    client = ClientProtocol(host=_Host(loop), listener="127.0.0.1:5672", conn_id="c1")  # type: ignore[arg-type]
    client.conn = conn  # type: ignore[assignment]
    return client


def test_a_deadline_already_past_is_re_armed_and_fires_under_uvloop() -> None:
    loop = uvloop.new_event_loop()
    try:
        now = loop.time()
        # two past deadlines in a row (the shaper's next slot already due), then a future one
        conn = _Conn([now - 1.0, now - 0.5, now + 0.01])
        client = _client(loop, conn)
        client._arm_timer()
        assert type(client.timer).__name__ == "Handle"  # what uvloop gives for a past time
        client._arm_timer()  # same deadline: kept, nothing asked of the handle
        conn.deadlines[0] = now - 0.75  # the core moved it: cancel and re-arm
        client._arm_timer()
        loop.run_until_complete(asyncio.sleep(0.1))
        assert len(conn.fired) == 3
        assert client.host.errors == 0  # type: ignore[attr-defined]
        assert client.timer is None
    finally:
        loop.close()


def test_no_deadline_cancels_the_armed_timer() -> None:
    loop = uvloop.new_event_loop()
    try:
        conn = _Conn([loop.time() + 60.0])
        client = _client(loop, conn)
        client._arm_timer()
        armed = client.timer
        assert armed is not None
        conn.deadlines.clear()
        client._arm_timer()
        assert client.timer is None
        assert armed.cancelled()
    finally:
        loop.close()
