"""The store's own commands: ``upgrade``, ``current``, ``check``, ``verify``, ``repair-budget``, ``alembic-ini``,
and ``demo`` (the failover story on two fresh stores). Each command's arguments sit beside its handler."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from .. import fleet, migrate
from ..db import looks_like_target
from ..display import terminal_text
from ..errors import HostedRoomError
from ..integrity import repair_budget, verify
from .support import EXIT_FAILED, EXIT_OK, Command, Progress, engine_of, positive_int, require_schema

__all__ = ["COMMANDS", "fleet_lines"]


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("revision", nargs="?", default="head")
    fleet = parser.add_argument_group(
        "a fleet (PostgreSQL: many gateways' schemas of --url, to head, in one run; exit 0 only when all are at head)")
    fleet.add_argument("--schemas", metavar="A,B,C", help="comma-separated schema names")
    fleet.add_argument("--schemas-from", metavar="FILE",
                       help="a file of schema names, one a line (# comments and blank lines skipped; - for stdin)")
    fleet.add_argument("--schema-pattern", metavar="LIKE",
                       help="every schema whose name is LIKE this (gw_%%) and that holds hostedrooms' version table "
                            "or nothing at all")
    fleet.add_argument("--workers", type=positive_int, default=4,
                       help="schemas migrated at once, each in a worker process (default 4; 1: in this process)")
    fleet.add_argument("--lock-timeout", type=float, metavar="SECONDS",
                       help="a schema whose migration waits longer for a lock fails (default: wait)")


def _upgrade(args: argparse.Namespace, out: TextIO) -> int:
    if args.schemas is not None or args.schemas_from is not None or args.schema_pattern is not None:
        return _upgrade_fleet(args, out)
    migrate.check_revision(args.revision)
    progress = Progress()
    progress(f"upgrading to {args.revision} ...")
    with engine_of(args, create=True) as engine:
        migrate.upgrade(engine, args.revision)
        progress.done()
        out.write(f"at {migrate.current_revision(engine)}\n")
    return EXIT_OK


UPGRADE = Command("upgrade", "migrate the schema (default: to head)", _upgrade, _upgrade_arguments)


def _fleet_schemas(args: argparse.Namespace) -> list[str]:
    """The schemas named by ``--schemas``, ``--schemas-from`` and ``--schema-pattern`` (all of them together)."""
    names = [name.strip() for name in (args.schemas or "").split(",") if name.strip()]
    if args.schemas_from is not None:
        if args.schemas_from == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(args.schemas_from, encoding="utf-8") as listed:
                lines = listed.read().splitlines()
        names += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if args.schema_pattern is not None:
        names += fleet.select_schemas(args.url, args.schema_pattern)
    return names


def _upgrade_fleet(args: argparse.Namespace, out: TextIO) -> int:
    """Upgrade every schema selected to head; one line per schema, then the totals; exit 0 when all are at head."""
    if args.schema is not None:
        raise HostedRoomError("--schema names one gateway; a fleet is named by --schemas, --schemas-from or "
                              "--schema-pattern alone")
    if args.revision != "head":
        raise HostedRoomError("a fleet upgrade goes to head; upgrade one schema to a revision with --schema NAME")
    names = _fleet_schemas(args)
    if not names:
        raise HostedRoomError("no schema selected (--schemas, --schemas-from or --schema-pattern named none)")
    progress = Progress()
    progress(f"upgrading {len(names)} schema(s), {args.workers} at a time ...")
    report = fleet.upgrade_schemas(args.url, names, workers=args.workers, lock_timeout=args.lock_timeout)
    progress.done()
    for line in fleet_lines(report):
        out.write(f"{terminal_text(line)}\n")
    return EXIT_OK if report.ok else EXIT_FAILED


def fleet_lines(report: fleet.FleetReport) -> list[str]:
    """What ``upgrade --schemas`` prints for ``report``: a line per schema, then the totals."""
    lines = []
    for outcome in report.outcomes:
        if outcome.status == "upgraded":
            lines.append(f"{outcome.schema}: upgraded {outcome.before or '(none)'} -> {outcome.after}")
        elif outcome.status == "current":
            lines.append(f"{outcome.schema}: already at head ({outcome.after})")
        else:
            lines.append(f"{outcome.schema}: FAILED at {outcome.before or '(none)'}: {outcome.error}")
    lines.append(f"fleet: {len(report.of('upgraded'))} upgraded, {len(report.of('current'))} already at head, "
                 f"{len(report.of('failed'))} failed, of {len(report.outcomes)} (head {report.head})")
    return lines


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
