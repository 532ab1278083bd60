"""The README's standby example runs as written and prints what its comments say (a ```py block: the library
walk-through in tests/test_readme.py counts its own ```python blocks)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_standby_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```py\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (block,) = [block for block in blocks if "Replicator(" in block]
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README standby example", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("1 room (1 caught-up); 1 event in 1 page; lag 0 events; ")
    assert lines[1:] == ["ops caught-up 1 1 ", "[('ops', 'promoted', 2)]", "[('ops', 'demoted')]"]
