"""Print the shell block of a Markdown file (README.md, a docs/ page) after ``<!-- ci: NAME ...-->`` (.ci/run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def block(text: str, name: str, where: str = "README.md") -> str:
    match = re.search(rf"<!-- ci: {re.escape(name)}\b.*?-->\s*```sh\n(.*?)```", text, flags=re.S)
    if match is None:
        raise SystemExit(f"{where} has no block marked ci: {name}")
    return match.group(1)


if __name__ == "__main__":
    sys.stdout.write(block(Path(sys.argv[1]).read_text(encoding="utf-8"), sys.argv[2], sys.argv[1]))
