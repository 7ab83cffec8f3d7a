"""The package as an index shows it: real classifiers, the project URLs, a README whose links
work off GitHub, a version read from the metadata, extras that install what they promise.
The built artefacts themselves (wheel and sdist contents, ``twine check``, the quickstart
from a clean venv) are checked by ``.ci/package``."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest
import trove_classifiers
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SITE = "https://langchain-idempotent.github.io/langchain-idempotent/"
SOURCE = "https://github.com/langchain-idempotent/langchain-idempotent"


def test_every_classifier_is_a_real_trove_classifier() -> None:
    unknown = [c for c in PROJECT["classifiers"] if c not in trove_classifiers.classifiers]
    assert not unknown, f"not trove classifiers: {unknown}"
    kinds = {c.split(" :: ")[0] for c in PROJECT["classifiers"]}
    assert {"Development Status", "Framework", "Operating System", "Typing"} <= kinds


def test_the_license_is_the_mit_text_the_metadata_names() -> None:
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_the_project_urls_name_the_docs_site_changelog_issues_and_source() -> None:
    urls = PROJECT["urls"]
    assert urls["Documentation"] == SITE
    assert urls["Source"] == SOURCE
    assert urls["Issues"] == f"{SOURCE}/issues"
    assert urls["Changelog"] == f"{SOURCE}/blob/main/CHANGELOG.md"


def test_the_changelog_has_a_dated_section_for_this_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\] - (\d{4}-\d{2}-\d{2})$", _text("CHANGELOG.md"), re.M)
    assert (PROJECT["version"], "2026-12-06") in headings


def _text(name: str) -> str:
    return (ROOT / name).read_text()


def test_every_readme_link_is_absolute_and_names_a_page_or_file_that_exists() -> None:
    """A package index shows the README without the repository around it: a relative link
    there is a dead link. Docs pages link to the site, other files to GitHub, and each one
    names something that exists in this checkout."""
    links = re.findall(r"\]\(([^)\s]+)\)", _text("README.md"))
    assert len(links) >= 20
    relative = [link for link in links if not re.match(r"https?://|#", link)]
    assert not relative, f"relative links in the README: {relative}"
    for link in links:
        path = link.partition("#")[0]
        if path.startswith(SITE):
            page = path.removeprefix(SITE).rstrip("/")
            candidates = [f"docs/{page}.md", f"docs/{page}/index.md"] if page else ["docs/index.md"]
            assert any((ROOT / c).is_file() for c in candidates), f"no page for {link}"
        elif path.startswith(f"{SOURCE}/blob/main/"):
            assert (ROOT / path.removeprefix(f"{SOURCE}/blob/main/")).exists(), link


def _requirements(extra: str | None) -> set[str]:
    """The distributions ``pip install 'langchain-idempotent[extra]'`` names directly, the
    package's own extras followed (``None``: the core dependencies)."""
    lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    names: set[str] = set()
    for line in lines:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "langchain-idempotent":
            for inner in requirement.extras:
                names |= _requirements(inner)
        else:
            names.add(canonicalize_name(requirement.name))
    return names


def _notebook_imports() -> dict[str, set[str]]:
    """Top-level modules each notebook (and its helper modules) imports."""
    found: dict[str, set[str]] = {}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        found[notebook.name] = _imports(code)
    for helper in sorted((ROOT / "notebooks").glob("*.py")):
        found[helper.name] = _imports(helper.read_text())
    return found


def _imports(code: str) -> set[str]:
    modules: set[str] = set()
    # Notebook cells may hold IPython magics: parse the Python lines only.
    python = [line for line in code.splitlines() if not line.startswith(("%", "!"))]
    tree = ast.parse("\n".join(python))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


#: Modules of this repository the notebooks import from a checkout (they run from one).
LOCAL = {"langchain_idempotent", "graphs", "tests", "_support", "_timeline", "__future__"}


def test_the_notebooks_extra_installs_every_module_the_notebooks_import() -> None:
    installs = _requirements("notebooks") | _requirements(None)
    owners = packages_distributions()
    missing: dict[str, str] = {}
    for notebook, modules in _notebook_imports().items():
        for module in modules - LOCAL - set(sys.stdlib_module_names):
            dists = {canonicalize_name(d) for d in owners.get(module, [module])}
            if not dists & installs:
                missing[f"{notebook}: {module}"] = ", ".join(sorted(dists))
    assert not missing, f"imported by a notebook, not named by the notebooks extra: {missing}"
    assert "psycopg" in installs  # notebook 05's, the one the extra lacked


def test_version_is_the_installed_metadata_and_importing_the_package_does_not_read_it() -> None:
    probe = (
        "import sys, langchain_idempotent as p\n"
        "print('importlib.metadata' in sys.modules)\n"
        "print(p.__version__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded_on_import, said = done.stdout.split()
    assert loaded_on_import == "False"
    assert said == version("langchain-idempotent") == PROJECT["version"]


def test_the_cli_prints_its_version_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "langchain_idempotent", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"langchain-idempotent {PROJECT['version']}\n"


@pytest.mark.parametrize("extra", ["notebooks", "dev"])
def test_an_extra_names_only_extras_that_exist(extra: str) -> None:
    for line in PROJECT["optional-dependencies"][extra]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "langchain-idempotent":
            assert requirement.extras <= set(PROJECT["optional-dependencies"]), line
