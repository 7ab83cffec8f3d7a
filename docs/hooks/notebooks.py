"""The notebooks in the docs site, with their outputs (the worker timeline, the bar charts).

As an MkDocs hook (mkdocs.yml ``hooks:``), it adds ``notebooks/*.ipynb`` — outside
``docs/`` — to the site's files as ``notebooks/NAME.ipynb``, before mkdocs-jupyter renders
them (``execute: false``: the site shows the committed outputs and runs nothing).

``python docs/hooks/notebooks.py [NAME.ipynb ...]`` executes each notebook in ``notebooks/``
(all of them by default) in place, in its own folder, and stamps its metadata with a hash of
its code cells (``code_sha256``). ``tests/test_docs.py`` checks that every committed
notebook carries the outputs of its current code: edit a code cell, re-run this.

CI still executes every notebook afresh (``pytest --nbmake notebooks`` in ``.ci/run``): the
committed outputs are what the site shows, not what proves the notebooks run.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
STAMP = "langchain_idempotent"


def _on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        # src_dir is the repository, so the file's path there is its path on the site
        files.append(
            File(
                f"notebooks/{path.name}",
                src_dir=str(NOTEBOOKS.parent),
                dest_dir=config.site_dir,
                use_directory_urls=config.use_directory_urls,
            )
        )
    return files


# What nbconvert's page template would fetch from a CDN: MathJax (an empty src here, which
# would load the page itself as a script) and, for notebooks with Mermaid outputs (none of
# ours), mermaid from cdnjs. The site loads nothing from another host, so both go.
_REMOTE = re.compile(
    r'<script src=""> </script>'
    r'|<script type="module">(?:(?!</script>).)*?https://cdnjs\.cloudflare\.com.*?</script>',
    re.S,
)


def on_post_page(output: str, page: Any, config: Any) -> str:
    if not page.file.src_uri.startswith("notebooks/"):
        return output
    return _REMOTE.sub("", output)


try:  # as a hook: before mkdocs-jupyter's own on_files turns the notebooks into pages
    from mkdocs.plugins import event_priority

    on_files = event_priority(100)(_on_files)
except ImportError:  # run as a script without mkdocs installed
    pass


def code_sha256(notebook: Any) -> str:
    """The hash of a notebook's code cells, in order (markdown edits need no re-run)."""
    digest = hashlib.sha256()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
            digest.update(source.encode() + b"\0")
    return digest.hexdigest()


def execute(path: Path, timeout: int = 900) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    notebook.metadata[STAMP] = {"code_sha256": code_sha256(notebook)}
    nbformat.write(notebook, path)


def main(names: list[str]) -> None:
    paths = [NOTEBOOKS / n for n in names] if names else sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        execute(path)


if __name__ == "__main__":
    main(sys.argv[1:])
