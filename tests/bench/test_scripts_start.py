"""Every bench script starts: ``--help`` exits 0 (so an import broken by a refactoring, such
as a helper moved to another bench module, is caught by the suite, not by the next person who
runs the bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py")
                 if "__main__" in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=BENCH.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()
