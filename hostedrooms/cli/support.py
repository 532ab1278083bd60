"""What every ``hostedrooms`` command shares: the :class:`Command` record, the default database and the ``--url``
options, exit codes, the engine of ``--url``, the progress line, tables, argument types, and the one-line error
text (any password masked, controls escaped)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from sqlalchemy import Engine

from .. import migrate
from ..db import DATABASE_URL_ENV, create_engine
from ..display import terminal_text
from ..errors import UPGRADE_HINT, SchemaMissingError, describe_target, redact
from ..logs import FORMATS, LEVELS, logs_enabled
from ..migrate import SCHEMA_ENV
from ..validation import INT64_MAX

__all__ = [
    "DEFAULT_DATABASE", "EXIT_FAILED", "EXIT_OK", "EXIT_STATUS_UNKNOWN", "EXIT_USAGE", "LISTEN_URL_ENV", "POOLER_ENV",
    "Command", "Handler", "Progress", "add_logging_options", "add_url_options", "default_url", "engine_of",
    "error_text", "no_arguments", "non_negative_int", "positive_int", "print_table", "require_schema",
]

DEFAULT_DATABASE = "state.db"
#: Environment variables for ``--pooler`` and ``--listen-url`` (see ``hostedrooms.create_engine``).
POOLER_ENV = "HOSTEDROOMS_POOLER"
LISTEN_URL_ENV = "HOSTEDROOMS_LISTEN_URL"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: ``status``'s exit code when the store cannot be read or an option is invalid (Nagios' UNKNOWN).
EXIT_STATUS_UNKNOWN = 3

#: A command's handler: the parsed arguments and stdout in, the exit code out.
Handler = Callable[[argparse.Namespace, TextIO], int]


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a command that takes none of its own."""


@dataclass(frozen=True)
class Command:
    """One subcommand, read in one place: its name, its help line (also its description), the arguments it adds
    to its parser and the handler that runs it (the handler's module defines both side by side).

    ``url``: the command reads a database named by ``--url`` (with ``--schema``, ``--pooler``, ``--listen-url``,
    added before its own arguments); ``logging``: a long-running command taking ``--log-format`` and
    ``--log-level`` (added after them).
    """

    name: str
    help: str
    run: Handler
    add_arguments: Callable[[argparse.ArgumentParser], None] = no_arguments
    url: bool = True
    logging: bool = False


class Progress:
    """One self-overwriting status line on a terminal; silent when stderr is piped or takes log lines."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        # Log lines (--log-format) go to stderr too: a line overwriting itself would garble them.
        self.enabled = self.stream.isatty() and not logs_enabled()
        self._width = 0

    def __call__(self, message: str) -> None:
        if self.enabled:
            text = f"\r{message}".ljust(self._width + 1)
            self._width = len(message)
            self.stream.write(text)
            self.stream.flush()

    def done(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * (self._width + 1) + "\r")
            self.stream.flush()


def default_url() -> str:
    """``$HOSTEDROOMS_DATABASE_URL``, else ``state.db`` in the current directory."""
    return os.environ.get(DATABASE_URL_ENV) or DEFAULT_DATABASE


def add_url_options(parser: argparse.ArgumentParser) -> None:
    """``--url`` and the options that say how to reach it (their defaults read from the environment now)."""
    parser.add_argument("--url", default=default_url(),
                        help=f"database path or URL (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
    parser.add_argument("--schema", default=os.environ.get(SCHEMA_ENV) or None,
                        help=f"PostgreSQL: this gateway's schema in a shared database (default: ${SCHEMA_ENV}; "
                             "`upgrade` creates it)")
    parser.add_argument("--pooler", choices=("session", "transaction"), default=os.environ.get(POOLER_ENV) or None,
                        help=f"PostgreSQL: --url goes through a pooler in this mode (default: ${POOLER_ENV}); "
                             "transaction: PgBouncer's pool_mode = transaction")
    parser.add_argument("--listen-url", default=os.environ.get(LISTEN_URL_ENV) or None,
                        help=f"PostgreSQL: a direct URL of the same database for LISTEN, bypassing the pooler "
                             f"(default: ${LISTEN_URL_ENV})")


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level``, which the long-running commands take."""
    parser.add_argument("--log-format", choices=FORMATS,
                        help="log hostedrooms' records to stderr, one per line: json (one object a line) or text "
                        "(default: no logs unless --log-level is given, then text)")
    parser.add_argument("--log-level", choices=LEVELS, help="the least level logged (default info)")


@contextmanager
def engine_of(args: argparse.Namespace, *, create: bool = False) -> Iterator[Engine]:
    """The engine of ``--url``; a SQLite file must already exist unless ``create`` (upgrade only)."""
    engine = create_engine(args.url, create=create, schema=getattr(args, "schema", None) or None,
                           pooler=getattr(args, "pooler", None) or None,
                           listen_url=getattr(args, "listen_url", None) or None)
    try:
        yield engine
    finally:
        engine.dispose()


def require_schema(engine: Engine) -> None:
    if migrate.current_revision(engine) is None:
        raise SchemaMissingError(f"no hostedrooms schema in {describe_target(engine.url)}; {UPGRADE_HINT} first")


def print_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    cells = [[terminal_text(value) for value in row] for row in rows]
    widths = [max([len(header), *(len(row[index]) for row in cells)]) for index, header in enumerate(headers)]
    out.write("  ".join(header.ljust(width) for header, width in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip() + "\n")
    if not rows:
        out.write("(none)\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if not 0 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {INT64_MAX}")
    return value


def error_text(error: object) -> str:
    """An error for stderr or a status line: one line, any password it may quote masked, controls escaped."""
    return terminal_text(redact(str(error)))
