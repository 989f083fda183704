"""Shell-side. The workers' metrics as one endpoint: the parent of ``--workers N`` scrapes each
worker's private endpoint and serves the sum (docs/fleet.md, "Metrics with workers").

prometheus_client's multiprocess mode does not fit: it cannot carry the scrape-time
collectors (:class:`~.collectors.LiveCollector` reads a snapshot the event loop publishes).
Instead every worker keeps its own registry, served on ``127.0.0.1:0``, and the parent merges
the text at scrape time:

- counters, histograms and summaries: summed over the workers, per label set;
- gauges: summed (``amqp_proxy_connections_active``; ``amqp_proxy_ledger_mode``: the number of
  workers in each mode), except those every worker reports alike, which are the maximum:
  :data:`MAX_GAUGES` (configured limits, the policy digest, the live proxies, whether an
  upstream is up, the bans in force: one list in the fleet's store);
- ``process_*`` (each worker's CPU, memory, file descriptors): per worker, with a ``worker``
  label.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

__all__ = ["MAX_GAUGES", "merge_families", "scrape_workers"]

MAX_GAUGES = frozenset({"amqp_proxy_limit", "amqp_proxy_limit_bytes", "amqp_proxy_policy_info",
                        "amqp_proxy_ledger_proxies", "amqp_proxy_upstream_up",
                        "amqp_proxy_bans_active", "amqp_proxy_jwks_age_seconds",
                        "amqp_proxy_jwks_keys"})
"""Gauges every worker reports alike: merged as the maximum, not the sum."""


def merge_families(texts: Sequence[tuple[str, str]]) -> list[Metric]:
    """Merge the exposition texts of several workers.

    Args:
        texts: ``(worker, text)`` per worker (``worker`` becomes the ``worker`` label of
            ``process_*`` samples).

    Returns:
        One family per name, in the order first seen.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for worker, text in texts:
        for family in text_string_to_metric_families(text):
            per_worker = family.name.startswith("process_")
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                values[family.name] = {}
            sums = values[family.name]
            keep_max = family.type == "gauge" and family.name in MAX_GAUGES
            for sample in family.samples:
                labels = dict(sample.labels)
                if per_worker:
                    labels["worker"] = worker
                key = (sample.name, tuple(sorted(labels.items())))
                if key in sums:
                    sums[key] = (max(sums[key], sample.value) if keep_max
                                 else sums[key] + sample.value)
                else:
                    sums[key] = sample.value
    for name, metric in families.items():
        for (sample_name, label_items), value in values[name].items():
            metric.add_sample(sample_name, dict(label_items), value)
    return list(families.values())


class _Families:
    """A collector that yields fixed families (to render them with ``generate_latest``)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        """The families given."""
        return iter(self._families)


def render(families: Iterable[Metric]) -> bytes:
    """The text exposition format of ``families``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def scrape_workers(endpoints: Sequence[tuple[str, str]], timeout: float = 2.0
                   ) -> tuple[bytes, list[str]]:
    """Scrape every worker (in parallel) and merge.

    Args:
        endpoints: ``(worker, url)`` per worker.
        timeout: seconds per scrape.

    Returns:
        ``(text, missing)``: the merged exposition text, and the workers that did not answer
        (their figures are absent from this scrape).
    """

    def fetch(url: str) -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback
                return resp.read().decode()
        except OSError as exc:
            logger.debug("scrape of %s failed: %s", url, exc)
            return None

    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        bodies = list(pool.map(fetch, [url for _, url in endpoints]))
    texts = [(w, b) for (w, _), b in zip(endpoints, bodies, strict=True) if b is not None]
    missing = [w for (w, _), b in zip(endpoints, bodies, strict=True) if b is None]
    return render(merge_families(texts)), missing
