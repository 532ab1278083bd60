"""docs/tutorial.md runs as written: its Python blocks, in order, as one script in an empty folder (issue #37: the
tutorial's code is run by CI), printing what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "pyproject.toml").is_file())
TUTORIAL = ROOT / "docs" / "tutorial.md"


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 5
    script = tmp_path / "tutorial.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "created design-review held by install:gateway-a at epoch 1",
        "['Shall we review the schema?', 'Yes, at three.', 'Agenda posted.']",
        "followed 4 Minutes drafted.",
        "standby: 1 room (1 caught-up)",
        "failover: [('design-review', 'promoted', 'install:gateway-b')]",
        "the old gateway's write was refused",
    ]
