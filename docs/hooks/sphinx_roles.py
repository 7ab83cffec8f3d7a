"""Griffe extension: the package's Sphinx roles become cross-references in the API reference.

The docstrings are written for Sphinx (``:class:`~.Policy```, ``:meth:`.claim```,
``:mod:`langchain_idempotent.core.store```); mkdocstrings renders docstrings as Markdown, where
those roles would show raw. Once the package is loaded, each role in each docstring is
rewritten the way Sphinx would resolve it — ``~`` keeps the last part as the title, a leading
``.`` searches by suffix, a bare name is looked up from the docstring's own scope outwards —
into an *optional* autoref: a link where the target is rendered on the site, plain code where
it is not (a private helper, ``TypeError``), never a warning. The docstrings themselves stay
Sphinx-shaped.

Loaded by mkdocs.yml (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import html
import re
from typing import Any

from griffe import Alias, Extension, GriffeLoader, Module, Object

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
# reST's literal-block marker: "next::" shows as "next:", "next ::" and a lone "::" as nothing
LITERAL = re.compile(r"(?m)^(?P<text>.*?)(?P<space>[ \t]*)::[ \t]*$")
EXPLICIT = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")
CALLABLE = {"func", "meth"}


def _walk(obj: Object, paths: dict[str, str]) -> None:
    """Every path of the package, mapped to the path of what it names (an alias to its
    target; an object to itself)."""
    for member in obj.members.values():
        if isinstance(member, Alias):
            paths.setdefault(member.path, member.target_path)
            continue
        paths[member.path] = member.path
        _walk(member, paths)


def _literal(match: re.Match[str]) -> str:
    text = match.group("text")
    return text + ":" if text.strip() and not match.group("space") else text


def _shared(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class SphinxRoles(Extension):
    """Rewrite ``:role:`target``` in every docstring of a loaded package."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        paths = {pkg.path: pkg.path}
        _walk(pkg, paths)
        self._paths = paths
        self._rewrite(pkg)

    def _rewrite(self, obj: Object) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(lambda m: self._replace(m, obj), obj.docstring.value)
            obj.docstring.value = LITERAL.sub(_literal, text)
        for member in obj.members.values():
            if not isinstance(member, Alias):
                self._rewrite(member)

    def _replace(self, match: re.Match[str], scope: Object) -> str:
        role, body = match.group(1), match.group("body").strip()
        explicit = EXPLICIT.match(body)
        if explicit:
            title, target = explicit.group("title"), explicit.group("target").lstrip("~!")
        else:
            target = body.lstrip("~!")
            title = target.lstrip(".")
            if body.startswith("~"):
                title = title.rsplit(".", 1)[-1]
            if role in CALLABLE and not title.endswith(")"):
                title += "()"
        identifier = self._resolve(target, scope)
        code = f"<code>{html.escape(title)}</code>"
        if identifier is None:
            return code
        return f'<autoref identifier="{html.escape(identifier)}" optional>{code}</autoref>'

    def _resolve(self, target: str, scope: Object) -> str | None:
        """What Sphinx would link ``target`` to, as a path in this package (``None`` when it
        names nothing here: a builtin, another library, a typo)."""
        paths = self._paths
        name = target.lstrip(".")
        if not target.startswith(".") and name in paths:
            return self._final(name)
        # from the docstring's own object outwards: a method, its class, its module, …
        place: Object | None = scope
        while place is not None:
            candidate = f"{place.path}.{name}"
            if candidate in paths:
                return self._final(candidate)
            place = place.parent
        # a leading dot (or a name found nowhere above): a path ending with it, the nearest
        # to the docstring's own module first
        ends = [p for p in paths if p.endswith(f".{name}")]
        if not ends:
            return None
        here = scope.path.split(".")
        return self._final(min(ends, key=lambda p: (-_shared(p.split("."), here), len(p), p)))

    def _final(self, path: str) -> str:
        """Follow aliases (``langchain_idempotent.Policy`` → ``core.policy.Policy``) to the
        path the reference renders, stopping outside the package."""
        seen = set()
        while path in self._paths and self._paths[path] != path and path not in seen:
            seen.add(path)
            path = self._paths[path]
        return path
