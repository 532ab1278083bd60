"""Every code block of the README and of docs/ is run as written, or says who runs it, or why not.

A ```python or ```py block runs here, in order with the blocks before it in the same file (one namespace per
file, on SQLite files in a temporary folder), unless the HTML comment right before it says otherwise:

- ``<!-- tested: NAME (tests/folder/test_x.py ...) -->``: the named test runs it (finding it with readme_block);
- ``<!-- raises: ErrorClass (why) -->``: it runs here and its last statement raises that hostedrooms error;
- ``<!-- not run: reason -->``: it cannot run as written (a fragment of a host application); listed below in
  NOT_RUN, so a new one is a deliberate change of this file.

A ```sh block is checked with ``bash -n``; the CI blocks (``<!-- ci: NAME -->``) are run by .ci/run, the
``<!-- tested: NAME -->`` ones by the test the marker names (marked_block).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostedrooms import errors

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: The Python blocks that nothing runs, "file: first line" (their markers give the reason).
NOT_RUN = ["docs/standby.md: from hostedrooms.standby import EnginePageSource, answer"]

_FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```[ \t]*$", flags=re.MULTILINE | re.DOTALL)


def documents() -> list[Path]:
    """README.md, then every page of docs/ (the site's sources)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text (dedented) and the marker comment before it."""

    path: Path
    line: int
    language: str
    text: str
    marker: str

    def __str__(self) -> str:
        first = self.text.strip().splitlines()[0] if self.text.strip() else ""
        return f"{self.path.relative_to(ROOT)}: {first}"


def blocks(path: Path) -> Iterator[Block]:
    text = path.read_text(encoding="utf-8")
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip()
        marker = before[before.rfind("<!--") + 4:-3].strip() if before.endswith("-->") else ""
        yield Block(path, text.count("\n", 0, match.start()) + 1, match.group(2),
                    textwrap.dedent(match.group(3)), marker)


def _python(path: Path) -> list[Block]:
    return [block for block in blocks(path) if block.language in ("python", "py")]


def readme_block(containing: str, language: str = "python") -> str:
    """The code block of ``language`` containing ``containing``, in README.md or docs/ (for tests that run it).

    A block shown both in the README and in a page must be the same there (so one test covers both).
    """
    found = {str(block) for path in documents()
             for block in re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
             if containing in block}
    assert len(found) == 1, f"{len(found)} different {language} blocks contain {containing!r}"
    return found.pop()


def marked_block(name: str) -> str:
    """The shell block after ``<!-- tested: NAME ... -->`` in README.md or docs/ (commands a test runs as written)."""
    found = {match.group(1) for path in documents() for match in re.finditer(
        rf"<!-- tested: {re.escape(name)}\b.*?-->\s*```sh\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)}
    assert len(found) == 1, f"{len(found)} different sh blocks are marked tested: {name}"
    return found.pop()


@pytest.mark.parametrize("path", documents(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_python_block_runs_in_order(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_example"}
    for block in _python(path):
        if block.marker.startswith(("tested:", "not run:")):
            continue
        code = compile(block.text, f"{path.name}:{block.line}", "exec")
        raises = re.match(r"raises: (\w+)", block.marker)
        if raises is None:
            assert block.marker == "", f"{block}: unknown marker {block.marker!r}"
            exec(code, namespace)
            continue
        with pytest.raises(getattr(errors, raises.group(1))):
            exec(code, namespace)


def test_blocks_not_run_here_say_who_runs_them_or_why_not() -> None:
    not_run = []
    for path in documents():
        for block in _python(path):
            if block.marker.startswith("tested:"):
                named = re.findall(r"tests/(?:\w+/)?test_\w+\.py", block.marker)
                assert named and all((ROOT / name).is_file() for name in named), f"{block}: {block.marker}"
            elif block.marker.startswith("not run:"):
                assert block.marker.removeprefix("not run:").strip(), f"{block}: no reason given"
                not_run.append(str(block))
    assert not_run == NOT_RUN


def test_every_python_block_is_valid_python() -> None:
    for path in documents():
        for block in _python(path):
            compile(block.text, str(block), "exec")


def test_every_shell_block_parses() -> None:
    for path in documents():
        for block in blocks(path):
            if block.language == "sh":
                result = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, check=False,
                                        timeout=60)
                assert result.returncode == 0, f"{block}: {result.stderr}"


def test_asyncio_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    block = readme_block("from hostedrooms import aio")
    assert "<!-- tested: asyncio" in (DOCS / "asyncio.md").read_text(encoding="utf-8")
    exec(compile(block, "docs/asyncio.md example", "exec"), {"__name__": "readme"})  # its asserts check the follower
    assert (tmp_path / "state-async.db").exists()


def test_the_fast_subset_is_sqlite_and_the_synchronous_api_only() -> None:
    command = marked_block("fast-subset").replace("python -m pytest -n 2", "python -m pytest --collect-only -q", 1)
    assert command != marked_block("fast-subset")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, capture_output=True, text=True,
                            check=False, env={**os.environ, "PYTEST_ADDOPTS": "-p no:cacheprovider",
                                 # the block's ``python`` is this interpreter, as in an activated venv
                                 "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"]))},
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    selected = [line for line in result.stdout.splitlines() if "::" in line]
    assert len(selected) > 500  # a subset, not a typo that selects nothing
    assert not [test for test in selected if re.search(r"postgresql|async|awaited|threads", test)]
    assert not [test for test in selected if "test_wheel.py" in test or "test_reliability" in test]


def test_the_readme_links_to_pages_that_exist() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README.read_text(encoding="utf-8")):
        assert (ROOT / target).is_file(), target
