"""Group the package root into its layers (issue 32, item 1), re-playable on any main.

    python scripts/relayout.py             # do it; a second run changes nothing
    python scripts/relayout.py --dry-run   # say what it would do, change nothing
    python scripts/relayout.py --commit-moves  # the git mv's as a commit of their own first

In order:

1. ``git mv`` every module of :data:`MOVES` to its layer (``core/``, ``adapters/``,
   ``integrations/``), creating the packages. A module already moved is skipped. A root
   module in neither :data:`MOVES` nor :data:`STAY` stops the script before anything
   changes (a merged branch added it: give it a line in :data:`MOVES`).
2. Write a public-path module at every old public path (no leading underscore). It *is*
   the moved module (``sys.modules[__name__]``), so imports, private names, pickles and
   monkeypatching through the old path keep working; type checkers see its ``__all__``.
   A moved package gets a face that re-exports it, and one such module per public
   submodule.
3. Rewrite every import inside the package to the modules' new homes, relative imports
   recomputed from each file's new place, and the faces' lazy tables.
4. In tests/, graphs/, benchmarks/ (not its results), notebooks/, docs/ and README.md:
   rewrite references to moved *private* modules (dotted names, ``from
   langchain_idempotent import _x``, file paths to any moved module), and
   ``sys.modules`` / ``import_module`` strings naming any moved module. Public paths stay:
   they keep working, and they are what the docs should show.
5. The renames of REVIEW §5 item 6 (exact, anchored; each says whether it applied).
6. ``ruff check --fix --select I`` and ``ruff format`` on the files it changed.

It ends by listing what it could not do (an import to split over several lines, a rename
whose anchor is gone), for a hand fix.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = "langchain_idempotent"
PKG_DIR = REPO / PKG

#: Old module (relative to the package) -> its home. Packages move whole.
MOVES: dict[str, str] = {
    # core: the record protocol and the engine; never LangChain, and of LangGraph only the
    # msgpack serde of langgraph-checkpoint (core/_compat.py)
    "record": "core.record",
    "protocol": "core.protocol",
    "stores.base": "core.store",
    "serde": "core.serde",
    "_codec": "core._codec",
    "_codec_compat": "core._compat",
    "canonical": "core.canonical",
    "_durations": "core._durations",
    "_limits": "core._limits",
    "_callinfo": "core._callinfo",
    "engine": "core.engine",
    "_flow": "core._flow",
    "_steps": "core._steps",
    "_reconciling": "core._reconciling",
    "_transactional": "core._transactional",
    "heartbeat": "core.heartbeat",
    "events": "core.events",
    "context": "core.context",
    "policy": "core.policy",
    "reconcile": "core.reconcile",
    "encryption": "core.encryption",
    # adapters: LangChain / LangGraph, with their private touches (adapters/_compat.py)
    "tool": "adapters.tool",
    "middleware": "adapters.middleware",
    "_call": "adapters._call",
    "approval": "adapters.approval",
    "_asking": "adapters._asking",
    "_siblings": "adapters._siblings",
    "_batch": "adapters._identical",
    "_handoff": "adapters._handoff",
    "_replay": "adapters._replay",
    "keys": "adapters.keys",
    "_compat": "adapters._compat",
    # integrations: MCP, remote agents (Agent Server), OpenTelemetry
    "mcp": "integrations.mcp",
    "remote": "integrations.remote",
    "otel": "integrations.otel",
}

#: What stays at the root: the face, the exception tree every layer raises (stored
#: failures name its module), deployment settings; and the packages that already were.
STAY = {"__init__", "__main__", "_lazy", "errors", "settings", "stores", "cli", "testing"}

#: The docstrings of the new packages.
LAYERS: dict[str, str] = {
    "core": (
        "The record protocol and the engine: what a record is and what each store operation\n"
        "decides (``record``, ``protocol``, ``store``), results as bytes (``serde``), keys'\n"
        "canonical JSON, and the engine that claims, runs and completes once per key\n"
        "(``engine`` and ``_flow``), with the policy, context, events and heartbeat it\n"
        "stands on.\n\n"
        "Nothing here imports LangChain or LangGraph, beyond LangGraph's msgpack serde\n"
        "(``_compat``); ``lint-imports`` checks it (``pyproject.toml``).\n"
    ),
    "adapters": (
        "LangChain and LangGraph in front of the engine: the wrapped tool (``tool``), the\n"
        "``create_agent`` middleware (``middleware``), one call's derivation (``_call``,\n"
        "``keys``), approval (``approval``, ``_asking``), batched sibling claims\n"
        "(``_siblings``), identical calls in one message (``_identical``), handoffs and\n"
        "re-stamped replays (``_handoff``, ``_replay``), and every private LangChain /\n"
        "LangGraph touch (``_compat``).\n"
    ),
    "integrations": (
        "Across the wire and into other tools: MCP on both sides (``mcp``), a run on\n"
        "another Agent Server once per key (``remote``), OpenTelemetry spans (``otel``).\n"
        "Each stands on the engine, never on the LangChain adapters.\n"
    ),
}

#: Written into the root face's docstring, after its first paragraph.
FACE_MAP = """\
Layout (``docs/development.md`` has the module map): ``core/`` the record protocol and
the engine, ``adapters/`` LangChain and LangGraph, ``integrations/`` MCP, remote agents
and OpenTelemetry, ``stores/`` the backends, ``cli/`` the operator's commands,
``testing/`` the store contract. The other modules at the root are the public paths of
moved modules (``langchain_idempotent.tool`` is ``adapters/tool.py``).
"""

MARK = "# public path: written by scripts/relayout.py"

#: (file after the move, pattern, replacement, what it renames). REVIEW §5 item 6.
RENAMES: list[tuple[str, str, str, str]] = [
    ("adapters/_siblings.py", r"\b_Step\b", "_Batch", "_siblings._Step -> _Batch"),
    ("adapters/_siblings.py", r"(?<![\w.])(?<!import )_steps\b", "_batches", "the batches"),
    ("core/_reconciling.py", r"^def ask\(", "def consult(", "_reconciling.ask -> consult"),
    ("core/_reconciling.py", r"^async def aask\(", "async def aconsult(", "aask -> aconsult"),
    ("core/_reconciling.py", r'"aask", "ask"\]', '"aconsult", "consult"]', "its __all__"),
    ("core/engine.py", r"(from \._reconciling import )aask, ask\b", r"\1aconsult, consult", ""),
    ("core/engine.py", r"(?<![\w.])ask\(step\.", "consult(step.", "the sync driver's call"),
    ("core/engine.py", r"(?<![\w.])aask\(step\.", "aconsult(step.", "the async driver's call"),
    ("core/_flow.py", r"\bself\._ask\(", "self._consult(", "Flow._ask -> _consult (uses)"),
    ("core/_flow.py", r"^(\s+)def _ask\(", r"\1def _consult(", "Flow._ask -> _consult"),
    # references in docstrings that name a module by its old place
    ("adapters/_compat.py", r":mod:`\._codec_compat`", ":mod:`..core._compat`", "docstring"),
    ("adapters/_compat.py", r":mod:`\.stores\.", ":mod:`..stores.", "docstring"),
    ("adapters/_compat.py", r":mod:`\.mcp\.", ":mod:`..integrations.mcp.", "docstring"),
    ("core/_callinfo.py", r":mod:`\.keys`", ":mod:`..adapters.keys`", "docstring"),
    ("core/_codec.py", r"\(pinned in _codec_compat\)", "(pinned in _compat)", "a comment"),
    ("../tests/test_compat.py", r"``_codec_compat\.py``", "``core/_compat.py``", "docstring"),
]

#: Where references to moved private modules are rewritten (step 4).
OUTSIDE = ["tests", "graphs", "benchmarks", "notebooks", "docs", "README.md"]
SKIP = [REPO / "benchmarks" / "results"]
TEXT = {".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".json"}


#: A ``# -- section ------`` comment, whose dashes fill the line to 100 characters.
RULER = re.compile(r"^([ \t]*# .*? )(-{3,})$", re.MULTILINE)


def _fit(m: re.Match[str]) -> str:
    over = len(m.group(0)) - 100
    return m.group(0) if over <= 0 else m.group(1) + "-" * max(3, len(m.group(2)) - over)


@dataclass
class Run:
    dry: bool
    changed: set[Path] = field(default_factory=set)
    todo: list[str] = field(default_factory=list)

    def say(self, message: str) -> None:
        print(("(dry run) " if self.dry else "") + message)

    def write(self, path: Path, text: str) -> None:
        if path.suffix == ".py":
            text = RULER.sub(_fit, text)
        if path.exists() and path.read_text(encoding="utf-8") == text:
            return
        self.changed.add(path)
        if not self.dry:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")


# -- modules and their names ---------------------------------------------------------------


def module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_of(module: str, package: bool) -> Path:
    rel = Path(*module.split("."))
    return REPO / (rel / "__init__.py" if package else rel.with_suffix(".py"))


def is_shim(path: Path) -> bool:
    return path.is_file() and MARK in path.read_text(encoding="utf-8")


def new_name(module: str) -> str:
    """Where ``module`` (a dotted name) lives after the move."""
    for old in sorted(MOVES, key=len, reverse=True):
        full = f"{PKG}.{old}"
        if module == full or module.startswith(full + "."):
            return f"{PKG}.{MOVES[old]}{module[len(full) :]}"
    return module


def relative(from_package: str, target: str) -> str:
    """The relative spec of ``target`` seen from inside ``from_package``."""
    here, there = from_package.split("."), target.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def resolve(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    base = package_of(module, path).split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def library_modules() -> dict[str, Path]:
    return {module_of(p): p for p in PKG_DIR.rglob("*.py") if "__pycache__" not in p.parts}


def is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split(".")[1:])


# -- step 1: the moves ---------------------------------------------------------------------


def check_root() -> list[str]:
    layers = {m.split(".")[0] for m in MOVES.values()}
    known = STAY | {m.split(".")[0] for m in MOVES} | layers
    unknown = []
    for entry in sorted(PKG_DIR.iterdir()):
        name = entry.stem if entry.suffix == ".py" else entry.name
        if entry.name in ("__pycache__", "py.typed") or name in known or is_shim(entry):
            continue
        if entry.suffix == ".py" or (entry / "__init__.py").exists():
            unknown.append(entry.name)
    return unknown


def planned_moves() -> list[tuple[Path, Path]]:
    moves = []
    for old, new in MOVES.items():
        for package in (False, True):
            source = path_of(f"{PKG}.{old}", package)
            if source.exists() and not is_shim(source):
                target = path_of(f"{PKG}.{new}", package)
                source, target = (source.parent, target.parent) if package else (source, target)
                if target.is_dir() and not any(target.rglob("*.py")):
                    shutil.rmtree(target)  # only bytecode left by an earlier run: not a module
                if target.exists():
                    sys.exit(f"relayout: both {source} and {target} exist; merge them by hand")
                moves.append((source, target))
    return moves


# -- step 3: imports inside the package ----------------------------------------------------


@dataclass
class Edit:
    line: int  # 0-based
    start: int
    end: int
    text: str


def import_edits(
    source: str,
    old_module: str,
    old_path: Path,
    new_module: str,
    new_path: Path,
    modules: set[str],
    run: Run,
) -> tuple[list[Edit], dict[str, str]]:
    """The edits of one package file's imports, and module names it binds that change."""
    edits: list[Edit] = []
    renamed: dict[str, str] = {}
    lines = source.splitlines(keepends=True)
    new_package = package_of(new_module, new_path)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if new_name(alias.name) != alias.name:
                    run.todo.append(f"{new_path}:{node.lineno}: import {alias.name} (by hand)")
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        target = resolve(node, old_module, old_path)
        if not target.startswith(PKG):
            continue
        homes = []  # (the new module to import from, the name imported, its old name)
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in modules or (new_name(sub) != sub and new_name(sub) in modules):
                parent, _, name = new_name(sub).rpartition(".")
                homes.append((parent, name, alias.name))
            else:
                homes.append((new_name(target), alias.name, alias.name))
        parents = {h[0] for h in homes}
        line = lines[node.lineno - 1]
        match = re.compile(r"from\s+(\.*[\w.]*)\s+import\b").match(line, node.col_offset)
        if match is None:
            run.todo.append(f"{new_path}:{node.lineno}: an import the script cannot read")
            continue

        def spec(parent: str, level: int = node.level) -> str:
            return relative(new_package, parent) if level else parent

        if len(parents) == 1:
            (parent,) = parents
            if spec(parent) != match.group(1):
                edits.append(Edit(node.lineno - 1, match.start(1), match.end(1), spec(parent)))
            for _, name, old in homes:
                if name != old:
                    span = range(node.lineno - 1, (node.end_lineno or node.lineno))
                    for i in span:
                        for m in re.finditer(rf"\b{re.escape(old)}\b", lines[i]):
                            if i == node.lineno - 1 and m.start() < match.end():
                                continue
                            edits.append(Edit(i, m.start(), m.end(), name))
                    if not any(a.asname for a in node.names if a.name == old):
                        renamed[old] = name
        else:
            indent = line[: len(line) - len(line.lstrip())]
            by_parent: dict[str, list[str]] = {}
            for parent, name, old in homes:
                asname = next(a.asname for a in node.names if a.name == old)
                by_parent.setdefault(parent, []).append(f"{name} as {asname}" if asname else name)
                if name != old and not asname:
                    renamed[old] = name
            text = "".join(
                f"{indent}from {spec(p)} import {', '.join(names)}\n"
                for p, names in by_parent.items()
            )
            split = replace_statement(node, lines, text)
            if split is None:
                run.todo.append(f"{new_path}:{node.lineno}: split this import over its homes")
            else:
                edits += split
    return edits, renamed


def replace_statement(node: ast.stmt, lines: list[str], text: str) -> list[Edit] | None:
    """Edits that put ``text`` in place of the whole statement ``node`` (``None`` if a
    comment inside it would be lost)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    if last > first and any("#" in lines[i] for i in range(first, last + 1)):
        return None
    edits = [Edit(first, 0, len(lines[first]), text)]
    edits += [Edit(i, 0, len(lines[i]), "") for i in range(first + 1, last + 1)]
    return edits


def apply(source: str, edits: list[Edit]) -> str:
    lines = source.splitlines(keepends=True)
    for edit in sorted(edits, key=lambda e: (e.line, e.start), reverse=True):
        line = lines[edit.line]
        lines[edit.line] = line[: edit.start] + edit.text + line[edit.end :]
    return "".join(lines)


def rename_uses(source: str, renamed: dict[str, str]) -> str:
    """``old.attr`` -> ``new.attr`` for each module name bound by an import that changed."""
    for old, new in renamed.items():
        source = re.sub(rf"(?<![\w.]){re.escape(old)}\.", f"{new}.", source)
    return source


LAZY_ROW = re.compile(r'^(\s+"\w+": ")([\w.]+)(",)', re.MULTILINE)


def lazy_tables(source: str, package: str) -> str:
    """A face's ``name -> module`` table, each module where it now lives."""

    def row(m: re.Match[str]) -> str:
        old = package + "." + m.group(2)
        if m.group(2).startswith(".") or new_name(old) == old:
            return m.group(0)
        return m.group(1) + relative(package, new_name(old))[1:] + m.group(3)

    return LAZY_ROW.sub(row, source)


# -- step 2: public paths ------------------------------------------------------------------


def shim(old: str, new: str) -> str:
    here = old.rpartition(".")[0]
    parent, _, name = new.rpartition(".")
    return f'''"""Public path: this module is :mod:`{new}` itself.

Importing ``{old}`` gives that module
(a name patched through either path is patched in both); type checkers see its ``__all__``.
"""

{MARK}
import sys
from typing import TYPE_CHECKING

from {relative(here, parent)} import {name} as _module

if TYPE_CHECKING:
    from {relative(here, new)} import *  # noqa: F403

sys.modules[__name__] = _module
'''


def package_face(old: str, new: str) -> str:
    return f'''"""Public path: the names of :mod:`{new}`.

``{old}`` re-exports them, and each of its public modules has a public
path here too.
"""

{MARK}
from {relative(old, new)} import *  # noqa: F403
'''


def public_paths(run: Run) -> None:
    for old, new in MOVES.items():
        old_full, new_full = f"{PKG}.{old}", f"{PKG}.{new}"
        if not is_public(old_full):
            continue
        new_dir = path_of(new_full, True).parent
        if new_dir.is_dir() and (new_dir / "__init__.py").exists():
            run.write(path_of(old_full, True), package_face(old_full, new_full))
            for sub in sorted(new_dir.glob("*.py")):
                if sub.stem != "__init__" and is_public(f"{new_full}.{sub.stem}"):
                    run.write(
                        path_of(f"{old_full}.{sub.stem}", False),
                        shim(f"{old_full}.{sub.stem}", f"{new_full}.{sub.stem}"),
                    )
        else:
            run.write(path_of(old_full, False), shim(old_full, new_full))


# -- step 4: outside the package -----------------------------------------------------------


def outside_files() -> Iterator[Path]:
    for name in OUTSIDE:
        root = REPO / name
        paths = [root] if root.is_file() else sorted(root.rglob("*")) if root.is_dir() else []
        for path in paths:
            wanted = path.is_file() and path.suffix in TEXT and "__pycache__" not in path.parts
            if wanted and not any(path.is_relative_to(s) for s in SKIP):
                yield path


def outside_rules(moved: dict[str, str]) -> list[tuple[re.Pattern[str], str]]:
    """``moved``: every moved module, old dotted name -> new."""
    rules = []
    for old in sorted(moved, key=len, reverse=True):
        new = moved[old]
        if not is_public(old):
            rules.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
        for suffix in (".py", "/"):
            old_path = old.replace(".", "/") + suffix
            new_path = new.replace(".", "/") + suffix
            rules.append((re.compile(rf"(?<![\w.]){re.escape(old_path)}(?![\w])"), new_path))
    return rules


def module_strings(source: str, moved: dict[str, str]) -> str:
    """A ``sys.modules`` / ``import_module`` string naming a moved module names its home."""

    def line(m: re.Match[str]) -> str:
        text = m.group(0)
        if "sys.modules" not in text and "import_module" not in text:
            return text
        for old, new in moved.items():
            text = re.sub(rf'(["\']){re.escape(old)}\1', rf"\g<1>{new}\g<1>", text)
        return text

    return re.sub(r"^.*$", line, source, flags=re.MULTILINE)


def from_package_imports(source: str, moved: dict[str, str], path: Path, run: Run) -> str:
    """``from langchain_idempotent[.x] import _private_module`` -> from its new parent."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and not node.level and node.module):
            continue
        if not node.module.startswith(PKG):
            continue
        homes = []
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if sub in moved and not is_public(sub):
                parent, _, name = moved[sub].rpartition(".")
                homes.append((parent, name, alias))
            else:
                homes.append((node.module, alias.name, alias))
        if all(parent == node.module for parent, _, _ in homes):
            continue
        line = lines[node.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        by_parent: dict[str, list[str]] = {}
        for parent, name, alias in homes:
            bound = alias.asname or (alias.name if name != alias.name else None)
            by_parent.setdefault(parent, []).append(f"{name} as {bound}" if bound else name)
        text = "".join(f"{indent}from {p} import {', '.join(n)}\n" for p, n in by_parent.items())
        split = replace_statement(node, lines, text)
        if split is None:
            run.todo.append(f"{path}:{node.lineno}: split this import over its homes")
        else:
            edits += split
    return apply(source, edits)


def rewrite_outside(path: Path, moved: dict[str, str], run: Run) -> None:
    source = path.read_text(encoding="utf-8")
    text = source
    if path.suffix == ".py":
        text = from_package_imports(text, moved, path, run)
        text = module_strings(text, moved)
    elif path.suffix == ".ipynb":
        notebook = json.loads(text)
        for cell in notebook.get("cells", []):
            if cell.get("cell_type") == "code":
                code = "".join(cell["source"])
                new = from_package_imports(code, moved, path, run)
                if new != code:
                    cell["source"] = new.splitlines(keepends=True)
        if notebook != json.loads(source):
            text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    for pattern, new in outside_rules(moved):
        text = pattern.sub(new, text)
    run.write(path, text)


# -- the run -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="change nothing")
    parser.add_argument(
        "--commit-moves",
        action="store_true",
        help="commit the git mv's alone first (pure renames, so `git log --follow` and "
        "`git blame` see each module's history); the rest is left for you to commit",
    )
    args = parser.parse_args(argv)
    staged = subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=REPO).returncode
    if args.commit_moves and staged:
        sys.exit("relayout: --commit-moves needs an empty index (commit or unstage first)")
    run = Run(dry=args.dry_run)

    unknown = check_root()
    if unknown:
        sys.exit(
            "relayout: these root modules are in neither MOVES nor STAY of "
            f"scripts/relayout.py: {', '.join(unknown)}; say where each belongs"
        )

    # Read every package file at its current place, with the place it moves to.
    moves = planned_moves()
    before = library_modules()
    after: dict[Path, tuple[str, Path]] = {}  # current path -> (new module, new path)
    for path in before.values():
        new_path = path
        for source, target in moves:
            if path == source or (path.is_relative_to(source) and source.is_dir()):
                new_path = target / path.relative_to(source) if source.is_dir() else target
        after[path] = (module_of(new_path), new_path)
    moved = {m: after[p][0] for m, p in before.items() if after[p][0] != m}
    known = set(before) | {m for m, _ in after.values()}

    sources = {}
    for path, (new_module, new_path) in after.items():
        source = path.read_text(encoding="utf-8")
        if is_shim(path):
            sources[new_path] = source
            continue
        edits, renamed = import_edits(
            source, module_of(path), path, new_module, new_path, known, run
        )
        text = rename_uses(apply(source, edits), renamed)
        for pattern, new in outside_rules(moved):  # docstrings and comments naming them
            text = pattern.sub(new, text)
        if new_path.name == "__init__.py":
            text = lazy_tables(text, new_module)
        sources[new_path] = text

    for source, target in moves:
        run.say(f"git mv {source.relative_to(REPO)} {target.relative_to(REPO)}")
        if not run.dry:
            target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", str(source), str(target)], cwd=REPO, check=True)
    if moves and args.commit_moves and not run.dry:
        message = (
            "relayout: the moves alone (git mv by scripts/relayout.py; its imports, public "
            "paths and renames are the next commit)"
        )
        subprocess.run(["git", "commit", "-q", "-m", message], cwd=REPO, check=True)
    for layer, doc in LAYERS.items():
        init = PKG_DIR / layer / "__init__.py"
        if not init.exists() and (run.dry or (PKG_DIR / layer).is_dir()):
            sources[init] = f'"""{doc}"""\n'
    for path, text in sources.items():
        if run.dry and not path.exists():
            run.changed.add(path)
            continue
        run.write(path, text)

    public_paths(run)

    face = PKG_DIR / "__init__.py"
    text = face.read_text(encoding="utf-8")
    if "Layout (``docs/development.md``" not in text:
        first = text.index('"""') + 3
        end = text.index("\n\n", first) + 2
        run.write(face, text[:end] + FACE_MAP + "\n" + text[end:])

    for path in outside_files():
        rewrite_outside(path, moved, run)

    for rel, pattern, replacement, what in RENAMES:
        path = PKG_DIR / rel
        if not path.exists():
            run.todo.append(f"rename ({what or pattern}): {rel} does not exist")
            continue
        text = path.read_text(encoding="utf-8")
        new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        done = re.search(re.escape(re.sub(r"\\\d", "", replacement.split("(")[0])), text)
        if count:
            run.say(f"rename in {rel}: {what or pattern} ({count}x)")
            run.write(path, new)
        elif not done:
            run.todo.append(f"rename in {rel}: {what or pattern}: its anchor is gone")

    py = sorted(str(p) for p in run.changed if p.suffix == ".py" and p.exists())
    if py and not run.dry:
        subprocess.run(["ruff", "check", "--fix", "--select", "I", "-q", *py], cwd=REPO)
        subprocess.run(["ruff", "format", "-q", *py], cwd=REPO)
    run.say(f"{len(moves)} moves, {len(run.changed)} files written")
    for item in run.todo:
        print("TODO", item)
    return 1 if run.todo else 0


if __name__ == "__main__":
    raise SystemExit(main())
