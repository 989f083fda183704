"""What a token costs per Open: the core's CPU from the client's SASL header to its Open on its
way to the router, for a password connection (SASL relayed) and for a token connection
(``token_authority = "proxy"``: the token validated with PyJWT against a cached JWKS, the
claims mapped, the proxy's own login to the router), with RS256 and ES256 tokens.

No sockets: the sans-IO core is fed the frames a client and a router send (bench_core.py's
way), so the figure is the proxy's own work, the part a token adds. Each connection is timed
on its own (``time.perf_counter_ns`` around its inputs); the median and p99 over N
connections are printed, and what the token adds (the token case's minus the password case's).
Also the token validation alone (``tokens.validate.validate_token``).

    .venv/bin/python bench/bench_token_open.py            # 3 rounds of 2,000 connections
    .venv/bin/python bench/bench_token_open.py --connections 500 --rounds 1
    .venv/bin/python bench/bench_token_open.py --e2e      # + through real proxies to qdrouterd

``--e2e`` also times whole Opens through the real daemon in front of a real qdrouterd 1.19
(``tests/support/qdrouterd.py``; skipped without a build): a raw client writes its SASL header,
sasl-init, AMQP header and Open in one write and times until the Open comes back, alternating
between a proxy relaying SASL (password in the router's sasldb) and a proxy with
``token_authority = "proxy"`` (JWKS from a file, cached), wall-clock median and p99.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from amqp_policy_proxy.amqp import constants as C  # noqa: E402
from amqp_policy_proxy.amqp.codec import symbol_array  # noqa: E402
from amqp_policy_proxy.amqp.framing import encode_frame  # noqa: E402
from amqp_policy_proxy.amqp.performatives import (  # noqa: E402
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
)
from amqp_policy_proxy.core.commands import Side  # noqa: E402
from amqp_policy_proxy.core.connection import ProxyConnection  # noqa: E402
from amqp_policy_proxy.core.tokenauth import ServiceLogin, TokenAuth  # noqa: E402
from amqp_policy_proxy.limits.connections import ConnectionLedger  # noqa: E402
from amqp_policy_proxy.policy.compile import compile_policy  # noqa: E402
from amqp_policy_proxy.policy.model import PolicySettings  # noqa: E402
from amqp_policy_proxy.tokens.config import TokenAuthConfig  # noqa: E402
from amqp_policy_proxy.tokens.jwks import JwksCache  # noqa: E402
from amqp_policy_proxy.tokens.validate import validate_token  # noqa: E402
from tests.support.issuer import AUDIENCE, ISSUER, Issuer  # noqa: E402

POLICY = compile_policy([(None, [["vhost", {
    "hostname": "$default", "allowUnknownUser": False,
    "groups": {"users": {"users": "alice", "remoteHosts": "*", "sources": "*", "targets": "*"},
               "senders": {"remoteHosts": "*", "sources": "*", "targets": "*"}}}]])],
    PolicySettings(default_vhost="$default"))
CONFIG = TokenAuthConfig.model_validate({
    "issuer": ISSUER, "audience": AUDIENCE, "jwks_file": "unused.json",
    "scope_prefix": "amqp-proxy.",
    "groups": [{"vhost": "$default", "group": "senders", "scopes": ["send"]}]})
SERVICE = ServiceLogin("PLAIN", "svc", b"service-secret")


def sasl(perf: object) -> bytes:
    return encode_frame(0, perf.encode(), 1)  # type: ignore[attr-defined]


ROUTER_GREETING = C.SASL_HEADER + sasl(SaslMechanisms(
    sasl_server_mechanisms=symbol_array(["PLAIN", "ANONYMOUS"])))
OUTCOME_OK = sasl(SaslOutcome(code=0))
OPEN = encode_frame(0, Open(container_id="client", hostname="").encode())
ROUTER_OPEN = C.AMQP_HEADER + encode_frame(0, Open(container_id="router").encode())


def plain_init(user: str, password: str) -> bytes:
    return sasl(SaslInit(mechanism="PLAIN",
                         initial_response=b"\0" + user.encode() + b"\0" + password.encode()))


def one_connection(n: int, ledger: ConnectionLedger, tokens: TokenAuth | None,
                   init: bytes) -> int:
    """One connection from the SASL header to the router's Open; its CPU in ns."""
    client, router = Side.CLIENT, Side.ROUTER
    started = time.thread_time_ns()
    conn = ProxyConnection(f"c{n}", remote_host="127.0.0.1", listener="l", policy=POLICY,
                           ledger=ledger, now=0.0, wall_offset=time.time(), tokens=tokens)
    conn.receive_data(client, C.SASL_HEADER, 0.0)
    if tokens is None:
        conn.router_connected(0.0)
        conn.receive_data(router, ROUTER_GREETING, 0.0)
        conn.receive_data(client, init, 0.0)
        conn.receive_data(router, OUTCOME_OK, 0.0)
        conn.receive_data(client, C.AMQP_HEADER + OPEN, 0.0)
    else:
        conn.receive_data(client, init, 0.0)
        conn.router_connected(0.0, login=SERVICE)
        conn.receive_data(router, ROUTER_GREETING, 0.0)
        conn.receive_data(router, OUTCOME_OK, 0.0)
        conn.receive_data(client, C.AMQP_HEADER + OPEN, 0.0)
    conn.receive_data(router, ROUTER_OPEN, 0.0)
    elapsed = time.thread_time_ns() - started
    assert conn.opened_at is not None, "not admitted"
    conn.connection_lost(client, 0.0)
    return elapsed


def run_case(tokens: TokenAuth | None, init: bytes, connections: int) -> list[int]:
    ledger = ConnectionLedger(1_000_000)
    for n in range(200):  # warm up
        one_connection(n, ledger, tokens, init)
    gc.collect()
    gc.disable()
    try:
        return [one_connection(n, ledger, tokens, init) for n in range(connections)]
    finally:
        gc.enable()


def summary(samples: list[int]) -> tuple[float, float]:
    """Median and p99 in µs."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) / 1000, p99 / 1000


def e2e(connections: int, issuer: Issuer) -> None:
    """Time to Open through real proxies in front of a real qdrouterd (see the module text)."""
    import socket
    import tempfile

    from amqp_policy_proxy.daemon.config import Address, DaemonConfig, UpstreamConfig
    from tests.support import qdrouterd as qdr
    from tests.support.proxy import ProxyThread

    reason = qdr.unavailable_reason()
    if reason is not None:
        print(f"e2e skipped: {reason}")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-token-"))
    (work / "jwks.json").write_bytes(issuer.jwks())
    (work / "pw").write_text("svc-secret\n")
    realm_user = f"alice@{qdr.REALM}"
    policy = compile_policy([(None, [["vhost", {
        "hostname": "$default", "allowUnknownUser": False,
        "groups": {"users": {"users": f"{realm_user}, alice", "remoteHosts": "*",
                             "sources": "*", "targets": "*"}}}]])],
        PolicySettings(default_vhost="$default"))
    auth = CONFIG.model_copy(update={"jwks_file": str(work / "jwks.json"),
                                     "token_authority": "proxy", "groups": []})
    token = issuer.token("rsa-1", exp=int(time.time()) + 3600)
    router = qdr.Qdrouterd({"alice": "secret", "svc": "svc-secret"}, mechs=("PLAIN",)).start()
    plain_proxy = ProxyThread([router.address], policy=policy, kind="qdrouterd").start()
    token_proxy = ProxyThread([], policy=policy, config=DaemonConfig(
        upstreams=(UpstreamConfig(Address(*router.address), kind="qdrouterd",
                                  token_authority="proxy", service_username=f"svc@{qdr.REALM}",
                                  service_password_file=str(work / "pw")),),
        token_auth=auth)).start()
    opening = C.AMQP_HEADER + OPEN
    targets = {"password (SASL relayed)": (plain_proxy.port, C.SASL_HEADER + plain_init(
                   realm_user, "secret") + opening),
               "token RS256 (proxy authority)": (token_proxy.port, C.SASL_HEADER + plain_init(
                   "alice", token) + opening)}

    def one(port: int, data: bytes) -> float:
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(data)
            got = b""
            while True:  # until an AMQP frame holding an Open (descriptor 0x10) comes back
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError(f"closed before the Open: {got[-80:]!r}")
                got += chunk
                at = got.find(b"AMQP\x00\x01\x00\x00")
                if at >= 0 and b"\x00\x53\x10" in got[at:]:
                    return time.perf_counter() - started

    try:
        times: dict[str, list[float]] = {name: [] for name in targets}
        for port, data in targets.values():
            for _ in range(20):
                one(port, data)  # warm up
        for _ in range(connections):
            for name, (port, data) in targets.items():
                times[name].append(one(port, data))
        base = statistics.median(times["password (SASL relayed)"])
        base_p99 = sorted(times["password (SASL relayed)"])[int(connections * 0.99) - 1]
        print(f"\nwall time to Open through the real daemon in front of qdrouterd 1.19 "
              f"({connections} connections each, alternating)")
        print(f"{'case':34} {'median ms':>10} {'p99 ms':>10} {'added median':>13} "
              f"{'added p99':>10}")
        for name, samples in times.items():
            ordered = sorted(samples)
            median, p99 = statistics.median(ordered), ordered[int(connections * 0.99) - 1]
            print(f"{name:34} {median * 1e3:10.2f} {p99 * 1e3:10.2f} "
                  f"{(median - base) * 1e3:13.2f} {(p99 - base_p99) * 1e3:10.2f}")
    finally:
        token_proxy.stop()
        plain_proxy.stop()
        router.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--e2e", action="store_true",
                        help="also through real proxies in front of a real qdrouterd")
    parser.add_argument("--e2e-connections", type=int, default=500)
    args = parser.parse_args(argv)
    issuer = Issuer()
    cache = JwksCache.from_config(CONFIG)
    cache.fetch_started(0.0)
    cache.fetched(issuer.jwks(), 0.0)
    auth = TokenAuth(CONFIG, "proxy", cache)
    now = time.time()
    rs256 = issuer.token("rsa-1", exp=int(now) + 3600, scope="amqp-proxy.send")
    es256 = issuer.token("ec-1", exp=int(now) + 3600, scope="amqp-proxy.send")
    cases = {
        "password (SASL relayed)": (None, plain_init("alice", "secret")),
        "token RS256 (proxy authority)": (auth, plain_init("alice", rs256)),
        "token ES256 (proxy authority)": (auth, plain_init("alice", es256)),
    }
    results: dict[str, list[int]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (tokens, init) in cases.items():
            results[name] += run_case(tokens, init, args.connections)
    keys = cache.keys(0.0)
    validate: dict[str, list[int]] = {"RS256": [], "ES256": []}
    for alg, token in (("RS256", rs256), ("ES256", es256)):
        for _ in range(args.connections * args.rounds):
            started = time.thread_time_ns()
            validate_token(token, CONFIG, keys, now)
            validate[alg].append(time.thread_time_ns() - started)
    base_median, base_p99 = summary(results["password (SASL relayed)"])
    print(f"core CPU per connection, SASL header to the router's Open "
          f"({args.rounds} x {args.connections} connections, Python "
          f"{sys.version.split()[0]})")
    print(f"{'case':34} {'median µs':>10} {'p99 µs':>10} {'added median':>13} "
          f"{'added p99':>10}")
    for name, samples in results.items():
        median, p99 = summary(samples)
        print(f"{name:34} {median:10.1f} {p99:10.1f} {median - base_median:13.1f} "
              f"{p99 - base_p99:10.1f}")
    for alg, samples in validate.items():
        median, p99 = summary(samples)
        print(f"{'validate_token ' + alg + ' alone':34} {median:10.1f} {p99:10.1f}")
    if args.e2e:
        e2e(args.e2e_connections, issuer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
