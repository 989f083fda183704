#!/usr/bin/env python3
"""Rewrite the generated key reference in docs/configuration.md from the config schema.

Run from the repository root after changing src/amqp_policy_proxy/daemon/config.py:
    PYTHONPATH=src python3 scripts/gen-config-docs.py
tests/unit/daemon/test_config.py fails while the document and the schema differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from amqp_policy_proxy.daemon.config import reference_markdown  # noqa: E402

BEGIN, END = "<!-- BEGIN GENERATED: keys -->\n", "<!-- END GENERATED: keys -->"


def main() -> int:
    """Replace the text between the markers; return 0."""
    doc = ROOT / "docs" / "configuration.md"
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{reference_markdown()}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
