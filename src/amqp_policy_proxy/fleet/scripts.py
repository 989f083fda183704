"""Layer 5 (no I/O itself). The fleet ledger's keys in Redis and its three Lua scripts.

Keys (``P`` = :data:`PREFIX`, ``{V}`` = the vhost's name as a Redis Cluster hash tag, so every
key of one vhost is in one slot and one script may touch them all):

============================  ===========================================================
``P:{V}:vhost``               hash: proxy id -> that proxy's admitted connections to V
``P:{V}:user:<user>``         hash: proxy id -> connections of <user> to V
``P:{V}:host:<ip>``           hash: proxy id -> connections to V from <ip>
``P:{V}:leases``              sorted set: proxy id -> lease expiry (ms, the store's clock)
``P:{V}:owned:<id>``          set: the hashes of V where proxy <id> has a field
``P:{V}:rate:vhost``          string: V's connection-rate bucket (GCRA tat, ms, expiring)
``P:{V}:rate:user:<user>``    string: <user>'s connection-rate bucket in V
``P:{V}:rate:host:<ip>``      string: <ip>'s connection-rate bucket in V
``P:{V}:shape:msg:<user>``    string: <user>'s message bucket in V (credit shaping)
``P:{V}:shape:bytes:<user>``  string: <user>'s byte bucket in V (credit shaping)
``P:{proxies}:alive``         sorted set: proxy id -> lease expiry (counts live proxies)
``P:{proxies}:vhosts:<id>``   set: the vhosts where proxy <id> may have fields
============================  ===========================================================

Every proxy writes only its own fields; the count of a scope is the sum of the fields of
proxies whose lease has not expired. Times come from the store's ``TIME``, one clock for the
whole fleet. The fleet-wide ``maxConnections`` (QDR's socket limit at accept) is not here: it
stays per process (docs/decisions/0006).
"""

from __future__ import annotations

PREFIX = "amqp-policy-proxy"
"""The first part of every key."""

#: Scope numbers the admission script returns for a denial (0: admitted), in QDR's order:
#: the counts, then the connection rates (the proxy's extension) in the same order.
SCOPE_VHOST, SCOPE_USER, SCOPE_HOST = 1, 2, 3
SCOPE_VHOST_RATE, SCOPE_USER_RATE, SCOPE_HOST_RATE = 4, 5, 6


def vhost_tag(vhost: str) -> str:
    """``P:{V}``: the prefix of every key of ``vhost`` (its Cluster hash tag)."""
    return f"{PREFIX}:{{{vhost}}}"


def scope_keys(vhost: str, user: str, host: str) -> tuple[str, str, str]:
    """The three hashes an Open to ``vhost`` by ``user`` from ``host`` is counted in."""
    tag = vhost_tag(vhost)
    return f"{tag}:vhost", f"{tag}:user:{user}", f"{tag}:host:{host}"


def rate_keys(vhost: str, user: str, host: str) -> tuple[str, str, str]:
    """The three connection-rate buckets an Open to ``vhost`` by ``user`` from ``host`` takes
    a token from (GCRA: each holds its theoretical arrival time, and expires when full)."""
    tag = vhost_tag(vhost)
    return f"{tag}:rate:vhost", f"{tag}:rate:user:{user}", f"{tag}:rate:host:{host}"


def shaping_keys(vhost: str, user: str) -> tuple[str, str]:
    """The message and byte buckets of ``user`` in ``vhost`` that credit shaping draws on."""
    tag = vhost_tag(vhost)
    return f"{tag}:shape:msg:{user}", f"{tag}:shape:bytes:{user}"


def leases_key(vhost: str) -> str:
    """The lease set of ``vhost``'s slot."""
    return f"{vhost_tag(vhost)}:leases"


def owned_key(vhost: str, proxy_id: str) -> str:
    """The set of ``vhost``'s hashes where ``proxy_id`` has a field."""
    return f"{vhost_tag(vhost)}:owned:{proxy_id}"


ALIVE_KEY = f"{PREFIX}:{{proxies}}:alive"
"""Every proxy's lease, to count the live ones (the ``local-share`` divisor)."""


def vhosts_key(proxy_id: str) -> str:
    """The vhosts where ``proxy_id`` may have fields (cleared when it starts again)."""
    return f"{PREFIX}:{{proxies}}:vhosts:{proxy_id}"


_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

ADMIT = _NOW + """
-- KEYS: leases, owned, vhost hash, user hash, host hash, then the vhost, user and host
-- connection-rate buckets
-- ARGV: proxy id, lease ms, vhost limit, user limit, host limit, enforce (1, or 0: shadow
-- mode, counted even over a limit), vhost rate, user rate, host rate (per second, 0: none),
-- burst (0: each rate)
local me = ARGV[1]
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), me)
-- the live sum of a hash, and the part of it that is not this proxy's
local function live(key)
  local fields = redis.call('HGETALL', key)
  local sum, mine = 0, 0
  for i = 1, #fields, 2 do
    local who = fields[i]
    local expiry = redis.call('ZSCORE', KEYS[1], who)
    if expiry and tonumber(expiry) >= now then
      local n = tonumber(fields[i + 1])
      sum = sum + n
      if who == me then mine = n end
    else
      -- a proxy whose lease ran out: its counts stop counting, and are removed
      redis.call('HDEL', key, who)
      if expiry then redis.call('ZREM', KEYS[1], who) end
    end
  end
  return sum, sum - mine
end
local others = {}
local over = 0
-- QDR's order: the vhost's maxConnections, then per user, then per host
for i = 3, 5 do
  local sum, rest = live(KEYS[i])
  others[i - 2] = rest
  if over == 0 and sum >= tonumber(ARGV[i]) then over = i - 2 end
end
if over > 0 and ARGV[6] ~= '0' then
  return {over, others[1], others[2], others[3]}
end
-- then the connection rates, all or nothing (a denied attempt takes no token); GCRA on the
-- store's clock: a bucket holds the instant it is full again
local takes = {}
if over == 0 and KEYS[6] then
  local burst = tonumber(ARGV[10] or '0')
  for i = 1, 3 do
    local rate = tonumber(ARGV[6 + i] or '0')
    if rate > 0 then
      local cap = burst > 0 and burst or rate
      local tat = tonumber(redis.call('GET', KEYS[5 + i]) or '0')
      if tat < now then tat = now end
      if tat - now > (cap - 1) * 1000 / rate + 0.000001 then
        over = 3 + i
        break
      end
      takes[#takes + 1] = {KEYS[5 + i], tat + 1000 / rate}
    end
  end
  if over > 0 and ARGV[6] ~= '0' then
    return {over, others[1], others[2], others[3]}
  end
  if over == 0 then
    for _, t in ipairs(takes) do
      redis.call('SET', t[1], string.format('%.6f', t[2]), 'PX',
                 math.max(1, math.ceil(t[2] - now)))
    end
  end
end
for i = 3, 5 do
  redis.call('HINCRBY', KEYS[i], me, 1)
  redis.call('SADD', KEYS[2], KEYS[i])
end
return {-over, others[1], others[2], others[3]}
"""
"""One admission: sum the live proxies' fields of the three scopes (dropping dead ones),
check the limits in QDR's order, then the connection rates (``maxConnectionRate``,
``maxConnectionRatePerUser``, ``maxConnectionRatePerHost``: GCRA buckets on the store's
clock, shared by the whole fleet), and count the connection and take a token from each
limited bucket only if all pass. Returns ``{scope, others_vhost, others_user, others_host}``:
scope 0 (admitted) or the failed one (:data:`SCOPE_VHOST` .. :data:`SCOPE_HOST_RATE`; in
shadow mode, enforce 0, the connection is counted anyway, no token is taken, and the failed
scope comes back negated), then what the *other* live proxies hold in each count scope, which
the ``local-share`` fallback adds to this proxy's own counts (it never admits a scope above
its limit together with what the store already granted)."""

CHARGE = _NOW + """
-- KEYS: one connection-rate bucket; ARGV: tokens, rate per second
-- tokens taken while the store was unreachable (the fallback's admissions), charged now:
-- the bucket may go into debt
local rate = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1]) * 1000 / rate
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.max(1, math.ceil(tat - now)))
return 0
"""
"""Charge a connection-rate bucket with the tokens this proxy's fallback took (debt allowed),
before the store decides again."""

TAKE = _NOW + """
-- KEYS: a user's message bucket, its byte bucket
-- ARGV: per bucket (messages, then bytes): rate per second (0: none), burst, debt (used
-- beyond what was taken: charged, the bucket may go into debt), want (taken only as far as
-- the bucket holds)
local out = {}
for b = 1, 2 do
  local rate = tonumber(ARGV[4 * b - 3])
  local taken = 0
  if rate > 0 then
    local burst, debt, want = tonumber(ARGV[4 * b - 2]), tonumber(ARGV[4 * b - 1]),
                              tonumber(ARGV[4 * b])
    local tat = tonumber(redis.call('GET', KEYS[b]) or '0')
    if tat < now then tat = now end
    tat = tat + debt * 1000 / rate
    local held = math.floor(burst - (tat - now) * rate / 1000 + 0.000001)
    if held > 0 then
      taken = math.min(want, held)
      tat = tat + taken * 1000 / rate
    end
    redis.call('SET', KEYS[b], string.format('%.6f', tat), 'PX',
               math.max(1, math.ceil(tat - now)))
  end
  out[b] = taken
end
return out
"""
"""Credit shaping for a fleet: charge what a proxy's connections used beyond their
allotment and take up to ``want`` whole tokens from a user's message and byte buckets (GCRA on
the store's clock, shared by every proxy). Returns the tokens taken ``{messages, bytes}``."""

RELEASE = """
-- KEYS: vhost hash, user hash, host hash; ARGV: proxy id
for i = 1, 3 do
  if redis.call('HINCRBY', KEYS[i], ARGV[1], -1) <= 0 then
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
return 0
"""
"""Uncount one connection from this proxy's fields (a field at zero is removed)."""

REWRITE = _NOW + """
-- KEYS: leases, owned, then the hashes where this proxy has connections
-- ARGV: proxy id, lease ms (0: leave, removing the lease), then one count per hash
local me = ARGV[1]
local lease = tonumber(ARGV[2])
if lease > 0 then
  redis.call('ZADD', KEYS[1], now + lease, me)
else
  redis.call('ZREM', KEYS[1], me)
end
local keep = {}
for i = 3, #KEYS do
  keep[KEYS[i]] = true
  redis.call('HSET', KEYS[i], me, ARGV[i])
  redis.call('SADD', KEYS[2], KEYS[i])
end
-- hashes this proxy no longer has connections in: its field goes (the same slot: the
-- owned set names only keys of this vhost)
for _, key in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if not keep[key] then
    redis.call('HDEL', key, me)
    redis.call('SREM', KEYS[2], key)
  end
end
return #KEYS - 2
"""
"""Rewrite this proxy's fields of one vhost to its own counts, idempotently: the lease is
renewed, every hash it has connections in is set to its count, and its field is removed from
every other hash it once wrote. This heals lost releases, writes lost in a failover, and the
fields of a previous run under the same proxy id."""

ALIVE = _NOW + """
-- KEYS: the alive set; ARGV: proxy id, lease ms (0: leave)
local lease = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
if lease > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
"""
"""Renew this proxy's lease in the alive set, drop expired ones; returns the live proxies."""
