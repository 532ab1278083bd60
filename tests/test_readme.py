"""The README's Python examples run as written (on a SQLite file in a temporary folder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hostedrooms import AuthorityConflictError, rooms

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_library_examples_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = [block for block in _python_blocks() if "hostedrooms_engine" not in block and "compat import" not in block]
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
