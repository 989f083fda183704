"""Which limits are fleet-wide: the limit domains of the proxies of a log. Imports pyspark.

Layer: the capacity reports, run on Spark (the ``report capacity`` subcommand or
``spark-submit``), never imported by the daemon; like the rest of ``spark_reports`` they
import from the proxy only the event-log schema, the policy and the top-level resolver. Here:
:mod:`.common` and :mod:`.events`.

A proxy that counts its connections alone (no ``[ledger]``) enforces every limit on its own
connections: its limits are compared with its own peak. The proxies of a fleet that share a
Redis ledger (``[ledger]``, docs/fleet.md) enforce every limit on the fleet's sum: the
report sums those proxies before comparing with a limit. Each such group of proxies is a
*limit domain*: one proxy, or one fleet. Since schema 4 every event-log file starts with a
``proxy_info`` record saying which (:func:`events.limit_domains`); ``--fleet`` puts every
proxy of the log in one fleet, for older logs or to see the fleet's view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from amqp_policy_proxy.spark_reports.common import local_table
from amqp_policy_proxy.spark_reports.events import limit_domains

_FLEET_PREFIX = "fleet:"


@dataclass(frozen=True)
class LimitScope:
    """How the limits of a report are compared: the domains and the sentence that says so."""

    fleet: bool
    """``--fleet``: every proxy of the log is one fleet."""
    domains: DataFrame | None
    """``proxy``, ``domain``: the proxies recorded as members of a fleet (``domain`` is the
    fleet's name); None when there are none (or with ``--fleet``)."""
    text: str
    """One sentence for the page: which peaks the limits are compared with, and why."""
    fleets: dict[str, int] = field(default_factory=dict)
    """Recorded fleets: name -> number of proxy processes."""
    local: int = 0
    """Proxy processes recorded as counting alone."""

    @property
    def summary(self) -> dict[str, object]:
        """For the job's summary: ``mode`` (``fleet``, ``recorded`` or ``per_proxy``),
        ``fleets`` and ``local`` as recorded."""
        mode = "fleet" if self.fleet else ("recorded" if self.fleets else "per_proxy")
        return {"mode": mode, "fleets": dict(self.fleets), "local": self.local}


def limit_scope(spark: SparkSession, events: DataFrame, fleet: bool) -> LimitScope:
    """Decide which proxies' counts are summed before they are compared with a limit.

    Runs one small query (the ``proxy_info`` records, one partition of the work table).

    Args:
        spark: the session.
        events: output of :func:`events.prepare_events` (from the work table).
        fleet: ``--fleet`` was given: all the proxies of the log form one fleet.

    Returns:
        The scope: with ``fleet``, every proxy in one domain; otherwise the proxies whose
        ``proxy_info`` says ``fleet`` are summed per fleet, every other proxy (``local``, or
        no record: a log older than schema 4) counts alone.
    """
    rows = [(str(r["proxy"]), str(r["limit_domain"]))
            for r in limit_domains(events).collect()]
    fleets: dict[str, int] = {}
    members = []
    for proxy, dom in rows:
        if dom.startswith(_FLEET_PREFIX):
            name = dom[len(_FLEET_PREFIX):]
            fleets[name] = fleets.get(name, 0) + 1
            members.append((proxy, dom))
    local = len(rows) - len(members)
    if fleet:
        return LimitScope(True, None, (
            "Limits are fleet-wide (--fleet): the concurrency of all the proxies of the log is "
            "summed before it is compared with a limit, so headroom and recommendations use "
            "fleet-wide peaks."), fleets, local)
    if not members:
        recorded = (f" ({local} proxy processes recorded no fleet ledger)" if local
                    else " (no proxy recorded a fleet ledger; pass --fleet if its proxies "
                         "shared one)")
        return LimitScope(False, None, (
            "Limits apply per proxy process (each counts its own connections), so headroom "
            f"and recommendations use per-proxy peaks{recorded}."), fleets, local)
    named = ", ".join(f"{name} ({n} proxy processes)" for name, n in sorted(fleets.items()))
    alone = (f"; the other {local} proxy processes counted alone: per-proxy peaks"
             if local else "")
    table = local_table(spark, members, T.StructType([
        T.StructField("proxy", T.StringType()), T.StructField("domain", T.StringType())]))
    return LimitScope(False, table, (
        "Limits are fleet-wide for the proxies that recorded a fleet ledger (proxy_info): "
        f"the concurrency of each fleet is summed before it is compared with a limit: {named}"
        f"{alone}."), fleets, local)
