"""docs/architecture.md keeps up with the code: every state, every core module, every layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqp_policy_proxy.core.state import ClientState, CloseState, RouterState

from .test_import_boundaries import LAYERS, SRC

DOC = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()


@pytest.mark.parametrize("state", [*ClientState, *RouterState, *CloseState],
                         ids=lambda s: f"{type(s).__name__}.{s.name}")
def test_every_state_is_described(state):
    assert f"`{state.name}`" in DOC


@pytest.mark.parametrize("module", sorted(p.name for p in (SRC / "core").glob("*.py")
                                          if p.name != "__init__.py"))
def test_every_core_module_has_a_row(module):
    assert f"| `{module}` |" in DOC


@pytest.mark.parametrize("unit", sorted(u for u in LAYERS if not u.startswith("__")))
def test_every_layer_unit_is_in_the_table(unit):
    name = f"`{unit}.py`" if (SRC / f"{unit}.py").exists() else f"`{unit}/`"
    assert name in DOC
