"""Griffe extension: render the docstrings' Sphinx roles as mkdocs-autorefs cross-references.

The docstrings are written for Sphinx (``:class:`~sqlalchemy.Engine```, ``:func:`.follow```, ...), and
mkdocstrings-python does not know Sphinx roles: without this extension they print raw (``:class:`` followed by
code). mkdocstrings loads it through the ``extensions:`` option in mkdocs.yml. When the package is loaded, every
docstring in it is rewritten before it is parsed:

- ``:role:`target``` becomes an *optional* autorefs reference to ``target``: a link when the API reference renders
  that object somewhere, plain code otherwise (an unknown target, such as ``sqlalchemy.Engine`` or a builtin, is
  never raw role text and never a strict-mode warning);
- ``~`` shows only the last component, a leading ``.`` is dropped from the text, ``!`` suppresses the link, and
  ``:role:`title <target>``` shows ``title``, as in Sphinx; ``:func:`` and ``:meth:`` add ``()``;
- a relative name is resolved like Sphinx does, in the documented object's class, then its module, then each
  enclosing package (``:mod:`.rules``` in ``hostedrooms.rooms`` is ``hostedrooms.rooms.rules``); names a module
  imported are followed to where they are defined, so the link finds the page that renders them.

Fenced code blocks and double-backtick literals are left alone, so a docstring can still show a role as code.
``tests/packaging/test_api_docs.py`` builds the site and fails on any raw role in the HTML.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE_RE = re.compile(r":(?:py:)?(?P<role>func|class|meth|mod|data|attr|exc|obj|const|type|any):`(?P<body>[^`]+)`(?!`)")
LITERAL_RE = re.compile(r"``.+?``", re.DOTALL)
FENCE_RE = re.compile(r"^\s*(```|~~~)")
EXPLICIT_RE = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
CALLABLE_ROLES = {"func", "meth"}


def _lookup(collection: griffe.ModulesCollection, path: str) -> str | None:
    """The canonical path of ``path`` if the loaded modules know it (aliases followed as far as they resolve)."""
    try:
        found = collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if isinstance(found, griffe.Alias):
        try:
            return str(found.final_target.path)
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return str(found.target_path)
    return str(found.path)


def _scopes(obj: griffe.Object | griffe.Alias) -> list[str]:
    """Where a relative name is looked up, innermost first: the enclosing class, the module, its packages."""
    scopes: list[str] = []
    current: Any = obj
    while current is not None:
        if current.is_class or current.is_module:
            scopes.append(current.path)
        current = current.parent
    return scopes


def resolve(target: str, obj: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """The identifier an autorefs reference to ``target``, written in ``obj``'s docstring, should use."""
    name = target.lstrip(".")
    if not target.startswith("."):
        absolute = _lookup(collection, name)
        if absolute is not None:
            return absolute
    for scope in _scopes(obj):
        found = _lookup(collection, f"{scope}.{name}")
        if found is not None:
            return found
    return name


def _text(role: str, body: str) -> tuple[str, str, bool]:
    """``(title, target, link)`` for one role body, with Sphinx's display rules."""
    link = not body.startswith("!")
    body = body.lstrip("!")
    explicit = EXPLICIT_RE.match(body)
    if explicit is not None and explicit["title"]:
        return explicit["title"], explicit["target"].strip().lstrip("~"), link
    target = body.strip()
    title = target.lstrip("~").lstrip(".")
    if target.startswith("~"):
        target = target[1:]
        title = title.rsplit(".", 1)[-1]
    if role in CALLABLE_ROLES and not title.endswith(")"):
        title += "()"
    return title, target, link


def convert_roles(text: str, obj: griffe.Object, collection: griffe.ModulesCollection) -> str:
    """``text`` with every Sphinx role outside code turned into an optional autorefs reference."""

    def replace(match: re.Match[str]) -> str:
        title, target, link = _text(match["role"], match["body"])
        code = f"<code>{html.escape(title)}</code>"
        if not link:
            return code
        identifier = html.escape(resolve(target, obj, collection), quote=True)
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    def outside_literals(chunk: str) -> str:
        pieces: list[str] = []
        last = 0
        for literal in LITERAL_RE.finditer(chunk):
            pieces.append(ROLE_RE.sub(replace, chunk[last : literal.start()]))
            pieces.append(literal.group())
            last = literal.end()
        pieces.append(ROLE_RE.sub(replace, chunk[last:]))
        return "".join(pieces)

    # Prose chunks are converted whole (a role may wrap onto the next line); fenced blocks stay as written.
    out: list[str] = []
    prose: list[str] = []
    in_fence = False
    for line in text.split("\n"):
        if FENCE_RE.match(line):
            if not in_fence and prose:
                out.append(outside_literals("\n".join(prose)))
                prose = []
            in_fence = not in_fence
            out.append(line)
        elif in_fence:
            out.append(line)
        else:
            prose.append(line)
    if prose:
        out.append(outside_literals("\n".join(prose)))
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite the Sphinx roles of every docstring in a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrite the docstrings of ``pkg`` and everything it defines, once the package is loaded."""
        collection = loader.modules_collection
        pending: list[griffe.Object] = [pkg]
        while pending:
            obj = pending.pop()
            if obj.docstring is not None:
                obj.docstring.value = convert_roles(obj.docstring.value, obj, collection)
            pending.extend(member for member in obj.members.values() if not member.is_alias)  # type: ignore[misc]

    def on_package_loaded(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """The same, under the name earlier griffe releases gave this event (a second pass finds no role left)."""
        self.on_package(pkg=pkg, loader=loader, **kwargs)
