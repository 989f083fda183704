"""The repository's docs stand alone: no pointer to design notes that live outside it.

Operators read docs/, the READMEs, the unit, the dashboards and the examples from an installed
package; developers read the docstrings. A reference such as "ARCHITECTURE 4.6", "QDR-POLICY
2.5" or "decision 7" names a file they do not have, so the fact must be written down here
instead (or point to a doc that is in the repository, e.g. docs/decisions/0001-...).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE_REFERENCE = re.compile(
    r"ARCHITECTURE|QDR-POLICY|STYLE(?:\.md| ?§| [0-9])"
    r"|\.\./shared|/work/shared|shared/(?:design|reference)"
    r"|\bdecisions? [0-9]{1,2}\b(?![0-9])"  # "decision 7"; "decision 0002" is docs/decisions/
    r"|\bissue #?[0-9]+\b"
)
TEXT_SUFFIXES = {".md", ".py", ".json", ".yml", ".yaml", ".toml", ".service", ".c"}


def files(*roots: str) -> list[Path]:
    out = []
    for root in roots:
        path = ROOT / root
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out.extend(p for p in sorted(path.rglob("*"))
                       if p.is_file() and p.suffix in TEXT_SUFFIXES)
    return out


def offending_lines(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE_REFERENCE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_docs_readmes_unit_dashboards_examples_and_sources_stand_alone():
    paths = files("docs", "README.md", "bench/README.md", "fuzz/README.md",
                  "systemd", "dashboards", "examples", "src")
    assert len(paths) > 50
    assert offending_lines(paths) == []


#: What the code around the package (tests, fuzz targets, bench, scripts) must not cite: the
#: design notes outside the repository. Issue numbers are fine there (they name the work).
DESIGN_NOTE = re.compile(OUTSIDE_REFERENCE.pattern.replace(r"|\bissue #?[0-9]+\b", ""))


def test_tests_fuzz_bench_and_scripts_cite_no_design_note_outside_the_repository():
    paths = [p for p in files("tests", "fuzz", "bench", "scripts", "debian")
             if p.name != "test_docs_standalone.py"]
    assert len(paths) > 100
    found = [line for line in offending_lines(paths) if DESIGN_NOTE.search(line.split(": ", 1)[1])]
    assert found == []


def test_the_pattern_catches_what_it_should():
    for bad in ("(ARCHITECTURE 4.6)", "QDR-POLICY 2.5", "STYLE §2.F", "(decision 7)",
                "decisions 1-6", "../shared/design", "issue 8"):
        assert OUTSIDE_REFERENCE.search(bad), bad
    for good in ("[decision 0004](decisions/0004-topic-delivery-filtering.md)",
                 "AMQP 1.0 Part 2 §2.7.1", "the spec's section 9.4.1.3", "--out /shared/capacity"):
        assert not OUTSIDE_REFERENCE.search(good), good
    assert DESIGN_NOTE.search("(ARCHITECTURE 4.6)") and not DESIGN_NOTE.search("issue 14")
