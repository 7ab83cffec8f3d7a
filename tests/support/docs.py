"""The user documentation as text: the README and the pages of the docs site (``docs/``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: A fenced ``python`` block right after this comment is executed by ``tests/test_docs.py``.
RUN_MARK = "<!-- run -->"


def pages() -> list[Path]:
    """Every Markdown page of the site, in a stable order."""
    return sorted(DOCS.rglob("*.md"))


def documentation_text() -> str:
    """The README and every docs page, joined: what a user reads."""
    return "\n".join([(ROOT / "README.md").read_text(), *(p.read_text() for p in pages())])


def section(page: str, title: str) -> str:
    """The body of the ``## title`` section of ``docs/page`` (to the next ``##`` heading)."""
    text = (DOCS / page).read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/{page} has no section {title!r}"
    return match.group(1)


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def runnable_snippets() -> list[Snippet]:
    """Every fenced ``python`` block marked ``<!-- run -->`` on the line before it."""
    found: list[Snippet] = []
    fence = re.compile(rf"^{re.escape(RUN_MARK)}\n```python\n(.*?)^```", re.S | re.M)
    for page in pages():
        text = page.read_text()
        for match in fence.finditer(text):
            found.append(Snippet(page, text.count("\n", 0, match.start()) + 2, match.group(1)))
    return found
