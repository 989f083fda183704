"""Transcript helpers for ProxyConnection tests (mitmproxy Playbook, simplified).

Frames are built with the project's encoder; a few tests pin real captured bytes so encoder and
decoder cannot agree on a shared mistake.
"""

from __future__ import annotations

from typing import Any

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.codec import symbol_array
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.performatives import (
    Attach,
    Begin,
    Close,
    Detach,
    End,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
    decode_performative,
)
from amqp_policy_proxy.core.commands import CloseTransport, ConnectRouter, Emit, SendData, Side
from amqp_policy_proxy.core.connection import ProxyConnection
from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.limits.rates import RateLimits
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings

__all__ = [
    "Attach", "Begin", "Close", "Detach", "End", "Flow", "Open", "Source", "Target", "Transfer",
    "Script", "frame", "make_policy", "parse_frames",
]


def frame(channel: int, perf: Any, payload: bytes = b"", ftype: int = 0) -> bytes:
    """Encode one frame."""
    return encode_frame(channel, perf.encode() + payload, ftype)


def parse_frames(data: bytes) -> list[tuple[int, Any, bytes]]:
    """Split bytes into ``(channel, performative, payload)``; protocol headers as ``(-1, hdr, b'')``."""
    out = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            out.append((-1, bytes(data[pos : pos + 8]), b""))
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        doff = data[pos + 4]
        channel = int.from_bytes(data[pos + 6 : pos + 8], "big")
        body = data[pos + doff * 4 : pos + size]
        if body:
            perf, n = decode_performative(body)
            out.append((channel, perf, bytes(body[n:])))
        else:
            out.append((channel, None, b""))
        pos += size
    return out


def make_policy(groups: dict[str, Any], **vhost: Any) -> Any:
    """Compile a one-vhost policy named ``test`` (hostname) with the given groups."""
    attrs = {"hostname": "test", "groups": groups, **vhost}
    return compile_policy([(None, [["vhost", attrs]])], PolicySettings())


class Script:
    """Drive one ProxyConnection; collects what each side was sent."""

    def __init__(self, policy: Any, *, remote_host: str = "127.0.0.1", now: float = 0.0,
                 ledger: ConnectionLedger | None = None, conn_id: str = "c1",
                 paused: Any = frozenset(), rates: RateLimits | None = None,
                 bans: Any = None, **facts: Any) -> None:
        self.ledger = ledger or ConnectionLedger(100)
        self.rates = rates
        self.conn = ProxyConnection(conn_id, remote_host=remote_host, listener="l",
                                    policy=policy, ledger=self.ledger, now=now,
                                    paused_vhosts=paused, rates=rates, bans=bans, **facts)
        self.now = now
        self.sent: dict[Side, bytearray] = {Side.CLIENT: bytearray(), Side.ROUTER: bytearray()}
        self.closed: set[Side] = set()
        self.events: list[Any] = []
        self.connect_requested = False

    def _run(self, cmds: list[Any]) -> list[Any]:
        for cmd in cmds:
            if isinstance(cmd, SendData):
                self.sent[cmd.side] += bytes(cmd.data)
            elif isinstance(cmd, CloseTransport):
                self.closed.add(cmd.side)
            elif isinstance(cmd, Emit):
                self.events.append(cmd.event)
            elif isinstance(cmd, ConnectRouter):
                self.connect_requested = True
        return cmds

    def client(self, data: bytes) -> list[Any]:
        """Client sends ``data``."""
        return self._run(self.conn.receive_data(Side.CLIENT, data, self.now))

    def router(self, data: bytes) -> list[Any]:
        """The router sends ``data``."""
        return self._run(self.conn.receive_data(Side.ROUTER, data, self.now))

    def client_in_reads(self, data: bytes, cuts: list[int]) -> list[Any]:
        """Client sends ``data`` cut at the offsets ``cuts`` (sorted), as separate reads."""
        commands: list[Any] = []
        prev = 0
        for cut in [*cuts, len(data)]:
            if cut > prev:
                commands += self.client(data[prev:cut])
            prev = cut
        return commands

    def timer(self, now: float) -> list[Any]:
        """Move the clock to ``now`` and fire the connection's timer if it is due."""
        self.now = now
        deadline = self.conn.get_timer()
        if deadline is not None and deadline <= now:
            return self._run(self.conn.handle_timer(now))
        return []

    def take(self, side: Side) -> list[tuple[int, Any, bytes]]:
        """Frames sent to ``side`` since the last take, parsed."""
        data = bytes(self.sent[side])
        self.sent[side].clear()
        return parse_frames(data)

    def sasl_plain(self, user: str, password: str = "secret", *, ok: bool = True,
                   mechanism: str = "PLAIN") -> None:
        """Run a SASL PLAIN exchange through the proxy (``mechanism`` EXTERNAL: an empty
        initial response, the identity is the TLS subject)."""
        self.client(C.SASL_HEADER)
        assert self.connect_requested
        self._run(self.conn.router_connected(self.now))
        mechs = SaslMechanisms(sasl_server_mechanisms=symbol_array(["PLAIN", "ANONYMOUS"]))
        self.router(C.SASL_HEADER + frame(0, mechs, ftype=1))
        resp = b"\0" + user.encode() + b"\0" + password.encode()
        if mechanism == "EXTERNAL":
            resp = b""
        self.client(frame(0, SaslInit(mechanism=mechanism, initial_response=resp), ftype=1))
        self.router(frame(0, SaslOutcome(code=0 if ok else 1), ftype=1))

    def open(self, hostname: str | None = "test", *, channel_max: int = 32767,
             max_frame_size: int = 65536, router_channel_max: int = 32767,
             router_max_frame: int = 65536, user: str | None = None) -> None:
        """Complete the AMQP header exchange and the Open (the router's Open included)."""
        if user is not None:
            self.sasl_plain(user)
            self.client(C.AMQP_HEADER)
        else:
            self.client(C.AMQP_HEADER)
            self._run(self.conn.router_connected(self.now))
        self.router(C.AMQP_HEADER)
        self.client(frame(0, Open(container_id="client", hostname=hostname,
                                  channel_max=channel_max, max_frame_size=max_frame_size)))
        self.router(frame(0, Open(container_id="router", channel_max=router_channel_max,
                                  max_frame_size=router_max_frame)))

    def begin(self, channel: int, *, router_channel: int | None = None,
              handle_max: int = 1023) -> None:
        """Client begins a session; the router answers (unless denied)."""
        self.client(frame(channel, Begin(next_outgoing_id=0, incoming_window=100,
                                         outgoing_window=100, handle_max=handle_max)))
        if router_channel is not None:
            self.router(frame(router_channel, Begin(remote_channel=channel, next_outgoing_id=0,
                                                    incoming_window=2147483647,
                                                    outgoing_window=2147483647,
                                                    handle_max=handle_max)))


def merged_commands(commands: list[Any]) -> list[Any]:
    """``commands`` with consecutive ``SendData`` to one side joined into ``(side, bytes)``
    and every other command as its ``repr``: what two runs are compared by (the writes may be
    cut differently, the bytes and their order may not)."""
    merged: list[Any] = []
    for cmd in commands:
        if type(cmd) is SendData and merged and type(merged[-1]) is list \
                and merged[-1][0] is cmd.side:
            merged[-1][1] += bytes(cmd.data)
        elif type(cmd) is SendData:
            merged.append([cmd.side, bytearray(cmd.data)])
        else:
            merged.append(repr(cmd))
    return [m if isinstance(m, str) else (m[0], bytes(m[1])) for m in merged]
