"""The library's file-level import graph has no cycle.

Every import counts, as REVIEW appendix A.5 counts them: at module level, inside a function
(a late import) and under ``if TYPE_CHECKING:`` (a type-only one), since each is an arrow a
reader must follow. ``from pkg import name`` is an arrow to ``pkg.name`` when that is a
module and to ``pkg`` otherwise; arrows into the package face (``langchain_idempotent``,
whose names all load lazily) are left out, as A.5 does.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "langchain_idempotent"
ROOT = "langchain_idempotent"

#: Cycles still allowed: none (issue 32 removed the last two, ``_call`` <-> ``_siblings`` and
#: the one inside ``cli/``). A new cycle fails.
STILL_OPEN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names one import statement may reach (modules or names in them)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        yield target
        yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """``{module: the library modules it imports}``."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                if target in modules and target not in (name, ROOT):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_library_has_no_import_cycle_but_the_ones_still_listed() -> None:
    found = cycles(import_graph())
    new = [sorted(c) for c in found - STILL_OPEN]
    gone = [sorted(c) for c in STILL_OPEN - found]
    assert not new, f"import cycles: {new}"
    assert not gone, f"these cycles are gone: take them off STILL_OPEN: {gone}"


def test_the_cycle_finder_sees_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == {frozenset({"a", "b", "c"})}
    assert cycles({"a": {"b"}, "b": set()}) == set()
