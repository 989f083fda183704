"""core/admission.py: the connection rates at the Open, after QDR's counts."""

from __future__ import annotations

from amqp_policy_proxy.core.commands import Side
from amqp_policy_proxy.core.events import ConnectionApproved, ConnectionDenied
from amqp_policy_proxy.limits.connections import ConnectionLedger
from amqp_policy_proxy.limits.rates import RateLimits

from .helpers import Close, Open, Script, make_policy

POLICY = make_policy(
    {"g": {"users": "*", "remoteHosts": "*", "maxConnectionRatePerUser": 2,
           "maxConnectionsPerUser": 3}},
    maxConnectionRatePerHost=10,
)


def attempt(ledger: ConnectionLedger, rates: RateLimits, n: int, now: float = 0.0,
            user: str = "alice") -> Script:
    s = Script(POLICY, ledger=ledger, rates=rates, conn_id=f"c{n}", now=now)
    s.open(user=user)
    return s


def test_a_connection_over_the_rate_is_denied_like_a_count_and_holds_no_slot():
    ledger, rates = ConnectionLedger(100), RateLimits()
    assert [e for e in attempt(ledger, rates, 1).events if isinstance(e, ConnectionApproved)]
    attempt(ledger, rates, 2)
    s = attempt(ledger, rates, 3)
    (denied,) = [e for e in s.events if isinstance(e, ConnectionDenied)]
    assert (denied.reason, denied.condition, denied.description) == (
        "user_rate", "amqp:resource-limit-exceeded", "connection disallowed by local policy")
    frames = s.take(Side.CLIENT)
    assert isinstance(frames[-2][1], Open) and isinstance(frames[-1][1], Close)
    assert frames[-1][1].error.condition == "amqp:resource-limit-exceeded"
    # the router never got this Open; the ledger holds the two admitted connections only
    assert not any(isinstance(p, Open) for _, p, _ in s.take(Side.ROUTER))
    assert ledger.user_active("test", "alice") == 2 and not ledger.is_admitted("c3")


def test_counts_come_first_and_a_count_denial_takes_no_token():
    ledger, rates = ConnectionLedger(100), RateLimits()
    for n in range(2):
        attempt(ledger, rates, n)
    s = attempt(ledger, rates, 9, now=1.0)  # a token is back: the third is admitted
    assert [e for e in s.events if isinstance(e, ConnectionApproved)]
    s = attempt(ledger, rates, 10, now=1.0)  # maxConnectionsPerUser 3: QDR's reason wins
    (denied,) = [e for e in s.events if isinstance(e, ConnectionDenied)]
    assert denied.reason == "user_limit"
    ledger.release("c0")
    s = attempt(ledger, rates, 11, now=1.0)  # the count denial left the token there
    assert [e for e in s.events if isinstance(e, ConnectionApproved)]


def test_without_rate_buckets_no_rate_applies():
    ledger = ConnectionLedger(100)
    for n in range(3):
        s = Script(POLICY, ledger=ledger, conn_id=f"c{n}")
        s.open(user="alice")
        assert [e for e in s.events if isinstance(e, ConnectionApproved)]
