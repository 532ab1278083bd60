"""Every public function and method the API reference renders documents its parameters and what it returns.

The objects are found the way mkdocstrings finds them: each ``::: dotted.name`` directive of a docs/ page, with
its ``members:`` and ``inherited_members:`` options, then every public member below it (no underscore name, no
submodule, an imported name only where ``__all__`` exports it), as mkdocs.yml configures the handler. For each
function or method shown, the Sphinx-style docstring (parsed by griffe's sphinx parser, as the site is) must have
a ``:param name:`` for every parameter but ``self``/``cls`` (``*args`` and ``**kwargs`` may share one entry),
no ``:param:`` for a parameter the signature does not have, a ``:returns:`` when the return annotation is not
``None``, and a ``:raises X:`` only for an exception class that exists. A class's constructor is shown with the
class (``merge_init_into_class``), so the class docstring documents its parameters (a dataclass's fields are
its attributes). A page that lists its objects one by one (standby, aio) must name every export of its module.
"""

from __future__ import annotations

import builtins
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
pytest.importorskip("griffe", reason="the docs extra is not installed (pip install -e '.[docs]')")
import griffe  # noqa: E402

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the docs extra (mkdocs)")

DIRECTIVE_RE = re.compile(r"^:::\s+(?P<path>[\w.]+)\s*$")
NO_RETURN = {"None", "NoReturn", "Never", "typing.NoReturn", "typing.Never"}


def directives(page: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``(object path, options)`` of each ``::: path`` directive in a Markdown page."""
    lines = page.splitlines()
    found: list[tuple[str, dict[str, Any]]] = []
    for index, line in enumerate(lines):
        match = DIRECTIVE_RE.match(line)
        if match is None:
            continue
        block: list[str] = []
        for following in lines[index + 1 :]:
            if following.strip() and not following.startswith((" ", "\t")):
                break
            block.append(following)
        parsed = yaml.safe_load(textwrap.dedent("\n".join(block))) if any(part.strip() for part in block) else None
        options = parsed.get("options", {}) if isinstance(parsed, dict) else {}
        found.append((match["path"], options or {}))
    return found


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object | None:
    """The object an alias points to (None for one that leaves the loaded packages)."""
    if isinstance(obj, griffe.Object):
        return obj
    try:
        return obj.final_target
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _shown(member: griffe.Object | griffe.Alias, members: Any, inherited: Any) -> bool:
    """Whether mkdocstrings renders ``member`` of a rendered object (its ``filter_objects`` and template rules)."""
    if member.inherited and not (inherited is True or (isinstance(inherited, list) and member.name in inherited)):
        return False
    if members is False or members == []:
        return bool(member.inherited)
    if isinstance(members, list):
        return member.name in members or bool(member.inherited)
    if member.name.startswith("_") and not (member.inherited and isinstance(inherited, list)):
        return False
    if not member.has_docstrings and not (member.inherited and isinstance(inherited, list)):
        return False  # show_if_no_docstring: false (a protocol's implementation is documented on the protocol)
    return not member.is_imported or member.is_public


def rendered(obj: griffe.Object, options: dict[str, Any], *, root: bool = True) -> Iterator[griffe.Object]:
    """``obj`` and every object rendered below it on the page."""
    yield obj
    if not (obj.is_module or obj.is_class):
        return
    members = options.get("members") if root else None
    inherited = options.get("inherited_members", False)
    for member in list(obj.all_members.values()):
        if _shown(member, members, inherited):
            target = _target(member)
            if target is not None and not target.is_module:  # show_submodules: false
                yield from rendered(target, options, root=False)


def _documented(obj: griffe.Object) -> tuple[set[str], bool, list[str]]:
    """The parameter names a docstring documents, whether it has ``:returns:``, and the exceptions it names."""
    if obj.docstring is None:
        return set(), False, []
    sections = griffe.parse_sphinx(obj.docstring, warnings=False)
    names: set[str] = set()
    returns = False
    raises: list[str] = []
    for section in sections:
        if section.kind is griffe.DocstringSectionKind.parameters:
            names.update(param.name.lstrip("*") for param in section.value)
        elif section.kind is griffe.DocstringSectionKind.returns:
            returns = True
        elif section.kind is griffe.DocstringSectionKind.raises:
            raises.extend(str(item.annotation) for item in section.value)
    return names, returns, raises


def _exception_exists(name: str, obj: griffe.Function, collection: griffe.ModulesCollection) -> bool:
    """Whether ``name`` (as a ``:raises name:`` writes it) is a builtin or a class the loaded packages know."""
    bare = name.lstrip("~")
    if isinstance(getattr(builtins, bare, None), type):
        return True
    for candidate in (bare, f"hostedrooms.errors.{bare}", f"{obj.module.path}.{bare}"):
        try:
            collection[candidate]
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        return True
    return False


def constructor(cls: griffe.Class, shown: set[str]) -> griffe.Function | None:
    """The ``__init__`` whose parameters ``cls``'s docstring must document (mkdocs shows it with the class:
    merge_init_into_class), or None: a dataclass's fields are documented as its attributes, and an inherited
    ``__init__`` of a class the pages show (``shown``) is documented there."""
    init = _target(cls.all_members["__init__"]) if "__init__" in cls.all_members else None
    if init is None or not isinstance(init, griffe.Function) or cls.has_labels("dataclass"):
        return None
    owner = init.parent
    if owner is not None and owner.path != cls.path and owner.path in shown:
        return None
    return init


def faults(obj: griffe.Function, collection: griffe.ModulesCollection,
           documented_elsewhere: griffe.Object | None = None) -> list[str]:
    """What ``obj``'s docstring lacks or gets wrong (empty when it is complete). ``documented_elsewhere``: the
    class whose docstring documents its ``__init__`` too (mkdocs merges the two)."""
    documented, has_returns, raises = _documented(obj)
    if documented_elsewhere is not None:
        more, _, more_raises = _documented(documented_elsewhere)
        documented, raises = documented | more, raises + more_raises
    problems: list[str] = []
    params = [param for param in obj.parameters if param.name not in ("self", "cls")]
    star = {param.name for param in params if param.kind in (griffe.ParameterKind.var_positional,
                                                              griffe.ParameterKind.var_keyword)}
    for param in params:
        if param.name in documented or (param.name in star and star & documented):
            continue
        problems.append(f":param {param.name}: missing")
    signature = {param.name for param in obj.parameters}
    problems.extend(f":param {name}: is not a parameter" for name in sorted(documented - signature))
    returns = obj.returns
    if returns is not None and str(returns) not in NO_RETURN and not has_returns:
        problems.append(f":returns: missing (annotated {returns})")
    problems.extend(f":raises {name}: is no known exception" for name in raises
                    if not _exception_exists(name, obj, collection))
    return problems


def rendered_functions(docs: Path, collection: griffe.ModulesCollection) -> dict[str, griffe.Function]:
    """Every function and method the pages under ``docs`` render, by path, with each class's own ``__init__``."""
    shown: dict[str, griffe.Object] = {}
    for page in sorted(docs.rglob("*.md")):
        for path, options in directives(page.read_text(encoding="utf-8")):
            start = _target(collection[path])
            assert start is not None, f"{page}: ::: {path} does not resolve"
            shown.update((obj.path, obj) for obj in rendered(start, options))
    found: dict[str, griffe.Function] = {}
    for path, obj in shown.items():
        if isinstance(obj, griffe.Function) and not obj.has_labels("property"):
            found[path] = obj
        init = constructor(obj, set(shown)) if isinstance(obj, griffe.Class) else None
        if init is not None:
            found[f"{path}.__init__"] = init
    return found


def undocumented(docs: Path, collection: griffe.ModulesCollection) -> list[str]:
    """One ``path: fault`` line for each fault of each function or method the pages render."""
    return [
        f"{path}: {problem}"
        for path, obj in sorted(rendered_functions(docs, collection).items())
        for problem in faults(obj, collection, collection[path.removesuffix(".__init__")]
                              if path.endswith(".__init__") else None)
    ]


def _load(*packages: str, search_paths: list[str]) -> griffe.ModulesCollection:
    loader = griffe.GriffeLoader(search_paths=search_paths, docstring_parser=griffe.Parser.sphinx)
    for package in packages:
        loader.load(package)
    loader.resolve_aliases(implicit=False, external=False)
    return loader.modules_collection


@pytest.fixture(scope="module")
def hostedrooms() -> griffe.ModulesCollection:
    return _load("hostedrooms", search_paths=[str(ROOT)])


def test_every_rendered_function_documents_its_parameters_and_returns(hostedrooms: griffe.ModulesCollection) -> None:
    functions = rendered_functions(ROOT / "docs", hostedrooms)
    # The walk reaches the pages' objects: the public operations, methods of classes and the ledger's page.
    for path in ("hostedrooms.rooms.events.append_event", "hostedrooms.ledger.deliveries.Deliveries.prepare",
                 "hostedrooms.uow.UnitOfWork.one_statement", "hostedrooms.standby.failover.failover",
                 "hostedrooms.aio.follow.follow"):
        assert path in functions, path
    assert not any(".RoomTransaction." in path for path in functions), "an internal class is walked"
    missing = undocumented(ROOT / "docs", hostedrooms)
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize(("module_name", "page"), [("hostedrooms.standby", "standby"), ("hostedrooms.aio", "aio")])
def test_pages_listing_objects_one_by_one_name_every_export(module_name: str, page: str) -> None:
    """A page that lists its objects one by one (to put the user-facing calls first) forgets none of ``__all__``."""
    import importlib

    text = (ROOT / "docs" / "api" / f"{page}.md").read_text(encoding="utf-8")
    exported = importlib.import_module(module_name).__all__
    missing = [name for name in exported
               if not re.search(rf"{re.escape(module_name)}\.(?:\w+\.)*{re.escape(name)}\b", text)]
    assert missing == [], f"docs/api/{page}.md does not name {missing}"


SAMPLE = '''
"""A module."""

__all__ = ["Box", "Sized", "Thing", "documented", "undocumented"]


def documented(a: int, *args: int, flag: bool = False, **kwargs: int) -> int:
    """Documented.

    :param a: a.
    :param args: the rest (with ``kwargs``).
    :param flag: a flag.
    :returns: a number.
    :raises ValueError: never.
    """
    return a


def undocumented(a: int, *, flag: bool = False) -> str:
    """Only ``a``.

    :param a: a.
    :param b: not a parameter.
    :raises NoSuchError: not an exception.
    """
    return ""


def _private(a: int) -> int:
    return a


class Thing:
    """A class."""

    def method(self, x: int) -> None:
        """No ``:param x:``."""

    def _hidden(self, y: int) -> int:
        return y


class Sized:
    """Its constructor's ``size`` is not documented."""

    def __init__(self, size: int) -> None:
        self.size = size


class Box(Sized):
    """Its inherited constructor is Sized's, whose own page entry documents it (or not): no fault here."""
'''


def test_the_check_lists_what_a_function_lacks(tmp_path: Path) -> None:
    (tmp_path / "sample_pkg").mkdir()
    (tmp_path / "sample_pkg" / "__init__.py").write_text(SAMPLE)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "all.md").write_text("# sample\n\n::: sample_pkg\n")
    collection = _load("sample_pkg", search_paths=[str(tmp_path)])
    assert undocumented(docs, collection) == [
        "sample_pkg.Sized.__init__: :param size: missing",
        "sample_pkg.Thing.method: :param x: missing",
        "sample_pkg.undocumented: :param flag: missing",
        "sample_pkg.undocumented: :param b: is not a parameter",
        "sample_pkg.undocumented: :returns: missing (annotated str)",
        "sample_pkg.undocumented: :raises NoSuchError: is no known exception",
    ]
    # A members list limits the walk to the names it gives.
    (docs / "all.md").write_text("::: sample_pkg\n    options:\n      members:\n        - documented\n")
    assert undocumented(docs, collection) == []
