"""Differential oracle: what the router reads is exactly what the proxy decided on (issue 14).

One fuzz input drives one :class:`~amqp_policy_proxy.core.connection.ProxyConnection` (the
sans-IO core, as the daemon runs it) whose router side is a real proton engine: a
``proton.Transport`` in server mode with SASL through Cyrus (the same C engine, frame decoder
and SASL library qdrouterd uses), answering as a router would (Open, Begin, Attach, credit,
settling deliveries). Every byte the proxy forwards goes into that engine, and every byte the
engine answers goes back into the proxy. Then, for everything the engine accepted:

- *identity*: the user the engine authenticated is the user the proxy admitted;
- *links*: each link the engine saw opened is one the proxy recorded under the same name, with
  the same role, the same address (or the same anonymity) and, read from the engine's side
  (address, dynamic flag), it passes the group's source/target rules, anonymous-sender and
  dynamic-source settings;
- *deliveries*: each delivery the engine received whole is within maxMessageSize; on an
  anonymous-relay link the ``to`` the router routes by (:mod:`tests.support.qdr_model`,
  qdrouterd's own section walker) and the one proton's decoder reads are the ``to`` the
  proxy read (:func:`~amqp_policy_proxy.amqp.message.read_message_head`), are allowed by the
  relay rules, and no router annotation is present; with ``allowUserIdProxy`` false the
  router's ``user-id`` is the authenticated user's;
- *numbering* (decision 0002: refused deliveries are withheld and the session renumbered):
  when the client numbered its deliveries 0, 1, 2... on each session, the engine never
  reports a delivery-id sequencing error; it never receives an aborted delivery the client
  did not abort itself; every ``accepted`` outcome the client reads (the engine accepts all
  it receives, the proxy maps its ids back) names a client delivery whose tag the engine
  received, and no delivery is both accepted and rejected.

A violation raises :class:`Divergence`. Exceptions escaping the core are findings too.

Input format: byte 0 picks the SASL opening (:data:`OPENINGS`); then records
``len_hi len_lo data``, each a chunk of client bytes sent after the Open and Begin (the chunk
is fed whole, then the engine and the proxy exchange bytes until both are quiet).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import cache
from typing import Any

from proton import Collector, Connection, Delivery, Endpoint, Event, Message, Transport

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.amqp.errors import AmqpError
from amqp_policy_proxy.amqp.framing import encode_frame
from amqp_policy_proxy.amqp.message import read_message_head
from amqp_policy_proxy.amqp.performatives import (
    Begin,
    Disposition,
    Open,
    Transfer,
    decode_performative,
)
from amqp_policy_proxy.core.commands import CloseTransport, ConnectRouter, SendData, Side
from amqp_policy_proxy.core.connection import ProxyConnection
from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.policy import decisions
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support import hostile
from tests.support.qdr_model import router_view

logging.getLogger("amqp_policy_proxy").setLevel(logging.CRITICAL)

PASSWORD = "fuzz-pw"
#: Names of the oracle's own: Cyrus SASL has one sasldb per process, shared with the tests'
#: brokers, so they must not collide with theirs.
ALICE = "fuzzalice"
CAROL = "fuzzcarol"
USERS = {ALICE: PASSWORD, CAROL: PASSWORD}
MAX_MESSAGE_SIZE = 4000

#: byte 0 % len: the SASL opening of the connection (None: no SASL, user anonymous).
OPENINGS: tuple[bytes | None, ...] = (
    None,
    hostile.plain_init(ALICE, PASSWORD),
    hostile.plain_init(ALICE, PASSWORD, authzid=CAROL),
    hostile.plain_init(CAROL, PASSWORD),
    hostile.plain_init(ALICE, PASSWORD, authzid=ALICE),
    hostile.sasl_init_count_exceeds_size(CAROL, ALICE, PASSWORD)
    + hostile.sasl_response(ALICE, PASSWORD),
)


class Divergence(AssertionError):
    """The router read something other than what the proxy decided on."""


@cache
def policy() -> Any:
    """ALICE and anonymous: public.* only, anonymous relay, no dynamic sources, a message size
    limit, no user-id proxying; CAROL: everything."""
    return compile_policy([(None, [["vhost", {
        "hostname": "test",
        "allowUnknownUser": False,
        "groups": {
            "users": {"users": f"{ALICE}, anonymous", "remoteHosts": "*",
                      "sources": "public.*", "targets": "public.*",
                      "allowAnonymousSender": True, "allowDynamicSource": False,
                      "maxMessageSize": MAX_MESSAGE_SIZE},
            "admins": {"users": CAROL, "remoteHosts": "*", "sources": "*", "targets": "*",
                       "allowAnonymousSender": True, "allowDynamicSource": True},
        },
    }]])], PolicySettings())


@cache
def sasl_config() -> Any:
    """The process's active Cyrus config with the oracle's users added (proton initialises
    Cyrus once per process, whichever config comes first)."""
    import atexit
    import shutil
    import tempfile

    from amqp_policy_proxy.demo.broker import active_sasl_config
    from amqp_policy_proxy.demo.sasl import make_sasl_config

    directory = tempfile.mkdtemp(prefix="amqp-proxy-oracle-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # Cyrus reads it until then
    own = make_sasl_config(directory, USERS)
    return active_sasl_config(own)


class Router:
    """A proton engine in server mode acting as the router: it accepts everything."""

    def __init__(self, sasl: bool) -> None:
        self.transport = Transport(Transport.SERVER)
        self.connection = Connection()
        self.collector = Collector()
        self.connection.collect(self.collector)
        if sasl:
            config = sasl_config()
            s = self.transport.sasl()
            s.config_path(str(config.config_dir))
            s.config_name(config.config_name)
            s.allowed_mechs("PLAIN ANONYMOUS")
            s.allow_insecure_mechs = True
        self.transport.bind(self.connection)
        self.closed = False
        self.links: list[tuple[Any, dict[str, Any]]] = []
        self.deliveries: list[tuple[dict[str, Any], bytes]] = []
        self.tags: set[bytes] = set()
        """Delivery-tags of the deliveries received whole."""
        self.aborted_tags: set[bytes] = set()
        self._partial: dict[Any, bytearray] = {}
        self.on_link_open: Any = None

    def push(self, data: bytes) -> None:
        """Bytes from the proxy."""
        if self.closed or not data:
            return
        try:
            self.transport.push(data)
        except Exception:  # the engine refused the bytes (it closes): nothing more reaches it
            self.closed = True
        self._events()

    def close(self) -> None:
        """The proxy closed the router's transport."""
        if not self.closed:
            self.closed = True
            self.transport.close_tail()
            self._events()

    def pull(self) -> bytes:
        """Bytes the engine has for the proxy."""
        out = b""
        try:
            pending = self.transport.pending()
            if pending > 0:
                out = self.transport.peek(pending)
                self.transport.pop(len(out))
        except Exception:
            return b""
        return out

    def _events(self) -> None:
        collector = self.collector
        while True:
            event = collector.peek()
            if event is None:
                break
            try:
                self._handle(event)
            finally:
                collector.pop()

    def _handle(self, event: Event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            if event.connection.state & Endpoint.LOCAL_UNINIT:
                event.connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            if event.session.state & Endpoint.LOCAL_UNINIT:
                event.session.incoming_capacity = 10_000_000
                event.session.open()
        elif kind == Event.LINK_REMOTE_OPEN:
            link = event.link
            terminus = link.remote_target if link.is_receiver else link.remote_source
            seen = {
                "name": link.name,
                "client_sender": link.is_receiver,
                "address": terminus.address,
                "dynamic": bool(terminus.dynamic),
            }
            self.links.append((link, seen))
            if self.on_link_open is not None:
                self.on_link_open(seen)
            if link.state & Endpoint.LOCAL_UNINIT:
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                link.open()
                if link.is_receiver:
                    link.flow(1000)
        elif kind == Event.DELIVERY:
            link = event.delivery.link
            if link.is_receiver:
                self._receive(link)
        elif kind == Event.LINK_REMOTE_CLOSE:
            event.link.close()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            event.session.close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            event.connection.close()

    def _receive(self, link: Any) -> None:
        """Read every readable delivery at the head of ``link``."""
        seen = next((s for lk, s in self.links if lk is link), {})
        while True:
            delivery = link.current
            if delivery is None or not delivery.readable:
                return
            if delivery.aborted:  # the client aborted it: nothing of it is a message
                self.aborted_tags.add(_delivery_tag(delivery))
                self._partial.pop(delivery, None)
                delivery.settle()
                link.advance()
                continue
            buf = self._partial.setdefault(delivery, bytearray())
            pending = delivery.pending
            if pending > 0:
                buf += link.recv(pending) or b""
            if delivery.partial:
                return
            self.deliveries.append((seen, bytes(self._partial.pop(delivery))))
            self.tags.add(_delivery_tag(delivery))
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
            link.advance()
            link.flow(1)

    @property
    def user(self) -> str | None:
        """The identity the engine authenticated (None before the SASL outcome)."""
        try:
            return self.transport.user
        except Exception:
            return None

    @property
    def error(self) -> str:
        """The engine's own error description, if it closed on one ("" otherwise)."""
        try:
            condition = self.transport.condition
        except Exception:
            return ""
        return "" if condition is None else f"{condition.name}: {condition.description}"


def _delivery_tag(delivery: Any) -> bytes:
    """A delivery's tag as the engine holds it, as bytes: read from the C engine directly,
    since proton's Python ``Delivery.tag`` decodes it as UTF-8 and raises on binary tags."""
    import cproton

    raw = cproton.lib.pn_delivery_tag(delivery._impl)
    return bytes(cproton.ffi.unpack(raw.start, raw.size))


def _chunks(data: bytes) -> Iterable[bytes]:
    pos = 1
    while pos + 2 <= len(data):
        n = (data[pos] << 8) | data[pos + 1]
        pos += 2
        yield data[pos:pos + n]
        pos += n


def encode_input(opening: int, chunks: Iterable[bytes]) -> bytes:
    """Build a fuzz input from an opening index and client byte chunks."""
    out = bytearray([opening])
    for chunk in chunks:
        chunk = chunk[:0xFFFF]
        out += len(chunk).to_bytes(2, "big") + chunk
    return bytes(out)


class Run:
    """One proxy connection between a scripted client and a proton engine as router."""

    def __init__(self, opening: bytes | None) -> None:
        self.ledger = ConnectionLedger(10)
        self.proxy = ProxyConnection("d1", remote_host="127.0.0.1", listener="l",
                                     policy=policy(), ledger=self.ledger, now=0.0)
        self.router = Router(sasl=opening is not None)
        self.router.on_link_open = self._link_opened
        self.now = 0.0
        self.connected = False
        self.client_bytes = bytearray()
        """The client's frames after its Begin (the fuzz chunks), for the numbering checks."""
        self.to_client = bytearray()

    def _link_opened(self, seen: dict[str, Any]) -> None:
        """Compare the link the engine just saw with the proxy's record of it, then."""
        conn = self.proxy
        record = None
        for session in conn.sessions.sessions.values():
            for link in session.links.values():
                if link.name == seen["name"]:
                    record = link
        if record is None:
            raise Divergence(f"the router attached {seen} which the proxy never recorded")
        if record.is_sender != seen["client_sender"]:
            raise Divergence(f"link {seen['name']!r}: the proxy saw sender={record.is_sender}, "
                             f"the router {seen['client_sender']}")
        if (record.address or None) != (seen["address"] or None):
            raise Divergence(f"link {seen['name']!r}: the proxy checked {record.address!r}, "
                             f"the router attached {seen['address']!r}")
        group = conn.group
        if group is None:
            return
        user = conn.user or ""
        address = seen["address"] or None
        if seen["client_sender"]:
            reason = decisions.approve_sender(group, user=user, target_address=address,
                                              open_senders=0)
        else:
            reason = decisions.approve_receiver(group, user=user, source_address=address,
                                                dynamic=seen["dynamic"], open_receivers=0)
        if reason is not None:
            raise Divergence(f"the router attached {seen}, which the policy denies: {reason}")

    def feed(self, data: bytes) -> None:
        """Client bytes into the proxy, then exchange until quiet."""
        self._run(self.proxy.receive_data(Side.CLIENT, data, self.now))
        self.pump()

    def _run(self, commands: list[Any]) -> None:
        for cmd in commands:
            if type(cmd) is SendData and cmd.side is Side.CLIENT:
                self.to_client += bytes(cmd.data)
            if type(cmd) is SendData and cmd.side is Side.ROUTER:
                self.router.push(bytes(cmd.data))
            elif type(cmd) is CloseTransport and cmd.side is Side.ROUTER:
                self.router.close()
            elif type(cmd) is ConnectRouter and not self.connected:
                self.connected = True
                self._run(self.proxy.router_connected(self.now))

    def pump(self) -> None:
        """Exchange bytes between the engine and the proxy until neither has more."""
        for _ in range(100):
            out = self.router.pull()
            if not out:
                return
            self._run(self.proxy.receive_data(Side.ROUTER, out, self.now))

    def check(self) -> None:
        """The identity and delivery invariants (links are checked as they open)."""
        conn = self.proxy
        engine_user = self.router.user
        if conn.view.admitted and engine_user is not None and engine_user != conn.user:
            raise Divergence(f"the router authenticated {engine_user!r}, the proxy admitted "
                             f"{conn.user!r}")
        group = conn.group
        for seen, message in self.router.deliveries:
            if group is None:
                continue
            limit = group.max_message_size
            if limit is not None and len(message) > limit:
                raise Divergence(f"a {len(message)}-byte message reached the router past "
                                 f"maxMessageSize {limit}")
            view = router_view(message)
            if seen.get("client_sender") and not seen.get("address"):
                self._check_relay(view, message)
            if not group.allow_user_id_proxy and view.valid and view.user_id:
                if view.user_id != (conn.user or "").encode():
                    raise Divergence(f"the router read user-id {view.user_id!r} for user "
                                     f"{conn.user!r}")

    def check_numbering(self) -> None:
        """The engine and the client agree on the deliveries the proxy let through."""
        try:
            client = _client_deliveries(bytes(self.client_bytes))
        except ValueError:
            return  # a delivery-tag that is not binary: nothing to compare tags with
        if client is None:
            return  # the client's own bytes do not parse: nothing to compare with
        error = self.router.error
        if client.contiguous and ("sequencing error" in error or "delivery-id" in error):
            raise Divergence(f"the router lost count of delivery-ids the client numbered "
                             f"in order: {error}")
        for tag in self.router.aborted_tags - client.aborted_tags:
            raise Divergence(f"the router got an aborted delivery {tag!r} the client did "
                             "not abort")
        if not client.contiguous:
            # the client reused or skipped delivery-ids: its own numbering names two
            # deliveries alike, so outcomes cannot be matched to tags (the proxy closes such
            # a session once it renumbers, as proton does: "sequencing error")
            return
        session = self.proxy.sessions.sessions.get(0)
        if session is None or session.router_channel is None:
            return
        outcomes = _client_outcomes(bytes(self.to_client), session.router_channel)
        if outcomes is None:
            return
        accepted, rejected = outcomes
        if accepted & rejected:
            raise Divergence(f"deliveries {sorted(accepted & rejected)} were both accepted "
                             "and rejected")
        for delivery_id in accepted:
            tag = client.tags.get(delivery_id)
            if tag is None or tag not in self.router.tags:
                raise Divergence(f"the client read 'accepted' for its delivery {delivery_id} "
                                 f"(tag {tag!r}), which the router never received")

    def _check_relay(self, view: Any, message: bytes) -> None:
        conn = self.proxy
        if not view.valid:
            return  # the router rejects it itself: "invalid message format"
        if view.to_override:
            raise Divergence("an anonymous-relay message with x-opt-qd.* reached the router")
        try:
            ours = read_message_head(message, 0, len(message), last=True).to
        except AmqpError as exc:
            raise Divergence(f"the proxy forwarded a message its reader refuses: {exc}") from None
        theirs = None if view.to is None else view.to.decode("utf-8", "replace")
        if ours != theirs:
            raise Divergence(f"relay 'to': the proxy read {ours!r}, the router {theirs!r}")
        try:
            decoded = Message()
            decoded.decode(message)
            proton_to = decoded.address
        except Exception:
            proton_to = ours
        if proton_to != ours:
            raise Divergence(f"relay 'to': the proxy read {ours!r}, proton {proton_to!r}")
        if theirs is not None and not decisions.approve_relay_target(
                conn.group, user=conn.user or "", to=theirs):
            raise Divergence(f"a relay message to {theirs!r} reached the router")


class ClientDeliveries:
    """What the client's own frames say about its deliveries on channel 0."""

    def __init__(self) -> None:
        self.tags: dict[int, bytes | None] = {}
        """delivery-id -> delivery-tag (channel 0)."""
        self.aborted_tags: set[bytes] = set()
        self.contiguous = True
        """On every channel, each delivery's id is the one after the previous delivery's."""


def _frames(data: bytes) -> Iterable[tuple[int, Any]] | None:
    """``(channel, performative)`` of each frame in ``data``; None if any does not decode."""
    out = []
    pos = 0
    try:
        while pos + 8 <= len(data):
            size = int.from_bytes(data[pos:pos + 4], "big")
            doff = data[pos + 4]
            if size < 8 or doff < 2 or pos + size > len(data):
                return None
            body = data[pos + doff * 4:pos + size]
            if body:
                out.append((int.from_bytes(data[pos + 6:pos + 8], "big"),
                            decode_performative(body)[0]))
            pos += size
    except Exception:
        return None
    return out


def _client_deliveries(data: bytes) -> ClientDeliveries | None:
    """The client's deliveries, read from its frames (None: they do not all decode)."""
    frames = _frames(data)
    if frames is None:
        return None
    found = ClientDeliveries()
    nxt: dict[int, int | None] = {}  # channel -> next delivery-id
    streaming: dict[tuple[int, int], bytes | None] = {}  # (channel, handle) -> its tag
    current: dict[tuple[int, int], int | None] = {}  # (channel, handle) -> its delivery-id
    for channel, perf in frames:
        if isinstance(perf, Begin):
            nxt[channel] = None
            continue
        if not isinstance(perf, Transfer) or perf.handle is None:
            continue
        key = (channel, int(perf.handle))
        tag = None if perf.delivery_tag is None else _as_bytes(perf.delivery_tag)
        if key not in streaming:
            expected = nxt.get(channel)
            did = expected if perf.delivery_id is None else int(perf.delivery_id)
            if perf.delivery_id is not None and expected is not None and did != expected:
                found.contiguous = False
            if did is not None:
                nxt[channel] = (did + 1) & 0xFFFFFFFF
                if channel == 0:
                    found.tags[did] = tag
            streaming[key] = tag
            current[key] = did
        elif perf.delivery_id is not None and int(perf.delivery_id) != current.get(key):
            found.contiguous = False  # a continuation naming another delivery (§2.7.5)
        tag = streaming[key]
        if perf.aborted and tag is not None:
            found.aborted_tags.add(tag)
        if perf.aborted or not perf.more:
            del streaming[key]
    return found


def _client_outcomes(data: bytes, channel: int) -> tuple[set[int], set[int]] | None:
    """Client delivery-ids the client read ``accepted`` / ``rejected`` for on ``channel``."""
    frames = _frames(data)
    if frames is None:
        return None
    accepted: set[int] = set()
    rejected: set[int] = set()
    for ch, perf in frames:
        if ch != channel or not isinstance(perf, Disposition) or not perf.role:
            continue
        first = int(perf.first)
        last = first if perf.last is None else int(perf.last)
        ids = {(first + i) & 0xFFFFFFFF for i in range(min((last - first) & 0xFFFFFFFF, 4096) + 1)}
        if type(perf.state).__name__ == "Accepted":
            accepted |= ids
        elif type(perf.state).__name__ == "Rejected":
            rejected |= ids
    return accepted, rejected


def opening_bytes(index: int) -> list[bytes]:
    """The client's bytes up to its Begin for opening ``index``."""
    sasl = OPENINGS[index % len(OPENINGS)]
    steps: list[bytes] = []
    if sasl is not None:
        steps.append(C.SASL_HEADER + sasl)
    steps.append(C.AMQP_HEADER + encode_frame(0, Open(
        container_id="fuzz", hostname="test", max_frame_size=65536,
        channel_max=16).encode()))
    steps.append(encode_frame(0, Begin(next_outgoing_id=0, incoming_window=10_000,
                                       outgoing_window=10_000, handle_max=64).encode()))
    return steps


def run_differential(data: bytes) -> None:
    """Run one input; raise :class:`Divergence` (or let a core exception out) on a finding."""
    if not data:
        return
    index = data[0] % len(OPENINGS)
    run = Run(OPENINGS[index])
    try:
        for step in opening_bytes(index):
            run.feed(step)
        run.to_client.clear()  # protocol headers, SASL, Open: only frames after the Begin
        for chunk in _chunks(data):
            if chunk:
                run.client_bytes += chunk
                run.feed(chunk)
        run.check()
        run.check_numbering()
    finally:
        run.router.close()


# ------------------------------------------------------------------ seeds


def _attach(handle: int, name: str, *, sender: bool, address: str | None,
            dynamic: bool = False) -> bytes:
    source = hostile.source(None if sender else address,
                            dynamic=b"\x41" if dynamic else b"")
    target = hostile.target(address if sender else None)
    fields = hostile.attach_fields(name, handle, role=b"\x42" if sender else b"\x41",
                                   source_=source, target_=target)
    return hostile.amqp_frame(0, hostile.described(0x12, hostile.list32(fields, 7)))


def seeds() -> list[bytes]:
    """Inputs that open links and send messages, allowed and hostile, for every opening."""
    body = hostile.body(b"hello")
    chunks = [
        [_attach(0, "s0", sender=True, address="public.a"),
         hostile.transfer(0, 0, 0, hostile.message_to(None) + body),
         hostile.transfer(0, 0, 1, b"\x00\x53\x75\xa0\x10" + b"x" * 16)],
        [_attach(1, "relay", sender=True, address=None),
         hostile.transfer(0, 1, 0, hostile.message_to("public.x")),
         hostile.transfer(0, 1, 1, hostile.message_to("secret.x")),
         hostile.transfer(0, 1, 2, hostile.message_to("public.y", user_id=CAROL.encode())),
         hostile.transfer(0, 1, 3, hostile.message_to("public.z", user_id=ALICE.encode()))],
        [_attach(2, "r0", sender=False, address="public.b"),
         _attach(3, "dyn", sender=False, address=None, dynamic=True)],
        [_attach(4, "big", sender=True, address="public.big"),
         hostile.transfer(0, 4, 0, b"\x00\x53\x75\xb0\x00\x00\x0f\xa0" + b"y" * 1000,
                          more=True),
         hostile.transfer(0, 4, 0, b"y" * 3000)],
        [hostile.shadow_attach(0, 5, shown="public.d", hidden="secret.f3d")],
        [hostile.attach_count_exceeds_size(0, 6, shown="public.a")],
        [hostile.attach_unknown_target_descriptor(0, 7, "secret.t")],
        [hostile.attach_ubyte_dynamic(0, 8, "secret.d")],
        [hostile.attach_ubyte_role(0, 9, "public.r")],
        [_attach(10, "s10", sender=True, address="public.m")]
        + [hostile.transfer_hidden_more(0, 10, 0, b"\x00\x53\x75\xa0\xf0" + b"z" * 240)] * 20,
        [_attach(11, "relay2", sender=True, address=None),
         hostile.transfer(0, 11, 0, hostile.message_described_message_id("public.ok",
                                                                          "secret.x")),
         hostile.transfer(0, 11, 1, hostile.message_properties_count_exceeds_size("secret.y")),
         hostile.transfer(0, 11, 2, hostile.message_router_annotation("public.ok",
                                                                      "secret.z")),
         hostile.transfer(0, 11, 3, hostile.message_to("public.after"))],
        # refused deliveries among allowed ones on two links, one of them multi-frame: the
        # router must read ids 0, 1, 2... and its outcomes must reach the right deliveries
        [_attach(12, "relay3", sender=True, address=None),
         _attach(13, "s13", sender=True, address="public.n"),
         hostile.transfer(0, 13, 0, hostile.message_to(None) + body),
         hostile.transfer(0, 12, 1, hostile.message_to("secret.a")),
         hostile.transfer(0, 12, 2, hostile.message_to("public.b")),
         hostile.transfer(0, 12, 3, hostile.message_to("secret.c"), more=True),
         hostile.transfer(0, 12, 3, b"\x00\x53\x75\xa0\x02zz"),
         hostile.transfer(0, 13, 4, hostile.message_to(None, user_id=CAROL.encode()) + body,
                          more=True),
         hostile.transfer(0, 13, 4, b"\x00\x53\x75\xa0\x02yy"),
         hostile.transfer(0, 13, 5, hostile.message_to(None) + body)],
    ]
    out = []
    for opening in range(len(OPENINGS)):
        for group in chunks:
            out.append(encode_input(opening, group))
    return out


def _as_bytes(value: Any) -> bytes:
    """A decoded delivery-tag as bytes; a client may type it as a string (not binary, as the
    spec says), which the engine keeps as its UTF-8 bytes.

    Raises:
        ValueError: any other type (a described value, a number...): the oracle cannot say
            which bytes the engine keeps for it.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise ValueError(f"delivery-tag of type {type(value).__name__}")
