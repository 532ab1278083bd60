"""Integrity verifier: checks every invariant the store relies on and reports the violations found.

Each check is one aggregate query, or one streamed scan where a rule needs Python (decoding stored JSON): nothing
is loaded whole, and everything runs in one read-only transaction, so a large database is verified in bounded
memory and without taking the write lock. ``verify`` changes nothing.

:func:`repair_budget` is the one repair here: it re-derives the gateway budget's shards from the rooms' stored
``event_bytes`` (what ``check_budget`` compares them with) when they disagree, as a writer holding every shard
does (:mod:`hostedrooms.rooms.transaction`).

``expect_heads`` adds the check no invariant can make: that events a reader remembers are still there, as they
were. After a failover onto an asynchronous standby the log can be contiguous and every invariant hold while
acknowledged events are gone and their seqs hold other events (:mod:`hostedrooms.lineage`); a remembered head
(room, seq, event id, and the content where given) that is gone or different is reported as ``expected_head``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from .backends import Backend, backend_for
from .db import Target, create_engine
from .errors import HostedRoomError, InvalidInputError
from .limits import Limits, in_force
from .queries import integrity as reads
from .rooms import RoomTransaction, event_page_checker, run_room_write, validate_event_id, validate_room_id
from .uow import UnitOfWork
from .validation import json_depth_within, max_json_depth


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, which row (room id, envelope id, ...), and what is wrong."""

    check: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.subject}: {self.detail}"


Check = Callable[[Connection, Backend], Iterable[Violation]]


def check_room_seqs(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """Every room's seqs run 1..next_seq-1 with no gap and no extra."""
    for room_id, next_seq, n, lo, hi in reads.room_seq_mismatches(connection):
        yield Violation("room_seqs", room_id,
                        f"{n} events with seqs {lo}..{hi}, expected 1..{next_seq - 1} contiguous")


def check_orphan_events(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """No event belongs to a room that does not exist."""
    for room_id, n in reads.orphan_events(connection):
        yield Violation("orphan_events", room_id, f"{n} events without a room")


def check_event_bytes(connection: Connection, backend: Backend) -> Iterator[Violation]:
    """Each room's ``event_bytes`` equals the UTF-8 bytes of its events' id, kind, actor and payload."""
    for room_id, stored, actual in reads.event_bytes_mismatches(connection, backend):
        yield Violation("event_bytes", room_id, f"event_bytes is {stored}, events hold {actual} bytes")


def check_event_ids_unique(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """An event id names at most one event per room."""
    for room_id, event_id, n in reads.duplicate_event_ids(connection):
        yield Violation("event_ids_unique", room_id, f"event_id {event_id!r} stored {n} times")


def check_event_epochs(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """No event carries an epoch above its room's current authority epoch."""
    for room_id, seq, event_epoch, room_epoch in reads.events_above_room_epoch(connection):
        yield Violation("event_epochs", room_id, f"seq {seq} at epoch {event_epoch} above the room's {room_epoch}")


def check_disbanded_retired(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """Every disbanded room's id is permanently retired."""
    for (room_id,) in reads.disbanded_rooms_not_retired(connection):
        yield Violation("disbanded_retired", room_id, "disbanded room's id is not retired")


def check_replica_logs(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """A replica holds exactly seqs 1..last_seq, and never claims more than the authority's latest_seq."""
    for room_id, last_seq, latest_seq, n, lo, hi in reads.replica_log_mismatches(connection):
        yield Violation("replica_log", room_id,
                        f"last_seq {last_seq} (latest_seq {latest_seq}) but {n} events with seqs {lo}..{hi}")
    for room_id, n in reads.orphan_replica_events(connection):
        yield Violation("replica_log", room_id, f"{n} replica events without a replica")


def check_readable_events(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """Every event of a room log or a replica log could be returned by a replay page and ingested by a replica:
    its id and kind pass the append rules, its actor and payload decode within MAX_JSON_DEPTH, and it fits a
    page alone (see :func:`hostedrooms.rooms.event_page_checker`). A readable event's actor and payload texts are
    also canonical JSON (``canonical_events``, ``canonical_replica_events``; one scan for both checks)."""
    problem_of = event_page_checker()
    for replica, name in ((False, "readable_events"), (True, "readable_replica_events")):
        canonical = name.replace("readable", "canonical")
        for row in reads.scan_events(connection, replica=replica):
            problem = problem_of(row)
            if problem is not None:
                yield Violation(name, row["room_id"], f"seq {row['seq']}: {problem}")
            elif (column := _non_canonical(row)) is not None:
                yield Violation(canonical, row["room_id"], f"seq {row['seq']}: its {column} is not canonical JSON")


#: What hostedrooms and the reference store for an actor or payload: sorted keys, no whitespace, non-ASCII as is.
#: (NaN and Infinity stay allowed here: the reference stored them, written so, and a page writes them back so.)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _non_canonical(row: sa.RowMapping) -> str | None:
    """The first of a decodable event's actor and payload texts that is not the canonical text of its value.

    Both hostedrooms and the reference store only canonical text, and the byte accounting (``event_bytes``, a
    page's running byte sum) and the replay page's size bound take its stored bytes for the bytes a page writes.
    Other text (hand-written, or by another program) is still read correctly, but is counted for bytes no page
    carries: a sign the row did not come through the API."""
    for column in ("actor_json", "payload_json"):
        text = row[column]
        if _CANONICAL(json.loads(text)) != text:
            return column
    return None


def _readable_json(text: Any, depth: int) -> bool:
    if not isinstance(text, str) or not json_depth_within(text, depth):
        return False
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def check_ledger_json(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """Every unfinished delivery's body and pending outbound intent's snapshot decodes within MAX_JSON_DEPTH: the
    ledger's queues skip rows that do not (finished rows are in no queue; the reference's own legacy repair fails
    undecodable intents), so they would otherwise wait unnoticed until they expire."""
    depth = max_json_depth()
    for row in reads.scan_unfinished_delivery_bodies(connection):
        if not _readable_json(row["body_json"], depth):
            yield Violation("ledger_json", row["envelope_id"], f"delivery body is not JSON within {depth} levels")
    for row in reads.scan_pending_outbound_snapshots(connection):
        if not _readable_json(row["snapshot_json"], depth):
            yield Violation("ledger_json", row["request_id"], f"outbound snapshot is not JSON within {depth} levels")


def check_delivery_owners(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """A queued id and a run id each own at most one delivery."""
    for column, owner, n in reads.delivery_owner_counts(connection):
        yield Violation("delivery_owners", str(owner), f"{column} owns {n} deliveries")


def check_delivery_states(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """Deliveries are in a known state, and a committed response names the request it answered."""
    for envelope_id, state in reads.unknown_delivery_states(connection):
        yield Violation("delivery_states", envelope_id, f"unknown state {state!r}")
    for (envelope_id,) in reads.committed_responses_without_request(connection):
        yield Violation("delivery_states", envelope_id, "response committed without a request id")


def check_budget(connection: Connection, _backend: Backend) -> Iterator[Violation]:
    """The gateway byte budget's shards account for exactly every room's ``event_bytes`` (live and disbanded),
    and their allowances promise no more than the limit they were spread for (or the total, when above it)."""
    used, allowance, limit = reads.budget_totals(connection)
    total = reads.room_bytes_total(connection)
    if int(used) != int(total):
        yield Violation("budget", "gateway", f"budget shards account for {used} bytes, rooms hold {total}")
    if int(allowance) > max(int(limit), int(used)):
        yield Violation("budget", "gateway",
                        f"budget allowances total {allowance} bytes, above the {limit} they were spread for")


def check_storage(connection: Connection, backend: Backend) -> Iterator[Violation]:
    """The database engine's own integrity check (SQLite ``PRAGMA integrity_check``)."""
    for problem in backend.integrity_problems(connection):
        yield Violation("storage", "database", problem)


CHECKS: tuple[Check, ...] = (
    check_room_seqs, check_orphan_events, check_event_bytes, check_event_ids_unique, check_event_epochs,
    check_readable_events, check_disbanded_retired, check_replica_logs, check_delivery_owners,
    check_delivery_states, check_ledger_json, check_budget, check_storage)


@dataclass(frozen=True)
class ExpectedHead:
    """An event a reader remembers (the last it read of a room): ``room_id``, ``seq``, ``event_id`` and, where
    known, its content (``kind``, ``actor``, ``authority_epoch``, ``payload``: compared when not None)."""

    room_id: str
    seq: int
    event_id: str
    kind: str | None = None
    actor: Any = None
    authority_epoch: int | None = None
    payload: Any = None

    @classmethod
    def of(cls, value: Any) -> ExpectedHead:
        """An ExpectedHead from itself, a ``(room_id, seq, event_id)`` tuple, ``"ROOM/SEQ/EVENT_ID"`` (room and
        event ids may hold ``:``, never ``/``) or an event dict as ``read_events`` returns it (its content is
        compared too); InvalidInputError (field ``expect_heads``) for anything else."""
        if isinstance(value, ExpectedHead):
            return value
        if isinstance(value, str):
            value = tuple(value.split("/"))
        if isinstance(value, Mapping):
            head = cls._checked(value.get("room_id"), value.get("seq"), value.get("event_id"))
            return cls(head.room_id, head.seq, head.event_id, value.get("kind"), value.get("actor"),
                       value.get("authority_epoch"), value.get("payload"))
        if isinstance(value, tuple) and len(value) == 3:
            return cls._checked(*value)
        raise InvalidInputError("an expected head is ROOM/SEQ/EVENT_ID, a (room_id, seq, event_id) tuple or an "
                                "event dict", field="expect_heads")

    @classmethod
    def _checked(cls, room_id: Any, seq: Any, event_id: Any) -> ExpectedHead:
        lim = in_force(None)
        if isinstance(seq, str) and seq.isascii() and seq.isdigit() and len(seq) <= 19:
            seq = int(seq)
        try:
            room = validate_room_id(room_id, lim)
            event = validate_event_id(event_id, lim)
        except HostedRoomError as exc:
            raise InvalidInputError(f"an expected head is invalid: {exc}", field="expect_heads") from None
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= 2**63 - 1:
            raise InvalidInputError("an expected head's seq must be a positive integer", field="expect_heads")
        return cls(room, seq, event)


def check_expected_head(connection: Connection, head: ExpectedHead) -> Iterator[Violation]:
    """The event ``head`` names is in the store (its rooms, else its replicas), the same event."""
    subject = f"{head.room_id} seq {head.seq}"
    row = reads.event_at(connection, head.room_id, head.seq)
    if row is None:
        yield Violation("expected_head", subject, f"event {head.event_id!r} is gone: the store holds no such seq "
                        "(a failover onto a standby that lacked it?)")
        return
    if row.event_id != head.event_id:
        yield Violation("expected_head", subject, f"holds event {row.event_id!r}, not the remembered "
                        f"{head.event_id!r}: the seq was reused (a failover onto a standby that lacked it?)")
        return
    differs = [name for name, stored, expected in (
        ("kind", row.kind, head.kind), ("authority_epoch", row.authority_epoch, head.authority_epoch),
        ("actor", _decoded(row.actor_json), head.actor), ("payload", _decoded(row.payload_json), head.payload))
        if expected is not None and stored != expected]
    if differs:
        yield Violation("expected_head", subject, f"event {head.event_id!r} has other content ({', '.join(differs)})")


def _decoded(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None


def verify(target: Target, *, progress: Callable[[str], Any] | None = None,
           expect_heads: Iterable[Any] = ()) -> list[Violation]:
    """Check every invariant of the hostedrooms store in ``target``; return the violations (empty: clean).

    ``progress`` (optional) is called with each check's name before it runs. A path or URL naming a SQLite
    file that does not exist raises :class:`~hostedrooms.errors.StoreMissingError`; nothing is created.
    ``expect_heads``: remembered events to find as they were (:class:`ExpectedHead`, ``(room_id, seq,
    event_id)``, ``"ROOM/SEQ/EVENT_ID"`` or an event dict; checked before anything is opened); one gone or
    different is an ``expected_head`` violation.

    :param target: the store: a path, a URL or an :class:`~sqlalchemy.Engine`.
    :param progress: called with each check's name before it runs, or None.
    :param expect_heads: remembered events that must still be stored as they were.
    :returns: the violations found; empty when the store is clean.
    :raises InvalidInputError: ``progress`` or ``expect_heads`` is invalid (nothing was opened).
    :raises StoreMissingError: a SQLite target does not exist.
    :raises StorageError: the store could not be read.
    """
    if progress is not None and not callable(progress):
        raise InvalidInputError("progress must be None or a callable taking a check's name", field="progress")
    if isinstance(expect_heads, str | bytes | Mapping) or not isinstance(expect_heads, Iterable):
        raise InvalidInputError("expect_heads must be an iterable of remembered events (ExpectedHead, (room_id, "
                                "seq, event_id), 'ROOM/SEQ/EVENT_ID' or an event dict)", field="expect_heads")
    heads = [ExpectedHead.of(head) for head in expect_heads]
    engine = create_engine(target, create=False)
    try:
        with UnitOfWork(engine, write=False) as uow:
            backend = backend_for(uow.connection)
            found: list[Violation] = []
            for check in CHECKS:
                if progress is not None:
                    progress(check.__name__.removeprefix("check_"))
                found.extend(check(uow.connection, backend))
            if heads and progress is not None:
                progress("expected_heads")
            for head in heads:
                found.extend(check_expected_head(uow.connection, head))
            return found
    finally:
        if not isinstance(target, Engine):
            engine.dispose()


@dataclass(frozen=True)
class BudgetRepair:
    """What :func:`repair_budget` found and changed: the violations ``check_budget`` reported under the lock (none:
    nothing was changed), the bytes the shards accounted for and what the rooms hold, and the allowances' sum
    before and after (spread for ``limit``)."""

    problems: tuple[Violation, ...]
    shards_used: int
    rooms_bytes: int
    allowance_before: int
    allowance_after: int
    limit: int

    @property
    def changed(self) -> bool:
        """Whether the shards were rewritten."""
        return bool(self.problems)


def repair_budget(target: Target, *, limits: Limits | None = None) -> BudgetRepair:
    """Re-derive the gateway budget's shards from the rooms when ``check_budget`` finds them wrong (a shard edited
    by hand, a bug); a clean budget is left as it is.

    One write transaction holding every budget shard (the exclusive mode of a room write, so no writer changes
    a room's bytes meanwhile): the shards' total becomes every room's ``event_bytes`` (live and disbanded) and
    the bytes free below ``limits``' ``MAX_GATEWAY_EVENT_BYTES`` are spread over them again, as after any
    exclusive write (a missing shard is restored). Returns what was found and changed. A path or URL naming a
    SQLite file that does not exist raises :class:`~hostedrooms.errors.StoreMissingError`.
    """
    limit = in_force(limits).MAX_GATEWAY_EVENT_BYTES
    engine = create_engine(target, create=False)

    def repair(tx: RoomTransaction) -> BudgetRepair:
        connection, store = tx.uow.connection, tx.store
        # Read before the lock only to tell a missing shard, which locking restores (and settles: a change too).
        shards, used, allowance = reads.budget_shards(connection)
        store.lock_budget(limit)
        problems = tuple(check_budget(connection, tx.uow.backend))
        if shards < store.budget_shards:
            problems = (*problems,
                        Violation("budget", "gateway", f"{store.budget_shards - shards} budget shard(s) missing"))
        else:  # every shard held: the shards as they are
            _, used, allowance = reads.budget_shards(connection)
        rooms_bytes = store.gateway_bytes()
        if problems:
            store.settle_budget(rooms_bytes, limit)
        return BudgetRepair(problems, used, rooms_bytes, allowance, reads.budget_shards(connection)[2], limit)

    try:
        return run_room_write(engine, limits, repair, exclusive=True)
    finally:
        if not isinstance(target, Engine):
            engine.dispose()
