"""End to end through the proxy to the in-tree broker: refused deliveries are withheld from the
router (decision 0002) and the client keeps its link credit.

The demo broker grants each sender a window of 250 and tops it up only when its own count of
received deliveries leaves 125 or fewer, as RabbitMQ 4 and ActiveMQ Artemis do with theirs.
A refused delivery never reaches it, so without the proxy giving the client back the credit
it spent, a run of more refusals than half the window leaves the client waiting forever.
"""

from __future__ import annotations

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection

from tests.support.burst import Burst, run

pytestmark = pytest.mark.integration


def _message(body: str, user_id: bytes) -> Message:
    m = Message(body=body)
    m.user_id = user_id
    return m


@pytest.mark.parametrize("refused", [1, 200])
def test_a_run_of_refused_deliveries_leaves_the_link_credit_whole(proxy, refused):
    address = f"orders.withheld-{refused}"
    plan = [(address, _message(f"bad-{i}", b"mallory")) for i in range(refused)]
    plan += [(address, _message(f"ok-{i}", b"alice")) for i in range(150)]
    client = Burst(f"127.0.0.1:{proxy.port}", plan, user="alice", password="secret",
                   allowed_mechs="PLAIN", allow_insecure_mechs=True, virtual_host="e2e")
    run(client, timeout=30)
    assert client.error is None
    assert client.outcomes == {m.body: "accepted" if m.body.startswith("ok")
                               else "rejected: user_id proxy violation" for _, m in plan}
    c = BlockingConnection(f"127.0.0.1:{proxy.port}", user="alice", password="secret",
                           allowed_mechs="PLAIN", allow_insecure_mechs=True,
                           virtual_host="e2e", timeout=10)
    rcv = c.create_receiver(address, credit=200)
    got = []
    try:
        while True:
            got.append(rcv.receive(timeout=2).body)
            rcv.accept()
    except Timeout:
        pass
    c.close()
    assert got == [f"ok-{i}" for i in range(150)]
