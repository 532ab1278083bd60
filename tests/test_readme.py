"""The README's Python examples run as written (on a SQLite file in a temporary folder)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from hostedrooms import AuthorityConflictError, rooms

README = Path(__file__).resolve().parent.parent / "README.md"


#: Python blocks that are not part of the library walk-through; other tests run them (see readme_block).
NOT_LIBRARY = ("hostedrooms_engine", "compat import", "from myapp", "pytest_alembic", "hostedrooms.records import")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def readme_block(containing: str, language: str = "python") -> str:
    """The one README code block of ``language`` containing ``containing`` (for tests that run it)."""
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (block,) = [block for block in blocks if containing in block]
    return str(block)


def marked_block(name: str) -> str:
    """The shell block after ``<!-- tested: NAME ... -->`` (the README's commands a test runs as written)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- tested: {re.escape(name)}\b.*?-->\s*```sh\n(.*?)```", text, flags=re.S)
    assert match is not None, f"README.md has no block marked tested: {name}"
    return match.group(1)


def test_library_examples_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = [block for block in _python_blocks() if not any(marker in block for marker in NOT_LIBRARY)]
    engine_block, rooms_block, fence_block = blocks
    namespace: dict[str, object] = {}
    exec(compile(engine_block, "README engines", "exec"), namespace)
    with pytest.raises(AuthorityConflictError, match="stale hosted room authority"):  # its last line, on purpose
        exec(compile(rooms_block, "README rooms", "exec"), namespace)
    before = rooms.room_state(namespace["engine"], room_id="r1")  # type: ignore[arg-type]
    assert before["authority_gateway_id"] == "install:gw-b" and before["authority_epoch"] == 2
    exec(compile(fence_block, "README fenced write", "exec"), namespace)
    after = rooms.room_state(namespace["engine"], room_id="r1")  # type: ignore[arg-type]
    assert after["updated_at"] == before["updated_at"] + 1


def test_plugin_example_is_valid_python() -> None:
    (block,) = [block for block in _python_blocks() if "hostedrooms_engine" in block]
    compile(block, "README plugin example", "exec")


def test_every_python_block_is_valid_python() -> None:
    for index, block in enumerate(_python_blocks()):
        compile(textwrap.dedent(block), f"README python block {index}", "exec")
