"""ingress/remote_hosts.py: QDR remoteHosts (2.6) plus CIDR, mapped IPv4 and host-name fixes."""

from __future__ import annotations

import pytest

from amqp_policy_proxy.ingress.remote_hosts import RemoteHosts, RemoteHostsError
from amqp_policy_proxy.resolver import system_resolver


def _problems(spec: object, resolver: object = None) -> tuple[tuple[int, str], ...]:
    with pytest.raises(RemoteHostsError) as info:
        RemoteHosts.parse(spec, resolver=resolver)  # type: ignore[arg-type]
    return info.value.problems


@pytest.mark.parametrize(
    ("spec", "host", "expected"),
    [
        ("*", "10.1.2.3", True),
        ("*", "2001:db8::1", True),
        ("*", "::ffff:10.1.2.3", True),
        ("*", "not-an-ip", False),  # unparsable host never matches, even '*'
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),
        ("::1", "::1", True),
        ("::1", "0:0:0:0:0:0:0:1", True),
        ("::1", "127.0.0.1", False),
        ("10.18.0.0-10.18.255.255", "10.18.0.0", True),
        ("10.18.0.0-10.18.255.255", "10.18.255.255", True),
        ("10.18.0.0-10.18.255.255", "10.19.0.0", False),
        ("10.18.0.0-10.18.255.255", "::ffff:10.18.7.7", True),  # an IPv4-mapped IPv6 address matches the IPv4 range
        ("2001:db8::-2001:db8::ffff", "2001:db8::abcd", True),
        ("2001:db8::-2001:db8::ffff", "2001:db8::1:0", False),
        ("10.0.0.0/8", "10.255.255.255", True),
        ("10.0.0.0/8", "11.0.0.0", False),
        ("fd00::/8", "fdff::1", True),
        ("fd00::/8", "fe00::1", False),
        ("10.0.0.0/8", "10.1.1.1%eth0", True),
        ("1.2.3.4, 5.6.7.8", "5.6.7.8", True),
        (["1.2.3.4", " 5.6.7.8 "], "5.6.7.8", True),
        ("1.2.3.4, 5.6.7.8", "9.9.9.9", False),
        ("::ffff:10.0.0.1", "10.0.0.1", True),
    ],
)
def test_matches(spec: str, host: str, expected: bool) -> None:
    assert RemoteHosts.parse(spec).matches(host) is expected


def test_empty_list_denies_everything() -> None:
    hosts = RemoteHosts()
    assert hosts.is_empty()
    assert not hosts.matches("127.0.0.1")
    assert hosts.first_match("127.0.0.1") is None


def test_first_match_names_the_item() -> None:
    hosts = RemoteHosts.parse("10.0.0.0/8, 10.1.0.0-10.1.0.9, *")
    assert hosts.first_match("10.1.0.5") == "10.0.0.0/8"
    assert hosts.first_match("192.0.2.1") == "*"
    assert hosts.first_match("garbage") is None
    assert hosts.items == ("10.0.0.0/8", "10.1.0.0-10.1.0.9", "*")


def test_hyphenated_host_name_resolved_with_fake_resolver() -> None:
    calls: list[str] = []

    def resolver(name: str) -> list[str]:
        calls.append(name)
        return {"my-host": ["192.0.2.10"], "db-1.example": ["2001:db8::10"]}[name]

    hosts = RemoteHosts.parse("my-host, db-1.example", resolver=resolver)
    assert calls == ["my-host", "db-1.example"]
    assert hosts.matches("192.0.2.10") and hosts.matches("2001:db8::10")
    assert not hosts.matches("192.0.2.11")
    assert dict(hosts.resolved) == {"my-host": "192.0.2.10", "db-1.example": "2001:db8::10"}


def test_host_name_resolution_errors() -> None:
    def resolver(name: str) -> list[str]:
        if name == "dual":
            return ["127.0.0.1", "::1"]
        if name == "same-twice":
            return ["192.0.2.1", "192.0.2.1"]
        if name == "junk":
            return ["not-an-ip"]
        if name == "none":
            return []
        raise LookupError("NXDOMAIN")

    assert RemoteHosts.parse("same-twice", resolver=resolver).matches("192.0.2.1")
    assert _problems("dual, gone, junk, none, 10.0.0.1-nohost", resolver) == (
        (0, "'dual' resolves to multiple IP addresses (127.0.0.1, ::1); QDR requires exactly one"),
        (1, "'gone' did not resolve to an IP address: NXDOMAIN"),
        (2, "'junk' resolved to 'not-an-ip', which is not an IP address"),
        (3, "'none' did not resolve to an IP address"),
        (4, "'10.0.0.1-nohost' did not resolve to an IP address: NXDOMAIN (it contains '-' but "
            "is not two IP addresses, so it is treated as a host name)"),
    )


def test_without_resolver_host_names_are_errors() -> None:
    assert _problems("localhost") == (
        (0, "'localhost' is a host name: cannot resolve host names without a resolver"),)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty host spec: an explicit empty remoteHosts is a configuration error in QDR; "
             "leave remoteHosts out to deny every host"),
        ("10.0.0.9-10.0.0.1", "host specs in range must have lower numeric address first"),
        ("10.0.0.1-::1", "mixed IPv4 and IPv6 host specs in range not allowed"),
        ("1.1.1.1-2.2.2.2-3.3.3.3", "hostspec must contain 1 or 2 host names"),
        ("10.*", "'*' cannot be combined with other text"),
        ("10.0.0.1/8", "CIDR network has host bits set; did you mean '10.0.0.0/8'?"),
        ("10.0.0.0/33", "not a valid CIDR network: '10.0.0.0/33' does not appear to be an IPv4 "
                        "or IPv6 network"),
        ("fe80::1%eth0", "IPv6 zone ids are not supported in remoteHosts"),
        ("300.1.1.1", "'300.1.1.1' is not a valid IP address"),
        ("fe80::zz", "'fe80::zz' is not a valid IP address"),
    ],
)
def test_invalid_items(spec: str, message: str) -> None:
    assert _problems(spec) == ((0, message),)


def test_every_bad_item_is_reported_with_its_index() -> None:
    problems = _problems(["*", "", "1.2.3.4", "10.*"])
    assert [i for i, _ in problems] == [1, 3]
    assert str(RemoteHostsError(problems)).startswith("[1] empty host spec")


def test_equality_and_repr() -> None:
    assert RemoteHosts.parse("*, 10.0.0.1") == RemoteHosts.parse(["*", "10.0.0.1"])
    assert RemoteHosts.parse("*") != RemoteHosts.parse("10.0.0.1")
    assert repr(RemoteHosts.parse("*")) == "RemoteHosts.parse(['*'])"
    assert hash(RemoteHosts.parse("*")) == hash(RemoteHosts.parse("*"))


def test_system_resolver_numeric_names() -> None:
    # Numeric input needs no DNS; the daemon passes system_resolver to load_policy.
    assert system_resolver("127.0.0.1") == ["127.0.0.1"]
    assert system_resolver("::1") == ["::1"]
    hosts = RemoteHosts.parse("127.0.0.1", resolver=system_resolver)
    assert hosts.matches("::ffff:127.0.0.1")
