"""Sans-IO. Names as the upstream resolves them: addresses and identities (decision 0007).

The proxy decides on a name and the upstream acts on a name; the two must be the same name.
An upstream does not route on the address text a client writes, nor look up the user name a
client sends, byte for byte: qdrouterd drops a scheme and authority, a leading ``/``, one
trailing separator, and serves ``$management``, ``_local/``, ``_topo/`` and ``_edge/`` itself;
``$`` names are system names on most brokers;
RabbitMQ maps ``/topic/K`` and ``/exchange/amq.topic/K`` to one routing key and takes the
routing key from each message's ``subject`` where the target leaves it empty; Cyrus SASL trims
the authentication identity. So every address decision (Attach sources and targets,
anonymous-relay ``to``, ``${user}`` rules, the topic models, the per-delivery topic filter)
is made on the :class:`Node` that :meth:`Naming.resolve` gives, and every identity on
:meth:`Naming.identity`'s name. The client's own text is forwarded unchanged: the upstream
resolves it to the node the proxy checked.

Three kinds (``[[upstream]] kind``):

* ``qdrouterd``: its address view (qpid-dispatch ``src/iterator.c``, the hash view routing
  uses) and Cyrus SASL's identity canonicalisation.
* ``rabbitmq``: RabbitMQ's AMQP 1.0 address formats, v1 (3.x: ``/queue/Q``, ``/exchange/X/K``,
  ``/topic/K``, ``/amq/queue/Q``, ``/reply-queue/Q``, a bare queue name) and v2 (3.13+/4.x:
  ``/queues/Q``, ``/exchanges/X/K``, percent-encoded), written in one canonical form; names are
  compared exactly by its internal authentication backend.
* ``other`` (the default: an upstream whose resolution the proxy does not know): only
  addresses that are already their own canonical form (no ``:/``, no leading ``/`` or ``_``,
  no ``//``, no trailing separator); anything else is refused like a denied address.

Router-internal nodes (``$management`` and every other ``$`` name, qdrouterd's ``_local/``,
``_topo/``, ``_edge/`` classes) come back with ``internal`` set: a rule allows them only when it names them
literally (:meth:`~.addresses.AddressRules.allows_literal`), never through ``*``, a pattern or
a topic wildcard; a ``$`` tree a vhost declares as broker topics (``topicTree``
``systemPrefixes``, e.g. MQTT's ``$SYS``) is granted like any address
(:func:`~.decisions.node_allowed`), ``$management`` never.

No I/O, no clock, no imports outside the standard library.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal, NamedTuple

KINDS: Final = ("qdrouterd", "rabbitmq", "other")
"""Accepted ``[[upstream]] kind`` values."""
IDENTITY_MODES: Final = ("strict", "canonical")
"""Accepted ``[[upstream]] identity`` values: ``strict`` refuses (SASL outcome ``auth``) a name
the authenticator would change; ``canonical`` takes the changed name."""

#: RabbitMQ 4.x's management node (HTTP over AMQP: queues, exchanges, bindings, token
#: renewal): internal, so only a rule naming it literally allows a link to or from it.
RABBIT_MANAGEMENT_NODE: Final = "/management"
#: Prefixes of qdrouterd's router-internal address classes (after its address view).
QDR_INTERNAL_PREFIXES: Final = ("_local", "_topo", "_edge", "$")
#: The management node (qdrouterd's agent subscribes it as a mobile address; Artemis, Azure and
#: the AMQP management draft use the same name): internal, and never a declared system prefix.
MANAGEMENT_NODE: Final = "$management"


def is_management(name: str) -> bool:
    """Whether ``name`` is the management node or a name below it (``$management.x``)."""
    return name.startswith(MANAGEMENT_NODE) and (
        len(name) == len(MANAGEMENT_NODE) or name[len(MANAGEMENT_NODE)] in "./:")
#: What ``isspace`` is in the C locale: what Cyrus SASL trims from an identity.
C_WHITESPACE: Final = " \t\n\v\f\r"
#: RabbitMQ's default topic exchange (``/topic/K`` publishes there).
RABBIT_TOPIC_EXCHANGE: Final = "amq.topic"


class Node(NamedTuple):
    """An address as the upstream resolves it."""

    name: str
    """The canonical name rules match (qdrouterd: its routing view, e.g. ``secret.a`` for
    ``public.x:/secret.a``; RabbitMQ: ``/queue/Q``, ``/topic/K``, ``/exchange/X/K``)."""
    internal: bool = False
    """A router-internal node: allowed only by a literal grant."""
    topic: str | None = None
    """What the topic models see: qdrouterd's node name, RabbitMQ's routing key on the topic
    exchange; None: the node is no topic (the topic models see :attr:`name`)."""
    by_subject: bool = False
    """RabbitMQ: the target leaves the routing key empty, so each message's ``subject`` is the
    routing key (:meth:`Naming.with_subject` gives the node of one message)."""

    @property
    def topic_name(self) -> str:
        """The string the topic models decide on."""
        return self.name if self.topic is None else self.topic


class _Memo(Enum):
    """The memo's marker of an address it does not know (an Enum member: mypy narrows it)."""

    NOT_KNOWN = 0


_NOT_KNOWN: Final[Literal[_Memo.NOT_KNOWN]] = _Memo.NOT_KNOWN
"""What :meth:`Naming.resolve`'s memo holds for an address not resolved yet."""


class Naming:
    """How one kind of upstream resolves addresses and identities.

    Args:
        kind: one of :data:`KINDS`.
        identity_mode: one of :data:`IDENTITY_MODES`.
        realm: a realm the upstream's SASL appends to a name without ``@`` (Cyrus with a
            ``user_realm``), or None. qdrouterd's listeners pass none.

    Raises:
        ValueError: an unknown kind or identity mode, or an empty realm.
    """

    __slots__ = ("kind", "identity_mode", "realm", "_memo")

    def __init__(self, kind: str = "other", *, identity_mode: str = "strict",
                 realm: str | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown upstream kind {kind!r} (one of {', '.join(KINDS)})")
        if identity_mode not in IDENTITY_MODES:
            raise ValueError(f"unknown identity mode {identity_mode!r}")
        if realm is not None and not realm:
            raise ValueError("empty realm")
        self.kind = kind
        self.identity_mode = identity_mode
        self.realm = realm
        self._memo: dict[str, Node | None] = {}

    def __repr__(self) -> str:
        return (f"Naming({self.kind!r}, identity_mode={self.identity_mode!r}, "
                f"realm={self.realm!r})")

    # -- addresses -----------------------------------------------------------------------

    def resolve(self, address: str) -> Node | None:
        """The node ``address`` names on this upstream, or None when the proxy cannot be
        sure which node the upstream would pick (refused like a denied address).

        Args:
            address: a terminus address or a message's ``to``, as the client wrote it.
        """
        memo = self._memo
        got = memo.get(address, _NOT_KNOWN)
        if got is not _NOT_KNOWN:
            return got
        if self.kind == "qdrouterd":
            node = qdr_node(address)
        elif self.kind == "rabbitmq":
            node = rabbit_node(address)
        else:
            node = strict_node(address)
        if len(memo) >= 4096:
            memo.clear()
        if len(address) <= 512:
            memo[address] = node
        return node

    def with_subject(self, node: Node, subject: str | None) -> Node | None:
        """The node one message on a :attr:`Node.by_subject` link goes to (RabbitMQ routes it
        by its ``subject``), or None when that is not known (no subject on ``/queue``).

        Args:
            node: the link's target node (``by_subject`` set).
            subject: the message's ``properties.subject``, None when absent.
        """
        if not node.by_subject:
            return node
        if node.name == "/queue":
            if not subject:
                return None
            return Node("/queue/" + subject)
        exchange = node.name[len("/exchange/"):].rstrip("/")
        return _exchange_node(exchange, subject or "")

    # -- identities ----------------------------------------------------------------------

    def identity(self, user: str) -> str | None:
        """The name the upstream's authenticator will record for the identity ``user``, or
        None when the proxy refuses it (SASL outcome ``auth``).

        qdrouterd (Cyrus SASL ``canon_user``) and unknown upstreams: leading and trailing C
        whitespace is trimmed (all whitespace is refused, as Cyrus refuses it); ``strict``
        refuses a name that trimming would change, ``canonical`` takes the trimmed name; a
        name with another control character is refused. A configured realm is appended to a
        name without ``@``. RabbitMQ: its internal backend compares names exactly; only a
        name with a control character is refused.
        """
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in user.strip(C_WHITESPACE)):
            return None
        if self.kind != "rabbitmq":
            trimmed = user.strip(C_WHITESPACE)
            if not trimmed:
                return None
            if trimmed != user and self.identity_mode == "strict":
                return None
            user = trimmed
        elif any(ord(ch) < 0x20 for ch in user):
            return None
        if self.realm is not None and "@" not in user:
            user = f"{user}@{self.realm}"
        return user


#: The naming of an upstream whose resolution the proxy does not know: the safe default.
DEFAULT_NAMING: Final = Naming("other")


# -- qdrouterd -------------------------------------------------------------------------------

def qdr_view(address: str) -> str:
    """qdrouterd's address view of ``address``: the text it routes on, before the class prefix.

    The state machine of qpid-dispatch ``parse_address_view`` (iterator.c): ``X:/rest`` ->
    ``rest`` (the first ``:/`` after the first character), ``X://authority/rest`` and
    ``//authority/rest`` -> ``rest``, ``/rest`` -> ``rest`` (one step only); a string where
    none of these completes stays whole. Then one trailing ``.`` or ``/`` is dropped.
    """
    n = len(address)
    start = 0
    if n:
        if address[0] == "/":
            if n > 1:
                if address[1] == "/":
                    slash = address.find("/", 2)
                    start = slash + 1 if slash >= 0 else 0
                else:
                    start = 1
        else:
            i = 1
            while i < n:
                if address[i] == ":":
                    if i + 1 < n and address[i + 1] == "/":
                        if i + 2 < n:
                            if address[i + 2] == "/":
                                slash = address.find("/", i + 3)
                                start = slash + 1 if slash >= 0 else 0
                            else:
                                start = i + 2
                        break
                    i += 2  # the character after ':' is not looked at again
                    continue
                i += 1
    view = address[start:]
    if view and view[-1] in "./":
        view = view[:-1]
    return view


def qdr_node(address: str) -> Node | None:
    """The node qdrouterd routes ``address`` to (:func:`qdr_view`), internal for its
    router-internal classes; None for an empty view."""
    view = qdr_view(address)
    if not view:
        return None
    internal = view.startswith(QDR_INTERNAL_PREFIXES)
    return Node(view, internal, view)


# -- RabbitMQ --------------------------------------------------------------------------------

def _exchange_node(exchange: str, key: str) -> Node | None:
    if not exchange:
        return None
    if exchange == RABBIT_TOPIC_EXCHANGE:
        return Node("/topic/" + key, False, key)
    return Node(f"/exchange/{exchange}/{key}")


def _pct_decode(text: str) -> str | None:
    """RFC 3986 percent-decoding of a v2 address segment (UTF-8); None when malformed."""
    if "%" not in text:
        return text
    out = bytearray()
    i = 0
    raw = text.encode("utf-8")
    while i < len(raw):
        if raw[i] == 0x25:
            hexa = raw[i + 1:i + 3]
            if len(hexa) != 2 or any(c not in b"0123456789abcdefABCDEF" for c in hexa):
                return None
            out.append(int(hexa, 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def rabbit_node(address: str) -> Node | None:
    """The node RabbitMQ's AMQP 1.0 plugin resolves ``address`` to, in one canonical form.

    v1 (``rabbit_routing_util:parse_endpoint``, 3.x): a name without ``/`` and
    ``/queue/Q``, ``/amq/queue/Q``, ``/reply-queue/Q`` are queue Q (``%2F`` unescaped to
    ``/`` in Q, as RabbitMQ does, except in reply-queue names) -> ``/queue/Q``;
    ``/exchange/X/K`` -> ``/exchange/X/K``, on ``amq.topic`` -> ``/topic/K``; ``/topic/K`` ->
    ``/topic/K``; ``/exchange/X``, ``/exchange/X/`` and ``/queue`` leave the routing key to each
    message's ``subject`` (``by_subject``). v2 (3.13+, 4.x): ``/queues/Q``, ``/exchanges/X/K``
    and ``/exchanges/X``, percent-decoded. Anything else (more segments, ``/temp-queue/``, a
    decoded name holding ``/``, an empty name) is None: RabbitMQ refuses it or its meaning is
    not certain. ``/management`` (4.x's HTTP-over-AMQP node, exactly that text) is the broker's
    own: internal, allowed only by a rule that names it literally.
    """
    if not address or any(ord(c) < 0x20 for c in address):
        return None
    if address == RABBIT_MANAGEMENT_NODE:
        return Node(RABBIT_MANAGEMENT_NODE, internal=True)
    if "/" not in address:
        return Node("/queue/" + _v1_unescape(address))
    parts = address.split("/")
    if parts[0] != "":
        return None
    head, rest = parts[1], parts[2:]
    if head == "queue":
        if not rest:
            return Node("/queue", by_subject=True)
        if len(rest) == 1 and rest[0]:
            return Node("/queue/" + _v1_unescape(rest[0]))
        return None
    if head == "amq" and len(rest) == 2 and rest[0] == "queue" and rest[1]:
        return Node("/queue/" + _v1_unescape(rest[1]))
    if head == "reply-queue" and rest and all(rest):
        return Node("/queue/" + "/".join(rest))
    if head == "topic" and len(rest) == 1:
        return _exchange_node(RABBIT_TOPIC_EXCHANGE, _v1_unescape(rest[0]))
    if head == "exchange" and 1 <= len(rest) <= 2 and rest[0]:
        exchange = _v1_unescape(rest[0])
        if len(rest) == 1 or rest[1] == "":
            return Node(f"/exchange/{exchange}/", by_subject=True)
        return _exchange_node(exchange, _v1_unescape(rest[1]))
    if head == "queues" and len(rest) == 1:
        queue = _pct_decode(rest[0])
        if not queue or "/" in queue:
            return None
        return Node("/queue/" + queue)
    if head == "exchanges" and 1 <= len(rest) <= 2:
        decoded = _pct_decode(rest[0])
        key = _pct_decode(rest[1]) if len(rest) == 2 else ""
        if not decoded or key is None or "/" in decoded:
            return None
        if len(rest) == 1:
            return Node(f"/exchange/{decoded}/", by_subject=True)
        return _exchange_node(decoded, key)
    return None


def _v1_unescape(segment: str) -> str:
    """RabbitMQ 3.x ``rabbit_routing_util:unescape``: only ``%2F`` (upper case) becomes ``/``."""
    return segment.replace("%2F", "/")


# -- any other upstream ----------------------------------------------------------------------

def strict_node(address: str) -> Node | None:
    """``address`` when it is its own canonical form on any upstream, else None.

    Canonical: not empty, no ``:/``, no leading ``/`` or ``_``, no ``//``, no trailing ``.`` or
    ``/``, no control character. ``$`` names are router-internal.
    """
    if (not address or ":/" in address or "//" in address or address[0] in "/_"
            or address[-1] in "./" or any(ord(c) < 0x20 for c in address)):
        return None
    return Node(address, address.startswith("$"), address)
