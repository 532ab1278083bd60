"""The standby example (docs/standby.md, a ```py block marked tested: standby) runs as written and prints what
its comments say."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from test_readme import readme_block


def test_the_standby_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = readme_block("Replicator(", "py")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README standby example", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("1 room (1 caught-up); 1 event in 1 page; lag 0 events; ")
    assert lines[1:] == ["ops caught-up 1 1 ", "[('ops', 'promoted', 2)]", "[('ops', 'demoted')]"]
