"""The package is grouped by layer (docs/development.md, "Module map"): the root holds
the face, the exception tree, the settings and the public paths of moved modules, each of
which *is* the module it names; and ``scripts/relayout.py`` has nothing left to do."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "langchain_idempotent"
MARK = "# public path: written by scripts/relayout.py"
#: What is code at the root (everything else there is a public path).
ROOT_CODE = {"__init__", "__main__", "_lazy", "errors", "settings"}
LAYERS = ("core", "adapters", "integrations", "stores", "cli", "testing")


def _public_paths() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if MARK in path.read_text(encoding="utf-8") and path.name != "__init__.py":
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts))
    return found


def test_the_root_holds_only_the_face_the_errors_the_settings_and_public_paths() -> None:
    code = {p.stem for p in PACKAGE.glob("*.py") if MARK not in p.read_text(encoding="utf-8")}
    assert code == ROOT_CODE, f"put a new module in its layer ({', '.join(LAYERS)})"


@pytest.mark.parametrize("old", _public_paths())
def test_a_public_path_is_the_moved_module_itself(old: str) -> None:
    module = importlib.import_module(old)
    assert module.__name__ != old and module.__name__.split(".")[1] in LAYERS
    assert sys.modules[old] is module is importlib.import_module(module.__name__)
    parent, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(parent), name) is module


def test_a_moved_packages_public_path_has_its_names() -> None:
    pytest.importorskip("mcp")
    import langchain_idempotent.integrations.mcp as real
    import langchain_idempotent.mcp as face

    assert all(getattr(face, name) is getattr(real, name) for name in real.__all__)


def test_the_relayout_script_has_nothing_left_to_do() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/relayout.py", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("0 moves, 0 files written")
