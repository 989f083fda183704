"""Merging the workers' metrics: counters and histograms summed, gauges summed except the
configuration gauges (maximum), process metrics per worker."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from amqp_policy_proxy.metrics.merge import merge_families, render

W0 = """# HELP amqp_proxy_connections_denied_total d
# TYPE amqp_proxy_connections_denied_total counter
amqp_proxy_connections_denied_total{vhost="v",reason="user_limit"} 3.0
# HELP amqp_proxy_connections_active a
# TYPE amqp_proxy_connections_active gauge
amqp_proxy_connections_active{vhost="v",group="g"} 1.0
# HELP amqp_proxy_limit l
# TYPE amqp_proxy_limit gauge
amqp_proxy_limit{vhost="v",group="",limit="maxConnectionsPerUser"} 2.0
# HELP amqp_proxy_ledger_latency_seconds h
# TYPE amqp_proxy_ledger_latency_seconds histogram
amqp_proxy_ledger_latency_seconds_bucket{le="0.001"} 1.0
amqp_proxy_ledger_latency_seconds_bucket{le="+Inf"} 2.0
amqp_proxy_ledger_latency_seconds_sum 0.01
amqp_proxy_ledger_latency_seconds_count 2.0
# HELP process_open_fds f
# TYPE process_open_fds gauge
process_open_fds 20.0
"""
W1 = W0.replace("} 3.0", "} 4.0").replace("} 1.0\n# HELP amqp_proxy_limit", "} 5.0\n# HELP amqp_proxy_limit").replace(
    "process_open_fds 20.0", "process_open_fds 30.0")


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_merge_sums_counters_histograms_and_gauges_keeps_max_of_limits() -> None:
    got = samples(render(merge_families([("0", W0), ("1", W1)])))
    assert got[("amqp_proxy_connections_denied_total",
                (("reason", "user_limit"), ("vhost", "v")))] == 7
    assert got[("amqp_proxy_connections_active", (("group", "g"), ("vhost", "v")))] == 6
    assert got[("amqp_proxy_limit", (("group", ""), ("limit", "maxConnectionsPerUser"),
                                     ("vhost", "v")))] == 2
    assert got[("amqp_proxy_ledger_latency_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("amqp_proxy_ledger_latency_seconds_count", ())] == 4
    assert got[("process_open_fds", (("worker", "0"),))] == 20
    assert got[("process_open_fds", (("worker", "1"),))] == 30


def test_merge_renders_the_counter_type_line() -> None:
    text = render(merge_families([("0", W0)])).decode()
    assert "# TYPE amqp_proxy_connections_denied_total counter" in text
    assert "# TYPE amqp_proxy_ledger_latency_seconds histogram" in text
