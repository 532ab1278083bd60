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
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, TextIO, cast

import sqlalchemy as sa
from alembic.util.exc import CommandError
from sqlalchemy import Engine

from . import migrate
from . import rooms as room_service
from .db import DATABASE_URL_ENV, create_engine, looks_like_target
from .display import terminal_text
from .errors import (
    UPGRADE_HINT,
    HostedRoomError,
    SchemaMissingError,
    StorageError,
    describe_target,
    redact,
    translate,
)
from .integrity import repair_budget, verify
from .limits import MAX_LOG_LIMIT
from .logs import FORMATS, LEVELS, logging_to, logs_enabled
from .migrate import SCHEMA_ENV
from .models import deliveries, replicas, rooms
from .records import EventRecord
from .rooms import decode_rows
from .store import REPLAY_COLUMNS, room_store
from .uow import UnitOfWork
from .validation import INT64_MAX, stored_json

DEFAULT_DATABASE = "state.db"
#: Environment variables for ``--pooler`` and ``--listen-url`` (see ``hostedrooms.create_engine``).
POOLER_ENV = "HOSTEDROOMS_POOLER"
LISTEN_URL_ENV = "HOSTEDROOMS_LISTEN_URL"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: ``status``'s exit code when the store cannot be read or an option is invalid (Nagios' UNKNOWN).
EXIT_STATUS_UNKNOWN = 3
#: The long-running commands, which take ``--log-format`` and ``--log-level``.
LOGGING_COMMANDS = ("replicate", "log", "failover", "serve-pages")
_log = logging.getLogger("hostedrooms.cli")  # not __name__: run as a script it is __main__
#: Where ``status`` reads the time, once per run (tests replace it).
status_clock: Callable[[], float] = time.time
#: Where a replay row holds its seq, actor and payload texts.
_SEQ, _ACTOR, _PAYLOAD = (REPLAY_COLUMNS.index(name) for name in ("seq", "actor_json", "payload_json"))


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


@contextmanager
def _engine(args: argparse.Namespace, *, create: bool = False) -> Iterator[Engine]:
    """The engine of ``--url``; a SQLite file must already exist unless ``create`` (upgrade only)."""
    engine = create_engine(args.url, create=create, schema=getattr(args, "schema", None) or None,
                           pooler=getattr(args, "pooler", None) or None,
                           listen_url=getattr(args, "listen_url", None) or None)
    try:
        yield engine
    finally:
        engine.dispose()


def _require_schema(engine: Engine) -> None:
    if migrate.current_revision(engine) is None:
        raise SchemaMissingError(f"no hostedrooms schema in {describe_target(engine.url)}; {UPGRADE_HINT} first")


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    cells = [[terminal_text(value) for value in row] for row in rows]
    widths = [max([len(header), *(len(row[index]) for row in cells)]) for index, header in enumerate(headers)]
    out.write("  ".join(header.ljust(width) for header, width in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(value.ljust(width) for value, width in zip(row, widths, strict=True)).rstrip() + "\n")
    if not rows:
        out.write("(none)\n")


# --- commands ------------------------------------------------------------------------------------------


def cmd_upgrade(args: argparse.Namespace, out: TextIO) -> int:
    migrate.check_revision(args.revision)
    progress = Progress()
    progress(f"upgrading to {args.revision} ...")
    with _engine(args, create=True) as engine:
        migrate.upgrade(engine, args.revision)
        progress.done()
        out.write(f"at {migrate.current_revision(engine)}\n")
    return EXIT_OK


def _revisions(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The database's current revision (None before the first migration) and the head revision."""
    with _engine(args) as engine:
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
    with _engine(args) as engine:
        _require_schema(engine)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(sa.select(
                rooms.c.room_id, rooms.c.name, rooms.c.authority_gateway_id, rooms.c.authority_epoch,
                rooms.c.next_seq - 1, rooms.c.event_bytes, rooms.c.disbanded_at,
            ).order_by(rooms.c.updated_at.desc(), rooms.c.room_id)).all()
    _table([[*list(row)[:6], "yes" if row.disbanded_at is not None else ""] for row in rows],
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
    if room_store(uow.dialect).room_head(uow.connection, room_id) is None:
        raise HostedRoomError(f"hosted room not found: {terminal_text(room_id)}")


def _log_page(engine: Engine, room_id: str, since: int, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` event rows of ``room_id`` after ``since`` (the store's compiled replay statement)."""
    with UnitOfWork(engine, write=False) as uow:
        store = room_store(uow.dialect)
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
    with _engine(args) as engine:
        _require_schema(engine)
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
    with _engine(args) as engine:
        _require_schema(engine)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(sa.select(
                replicas.c.room_id, replicas.c.authority_gateway_id, replicas.c.authority_epoch,
                replicas.c.last_seq, replicas.c.latest_seq, replicas.c.event_bytes,
            ).order_by(replicas.c.room_id)).all()
    _table(rows, ("ROOM", "AUTHORITY", "EPOCH", "LAST_SEQ", "LATEST_SEQ", "BYTES"), out)
    return EXIT_OK


def cmd_deliveries(args: argparse.Namespace, out: TextIO) -> int:
    with _engine(args) as engine:
        _require_schema(engine)
        query = sa.select(
            deliveries.c.envelope_id, deliveries.c.state, deliveries.c.kind, deliveries.c.target_chat_id,
            deliveries.c.queued_id, deliveries.c.run_id, deliveries.c.updated_at,
        ).order_by(deliveries.c.updated_at.desc(), deliveries.c.envelope_id)
        if args.state:
            query = query.where(deliveries.c.state == args.state)
        with UnitOfWork(engine, write=False) as uow:
            rows = uow.execute(query).all()
    _table([tuple("" if value is None else value for value in row) for row in rows],
           ("ENVELOPE", "STATE", "KIND", "CHAT", "QUEUED_ID", "RUN_ID", "UPDATED_AT"), out)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    progress = Progress()
    with _engine(args) as engine:
        _require_schema(engine)
        found = verify(engine, progress=lambda name: progress(f"verifying {name} ..."),
                       expect_heads=args.expect_head or ())
    progress.done()
    for violation in found:
        out.write(f"{terminal_text(violation)}\n")
    out.write("verify: clean\n" if not found else f"verify: {len(found)} violation(s)\n")
    return EXIT_OK if not found else EXIT_FAILED


def cmd_repair_budget(args: argparse.Namespace, out: TextIO) -> int:
    """Re-derive the gateway budget's shards from the rooms when ``verify`` would report them; exit 0 either way."""
    with _engine(args) as engine:
        _require_schema(engine)
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
    _table([(room["room_id"], _use(room["events"]), _use(room["bytes"])) for room in room_status["fullest"]],
           ("ROOM", "EVENTS", "BYTES"), out)
    out.write("\n" + terminal_text(
        f"replicas    {_use(replica_status['rooms'])}; {replica_status['behind']:,} behind, lag "
        f"{replica_status['lag']:,} events in all, {replica_status['max_lag']:,} at most; largest "
        f"{_use(replica_status['largest'])}") + "\n")
    out.write("  (lag: the source's latest seq as the last ingested page reported it, minus the seq ingested)\n")
    _table([(item["room_id"], item["authority"]["gateway_id"], item["authority"]["epoch"], item["last_seq"],
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
    _table(rows, ("KIND", "STATE", "COUNT", "OLDEST"), out)


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
        with _engine(args) as engine:
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


def _seconds(value: float, option: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise HostedRoomError(f"{option} must be a finite number of seconds, 0 or more")
    return value


class _ReplicateDisplay:
    """The replicate command's output: a progress line on a terminal (rooms, events, lag), a line per refused or
    demoted room on stdout, and one summary line."""

    def __init__(self, out: TextIO, source: str) -> None:
        self.out, self.source = out, source
        self.progress = Progress()
        self.rooms = self.events = self.pages = self.passes = self.lag = 0

    def on_page(self, page: Any) -> None:
        self.events += page.events
        self.pages += 1
        self.progress(f"replicating from {self.source}: room {self.rooms + 1}, {self.events:,} events, "
                      f"lag {self.lag:,} events ...")

    def on_room(self, room: Any) -> None:
        from .standby.replicator import DEMOTED, REFUSED

        self.rooms += 1
        self.lag += room.lag
        if room.status in (REFUSED, DEMOTED):
            self.progress.done()
            self.out.write(terminal_text(f"{room.status} {room.room_id}: {room.reason}") + "\n")
            self.out.flush()

    def on_pass(self, report: Any) -> None:
        self.passes += 1
        self.rooms, self.lag = 0, 0
        self.progress(f"replicating from {self.source}: {len(report.rooms)} rooms, {self.events:,} events "
                      f"so far, lag {report.lag:,} events" + (f"; {redact(report.error)}" if report.error else ""))


class SignalStop(threading.Event):
    """A stop flag a signal handler may set: :meth:`signal` only assigns an attribute.

    ``threading.Event.set`` takes the event's lock; a handler runs on the main thread between two bytecodes,
    possibly while that thread holds the same lock inside ``Event.wait`` (a following replicator waits on the
    event every few milliseconds), and would then wait for itself forever. Waits here poll the flag instead.
    """

    _POLL = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.signalled = False

    def signal(self, *_: Any) -> None:
        """The handler: no lock, no allocation beyond the assignment."""
        self.signalled = True

    def is_set(self) -> bool:
        return self.signalled or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            remaining = self._POLL if deadline is None else min(self._POLL, deadline - time.monotonic())
            if remaining <= 0:
                return False
            super().wait(remaining)
        return True


@contextmanager
def _stop_on_signals() -> Iterator[SignalStop]:
    """A stop flag set by SIGTERM or SIGINT while the block runs (the previous handlers come back)."""
    stop = SignalStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {number: signal.signal(number, stop.signal) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def cmd_replicate(args: argparse.Namespace, out: TextIO) -> int:
    from .standby import PollingWaker, Replicator, open_source

    interval = _seconds(args.interval, "--interval")
    # A database answers a change probe in microseconds; an HTTP endpoint costs a request per look.
    http_source = args.source.startswith(("http://", "https://"))
    poll = _seconds(args.poll if args.poll is not None else 0.5 if http_source else 0.01, "--poll")
    metrics = _standby_metrics(args)
    source = open_source(args.source, **_page_client_options(args, args.source))
    try:
        with _engine(argparse.Namespace(url=args.target, schema=args.schema)) as target:
            _require_schema(target)
            display = _ReplicateDisplay(out, terminal_text(source.describe()))
            replicator = Replicator(source, target, local_gateway_id=args.gateway, on_page=display.on_page,
                                    on_room=display.on_room, workers=args.workers,
                                    max_pages_per_room=args.max_pages if args.follow else None,
                                    prune_disbanded_after=args.prune_disbanded_after)
            if not args.follow:
                report = replicator.sync_once()
                display.progress.done()
                out.write(terminal_text(f"replicate: {report.summary()}") + "\n")
                return EXIT_OK if report.ok else EXIT_FAILED
            last: list[Any] = []

            def on_pass(report: Any) -> None:
                last[:] = [report]
                display.on_pass(report)
                if metrics is not None:
                    metrics.on_pass(report)

            waker = PollingWaker(source.change_token, poll_interval=poll) if poll > 0 else None
            with _stop_on_signals() as stop, _serving(metrics, args.metrics, out):
                replicator.run(interval=interval, waker=waker, stop=stop, on_pass=on_pass)
            display.progress.done()
            tail = f"; last pass: {last[0].summary()}" if last else ""
            out.write(terminal_text(f"replicate: stopped after {display.passes} passes, {display.events:,} events "
                                    f"in {display.pages:,} pages{tail}") + "\n")
            return EXIT_OK
    finally:
        source.close()


def _warn(message: str) -> None:
    """A warning an operator must see: on stderr, whatever the logging options (and logged)."""
    _log.warning("%s", message)
    sys.stderr.write(terminal_text(f"hostedrooms: WARNING: {message}") + "\n")
    sys.stderr.flush()


def _page_client_options(args: argparse.Namespace, spec: str | None) -> dict[str, Any]:
    """An http(s) page source's token (``--token-file``, else ``$HOSTEDROOMS_PAGE_TOKEN``) and TLS CA
    (``--tls-ca``); the options are refused where they would be ignored."""
    from .standby.auth import client_tls_context, in_clear, resolve_token
    from .standby.open import is_http_source

    if spec is None or not is_http_source(spec):
        if args.token_file is not None or args.tls_ca is not None:
            raise HostedRoomError("--token-file and --tls-ca apply to an http(s):// page source only")
        return {}
    if args.tls_ca is not None and not spec.startswith("https://"):
        raise HostedRoomError("--tls-ca needs an https:// page source")
    options: dict[str, Any] = {"token": resolve_token(args.token_file)}
    if options["token"] is not None and in_clear(spec):
        _warn(f"the page token is sent in clear to {describe_target(spec)}: use https://")
    if args.tls_ca is not None:
        options["ssl_context"] = client_tls_context(args.tls_ca)
    return options


def cmd_serve_pages(args: argparse.Namespace, out: TextIO) -> int:
    """Serve this gateway's pages to its standbys until SIGINT or SIGTERM."""
    from .standby import EnginePageSource, PageServer
    from .standby.auth import in_clear, is_loopback, resolve_token, server_tls_context
    from .standby.metrics import parse_address

    address = parse_address(args.listen, option="--listen")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise HostedRoomError("--tls-cert and --tls-key go together")
    token = resolve_token(args.token_file)
    if token is not None and args.insecure_no_token:
        raise HostedRoomError("--insecure-no-token with a token (--token-file or $HOSTEDROOMS_PAGE_TOKEN): "
                              "choose one")
    context = None if args.tls_cert is None else server_tls_context(args.tls_cert, args.tls_key)
    with _engine(args) as engine:
        _require_schema(engine)
        source = EnginePageSource(engine)
        try:
            with PageServer(source, address, prefix=args.prefix, token=token, ssl_context=context,
                            insecure_no_token=args.insecure_no_token) as server, _stop_on_signals() as stop:
                if token is None and not is_loopback(str(server.server_address[0])):
                    _warn(f"serving every room of {describe_target(engine.url)} WITHOUT A TOKEN at {server.url} "
                          "(--insecure-no-token): anyone who can connect reads every room and can serve a log "
                          "that demotes a returning authority")
                elif in_clear(server.url):
                    _warn(f"the token and the pages cross the network in clear at {server.url}: serve with "
                          "--tls-cert and --tls-key (or behind a TLS proxy)")
                guard = "token required" if token is not None else "no token"
                out.write(terminal_text(f"serve-pages: {describe_target(engine.url)} at {server.url} ({guard})")
                          + "\n")
                out.flush()
                stop.wait()
        finally:
            source.close()
    out.write("serve-pages: stopped\n")
    return EXIT_OK


def _standby_metrics(args: argparse.Namespace) -> Any:
    """The --metrics endpoint's metrics (None without the option), its address checked before anything opens."""
    if args.metrics is None:
        return None
    from .standby.metrics import StandbyMetrics, parse_address

    if not args.follow:
        raise HostedRoomError("--metrics needs --follow (it serves a running replicator's metrics)")
    parse_address(args.metrics)
    return StandbyMetrics()


@contextmanager
def _serving(metrics: Any, address: str | None, out: TextIO) -> Iterator[None]:
    """Serve ``metrics`` at ``address`` while the block runs (nothing without --metrics)."""
    if metrics is None:
        yield
        return
    host, port = metrics.serve(str(address))
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address
    out.write(terminal_text(f"replicate: metrics at http://{shown}:{port}/metrics") + "\n")
    out.flush()
    try:
        yield
    finally:
        metrics.close()


def _failover_line(room: Any) -> str:
    if room.outcome == "promoted":
        what = f"epoch {room.previous_epoch} -> {room.epoch}, claim at seq {room.claim_seq}"
    elif room.outcome == "would-promote":
        what = f"epoch {room.previous_epoch} -> {room.epoch} (seq {room.last_seq})"
    elif room.outcome == "taken-over":
        what = f"epoch {room.previous_epoch} -> {room.epoch}, {room.reason}"
    else:
        what = f"{room.outcome}: {room.reason}"
    label = {"promoted": "promoted", "would-promote": "would promote", "taken-over": "taken over",
             "released": "left", "fenced": "pending"}.get(room.outcome, "not promoted")
    return terminal_text(f"{label:<13} {room.room_id}  {what}")


def cmd_failover(args: argparse.Namespace, out: TextIO) -> int:
    from .identity import local_gateway_id
    from .standby import failover, open_source

    if args.dry_run and args.catch_up_from:
        raise HostedRoomError("--dry-run writes nothing: run `hostedrooms replicate` first instead of "
                              "--catch-up-from")
    local = local_gateway_id(args.gateway)
    # Every message names the source as describe_target masks it: the URL may carry a password.
    named = describe_target(args.catch_up_from) if args.catch_up_from else ""
    try:
        with _engine(argparse.Namespace(url=args.target, schema=args.schema)) as target:
            _require_schema(target)
            options = _page_client_options(args, args.catch_up_from)
            source = open_source(args.catch_up_from, **options) if args.catch_up_from else None
            try:
                report = failover(target, from_gateway=args.from_gateway, local_gateway_id=local,
                                  dry_run=args.dry_run, reason=args.reason, catch_up_from=source)
            finally:
                if source is not None:
                    source.close()
    except (HostedRoomError, OSError, sa.exc.SQLAlchemyError) as exc:
        if args.catch_up_from and args.catch_up_from in str(exc):
            raise HostedRoomError(str(exc).replace(args.catch_up_from, named)) from None
        raise
    if report.catch_up is not None:
        if report.fenced:
            out.write(terminal_text(f"fenced: {len(report.fenced)} rooms of {report.from_gateway} in {named}")
                      + "\n")
        out.write(terminal_text(f"catch-up: {report.catch_up.summary()}") + "\n")
        if report.catch_up.error:
            fenced = (f"; the {len(report.fenced)} rooms fenced in its store stay fenced: run failover again"
                      if report.fenced else "")
            raise HostedRoomError(f"the catch-up from {named} failed ({redact(report.catch_up.error)}); nothing was "
                                  f"promoted{fenced} (without --catch-up-from, failover promotes what is "
                                  "replicated)")
    for room in report.rooms:
        out.write(_failover_line(room) + "\n")
    out.write(terminal_text(f"failover: {report.summary()}") + "\n")
    return EXIT_OK if report.ok else EXIT_FAILED


# --- parser ------------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if not 0 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {INT64_MAX}")
    return value


def _add_alembic_ini(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("path", nargs="?", default="alembic.ini", help="file to write, or - for stdout")
    sub.add_argument("--url", dest="ini_url", help="sqlalchemy.url to write (default: sqlite:///state.db)")
    sub.add_argument("--force", action="store_true", help="replace an existing file")


def _add_log(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("room")
    sub.add_argument("--since", type=int, default=0, help="print events after this seq")
    sub.add_argument("--limit", type=_positive, default=500, help="events per read")
    sub.add_argument("--follow", action="store_true",
                     help="print new events as they commit, until the room is disbanded")
    sub.add_argument("--interval", type=float, default=0.25,
                     help="with --follow on SQLite: how often to look for commits (seconds; PostgreSQL is woken "
                          "by NOTIFY)")
    sub.add_argument("--json", action="store_true", help="JSON lines instead of text")


def _add_replicate(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", dest="source", required=True,
                     help="the authority: its database (path or URL) or its page endpoint (http(s)://...)")
    sub.add_argument("--to", dest="target", default=default_url(),
                     help=f"this gateway's database (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
    _add_target_schema(sub)
    sub.add_argument("--follow", action="store_true", help="keep replicating until interrupted")
    sub.add_argument("--interval", type=float, default=1.0,
                     help="with --follow: seconds between passes at most (default 1)")
    sub.add_argument("--poll", type=float,
                     help="with --follow: seconds between checks for new commits on the source, which "
                     "start a pass at once (default 0.01 for a database, 0.5 for an http(s) endpoint; "
                     "0: passes at --interval only)")
    sub.add_argument("--max-pages", type=_positive, default=16,
                     help="with --follow: pages read from one room per pass (default 16)")
    sub.add_argument("--workers", type=_positive, default=1,
                     help="rooms replicated at once (default 1; more helps where the stores take concurrent "
                     "work, such as PostgreSQL on a machine with cores to spare)")
    sub.add_argument("--gateway", help="this gateway's id, to demote rooms the source shows a newer "
                     "lineage of (default: install:$HOSTEDROOMS_INSTALL_ID)")
    sub.add_argument("--prune-disbanded-after", type=_non_negative_int, metavar="SECONDS",
                     help="remove a replica whose room was disbanded this many seconds after its disband, freeing "
                     "its replica slot (default: keep them)")
    sub.add_argument("--metrics", metavar="HOST:PORT",
                     help="with --follow: serve Prometheus metrics (every room's lag, the passes' durations and "
                     "failures) at http://HOST:PORT/metrics; port 0 takes a free port (printed); needs the "
                     "metrics extra (prometheus-client)")
    _add_page_client(sub)


class _NoTokenOption(argparse.Action):
    """``--token VALUE`` (which argparse would otherwise take for ``--token-file``, then quote VALUE in its error):
    refused without repeating the value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error("there is no --token option (a command line is visible to other users): put the token in a "
                     "file for --token-file, or in $HOSTEDROOMS_PAGE_TOKEN")


def _add_token_file(sub: argparse.ArgumentParser, help_: str) -> None:
    sub.add_argument("--token-file", metavar="PATH", help=help_)
    sub.add_argument("--token", nargs="?", action=_NoTokenOption, help=argparse.SUPPRESS)


def _add_page_client(sub: argparse.ArgumentParser) -> None:
    _add_token_file(sub, "an http(s) source's bearer token: the file's one line (not readable by others; default: "
                    "$HOSTEDROOMS_PAGE_TOKEN)")
    sub.add_argument("--tls-ca", metavar="FILE",
                     help="an https source's certificate is verified against the CA certificates in FILE (PEM) "
                     "instead of the system's")


def _add_serve_pages(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="the address to serve at (default 127.0.0.1:0: loopback, a free port, printed)")
    sub.add_argument("--prefix", default="", help="the endpoint's path (e.g. /standby; default: the root)")
    _add_token_file(sub, "the bearer token standbys must send: the file's one line (not readable by others; "
                    "default: $HOSTEDROOMS_PAGE_TOKEN); required unless HOST is loopback")
    sub.add_argument("--insecure-no-token", action="store_true",
                     help="serve beyond loopback without a token (every client that can connect reads every room)")
    sub.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    sub.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")


def _add_target_schema(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--schema", default=os.environ.get(SCHEMA_ENV) or None,
                     help=f"PostgreSQL: this gateway's schema in --to's database (default: ${SCHEMA_ENV}); a "
                     "PostgreSQL source in a schema names it in its URL (?options=-csearch_path%%3DNAME)")


def _add_failover(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from-gateway", required=True, help="the silent authority's gateway id (install:...)")
    sub.add_argument("--to", dest="target", default=default_url(),
                     help=f"this gateway's database (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
    _add_target_schema(sub)
    sub.add_argument("--dry-run", action="store_true", help="report what would be promoted; write nothing")
    sub.add_argument("--gateway", help="this gateway's id (default: install:$HOSTEDROOMS_INSTALL_ID)")
    sub.add_argument("--catch-up-from", metavar="SOURCE",
                     help="replicate from the authority's database or endpoint first (when still readable); its "
                     "database is fenced first (each of its rooms demoted there, so it can no longer write), an "
                     "http(s) endpoint cannot be: stop the authority before")
    sub.add_argument("--reason", default="authority-unreachable", help="recorded in each claim event")
    _add_page_client(sub)


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
    sub.add_argument("--warn-lag", type=_non_negative_int, metavar="EVENTS",
                     help="warn when a replica lags this many events (default: not checked)")
    sub.add_argument("--critical-lag", type=_non_negative_int, metavar="EVENTS",
                     help="critical when a replica lags this many events (default: not checked)")
    sub.add_argument("--schema-behind", choices=("ok", "warning", "critical"), default="warning",
                     help="the verdict when the store's schema is not this installation's head (default warning)")


def error_text(error: object) -> str:
    """An error for stderr or a status line: one line, any password it may quote masked, controls escaped."""
    return terminal_text(redact(str(error)))


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
