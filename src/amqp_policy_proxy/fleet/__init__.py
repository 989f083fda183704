"""Layer 5 (I/O: the shared store). The fleet: connection counts and rates shared by every
proxy of a fleet in Redis (docs/fleet.md, docs/decisions/0006-fleet-ledger.md).

- :mod:`.scripts`: the store's keys and the Lua scripts (admission, release, rewrite);
- :mod:`.ledger`: :class:`~.ledger.FleetLedger`, the admission ledger the daemon gives the core
  when ``[ledger]`` is configured; it owns the Redis client (redis-py's asyncio client);
- :mod:`.rates`: :class:`~.rates.FleetRates`, the connection rates decided in the store and
  the shaping buckets drawn from it;
- :mod:`.private_redis`: the private ``redis-server`` of ``ledger = "auto"``.

It imports ``limits/`` (the process's own counts stay the in-process ledger), ``core/`` (the
``AdmissionLedger`` protocol and ``LEDGER_PENDING``) and ``policy/``; never ``daemon/`` or
``metrics/``: the daemon gives it callbacks for its figures.
"""
