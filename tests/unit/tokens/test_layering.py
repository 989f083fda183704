"""PyJWT stays in tokens/ (docs/architecture.md, "Layers"), as proton stays in amqp/codec.py."""

from __future__ import annotations

from ..test_import_boundaries import SRC, _imports


def test_pyjwt_only_in_tokens() -> None:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("tokens/"):
            continue
        for name in _imports(path):
            assert name.split(".")[0] != "jwt", f"{rel} imports {name}"
