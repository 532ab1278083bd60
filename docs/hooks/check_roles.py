"""Fail when the built documentation site shows a Sphinx role raw (``:class:`` followed by code).

Usage: ``python docs/hooks/check_roles.py SITE_DIR`` after ``mkdocs build --strict --site-dir SITE_DIR``. It prints
each raw role (page, line, text around it) and exits 1 if there is any, 0 otherwise. Code samples (``<pre>`` and
``<code>`` elements) may show roles: only prose is checked. docs/hooks/roles.py is what turns the docstrings' roles
into links; this check proves none escaped it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROLES = "func|class|meth|mod|data|attr|exc|obj|const|type|any"
# A raw role as Python-Markdown renders it: the role name, then the backquoted target as <code> (or backquotes).
RAW_ROLE_RE = re.compile(rf":(?:py:)?(?:{ROLES}):(?=<code|`)")
CODE_RE = re.compile(r"<(pre|code)\b[^>]*>.*?</\1>", re.DOTALL | re.IGNORECASE)


def _blank_code(page: str) -> str:
    """``page`` with the inside of every code element emptied (its newlines kept, so line numbers hold)."""

    def keep_newlines(match: re.Match[str]) -> str:
        tag = match.group(1)
        return f"<{tag}>" + "\n" * match.group().count("\n") + f"</{tag}>"

    return CODE_RE.sub(keep_newlines, page)


def find_raw_roles(site_dir: Path) -> list[str]:
    """One ``page:line: text`` entry per raw role in the HTML pages under ``site_dir``."""
    found: list[str] = []
    for page in sorted(site_dir.rglob("*.html")):
        prose = _blank_code(page.read_text(encoding="utf-8"))
        for match in RAW_ROLE_RE.finditer(prose):
            line = prose.count("\n", 0, match.start()) + 1
            context = prose[match.start() : match.start() + 80].split("\n", 1)[0]
            found.append(f"{page.relative_to(site_dir)}:{line}: {context}")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print("usage: check_roles.py SITE_DIR (a directory mkdocs built)", file=sys.stderr)
        return 2
    site_dir = Path(argv[1])
    if not any(site_dir.rglob("*.html")):
        print(f"{site_dir}: no HTML page: build the site first", file=sys.stderr)
        return 2
    found = find_raw_roles(site_dir)
    for entry in found:
        print(entry)
    print(f"{len(found)} raw Sphinx role(s) in {site_dir}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
