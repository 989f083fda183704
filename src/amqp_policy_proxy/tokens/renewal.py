"""Sans-IO. In-band token renewal: the two requests clients send on a live connection, parsed
and answered, and the rule that decides whether the new token replaces the old one.

Two protocols, both answered by the proxy itself (never forwarded to a router that does not
know them):

* **CBS** (AMQP Claims-based Security, OASIS working draft; what the Azure Service Bus and
  Event Hubs clients speak): a request to the node ``$cbs`` with application-properties
  ``operation`` = ``put-token``, ``type`` (the token type: ``jwt`` is accepted,
  ``servicebus.windows.net:sastoken`` is not), ``name`` (the audience the token is for, kept
  for the log only) and optionally ``expiration`` (a timestamp; informative: the token's own
  ``exp`` governs); the token is the body, an amqp-value string. The response has
  application-properties ``status-code`` (an AMQP int: 202 accepted, 401 refused, 400 a
  malformed request) and ``status-description``, no body, its ``correlation-id`` the request's
  ``message-id`` and its ``to`` the request's ``reply-to``.
* **HTTP over AMQP** (RabbitMQ 4.1's management v2, on the link pair to ``/management``):
  properties ``to`` = ``/auth/tokens``, ``subject`` = ``PUT``, ``reply-to`` = ``$me``, a
  ``message-id``; the token is the body, an amqp-value binary (RabbitMQ's client; a string or
  data sections are read too). The response has properties ``subject`` = the status code
  (``204`` on success, ``401`` refused, ``400`` malformed), ``correlation-id`` = the request's
  ``message-id``, application-properties ``http:response`` = ``1.1``, and an amqp-value body:
  null, or the refusal's text.

:func:`renew` is the rule: a renewed token replaces the connection's identity only for the
same subject and an ``exp`` no earlier than the current one; its groups come back so that the
caller can re-check the links. A worse token (fails validation, another subject, an earlier
``exp``) changes nothing and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..amqp import codec
from ..policy.naming import RABBIT_MANAGEMENT_NODE
from .claims import TokenIdentity, identity_from_token
from .errors import RejectReason, TokenRejected, shown
from .jwks import JwkSet
from .sections import (
    MAX_MESSAGE_BYTES,
    Int32,
    Message,
    MessageError,
    Properties,
    decode_message,
    encode_message,
)
from .validate import ValidatedToken, validate_token

if TYPE_CHECKING:  # a type only: the schema (pydantic) stays out of the core
    from .config import TokenAuthConfig

CBS_NODE = "$cbs"
"""The CBS node's address (a client attaches a sender to it and a receiver from it)."""
MANAGEMENT_NODE = RABBIT_MANAGEMENT_NODE
"""RabbitMQ's management node: the address of the HTTP-over-AMQP link pair."""
AUTH_TOKENS_PATH = "/auth/tokens"
"""The HTTP-over-AMQP request target of a token renewal."""
PUT_TOKEN = "put-token"
JWT_TYPES = frozenset({"jwt", "servicebus.windows.net:jwt"})
"""The CBS token types read as a JWT."""
CBS_ACCEPTED, CBS_REFUSED = 202, 401
HTTP_NO_CONTENT, HTTP_UNAUTHORIZED = 204, 401
BAD_REQUEST, NOT_FOUND, METHOD_NOT_ALLOWED = 400, 404, 405


class RenewalRequestError(ValueError):
    """A renewal request that cannot be acted on: answer it with :attr:`status_code`.

    ``message_id`` and ``reply_to`` are the request's when they could be read (None when not:
    then the answer cannot be correlated and the caller may drop the request). The text
    never holds the token.
    """

    def __init__(self, status_code: int, description: str, *, message_id: Any = None,
                 reply_to: str | None = None) -> None:
        """Create the error with the status to answer and the request's ids."""
        super().__init__(description)
        self.status_code = status_code
        self.description = description
        self.message_id = message_id
        self.reply_to = reply_to


@dataclass(frozen=True, slots=True)
class CbsPutToken:
    """A CBS ``put-token`` request."""

    message_id: Any
    """The request's message-id (the response's correlation-id)."""
    reply_to: str | None
    """Where the response goes (its ``to``)."""
    token_type: str
    """``type``: ``jwt`` (or ``servicebus.windows.net:jwt``)."""
    audience: str
    """``name``: the audience the client says the token is for (for the log)."""
    expiration: float | None
    """``expiration`` in seconds since the epoch, if given (informative)."""
    token: str = field(repr=False)
    """The token (never in ``repr``)."""


@dataclass(frozen=True, slots=True)
class TokenPut:
    """A RabbitMQ ``PUT /auth/tokens`` request (HTTP over AMQP)."""

    message_id: Any
    """The request's message-id (the response's correlation-id)."""
    reply_to: str | None
    """``$me`` from RabbitMQ's client: the response goes back on the paired link."""
    token: bytes = field(repr=False)
    """The token (never in ``repr``)."""


def _read(payload: bytes | bytearray | memoryview, max_bytes: int) -> Message:
    try:
        return decode_message(payload, max_bytes=max_bytes)
    except MessageError as exc:
        raise RenewalRequestError(BAD_REQUEST, f"malformed request: {exc}") from None


def parse_cbs_put_token(payload: bytes | bytearray | memoryview, *,
                        max_bytes: int = MAX_MESSAGE_BYTES) -> CbsPutToken:
    """Read a CBS request sent to ``$cbs``.

    Args:
        payload: the request message's bytes.
        max_bytes: the largest request read.

    Returns:
        The ``put-token`` request.

    Raises:
        RenewalRequestError: status 400 for a message that is not well formed, lacks a
            message-id, is another operation (``delete-token``...), lacks ``type`` or
            ``name``, has an ``expiration`` that is not a timestamp, a token type other than
            a JWT, or a body that is not an amqp-value string.
    """
    msg = _read(payload, max_bytes)
    props = msg.properties or Properties()
    mid, reply_to = props.message_id, props.reply_to

    def bad(why: str) -> RenewalRequestError:
        return RenewalRequestError(BAD_REQUEST, why, message_id=mid, reply_to=reply_to)

    if mid is None:
        raise bad("the request has no message-id")
    app = msg.application_properties
    operation = app.get("operation")
    if operation != PUT_TOKEN:
        raise bad(f"operation '{shown(operation, 32)}' is not supported (only put-token)")
    token_type, name = app.get("type"), app.get("name")
    if not isinstance(token_type, str) or not isinstance(name, str):
        raise bad("put-token needs the string application-properties type and name")
    if token_type not in JWT_TYPES:
        raise bad(f"token type '{shown(token_type, 48)}' is not supported (only jwt)")
    expiration = app.get("expiration")
    if expiration is not None and not isinstance(expiration, codec.timestamp):
        raise bad("expiration is not a timestamp")
    if msg.body_kind != "value" or not isinstance(msg.body, str) or not msg.body:
        raise bad("the token must be the body, an amqp-value string")
    return CbsPutToken(mid, reply_to, token_type, name,
                       None if expiration is None else int(expiration) / 1000.0, msg.body)


def cbs_response(message_id: Any, reply_to: str | None, status_code: int,
                 description: str) -> bytes:
    """The response to a CBS request.

    Args:
        message_id: the request's message-id (the correlation-id).
        reply_to: the request's reply-to (the response's ``to``; None: not set).
        status_code: 202, 400 or 401 (written as an AMQP int).
        description: ``status-description`` (never the token).

    Returns:
        The response message's bytes: properties, application-properties, no body.
    """
    return encode_message(Properties(to=reply_to, correlation_id=message_id),
                          [("status-code", Int32(status_code)),
                           ("status-description", description)])


def parse_auth_tokens_put(payload: bytes | bytearray | memoryview, *,
                          max_bytes: int = MAX_MESSAGE_BYTES) -> TokenPut:
    """Read an HTTP-over-AMQP request sent on the management link pair.

    Args:
        payload: the request message's bytes.
        max_bytes: the largest request read.

    Returns:
        The ``PUT /auth/tokens`` request.

    Raises:
        RenewalRequestError: 400 for a message that is not well formed or lacks a message-id
            or a token body (amqp-value binary or string, or data); 404 for another request
            target; 405 for another method on ``/auth/tokens``.
    """
    msg = _read(payload, max_bytes)
    props = msg.properties or Properties()
    mid, reply_to = props.message_id, props.reply_to
    if mid is None:
        raise RenewalRequestError(BAD_REQUEST, "the request has no message-id",
                                  reply_to=reply_to)
    if props.to != AUTH_TOKENS_PATH:
        raise RenewalRequestError(NOT_FOUND, f"request target '{shown(props.to, 64)}' is not "
                                  f"{AUTH_TOKENS_PATH}", message_id=mid, reply_to=reply_to)
    if props.subject != "PUT":
        raise RenewalRequestError(METHOD_NOT_ALLOWED, f"method '{shown(props.subject, 16)}' "
                                  f"on {AUTH_TOKENS_PATH} (only PUT)", message_id=mid,
                                  reply_to=reply_to)
    body = msg.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    if msg.body_kind not in ("value", "data") or not isinstance(body, bytes) or not body:
        raise RenewalRequestError(BAD_REQUEST, "the token must be the body (an amqp-value "
                                  "binary)", message_id=mid, reply_to=reply_to)
    return TokenPut(mid, reply_to, body)


def auth_tokens_response(message_id: Any, status_code: int,
                         description: str | None = None) -> bytes:
    """The response to an HTTP-over-AMQP request, as RabbitMQ writes it.

    Args:
        message_id: the request's message-id (the correlation-id).
        status_code: 204, 400, 401, 404 or 405 (the ``subject``, as text).
        description: the refusal's text for the body (never the token); None: a null body.

    Returns:
        The response message's bytes.
    """
    return encode_message(Properties(subject=str(status_code), correlation_id=message_id),
                          [("http:response", "1.1")], body=description, body_kind="value")


# ------------------------------------------------------------------------------ the rule


@dataclass(frozen=True, slots=True)
class RenewalOutcome:
    """What a renewal did."""

    accepted: bool
    """The new token replaced the old one."""
    identity: TokenIdentity
    """The identity in force afterwards (the new one when accepted, else the current)."""
    reason: RejectReason | None = None
    """Why it was refused (the rejection metric's label), None when accepted."""
    detail: str = ""
    """The refusal in words (never the token), "" when accepted."""
    token: ValidatedToken | None = None
    """The new token when accepted."""
    groups_changed: bool = False
    """The new identity's groups differ from the old one's: re-check the links."""


def renew(current: TokenIdentity, token: str | bytes, *, config: TokenAuthConfig,
          keys: JwkSet | None, now: float) -> RenewalOutcome:
    """Decide a renewal with ``token`` on a connection whose identity is ``current``.

    Args:
        current: the connection's identity now.
        token: the token the request carries.
        config: the validation and group-mapping settings.
        keys: the JWKS's keys (None: none to trust).
        now: wall-clock seconds since the epoch.

    Returns:
        Accepted: the new identity (same user, its new groups and ``exp``). Refused: the
        current identity unchanged and the reason: the token's own (``expired``,
        ``bad_signature``...), ``subject_changed`` or ``not_newer``.
    """
    try:
        validated = validate_token(token, config, keys, now)
    except TokenRejected as exc:
        return RenewalOutcome(False, current, exc.reason, str(exc))
    if validated.subject != current.user:
        return RenewalOutcome(False, current, RejectReason.SUBJECT_CHANGED,
                              f"{RejectReason.SUBJECT_CHANGED.value}: the token is for "
                              f"'{shown(validated.subject)}', the connection for "
                              f"'{shown(current.user)}'")
    if validated.expires_at < current.expires_at:
        return RenewalOutcome(False, current, RejectReason.NOT_NEWER,
                              f"{RejectReason.NOT_NEWER.value}: the token expires "
                              f"{current.expires_at - validated.expires_at:.0f} s before the "
                              "current one")
    renewed = identity_from_token(validated, config)
    return RenewalOutcome(True, renewed, token=validated,
                          groups_changed=dict(renewed.groups) != dict(current.groups))


def answer_cbs(request: CbsPutToken, outcome: RenewalOutcome) -> bytes:
    """The CBS response for a decided ``put-token``: 202, or 401 with the reason."""
    if outcome.accepted:
        return cbs_response(request.message_id, request.reply_to, CBS_ACCEPTED, "Accepted")
    return cbs_response(request.message_id, request.reply_to, CBS_REFUSED, outcome.detail)


def answer_auth_tokens(request: TokenPut, outcome: RenewalOutcome) -> bytes:
    """The HTTP-over-AMQP response for a decided ``PUT /auth/tokens``: 204, or 401 with the
    reason as its body."""
    if outcome.accepted:
        return auth_tokens_response(request.message_id, HTTP_NO_CONTENT)
    return auth_tokens_response(request.message_id, HTTP_UNAUTHORIZED, outcome.detail)
