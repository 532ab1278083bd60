"""The store's own commands: ``upgrade``, ``current``, ``check``, ``verify``, ``repair-budget``, ``alembic-ini``,
and ``demo`` (the failover story on two fresh stores). Each command's arguments sit beside its handler."""

from __future__ import annotations

import argparse
from typing import TextIO

from .. import migrate
from ..db import looks_like_target
from ..display import terminal_text
from ..errors import HostedRoomError
from ..integrity import repair_budget, verify
from .support import EXIT_FAILED, EXIT_OK, Command, Progress, engine_of, require_schema

__all__ = ["COMMANDS"]


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revision", nargs="?", default="head")


def _upgrade(args: argparse.Namespace, out: TextIO) -> int:
    migrate.check_revision(args.revision)
    progress = Progress()
    progress(f"upgrading to {args.revision} ...")
    with engine_of(args, create=True) as engine:
        migrate.upgrade(engine, args.revision)
        progress.done()
        out.write(f"at {migrate.current_revision(engine)}\n")
    return EXIT_OK


UPGRADE = Command("upgrade", "migrate the schema (default: to head)", _upgrade, _upgrade_arguments)


def _revisions(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The database's current revision (None before the first migration) and the head revision."""
    with engine_of(args) as engine:
        revision = migrate.current_revision(engine)
    return revision, migrate.head_revision()


def _current(args: argparse.Namespace, out: TextIO) -> int:
    revision, head = _revisions(args)
    out.write(f"{revision or '(none)'}{' (head)' if revision == head else ''}\n")
    return EXIT_OK


CURRENT = Command("current", "print the schema revision", _current)


def _check(args: argparse.Namespace, out: TextIO) -> int:
    revision, head = _revisions(args)
    if revision == head:
        out.write(f"schema at head ({head})\n")
        return EXIT_OK
    out.write(f"schema not at head: database at {revision or '(none)'}, head is {head}\n")
    return EXIT_FAILED


CHECK = Command("check", "exit 0 when the schema is at head, 1 otherwise", _check)


def _verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expect-head", action="append", metavar="ROOM/SEQ/EVENT_ID",
        help="an event a reader remembers (repeatable): a violation when it is gone or another event holds its seq "
             "(a failover onto a standby that lacked it)")


def _verify(args: argparse.Namespace, out: TextIO) -> int:
    progress = Progress()
    with engine_of(args) as engine:
        require_schema(engine)
        found = verify(engine, progress=lambda name: progress(f"verifying {name} ..."),
                       expect_heads=args.expect_head or ())
    progress.done()
    for violation in found:
        out.write(f"{terminal_text(violation)}\n")
    out.write("verify: clean\n" if not found else f"verify: {len(found)} violation(s)\n")
    return EXIT_OK if not found else EXIT_FAILED


VERIFY = Command("verify", "check every store invariant; exit 1 on violations", _verify, _verify_arguments)


def _repair_budget(args: argparse.Namespace, out: TextIO) -> int:
    """Re-derive the gateway budget's shards from the rooms when ``verify`` would report them; exit 0 either way."""
    with engine_of(args) as engine:
        require_schema(engine)
        repair = repair_budget(engine)
    for violation in repair.problems:
        out.write(f"{terminal_text(violation)}\n")
    if not repair.changed:
        out.write(f"repair-budget: clean, nothing changed (shards account for {repair.rooms_bytes} bytes)\n")
    else:
        out.write(f"repair-budget: repaired: shards accounted for {repair.shards_used} bytes, now "
                  f"{repair.rooms_bytes} (what the rooms hold); allowances {repair.allowance_before} -> "
                  f"{repair.allowance_after} bytes, spread for {repair.limit}\n")
    return EXIT_OK


REPAIR_BUDGET = Command("repair-budget", "re-derive the gateway byte budget's shards from the rooms when verify "
                        "reports them wrong (a clean budget is left as it is)", _repair_budget)


def _alembic_ini_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default="alembic.ini", help="file to write, or - for stdout")
    parser.add_argument("--url", dest="ini_url", help="sqlalchemy.url to write (default: sqlite:///state.db)")
    parser.add_argument("--force", action="store_true", help="replace an existing file")


def _alembic_ini(args: argparse.Namespace, out: TextIO) -> int:
    """Write an ``alembic.ini`` that drives the installed hostedrooms (``script_location`` inside the package)."""
    if looks_like_target(args.path):
        raise HostedRoomError("the file to write looks like a database URL or DSN: give the URL with --url and a "
                              "file name (or -) as the argument")
    text = migrate.alembic_ini(args.ini_url)
    if args.path == "-":
        out.write(text)
        return EXIT_OK
    mode = "w" if args.force else "x"  # never replace a file (a host's own alembic.ini, say) unless asked
    try:
        with open(args.path, mode, encoding="utf-8") as ini:
            ini.write(text)
    except FileExistsError:
        raise HostedRoomError(f"{args.path} exists; pass --force to replace it") from None
    out.write(f"wrote {args.path}: alembic -c {args.path} upgrade head\n")
    return EXIT_OK


ALEMBIC_INI = Command("alembic-ini", "write an alembic.ini for the installed package", _alembic_ini,
                      _alembic_ini_arguments, url=False)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="folder for the two SQLite files (default: a temporary folder)")
    parser.add_argument("--url-a", help="gateway A's database URL (instead of a SQLite file)")
    parser.add_argument("--url-b", help="gateway B's database URL (instead of a SQLite file)")


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    from ..demo import run_demo

    return run_demo(directory=args.dir, url_a=args.url_a, url_b=args.url_b, out=out)


DEMO = Command("demo", "run the failover story on two gateways' databases", _demo, _demo_arguments, url=False)

#: This module's commands.
COMMANDS = (UPGRADE, CURRENT, CHECK, VERIFY, REPAIR_BUDGET, ALEMBIC_INI, DEMO)
