"""The fuzz harness in the suite: regressions, captured seeds, and a bounded mutation fuzz.

- every input in ``fuzz/regressions/`` (one file per bug the fuzzers found, named after it)
  replays without a finding;
- every seed in ``fuzz/corpus/`` (captured from proton clients through the proxy, and from
  HAProxy for the PROXY protocol parser) passes the same invariants;
- hypothesis mutates those seeds (byte flips, splices, cuts, random inserts) for a few thousand
  inputs; ``HYPOTHESIS_PROFILE=fast`` runs a few hundred, ``deep`` a hundred thousand.

The long coverage-guided runs are ``fuzz/fuzz_*.py`` (atheris); see ``fuzz/README.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fuzz.differential import run_differential
from fuzz.harness import Finding, run_connection, run_framing
from fuzz.proxy_header import run_proxy_header

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
TARGETS = {"connection": run_connection, "framing": run_framing,
           "differential": run_differential, "proxy_header": run_proxy_header}
#: Targets whose fuzzers have found no bug yet (so no regression input to replay).
NO_FINDINGS_YET = {"proxy_header"}
EXAMPLES = {"fast": 200, "deep": 100_000}.get(os.environ.get("HYPOTHESIS_PROFILE", ""), 1000)


def _files(kind: str, target: str) -> list[Path]:
    return sorted(p for p in (FUZZ / kind / target).glob("*") if p.is_file())


def _cases(kind: str) -> list[tuple[str, Path]]:
    return [(target, p) for target in TARGETS for p in _files(kind, target)]


@pytest.mark.parametrize(("target", "path"), _cases("regressions"),
                         ids=[f"{t}/{p.name}" for t, p in _cases("regressions")])
def test_regression_input_replays_clean(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


@pytest.mark.parametrize(("target", "path"), _cases("corpus"),
                         ids=[f"{t}/{p.name}" for t, p in _cases("corpus")])
def test_captured_seed_passes_every_invariant(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


def test_there_are_seeds_and_regressions() -> None:
    for target in TARGETS:
        assert len(_files("corpus", target)) >= 9
        assert _files("regressions", target) or target in NO_FINDINGS_YET


def _small_seeds(target: str) -> list[bytes]:
    return [p.read_bytes() for p in _files("corpus", target) if p.stat().st_size <= 8192]


@st.composite
def mutated(draw: st.DrawFn, target: str) -> bytes:
    """A captured seed with a few random edits (mitmproxy ``mutations()`` style)."""
    data = bytearray(draw(st.sampled_from(_small_seeds(target))))
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=16))
            continue
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "splice", "cut"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.sampled_from([0x00, 0x40, 0x41, 0x42, 0x43, 0x45, 0x52, 0x53,
                                              0x70, 0x80, 0xA0, 0xB0, 0xC0, 0xD0, 0xFF]))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=12))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "splice":
            other = draw(st.sampled_from(_small_seeds(target)))
            start = draw(st.integers(0, max(0, len(other) - 1)))
            data[pos:pos] = other[start : start + draw(st.integers(1, 64))]
        else:
            del data[pos:]
    return bytes(data)


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@FUZZ_SETTINGS
@given(mutated("connection"))
def test_mutated_connection_scripts(data: bytes) -> None:
    run_connection(data)


@pytest.mark.slow
@FUZZ_SETTINGS
@given(mutated("framing"))
def test_mutated_frame_streams(data: bytes) -> None:
    run_framing(data)


@pytest.mark.slow
@FUZZ_SETTINGS
@given(mutated("differential"))
# the oracle itself once failed on these: a binary delivery-tag that is not UTF-8 (proton's
# Python Delivery.tag decodes it), and a delivery-tag a client typed as a string
@example(bytes.fromhex(
    "0400400000004002000000005312d00000003000000007a10273305200424040005328d0000000050000"
    "000140005329d00000000e00000001a1087075626c69632e6100430000004302000000005314d0000000"
    "140000000652007000000000a00480000000434242005373d00000000700000003404040005377a00178"
    "005377a00568656c6c6f00390000003902000000005314d0000000140000000652007000000001a00400"
    "000001434242005375a01078787878787878787878787878787878"))
@example(bytes.fromhex(
    "02003b0000003b02000000005312d00000002b00000007a10672656c617932520b424040005328d00000"
    "00050000000140005329d0000000050000000140004f0000004f02000000005314d00000001400000006"
    "520b7000000000a00400000000434242005373d00000001d00000003005301a1087365637265742e7840"
    "a1097075626c69632e6f6b005377a0017800420000004202000000005314d00000001400000006520b70"
    "00000001a10400000001434242005373d000000006000000034040a1087365637265742e79005377a001"
    "7800660000006602000000005314d00000001400000006520b7000000002a00400000002434242005372"
    "d10000001b00000002a30b782d6f70742d71642e746fa1087365637265742e7a005373d0000000110000"
    "00034040a1097075626c69632e6f6b005377a0017800460000004602000000005314d000000014000000"
    "06520b7000000003a00400000003434242005373d000000014000000034040a10c7075626c69632e6166"
    "746572005377a00178"))
def test_what_the_router_reads_is_what_the_proxy_decided(data: bytes) -> None:
    """The differential oracle (issue 14): a proxy connection in front of a real proton engine
    acting as the router; the engine's identity, links, deliveries and relay ``to`` must be
    the ones the proxy decided on, for mutated seeds of allowed and hostile traffic."""
    run_differential(data)


@pytest.mark.slow
@FUZZ_SETTINGS
@given(mutated("proxy_header"))
def test_mutated_proxy_headers(data: bytes) -> None:
    """PROXY protocol headers HAProxy sent (captured) and hand-made ones, mutated, read as
    the daemon reads them: no exception, bounded, nothing taken past the header, errors
    final, and the same decision as the reference reading of the spec."""
    run_proxy_header(data)


@pytest.mark.slow
@FUZZ_SETTINGS
@given(st.binary(max_size=600))
def test_random_connection_scripts(data: bytes) -> None:
    run_connection(data)


def test_a_finding_is_reported() -> None:
    # the harness is not vacuous: an input that breaks an invariant raises Finding
    import fuzz.harness as harness

    original = harness._check_buffers

    def broken(conn: object) -> None:
        raise Finding("planted")

    harness._check_buffers = broken  # type: ignore[assignment]
    try:
        with pytest.raises(Finding):
            run_connection(_small_seeds("connection")[0])
    finally:
        harness._check_buffers = original


def test_a_proxy_header_finding_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PROXY header harness is not vacuous: a parser that takes one byte of the client's
    stream with the header, or disagrees with the reference, is a finding."""
    import dataclasses

    import fuzz.proxy_header as harness
    from amqp_policy_proxy.ingress.proxy_protocol import ProxyHeader, parse_header

    seed = (FUZZ / "corpus" / "proxy_header" / "haproxy-v2-client").read_bytes()
    harness.run_proxy_header(seed)

    def greedy(data: bytes):  # one byte too many
        result = parse_header(data)
        if isinstance(result, ProxyHeader):
            return dataclasses.replace(result, length=result.length + 1)
        return result

    monkeypatch.setattr(harness, "parse_header", greedy)
    with pytest.raises(harness.Finding, match="reference says"):
        harness.run_proxy_header(seed)


def _regression(prefix: str) -> bytes:
    return next(p for p in _files("regressions", "differential")
                if p.name.startswith(prefix)).read_bytes()


def test_the_oracle_sees_a_shadow_attach_when_the_canonical_check_is_off(monkeypatch) -> None:
    # not vacuous: without the canonical check, the proxy decides on one link and the proton
    # engine attaches another (issue 14 finding 3), and the oracle says so
    import amqp_policy_proxy.core.client_side as core
    from fuzz.differential import Divergence

    monkeypatch.setattr(core, "check_performative", lambda buf, pos, end: (0, end, []))
    with pytest.raises(Divergence, match="secret.f3d"):
        run_differential(_regression("finding-3-shadow-attach"))


def test_the_oracle_sees_an_identity_the_router_did_not_authenticate(monkeypatch) -> None:
    # not vacuous: if the proxy took the authzid as the user (finding 1), the engine's
    # authenticated user differs from the admitted one
    import amqp_policy_proxy.core.client_side as core
    from amqp_policy_proxy.amqp.sasl import SaslIdentity, identity_from_sasl_init
    from fuzz.differential import Divergence

    def authzid_wins(mechanism, response, **kw):
        found = identity_from_sasl_init(mechanism, response, **kw)
        return SaslIdentity(found.authzid or found.user, None)

    monkeypatch.setattr(core, "identity_from_sasl_init", authzid_wins)
    with pytest.raises(Divergence, match="authenticated 'fuzzalice'"):
        run_differential(_regression("finding-1-authzid-admin"))
