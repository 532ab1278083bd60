"""The console script's layout: one Command record per command, declared in its group's module beside its handler;
the CLI builds no SQL and reaches into no store (it reads through hostedrooms.queries and the services)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import hostedrooms.cli
from hostedrooms.cli import COMMANDS, LOGGING_COMMANDS, build_parser
from hostedrooms.cli.support import Command

PACKAGE = Path(hostedrooms.cli.__file__).parent
#: What the CLI may not import: the tables, the stores, the unit of work and the backend seam.
STORE_INTERNALS = ("hostedrooms.models", "hostedrooms.store", "hostedrooms.uow", "hostedrooms.backends",
                   "hostedrooms.statements")
#: SQLAlchemy's statement builders.
SQL_BUILDERS = {"select", "insert", "update", "delete", "text", "exists", "func", "literal_column", "table", "column"}


def _imports(tree: ast.AST, module: str) -> set[str]:
    package = module if module.endswith(".cli") else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def test_the_cli_builds_no_sql_and_imports_no_store_internals() -> None:
    checked = []
    for path in sorted(PACKAGE.glob("*.py")):
        module = "hostedrooms.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imports(tree, module)
        assert not [name for name in imported if name.startswith(STORE_INTERNALS)], module
        assert not [name for name in imported
                    if name.startswith("sqlalchemy") and name.rpartition(".")[2] in SQL_BUILDERS], module
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id in {"sa", "sqlalchemy"}}
        assert not used & SQL_BUILDERS, module
        checked.append(module)
    assert {"hostedrooms.cli", "hostedrooms.cli.store", "hostedrooms.cli.inspect", "hostedrooms.cli.standby",
            "hostedrooms.cli.support"} <= set(checked)


def test_every_command_is_one_record_beside_its_handler_and_arguments() -> None:
    names = [command.name for command in COMMANDS]
    assert len(set(names)) == len(names)
    assert build_parser().command_names == tuple(names)
    for command in COMMANDS:
        assert isinstance(command, Command)
        home = inspect.getmodule(command.run)
        assert home is not None and home.__name__.startswith("hostedrooms.cli."), command.name
        # The group module lists the command, and its handler and arguments are defined there.
        assert command in importlib.import_module(home.__name__).COMMANDS, command.name
        if command.add_arguments.__name__ != "no_arguments":
            assert inspect.getmodule(command.add_arguments) is home, command.name
    assert set(LOGGING_COMMANDS) == {"replicate", "log", "failover", "serve-pages"}
    grouped = [command for module in ("store", "inspect", "standby")
               for command in importlib.import_module(f"hostedrooms.cli.{module}").COMMANDS]
    assert sorted(grouped, key=lambda command: names.index(command.name)) == list(COMMANDS)
