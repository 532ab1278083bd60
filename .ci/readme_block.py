"""Print the shell block of README.md that follows the marker ``<!-- ci: NAME ...-->`` (for .ci/run)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def block(readme: str, name: str) -> str:
    match = re.search(rf"<!-- ci: {re.escape(name)}\b.*?-->\s*```sh\n(.*?)```", readme, flags=re.S)
    if match is None:
        raise SystemExit(f"README.md has no block marked ci: {name}")
    return match.group(1)


if __name__ == "__main__":
    sys.stdout.write(block(Path(sys.argv[1]).read_text(encoding="utf-8"), sys.argv[2]))
