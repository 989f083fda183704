"""Layer 5 (I/O: Redis). The fleet's ban list: every ban of every proxy and worker, in the
``[ledger]`` store, with its expiry on the store's clock (docs/operations.md, "Bans").

Keys (``P`` = :data:`~.scripts.PREFIX`; one hash tag, so both keys are in one Redis Cluster
slot and one script touches both):

==========================  ==============================================================
``P:{bans}:list``           hash: ``user:<name>`` / ``host:<address or network>`` -> the ban
                            as JSON (``kind``, ``value``, ``reason``, ``source``, ``by``,
                            ``vhost``, ``created_ms``, ``expires_ms``: the store's clock,
                            milliseconds; ``expires_ms`` null: until lifted)
``P:{bans}:version``        integer, incremented by every change
==========================  ==============================================================

A proxy writes a change with one script call (:data:`PUT`, :data:`DELETE`) and learns the
others' by reading the version (one ``GET``) several times a second and the list
(:data:`LOAD`, which also drops the expired entries) when the version moved. Times are the
store's ``TIME``, one clock for the fleet; :meth:`BanStore.load` returns the store's now with
the list, so each proxy turns an expiry into its own clock as "that many milliseconds from
now". The list lives as long as the store does (with ``ledger = "auto"``, the daemon's private
redis-server: a ban survives a worker's restart, not the daemon's).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from .scripts import PREFIX

logger = logging.getLogger(__name__)

__all__ = ["DELETE", "LIST_KEY", "LOAD", "PUT", "VERSION_KEY", "BanStore", "StoredBans"]

LIST_KEY = f"{PREFIX}:{{bans}}:list"
"""The hash of every ban."""
VERSION_KEY = f"{PREFIX}:{{bans}}:version"
"""Incremented by every change of :data:`LIST_KEY`."""

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

PUT = _NOW + """
-- KEYS: list, version; ARGV: field, the ban as JSON (no times), ttl in ms (0: none)
local ban = cjson.decode(ARGV[2])
ban['created_ms'] = now
local ttl = tonumber(ARGV[3])
if ttl > 0 then ban['expires_ms'] = now + ttl else ban['expires_ms'] = cjson.null end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(ban))
return redis.call('INCR', KEYS[2])
"""
"""Put one ban (replacing one of the same field); returns the new version."""

DELETE = """
-- KEYS: list, version; ARGV: field
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
local version
if removed > 0 then
  version = redis.call('INCR', KEYS[2])
else
  version = tonumber(redis.call('GET', KEYS[2]) or '0')
end
return {removed, version}
"""
"""Lift one ban; returns ``{removed (0|1), version}``."""

LOAD = _NOW + """
-- KEYS: list, version. Drops the expired entries; returns {now ms, version, f1, v1, ...}
local all = redis.call('HGETALL', KEYS[1])
local out = {now, tonumber(redis.call('GET', KEYS[2]) or '0')}
for i = 1, #all, 2 do
  local ok, ban = pcall(cjson.decode, all[i + 1])
  local good = ok and type(ban) == 'table' and type(ban['kind']) == 'string'
    and type(ban['value']) == 'string'
  local expires = good and ban['expires_ms'] or nil
  if not good or (type(expires) == 'number' and expires <= now) then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
return out
"""
"""The list as it is now, with the store's time and version (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class StoredBans:
    """One read of the fleet's list.

    Attributes:
        now_ms: the store's clock when it was read, milliseconds.
        version: the list's version.
        bans: each ban as stored (``kind``, ``value``, ``reason``, ``source``, ``by``,
            ``vhost``, ``created_ms``, ``expires_ms``).
    """

    now_ms: int
    version: int
    bans: tuple[dict[str, Any], ...]


def field_of(kind: str, value: str) -> str:
    """The hash field of a ban: ``user:<name>`` or ``host:<address or network>``."""
    return f"{kind}:{value}"


class BanStore:
    """The fleet's ban list in Redis (see the module docstring).

    Args:
        url: the ``[ledger] url`` (``redis://``, ``rediss://``, ``unix://``).
        client: a redis-py asyncio client (tests); default: made from ``url``.

    Every method raises what redis-py raises when the store is unreachable or answers with an
    error (``redis.exceptions.RedisError``, ``OSError``); the caller retries.
    """

    def __init__(self, url: str, *, client: Any = None) -> None:
        self.url = url
        self._client = client
        self._scripts: dict[str, Any] = {}

    def _script(self, name: str, text: str) -> Any:
        if self._client is None:
            from .ledger import connect

            self._client = connect(self.url)
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self._client.register_script(text)
        return script

    async def put(self, ban: dict[str, Any], ttl_ms: int | None) -> int:
        """Store ``ban`` (``kind``, ``value``, ``reason``, ``source``, ``by``, ``vhost``) with
        an expiry ``ttl_ms`` milliseconds from the store's now (None: until lifted).

        Returns:
            The list's new version.
        """
        body = {k: ban.get(k) for k in ("kind", "value", "reason", "source", "by", "vhost")}
        script = self._script("put", PUT)
        version = await script(keys=[LIST_KEY, VERSION_KEY],
                               args=[field_of(ban["kind"], ban["value"]), json.dumps(body),
                                     max(1, int(ttl_ms)) if ttl_ms is not None else 0])
        return int(version)

    async def delete(self, kind: str, value: str) -> tuple[bool, int]:
        """Lift the ban of ``(kind, value)``.

        Returns:
            ``(it was there, the list's version)``.
        """
        script = self._script("delete", DELETE)
        removed, version = await script(keys=[LIST_KEY, VERSION_KEY],
                                        args=[field_of(kind, value)])
        return bool(int(removed)), int(version)

    async def version(self) -> int:
        """The list's version (0 before the first change)."""
        if self._client is None:
            self._script("load", LOAD)
        raw = await self._client.get(VERSION_KEY)
        return int(raw or 0)

    async def load(self) -> StoredBans:
        """The list in force now (expired entries dropped from the store on the way).

        An entry that is not a JSON object (written by something else) is dropped too.
        """
        script = self._script("load", LOAD)
        raw = await script(keys=[LIST_KEY, VERSION_KEY])
        now_ms, version = int(raw[0]), int(raw[1])
        bans = []
        for i in range(2, len(raw) - 1, 2):
            text = raw[i + 1]
            try:
                ban = json.loads(text.decode() if isinstance(text, bytes) else text)
            except ValueError:
                continue
            if isinstance(ban, dict) and isinstance(ban.get("kind"), str) \
                    and isinstance(ban.get("value"), str):
                bans.append(ban)
        return StoredBans(now_ms, version, tuple(bans))

    async def close(self) -> None:
        """Close the client. Never raises."""
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:  # noqa: BLE001
                pass
