#!/usr/bin/env python3
"""atheris target: the differential oracle (a proxy connection in front of a real proton engine).

Run (see fuzz/README.md)::

    .venv/bin/python fuzz/fuzz_differential.py fuzz/work/differential fuzz/corpus/differential \
        -runs=1000000 -max_len=16384 -timeout=10 -rss_limit_mb=2048

The invariants are in ``fuzz/differential.py``; a violation raises ``Divergence`` and libFuzzer
writes the input to ``crash-*`` (move it to ``fuzz/regressions/differential/`` with a note).
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["amqp_policy_proxy", "fuzz"]):
    from fuzz.differential import run_differential


def test_one_input(data: bytes) -> None:
    """libFuzzer entry point."""
    run_differential(data)


def main() -> None:
    """Parse libFuzzer flags from argv and fuzz until told to stop."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
