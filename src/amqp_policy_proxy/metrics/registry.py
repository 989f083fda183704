"""Shell-side. The daemon's dedicated Prometheus registry (docs/observability.md).

Application code never touches prometheus_client's global ``REGISTRY``: the daemon builds one
registry here, hands it to :class:`~amqp_policy_proxy.metrics.observer.MetricsObserver` and
:class:`~amqp_policy_proxy.metrics.collectors.LiveCollector`, and serves it with
:func:`~amqp_policy_proxy.metrics.exposition.start_metrics_server`. Tests build a fresh one each.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector

__all__ = ["build_registry"]


def build_registry(*, process_metrics: bool = True) -> CollectorRegistry:
    """Build a new, empty registry for one daemon (or one test).

    The registry has ``auto_describe`` on, so registering two collectors that export the same
    family name fails at registration time rather than at the first scrape.

    Args:
        process_metrics: also register prometheus_client's standard ``process_*`` collector
            (CPU seconds, resident memory, open file descriptors, start time), read from
            ``/proc`` at scrape time. These are outside the ``amqp_proxy_`` contract.

    Returns:
        A dedicated :class:`prometheus_client.CollectorRegistry`, never the global one.
    """
    registry = CollectorRegistry(auto_describe=True)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry
