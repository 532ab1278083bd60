"""Rooms and their append-only event log, with authority fencing (the native service).

Every public function takes an :class:`~sqlalchemy.Engine` first, then the reference implementation's keyword
arguments, validates all of them before touching the database, runs in one transaction (one
:class:`~hostedrooms.uow.UnitOfWork`) and returns the reference's dict shapes, errors and messages.

Limits (``MAX_*``) are read at call time from ``limits=`` (default: :mod:`hostedrooms.limits`), so tests and
operators can lower them, and the compat facade passes its own module so lowering a limit there works too.

Concurrency
-----------
SQLite serialises write transactions (``BEGIN IMMEDIATE``). On PostgreSQL (READ COMMITTED):

* writers to one room serialise on that room's row (``SELECT ... FOR UPDATE``, always the first lock taken);
  writers to different rooms do not block each other;
* ``create_room`` serialises on a room-creation advisory lock, which makes the active-room cap exact and turns
  a concurrent create of the same id into the idempotent replay;
* the gateway-wide byte limit is a sum over every room, which no row lock protects. Writers take a *shared*
  advisory lock on the gateway budget (sharers never block each other) and count how many transactions hold it
  (``n``, themselves included). A writer adding ``b`` bytes proceeds only if
  ``committed + b + (n - 1) * max_event_bytes <= limit``: every transaction that could commit alongside it either
  committed before its sum was read or held the lock when it counted, and none of those adds more than
  ``max_event_bytes`` (writers adding more take the exclusive path). Of any set of concurrent writers the one that
  locked last therefore saw room for all of them, so the committed total never exceeds the limit. A writer that
  does not fit (near the limit, or a big batch) restarts its transaction holding the lock *exclusively*: it
  waits for every sharer, sees the exact total, and then behaves exactly like the reference (prune disbanded
  rooms, then refuse). Pruning and disbanding always run exclusively, so two pruners never delete the same rows.
  Lock order is always: room-creation lock, room row, gateway budget lock, so no cycle can form.

The common append takes a shorter path to the same end (:func:`_fast_append`): one ``UPDATE ... RETURNING``
checks the fence and room limits, allocates the seqs, locks the row and (PostgreSQL) takes the budget lock shared
and counts the sharers; one ``INSERT`` adds the events, on PostgreSQL only if the gateway total read by that
later statement leaves the sharers' slack. Whatever does not fit rolls back and takes the full path.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Select, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from . import limits as default_limits
from . import models
from .dialect import StoreDialect
from .engines import EngineSource, resolve_engine
from .errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    EventConflictError,
    HostedRoomError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    StorageError,
)
from .statements import HotStatement
from .uow import UnitOfWork
from .validation import (
    INT64_MAX,
    MAX_EPOCH,
    bounded_int,
    canonical_json,
    canonical_json_sized,
    clock,
    identifier,
    json_depth_within,
    max_json_depth,
    stored_json,
    utf8_len,
)

__all__ = [
    "CONTROL_EVENT_KINDS",
    "EVENT_KINDS_BY_ACTOR",
    "GATEWAY_BYTES_LOCK_KEY",
    "ROOM_CREATION_LOCK_KEY",
    "EngineSource",
    "NeedExclusiveGatewayLock",
    "PreparedEvent",
    "RoomTransaction",
    "append_event",
    "append_events",
    "claim_authority",
    "create_room",
    "disband_room",
    "event_page_checker",
    "event_to_dict",
    "list_rooms",
    "max_event_bytes",
    "payload_json",
    "prune_disbanded_rooms",
    "read_events",
    "rename_room",
    "request_room_stop",
    "room_state",
    "room_stop_event",
    "room_to_dict",
    "run_room_write",
    "system_actor_json",
    "user_event_id",
    "validate_actor_id",
    "validate_event_id",
    "validate_event_kind",
    "validate_members",
    "validate_room_id",
    "validate_room_name",
]

#: A namespace of ``MAX_*`` / ``CONTROL_*`` constants (a module or SimpleNamespace), read at call time.
Limits = Any
#: A row as a mapping: a SQLAlchemy RowMapping or a plain dict of column values.
RowLike = Mapping[Any, Any]

#: Advisory lock keys ("hosted" + n); 1 is the migration lock.
GATEWAY_BYTES_LOCK_KEY = 0x686F737465640002
ROOM_CREATION_LOCK_KEY = 0x686F737465640003

_EVENT_KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
CONTROL_EVENT_KINDS = frozenset({"authority.claimed", "authority.lost", "room.disbanded", "room.stop_requested"})
EVENT_KINDS_BY_ACTOR: Mapping[str, frozenset[str]] = {
    "user": frozenset({"message.user"}),
    "member": frozenset({"message.member"}),
    "gateway": frozenset({
        "member.unavailable", "room.activity", "room.stop_requested", "turn.deferred", "turn.reassigned",
        "turn.cancelled", "turn.failed", "turn.settled", "turn.started"}),
    "system": frozenset({
        "authority.claimed", "authority.lost", "room.created", "room.disbanded", "room.members_changed",
        "room.renamed"}),
}
# (field, name of the limit bounding it)
_OPTIONAL_ACTOR_FIELDS = (
    ("display_name", "MAX_ACTOR_LABEL_CHARS"), ("profile", "MAX_ACTOR_ID_CHARS"),
    ("connection_id", "MAX_ACTOR_ID_CHARS"))
_ACTOR_FIELDS = frozenset({"kind", "id", *(field for field, _ in _OPTIONAL_ACTOR_FIELDS)})
_EVENT_FIELDS = frozenset({"event_id", "kind", "actor", "payload"})

_HISTORY_FULL = "This Group Chat reached its history limit. Start a new Group Chat to continue."
_ROOM_FULL = "This Group Chat reached its storage limit. Start a new Group Chat to continue."
_GATEWAY_FULL = "Group Chat storage is full on this host. Delete an old Group Chat and try again."
_TOO_MANY_ROOMS = "This host has too many active Group Chats. Delete one and try again."
_SEQUENCE_FENCE = "hosted room sequence advance lost its write fence"

_rooms = models.rooms
_events = models.events
_retired = models.retired_ids
# Rows of a purged room are deleted from these tables, in this order, before the room itself.
_DEPENDENT_TABLES = (models.remote_runs, models.links, models.peer_reservations, models.events)

_T = TypeVar("_T")

# Hot-path statements, built once (construction and cache-key generation are a large share of an append).
_SELECT_ROOM = select(*_rooms.c).where(_rooms.c.room_id == bindparam("room_id"))
_SELECT_EVENT = select(*_events.c).where(
    _events.c.room_id == bindparam("room_id"), _events.c.event_id == bindparam("event_id"))
_SELECT_RETIRED = select(_retired.c.room_id).where(_retired.c.room_id == bindparam("room_id"))
#: Accounted event bytes of every room on this gateway (live and disbanded).
_GATEWAY_TOTAL = select(func.coalesce(func.sum(_rooms.c.event_bytes), 0))
_SUM_EVENT_BYTES = HotStatement(_GATEWAY_TOTAL)
_HOT_INSERT_EVENT = HotStatement(insert(_events), column_keys=[column.name for column in _events.c])
_LOCK_ROOM: dict[str, Select[Any]] = {}
_all_rooms = _rooms.alias("all_rooms")
# The whole of an uncontended single append where writers are serialised (SQLite): one guarded UPDATE checks the
# authority fence, the room is live, the count and byte limits (the reserves already in the bound limits) and the
# gateway total, and allocates the seq. No row means "not this easy": the transaction is rolled back and the
# full path runs, so its errors and their precedence are the reference's.
_FAST_GUARDS = (
    _rooms.c.room_id == bindparam("fast_room_id"),
    _rooms.c.authority_gateway_id == bindparam("fast_gateway_id"),
    _rooms.c.authority_epoch == bindparam("fast_epoch"),
    _rooms.c.disbanded_at.is_(None),
    _rooms.c.next_seq <= bindparam("fast_max_events"),
    _rooms.c.event_bytes + bindparam("fast_size") <= bindparam("fast_max_room_bytes"))
_FAST_ADVANCE_ROOM = (
    update(_rooms)
    .values(next_seq=_rooms.c.next_seq + bindparam("fast_count"),
            event_bytes=_rooms.c.event_bytes + bindparam("fast_size"), updated_at=bindparam("fast_now"))
    .returning(_rooms.c.next_seq))
# Serialised writers (SQLite): the gateway total is exact inside the same UPDATE.
_FAST_ADVANCE = HotStatement(_FAST_ADVANCE_ROOM.where(
    *_FAST_GUARDS,
    select(func.coalesce(func.sum(_all_rooms.c.event_bytes), 0)).scalar_subquery() + bindparam("fast_size")
    <= bindparam("fast_max_gateway_bytes")))
# Concurrent writers (PostgreSQL): the same UPDATE also takes the gateway budget lock shared and counts its
# holders (after the room row: the documented lock order); the INSERT then adds the row only if the gateway total,
# read by that later statement (so after the sharers were counted), leaves room for the other sharers' slack.
_FAST_CONCURRENT: dict[str, HotStatement] = {}
_BUDGETED_INSERT_EVENT = HotStatement(insert(_events).from_select(
    [column.name for column in _events.c],
    select(*(bindparam(column.name, type_=column.type) for column in _events.c)).where(
        _GATEWAY_TOTAL.scalar_subquery() <= bindparam("budget"))))


def _fast_advance_concurrent(dialect: StoreDialect) -> HotStatement:
    stmt = _FAST_CONCURRENT.get(dialect.name)
    if stmt is None:
        stmt = _FAST_CONCURRENT[dialect.name] = HotStatement(_FAST_ADVANCE_ROOM.where(*_FAST_GUARDS).returning(
            *dialect.lock_shared_and_count(GATEWAY_BYTES_LOCK_KEY)))
    return stmt


# --- validation (pure; limits read at call time) -------------------------------------------------------------


def _lim(limits: Limits | None) -> Limits:
    return default_limits if limits is None else limits


def _identifier(value: Any, label: str, max_chars: int) -> str:
    return identifier(value, error=HostedRoomError, label=label, max_chars=max_chars)


def _room_id(value: Any, lim: Limits) -> str:
    return _identifier(value, "room_id", lim.MAX_ROOM_ID_CHARS)


def _event_id(value: Any, lim: Limits) -> str:
    return _identifier(value, "event_id", lim.MAX_EVENT_ID_CHARS)


def _actor_id(value: Any, label: str, lim: Limits) -> str:
    return _identifier(value, label, lim.MAX_ACTOR_ID_CHARS)


def _room_name(value: Any, lim: Limits) -> str:
    return identifier(
        value, error=HostedRoomError, label="name", max_chars=lim.MAX_ROOM_NAME_CHARS, pattern=None,
        invalid="invalid room name")


def _event_kind(value: Any, lim: Limits) -> str:
    return identifier(
        value, error=HostedRoomError, label="kind", max_chars=lim.MAX_EVENT_KIND_CHARS, pattern=_EVENT_KIND_RE,
        invalid="invalid event kind")


def _positive(value: Any, label: str) -> int:
    return bounded_int(
        value, error=HostedRoomError, message=f"{label} must be a positive integer", low=1, high=INT64_MAX)


def _epoch(value: Any, label: str, high: int = MAX_EPOCH) -> int:
    """A positive epoch of at most ``high`` (default MAX_EPOCH, so that the ``epoch + 1`` a claim or a promotion
    writes always fits 64 bits; a claim's expected epoch is bounded one lower)."""
    epoch = _positive(value, label)
    if epoch > high:
        raise HostedRoomError(f"{label} is beyond the largest authority epoch")
    return epoch


def _bounded_limit(value: Any, maximum: int) -> int:
    return bounded_int(value, error=HostedRoomError, message=f"limit must be between 1 and {maximum}", low=1,
                       high=maximum)


def _non_negative(value: Any, label: str) -> int:
    return bounded_int(value, error=HostedRoomError, message=f"{label} must be a non-negative integer", high=INT64_MAX)


def _actor_max_bytes(lim: Limits) -> int:
    # Not a constant of the reference module (it hard-codes 4 KiB), so a facade namespace may lack it.
    return int(getattr(lim, "MAX_ACTOR_JSON_BYTES", default_limits.MAX_ACTOR_JSON_BYTES))


def _actor_json(value: Any, lim: Limits) -> str:
    return canonical_json(value, error=HostedRoomError, label="actor", max_bytes=_actor_max_bytes(lim))


def _payload_json(value: Any, lim: Limits) -> str:
    return _payload_json_sized(value, lim)[0]


def _payload_json_sized(value: Any, lim: Limits) -> tuple[str, int]:
    return canonical_json_sized(value, error=HostedRoomError, label="payload", max_bytes=lim.MAX_EVENT_JSON_BYTES)


def _system_actor_json(actor_id: str, lim: Limits) -> str:
    return _actor_json({"kind": "system", "id": actor_id}, lim)


def _claim_payload_json(previous_gateway_id: str, new_gateway_id: str, epoch: int, lim: Limits) -> str:
    return _payload_json(
        {"previous_gateway_id": previous_gateway_id, "authority_gateway_id": new_gateway_id,
         "authority_epoch": epoch}, lim)


def _members(value: Any, lim: Limits) -> tuple[list[dict[str, Any]], str]:
    if not isinstance(value, list):
        raise HostedRoomError("members must be a list")
    if len(value) > lim.MAX_MEMBERS:
        raise HostedRoomError("too many room members")
    if not all(isinstance(member, dict) for member in value):
        raise HostedRoomError("each room member must be an object")
    members = [dict(member) for member in value]
    return members, canonical_json(members, error=HostedRoomError, label="members",
                                   max_bytes=lim.MAX_MEMBERS_JSON_BYTES)


def _actor(value: Any, *, kind: str, lim: Limits) -> tuple[dict[str, str], str]:
    if not isinstance(value, dict):
        raise HostedRoomError("actor must be an object")
    unknown = set(value) - _ACTOR_FIELDS
    if unknown:
        raise HostedRoomError(f"unknown actor fields: {', '.join(sorted(unknown))}")
    actor_kind = value.get("kind")
    if not isinstance(actor_kind, str) or actor_kind not in EVENT_KINDS_BY_ACTOR:
        raise HostedRoomError("invalid actor.kind")
    if kind not in EVENT_KINDS_BY_ACTOR[actor_kind]:
        raise HostedRoomError(f"actor kind '{actor_kind}' cannot append '{kind}'")
    actor = {"kind": actor_kind, "id": _actor_id(value.get("id"), "actor.id", lim)}
    for field, limit_name in _OPTIONAL_ACTOR_FIELDS:
        field_value = value.get(field)
        if field_value is None:
            continue
        if not isinstance(field_value, str):
            raise HostedRoomError(f"actor.{field} must be a string")
        field_value = field_value.strip()
        if len(field_value) > getattr(lim, limit_name):
            raise HostedRoomError(f"actor.{field} is too long")
        if field_value:
            actor[field] = field_value
    return actor, _actor_json(actor, lim)


def _legacy_members_match(existing_json: str, proposed: list[dict[str, Any]]) -> bool:
    """Adoption may add routing metadata (``target``) that an older room could not store."""
    try:
        existing = json.loads(existing_json)
    except (TypeError, ValueError, RecursionError):  # undecodable stored members match nothing
        return False
    if not isinstance(existing, list) or len(existing) != len(proposed):
        return False
    for previous, current in zip(existing, proposed, strict=True):
        if not isinstance(previous, dict):
            return False
        previous, current = dict(previous), dict(current)
        previous_target, current_target = previous.pop("target", None), current.pop("target", None)
        if previous != current or (previous_target not in (None, {}) and previous_target != current_target):
            return False
    return True


# Validation shared with the replica service (the same rules and messages as the reference's rooms).
validate_room_id = _room_id
validate_room_name = _room_name
validate_members = _members
validate_actor_id = _actor_id
validate_event_id = _event_id
validate_event_kind = _event_kind
system_actor_json = _system_actor_json
payload_json = _payload_json


def user_event_id(client_event_id: Any, *, limits: Limits | None = None) -> str:
    """Map a client retry key into the server-owned user-event namespace."""
    client = _event_id(client_event_id, _lim(limits))
    return f"user:{hashlib.sha256(client.encode('utf-8')).hexdigest()}"


def max_event_bytes(limits: Limits | None = None) -> int:
    """The most bytes one validated event can account for (ids and kinds are ASCII)."""
    lim = _lim(limits)
    return int(lim.MAX_EVENT_ID_CHARS + lim.MAX_EVENT_KIND_CHARS + _actor_max_bytes(lim) + lim.MAX_EVENT_JSON_BYTES)


@dataclass(slots=True)
class PreparedEvent:
    """A validated event ready to insert: canonical texts, its epoch stamp and whether it is a control kind.

    Treat it as immutable (not frozen only because a frozen dataclass costs a batch append a tenth of its time).
    """

    event_id: str
    kind: str
    actor_json: str
    payload_json: str
    authority_epoch: int | None
    control: bool = False
    #: Accounted bytes: event_id + kind + actor_json + payload_json in UTF-8 (computed once, when not given).
    size: int = dataclass_field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if self.size < 0:
            self.size = utf8_len(self.event_id, self.kind, self.actor_json, self.payload_json)

    def same_content(self, row: RowLike) -> bool:
        """Whether a stored event row carries exactly this immutable content."""
        stored = (row["kind"], row["actor_json"], row["authority_epoch"], row["payload_json"])
        return stored == (self.kind, self.actor_json, self.authority_epoch, self.payload_json)


class _BatchMemo:
    """What repeats across one batch's items, validated once: kinds by their text, actors by their value (a batch
    usually has one author and a few kinds), plus the batch's already validated authority.

    A memo must never change what is stored, so it is keyed by value, never by object identity (an item Mapping
    may build a fresh actor on each access, and a freed object's id is reused), and only for actors whose
    content cannot change or lie: a plain dict of exact ``str`` keys and ``str``/None values. Anything else is
    validated on its own, every time.
    """

    __slots__ = ("actors", "epoch", "gateway_id", "kinds")

    def __init__(self, gateway_id: str, epoch: int) -> None:
        self.gateway_id, self.epoch = gateway_id, epoch
        self.kinds: dict[str, str] = {}
        self.actors: dict[tuple[str, tuple[tuple[str, str | None], ...]], tuple[dict[str, str], str]] = {}

    def kind(self, value: Any, lim: Limits) -> str:
        if type(value) is not str:
            return _event_kind(value, lim)
        checked = self.kinds.get(value)
        if checked is None:
            checked = self.kinds[value] = _event_kind(value, lim)
        return checked

    def actor(self, value: Any, kind: str, lim: Limits) -> tuple[dict[str, str], str]:
        content = _actor_memo_key(value)
        if content is None:
            return _actor(value, kind=kind, lim=lim)
        key = (kind, content)
        known = self.actors.get(key)
        if known is None:
            known = self.actors[key] = _actor(value, kind=kind, lim=lim)
        return known


def _actor_memo_key(value: Any) -> tuple[tuple[str, str | None], ...] | None:
    """An immutable copy of ``value``'s items when it is a plain dict of exact strings (None values allowed),
    the only actors the batch memo may key by value; None otherwise."""
    if type(value) is not dict or len(value) > len(_ACTOR_FIELDS):
        return None
    items = tuple(value.items())
    for name, field_value in items:
        if type(name) is not str or (type(field_value) is not str and field_value is not None):
            return None
    return items


# --- row mappers -----------------------------------------------------------------------------------------------


def room_to_dict(row: RowLike, *, idempotent: bool = False) -> dict[str, Any]:
    """The reference's room dict; ``disbanded_at`` when set and ``latest_seq`` when ``next_seq`` was selected."""
    members = stored_json(row["members_json"], lambda: f"hosted room {row['room_id']!r}")
    result: dict[str, Any] = {
        "room_id": row["room_id"], "name": row["name"], "members": members,
        "authority_gateway_id": row["authority_gateway_id"], "authority_epoch": int(row["authority_epoch"]),
        "revision": int(row["revision"]), "created_at": float(row["created_at"]),
        "updated_at": float(row["updated_at"]), "idempotent": idempotent}
    if row.get("disbanded_at") is not None:
        result["disbanded_at"] = float(row["disbanded_at"])
    if "next_seq" in row:
        result["latest_seq"] = int(row["next_seq"]) - 1
    return result


def event_to_dict(row: RowLike, *, idempotent: bool = False) -> dict[str, Any]:
    """The reference's event dict (actor and payload parsed from their canonical JSON; :func:`stored_json`)."""
    epoch = row["authority_epoch"]

    def where() -> str:
        return f"hosted room {row['room_id']!r} event seq {int(row['seq'])}"

    return {
        "room_id": row["room_id"], "seq": int(row["seq"]), "event_id": row["event_id"], "kind": row["kind"],
        "actor": stored_json(row["actor_json"], where), "authority_epoch": int(epoch) if epoch is not None else None,
        "payload": stored_json(row["payload_json"], where), "created_at": float(row["created_at"]),
        "idempotent": idempotent}


def _appended(row: RowLike, actor: dict[str, str], payload: Any = None) -> dict[str, Any]:
    """The event dict of a row this call just wrote: its normalised actor as given (never re-parsed), and its
    payload parsed from the canonical text unless the caller parsed it already."""
    return {
        "room_id": row["room_id"], "seq": row["seq"], "event_id": row["event_id"], "kind": row["kind"],
        "actor": actor, "authority_epoch": row["authority_epoch"],
        "payload": json.loads(row["payload_json"]) if payload is None else payload,
        "created_at": row["created_at"], "idempotent": False}


def _parse_all(texts: Sequence[str]) -> list[Any]:
    """Parse many canonical JSON texts at once: one parser call for the lot is several times faster than one
    per text (each is a complete JSON value we wrote, so joining them makes one valid array)."""
    parsed: list[Any] = json.loads(f"[{','.join(texts)}]")
    return parsed


def _require_authority(room: RowLike, gateway_id: str, epoch: int, message: str) -> None:
    if room["authority_gateway_id"] != gateway_id or int(room["authority_epoch"]) != epoch:
        raise AuthorityConflictError(message)


# --- the write transaction -------------------------------------------------------------------------------------


class NeedExclusiveGatewayLock(Exception):
    """Internal signal: restart the transaction holding the gateway byte-budget lock exclusively."""


class RoomTransaction:
    """One room write transaction: the unit of work, the limits in force, and the gateway budget lock state.

    Reusable in-transaction helpers for other services (replicas): :meth:`lock_room`, :meth:`require_room`,
    :meth:`load_events`, :meth:`check_capacity`, :meth:`append_locked`, :meth:`prune_disbanded`,
    :meth:`gateway_event_bytes`, :meth:`lock_room_creation`, :meth:`check_room_slot`. Use :func:`run_room_write` to
    run a body with the retry into exclusive mode, or pass ``exclusive=True`` to skip the shared fast path.
    """

    def __init__(self, uow: UnitOfWork, limits: Limits | None = None, *, exclusive: bool = False) -> None:
        self.uow = uow
        self.limits = _lim(limits)
        # Where writers never overlap (SQLite) the budget is always exact: behave as the exclusive holder.
        self.exclusive = exclusive or not uow.dialect.concurrent_writers
        self._gateway_locked = False
        self._holders = 1

    # -- locks and reads --

    def lock_room_creation(self) -> None:
        """Serialise room creation (exact active-room cap; concurrent creates of one id replay)."""
        self.uow.dialect.serialize(self.uow.connection, ROOM_CREATION_LOCK_KEY)

    def _lock_gateway(self) -> int:
        """Take the gateway budget lock (once); return how many transactions may add bytes alongside."""
        if not self._gateway_locked:
            connection = self.uow.connection
            if self.exclusive:
                self.uow.dialect.serialize(connection, GATEWAY_BYTES_LOCK_KEY)
            else:
                self._holders = self.uow.dialect.serialize_shared(connection, GATEWAY_BYTES_LOCK_KEY)
            self._gateway_locked = True
        return 1 if self.exclusive else self._holders

    def lock_room(self, room_id: str) -> RowLike | None:
        """Every column of a room (live or disbanded), row-locked until the transaction ends; None if absent."""
        dialect = self.uow.dialect
        stmt = _LOCK_ROOM.get(dialect.name)
        if stmt is None:
            stmt = _LOCK_ROOM[dialect.name] = dialect.for_update(_SELECT_ROOM)
        return self.uow.connection.execute(stmt, {"room_id": room_id}).mappings().first()

    def is_retired(self, room_id: str) -> bool:
        """Whether ``room_id`` is permanently retired."""
        return self.uow.connection.execute(_SELECT_RETIRED, {"room_id": room_id}).first() is not None

    def require_room(
        self, row: RowLike | None, room_id: str, *, include_disbanded: bool = False
    ) -> RowLike:
        """``row`` if it is a (live) room, else the reference's not-found or history-expired error."""
        return _require_room(self.uow, row, room_id, include_disbanded=include_disbanded)

    def load_event(self, room_id: str, event_id: str) -> RowLike | None:
        """One event row by id, or None."""
        params = {"room_id": room_id, "event_id": event_id}
        return self.uow.connection.execute(_SELECT_EVENT, params).mappings().first()

    def load_events(self, room_id: str, event_ids: Sequence[str]) -> dict[str, RowLike]:
        """Event rows by id (only those that exist)."""
        stmt = select(*_events.c).where(_events.c.room_id == room_id, _events.c.event_id.in_(list(event_ids)))
        return {row["event_id"]: row for row in self.uow.connection.execute(stmt).mappings()}

    def gateway_event_bytes(self) -> int:
        """Accounted event bytes of every room on this gateway (live and disbanded)."""
        total = _SUM_EVENT_BYTES.first(self.uow.connection, {})
        return int(total[0]) if total is not None else 0

    # -- capacity --

    def check_room_slot(self) -> None:
        """Refuse one more active room beyond MAX_ACTIVE_ROOMS (exact under :meth:`lock_room_creation`)."""
        active = self.uow.connection.execute(
            select(func.count()).select_from(_rooms).where(_rooms.c.disbanded_at.is_(None))).scalar_one()
        if int(active) >= self.limits.MAX_ACTIVE_ROOMS:
            raise HostedRoomError(_TOO_MANY_ROOMS)

    def check_capacity(
        self, room: RowLike, events: Sequence[PreparedEvent], *, uncounted_room_bytes: int = 0
    ) -> None:
        """Refuse ``events`` (appended in order) beyond the room's count/byte limits or the gateway's bytes.

        Control kinds may use the control reserves. When the gateway total would overflow, disbanded rooms are
        pruned first (exclusive mode only; in shared mode :class:`NeedExclusiveGatewayLock` is raised instead).
        ``uncounted_room_bytes``: bytes ``room`` already holds that the gateway total does not count yet (a room
        about to be inserted with a copied log); they must fit the gateway without the control reserve.
        """
        lim = self.limits
        count, room_bytes = int(room["next_seq"]) - 1, int(room["event_bytes"])
        for event in events:
            count_reserve, byte_reserve = (
                (lim.CONTROL_EVENT_COUNT_RESERVE, lim.CONTROL_EVENT_BYTE_RESERVE) if event.control else (0, 0))
            if count >= lim.MAX_EVENTS_PER_ROOM + count_reserve:
                raise HostedRoomError(_HISTORY_FULL)
            size = event.size
            if room_bytes + size > lim.MAX_ROOM_EVENT_BYTES + byte_reserve:
                raise HostedRoomError(_ROOM_FULL)
            count, room_bytes = count + 1, room_bytes + size
        steps = [(event.size, event.control) for event in events]
        self._check_gateway([(uncounted_room_bytes, False), *steps] if uncounted_room_bytes else steps)

    def _check_gateway(self, steps: Sequence[tuple[int, bool]]) -> None:
        """``steps``: the (bytes, control) additions in order."""
        lim = self.limits
        per_writer = max_event_bytes(lim)
        if not self.exclusive and sum(size for size, _ in steps) > per_writer:
            raise NeedExclusiveGatewayLock  # sharers may only add what the others' slack assumed
        slack = (self._lock_gateway() - 1) * per_writer
        current = self.gateway_event_bytes()
        added = 0
        for size, control in steps:
            added += size
            limit = lim.MAX_GATEWAY_EVENT_BYTES + (lim.CONTROL_EVENT_BYTE_RESERVE if control else 0)
            if current + added + slack <= limit:
                continue
            if not self.exclusive:
                raise NeedExclusiveGatewayLock
            if self.prune_disbanded(now=None, max_gateway_event_bytes=max(0, limit - added), current_bytes=current):
                current = self.gateway_event_bytes()
            if current + added > limit:
                raise HostedRoomError(_GATEWAY_FULL)

    # -- writes --

    def append_locked(
        self,
        room: RowLike,
        events: Sequence[PreparedEvent],
        *,
        now: float,
        values: dict[str, Any] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        error: BaseException | None = None,
        check: bool = True,
    ) -> list[dict[str, Any]]:
        """Capacity-check, then append ``events`` at the room's next seqs under a fenced room update.

        ``room`` must come from :meth:`lock_room` in this transaction. The room update advances ``next_seq`` and
        ``event_bytes`` and sets ``updated_at`` plus ``values``, guarded by ``next_seq`` and ``where``; unless
        exactly one row changes, ``error`` is raised (default: a RuntimeError). Returns the inserted rows as dicts.
        """
        if check:
            self.check_capacity(room, events)
        room_id, first_seq = room["room_id"], int(room["next_seq"])
        stmt = (
            update(_rooms)
            .where(_rooms.c.room_id == room_id, _rooms.c.next_seq == first_seq, *where)
            .values(next_seq=first_seq + len(events),
                    event_bytes=_rooms.c.event_bytes + sum(event.size for event in events),
                    updated_at=now, **(values or {})))
        self.uow.fenced(stmt, error if error is not None else RuntimeError(_SEQUENCE_FENCE))
        rows = [
            {"room_id": room_id, "seq": first_seq + index, "event_id": event.event_id, "kind": event.kind,
             "actor_json": event.actor_json, "authority_epoch": event.authority_epoch,
             "payload_json": event.payload_json, "created_at": now}
            for index, event in enumerate(events)]
        _insert_events(self.uow.connection, rows)
        return rows

    def retire(self, room_ids: Sequence[str]) -> None:
        """Reserve the ids of these disbanded rooms permanently (retired_at = disbanded_at)."""
        rows = self.uow.connection.execute(
            select(_rooms.c.room_id, _rooms.c.disbanded_at.label("retired_at"))
            .where(_rooms.c.room_id.in_(list(room_ids)), _rooms.c.disbanded_at.is_not(None))).mappings().all()
        if rows:
            stmt = self.uow.dialect.insert(_retired).on_conflict_do_nothing(index_elements=[_retired.c.room_id])
            self.uow.connection.execute(stmt, [dict(row) for row in rows])

    def prune_disbanded(
        self, *, now: float | None, max_gateway_event_bytes: int | None = None, current_bytes: int | None = None
    ) -> int:
        """Purge disbanded rooms past retention (when ``now`` is given), beyond the tombstone cap, and (oldest
        first) while the gateway holds more than ``max_gateway_event_bytes``; their ids stay retired.

        Takes the gateway budget lock exclusively (pruners must not interleave); returns the rooms purged.
        """
        if not self.exclusive:
            raise NeedExclusiveGatewayLock
        self._lock_gateway()
        lim, connection = self.limits, self.uow.connection
        disbanded = _rooms.c.disbanded_at.is_not(None)
        room_order = self.uow.dialect.bytewise(_rooms.c.room_id)
        candidates: set[str] = set()
        if now is not None:
            cutoff = now - lim.DISBANDED_ROOM_RETENTION_SECONDS
            candidates.update(connection.execute(
                select(_rooms.c.room_id).where(disbanded, _rooms.c.disbanded_at <= cutoff)).scalars())
        candidates.update(connection.execute(
            select(_rooms.c.room_id).where(disbanded).order_by(_rooms.c.disbanded_at.desc(), room_order.asc())
            .offset(lim.MAX_DISBANDED_ROOM_TOMBSTONES)).scalars())
        if max_gateway_event_bytes is not None:
            retained = self.gateway_event_bytes() if current_bytes is None else current_bytes
            if retained > max_gateway_event_bytes:
                oldest_first = connection.execute(
                    select(_rooms.c.room_id, _rooms.c.event_bytes).where(disbanded)
                    .order_by(_rooms.c.disbanded_at.asc(), room_order.asc()))
                for room_id, room_bytes in oldest_first:
                    candidates.add(room_id)
                    retained -= int(room_bytes)
                    if retained <= max_gateway_event_bytes:
                        break
        if not candidates:
            return 0
        room_ids = sorted(candidates)
        self.retire(room_ids)
        for table in _DEPENDENT_TABLES:
            connection.execute(delete(table).where(table.c.room_id.in_(room_ids)))
        connection.execute(delete(_rooms).where(_rooms.c.room_id.in_(room_ids)))
        return len(room_ids)


def _require_room(
    uow: UnitOfWork, row: RowLike | None, room_id: str, *, include_disbanded: bool = False
) -> RowLike:
    if row is not None and (include_disbanded or row["disbanded_at"] is None):
        return row
    # A retained disband tombstone still has replayable history; only a purged, retired id has expired.
    if row is None:
        retired = uow.connection.execute(_SELECT_RETIRED, {"room_id": room_id}).first()
        if retired is not None:
            raise RoomHistoryExpiredError("Group Chat history expired; room_id remains permanently retired")
    raise RoomNotFoundError("hosted room not found")


def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


def run_room_write(
    engine: EngineSource, limits: Limits | None, body: Callable[[RoomTransaction], _T], *, exclusive: bool = False
) -> _T:
    """Run ``body`` in one committed write transaction; if it needs the gateway budget lock exclusively, run it
    again from the start holding it (the first attempt rolled back completely)."""
    bound = _resolve(engine)
    while True:
        try:
            with UnitOfWork(bound) as uow:
                result = body(RoomTransaction(uow, limits, exclusive=exclusive))
                uow.commit()
                return result
        except NeedExclusiveGatewayLock:
            if exclusive:  # pragma: no cover - exclusive transactions never raise it
                raise
            exclusive = True


# --- rooms -----------------------------------------------------------------------------------------------------


def create_room(
    engine: EngineSource, *, room_id: Any, name: Any, members: Any, authority_gateway_id: Any,
    now: float | None = None, limits: Limits | None = None,
) -> dict[str, Any]:
    """Create a room, or return the identical existing room idempotently (adopting a 'legacy' room)."""
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    name = _room_name(name, lim)
    normalized_members, members_json = _members(members, lim)
    gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    timestamp = clock(now)

    def body(tx: RoomTransaction) -> dict[str, Any]:
        tx.lock_room_creation()
        if tx.is_retired(room_id):
            raise RoomConflictError("room_id belongs to a disbanded room")
        existing = tx.lock_room(room_id)
        if existing is not None:
            return _existing_room(tx, existing, name, normalized_members, members_json, gateway_id, timestamp)
        tx.check_room_slot()
        tx.uow.connection.execute(insert(_rooms).values(
            room_id=room_id, name=name, members_json=members_json, authority_gateway_id=gateway_id,
            authority_epoch=1, next_seq=1, event_bytes=0, revision=1, created_at=timestamp, updated_at=timestamp,
            disbanded_at=None))
        # The reference's first-time result carries no latest_seq (its reload omits next_seq).
        return {
            "room_id": room_id, "name": name, "members": normalized_members, "authority_gateway_id": gateway_id,
            "authority_epoch": 1, "revision": 1, "created_at": timestamp, "updated_at": timestamp,
            "idempotent": False}

    return run_room_write(engine, lim, body)


def _existing_room(
    tx: RoomTransaction, existing: RowLike, name: str, members: list[dict[str, Any]], members_json: str,
    gateway_id: str, now: float,
) -> dict[str, Any]:
    if existing["disbanded_at"] is not None:
        raise RoomConflictError("room_id belongs to a disbanded room")
    legacy_adoption = existing["authority_gateway_id"] == "legacy" and gateway_id != "legacy"
    members_match = existing["members_json"] == members_json or (
        legacy_adoption and _legacy_members_match(existing["members_json"], members))
    if existing["name"] != name or not members_match:
        raise RoomConflictError("room_id already exists with different state")
    if legacy_adoption:
        return _adopt_legacy_room(tx, existing, members_json=members_json, gateway_id=gateway_id, now=now)
    if existing["authority_gateway_id"] != gateway_id:
        raise RoomConflictError("room_id already belongs to a different authority")
    return room_to_dict(existing, idempotent=True)


def _adopt_legacy_room(
    tx: RoomTransaction, existing: RowLike, *, members_json: str, gateway_id: str, now: float
) -> dict[str, Any]:
    """Claim a 'legacy'-authority room for a real gateway with a fenced claim event at epoch + 1."""
    previous_epoch = int(existing["authority_epoch"])
    if previous_epoch >= MAX_EPOCH:  # only a row written outside hostedrooms can be there
        raise HostedRoomError("legacy room authority_epoch is beyond the largest authority epoch")
    target_epoch = previous_epoch + 1
    claim = PreparedEvent(
        "system:authority-adopted", "authority.claimed", _system_actor_json("authority-control", tx.limits),
        _claim_payload_json("legacy", gateway_id, target_epoch, tx.limits), target_epoch, control=True)
    [row] = tx.append_locked(
        existing, [claim], now=now,
        values={"members_json": members_json, "authority_gateway_id": gateway_id, "authority_epoch": target_epoch,
                "revision": _rooms.c.revision + 1},
        where=[_rooms.c.authority_gateway_id == "legacy", _rooms.c.authority_epoch == previous_epoch,
               _rooms.c.disbanded_at.is_(None)],
        error=AuthorityConflictError("legacy room adoption lost its fence"))
    adopted = {**existing, "members_json": members_json, "authority_gateway_id": gateway_id,
               "authority_epoch": target_epoch, "next_seq": int(existing["next_seq"]) + 1,
               "revision": int(existing["revision"]) + 1, "updated_at": now}
    return {**room_to_dict(adopted, idempotent=True), "adopted": True, "claim_event": event_to_dict(row)}


def list_rooms(
    engine: EngineSource, *, include_disbanded: bool = False, limit: int | None = None, offset: int = 0,
    limits: Limits | None = None,
) -> list[dict[str, Any]]:
    """One bounded read-only page ordered by most recent change (``limit`` defaults to MAX_ROOM_LIST_LIMIT)."""
    lim = _lim(limits)
    maximum = lim.MAX_ROOM_LIST_LIMIT
    page_size = _bounded_limit(maximum if limit is None else limit, maximum)
    skip = _non_negative(offset, "offset")
    with UnitOfWork(_resolve(engine), write=False) as uow:
        stmt = select(*_rooms.c)
        if not include_disbanded:
            stmt = stmt.where(_rooms.c.disbanded_at.is_(None))
        stmt = stmt.order_by(_rooms.c.updated_at.desc(), uow.dialect.bytewise(_rooms.c.room_id).asc())
        rows = uow.connection.execute(stmt.limit(page_size).offset(skip)).mappings().all()
    return [room_to_dict(row) for row in rows]


def room_state(
    engine: EngineSource, *, room_id: Any, include_disbanded: bool = False, limits: Limits | None = None
) -> dict[str, Any]:
    """Durable replay and authority state for one room, with the claim event of its current epoch if any."""
    room_id = _room_id(room_id, _lim(limits))
    with UnitOfWork(_resolve(engine), write=False) as uow:
        found = uow.connection.execute(_SELECT_ROOM, {"room_id": room_id}).mappings().first()
        row = _require_room(uow, found, room_id, include_disbanded=include_disbanded)
        claim = uow.connection.execute(
            select(*_events.c).where(
                _events.c.room_id == room_id, _events.c.kind == "authority.claimed",
                _events.c.authority_epoch == int(row["authority_epoch"]))
            .order_by(_events.c.seq.desc()).limit(1)).mappings().first()
    state = room_to_dict(row)
    if claim is not None:
        state["authority_claim"] = event_to_dict(claim)
    return state


def rename_room(
    engine: EngineSource, *, room_id: Any, event_id: Any, name: Any, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Rename a live room and append its ``room.renamed`` replay event atomically (no authority fence)."""
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    event_id = _event_id(event_id, lim)
    name = _room_name(name, lim)
    timestamp = clock(now)
    actor_json = _system_actor_json("room-control", lim)
    payload_json = _payload_json({"name": name}, lim)

    def body(tx: RoomTransaction) -> dict[str, Any]:
        room = tx.require_room(tx.lock_room(room_id), room_id, include_disbanded=True)
        if room["disbanded_at"] is not None:
            raise RoomNotFoundError("hosted room not found")
        existing = tx.load_event(room_id, event_id)
        if existing is not None:
            if existing["kind"] != "room.renamed" or existing["payload_json"] != payload_json:
                raise EventConflictError("event_id already exists with different immutable content")
            return {**room_to_dict(room, idempotent=True), "event": event_to_dict(existing, idempotent=True)}
        event = PreparedEvent(event_id, "room.renamed", actor_json, payload_json, int(room["authority_epoch"]))
        [row] = tx.append_locked(room, [event], now=timestamp, values={"name": name, "revision": _rooms.c.revision + 1})
        updated = {**room, "name": name, "next_seq": int(room["next_seq"]) + 1,
                   "revision": int(room["revision"]) + 1, "updated_at": timestamp}
        return {**room_to_dict(updated), "event": event_to_dict(row)}

    return run_room_write(engine, lim, body)


# --- events ----------------------------------------------------------------------------------------------------


def _validated_event(
    event_id: Any, kind: Any, actor: Any, payload: Any, authority_gateway_id: Any, authority_epoch: Any, lim: Limits,
    memo: _BatchMemo | None = None,
) -> tuple[PreparedEvent, dict[str, str], str, int]:
    """Validate one event in the reference's order (the first problem reported is the same); returns the event,
    the normalised actor, and the validated authority gateway id and epoch (taken from ``memo`` when given)."""
    checked_id = _event_id(event_id, lim)
    if memo is None:
        checked_kind = _event_kind(kind, lim)
        normalized_actor, actor_json = _actor(actor, kind=checked_kind, lim=lim)
        # Every admitted actor kind is room-scoped, so authority fields are always required.
        gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    else:
        checked_kind = memo.kind(kind, lim)
        normalized_actor, actor_json = memo.actor(actor, checked_kind, lim)
        gateway_id = memo.gateway_id
    if normalized_actor["kind"] == "gateway" and normalized_actor["id"] != gateway_id:
        raise HostedRoomError("gateway actor.id must match authority_gateway_id")
    epoch = _epoch(authority_epoch, "authority_epoch") if memo is None else memo.epoch
    if not isinstance(payload, dict):
        raise HostedRoomError("payload must be an object")
    payload_json, payload_size = _payload_json_sized(payload, lim)
    # Ids and kinds are ASCII (their shapes say so): their lengths are their byte sizes.
    size = len(checked_id) + len(checked_kind) + utf8_len(actor_json) + payload_size
    event = PreparedEvent(
        checked_id, checked_kind, actor_json, payload_json, epoch, control=checked_kind in CONTROL_EVENT_KINDS,
        size=size)
    return event, normalized_actor, gateway_id, epoch


def append_event(
    engine: EngineSource, *, room_id: Any, event_id: Any, kind: Any, actor: Any, payload: Any,
    authority_gateway_id: Any = None, authority_epoch: Any = None, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Append one immutable event at the room's next sequence number under the authority fence.

    Repeating an ``event_id`` with identical content returns the original (even after the room was disbanded
    or its authority moved, as the reference does); different content raises EventConflictError.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    event, normalized_actor, gateway_id, epoch = _validated_event(
        event_id, kind, actor, payload, authority_gateway_id, authority_epoch, lim)
    timestamp = clock(now)
    bound = _resolve(engine)
    try:
        [row] = run_room_write(bound, lim, lambda tx: _fast_append(tx, room_id, [event], gateway_id, timestamp))
        return _appended(row, normalized_actor)
    except _TakeFullPath:
        pass  # a replay, a conflict, a stale authority or a limit: the full path decides which

    def body(tx: RoomTransaction) -> dict[str, Any]:
        # Lock the room first: a concurrent append of the same event_id then waits and replays it.
        locked = tx.lock_room(room_id)
        existing = tx.load_event(room_id, event.event_id)
        if existing is not None:
            if not event.same_content(existing):
                raise EventConflictError("event_id already exists with different content")
            return event_to_dict(existing, idempotent=True)
        room = tx.require_room(locked, room_id)
        _require_authority(room, gateway_id, epoch, "stale hosted room authority")
        [row] = tx.append_locked(room, [event], now=timestamp)
        return _appended(row, normalized_actor)

    return run_room_write(bound, lim, body)


class _TakeFullPath(Exception):
    """Internal signal: the fast append did not apply; roll back and take the full path."""


def _fast_append(
    tx: RoomTransaction, room_id: str, events: Sequence[PreparedEvent], gateway_id: str, now: float
) -> list[dict[str, Any]]:
    """Append ``events`` with one guarded UPDATE ... RETURNING and one INSERT, or raise :class:`_TakeFullPath`.

    The UPDATE checks the authority fence, that the room is live and its count and byte limits, and allocates the
    seqs; where writers are serialised (SQLite) it checks the gateway total too. Where they run concurrently
    (PostgreSQL) the gateway budget is then checked as the full path does (shared budget lock, sharers' slack),
    but only the common case passes here. A batch holding a control kind takes the full path (the reserves apply
    per event); otherwise checking the batch's last event against the limits is checking each of them, since
    counts and bytes only grow. A stored (or repeated) event_id surfaces as the unique constraint. Whatever does
    not apply here rolls back, and the full path then replays, refuses or reports it with the reference's errors.
    """
    lim = tx.limits
    control = events[0].control
    if len(events) > 1 and any(event.control for event in events):
        raise _TakeFullPath
    count_reserve, byte_reserve = (
        (lim.CONTROL_EVENT_COUNT_RESERVE, lim.CONTROL_EVENT_BYTE_RESERVE) if control else (0, 0))
    count, size = len(events), sum(event.size for event in events)
    gateway_limit = lim.MAX_GATEWAY_EVENT_BYTES + byte_reserve
    serialised = tx.exclusive
    if not serialised and size > max_event_bytes(lim):
        raise _TakeFullPath  # a sharer may add only what the other sharers' slack assumed
    connection = tx.uow.connection
    advance = _FAST_ADVANCE if serialised else _fast_advance_concurrent(tx.uow.dialect)
    advanced = advance.first(connection, {
        "fast_room_id": room_id, "fast_gateway_id": gateway_id, "fast_epoch": events[0].authority_epoch,
        "fast_count": count, "fast_max_events": lim.MAX_EVENTS_PER_ROOM + count_reserve - count + 1,
        "fast_size": size, "fast_max_room_bytes": lim.MAX_ROOM_EVENT_BYTES + byte_reserve,
        "fast_max_gateway_bytes": gateway_limit, "fast_now": now})
    if advanced is None:
        raise _TakeFullPath
    first_seq = int(advanced[0]) - count
    rows = [
        {"room_id": room_id, "seq": first_seq + index, "event_id": event.event_id, "kind": event.kind,
         "actor_json": event.actor_json, "authority_epoch": event.authority_epoch,
         "payload_json": event.payload_json, "created_at": now}
        for index, event in enumerate(events)]
    try:
        if serialised:
            _insert_events(connection, rows)
        else:
            # The total read now includes this transaction's own bytes: committed + size + slack <= limit.
            budget = gateway_limit - (int(advanced[2]) - 1) * max_event_bytes(lim)
            if len(rows) == 1:
                if _BUDGETED_INSERT_EVENT.rowcount(connection, {**rows[0], "budget": budget}) != 1:
                    raise _TakeFullPath
            else:
                if tx.gateway_event_bytes() > budget:
                    raise _TakeFullPath
                _insert_events(connection, rows)
    except IntegrityError as exc:  # an event_id exists (or repeats): replays or a conflict
        raise _TakeFullPath from exc
    return rows


def _insert_events(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if len(rows) == 1:
        _HOT_INSERT_EVENT.rowcount(connection, rows[0])
    else:
        _HOT_INSERT_EVENT.run_many(connection, rows)


def append_events(
    engine: EngineSource, room_id: Any, events: Any, authority_gateway_id: Any, authority_epoch: Any,
    now: float | None = None, *, limits: Limits | None = None,
) -> list[dict[str, Any]]:
    """Append many events to one room in one transaction: all or nothing, at contiguous seqs, in order.

    Each item is a mapping with ``event_id``, ``kind``, ``actor`` and ``payload`` validated as
    :func:`append_event` does. An item whose ``event_id`` already exists (or repeats an earlier item) with the
    same content is a replay (returned with ``idempotent: True`` and its original seq); different content
    raises EventConflictError and nothing is written. At most MAX_LOG_LIMIT items.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    epoch = _epoch(authority_epoch, "authority_epoch")
    if not isinstance(events, (list, tuple)) or not events:
        raise HostedRoomError("events must be a non-empty list")
    if len(events) > lim.MAX_LOG_LIMIT:
        raise HostedRoomError("too many events")
    prepared: list[tuple[PreparedEvent, dict[str, str]]] = []
    memo = _BatchMemo(gateway_id, epoch)
    for item in events:
        if not isinstance(item, Mapping):
            raise HostedRoomError("each event must be an object")
        if not item.keys() <= _EVENT_FIELDS:
            unknown = sorted(str(name) for name in item.keys() - _EVENT_FIELDS)
            raise HostedRoomError(f"unknown event fields: {', '.join(unknown)}")
        event, actor, _, _ = _validated_event(
            item.get("event_id"), item.get("kind"), item.get("actor"), item.get("payload"), gateway_id, epoch, lim,
            memo)
        prepared.append((event, actor))
    timestamp = clock(now)
    bound = _resolve(engine)
    try:
        batch = [event for event, _ in prepared]
        rows = run_room_write(bound, lim, lambda tx: _fast_append(tx, room_id, batch, gateway_id, timestamp))
        payloads = _parse_all([row["payload_json"] for row in rows])
        return [_appended(row, dict(actor), payload)
                for row, (_, actor), payload in zip(rows, prepared, payloads, strict=True)]
    except _TakeFullPath:
        pass  # replays, a conflict, a control kind, a stale authority or a limit: the full path decides

    def body(tx: RoomTransaction) -> list[dict[str, Any]]:
        locked = tx.lock_room(room_id)
        stored = tx.load_events(room_id, [event.event_id for event, _ in prepared])
        fresh: dict[str, PreparedEvent] = {}
        for event, _ in prepared:
            seen = stored.get(event.event_id)
            earlier = fresh.get(event.event_id)
            if (seen is not None and not event.same_content(seen)) or (earlier is not None and earlier != event):
                raise EventConflictError("event_id already exists with different content")
            if seen is None and earlier is None:
                fresh[event.event_id] = event
        written: dict[str, dict[str, Any]] = {}
        if fresh:
            room = tx.require_room(locked, room_id)
            _require_authority(room, gateway_id, epoch, "stale hosted room authority")
            written = {row["event_id"]: row for row in tx.append_locked(room, list(fresh.values()), now=timestamp)}
        results: list[dict[str, Any]] = []
        returned: set[str] = set()
        for event, actor in prepared:
            if event.event_id in written and event.event_id not in returned:
                results.append(_appended(written[event.event_id], dict(actor)))
            else:
                results.append(event_to_dict(stored.get(event.event_id) or written[event.event_id], idempotent=True))
            returned.add(event.event_id)
        return results

    return run_room_write(bound, lim, body)


def read_events(
    engine: EngineSource, *, room_id: Any, since_seq: Any = 0, limit: Any = 100, include_disbanded: bool = False,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """A monotonic page of the room log after ``since_seq`` whose whole serialized form fits MAX_LOG_PAGE_BYTES.

    A stored event that cannot be decoded (written before MAX_JSON_DEPTH, by the reference or by hand) raises
    StorageError naming the room and seq; a room purged while it is read raises RoomHistoryExpiredError.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    since = _non_negative(since_seq, "since_seq")
    page_size = _bounded_limit(limit, lim.MAX_LOG_LIMIT)
    page_bytes = int(lim.MAX_LOG_PAGE_BYTES)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        found = uow.connection.execute(
            select(_rooms.c.next_seq, _rooms.c.authority_gateway_id, _rooms.c.authority_epoch,
                   _rooms.c.disbanded_at).where(_rooms.c.room_id == room_id)).mappings().first()
        room = _require_room(uow, found, room_id, include_disbanded=include_disbanded)
        latest_seq = int(room["next_seq"]) - 1
        authority = {"gateway_id": room["authority_gateway_id"], "epoch": int(room["authority_epoch"])}
        if since > latest_seq:
            raise HostedRoomError("since_seq is ahead of the hosted room log")
        rows = uow.connection.execute(_page_query(uow, room_id, since, latest_seq, page_size, page_bytes)).mappings()
        events = [event_to_dict(row) for row in rows]
        if not events and since < latest_seq:
            # PostgreSQL reads each statement at its own snapshot: the room may have been purged (disbanded, then
            # pruned) after its row was read. Read it again, so that is reported as such.
            again = uow.connection.execute(select(_rooms.c.room_id, _rooms.c.disbanded_at).where(
                _rooms.c.room_id == room_id)).mappings().first()
            _require_room(uow, again, room_id, include_disbanded=include_disbanded)

    def build(page: list[dict[str, Any]]) -> dict[str, Any]:
        cursor = page[-1]["seq"] if page else since
        return {"events": page, "cursor": cursor, "latest_seq": latest_seq, "has_more": cursor < latest_seq,
                "authority": authority}

    def fits(page: list[dict[str, Any]]) -> bool:
        try:
            text = json.dumps(build(page), ensure_ascii=False, separators=(",", ":"))
        except RecursionError:  # a decodable but very deep value stored before MAX_JSON_DEPTH (or by the reference)
            raise _unserialisable(room_id, page) from None
        return utf8_len(text) <= page_bytes

    if events and not fits(events):
        # Binary-search the largest prefix whose serialized page fits the budget.
        low, high = 1, len(events)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(events[:middle]) else (low, middle - 1)
        events = events[:low]
        if not fits(events):
            raise HostedRoomError("hosted room event exceeds replay page limit")
    elif not events and since < latest_seq:
        # The next event alone outweighs a page (only with a lowered MAX_LOG_PAGE_BYTES); an empty page with
        # has_more would make a reader spin forever.
        raise HostedRoomError("hosted room event exceeds replay page limit")
    return build(events)


def event_page_checker(limits: Limits | None = None) -> Callable[[RowLike], str | None]:
    """A function telling why no replay page could ever return a stored event row (or a replica could not ingest
    it), or None when the row is fine. Used by ``verify`` on room logs and replica logs, one call per row.

    The event's id and kind must pass the append rules as stored, its actor and payload must decode within
    MAX_JSON_DEPTH, and the event alone must fit MAX_LOG_PAGE_BYTES in the largest page envelope (a cursor and
    latest_seq of 19 digits, the longest gateway id).
    """
    lim = _lim(limits)
    depth = max_json_depth()
    budget = int(lim.MAX_LOG_PAGE_BYTES) - len(json.dumps({
        "events": [], "cursor": INT64_MAX, "latest_seq": INT64_MAX, "has_more": False,
        "authority": {"gateway_id": "g" * int(lim.MAX_ACTOR_ID_CHARS), "epoch": INT64_MAX}}, separators=(",", ":")))
    # Serialised again, a decoded text grows at most 4.5 times (a float "1e15" is written 1000000000000000.0), and
    # the event's other fields (keys, room id, seq, epoch, time) take well under 1 KiB: below that, it fits.
    surely_fits = (budget - 1024) // 5

    def problem(row: RowLike) -> str | None:
        for label, value, validate in (("event_id", row["event_id"], _event_id), ("kind", row["kind"], _event_kind)):
            try:
                if validate(value, lim) != value:
                    return f"its {label} does not pass the append rules"
            except HostedRoomError:
                return f"its {label} does not pass the append rules"
        texts = (row["actor_json"], row["payload_json"])
        for column, text in zip(("actor_json", "payload_json"), texts, strict=True):
            if not isinstance(text, str) or not json_depth_within(text, depth):
                return f"its {column} is not JSON within {depth} levels of nesting"
        try:
            if utf8_len(row["room_id"], row["event_id"], row["kind"], *texts) <= surely_fits:
                json.loads(texts[0])
                json.loads(texts[1])
                return None
            event = json.dumps(event_to_dict(row), ensure_ascii=False, separators=(",", ":"))
        except (StorageError, RecursionError, ValueError, TypeError):
            return "its actor or payload cannot be decoded"
        return "it alone exceeds the replay page limit" if utf8_len(event) > budget else None

    return problem


def _unserialisable(room_id: str, page: Sequence[dict[str, Any]]) -> StorageError:
    """The error for a page that decoded but cannot be serialised (RecursionError), naming the first culprit."""
    for event in page:
        try:
            json.dumps(event)
        except RecursionError:
            return StorageError(f"hosted room {room_id!r} event seq {event['seq']} holds a stored value that "
                                "cannot be decoded (RecursionError)")
    return StorageError(f"hosted room {room_id!r} holds a stored value that cannot be decoded (RecursionError)")


def _page_query(uow: UnitOfWork, room_id: str, since: int, latest_seq: int, page_size: int, page_bytes: int) -> Any:
    """Events after ``since`` (at most ``page_size``) while their running raw byte sum fits ``page_bytes``."""
    size = (uow.dialect.byte_length(_events.c.event_id) + uow.dialect.byte_length(_events.c.kind)
            + uow.dialect.byte_length(_events.c.actor_json) + uow.dialect.byte_length(_events.c.payload_json))
    # seq <= latest_seq keeps the page consistent with the room row read just before (PostgreSQL reads each
    # statement at its own snapshot, so later appends could otherwise show up beyond latest_seq).
    candidates = (
        select(*_events.c, func.sum(size).over(order_by=_events.c.seq).label("cumulative_bytes"))
        .where(_events.c.room_id == room_id, _events.c.seq > since, _events.c.seq <= latest_seq)
        .order_by(_events.c.seq).limit(page_size).cte("candidates"))
    return (select(*(candidates.c[column.name] for column in _events.c))
            .where(candidates.c.cumulative_bytes <= page_bytes).order_by(candidates.c.seq))


def request_room_stop(
    engine: EngineSource, *, room_id: Any, cancel_id: Any, expected_gateway_id: Any, expected_epoch: Any,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Append an idempotent ``room.stop_requested`` fence that supersedes earlier user turns (wall clock)."""
    lim = _lim(limits)
    stop = room_stop_event(cancel_id=cancel_id, expected_gateway_id=expected_gateway_id,
                           expected_epoch=expected_epoch, limits=lim)
    return append_event(engine, room_id=room_id, **stop, limits=lim)


def room_stop_event(
    *, cancel_id: Any, expected_gateway_id: Any, expected_epoch: Any, limits: Limits | None = None
) -> dict[str, Any]:
    """The :func:`append_event` keyword arguments (but ``room_id``) of a stop request; validates ``cancel_id``.

    The seed-compatible facade passes them to its module's ``append_event``, looked up at call time.
    """
    cancel = _identifier(cancel_id, "cancel_id", _lim(limits).MAX_EVENT_ID_CHARS)
    return {"event_id": f"room-stop:{hashlib.sha256(cancel.encode()).hexdigest()[:32]}",
            "kind": "room.stop_requested", "actor": {"kind": "gateway", "id": expected_gateway_id},
            "payload": {"cancel_id": cancel}, "authority_gateway_id": expected_gateway_id,
            "authority_epoch": expected_epoch}


# --- authority and lifecycle -----------------------------------------------------------------------------------


def claim_authority(
    engine: EngineSource, *, room_id: Any, expected_gateway_id: Any, expected_epoch: Any, new_gateway_id: Any,
    event_id: Any, now: float | None = None, limits: Limits | None = None,
) -> dict[str, Any]:
    """Move authority with a compare-and-swap of the epoch and an ``authority.claimed`` event.

    It does not decide *when* takeover is safe. An exact retry replays; a retry after a later claim raises
    AuthoritySupersededError; a claim from a stale authority raises AuthorityConflictError.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    expected_gateway = _actor_id(expected_gateway_id, "expected_gateway_id", lim)
    new_gateway = _actor_id(new_gateway_id, "new_gateway_id", lim)
    claim_id = _event_id(event_id, lim)
    expected = _epoch(expected_epoch, "expected_epoch", MAX_EPOCH - 1)
    timestamp = clock(now)
    target_epoch = expected + 1
    claim = PreparedEvent(
        claim_id, "authority.claimed", _system_actor_json("authority-control", lim),
        _claim_payload_json(expected_gateway, new_gateway, target_epoch, lim), target_epoch, control=True)

    def body(tx: RoomTransaction) -> dict[str, Any]:
        room = tx.require_room(tx.lock_room(room_id), room_id)
        existing = tx.load_event(room_id, claim_id)
        if existing is not None:
            if not claim.same_content(existing):
                raise EventConflictError("event_id already exists with different content")
            if room["authority_gateway_id"] != new_gateway or int(room["authority_epoch"]) != target_epoch:
                raise AuthoritySupersededError("authority claim succeeded but was later superseded")
            replay = room_to_dict(_live(room), idempotent=True)
            return {**replay, "claim_event": event_to_dict(existing, idempotent=True)}
        _require_authority(room, expected_gateway, expected, "hosted room authority changed")
        [row] = tx.append_locked(
            room, [claim], now=timestamp,
            values={"authority_gateway_id": new_gateway, "authority_epoch": _rooms.c.authority_epoch + 1,
                    "revision": _rooms.c.revision + 1},
            where=[_rooms.c.disbanded_at.is_(None), _rooms.c.authority_gateway_id == expected_gateway,
                   _rooms.c.authority_epoch == expected],
            error=AuthorityConflictError("hosted room authority changed"))
        claimed = {**room, "authority_gateway_id": new_gateway, "authority_epoch": target_epoch,
                   "next_seq": int(room["next_seq"]) + 1, "revision": int(room["revision"]) + 1,
                   "updated_at": timestamp}
        return {**room_to_dict(_live(claimed)), "claim_event": event_to_dict(row)}

    return run_room_write(engine, lim, body)


def _live(room: RowLike) -> dict[str, Any]:
    # The reference's claim result is read without disbanded_at (the room is live anyway).
    return {key: value for key, value in room.items() if key != "disbanded_at"}


def disband_room(
    engine: EngineSource, *, room_id: Any, expected_gateway_id: Any, expected_epoch: Any, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Tombstone a room with a fenced ``room.disbanded`` event and retire its id permanently (idempotent)."""
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    expected_gateway = _actor_id(expected_gateway_id, "expected_gateway_id", lim)
    expected = _epoch(expected_epoch, "expected_epoch")
    timestamp = clock(now)
    payload_json = _payload_json({"room_id": room_id}, lim)
    actor_json = _system_actor_json("room-control", lim)

    def body(tx: RoomTransaction) -> dict[str, Any]:
        room = tx.lock_room(room_id)
        replay = _disband_replay(tx, room_id, room)
        if replay is not None:
            return replay
        assert room is not None  # _disband_replay raised or replayed otherwise
        _require_authority(room, expected_gateway, expected, "stale hosted room authority")
        event = PreparedEvent(
            "system:room-disbanded", "room.disbanded", actor_json, payload_json, int(room["authority_epoch"]),
            control=True)
        [row] = tx.append_locked(
            room, [event], now=timestamp, values={"disbanded_at": timestamp, "revision": _rooms.c.revision + 1},
            where=[_rooms.c.disbanded_at.is_(None), _rooms.c.authority_gateway_id == expected_gateway,
                   _rooms.c.authority_epoch == expected],
            error=RoomConflictError("hosted room disband lost its fence"))
        tx.retire([room_id])
        tx.prune_disbanded(now=timestamp, max_gateway_event_bytes=tx.limits.MAX_GATEWAY_EVENT_BYTES)
        return {"room_id": room_id, "disbanded_at": timestamp, "idempotent": False, "event": event_to_dict(row)}

    # Disband prunes, and pruners must not interleave: hold the gateway budget lock exclusively from the start.
    return run_room_write(engine, lim, body, exclusive=True)


def _disband_replay(tx: RoomTransaction, room_id: str, room: RowLike | None) -> dict[str, Any] | None:
    """The idempotent replay for a retired or already-disbanded room; None when the room is live."""
    if room is None:
        retired_at = tx.uow.connection.execute(
            select(_retired.c.retired_at).where(_retired.c.room_id == room_id)).scalar()
        if retired_at is None:
            raise RoomNotFoundError("hosted room not found")
        return {"room_id": room_id, "disbanded_at": float(retired_at), "idempotent": True, "history_expired": True}
    if room["disbanded_at"] is None:
        return None
    tx.retire([room_id])
    event = tx.load_event(room_id, "system:room-disbanded")
    replay: dict[str, Any] = {"room_id": room_id, "disbanded_at": float(room["disbanded_at"]), "idempotent": True}
    if event is not None:
        replay["event"] = event_to_dict(event, idempotent=True)
    return replay


def prune_disbanded_rooms(engine: EngineSource, *, now: float | None = None, limits: Limits | None = None) -> int:
    """Purge disbanded rooms past retention or beyond the tombstone cap; their ids stay retired forever."""
    timestamp = clock(now)
    return run_room_write(engine, limits, lambda tx: tx.prune_disbanded(now=timestamp), exclusive=True)
