"""What an operator meets first, end to end through a real proxy:

- readiness tells the truth while the router is down: before any client, ``/readyz`` is 503,
  ``status`` says the upstream is down, ``amqp_proxy_upstream_up`` is 0, and a SASL client gets
  ``sys-temp`` at once; once the router is there, the probes find it and all three say so;
- every failed authentication is on record: a wrong password and a client that leaves in the
  middle of SASL give a log line, a ``sasl_failed`` event and
  ``amqp_proxy_sasl_failures_total{reason}`` (never the password);
- gauges of counts have a sample at 0 with no connection open.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from amqp_policy_proxy.amqp import constants as C
from amqp_policy_proxy.core.events import SaslFailed
from amqp_policy_proxy.policy.compile import compile_policy
from amqp_policy_proxy.policy.model import PolicySettings
from tests.support.logs import LoggerLines
from tests.support.ports import free_port
from tests.support.proxy import ProxyThread
from tests.support.rawpeer import RawClient, RawUpstream

from .test_observability_e2e import scrape, value

pytestmark = pytest.mark.integration

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "test",
    "groups": {"all": {"users": "*", "remoteHosts": "*", "sources": "*", "targets": "*"}},
}]])], PolicySettings())


def readyz(proxy: ProxyThread) -> tuple[int, str]:
    proxy.call(proxy.daemon.publish_now)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/readyz",
                                    timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_readiness_tells_the_truth_while_the_router_is_down():
    port = free_port()
    with ProxyThread([("127.0.0.1", port)], policy=POLICY, metrics=True) as proxy:
        status, body = readyz(proxy)
        assert status == 503 and "no upstream reachable" in body, body
        from amqp_policy_proxy.daemon.control import Control

        state = proxy.call(lambda: Control(proxy.daemon).status()["upstreams"][0])
        assert state["state"] == "down" and not state["healthy"]
        samples, _ = scrape(proxy)
        assert value(samples, "amqp_proxy_upstream_up", upstream=f"127.0.0.1:{port}") == 0
        assert ("amqp_proxy_upstream_up", (("upstream", f"127.0.0.1:{port}"),)) in samples
        with RawClient(proxy.port) as c:
            start = time.monotonic()
            assert c.sasl_plain("alice") == int(C.SaslCode.SYS_TEMP)
            assert time.monotonic() - start < 0.5  # at once, no connect attempt to wait for
        with RawUpstream(port=port):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and readyz(proxy)[0] != 200:
                time.sleep(0.2)
            assert readyz(proxy)[0] == 200
            samples, _ = scrape(proxy)
            assert value(samples, "amqp_proxy_upstream_up", upstream=f"127.0.0.1:{port}") == 1
            with RawClient(proxy.port) as c:
                assert c.sasl_plain("alice") == 0


def test_failed_logins_are_on_record():
    with LoggerLines("amqp_policy_proxy.core.context") as log, RawUpstream(sasl_reject=["mallory"]) as up, ProxyThread(
            [("127.0.0.1", up.port)], policy=POLICY, metrics=True) as proxy:
        with RawClient(proxy.port) as c:
            assert c.sasl_plain("mallory", "wrong-password") == int(C.SaslCode.AUTH)
        with RawClient(proxy.port) as c:  # leaves in the middle of SASL
            c.send(C.SASL_HEADER)
            c.read_for(0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(proxy.events_of(SaslFailed)) < 2:
            time.sleep(0.05)
        failed = proxy.events_of(SaslFailed)
        assert [(e.user, e.mechanism, e.reason, e.code, e.remote_host) for e in failed] == [
            ("mallory", "PLAIN", "auth", 1, "127.0.0.1"),
            (None, "", "dropped", None, "127.0.0.1")]
        samples, text = scrape(proxy)
        assert value(samples, "amqp_proxy_sasl_failures_total", reason="auth") == 1
        assert value(samples, "amqp_proxy_sasl_failures_total", reason="dropped") == 1
        assert value(samples, "amqp_proxy_sasl_failure_hosts", remote_host="127.0.0.1") == 2
        lines = [m for m in log.messages if "SASL authentication failed" in m]
        assert any("user 'mallory', rhost '127.0.0.1', mechanism PLAIN: auth (1)" in line
                   for line in lines), lines
        assert not any("wrong-password" in m for m in log.messages)
        assert "wrong-password" not in text


def test_connection_gauges_have_a_sample_at_zero():
    with RawUpstream() as up, ProxyThread([("127.0.0.1", up.port)], policy=POLICY,
                                          metrics=True) as proxy:
        samples, _ = scrape(proxy)
        assert samples[("amqp_proxy_connections_active",
                        (("group", "all"), ("vhost", "test")))] == 0


def test_status_shows_a_failed_reload_and_the_policy_that_still_runs(tmp_path):
    from amqp_policy_proxy.cli import render_status
    from amqp_policy_proxy.daemon.control import Control

    path = tmp_path / "policy.json"
    path.write_text('[["vhost", {"hostname": "test", "groups": {"all": {"users": "*", '
                    '"remoteHosts": "*", "sources": "*", "targets": "*"}}}]]')
    with RawUpstream() as up, ProxyThread([("127.0.0.1", up.port)],
                                          policy_path=str(path)) as proxy:
        def status() -> dict:
            return proxy.call(lambda: Control(proxy.daemon).status())

        assert status()["policy"]["last_reload"] is None
        assert proxy.reload()
        ok = status()["policy"]
        assert ok["last_reload"]["result"] == "ok" and ok["last_reload"]["digest"] == ok["digest"]
        path.write_text('[["vhost", {"hostname": "test", "maxConnections": -1}]]')
        assert not proxy.reload()
        bad = status()
        last = bad["policy"]["last_reload"]
        assert last["result"] == "error" and last["digest"] == ok["digest"]
        assert any("maxConnections" in issue for issue in last["issues"]), last
        assert "last reload: FAILED at " in render_status(bad)
