"""Hand-built hostile frames: the policy bypasses of issue 14, byte for byte.

Each builder returns whole frames a client with one valid account could send. They exploit
the ways AMQP readers disagree: a list read by its *count* (proton's Python ``Data`` decoder)
or by its *size* (proton's C engine, which qdrouterd and the in-tree broker use); a field of
the wrong type (the C engine skips it and uses the default); a described value where the
spec has none (qdrouterd's message walker steps over ``0x00`` as one byte). The proxy must
refuse every one of them (``amqp:decode-error``, or a refused message) and forward nothing.
"""

from __future__ import annotations

from amqp_policy_proxy.amqp.framing import encode_frame


def _str8(text: str) -> bytes:
    raw = text.encode()
    return b"\xa1" + bytes([len(raw)]) + raw


def _sym8(text: str) -> bytes:
    raw = text.encode()
    return b"\xa3" + bytes([len(raw)]) + raw


def _bin8(raw: bytes) -> bytes:
    return b"\xa0" + bytes([len(raw)]) + raw


def list32(items: bytes, count: int, *, size: int | None = None) -> bytes:
    """A list32 of ``items`` whose header claims ``count`` elements (and ``size`` if given)."""
    size = len(items) + 4 if size is None else size
    return b"\xd0" + size.to_bytes(4, "big") + count.to_bytes(4, "big") + items


def described(code: int, value: bytes) -> bytes:
    """``value`` described by the smallulong ``code``."""
    return b"\x00\x53" + bytes([code]) + value


def amqp_frame(channel: int, body: bytes) -> bytes:
    """An AMQP frame (type 0) with ``body``."""
    return encode_frame(channel, body, 0)


def sasl_frame(body: bytes) -> bytes:
    """A SASL frame (type 1) with ``body``."""
    return encode_frame(0, body, 1)


def source(address: str | None, *, dynamic: bytes = b"") -> bytes:
    """A source (0x28) with ``address`` and optionally a raw ``dynamic`` field."""
    fields = (_str8(address) if address is not None else b"\x40")
    count = 1
    if dynamic:
        fields += b"\x40\x40\x40" + dynamic  # durable, expiry-policy, timeout, dynamic
        count = 5
    return described(0x28, list32(fields, count))


def target(address: str | None, *, code: int = 0x29) -> bytes:
    """A target with ``address``, described by ``code`` (0x29 is the real one)."""
    fields = _str8(address) if address is not None else b"\x40"
    return described(code, list32(fields, 1))


def attach_fields(name: str, handle: int, *, role: bytes, source_: bytes,
                  target_: bytes) -> bytes:
    """The first seven fields of an Attach, each already encoded by the caller's choice."""
    return (_str8(name) + b"\x52" + bytes([handle]) + role + b"\x40\x40" + source_ + target_)


# ------------------------------------------------------------------ finding 1 and 2: SASL


def plain_init(authcid: str, password: str, *, authzid: str = "") -> bytes:
    """A well-formed PLAIN sasl-init naming ``authzid`` while authenticating ``authcid``."""
    response = authzid.encode() + b"\0" + authcid.encode() + b"\0" + password.encode()
    return sasl_frame(described(0x41, list32(_sym8("PLAIN") + _bin8(response), 2)))


def sasl_init_count_exceeds_size(claimed: str, authcid: str, password: str) -> bytes:
    """Finding 2: a PLAIN sasl-init list sized for the mechanism only, with count 2.

    A count-driven reader takes the initial response after the list (``\\0claimed\\0x``) as
    field 2; the router reads by size, sees no initial response, sends an empty challenge and
    authenticates the real credentials from the sasl-response (:func:`sasl_response`).
    """
    mechanism = _sym8("PLAIN")
    hidden = _bin8(b"\0" + claimed.encode() + b"\0x")
    listed = list32(mechanism, 2, size=len(mechanism) + 4)
    del authcid, password  # sent later, in the sasl-response
    return sasl_frame(described(0x41, listed + hidden))


def sasl_response(authcid: str, password: str) -> bytes:
    """A sasl-response carrying PLAIN credentials."""
    return sasl_frame(described(0x43, list32(_bin8(b"\0" + authcid.encode() + b"\0"
                                                   + password.encode()), 1)))


def sasl_init_deeply_nested(depth: int = 2000) -> bytes:
    """Finding 10: a sasl-init whose mechanism is a list nested ``depth`` deep."""
    value = b"\x45"
    for _ in range(depth):
        value = b"\xd0" + (len(value) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + value
    return sasl_frame(described(0x41, list32(value, 1)))


# ------------------------------------------------------------------ findings 3, 4, 6: Attach


def shadow_attach(channel: int, handle: int, *, shown: str, hidden: str) -> bytes:
    """Finding 3: the Attach's ``name`` is a list of size 1 and count 6.

    Read by count, the name swallows the next six fields (handle .. target ``hidden``), so
    the fields after them, a sender to ``shown``, are the Attach's. Read by size (the
    router), the name is an empty list and the Attach is a sender to ``hidden``.
    """
    fake_name = b"\xc0\x01\x06"
    real = (b"\x52" + bytes([handle]) + b"\x42\x40\x40" + source(None) + target(hidden))
    shown_fields = (b"\x52" + bytes([handle]) + b"\x42\x40\x40" + source(None) + target(shown))
    return amqp_frame(channel, described(0x12, list32(fake_name + real + shown_fields, 7)))


def attach_count_exceeds_size(channel: int, handle: int, *, shown: str) -> bytes:
    """Finding 4: an Attach list whose size ends before its target.

    Read by count, the target ``shown`` after the list is field 6; read by size (the
    router), the Attach has no target: an anonymous-relay sender.
    """
    head = _str8("count-gt-size") + b"\x52" + bytes([handle]) + b"\x42\x40\x40" + source(None)
    listed = list32(head, 7, size=len(head) + 4)
    return amqp_frame(channel, described(0x12, listed + target(shown)))


def attach_unknown_target_descriptor(channel: int, handle: int, address: str) -> bytes:
    """Finding 6: a sender whose target is described by 0x77, not 0x29.

    The proxy's codec does not know 0x77 (no address: anonymous); the router's engine
    ignores the descriptor and reads the list as a target with ``address``.
    """
    fields = attach_fields("odd-target", handle, role=b"\x42", source_=source(None),
                           target_=target(address, code=0x77))
    return amqp_frame(channel, described(0x12, list32(fields, 7)))


def attach_ubyte_dynamic(channel: int, handle: int, address: str) -> bytes:
    """Finding 6: a receiver whose source has ``dynamic = ubyte(1)``.

    Truthy for a Python reader (dynamic: sources not checked); not a boolean for the
    router's engine, which reads ``dynamic`` false and attaches ``address``.
    """
    fields = attach_fields("ubyte-dynamic", handle, role=b"\x41",
                           source_=source(address, dynamic=b"\x50\x01"), target_=target(None))
    return amqp_frame(channel, described(0x12, list32(fields, 7)))


def attach_ubyte_role(channel: int, handle: int, address: str) -> bytes:
    """Finding 6: ``role = ubyte(1)``: a receiver to a Python reader, a sender to the router."""
    fields = attach_fields("ubyte-role", handle, role=b"\x50\x01", source_=source(address),
                           target_=target(address))
    return amqp_frame(channel, described(0x12, list32(fields, 7)))


# ------------------------------------------------------------------ finding 7: Transfer


def transfer_hidden_more(channel: int, handle: int, delivery_id: int, payload: bytes) -> bytes:
    """Finding 7: a Transfer list of count 5 with a sixth field ``more=true`` inside its size.

    Read by count, each frame is a whole delivery (checked against maxMessageSize alone);
    read by size (the router), ``more`` is true and the frames join into one message.
    """
    fields = (b"\x52" + bytes([handle]) + b"\x70" + delivery_id.to_bytes(4, "big")
              + _bin8(delivery_id.to_bytes(4, "big")) + b"\x43" + b"\x42")
    listed = list32(fields + b"\x41", 5)  # count 5, size covering the sixth: more = true
    return amqp_frame(channel, described(0x14, listed) + payload)


def transfer(channel: int, handle: int, delivery_id: int, payload: bytes, *,
             more: bool = False) -> bytes:
    """A plain, canonical Transfer."""
    fields = (b"\x52" + bytes([handle]) + b"\x70" + delivery_id.to_bytes(4, "big")
              + _bin8(delivery_id.to_bytes(4, "big")) + b"\x43" + b"\x42"
              + (b"\x41" if more else b"\x42"))
    return amqp_frame(channel, described(0x14, list32(fields, 6)) + payload)


# ------------------------------------------------------------------ findings 5, 8: messages


def properties(fields: bytes, count: int, *, size: int | None = None) -> bytes:
    """A properties section (0x73) over raw ``fields``."""
    return described(0x73, list32(fields, count, size=size))


def body(text: bytes = b"x") -> bytes:
    """An amqp-value section holding binary ``text``."""
    return described(0x77, _bin8(text))


def message_described_message_id(shown_to: str, hidden_to: str) -> bytes:
    """Finding 5: a message-id encoded as a described value.

    qdrouterd's properties walker steps over the ``0x00`` as a one-byte field, so its
    ``user-id`` is the descriptor and its ``to`` is the described value's value
    (``hidden_to``); every AMQP decoder reads the described message-id whole and then
    ``shown_to``.
    """
    message_id = b"\x00\x53\x01" + _str8(hidden_to)
    fields = message_id + b"\x40" + _str8(shown_to)
    return properties(fields, 3) + body()


def message_properties_count_exceeds_size(hidden_to: str) -> bytes:
    """Finding 5: a properties list whose size ends before its ``to``.

    qdrouterd's properties walker reads the fields by count, so its ``to`` is ``hidden_to``,
    after the list; a size-driven reader sees a properties list without ``to`` (nothing to
    check on an anonymous-relay link).
    """
    fields = b"\x40\x40"
    return properties(fields, 3, size=len(fields) + 4) + _str8(hidden_to) + body()


def message_router_annotation(to: str, annotated_to: str) -> bytes:
    """Finding 8: an anonymous-relay message with ``x-opt-qd.to`` among its annotations."""
    entries = _sym8("x-opt-qd.to") + _str8(annotated_to)
    annotations = described(0x72, b"\xd1" + (len(entries) + 4).to_bytes(4, "big")
                            + (2).to_bytes(4, "big") + entries)
    return annotations + properties(b"\x40\x40" + _str8(to), 3) + body()


def message_to(to: str | None, *, user_id: bytes | None = None) -> bytes:
    """A canonical message with ``to`` (and ``user-id``)."""
    fields = b"\x40" + (_bin8(user_id) if user_id is not None else b"\x40") + (
        _str8(to) if to is not None else b"\x40")
    return properties(fields, 3) + body()
