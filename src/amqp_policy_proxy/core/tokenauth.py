"""Sans-IO. Token connections: what the core is given to check OAuth 2.0 access tokens, the
service identity it logs in to the router with, and the Open decision under a token's groups.

An upstream with ``token_authority`` (docs/oauth2.md, docs/decisions/0008) makes every client
connection a token connection: its sasl-init carries a JWT (PLAIN's password or OAUTHBEARER,
:mod:`..tokens.sasl`), which :func:`check_token` validates with the tokens package
against the keys :class:`TokenKeys` holds (the daemon's JWKS cache, fed by its fetches). The
token's identity claim is the policy user and its claims give the groups
(:func:`~..tokens.claims.identity_from_token`); :func:`token_open_decision` is
:func:`~..policy.decisions.approve_open` with those groups.

``proxy``: the proxy completes SASL with the client itself and logs in to the router with
:class:`ServiceLogin` (the router leg's ``LOGIN`` state, :mod:`.router_side`). ``upstream``:
the SASL exchange is relayed; the proxy refuses a token it does not accept before the router
sees it, and admits only once the router accepted it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..amqp.constants import SASL_FRAME
from ..amqp.performatives import SaslInit
from ..policy import decisions
from ..policy.lookup import resolve_vhost
from ..policy.reasons import ConnectionDenyReason
from ..tokens.claims import TokenIdentity, check_username, group_for, identity_from_token
from ..tokens.errors import RejectReason, TokenRejected
from ..tokens.jwks import JwkSet
from ..tokens.sasl import MECHANISMS, TokenCredentials, credentials_from_sasl
from ..tokens.validate import validate_token
from .wire import frame

if TYPE_CHECKING:
    from ..ingress.peer import ClientAddress
    from ..policy.model import Policy
    from ..tokens.config import TokenAuthConfig  # a type only: no pydantic in the core

PROXY = "proxy"
UPSTREAM = "upstream"
#: The refusal reason of a sasl-init that carries no token (another mechanism than PLAIN and
#: OAUTHBEARER, or a client that skipped SASL): not one of the tokens package's reasons, which
#: are about a token that is there.
NO_TOKEN = "no_token"
#: The close description of a token connection whose token expired (``set_expiry``).
TOKEN_EXPIRED = "token expired"
#: Every ``reason`` label value of ``amqp_proxy_token_rejections_total``.
REJECTION_REASONS: tuple[str, ...] = (*(r.value for r in RejectReason), NO_TOKEN)


class TokenKeys(Protocol):
    """The keys tokens are checked with, and the early refresh an unknown ``kid`` asks for.

    :class:`~..tokens.jwks.JwksCache` is it; the daemon fetches for it.
    """

    def keys(self, now: float) -> JwkSet | None:
        """The keys to trust at ``now`` (loop clock), None when there are none."""

    def unknown_kid(self, kid: str | None, now: float) -> bool:
        """A token named a ``kid`` the keys lack: True when a fetch is under way or now due
        (the caller waits for it), False when the token is to be refused now."""


@dataclass(frozen=True, slots=True)
class TokenAuth:
    """What a token connection needs: the ``[token_auth]`` settings, the authority of the
    upstreams, and the keys."""

    config: TokenAuthConfig
    authority: str
    """``proxy`` or ``upstream``."""
    keys: TokenKeys

    @property
    def proxy(self) -> bool:
        """The proxy completes SASL with the client and logs in to the router itself."""
        return self.authority == PROXY


@dataclass(frozen=True, slots=True)
class ServiceLogin:
    """The identity the proxy authenticates to the router with (``token_authority =
    "proxy"``): PLAIN with a user name and password, or EXTERNAL (the client certificate of
    the upstream's TLS settings)."""

    mechanism: str
    """``PLAIN`` or ``EXTERNAL``."""
    username: str = ""
    password: bytes = field(default=b"", repr=False)

    def initial_response(self) -> bytes:
        """The sasl-init's initial response (PLAIN: ``NUL user NUL password``; EXTERNAL:
        empty, the certificate's identity)."""
        if self.mechanism == "PLAIN":
            return b"\x00" + self.username.encode() + b"\x00" + self.password
        return b""

    def sasl_init_frame(self) -> bytes:
        """The whole sasl-init frame the proxy sends the router (encoded once per
        identity)."""
        found = _INIT_FRAMES.get(self)
        if found is None:
            found = frame(0, SaslInit(mechanism=self.mechanism,
                                      initial_response=self.initial_response()),
                          ftype=SASL_FRAME)
            if len(_INIT_FRAMES) >= 64:  # identities change only at reloads
                _INIT_FRAMES.clear()
            _INIT_FRAMES[self] = found
        return found


_INIT_FRAMES: dict[ServiceLogin, bytes] = {}


class TokenCheck:
    """A validated token connection: who, and until when."""

    __slots__ = ("identity", "mechanism")

    def __init__(self, identity: TokenIdentity, mechanism: str) -> None:
        """The identity the token gives, and the mechanism it came with."""
        self.identity = identity
        self.mechanism = mechanism


class Rejected(Exception):
    """A token sasl-init is refused: ``reason`` (a :data:`REJECTION_REASONS` value) and the
    words for the log (never the token)."""

    def __init__(self, reason: str, detail: str, *, kid: str | None = None,
                 unknown_kid: bool = False) -> None:
        """The refusal; ``unknown_kid``: the reason is an unknown ``kid`` (a refresh may help)."""
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.kid = kid
        self.unknown_kid = unknown_kid


def read_token(mechanism: str, response: bytes | None) -> TokenCredentials:
    """The token of a sasl-init (:func:`~..tokens.sasl.credentials_from_sasl`).

    Raises:
        Rejected: ``no_token`` for a mechanism other than PLAIN and OAUTHBEARER, ``malformed``
            for a response that does not hold a token.
    """
    if mechanism.upper() not in MECHANISMS:
        raise Rejected(NO_TOKEN, f"mechanism {mechanism[:32]!a} carries no token")
    try:
        return credentials_from_sasl(mechanism, response)
    except TokenRejected as exc:
        raise Rejected(exc.reason.value, exc.detail) from None


def check_token(auth: TokenAuth, bearer: TokenCredentials, now: float,
                wall: float) -> TokenCheck:
    """Validate the token of a sasl-init and map it to the policy's terms.

    Args:
        auth: the settings and the keys.
        bearer: what :func:`read_token` read.
        now: loop-clock seconds (the keys' clock).
        wall: wall-clock seconds since the epoch (the token's clock).

    Returns:
        The identity (policy user, groups per vhost, ``exp``).

    Raises:
        Rejected: the token's :class:`~..tokens.errors.TokenRejected` reason, or
            ``username_mismatch`` when the SASL user name is not the token's identity.
    """
    config = auth.config
    try:
        token = validate_token(bearer.token, config, auth.keys.keys(now), wall)
        identity = identity_from_token(token, config)
        check_username(identity.user, bearer.username)  # PLAIN's authcid
        check_username(identity.user, bearer.authzid)  # PLAIN's authzid, OAUTHBEARER's a=
    except TokenRejected as exc:
        raise Rejected(exc.reason.value, exc.detail, kid=exc.kid,
                       unknown_kid=exc.reason is RejectReason.UNKNOWN_KID) from None
    return TokenCheck(identity, bearer.mechanism)


def token_open_decision(policy: Policy, *, hostname: str | None, identity: TokenIdentity,
                        remote_host: str | ClientAddress
                        ) -> decisions.OpenAllowed | decisions.OpenDenied:
    """:func:`~..policy.decisions.approve_open` for a token connection: the vhost from the
    hostname, the group a ``[[token_auth.groups]]`` rule gives the token in that vhost (else
    the policy's own assignment of the identity), then ``remoteHosts``.

    Returns:
        As :func:`~..policy.decisions.approve_open`; the rule text says which scope gave the
        group.
    """
    user = identity.user
    vmatch = resolve_vhost(policy, hostname)
    if vmatch is None or vmatch.vhost.hostname not in identity.groups:
        # no rule decides this vhost: the policy's own users lists, '*' and $default
        return decisions.approve_open(policy, hostname=hostname, user=user,
                                      remote_host=remote_host)
    vhost = vmatch.vhost
    found = group_for(vhost, identity)
    rhost = remote_host if isinstance(remote_host, str) else remote_host.text
    if found is None:
        return decisions.OpenDenied(
            ConnectionDenyReason.UNKNOWN_USER, vhost, None,
            f"DENY AMQP Open for user '{user}', rhost '{rhost}', vhost '{vhost.hostname}': "
            "the token's group is not defined by the vhost",
            f"vhost '{vhost.hostname}'; token group '{identity.groups[vhost.hostname]}' not "
            "defined")
    if not found.group.remote_hosts.matches(remote_host):
        return decisions.OpenDenied(
            ConnectionDenyReason.REMOTE_HOST, vhost, found.group,
            f"DENY AMQP Open for user '{user}', rhost '{rhost}', vhost '{vhost.hostname}': "
            "User is not allowed to connect from this network host",
            f"vhost '{vhost.hostname}'; {found.rule}; no remoteHosts item of the group "
            "matches the client")
    return decisions.OpenAllowed(vhost, found.group,
                                 f"vhost '{vhost.hostname}'; {found.rule}; remoteHosts matches")


class Deciding(Protocol):
    """What :func:`open_decision` reads of a connection (its :class:`~.context.Context`)."""

    @property
    def token(self) -> TokenCheck | None:
        """The validated token, or None."""

    @property
    def user(self) -> str | None:
        """The authenticated user."""

    @property
    def client_address(self) -> str | ClientAddress:
        """The client's address."""


def open_decision(ctx: Deciding, policy: Policy, hostname: str | None
                  ) -> decisions.OpenAllowed | decisions.OpenDenied:
    """The Open decision (vhost, group, ``remoteHosts``) of the connection ``ctx`` under
    ``policy``: by its token's groups for a token connection (:func:`token_open_decision`),
    else :func:`~..policy.decisions.approve_open` of its user. Admission and a reload's
    re-evaluation both ask it."""
    token = ctx.token
    user = ctx.user
    assert user is not None
    if token is not None:
        return token_open_decision(policy, hostname=hostname, identity=token.identity,
                                   remote_host=ctx.client_address)
    return decisions.approve_open(policy, hostname=hostname, user=user,
                                  remote_host=ctx.client_address)
