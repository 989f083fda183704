#!/usr/bin/env python3
"""Capture fuzz seeds from real python-qpid-proton clients talking through a real proxy.

    proton client ─► recorder(front) ─► ProxyThread ─► recorder(back) ─► RawUpstream (echo)

The recorder is a byte-transparent TCP relay that logs, in one global order, what each client
sent (``C``) and what the upstream answered (``B``). Scenarios run one connection at a time,
so each transcript is one proxied connection; it is written as

- ``fuzz/corpus/connection/<scenario>-p<N>``: a :func:`fuzz.harness.encode_script` input for
  each harness policy N (same bytes, different policy), and
- ``fuzz/corpus/framing/<scenario>-client`` / ``-router``: the frame streams (protocol headers
  removed) for :func:`fuzz.harness.run_framing`.

Run from the repository root: ``.venv/bin/python fuzz/capture_corpus.py``. It overwrites the
seed files it writes and leaves other files (hand-made seeds, minimised finds) alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from fuzz.harness import OP_BROKER, OP_CLIENT, POLICY_NAMES, encode_script, policy  # noqa: E402
from tests.support.proxy import ProxyThread  # noqa: E402
from tests.support.rawpeer import RawUpstream  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus")


class Recorder:
    """Two recording TCP relays on one background loop (so the log has one causal order)."""

    def __init__(self) -> None:
        """Create; call :meth:`start` with the target ports."""
        self.log: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.front_port = 0
        self.back_port = 0
        self.back_target = 0
        self.front_target = 0

    def start(self, front_target: int, back_target: int) -> None:
        """Start relays to the proxy (front) and to the upstream (back)."""
        self.front_target, self.back_target = front_target, back_target
        ready = threading.Event()

        async def main() -> None:
            front = await asyncio.start_server(
                lambda r, w: self._relay(r, w, self.front_target, "C", None), "127.0.0.1", 0)
            back = await asyncio.start_server(
                lambda r, w: self._relay(r, w, self.back_target, None, "B"), "127.0.0.1", 0)
            self.front_port = front.sockets[0].getsockname()[1]
            self.back_port = back.sockets[0].getsockname()[1]
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=lambda: self.loop.run_until_complete(main()),
                         daemon=True).start()
        ready.wait(10)

    async def _relay(self, reader: Any, writer: Any, port: int, up_tag: str | None,
                     down_tag: str | None) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)

        async def pump(src: Any, dst: Any, tag: str | None) -> None:
            try:
                while data := await src.read(65536):
                    if tag is not None:
                        with self.lock:
                            self.log.append((tag, data))
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pump(reader, w2, up_tag), pump(r2, writer, down_tag))

    def take(self) -> list[tuple[str, bytes]]:
        """Return and clear the log."""
        time.sleep(0.3)
        with self.lock:
            log, self.log = self.log, []
        return log


def connect(port: int, **kw: Any) -> BlockingConnection:
    """A proton BlockingConnection to the recorder, vhost ``test``."""
    kw.setdefault("virtual_host", "test")
    return BlockingConnection(f"127.0.0.1:{port}", timeout=5, **kw)


def plain(user: str) -> dict[str, Any]:
    """kwargs for SASL PLAIN as ``user``."""
    return {"user": user, "password": "pw", "allowed_mechs": "PLAIN",
            "allow_insecure_mechs": True}


def roundtrip(c: BlockingConnection, address: str, messages: list[Message],
              source: str | None = None) -> None:
    """Send ``messages`` to ``address`` and receive the echoes (from ``source``)."""
    rcv = c.create_receiver(source or address, credit=len(messages))
    snd = c.create_sender(address)
    for m in messages:
        snd.send(m)
    for _ in messages:
        rcv.receive(timeout=5)  # echoes arrive pre-settled: nothing to accept
    snd.close()
    rcv.close()


def s_no_sasl(port: int) -> None:
    c = connect(port, sasl_enabled=False)
    roundtrip(c, "public.a", [Message(body="hello"), Message(body=b"\x00" * 100),
                              Message(body={"k": [1, 2.5, None]}, durable=True, priority=7)])
    c.close()


def s_sasl_anonymous(port: int) -> None:
    c = connect(port, allowed_mechs="ANONYMOUS")
    roundtrip(c, "public.b", [Message(body="x", subject="s", correlation_id=5)])
    c.close()


def s_plain_alice(port: int) -> None:
    c = connect(port, **plain("alice"))
    roundtrip(c, "tmp-alice", [Message(body="to self", user_id=b"alice", address="public.q",
                                         properties={"a": 1})], source="alice.inbox")
    rcv = c.create_receiver(None, dynamic=True)
    rcv.close()
    c.close()


def s_anonymous_relay(port: int) -> None:
    c = connect(port, **plain("alice"))
    snd = c.create_sender(None)
    snd.send(Message(address="public.x", body="ok"))
    with contextlib.suppress(Exception):
        snd.send(Message(address="private.y", body="denied"))
    c.close()


def s_denied_link(port: int) -> None:
    c = connect(port, **plain("alice"))
    with contextlib.suppress(Exception):
        c.create_sender("private.z")
    with contextlib.suppress(Exception):
        c.create_receiver("secret")
    with contextlib.suppress(Exception):
        c.close()


def s_denied_user(port: int) -> None:
    with contextlib.suppress(Exception):
        c = connect(port, **plain("mallory"))
        c.close()


def s_big_messages(port: int) -> None:
    c = connect(port, **plain("bob"))
    roundtrip(c, "bulk", [Message(body=b"B" * 200_000), Message(body="u" * 70_000)])
    c.close()


def s_oversize(port: int) -> None:
    with contextlib.suppress(Exception):
        c = connect(port, **plain("alice"))
        snd = c.create_sender("public.big")
        snd.send(Message(body=b"O" * 5000))
        c.close()


def s_heartbeat(port: int) -> None:
    c = connect(port, heartbeat=1, **plain("bob"))
    time.sleep(1.5)
    c.close()


SCENARIOS: dict[str, Callable[[int], None]] = {
    "no-sasl": s_no_sasl, "sasl-anonymous": s_sasl_anonymous, "plain-alice": s_plain_alice,
    "anonymous-relay": s_anonymous_relay, "denied-link": s_denied_link,
    "denied-user": s_denied_user, "big-messages": s_big_messages, "oversize": s_oversize,
    "heartbeat": s_heartbeat,
}


def strip_headers(stream: bytes) -> bytes:
    """Remove protocol headers, keeping frames only (what a FrameDecoder sees)."""
    out = bytearray()
    pos = 0
    while pos + 8 <= len(stream):
        if stream[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(stream[pos : pos + 4], "big")
        out += stream[pos : pos + size]
        pos += size
    return bytes(out)


def write(path: str, data: bytes) -> None:
    """Write one seed file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def main() -> int:
    """Run every scenario and write the seeds."""
    with RawUpstream(echo=True, echo_settle_at_receiver=False, credit=50) as upstream:
        rec = Recorder()
        rec.start(0, upstream.port)
        with ProxyThread([("127.0.0.1", rec.back_port)], policy=policy(0)) as proxy:
            rec.front_target = proxy.port
            for name, scenario in SCENARIOS.items():
                try:
                    scenario(rec.front_port)
                except Exception as exc:  # a scenario failing still leaves a transcript
                    print(f"{name}: {type(exc).__name__}: {exc}")
                log = rec.take()
                ops = [(OP_CLIENT if tag == "C" else OP_BROKER, data) for tag, data in log]
                for i in range(len(POLICY_NAMES)):
                    write(os.path.join(CORPUS, "connection", f"{name}-p{i}"),
                          encode_script(i, 0, ops))
                client = b"".join(d for t, d in log if t == "C")
                router = b"".join(d for t, d in log if t == "B")
                write(os.path.join(CORPUS, "framing", f"{name}-client"),
                      bytes([2, 63]) + strip_headers(client))
                write(os.path.join(CORPUS, "framing", f"{name}-router"),
                      bytes([2, 63]) + strip_headers(router))
                print(f"{name}: {len(log)} chunks, client {len(client)} B, router {len(router)} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
