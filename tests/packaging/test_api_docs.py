"""The API reference renders the docstrings' Sphinx roles as links, never raw (docs/hooks/roles.py), and the built
site has no raw role anywhere (docs/hooks/check_roles.py, which CI also runs on the site it builds)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
pytest.importorskip("griffe", reason="the docs extra is not installed (pip install -e '.[docs]')")
import griffe  # noqa: E402


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


roles = _load("roles")
check_roles = _load("check_roles")


@pytest.fixture(scope="module")
def loaded() -> griffe.GriffeLoader:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], docstring_parser=griffe.Parser.sphinx)
    loader.load("hostedrooms")
    loader.resolve_aliases(implicit=False, external=False)
    return loader


def _convert(loader: griffe.GriffeLoader, text: str, where: str) -> str:
    obj = loader.modules_collection[where]
    return str(roles.convert_roles(text, obj, loader.modules_collection))


def test_roles_become_optional_autorefs_with_sphinx_titles(loaded: griffe.GriffeLoader) -> None:
    out = _convert(
        loaded, "an :class:`~hostedrooms.uow.UnitOfWork` and :func:`hostedrooms.rooms.read_events`", "hostedrooms.rooms"
    )
    assert ":class:" not in out and ":func:" not in out
    assert '<autoref identifier="hostedrooms.uow.UnitOfWork" optional><code>UnitOfWork</code></autoref>' in out
    assert "<code>hostedrooms.rooms.read_events()</code>" in out
    assert 'identifier="hostedrooms.rooms.events.read_events"' in out


def test_relative_names_resolve_against_the_documented_object(loaded: griffe.GriffeLoader) -> None:
    assert 'identifier="hostedrooms.rooms.rules"' in _convert(loaded, ":mod:`.rules`", "hostedrooms.rooms")
    out = _convert(loaded, ":func:`read_events`", "hostedrooms.rooms.events.append_event")
    assert 'identifier="hostedrooms.rooms.events.read_events"' in out and "<code>read_events()</code>" in out


def test_unknown_targets_explicit_titles_and_code_are_kept_apart(loaded: griffe.GriffeLoader) -> None:
    out = _convert(
        loaded, ":exc:`NoSuchThing` :meth:`the ledger <hostedrooms.ledger.DeliveryLedger>` :class:`!X`", "hostedrooms"
    )
    assert 'identifier="NoSuchThing" optional><code>NoSuchThing</code>' in out
    assert "<code>the ledger</code>" in out and 'identifier="hostedrooms.ledger' in out
    assert out.endswith(" <code>X</code>")
    sample = "shown as ``:class:`Foo``` and\n```\n:func:`bar`\n```"
    assert _convert(loaded, sample, "hostedrooms") == sample


def test_checker_finds_raw_roles_in_prose_only(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text("<p>ok <code>:class:`X`</code></p>\n<pre>:func:<code>y</code></pre>\n")
    assert check_roles.find_raw_roles(tmp_path) == []
    (tmp_path / "b.html").write_text("<p>line one</p>\n<p>takes an :class:<code>~sqlalchemy.Engine</code></p>\n")
    assert check_roles.find_raw_roles(tmp_path) == ["b.html:2: :class:<code></code></p>"]


def test_built_site_has_no_raw_role(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    site = tmp_path / "site"
    build = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert check_roles.find_raw_roles(site) == []
    rooms = (site / "api" / "rooms" / "index.html").read_text(encoding="utf-8")
    # The operations come first, the transaction machinery is not shown, and roles became links.
    assert rooms.index('id="hostedrooms.rooms.append_event"') < rooms.index('id="hostedrooms.rooms.validate_room_id"')
    assert 'id="hostedrooms.rooms.RoomTransaction"' not in rooms
    assert 'id="hostedrooms.rooms.NeedExclusiveGatewayLock"' not in rooms
    assert 'class="autorefs autorefs-internal"' in rooms
    for module_name in ("hostedrooms.rooms.events", "hostedrooms.rooms.lifecycle"):
        for name in _public_functions(module_name):
            assert f'id="hostedrooms.rooms.{name}"' in rooms, f"{name} is missing from docs/api/rooms.md"
    assert 'id="hostedrooms.rooms.follow.follow"' in rooms
    # A page with an explicit members list shows every public function of its module (none forgotten).
    for module, page in (
        ("hostedrooms.migrate", "migrate"),
        ("hostedrooms.replicas", "replicas"),
        ("hostedrooms.peers", "peers"),
    ):
        html = (site / "api" / page / "index.html").read_text(encoding="utf-8")
        for name in _public_functions(module):
            assert f'id="{module}.{name}"' in html, f"{module}.{name} is missing from docs/api/{page}.md"


def _public_functions(module_name: str) -> list[str]:
    """The public functions ``module_name`` defines or lists in ``__all__``."""
    import importlib
    import inspect

    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [
        name for name, value in vars(module).items() if inspect.isfunction(value) and value.__module__ == module_name
    ]
    return [name for name in names if not name.startswith("_") and inspect.isfunction(getattr(module, name))]
