#!/usr/bin/env python3
"""Capture PROXY protocol seeds from the real HAProxy (Debian's) for ``fuzz/proxy_header.py``.

    client ─► HAProxy (send-proxy / send-proxy-v2 [+ options], health checks) ─► recorder

The recorder is a TCP server that keeps the first bytes of every connection HAProxy makes to it
(the header and whatever followed it in the same reads: the client's AMQP or TLS bytes, or
the health check's AMQP header) and answers like an AMQP peer (its own protocol header), so
the health checks pass. Each scenario writes ``fuzz/corpus/proxy_header/haproxy-<scenario>``
(a chunk-size byte, then the bytes HAProxy sent): client connections and health checks, v1
and v2, IPv4 and IPv6 clients, v2 with the ``crc32c`` and ``unique-id`` TLVs, a TLS client.

Run from the repository root: ``.venv/bin/python fuzz/capture_proxy_headers.py``. It
overwrites the seeds it writes and leaves the others (hand-made ones) alone.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.haproxy import HAProxy  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus", "proxy_header")
SASL_HEADER = b"AMQP\x03\x01\x00\x00"


class Recorder:
    """Accepts on 127.0.0.1, keeps each connection's first bytes, answers an AMQP header."""

    def __init__(self) -> None:
        """Bind and start accepting in a thread."""
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        conn.settimeout(0.3)
        try:
            while len(data) < 600:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
                if SASL_HEADER in data or b"\x16\x03" in data:
                    conn.sendall(SASL_HEADER)
                    break
        except OSError:
            pass
        self.seen.append(data)
        time.sleep(0.05)
        conn.close()

    def close(self) -> None:
        """Stop accepting."""
        self.sock.close()


class Configured(HAProxy):
    """:class:`HAProxy` with extra server-line options and an optional IPv6 bind."""

    def __init__(self, *args, extra: str = "", frontend: str = "", **kwargs) -> None:
        """``extra``: appended to the server line; ``frontend``: lines for the frontend."""
        super().__init__(*args, **kwargs)
        self.extra, self.frontend = extra, frontend

    def config_text(self) -> str:
        """The helper's configuration with the extra options."""
        text = super().config_text()
        text = text.replace("    default_backend amqp_out\n",
                            f"{self.frontend}    default_backend amqp_out\n")
        lines = text.splitlines()
        lines = [line + self.extra if line.lstrip().startswith("server ") else line
                 for line in lines]
        return "\n".join(lines) + "\n"


def tls_client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello)."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


SCENARIOS = {
    # name: (send_proxy, server extra, frontend lines, listen host, client bytes, checks)
    "v1-client": ("send-proxy", "", "", "127.0.0.1", SASL_HEADER, False),
    "v1-check": ("send-proxy", "", "", "127.0.0.1", None, True),
    "v1-client-ipv6": ("send-proxy", "", "", "::1", SASL_HEADER, False),
    "v2-client": ("send-proxy-v2", "", "", "127.0.0.1", SASL_HEADER, False),
    "v2-check-local": ("send-proxy-v2", "", "", "127.0.0.1", None, True),
    "v2-client-ipv6": ("send-proxy-v2", "", "", "::1", SASL_HEADER, False),
    "v2-client-tls": ("send-proxy-v2", "", "", "127.0.0.1", tls_client_hello(), False),
    "v2-crc32c": ("send-proxy-v2", " proxy-v2-options crc32c", "", "127.0.0.1", SASL_HEADER,
                  False),
    "v2-unique-id-crc32c": (
        "send-proxy-v2", " proxy-v2-options unique-id,crc32c",
        "    unique-id-format %{+X}o\\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid\n", "127.0.0.1",
        SASL_HEADER, False),
}


def capture(name: str) -> bytes:
    """Run one scenario; return the first connection's bytes as HAProxy sent them."""
    send_proxy, extra, frontend, listen, client_bytes, checks = SCENARIOS[name]
    recorder = Recorder()
    try:
        with Configured(("127.0.0.1", recorder.port), host=listen, send_proxy=send_proxy,
                        health_check=checks, extra=extra, frontend=frontend) as lb:
            if checks:
                deadline = time.monotonic() + 5
                while not recorder.seen and time.monotonic() < deadline:
                    time.sleep(0.05)
            else:
                family = socket.AF_INET6 if ":" in listen else socket.AF_INET
                with socket.socket(family) as client:
                    client.connect((listen, lb.port))
                    client.sendall(client_bytes)
                    client.settimeout(2)
                    try:
                        client.recv(64)
                    except OSError:
                        pass
                time.sleep(0.1)
    finally:
        recorder.close()
    if not recorder.seen:
        raise RuntimeError(f"{name}: HAProxy made no connection")
    return recorder.seen[0]


def main() -> int:
    """Write every scenario's seed; return 0."""
    os.makedirs(CORPUS, exist_ok=True)
    for i, name in enumerate(SCENARIOS):
        data = capture(name)
        with open(os.path.join(CORPUS, f"haproxy-{name}"), "wb") as f:
            f.write(bytes([i * 7 % 32]) + data)  # a different chunking for each seed
        print(f"{name}: {len(data)} bytes: {data[:60]!r}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
