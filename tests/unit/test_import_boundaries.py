"""The layering rules of ARCHITECTURE section 1, enforced on the source's ASTs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "amqp_policy_proxy"
PURE = ["amqp", "core", "policy", "limits", "ingress"]
PURE_FILES = [p for pkg in PURE for p in sorted((SRC / pkg).rglob("*.py"))] + [
    SRC / "eventlog" / "schema.py",
    SRC / "eventlog" / "records.py",
]
FORBIDDEN = {"asyncio", "socket", "uvloop", "prometheus_client", "pyspark", "selectors", "ssl"}
CLOCK_CALLS = {("time", "time"), ("time", "monotonic"), ("time", "perf_counter"),
               ("datetime", "now"), ("datetime", "utcnow"), ("date", "today")}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # resolve relative imports against the package path
                pkg = path.relative_to(SRC.parent).with_suffix("").parts[: -node.level]
                base = ".".join(pkg)
                names.append(f"{base}.{node.module}" if node.module else base)
            else:
                names.append(node.module or "")
    return names


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_sans_io_packages_import_no_io(path: Path) -> None:
    for name in _imports(path):
        top = name.split(".")[0]
        assert top not in FORBIDDEN, f"{path.name} imports {name}"
        assert not name.startswith("amqp_policy_proxy.daemon"), f"{path.name} imports {name}"
        assert not name.startswith("amqp_policy_proxy.metrics"), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_sans_io_packages_never_read_the_clock(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in CLOCK_CALLS:
                pytest.fail(f"{path.name}:{node.lineno} reads the clock ({owner.id}.{node.func.attr})")


def test_proton_only_in_codec_and_demo() -> None:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "amqp/codec.py" or rel.startswith("demo/"):
            continue
        for name in _imports(path):
            assert name.split(".")[0] != "proton", f"{rel} imports {name}"


def test_netaddr_only_in_ingress() -> None:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("ingress/"):
            continue
        for name in _imports(path):
            assert name.split(".")[0] != "netaddr", f"{rel} imports {name}"


def test_pyspark_only_in_spark_reports_and_daemon_never_imports_it() -> None:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("spark_reports/"):
            continue
        for name in _imports(path):
            assert name.split(".")[0] != "pyspark", f"{rel} imports {name}"
