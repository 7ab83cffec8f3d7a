"""The documentation site tells the truth: it builds without a warning, every snippet marked
runnable runs as printed, and its tables of options, variables and events are the library's
own."""

from __future__ import annotations

import importlib.util
import json
import os
import pydoc
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from langchain_idempotent.core.events import EVENT_KINDS
from langchain_idempotent.core.policy import env_fields, option_names

from .support import forked
from .support.docs import DOCS, ROOT, Snippet, pages, runnable_snippets, section

SNIPPETS = runnable_snippets()


def test_the_site_has_runnable_snippets() -> None:
    assert len(SNIPPETS) >= 3, [s.name for s in SNIPPETS]


def test_a_snippet_runs_in_a_process_of_its_own_that_reports_its_failure(tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(
        "import os, sys\nprint(__name__, sys.argv[0] == __file__, os.getcwd())\n"
        "raise ValueError('as printed')\n"
    )
    done = forked.run_script(script, timeout=60)
    assert done.returncode == 1 and "ValueError: as printed" in done.stderr
    assert done.stdout.split() == ["__main__", "True", str(tmp_path)]
    script.write_text("import sys\nsys.exit(3)\n")
    assert forked.run_script(script, timeout=60).returncode == 3


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.name)
def test_every_runnable_snippet_runs_as_printed(snippet: Snippet, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    done = forked.run_script(script, timeout=120)
    assert done.returncode == 0, f"{snippet.name}:\n{done.stderr}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in pages() if str(p.relative_to(DOCS)) not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_the_configuration_table_names_every_option_and_variable() -> None:
    table = (DOCS / "configuration.md").read_text()
    for name in option_names():
        assert f"`{name}`" in table, name
    for name in env_fields():
        assert f"`IDEMPOTENCY_{name.upper()}`" in table, name


def test_the_operations_page_lists_every_event_kind() -> None:
    listed = set(re.findall(r"`(\w+)`", section("operations.md", "Observability").split("—")[1]))
    assert set(EVENT_KINDS) <= listed, sorted(set(EVENT_KINDS) - listed)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (a warning fails the build)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_in_strict_mode(site: Path) -> None:
    assert (site / "concepts" / "index.html").exists()


def test_the_api_reference_shows_no_sphinx_role_and_links_the_ones_it_renders(site: Path) -> None:
    """The docstrings' ``:class:`~.Policy``` roles become links (or plain code), and every
    heading is the real module path."""
    page = (site / "reference" / "index.html").read_text()
    raw = re.findall(r":(?:class|func|meth|mod|attr|data|exc|obj):", page)
    assert not raw, f"raw Sphinx roles in the API reference: {len(raw)}"
    assert 'href="#langchain_idempotent.core.policy.Policy"' in page
    headings = re.findall(r'<h2 id="(langchain_idempotent[.\w]*)"', page)
    assert len(headings) >= 20, headings
    for path in headings:
        obj = pydoc.locate(path)
        assert obj is not None, f"{path}: nothing there"
        if isinstance(obj, types.ModuleType):
            continue
        shown = path.removesuffix(f".{obj.__qualname__}")
        # the deepest public module of its definition: stores.sqlite for stores/sqlite/_store.py
        parts = obj.__module__.split(".")
        home = ".".join(parts[: next((i for i, p in enumerate(parts) if p.startswith("_")), None)])
        assert shown == home, f"{path} is shown under {shown}, defined in {obj.__module__}"


def _html(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): p.read_text() for p in site.rglob("*.html")}


def test_no_page_loads_anything_from_another_host(site: Path) -> None:
    """Scripts, stylesheets, fonts and images come with the site (no CDN): it reads the same
    offline."""
    remote = re.compile(
        r'<(?:script|img)[^>]*\bsrc="(?:https?:)?//[^"]*"'
        r'|<link[^>]*\brel="(?:stylesheet|preconnect|preload|modulepreload)"[^>]*\bhref="(?:https?:)?//'
    )
    found = {page: remote.findall(text) for page, text in _html(site).items()}
    assert not {p: f for p, f in found.items() if f}


def test_every_page_with_a_diagram_loads_the_mermaid_served_with_the_site(site: Path) -> None:
    pages = {p: t for p, t in _html(site).items() if 'class="mermaid"' in t}
    assert "concepts/index.html" in pages
    for page, text in pages.items():
        local = re.search(r'<script src="([^"]*assets/javascripts/mermaid\.min\.js)"', text)
        assert local, f"{page} has a diagram and no local mermaid"
        assert text.index(local.group(0)) < text.index("assets/javascripts/bundle."), page
        assert (site / page).parent.joinpath(local.group(1)).resolve().is_file(), page


def _notebook_hook() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("notebooks_hook", DOCS / "hooks" / "notebooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_is_committed_with_the_outputs_of_its_current_code(path: Path) -> None:
    """The site shows the committed outputs, so they must be the current code's: every code
    cell ran, in order, without an error, and the stamp is the hash of the code as it is."""
    hook = _notebook_hook()
    notebook = json.loads(path.read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    stamp = notebook["metadata"].get(hook.STAMP, {}).get("code_sha256")
    rerun = f"re-run `python docs/hooks/notebooks.py {path.name}` and commit it"
    assert stamp == hook.code_sha256(
        types.SimpleNamespace(
            cells=[
                types.SimpleNamespace(cell_type=c["cell_type"], source=c["source"]) for c in code
            ]
        )
    ), f"{path.name}: its outputs are not from its current code; {rerun}"
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), rerun
    errors = [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"{path.name} was committed with an error output"


def test_the_site_shows_each_notebook_with_its_plots(site: Path) -> None:
    for path in NOTEBOOKS:
        page = (site / "notebooks" / path.stem / "index.html").read_text()
        notebook = json.loads(path.read_text())
        plots = sum(
            "image/png" in o.get("data", {})
            for c in notebook["cells"]
            for o in c.get("outputs", [])
        )
        assert page.count('src="data:image/png') >= plots, path.name
    timeline = (site / "notebooks" / "03_leases_and_workers" / "index.html").read_text()
    assert 'src="data:image/png' in timeline  # the worker timeline


def test_every_claim_on_the_compared_with_page_names_its_source() -> None:
    """Each point about another tool links to where it is documented, coded or measured;
    only the "Together." / "Choosing." advice stands on this library's own pages."""
    text = (DOCS / "compared.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    unsourced = []
    for body in sections:
        title = body.splitlines()[0]
        if title in ("At a glance", "When not to wrap"):
            continue
        for point in re.split(r"^- ", body, flags=re.M)[1:]:
            if not point.startswith(("**Together.**", "**Choosing.**")) and not re.search(
                r"\]\(|\]\[", point
            ):
                unsourced.append(f"{title}: {point[:60]}")
    assert len(sections) >= 10
    assert not unsourced, unsourced


@pytest.mark.parametrize("page", ["multi-agent.md", "mcp.md"])
def test_every_python_block_runs_or_first_says_what_it_needs(page: str) -> None:
    """A snippet a newcomer pastes either runs as printed (``<!-- run -->``, executed above)
    or opens with a comment naming what it needs from elsewhere."""
    text = (DOCS / page).read_text()
    fragments = [
        text.count("\n", 0, m.start()) + 1
        for m in re.finditer(r"^(?P<mark>.*)\n```python\n(?P<first>.*)$", text, re.M)
        if m.group("mark") != "<!-- run -->" and not m.group("first").startswith("# ")
    ]
    assert fragments == [], f"docs/{page}: python blocks neither run nor say what they need"


def test_the_module_map_names_every_module_of_the_package() -> None:
    """docs/development.md's map stays the layout: every root module and every cli/ and
    stores/ module by name, every other subpackage by its folder."""
    text = section("development.md", "Module map")
    package = ROOT / "langchain_idempotent"
    missing = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if len(parts) == 1:
            wanted = parts[0]
        elif parts[0] in ("cli", "stores") and len(parts) == 2:
            wanted = "/".join(parts)
        else:
            wanted = "/".join(parts[:-1]) + "/"
        if f"`{wanted}`" not in text and f"`{wanted}" not in text:
            missing.append(wanted)
    assert not missing, f"docs/development.md's module map leaves out {sorted(set(missing))}"


def _importable_paths() -> list[tuple[str, list[str]]]:
    """docs/development.md's table of importable paths: (module or command, names listed)."""
    rows = []
    for line in section("development.md", "Importable paths").splitlines():
        cells = line.split("|")
        if len(cells) == 5 and cells[1].strip().startswith("`langchain"):
            rows.append((re.findall(r"`([^`]+)`", cells[1])[0], re.findall(r"`(\w+)`", cells[3])))
    return rows


def test_the_importable_paths_are_the_package_face_and_modules_that_import() -> None:
    """Every path the development page lists imports, and has every name it lists; the
    face's row is exactly ``langchain_idempotent.__all__``."""
    import importlib

    import langchain_idempotent

    rows = dict(_importable_paths())
    assert set(rows["langchain_idempotent"]) == set(langchain_idempotent.__all__)
    for path, names in rows.items():
        if path == "langchain-idempotent":
            continue
        module = importlib.import_module(path)
        missing = [n for n in names if not hasattr(module, n)]
        assert not missing, f"{path} has no {missing}"


def test_the_importable_paths_name_every_cli_command() -> None:
    commands = dict(_importable_paths())["langchain-idempotent"]
    done = subprocess.run(
        [sys.executable, "-m", "langchain_idempotent", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert commands and all(c in done.stdout for c in commands), (commands, done.stdout)
