"""The package is grouped by layer (docs/development.md, "Module map"): the root holds
the face, the exception tree and the settings; every other module lives in its layer and
has exactly one import path, the one of its file."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "langchain_idempotent"
#: What is code at the root.
ROOT_CODE = {"__init__", "__main__", "_lazy", "errors", "settings"}
LAYERS = ("core", "adapters", "integrations", "stores", "cli", "testing")
#: Paths of modules that moved into a layer before the first release; none is importable.
REMOVED = (
    "langchain_idempotent.tool",
    "langchain_idempotent.engine",
    "langchain_idempotent.keys",
    "langchain_idempotent.mcp",
    "langchain_idempotent.stores.base",
)


def test_the_root_holds_only_the_face_the_errors_and_the_settings() -> None:
    root = {p.stem for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert root == ROOT_CODE, f"put a new module in its layer ({', '.join(LAYERS)})"
    assert folders == set(LAYERS)


@pytest.mark.parametrize("old", REMOVED)
def test_a_path_from_before_the_layers_is_pythons_own_module_not_found(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
