"""hostedrooms uses SQLAlchemy's and Alembic's public API only (issue #37): a private name breaks the tools hosts
plug into SQLAlchemy (instrumentations, proxies, other versions).

The package's source is read with ``ast`` (nothing is imported from it) and these are refused:

* an import of a private module of SQLAlchemy or Alembic (any dotted part starting with ``_``, or their internal
  ``util`` and ``testing`` packages; ``alembic.util.exc`` is documented) or of a private name from any of their
  modules;
* an attribute whose name is private to SQLAlchemy or Alembic (a single-underscore name that one of their classes
  or modules defines and hostedrooms never defines itself), read, assigned or named to ``getattr``/``setattr``/
  ``hasattr``; names in :data:`KNOWN_PRIVATE` are refused even if hostedrooms has one of the same spelling;
* a private method of theirs defined in a subclass of one of their classes.

:data:`ALLOWED` lists the one use left, with the reason at its site (``engine_profile._quiet_rows``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hostedrooms"

#: Each library's private names are read from the classes and module globals of these modules.
LIBRARY_MODULES = (
    "sqlalchemy", "sqlalchemy.engine.base", "sqlalchemy.engine.default", "sqlalchemy.engine.cursor",
    "sqlalchemy.engine.result", "sqlalchemy.engine.interfaces", "sqlalchemy.engine.url", "sqlalchemy.engine.create",
    "sqlalchemy.pool.base", "sqlalchemy.pool.impl", "sqlalchemy.sql.schema", "sqlalchemy.sql.elements",
    "sqlalchemy.sql.compiler", "sqlalchemy.sql.base", "sqlalchemy.log", "sqlalchemy.event.api",
    "sqlalchemy.orm.session", "sqlalchemy.ext.asyncio.engine", "sqlalchemy.ext.asyncio.session",
    "sqlalchemy.ext.asyncio.result", "sqlalchemy.dialects.sqlite.base", "sqlalchemy.dialects.postgresql.base",
    "sqlalchemy.dialects.postgresql.psycopg", "alembic.config", "alembic.command", "alembic.script.base",
    "alembic.script.revision", "alembic.runtime.migration", "alembic.runtime.environment",
    "alembic.operations.base", "alembic.autogenerate.api",
)

#: Private names refused whatever hostedrooms itself defines (the ones it used before issue #37, and the
#: best-known others).
KNOWN_PRIVATE = frozenset({
    "_should_log_debug", "_should_log_info", "_option_cls", "_upgrade_revs", "_downgrade_revs", "_stamp_revs",
    "_ddl_if", "_cursor_execute", "_execute_context", "_has_events", "_execution_options", "_proxied",
    "_dbapi_connection", "_log_debug", "_log_info", "_message_formatter", "_compiled_cache", "_revision_map",
    "_catch_revision_errors", "_echo", "_run_ddl_visitor", "_invalidate_pool_on_disconnect",
})

#: The uses of a private name that remain: (module, name) -> how many. Each says why at its site.
ALLOWED = {("hostedrooms/engine_profile.py", "_should_log_debug"): 1}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def library_private_names() -> frozenset[str]:
    """Every single-underscore name SQLAlchemy's and Alembic's classes and module globals define."""
    names: set[str] = set(KNOWN_PRIVATE)
    for module_name in LIBRARY_MODULES:
        module = importlib.import_module(module_name)
        names.update(name for name in vars(module) if _private(name))
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__.split(".")[0] not in ("sqlalchemy", "alembic"):
                continue
            for klass in cls.__mro__:
                if klass.__module__.split(".")[0] in ("sqlalchemy", "alembic"):
                    names.update(name for name in vars(klass) if _private(name))
    return frozenset(names)


def _library_module(name: str | None) -> bool:
    return name is not None and name.split(".")[0] in ("sqlalchemy", "alembic")


def _private_module(name: str) -> bool:
    parts = name.split(".")
    internal = len(parts) > 1 and parts[1] in ("util", "testing") and name != "alembic.util.exc"
    return internal or any(_private(part) for part in parts)


@cache
def _nodes(text: str) -> tuple[ast.AST, ...]:
    """Every node of the module ``text``, walked once."""
    return tuple(ast.walk(ast.parse(text)))


def own_names(sources: dict[str, str]) -> set[str]:
    """The private names the checked source defines itself: functions, classes, attributes, slots, globals."""
    found: set[str] = set()
    for text in sources.values():
        for node in _nodes(text):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                found.add(node.value)  # __slots__ entries, dataclass-style names
    return {name for name in found if _private(name)} - KNOWN_PRIVATE


def _library_bases(nodes: tuple[ast.AST, ...]) -> set[str]:
    """Names the module imports from SQLAlchemy or Alembic (as bound in the module)."""
    bound: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and _library_module(node.module):
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names
                         if _library_module(alias.name))
    return bound


def _named_attribute(node: ast.Call) -> str | None:
    if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def violations(sources: dict[str, str]) -> Iterator[tuple[str, int, str]]:
    """(module, line, private name) for each use of a private SQLAlchemy or Alembic name in ``sources``
    (module path -> source text)."""
    private = library_private_names()
    ours = own_names(sources)
    foreign = private - ours
    for path, text in sources.items():
        nodes = _nodes(text)
        bases = _library_bases(nodes)
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level == 0 and _library_module(node.module):
                assert node.module is not None
                if _private_module(node.module):
                    yield path, node.lineno, node.module
                yield from ((path, node.lineno, alias.name) for alias in node.names if _private(alias.name))
            elif isinstance(node, ast.Import):
                yield from ((path, node.lineno, alias.name) for alias in node.names
                            if _library_module(alias.name) and _private_module(alias.name))
            elif isinstance(node, ast.Attribute) and node.attr in foreign:
                yield path, node.lineno, node.attr
            elif isinstance(node, ast.Call) and (name := _named_attribute(node)) in foreign:
                yield path, node.lineno, str(name)
            elif isinstance(node, ast.ClassDef) and any(ast.unparse(base).split(".")[0] in bases
                                                        for base in node.bases):
                yield from ((path, item.lineno, item.name) for item in node.body
                            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in private)


def package_sources() -> dict[str, str]:
    root = PACKAGE.parent
    return {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def test_hostedrooms_uses_no_private_sqlalchemy_or_alembic_name_but_the_one_allowed() -> None:
    counted: dict[tuple[str, str], int] = {}
    for path, _line, name in violations(package_sources()):
        counted[(path, name)] = counted.get((path, name), 0) + 1
    assert counted == ALLOWED, "private SQLAlchemy/Alembic API in hostedrooms: " + ", ".join(
        f"{path}: {name}" for path, name in sorted(set(counted) - set(ALLOWED)))


def test_the_library_private_names_are_read() -> None:
    """The scan knows the libraries' private names (not only the hand-written list)."""
    names = library_private_names()
    assert {"_execute_context", "_should_log_debug", "_upgrade_revs", "_ddl_if", "_option_cls"} <= names
    assert len(names - KNOWN_PRIVATE) > 500


# Each pattern the check refuses, in a module of its own.
REFUSED = {
    "concurrency": ("from sqlalchemy.util._concurrency import greenlet_spawn\n", "sqlalchemy.util._concurrency"),
    "util": ("from sqlalchemy.util import greenlet_spawn\n", "sqlalchemy.util"),
    "private_import": ("from sqlalchemy.engine.base import _EMPTY_EXECUTION_OPTIONS\n", "_EMPTY_EXECUTION_OPTIONS"),
    "import_module": ("import sqlalchemy.util._collections\n", "sqlalchemy.util._collections"),
    "assign": ("def quiet(engine):\n    engine._should_log_debug = lambda: False\n", "_should_log_debug"),
    "call": ("def steps(script, heads):\n    return script._upgrade_revs('head', heads)\n", "_upgrade_revs"),
    "getattr": ("def cond(obj):\n    return getattr(obj, '_ddl_if', None)\n", "_ddl_if"),
    "cursor": ("def run(c, cur):\n    c._cursor_execute(cur, 'SELECT 1', ())\n", "_cursor_execute"),
    "foreign": ("def meta(r):\n    return r._metadata\n", "_metadata"),
    "subclass": ("from sqlalchemy.engine import Engine\n\nclass Quiet(Engine):\n"
                 "    def _should_log_info(self):\n        return False\n", "_should_log_info"),
}


def test_each_refused_pattern_is_reported() -> None:
    for label, (text, name) in REFUSED.items():
        found = [hit[2] for hit in violations({f"{label}.py": text})]
        assert name in found, (label, found)


def test_public_code_and_hostedrooms_own_private_names_pass() -> None:
    clean = (
        "from sqlalchemy import Engine, event\n"
        "from sqlalchemy.ext.asyncio import AsyncSession\n"
        "from alembic.util.exc import CommandError\n\n"
        "class Holder:\n"
        "    __slots__ = ('_engine',)\n\n"
        "    def __init__(self, engine):\n"
        "        self._engine = engine\n\n"
        "def pool_of(holder):\n"
        "    return holder._engine.pool\n\n"
        "def listen(engine):\n"
        "    event.listen(engine, 'set_engine_execution_options', lambda e, o: None)\n"
    )
    assert list(violations({"clean.py": clean})) == []
