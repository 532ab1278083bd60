"""The read-only commands: ``rooms``, ``log``, ``replicas``, ``deliveries`` and ``status``. Each command's arguments
sit beside its handler; what they read comes from :mod:`hostedrooms.queries.listings` and :mod:`hostedrooms.status`.

Stored values (names, ids and messages that may come from peers) are printed with control characters escaped
(:func:`hostedrooms.display.terminal_text`), so they cannot move the cursor, recolour the terminal or fake rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO, cast

import sqlalchemy as sa
from sqlalchemy import Engine

from .. import rooms as room_service
from ..display import terminal_text
from ..errors import HostedRoomError, StorageError, StoreUnavailableError, describe_target, translate
from ..limits import MAX_LOG_LIMIT
from ..queries import listings
from ..records import EventRecord
from ..retry import JitteredBackoff
from ..rooms import decode_rows
from ..validation import INT64_MAX, stored_json
from .support import (
    EXIT_OK,
    Command,
    engine_of,
    error_text,
    non_negative_int,
    positive_int,
    print_table,
    require_schema,
)

__all__ = ["COMMANDS", "status_clock"]

_log = logging.getLogger("hostedrooms.cli")  # the console script's one logger, whatever module logs
#: Where ``status`` reads the time, once per run (tests replace it).
status_clock: Callable[[], float] = time.time
#: ``log --follow`` after a StoreUnavailableError: the waits before following again (full jitter, doubling from
#: 1 s to 60 s), how they are slept (tests replace it), and the failures in a row after which it gives up.
follow_backoff = JitteredBackoff(base=1.0, cap=60.0, jitter="full")
follow_sleep: Callable[[float], object] = time.sleep
follow_attempts = 10
#: Where a log row holds its seq, actor and payload texts.
_SEQ, _ACTOR, _PAYLOAD = (listings.LOG_COLUMNS.index(name) for name in ("seq", "actor_json", "payload_json"))


# --- rooms, replicas, deliveries ---------------------------------------------------------------------------


def _rooms(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        rows = listings.rooms_listing(engine)
    print_table([[*list(row)[:6], "yes" if row.disbanded_at is not None else ""] for row in rows],
                ("ROOM", "NAME", "AUTHORITY", "EPOCH", "LATEST_SEQ", "BYTES", "DISBANDED"), out)
    return EXIT_OK


ROOMS = Command("rooms", "list rooms", _rooms)


def _replicas(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        rows = listings.replicas_listing(engine)
    print_table(rows, ("ROOM", "AUTHORITY", "EPOCH", "LAST_SEQ", "LATEST_SEQ", "BYTES"), out)
    return EXIT_OK


REPLICAS = Command("replicas", "list replicas", _replicas)


def _deliveries_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=listings.DELIVERY_STATES)


def _deliveries(args: argparse.Namespace, out: TextIO) -> int:
    with engine_of(args) as engine:
        require_schema(engine)
        rows = listings.deliveries_listing(engine, args.state)
    print_table([tuple("" if value is None else value for value in row) for row in rows],
                ("ENVELOPE", "STATE", "KIND", "CHAT", "QUEUED_ID", "RUN_ID", "UPDATED_AT"), out)
    return EXIT_OK


DELIVERIES = Command("deliveries", "list secure-peer deliveries", _deliveries, _deliveries_arguments)


# --- log ---------------------------------------------------------------------------------------------------


def _log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("room")
    parser.add_argument("--since", type=int, default=0, help="print events after this seq")
    parser.add_argument("--limit", type=positive_int, default=500, help="events per read")
    parser.add_argument("--follow", action="store_true",
                        help="print new events as they commit, until the room is disbanded")
    parser.add_argument("--interval", type=float, default=0.25,
                        help="with --follow on SQLite: how often to look for commits (seconds; PostgreSQL is woken "
                             "by NOTIFY)")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of text")


def _log_command(args: argparse.Namespace, out: TextIO) -> int:
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
        if not listings.room_exists(engine, args.room):
            raise _room_not_found(args.room)
        return _follow_log(engine, args, out)


LOG = Command("log", "print a room's events", _log_command, _log_arguments, logging=True)


def _room_not_found(room_id: str) -> HostedRoomError:
    return HostedRoomError(f"hosted room not found: {terminal_text(room_id)}")


def _log_page(engine: Engine, room_id: str, since: int, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` event rows of ``room_id`` after ``since``; the room must exist."""
    rows = listings.room_log_page(engine, room_id, since=since, limit=limit)
    if rows is None:
        raise _room_not_found(room_id)
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


def _follow_log(engine: Engine, args: argparse.Namespace, out: TextIO) -> int:
    """``log --follow``: every event after ``--since`` as it commits (hostedrooms.rooms.follow: NOTIFY on
    PostgreSQL, ``--interval`` polling on SQLite), until the room is disbanded.

    A StoreUnavailableError (the store unreachable past the follower's own reconnect deadline) does not end it:
    it follows again from the last event printed (checked unchanged, as a resumed follow() checks it) after a
    jittered, doubling wait (:data:`follow_backoff`), and gives up, raising the error, after
    :data:`follow_attempts` failures in a row (an event printed starts the count again)."""
    page_size = min(args.limit, MAX_LOG_LIMIT)
    _log.info("following room %s after seq %s", args.room, args.since, extra={"event": "log.follow", "room": args.room,
                                                                            "seq": args.since})
    since, last, failures = args.since, None, 0
    while True:
        try:
            with contextlib.closing(room_service.follow(engine, args.room, since, limit=page_size,
                                                        poll_interval=args.interval, last_event=last)) as feed:
                for event in feed:
                    out.write((_event_json(event) if args.json else _followed_line(event)) + "\n")
                    out.flush()
                    since, last, failures = event["seq"], event, 0
            break
        except StoreUnavailableError as error:
            failures += 1
            if failures >= follow_attempts:
                raise
            delay = follow_backoff.delay(failures)
            _log.warning("following room %s again after seq %s in %.2f s: %s", args.room, since, delay, error,
                         extra={"event": "log.follow_retry", "room": args.room, "seq": since})
            follow_sleep(delay)
    _log.info("room %s ended (disbanded)", args.room, extra={"event": "log.follow_ended", "room": args.room})
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
    """The lines of log rows, one by one: JSON events decoded as read_events decodes them; the text form
    decodes the actor only (the payload is printed as stored, so an undecodable payload still shows)."""
    if as_json:
        yield from map(_event_json, decode_rows(rows))
        return
    for row in rows:
        event = cast(EventRecord, dict(zip(listings.LOG_COLUMNS, row, strict=False)))
        yield _event_line(event, row[_ACTOR], row[_PAYLOAD])


def _followed_line(event: EventRecord) -> str:
    """A followed (decoded) event as a text line: its actor and payload in their canonical stored form."""
    def text(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    return _event_line(event, text(event["actor"]), text(event["payload"]))


# --- status ------------------------------------------------------------------------------------------------


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
    from ..status import MAX_TOP

    value = int(text)
    if not 0 <= value <= MAX_TOP:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_TOP}")
    return value


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    parser.add_argument("--top", type=_top, default=10, metavar="N",
                        help="rooms and replicas listed (the fullest, the most behind; default 10, at most 500)")
    parser.add_argument("--warn-percent", type=_percent, default=80.0,
                        help="warn (exit 1) when a limit (live rooms, their bytes of the gateway budget, the fullest "
                        "room, replicas, in-flight deliveries) is used to this percent (default 80)")
    parser.add_argument("--critical-percent", type=_percent, default=95.0,
                        help="critical (exit 2) when one of those limits is used to this percent (default 95)")
    parser.add_argument("--warn-backlog-age", type=_limit_seconds, metavar="SECONDS",
                        help="warn when the oldest unfinished ledger item is this old (default: not checked)")
    parser.add_argument("--critical-backlog-age", type=_limit_seconds, metavar="SECONDS",
                        help="critical when the oldest unfinished ledger item is this old (default: not checked)")
    parser.add_argument("--warn-lag", type=non_negative_int, metavar="EVENTS",
                        help="warn when a replica lags more than this many events (0: any lag; default: not "
                        "checked)")
    parser.add_argument("--critical-lag", type=non_negative_int, metavar="EVENTS",
                        help="critical when a replica lags more than this many events (0: any lag; default: not "
                        "checked)")
    parser.add_argument("--schema-behind", choices=("ok", "warning", "critical"), default="warning",
                        help="the verdict when the store's schema is not this installation's head (default warning)")


def _status(args: argparse.Namespace, out: TextIO) -> int:
    """``hostedrooms status``: exit 0 ok, 1 warning, 2 critical, 3 unknown (the store could not be read, or an
    option is invalid); an unknown's error is its one line on stdout (``UNKNOWN: ...``, or the JSON)."""
    from ..status import EXIT_CODES, UNKNOWN, Thresholds, assess, perfdata, store_status

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
        # Said once, on stdout (what a monitoring system reads): an error line on stderr too showed it twice.
        return EXIT_CODES[UNKNOWN]
    verdict = assess(status, thresholds)
    if args.json:
        out.write(json.dumps({**verdict, "target": target, "status": status}, ensure_ascii=True) + "\n")
    else:
        _status_screen(target, status, verdict, perfdata(status, thresholds), out)
    return verdict["exit_code"]


STATUS = Command("status", "a store's limits, ledger backlog and replica lag in one read; exit 0 ok, 1 warning, "
                 "2 critical, 3 unknown", _status, _status_arguments)


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
        f"bytes       {_use(room_status['bytes'])} of the gateway budget (MAX_GATEWAY_EVENT_BYTES, every room "
        f"together); {room_status['disbanded_bytes']:,} in disbanded rooms",
        f"room bytes  {_use(room_status['most_bytes'])} of the per-room cap (MAX_ROOM_EVENT_BYTES, each room "
        "alone), in the room with the most",
    ]
    out.write("".join(terminal_text(line) + "\n" for line in lines))
    out.write("\nrooms closest to their per-room limits (events of MAX_EVENTS_PER_ROOM, bytes of "
              "MAX_ROOM_EVENT_BYTES)\n")
    print_table([(room["room_id"], _use(room["events"]), _use(room["bytes"])) for room in room_status["fullest"]],
                ("ROOM", "EVENTS OF ROOM CAP", "BYTES OF ROOM CAP"), out)
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


#: This module's commands.
COMMANDS = (ROOMS, LOG, REPLICAS, DELIVERIES, STATUS)
