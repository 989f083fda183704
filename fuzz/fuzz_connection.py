#!/usr/bin/env python3
"""atheris target: one ProxyConnection driven by a fuzzed script of client/router bytes and events.

Run (see fuzz/README.md)::

    .venv/bin/python fuzz/fuzz_connection.py fuzz/work/connection fuzz/corpus/connection \
        -runs=1000000 -max_len=65536 -timeout=10 -rss_limit_mb=2048

The invariants are in ``fuzz/harness.py``; a violation raises ``Finding`` and libFuzzer writes
the input to ``crash-*`` (move it to ``fuzz/regressions/connection/`` with a note).
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["amqp_policy_proxy", "fuzz", "tests.support.frames"]):
    from fuzz.harness import run_connection


def test_one_input(data: bytes) -> None:
    """libFuzzer entry point."""
    run_connection(data)


def main() -> None:
    """Parse libFuzzer flags from argv and fuzz until told to stop."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
