"""The ``hostedrooms`` console script: migrate, inspect, verify, repair the budget, and a demo of the whole story.

Every command takes ``--url`` (default: ``$HOSTEDROOMS_DATABASE_URL``, else ``./state.db``). Errors are one
line on stderr and a non-zero exit; progress is shown only when stderr is a terminal. Only ``upgrade`` and
``demo`` create a SQLite file: every other command refuses a missing one and leaves nothing behind. Stored
values (names, ids and messages that may come from peers) are printed with control characters escaped
(:func:`hostedrooms.display.terminal_text`), so they cannot move the cursor, recolour the terminal or fake rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn, TextIO, cast

import sqlalchemy as sa
from alembic.util.exc import CommandError
from sqlalchemy import Engine

from . import migrate
from . import rooms as room_service
from .cli_standby import (
    _add_failover,
    _add_replicate,
    _add_serve_pages,
    cmd_failover,
    cmd_replicate,
    cmd_serve_pages,
)
from .cli_support import (
    DEFAULT_DATABASE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS_UNKNOWN,
    EXIT_USAGE,
    LISTEN_URL_ENV,
    POOLER_ENV,
    Progress,
    default_url,
    engine_of,
    error_text,
    non_negative_int,
    positive_int,
    print_table,
    require_schema,
)
from .db import DATABASE_URL_ENV, looks_like_target
from .display import terminal_text
from .errors import (
    HostedRoomError,
    StorageError,
    describe_target,
    translate,
)
from .integrity import repair_budget, verify
from .limits import MAX_LOG_LIMIT
from .logs import FORMATS, LEVELS, logging_to
from .migrate import SCHEMA_ENV
from .models import deliveries, replicas, rooms
from .records import EventRecord
from .rooms import decode_rows
from .store import REPLAY_COLUMNS, room_store
from .uow import UnitOfWork
from .validation import INT64_MAX, stored_json

#: The long-running commands, which take ``--log-format`` and ``--log-level``.
LOGGING_COMMANDS = ("replicate", "log", "failover", "serve-pages")
_log = logging.getLogger("hostedrooms.cli")  # not __name__: run as a script it is __main__
#: Where ``status`` reads the time, once per run (tests replace it).
status_clock: Callable[[], float] = time.time
#: Where a replay row holds its seq, actor and payload texts.
_SEQ, _ACTOR, _PAYLOAD = (REPLAY_COLUMNS.index(name) for name in ("seq", "actor_json", "payload_json"))


# --- commands ------------------------------------------------------------------------------------------


def cmd_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    migrate.check_revision(args.revision)
    progress = Progress()
    progress(f"upgrading to {args.revision} ...")
    with engine_of(args, create=True) as engine:
        migrate.upgrade(engine, args.revision)
        progress.done()
        out.write(f"at {migrate.current_revision(engine)}\n")
    return EXIT_OK


def _revisions(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The database's current revision (None before the first migration) and the head revision."""
    with engine_of(args) as engine:
        revision = migrate.current_revision(engine)
    return revision, migrate.head_revision()


def cmd_current(args: argparse.Namespace, out: TextIO) -> int:
    revision, head = _revisions(args)
    out.write(f"{revision or '(none)'}{' (head)' if revision == head else ''}\n")
    return EXIT_OK


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    revision, head = _revisions(args)
    if revision == head:
        out.write(f"schema at head ({head})\n")
        return EXIT_OK
    out.write(f"schema not at head: database at {revision or '(none)'}, head is {head}\n")
    return EXIT_FAILED


def cmd_rooms(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(sa.select(
                rooms.c.room_id, rooms.c.name, rooms.c.authority_gateway_id, rooms.c.authority_epoch,
                rooms.c.next_seq - 1, rooms.c.event_bytes, rooms.c.disbanded_at,
            ).order_by(rooms.c.updated_at.desc(), rooms.c.room_id)).all()
    print_table([[*list(row)[:6], "yes" if row.disbanded_at is not None else ""] for row in rows],
           ("ROOM", "NAME", "AUTHORITY", "EPOCH", "LATEST_SEQ", "BYTES", "DISBANDED"), out)
    return EXIT_OK


def _event_line(event: EventRecord, actor_json: str, payload_json: str) -> str:
    actor = stored_json(actor_json, lambda: f"hosted room {event['room_id']!r} event seq {event['seq']}")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(event["created_at"]))
    who = f"{actor.get('kind')}:{actor.get('id')}" if isinstance(actor, dict) else str(actor)
    line = (f"{event['seq']:>6}  {stamp}  e{event['authority_epoch'] or '-'}  {event['kind']:<20} {who:<24} "
            f"{payload_json}")
    return terminal_text(line)


def _event_json(event: EventRecord) -> str:
    try:
        return terminal_text(json.dumps({key: value for key, value in event.items() if key != "idempotent"},
                                        ensure_ascii=False))
    except RecursionError:  # decodable, but too deep to encode again here
        raise StorageError(f"hosted room {event['room_id']!r} event seq {event['seq']} holds a stored value that "
                           "cannot be decoded (RecursionError)") from None


def _log_lines(rows: Sequence[tuple[Any, ...]], as_json: bool) -> Iterator[str]:
    """The lines of replay rows, one by one: JSON events decoded as read_events decodes them; the text form
    decodes the actor only (the payload is printed as stored, so an undecodable payload still shows)."""
    if as_json:
        yield from map(_event_json, decode_rows(rows))
        return
    for row in rows:
        event = cast(EventRecord, dict(zip(REPLAY_COLUMNS, row, strict=False)))
        yield _event_line(event, row[_ACTOR], row[_PAYLOAD])


def _require_room(uow: UnitOfWork, room_id: str) -> None:
    if room_store(uow.backend).room_head(uow.connection, room_id) is None:
        raise HostedRoomError(f"hosted room not found: {terminal_text(room_id)}")


def _log_page(engine: Engine, room_id: str, since: int, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` event rows of ``room_id`` after ``since`` (the store's compiled replay statement)."""
    with UnitOfWork(engine, write=False) as uow:
        store = room_store(uow.backend)
        _require_room(uow, room_id)
        # No byte budget here (a page is --limit events): the largest the statement takes; max_event_bytes only
        # sizes the driver's fetches (a backend stepping the cursor takes max_bytes // max_event_bytes at a time).
        rows, _ = store.replay_rows(uow.connection, room_id, since=since, latest_seq=INT64_MAX, limit=limit,
                                    max_bytes=INT64_MAX, max_event_bytes=INT64_MAX // 512)
    return rows


def _print_log(engine: Engine, args: argparse.Namespace, out: TextIO) -> None:
    """Up to ``--limit`` events after ``--since``, read a page of at most MAX_LOG_LIMIT rows at a time (memory
    stays one page whatever the limit)."""
    since, remaining = args.since, args.limit
    while remaining > 0:
        page_size = min(remaining, MAX_LOG_LIMIT)
        rows = _log_page(engine, args.room, since, page_size)
        for line in _log_lines(rows, args.json):
            out.write(line + "\n")
        if len(rows) < page_size:
            return
        since, remaining = rows[-1][_SEQ], remaining - len(rows)


def cmd_log(args: argparse.Namespace, out: TextIO) -> int:
    since = args.since
    # Seqs and limits are 64-bit: a larger value cannot even be bound by the driver.
    if not 0 <= since <= INT64_MAX:
        raise HostedRoomError(f"--since must be between 0 and {INT64_MAX}")
    if args.limit > INT64_MAX:
        raise HostedRoomError(f"--limit must be between 1 and {INT64_MAX}")
    if not math.isfinite(args.interval) or args.interval < 0:
        raise HostedRoomError("--interval must be a finite number of seconds, 0 or more")
    with engine_of(args) as engine:
        require_schema(engine)
        if not args.follow:
            _print_log(engine, args, out)
            return EXIT_OK
        with UnitOfWork(engine, write=False) as uow:
            _require_room(uow, args.room)
        return _follow_log(engine, args, out)


def _follow_log(engine: Engine, args: argparse.Namespace, out: TextIO) -> int:
    """``log --follow``: every event after ``--since`` as it commits (hostedrooms.rooms.follow: NOTIFY on
    PostgreSQL, ``--interval`` polling on SQLite), until the room is disbanded."""
    page_size = min(args.limit, MAX_LOG_LIMIT)
    _log.info("following room %s after seq %s", args.room, args.since, extra={"event": "log.follow", "room": args.room,
                                                                            "seq": args.since})
    with contextlib.closing(room_service.follow(engine, args.room, args.since, limit=page_size,
                                                poll_interval=args.interval)) as feed:
        for event in feed:
            out.write((_event_json(event) if args.json else _followed_line(event)) + "\n")
            out.flush()
    _log.info("room %s ended (disbanded)", args.room, extra={"event": "log.follow_ended", "room": args.room})
    return EXIT_OK


def _followed_line(event: EventRecord) -> str:
    """A followed (decoded) event as a text line: its actor and payload in their canonical stored form."""
    def text(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    return _event_line(event, text(event["actor"]), text(event["payload"]))


def cmd_replicas(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(sa.select(
                replicas.c.room_id, replicas.c.authority_gateway_id, replicas.c.authority_epoch,
                replicas.c.last_seq, replicas.c.latest_seq, replicas.c.event_bytes,
            ).order_by(replicas.c.room_id)).all()
    print_table(rows, ("ROOM", "AUTHORITY", "EPOCH", "LAST_SEQ", "LATEST_SEQ", "BYTES"), out)
    return EXIT_OK


def cmd_deliveries(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        query = sa.select(
            deliveries.c.envelope_id, deliveries.c.state, deliveries.c.kind, deliveries.c.target_chat_id,
            deliveries.c.queued_id, deliveries.c.run_id, deliveries.c.updated_at,
        ).order_by(deliveries.c.updated_at.desc(), deliveries.c.envelope_id)
        if args.state:
            query = query.where(deliveries.c.state == args.state)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(query).all()
    print_table([tuple("" if value is None else value for value in row) for row in rows],
           ("ENVELOPE", "STATE", "KIND", "CHAT", "QUEUED_ID", "RUN_ID", "UPDATED_AT"), out)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
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


def cmd_repair_budget(args: argparse.Namespace, out: TextIO) -> int:
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


def cmd_alembic_ini(args: argparse.Namespace, out: TextIO) -> int:
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


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from .demo import run_demo

    return run_demo(directory=args.dir, url_a=args.url_a, url_b=args.url_b, out=out)


# --- status ------------------------------------------------------------------------------------------


def _use(use: Any) -> str:
    return f"{use['used']:,} of {use['limit']:,} ({use['percent']:g}%)"


def _seconds_text(age: float | None) -> str:
    return "-" if age is None else f"{age:,.0f} s"


def _status_screen(target: str, status: Any, verdict: Any, perf: str, out: TextIO) -> None:
    """``hostedrooms status`` as text: the verdict line first (what a monitoring system shows, with its performance
    data after ``|``), then the store."""
    findings = "; ".join(f"{item['check']}: {item['message']}" for item in verdict["findings"])
    out.write(terminal_text(f"{verdict['state'].upper()}: {findings or 'every limit and age within thresholds'}")
              + f" | {perf}\n")
    schema, room_status, replica_status, ledger = (status[key] for key in ("schema", "rooms", "replicas", "ledger"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(status["now"]))
    head = "at head" if schema["at_head"] else f"head is {schema['head']}"
    lines = [
        f"store       {target} ({status['backend']}), schema {schema['revision']} ({head}), at {stamp}",
        f"rooms       live {_use(room_status['live'])}; disbanded {_use(room_status['disbanded'])}",
        f"events      {room_status['events']:,} in every room's log",
        f"bytes       {_use(room_status['bytes'])} of the gateway budget; {room_status['disbanded_bytes']:,} in "
        "disbanded rooms",
    ]
    out.write("".join(terminal_text(line) + "\n" for line in lines))
    out.write("\nrooms closest to their per-room limits (events of MAX_EVENTS_PER_ROOM, bytes of "
              "MAX_ROOM_EVENT_BYTES)\n")
    print_table([(room["room_id"], _use(room["events"]), _use(room["bytes"])) for room in room_status["fullest"]],
           ("ROOM", "EVENTS", "BYTES"), out)
    out.write("\n" + terminal_text(
        f"replicas    {_use(replica_status['rooms'])}; {replica_status['behind']:,} behind, lag "
        f"{replica_status['lag']:,} events in all, {replica_status['max_lag']:,} at most; largest "
        f"{_use(replica_status['largest'])}") + "\n")
    out.write("  (lag: the source's latest seq as the last ingested page reported it, minus the seq ingested)\n")
    print_table([(item["room_id"], item["authority"]["gateway_id"], item["authority"]["epoch"], item["last_seq"],
             item["latest_seq"], item["lag"], _seconds_text(item["since_update"]))
            for item in replica_status["most_behind"]],
           ("REPLICA", "AUTHORITY", "EPOCH", "INGESTED", "SOURCE_LATEST", "LAG", "LAST_PAGE"), out)
    backlog = ledger["backlog"]
    out.write(f"\nledger      in flight {_use(ledger['in_flight'])}; backlog {backlog['count']:,}, oldest "
              f"{_seconds_text(backlog['oldest_age'])}; {ledger['responses_pending']:,} response intents pending\n")
    rows = [("delivery", state, item["count"], _seconds_text(item["oldest_age"]))
            for state, item in ledger["deliveries"].items()]
    rows += [("outbound", state, item["count"], _seconds_text(item["oldest_age"]))
             for state, item in ledger["outbound"].items()]
    print_table(rows, ("KIND", "STATE", "COUNT", "OLDEST"), out)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    """``hostedrooms status``: exit 0 ok, 1 warning, 2 critical, 3 unknown (the store could not be read, or an
    option is invalid); the error of an unknown goes to stderr too."""
    from .status import EXIT_CODES, UNKNOWN, Thresholds, assess, perfdata, store_status

    target = describe_target(args.url)
    try:
        thresholds = Thresholds(
            warn_percent=args.warn_percent, critical_percent=args.critical_percent,
            warn_backlog_age=args.warn_backlog_age, critical_backlog_age=args.critical_backlog_age,
            warn_lag=args.warn_lag, critical_lag=args.critical_lag, schema_behind=args.schema_behind)
        with engine_of(args) as engine:
            status = store_status(engine, now=status_clock(), top=args.top)
    except (HostedRoomError, OSError, sa.exc.SQLAlchemyError) as exc:
        error = error_text(translate(exc, args.url) if isinstance(exc, sa.exc.SQLAlchemyError) else exc)
        if args.json:
            out.write(json.dumps({"state": UNKNOWN, "exit_code": EXIT_CODES[UNKNOWN], "target": target,
                                  "error": error}) + "\n")
        else:
            out.write(f"UNKNOWN: {error}\n")
        sys.stderr.write(f"hostedrooms: error: {error}\n")
        return EXIT_CODES[UNKNOWN]
    verdict = assess(status, thresholds)
    if args.json:
        out.write(json.dumps({**verdict, "target": target, "status": status}, ensure_ascii=True) + "\n")
    else:
        _status_screen(target, status, verdict, perfdata(status, thresholds), out)
    return verdict["exit_code"]


# --- standby ------------------------------------------------------------------------------------------


# --- parser ------------------------------------------------------------------------------------------


def _add_alembic_ini(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("path", nargs="?", default="alembic.ini", help="file to write, or - for stdout")
    sub.add_argument("--url", dest="ini_url", help="sqlalchemy.url to write (default: sqlite:///state.db)")
    sub.add_argument("--force", action="store_true", help="replace an existing file")


def _add_log(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("room")
    sub.add_argument("--since", type=int, default=0, help="print events after this seq")
    sub.add_argument("--limit", type=positive_int, default=500, help="events per read")
    sub.add_argument("--follow", action="store_true",
                     help="print new events as they commit, until the room is disbanded")
    sub.add_argument("--interval", type=float, default=0.25,
                     help="with --follow on SQLite: how often to look for commits (seconds; PostgreSQL is woken "
                          "by NOTIFY)")
    sub.add_argument("--json", action="store_true", help="JSON lines instead of text")


def _percent(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("must be a finite percentage, 0 or more")
    return value


def _limit_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError("must be a finite number of seconds, 0 or more")
    return value


def _top(text: str) -> int:
    from .status import MAX_TOP

    value = int(text)
    if not 0 <= value <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_TOP}")
    return value


def _add_status(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    sub.add_argument("--top", type=_top, default=10, metavar="N",
                     help="rooms and replicas listed (the fullest, the most behind; default 10, at most 500)")
    sub.add_argument("--warn-percent", type=_percent, default=80.0,
                     help="warn (exit 1) when a limit (live rooms, their bytes of the gateway budget, the fullest "
                     "room, replicas, in-flight deliveries) is used to this percent (default 80)")
    sub.add_argument("--critical-percent", type=_percent, default=95.0,
                     help="critical (exit 2) when one of those limits is used to this percent (default 95)")
    sub.add_argument("--warn-backlog-age", type=_limit_seconds, metavar="SECONDS",
                     help="warn when the oldest unfinished ledger item is this old (default: not checked)")
    sub.add_argument("--critical-backlog-age", type=_limit_seconds, metavar="SECONDS",
                     help="critical when the oldest unfinished ledger item is this old (default: not checked)")
    sub.add_argument("--warn-lag", type=non_negative_int, metavar="EVENTS",
                     help="warn when a replica lags this many events (default: not checked)")
    sub.add_argument("--critical-lag", type=non_negative_int, metavar="EVENTS",
                     help="critical when a replica lags this many events (default: not checked)")
    sub.add_argument("--schema-behind", choices=("ok", "warning", "critical"), default="warning",
                     help="the verdict when the store's schema is not this installation's head (default warning)")


class RedactingParser(argparse.ArgumentParser):
    """argparse, whose usage errors never quote a password: they echo what was given (``unrecognized arguments:
    postgresql://user:pw@...`` for a URL put before the command, after a mistyped option or as a positional), so
    every message goes through :func:`~hostedrooms.errors.redact`. Subparsers are of this class too."""

    #: The subcommands' names (set by :func:`build_parser` on the top parser).
    command_names: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        super().error(error_text(message))


def build_parser() -> RedactingParser:
    parser = RedactingParser(prog="hostedrooms", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[[argparse.Namespace, TextIO], int], help_: str,
                url: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_, description=help_)
        if url:
            sub.add_argument("--url", default=default_url(),
                             help=f"database path or URL (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
            sub.add_argument("--schema", default=os.environ.get(SCHEMA_ENV) or None,
                             help=f"PostgreSQL: this gateway's schema in a shared database (default: ${SCHEMA_ENV}; "
                                  "`upgrade` creates it)")
            sub.add_argument("--pooler", choices=("session", "transaction"),
                             default=os.environ.get(POOLER_ENV) or None,
                             help=f"PostgreSQL: --url goes through a pooler in this mode (default: ${POOLER_ENV}); "
                                  "transaction: PgBouncer's pool_mode = transaction")
            sub.add_argument("--listen-url", default=os.environ.get(LISTEN_URL_ENV) or None,
                             help=f"PostgreSQL: a direct URL of the same database for LISTEN, bypassing the pooler "
                                  f"(default: ${LISTEN_URL_ENV})")
        sub.set_defaults(handler=handler)
        return sub

    command("upgrade", cmd_upgrade, "migrate the schema (default: to head)").add_argument(
        "revision", nargs="?", default="head")
    command("current", cmd_current, "print the schema revision")
    command("check", cmd_check, "exit 0 when the schema is at head, 1 otherwise")
    command("rooms", cmd_rooms, "list rooms")
    _add_log(command("log", cmd_log, "print a room's events"))
    command("replicas", cmd_replicas, "list replicas")
    command("deliveries", cmd_deliveries, "list secure-peer deliveries").add_argument(
        "--state", choices=("prepared", "authorized", "queued", "running", "completed", "failed"))
    command("verify", cmd_verify, "check every store invariant; exit 1 on violations").add_argument(
        "--expect-head", action="append", metavar="ROOM/SEQ/EVENT_ID",
        help="an event a reader remembers (repeatable): a violation when it is gone or another event holds its seq "
             "(a failover onto a standby that lacked it)")
    command("repair-budget", cmd_repair_budget, "re-derive the gateway byte budget's shards from the rooms when "
            "verify reports them wrong (a clean budget is left as it is)")
    _add_status(command("status", cmd_status, "a store's limits, ledger backlog and replica lag in one read; exit "
                        "0 ok, 1 warning, 2 critical, 3 unknown"))
    _add_alembic_ini(command("alembic-ini", cmd_alembic_ini, "write an alembic.ini for the installed package",
                             url=False))
    _add_replicate(command("replicate", cmd_replicate,
                           "keep replicas of every room of another gateway caught up", url=False))
    _add_failover(command("failover", cmd_failover, "promote every caught-up replica of a silent authority",
                          url=False))
    _add_serve_pages(command("serve-pages", cmd_serve_pages, "serve this gateway's pages to its standbys "
                             "(until interrupted)"))
    demo = command("demo", cmd_demo, "run the failover story on two gateways' databases", url=False)
    demo.add_argument("--dir", help="folder for the two SQLite files (default: a temporary folder)")
    demo.add_argument("--url-a", help="gateway A's database URL (instead of a SQLite file)")
    demo.add_argument("--url-b", help="gateway B's database URL (instead of a SQLite file)")
    for name in LOGGING_COMMANDS:
        _add_logging(commands.choices[name])
    parser.command_names = tuple(commands.choices)
    return parser


def _add_logging(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--log-format", choices=FORMATS,
                     help="log hostedrooms' records to stderr, one per line: json (one object a line) or text "
                     "(default: no logs unless --log-level is given, then text)")
    sub.add_argument("--log-level", choices=LEVELS, help="the least level logged (default info)")


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


if __name__ == "__main__":
    raise SystemExit(main())
