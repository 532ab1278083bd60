"""The ``hostedrooms`` console script: migrate, inspect, verify, repair the budget, and a demo of the whole story.

Every command takes ``--url`` (default: ``$HOSTEDROOMS_DATABASE_URL``, else ``./state.db``). Errors are one
line on stderr and a non-zero exit; progress is shown only when stderr is a terminal. Only ``upgrade`` and
``demo`` create a SQLite file: every other command refuses a missing one and leaves nothing behind. Stored
values (names, ids and messages that may come from peers) are printed with control characters escaped
(:func:`hostedrooms.display.terminal_text`), so they cannot move the cursor, recolour the terminal or fake rows.

This package holds :func:`main` and the parser; each command is a :class:`~hostedrooms.cli.support.Command`
(its arguments beside its handler) in the module of its group: :mod:`~hostedrooms.cli.store` (the schema,
verify, repair-budget, alembic-ini, demo), :mod:`~hostedrooms.cli.inspect` (rooms, log, replicas, deliveries,
status) and :mod:`~hostedrooms.cli.standby` (replicate, failover, serve-pages); :mod:`~hostedrooms.cli.support`
holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import sqlalchemy as sa
from alembic.util.exc import CommandError

from ..errors import HostedRoomError, translate
from ..logs import logging_to
from . import inspect, standby, store
from .support import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_UNKNOWN,
    EXIT_USAGE,
    Command,
    Progress,
    add_logging_options,
    add_url_options,
    error_text,
)

__all__ = [
    "COMMANDS", "EXIT_FAILED", "EXIT_OK", "EXIT_STATUS_UNKNOWN", "EXIT_USAGE", "LOGGING_COMMANDS", "Progress",
    "RedactingParser", "build_parser", "main",
]

#: Every command, in the order ``hostedrooms --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    store.UPGRADE, store.CURRENT, store.CHECK,
    inspect.ROOMS, inspect.LOG, inspect.REPLICAS, inspect.DELIVERIES,
    store.VERIFY, store.REPAIR_BUDGET, inspect.STATUS, store.ALEMBIC_INI,
    standby.REPLICATE, standby.FAILOVER, standby.SERVE_PAGES,
    store.DEMO,
)
#: The long-running commands, which take ``--log-format`` and ``--log-level``.
LOGGING_COMMANDS = tuple(command.name for command in COMMANDS if command.logging)


class RedactingParser(argparse.ArgumentParser):
    """argparse, whose usage errors never quote a password: they echo what was given (``unrecognized arguments:
    postgresql://user:pw@...`` for a URL put before the command, after a mistyped option or as a positional), so
    every message goes through :func:`~hostedrooms.errors.redact`. Subparsers are of this class too."""

    #: The subcommands' names (set by :func:`build_parser` on the top parser).
    command_names: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        super().error(error_text(message))


def build_parser() -> RedactingParser:
    """The parser of every command: a command's ``--url`` options first, then its own, then the logging options."""
    parser = RedactingParser(prog="hostedrooms", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        if command.url:
            add_url_options(sub)
        sub.set_defaults(handler=command.run)
        command.add_arguments(sub)
    for command in COMMANDS:
        if command.logging:
            add_logging_options(commands.choices[command.name])
    parser.command_names = tuple(commands.choices)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args(arguments)
    except SystemExit as exc:
        # A monitoring system reads 2 as critical: a usage error of the status check is unknown (3), wherever
        # the command stands (an argument misplaced before it).
        names = getattr(parser, "command_names", ())
        if exc.code == EXIT_USAGE and next((word for word in arguments if word in names), None) == "status":
            raise SystemExit(EXIT_STATUS_UNKNOWN) from None
        raise


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one command; errors become one line on stderr and a non-zero exit code."""
    parser = build_parser()
    args = _parse(parser, argv)
    try:
        with logging_to(sys.stderr, log_format=getattr(args, "log_format", None),
                        level=getattr(args, "log_level", None)):
            return int(args.handler(args, out or sys.stdout))
    except KeyboardInterrupt:
        return 130
    except (HostedRoomError, OSError, CommandError) as exc:
        sys.stderr.write(f"hostedrooms: error: {error_text(exc)}\n")
        return EXIT_FAILED
    except sa.exc.SQLAlchemyError as exc:
        sys.stderr.write(f"hostedrooms: error: {error_text(translate(exc, getattr(args, 'url', '?')))}\n")
        return EXIT_FAILED
