"""The layout limits of the package and of bench/: module, function and class sizes, and import cycles.

Run as a script to list every violation (``python tests/layout_check.py hostedrooms bench``);
tests/packaging/test_layout.py asserts there are none. Sizes count physical lines (a function from its ``def``
line to its last line, so decorators are not counted, docstrings are). Imports are the module-level ones
(``if TYPE_CHECKING:`` blocks excepted) and those inside functions: a deferred import that closes a cycle is
still a cycle.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 400


def modules(root: Path) -> dict[str, Path]:
    """Every module under the package or folder ``root``, by dotted name (``hostedrooms.rooms.events``)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def size_problems(name: str, path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        yield f"{path}: module of {lines} lines (limit {MAX_MODULE_LINES})"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if length > limit:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                yield f"{path}:{node.lineno}: {kind} {node.name} of {length} lines (limit {limit})"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports (a package import counts as its ``__init__``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from package import module`` imports the module; the package only for names defined in it
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                          for alias in node.names]
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def cycles(known: dict[str, Path]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan), as a sorted list of names."""
    graph = {name: imported(name, path, known) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def problems(root: Path) -> list[str]:
    known = modules(root)
    found = [problem for name, path in known.items() for problem in size_problems(name, path)]
    found += [f"import cycle: {' -> '.join(group)}" for group in cycles(known)]
    return found


def main(argv: list[str]) -> int:
    found = [problem for root in argv or ["hostedrooms", "bench"] for problem in problems(Path(root))]
    print("\n".join(found) if found else "no layout problems")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
