#!/usr/bin/env python3
"""atheris target: the frame decoder and the wire readers (framing, transfer, performatives).

Run (see fuzz/README.md)::

    .venv/bin/python fuzz/fuzz_framing.py fuzz/work/framing fuzz/corpus/framing \
        -runs=1000000 -max_len=65536 -timeout=10 -rss_limit_mb=2048

The invariants are in ``fuzz/harness.py``; a violation raises ``Finding`` and libFuzzer writes
the input to ``crash-*`` (move it to ``fuzz/regressions/framing/`` with a note).
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["amqp_policy_proxy", "fuzz", "tests.support.frames"]):
    from fuzz.harness import run_framing


def test_one_input(data: bytes) -> None:
    """libFuzzer entry point."""
    run_framing(data)


def main() -> None:
    """Parse libFuzzer flags from argv and fuzz until told to stop."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
