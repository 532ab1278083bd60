"""The README stays a front door (issue #37): at most 300 lines, every link in it resolves, and its map of the
docs names every page of docs/.

A link's file must exist, and its ``#anchor`` must be a heading of that page as the site spells the anchor
(Python-Markdown's toc slugs: markup dropped, punctuation removed, lower case, spaces as ``-``), so a renamed
heading breaks this test rather than a reader's click. The reference (docs/api/) and the recipe's files are
reached from their pages, not from the README.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 300

_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^([ \t]*)```.*?^\1```[ \t]*$", flags=re.MULTILINE | re.DOTALL)


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives ``heading`` (its default ``slugify``)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings (code blocks aside: a ``# comment`` there is no heading)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(match.group(1)) for match in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.MULTILINE)}


def link_problems(text: str, base: Path) -> list[str]:
    """Every relative link of ``text`` (a Markdown file in ``base``) whose file or anchor does not exist."""
    problems = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of the repository
            continue
        path, _, anchor = target.partition("#")
        page = base / path if path else None
        if page is None or not page.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (page.suffix != ".md" or anchor not in anchors(page)):
            problems.append(f"{target}: no heading with that anchor")
    return problems


def test_the_readme_is_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines: move detail to a docs/ page"


def test_every_link_of_the_readme_resolves() -> None:
    assert link_problems(README.read_text(encoding="utf-8"), ROOT) == []


def test_the_readmes_map_names_every_page_of_the_docs() -> None:
    linked = {target.partition("#")[0] for target in _LINK.findall(README.read_text(encoding="utf-8"))}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set()


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Title\n\n## Inside your application's `Alembic`\n\n```sh\n# not a heading\n```\n", encoding="utf-8")
    text = ("[a](docs/page.md) [b](docs/page.md#inside-your-applications-alembic) [c](https://example.invalid/x) "
            "[d](docs/gone.md) [e](docs/page.md#not-a-heading) [f](docs/page.md#title)")
    assert link_problems(text, tmp_path) == ["docs/gone.md: no such file",
                                             "docs/page.md#not-a-heading: no heading with that anchor"]
