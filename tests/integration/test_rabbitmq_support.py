"""tests/support/rabbitmq.py: a private RabbitMQ 3.10 speaking AMQP 1.0 on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from proton import Message
from proton.utils import BlockingConnection

from tests.support.rabbitmq import RabbitMQ

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.slow]


def _roundtrip(url: str, **credentials: str) -> bytes:
    queue = f"/queue/support-{uuid.uuid4().hex[:8]}"
    body = bytes(range(256)) * 4
    conn = BlockingConnection(url, timeout=15, allow_insecure_mechs=True, **credentials)
    try:
        conn.create_sender(queue).send(Message(body=body))
        receiver = conn.create_receiver(queue)
        got = receiver.receive(timeout=10)
        receiver.accept()
        assert bytes(got.body) == body
        return bytes(got.body)
    finally:
        conn.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_send_receive_stop() -> None:
    reason = RabbitMQ.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with RabbitMQ() as rabbit:
        assert rabbit.start_seconds is not None and rabbit.start_seconds > 0
        assert rabbit.pid_file is not None
        beam = int(rabbit.pid_file.read_text())
        workdir = rabbit.workdir
        assert workdir is not None and workdir.exists()
        _roundtrip(rabbit.url, user="guest", password="guest", allowed_mechs="PLAIN")
        _roundtrip(rabbit.url, allowed_mechs="ANONYMOUS")
    assert not _pid_alive(beam)
    assert not workdir.exists()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", rabbit.port), timeout=2):
        pass
    rabbit.stop()  # idempotent
