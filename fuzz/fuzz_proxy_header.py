#!/usr/bin/env python3
"""atheris target: the PROXY protocol header parser, read in chunks as the daemon reads it.

Run (see fuzz/README.md)::

    .venv/bin/python fuzz/fuzz_proxy_header.py fuzz/work/proxy_header fuzz/corpus/proxy_header \
        -runs=1000000 -max_len=4200 -timeout=10 -rss_limit_mb=2048

The invariants are in ``fuzz/proxy_header.py``; a violation raises ``Finding`` and libFuzzer
writes the input to ``crash-*`` (move it to ``fuzz/regressions/proxy_header/`` with a note).
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with atheris.instrument_imports(include=["amqp_policy_proxy", "fuzz"]):
    from fuzz.proxy_header import run_proxy_header


def test_one_input(data: bytes) -> None:
    """libFuzzer entry point."""
    run_proxy_header(data)


def main() -> None:
    """Parse libFuzzer flags from argv and fuzz until told to stop."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
