"""The public face: one export list that `__all__`, the lazy loader, `dir()`, the type
checkers' imports and the README agree on; a cheap `import langchain_idempotent`; an
optional dependency that is missing names the extra that installs it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import langchain_idempotent
import langchain_idempotent.stores

from .support.docs import documentation_text

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "langchain_idempotent"
FACES = {
    langchain_idempotent: ("_EXPORTS", PACKAGE / "__init__.py"),
    langchain_idempotent.stores: ("_STORES", PACKAGE / "stores" / "__init__.py"),
}
# The Postgres store arrives with its own branch; until its module exists it cannot resolve.
HAS_POSTGRES_MODULE = (PACKAGE / "stores" / "postgres" / "__init__.py").exists()


def _resolvable(names: list[str]) -> list[str]:
    return [n for n in names if n != "PostgresIdempotencyStore" or HAS_POSTGRES_MODULE]


def _type_checking_imports(init: Path) -> dict[str, str]:
    """``{public name: module}`` from the ``if TYPE_CHECKING:`` block of a face."""
    found: dict[str, str] = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level >= 1, ast.unparse(stmt)
                for alias in stmt.names:
                    # `import X as X` is what makes a type checker treat X as re-exported.
                    assert alias.asname == alias.name, ast.unparse(stmt)
                    # As the lazy table names it: relative to the face (".x" is a sibling's).
                    found[alias.name] = "." * (stmt.level - 1) + (stmt.module or "")
    return found


@pytest.mark.parametrize("face", list(FACES), ids=lambda m: m.__name__)
def test_all_the_lazy_table_and_the_type_checking_imports_list_the_same_names(face: object) -> None:
    table_name, init = FACES[face]  # type: ignore[index]
    table: dict[str, str] = getattr(face, table_name)
    exported = face.__all__  # type: ignore[attr-defined]
    assert len(exported) == len(set(exported)), "a name is listed twice"
    assert exported == list(table)
    assert _type_checking_imports(init) == table


@pytest.mark.parametrize("face", list(FACES), ids=lambda m: m.__name__)
def test_dir_shows_exactly_the_public_names(face: object) -> None:
    assert dir(face) == sorted(face.__all__)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", _resolvable(langchain_idempotent.__all__))
def test_every_public_name_resolves_to_the_object_its_module_defines(name: str) -> None:
    module = langchain_idempotent._EXPORTS[name]
    value = getattr(langchain_idempotent, name)
    assert value is getattr(importlib.import_module(f"langchain_idempotent.{module}"), name)
    assert vars(langchain_idempotent)[name] is value  # cached: later uses skip the loader


#: What only store authors and operators use: in ``langchain_idempotent.stores``, not the root.
STORE_AUTHORS_ONLY = {"ClaimRequest", "CompleteRequest", "Held", "parse_store_url"}


@pytest.mark.parametrize(
    "name",
    _resolvable([n for n in langchain_idempotent.stores.__all__ if n not in STORE_AUTHORS_ONLY]),
)
def test_every_store_name_resolves_from_the_stores_package_too(name: str) -> None:
    assert getattr(langchain_idempotent.stores, name) is getattr(langchain_idempotent, name)


def test_the_store_authors_names_live_in_the_stores_package_only() -> None:
    for name in STORE_AUTHORS_ONLY:
        assert name in langchain_idempotent.stores.__all__
        assert name not in langchain_idempotent.__all__
        assert getattr(langchain_idempotent.stores, name) is not None


def test_every_error_derives_from_idempotency_error_and_all_but_one_are_on_the_face() -> None:
    from langchain_idempotent import errors

    # SideEffectMisuseError is a programming error few callers catch: it lives in errors.
    assert set(errors.__all__) - set(langchain_idempotent.__all__) == {"SideEffectMisuseError"}
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.IdempotencyError)


def test_the_face_is_at_most_29_names_and_nothing_else_resolves_on_it() -> None:
    # 28 names, and ResultEncryption (records at rest, issue 30): a user passes it in code.
    assert len(langchain_idempotent.__all__) <= 29
    for name in ("Engine", "EventCounter", "IdempotencySettings", "store_from_url"):
        assert not hasattr(langchain_idempotent, name)  # one address: their own module


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(langchain_idempotent, "NoSuchThing")
    assert not hasattr(langchain_idempotent.stores, "NoSuchStore")
    with pytest.raises(ImportError, match="NoSuchThing"):
        exec("from langchain_idempotent import NoSuchThing", {})


# -- the README and the docs site -----------------------------------------------------------

README = documentation_text()
# Modules a documented name may come from when it is not ours: Python, LangChain, LangGraph,
# redis-py and the serializer the results go through.
FOREIGN_MODULES = [
    "decimal",
    "enum",
    "pathlib",
    "builtins",
    "langchain_core.messages",
    "langchain_core.messages.base",
    "langchain_core.tools",
    "langgraph.errors",
    "langgraph.prebuilt",
    "langgraph.graph",
    "langgraph.types",
    "langgraph.checkpoint.memory",
    "langchain.agents.middleware.human_in_the_loop",
    "langgraph.checkpoint.serde.jsonplus",
    "redis",
    "redis.asyncio",
    "redis.cluster",
    "redis.sentinel",
    "psycopg",
    "langgraph.checkpoint.postgres",
    "langchain.agents.middleware",
    # our own public submodules, named in the README by their module
    "langchain_idempotent.testing",
    "langchain_idempotent.integrations.mcp",
    "langchain_idempotent.adapters.keys",  # CallInfo's Scope and KeyFunction (docs/keys.md)
    # langchain-tests' standard tool classes (docs/peer-suites.md)
    "langchain_tests.unit_tests",
    "langchain_tests.integration_tests",
    # the MCP SDK (docs/mcp.md)
    "mcp",
    "mcp.types",
    "mcp.server.fastmcp",  # mcp 1's FastMCP ...
    "mcp.server.mcpserver",  # ... renamed MCPServer in mcp 2: whichever is installed
    "mcp.server.lowlevel",
    "fastmcp",
    "langchain_idempotent.integrations.remote",
    "langgraph.pregel.remote",
    "langchain_idempotent.core.engine",
    "langchain_idempotent.core.events",
    "langchain_idempotent.settings",
    "langchain_idempotent.errors",
    "langchain_idempotent.adapters.approval",
    # LangGraph's node cache and SQLite checkpointer (docs/compared.md)
    "langgraph.cache.base",
    "langgraph.cache.redis",
    "langgraph.checkpoint.sqlite",
    # the store authors' values and OpenTelemetry (docs/development.md, "Importable paths")
    "langchain_idempotent.core.record",
    "langchain_idempotent.integrations.otel",
]


def _readme_imports() -> set[str]:
    names: set[str] = set()
    pattern = r"from langchain_idempotent import (\([^)]*\)|[^\n]*)"
    for group in re.findall(pattern, README):
        names |= {n.strip() for n in group.strip("()").split(",") if n.strip()}
    return names


def _readme_backticked_names() -> set[str]:
    """CamelCase names in backticks (``Name``, ``Name(...)``, ``Name.attr``) and calls of
    functions named after idempotency (``idempotent(...)``, ``get_idempotency_context()``)."""
    camel = re.findall(r"`([A-Z][a-z]+[A-Za-z0-9]*)[`(.]", README)
    calls = re.findall(r"`([a-z_]*idempot[a-z_]*)\(", README)
    return (set(camel) | set(calls)) - _example_names()


#: Classes the documentation's prose uses as examples of a tool's results (docs/results.md,
#: docs/peer-suites.md), and the store authors' names of ``langchain_idempotent.stores``.
EXAMPLE_NAMES = {"Bar", "Document", "Label", "Point", "Refund", "ClaimRequest"}
#: A peer test's own context class (docs/peer-suites.md), and mcp 2's answer to a call that
#: asks for input (docs/mcp.md: absent from the mcp 1 set this environment may hold).
EXAMPLE_NAMES |= {"CustomContext", "InputRequiredResult"}
#: langchain-mcp-adapters' client (docs/mcp.md): absent from the mcp 2 set of the drift job.
EXAMPLE_NAMES |= {"MultiServerMCPClient"}
#: Other projects' names on docs/compared.md whose packages are not installed here
#: (Powertools for AWS Lambda, CTRLRun).
EXAMPLE_NAMES |= {"IdempotencyAlreadyInProgressError", "IdempotencyConfig", "NotExecuted"}


def _example_names() -> set[str]:
    """Classes the documentation's own examples define (``class Refund(BaseModel): ...``)."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    defined = {name for block in blocks for name in re.findall(r"^\s*class (\w+)", block, re.M)}
    return defined | EXAMPLE_NAMES


def _foreign(name: str) -> bool:
    return any(hasattr(_module(m), name) for m in FOREIGN_MODULES)


def _module(name: str) -> object:
    """The module, or ``None`` where the installed set lacks it (mcp 1 vs mcp 2)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None


def test_the_readme_imports_only_public_names() -> None:
    imported = _readme_imports()
    assert imported, "the README shows no `from langchain_idempotent import ...` line"
    assert imported <= set(langchain_idempotent.__all__)


def test_every_name_the_readme_puts_in_backticks_is_public_or_not_ours() -> None:
    names = _readme_backticked_names()
    assert {"IdempotencyError", "idempotent"} <= names  # the parser finds what is there
    unknown = {n for n in names if n not in langchain_idempotent.__all__ and not _foreign(n)}
    assert not unknown, f"the README names {sorted(unknown)}, which langchain_idempotent lacks"


# -- import cost and optional dependencies (fresh interpreters) ----------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


HEAVY = ["langgraph", "langchain", "langchain_core", "redis", "pydantic_settings", "psycopg"]


@pytest.mark.parametrize(
    "statement",
    [
        "import langchain_idempotent",
        "from langchain_idempotent import IdempotencyError, MissingScopeError",
        "from langchain_idempotent.core.policy import Policy",  # the approval setting is in it
    ],
)
def test_importing_the_package_loads_no_heavy_dependency(statement: str) -> None:
    proc = _python(
        f"""
        import sys
        {statement}
        heavy = {HEAVY!r}
        print(sorted(m for m in sys.modules if m.split(".")[0] in heavy))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# What the engine may load of LangGraph: only its msgpack serde (``langgraph-checkpoint``).
LANGCHAIN_PROBE = """
import sys
loaded = sorted(
    m for m in sys.modules
    if m.split(".")[0] in ("langchain_core", "langchain")
    or (m.startswith("langgraph.") and m.split(".")[:3] != ["langgraph", "checkpoint", "serde"]
        and m != "langgraph.checkpoint")
)
print(loaded)
"""


@pytest.mark.parametrize(
    "module",
    [
        f"langchain_idempotent.{name}"
        for name in ("core.engine", "core.serde", "integrations.mcp.server")
    ],
)
def test_the_engine_and_the_mcp_server_load_no_langchain(module: str) -> None:
    if module.endswith(".mcp.server"):
        pytest.importorskip("mcp")
    proc = _python(f"import {module}\n{LANGCHAIN_PROBE}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"{module} loads LangChain: {proc.stdout}"


def test_an_engine_runs_and_replays_a_call_without_loading_langchain() -> None:
    run_twice = textwrap.dedent(
        """
        from langchain_idempotent.core.engine import Engine
        from langchain_idempotent.stores.memory import InMemoryIdempotencyStore

        engine = Engine(InMemoryIdempotencyStore())
        runs = []

        def action():
            runs.append(1)
            return {"ok": [1, "a"]}

        answers = [engine.run("k", fingerprint="f", action=action) for _ in range(2)]
        assert answers == [{"ok": [1, "a"]}] * 2 and runs == [1], (answers, runs)
        """
    )
    proc = _python(run_twice + LANGCHAIN_PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_store_base_and_the_embedded_stores_do_not_import_redis() -> None:
    proc = _python(
        """
        import sys
        from langchain_idempotent.core.store import BaseIdempotencyStore
        from langchain_idempotent import InMemoryIdempotencyStore, SqliteIdempotencyStore
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("redis", "psycopg")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


BLOCK_IMPORTS = """
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
import langchain_idempotent
try:
    getattr(langchain_idempotent, {name!r})
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize(
    ("name", "blocked", "extra"),
    [
        ("IdempotencyMiddleware", ["langchain"], "agents"),
        pytest.param(
            "PostgresIdempotencyStore",
            ["psycopg", "psycopg_pool"],
            "postgres",
            marks=pytest.mark.skipif(not HAS_POSTGRES_MODULE, reason="stores/postgres/"),
        ),
    ],
)
def test_a_missing_optional_dependency_names_the_extra_that_installs_it(
    name: str, blocked: list[str], extra: str
) -> None:
    proc = _python(BLOCK_IMPORTS.format(blocked=set(blocked), name=name))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ImportError"), proc.stdout
    assert f"[{extra}]" in proc.stdout
