"""MkDocs hook: Mermaid is served with the site, never fetched from a CDN.

Material for MkDocs renders a ``mermaid`` fence with the global ``mermaid`` object and loads
it from unpkg.com only when that global is undefined. This hook puts the copy shipped in
``docs/assets/javascripts/mermaid.min.js`` (the ``mermaid`` npm package's
``dist/mermaid.min.js``, version below; licence beside it) on every page that has a
diagram, before Material's own script, so a page renders its diagrams offline and no page
loads anything from another host.

To move to another release: ``npm pack mermaid@VERSION``, copy ``package/dist/mermaid.min.js``
over the file and set ``MERMAID_VERSION`` (Material expects mermaid 11).

Loaded by mkdocs.yml (``hooks:``).
"""

from __future__ import annotations

from typing import Any

from mkdocs.utils import get_relative_url

MERMAID_VERSION = "11.17.2"
SCRIPT = "assets/javascripts/mermaid.min.js"
DIAGRAM = 'class="mermaid"'
BUNDLE = '<script src="'  # Material's first script tag at the end of the body


def on_post_page(output: str, page: Any, config: Any, **kwargs: Any) -> str:
    if DIAGRAM not in output:
        return output
    src = get_relative_url(SCRIPT, page.url)
    tag = f'<script src="{src}" data-mermaid-version="{MERMAID_VERSION}"></script>\n'
    at = output.find(BUNDLE, output.find("</article>"))
    if at < 0:
        raise ValueError(f"{page.file.src_uri}: no script tag to load mermaid before")
    return output[:at] + tag + output[at:]
