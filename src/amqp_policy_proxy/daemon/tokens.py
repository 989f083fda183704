"""Daemon layer. Token connections' I/O: fetching the JWKS for the core's checks, and the
service identities the proxy logs in to routers with (docs/oauth2.md).

:class:`TokenService` drives the sans-IO :class:`~..tokens.jwks.JwksCache`: one task sleeps
until the cache says a fetch is due (at start, every ``jwks_refresh_seconds``, early for an
unknown ``kid``, with back-off after failures), fetches ``jwks_url`` with aiohttp (bounded by
``jwks_fetch_timeout_seconds`` and ``jwks_max_bytes``) or reads ``jwks_file`` off the loop, and
reports the bytes or the failure to the cache, which keeps the last good keys in use while the
source is down. After each fetch the connections whose token waits for it
(:attr:`~..core.view.ConnectionView.token_waiting`) are fed ``keys_changed``. The cache's
figures go to the metrics snapshot (age, keys, usable) and a failure counter.

The service identity of each ``[[upstream]]`` (``service_username`` with the password from
``service_password_file``, or the upstream's ``tls_cert`` by SASL EXTERNAL) is read at start
and at each reload; the password never reaches a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.tokenauth import ServiceLogin, TokenAuth
from ..tokens.jwks import JwksCache, JwksError
from .settings import ConfigError, DaemonConfig, UpstreamConfig

if TYPE_CHECKING:
    from ..policy.model import Policy
    from ..tokens.config import TokenAuthConfig

__all__ = ["JwksFigures", "TokenService", "read_service_login"]

logger = logging.getLogger(__name__)

#: The longest a fetch loop sleeps before it looks at the cache again (seconds): an unknown
#: ``kid`` makes a fetch due at once, and the loop is woken for it, so this is only a bound.
MAX_SLEEP = 60.0


@dataclass(frozen=True, slots=True)
class JwksFigures:
    """The JWKS figures of the metrics snapshot."""

    source: str
    """The URL or the file."""
    age_seconds: float | None
    """Seconds since the last good fetch; None: never fetched."""
    keys: int
    """Usable keys held."""
    usable: bool
    """Tokens can be checked (keys held, not older than ``jwks_max_stale_seconds``)."""
    failures_total: int
    """Failed fetches since start (a counter)."""


def read_service_login(upstream: UpstreamConfig) -> ServiceLogin | None:
    """The service identity of ``upstream`` (``token_authority = "proxy"``).

    Returns:
        PLAIN with ``service_username`` and the first line of ``service_password_file``;
        EXTERNAL when the upstream has only a ``tls_cert``; None when it takes no tokens.

    Raises:
        ConfigError: the password file cannot be read or is empty (``key: path: reason``).
    """
    if upstream.token_authority != "proxy":
        return None
    if upstream.service_username is None or upstream.service_password_file is None:
        return ServiceLogin("EXTERNAL")
    path = upstream.service_password_file
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"upstream {upstream.address}: service_password_file: {path}: "
                           f"cannot read: {getattr(exc, 'strerror', None) or exc}"]) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ConfigError([f"upstream {upstream.address}: service_password_file: {path}: "
                           "empty"])
    return ServiceLogin("PLAIN", upstream.service_username, password.encode("utf-8"))


class TokenService:
    """The JWKS cache and its fetches, and the upstreams' service identities.

    Args:
        config: the daemon's configuration (``token_auth`` must be set).
        loop_time: the loop clock (seconds).
        waiting: returns the connections to wake after a fetch (``conn_id`` -> an object
            with ``conn``, a :class:`~..core.connection.ProxyConnection`, and ``run(step)``
            as :class:`~.relay.ClientProtocol` has).
    """

    def __init__(self, config: DaemonConfig, loop_time: Callable[[], float],
                 waiting: Callable[[], Mapping[str, Any]]) -> None:
        """Nothing fetched yet (the first fetch is due at once)."""
        auth = config.token_auth
        assert auth is not None
        self.config: TokenAuthConfig = auth
        self.cache = JwksCache.from_config(auth)
        self.token_auth = TokenAuth(auth, auth.token_authority, _WakingKeys(self))
        """What each connection is given (the core's :class:`~..core.tokenauth.TokenAuth`)."""
        self._time = loop_time
        self._waiting = waiting
        self._logins: dict[UpstreamConfig, ServiceLogin | None] = {
            up: read_service_login(up) for up in config.upstreams}
        self.failures_total = 0
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._session: Any = None

    def login(self, upstream: UpstreamConfig) -> ServiceLogin | None:
        """The service identity to log in to ``upstream`` with (None: none needed)."""
        return self._logins.get(upstream)

    def reload_logins(self, config: DaemonConfig) -> None:
        """Read the service password files again (SIGHUP); a file that fails keeps the
        identity read before, with an error logged."""
        for up in config.upstreams:
            try:
                self._logins[up] = read_service_login(up)
            except ConfigError as exc:
                logger.error("service identity not reloaded, the previous one stays: %s",
                             exc.issues[0] if exc.issues else exc)

    def log_mapping_issues(self, policy: Policy) -> None:
        """Warn about ``[[token_auth.groups]]`` rules that name a vhost or group ``policy``
        does not define (such a rule gives no group; the policy's own users lists apply): at
        start and after each reload."""
        from ..tokens.claims import mapping_issues

        for issue in mapping_issues(self.config, policy):
            logger.warning("%s", issue)

    def figures(self) -> JwksFigures:
        """The cache's figures now, for the metrics snapshot."""
        status = self.cache.status(self._time())
        return JwksFigures(self.cache.source, status.age_seconds, status.keys, status.usable,
                           self.failures_total)

    # ------------------------------------------------------------------ fetching

    async def start(self, first_wait: float = 5.0) -> None:
        """Start fetching, having waited up to ``first_wait`` seconds for the first fetch (a
        start with the issuer down or slow goes on, the fetch with it: tokens are refused as
        ``jwks_unavailable`` until one succeeds)."""
        if self.config.jwks_url is not None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.jwks_fetch_timeout_seconds))
        loop = asyncio.get_running_loop()
        self._first = loop.create_task(self.fetch_once())
        await asyncio.wait({self._first}, timeout=first_wait)
        if not self._first.done():
            logger.warning("JWKS %s: the first fetch did not finish within %.0f s; going on "
                           "(tokens are refused until it does)", self.cache.source, first_wait)
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        """Stop fetching."""
        for task in (self._first, self._task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._first = self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def wake(self) -> None:
        """A connection's unknown ``kid`` made a fetch due: look at the cache now."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            at = self.cache.next_fetch_at()
            now = self._time()
            wait = MAX_SLEEP if at is None else max(0.0, min(at - now, MAX_SLEEP))
            if wait > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass
            if self.cache.due(self._time()):
                try:
                    await self.fetch_once()
                except Exception:  # a bug: logged, the loop goes on
                    logger.exception("JWKS fetch failed unexpectedly")
            elif self._waiting_connections():
                self._feed_waiting()  # the cache refused an early fetch: let them go

    async def fetch_once(self) -> None:
        """Fetch the JWKS now and report it to the cache (then wake the waiting tokens)."""
        cache = self.cache
        cache.fetch_started(self._time())
        try:
            document = await self._fetch()
        except Exception as exc:  # the source is down or gives garbage: keep the keys
            self._failed(_why(exc))
        else:
            try:
                keys = cache.fetched(document, self._time())
            except JwksError as exc:
                self.failures_total += 1
                logger.warning("JWKS %s unusable, the cached keys stay in use: %s",
                               cache.source, exc)
            else:
                for line in keys.skipped:
                    logger.info("JWKS %s: %s", cache.source, line)
                logger.info("JWKS %s: %d usable key%s", cache.source, len(keys),
                            "" if len(keys) == 1 else "s")
        self._feed_waiting()
        self._wake.set()  # the loop sleeps until the next fetch the cache now says

    def _failed(self, why: str) -> None:
        self.failures_total += 1
        cache = self.cache
        cache.fetch_failed(why, self._time())
        age = cache.age(self._time())
        logger.warning("JWKS %s: fetch failed (%s); %s", cache.source, why,
                       "no keys yet: tokens are refused" if age is None
                       else f"the keys fetched {age:.0f} s ago stay in use")

    async def _fetch(self) -> bytes:
        config = self.config
        limit = config.jwks_max_bytes
        if config.jwks_url is None:
            assert config.jwks_file is not None
            path = config.jwks_file

            def read() -> bytes:
                with open(path, "rb") as f:
                    return f.read(limit + 1)

            return await asyncio.to_thread(read)
        session = self._session
        assert session is not None
        async with session.get(config.jwks_url, allow_redirects=False) as response:
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
            data = await response.content.read(limit + 1)
            if len(data) > limit:
                raise OSError(f"more than the {limit} bytes allowed")
            return bytes(data)

    def _waiting_connections(self) -> list[Any]:
        return [proto for proto in list(self._waiting().values())
                if proto.conn is not None and not proto.closed
                and proto.conn.view.token_waiting]

    def _feed_waiting(self) -> None:
        for proto in self._waiting_connections():
            proto.run(proto.conn.keys_changed)


class _WakingKeys:
    """The cache as the core sees it (:class:`~..core.tokenauth.TokenKeys`), waking the fetch
    loop when an unknown ``kid`` makes a fetch due."""

    __slots__ = ("service",)

    def __init__(self, service: TokenService) -> None:
        self.service = service

    def keys(self, now: float) -> Any:
        """The cache's keys."""
        return self.service.cache.keys(now)

    def unknown_kid(self, kid: str | None, now: float) -> bool:
        """The cache's answer; a fetch now due wakes the loop."""
        due = self.service.cache.unknown_kid(kid, now)
        if due:
            self.service.wake()
        return due


def _why(exc: BaseException) -> str:
    """A fetch failure in words (no secrets: a URL's query could hold one, it is not shown)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text[:200]
