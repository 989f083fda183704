"""The layering rules (docs/architecture.md, "Layers"), enforced on the source's ASTs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "amqp_policy_proxy"
PURE = ["amqp", "core", "policy", "limits", "ingress", "tokens"]
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


#: The layers, bottom first (docs/architecture.md, "Layers"): a module may import its own
#: package and packages of a lower rank, never a higher one. ``spark_reports`` is a separate
#: program that reads the event log's schema and the policy; it sits beside the daemon.
LAYERS: dict[str, int] = {
    "amqp": 0,
    "resolver": 1,
    "ingress": 1,
    "policy": 2,
    "limits": 3,
    "tokens": 3,
    "core": 4,
    "eventlog": 5,
    "metrics": 5,
    "fleet": 5,
    "daemon": 6,
    "spark_reports": 6,
    "demo": 7,
    "admin_client": 8,
    "cli": 9,
    "__main__": 10,
    "__init__": -1,
}
#: What the capacity reports may import from the proxy (they run on Spark executors, far from a
#: running daemon): the event-log schema, the policy, the host-name resolver and the sans-IO
#: connection ledger and rate buckets of ``limits`` (the exact what-if replays the log through
#: them, spark_reports/replay.py).
SPARK_REPORTS_MAY_IMPORT = {"eventlog", "policy", "limits", "resolver", "spark_reports",
                            "__init__"}


def _unit(path: Path) -> str:
    """The layer unit of a source file: its top-level package, or the module's own name."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _module(path: Path) -> str:
    return "amqp_policy_proxy." + ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(
        ".__init__"
    )


ALL_FILES = sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_layers_read_top_down(path: Path) -> None:
    unit = _unit(path)
    assert unit in LAYERS, f"{unit} has no place in LAYERS: give the new package a layer"
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] != "amqp_policy_proxy" or len(parts) < 2:
            continue
        target = parts[1]
        if target == unit:
            continue
        assert LAYERS[target] < LAYERS[unit], (
            f"{path.relative_to(SRC)} ({unit}, layer {LAYERS[unit]}) imports {name} "
            f"({target}, layer {LAYERS[target]})"
        )
        if unit == "spark_reports":
            assert target in SPARK_REPORTS_MAY_IMPORT, f"{path.relative_to(SRC)} imports {name}"


def test_no_import_cycles_between_modules() -> None:
    """No circle of imports, counting those only a type checker reads: a circle there too
    means two modules that each need the other's concepts (one concept, one home)."""
    modules = {_module(p): p for p in ALL_FILES}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imports(path):
            # "from .x import y" names a module x or a symbol y of x: keep the longest module
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                targets.add(name)
        graph[module] = targets
    seen: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(module: str) -> None:
        seen[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if seen.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in seen:
                visit(target)
        stack.pop()
        seen[module] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module)


def test_the_daemon_at_rest_does_not_load_what_it_does_not_use(tmp_path: Path) -> None:
    """Memory at rest: the modules behind `run` and a JSON policy load leave out aiohttp
    (only with an [admin] socket), PyYAML (only for *.yaml policy files), redis-py (only with
    a fleet), Spark (reports only) and pydantic (the config schema, which `run` uses in a
    child: daemon/config_child.py). A fresh interpreter, so nothing else has imported them
    first."""
    policy = tmp_path / "p.json"
    policy.write_text('[["vhost", {"hostname": "$default", "groups": {"$default": '
                      '{"users": "*", "remoteHosts": "*"}}}]]')
    code = (
        "import sys\n"
        "import amqp_policy_proxy.cli, amqp_policy_proxy.daemon.run\n"
        "import amqp_policy_proxy.daemon.workers, amqp_policy_proxy.daemon.relay\n"
        "import amqp_policy_proxy.daemon.app, amqp_policy_proxy.core.connection\n"
        "from amqp_policy_proxy.policy.load import load_policy\n"
        f"load_policy({str(policy)!r})\n"
        "heavy = ('aiohttp', 'yaml', 'redis', 'pyspark', 'pydantic', 'pydantic_core')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]", f"loaded at rest: {out}"


def test_the_daemon_lifecycle_stays_under_500_lines() -> None:
    """daemon/app.py is the lifecycle and the relay's host; its parts live beside it (tls,
    health, snapshots, outputs, reload, drain, listeners, tokens...). A new part gets its own
    module instead of growing it past 500 lines again."""
    lines = len((SRC / "daemon" / "app.py").read_text().splitlines())
    assert lines < 500, f"daemon/app.py has {lines} lines: give the new part its own module"
