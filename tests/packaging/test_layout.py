"""The layout limits hold (issue #35): no module of the package or of bench/ over 600 lines, no function over 60,
no class over 400, no import cycle (tests/layout_check.py lists any; ``python tests/layout_check.py`` prints
them)."""

from __future__ import annotations

from pathlib import Path

import layout_check

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_keeps_its_limits() -> None:
    assert layout_check.problems(ROOT / "hostedrooms") == []


def test_bench_keeps_its_limits() -> None:
    assert layout_check.problems(ROOT / "bench") == []


def test_the_checker_finds_a_cycle_and_an_oversized_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from . import a\n\n\ndef f():\n" + "    x = 1\n" * 60)
    found = layout_check.problems(package)
    assert any("import cycle: pkg.a -> pkg.b" in problem for problem in found), found
    assert any("function f of 61 lines" in problem for problem in found), found
