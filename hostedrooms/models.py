"""Declarative models: the only place hostedrooms tables are defined.

Table and column names, nullability, defaults, keys and indexes follow the reference implementation's
DDL so existing ``state.db`` files can be adopted in place. Types are chosen to round-trip on SQLite and
PostgreSQL: room timestamps are float seconds (REAL / double precision), ledger timestamps are integer
seconds (64-bit), and JSON columns hold the canonical JSON *text* the services write, because byte
accounting and idempotency compare that exact text.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

#: Deterministic constraint and index names on every dialect (CHECK names are given per constraint).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite keeps the reference DDL's type names (REAL, INTEGER); PostgreSQL gets double precision and bigint.
Seconds: TypeEngine[float] = Double().with_variant(sqlite.REAL(), "sqlite")
Int64: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")


def _at_least(**minimums: int) -> tuple[CheckConstraint, ...]:
    # ``column >= minimum`` checks in keyword order, named ``<column>_positive`` (minimum 1) or
    # ``<column>_non_negative`` (minimum 0).
    return tuple(
        CheckConstraint(f"{column} >= {minimum}", name=f"{column}_{'positive' if minimum else 'non_negative'}")
        for column, minimum in minimums.items())


#: The partial index condition of ``idx_hosted_room_events_claims``; a query the index can serve repeats it with the
#: kind as this literal (a bound parameter would hide the match from SQLite's planner and PostgreSQL's generic plan).
CLAIM_KIND_CONDITION = "kind = 'authority.claimed'"


#: The ``info`` key of an index created on one dialect only: that dialect's name (see :func:`only_on`).
ONLY_ON = "hostedrooms.only_on"


def only_on(dialect: str, index: Index) -> Index:
    """``index``, created on ``dialect`` alone (``ddl_if``), and saying so in its public ``info`` for the
    migration environment's comparison, which does not read ``ddl_if``."""
    index.info[ONLY_ON] = dialect
    return index.ddl_if(dialect=dialect)


def _unique_when_set(name: str, column: str) -> Index:
    # A partial unique index over the rows where ``column`` is set, on both backends.
    where = text(f"{column} IS NOT NULL")
    return Index(name, column, unique=True, sqlite_where=where, postgresql_where=where)


class Base(DeclarativeBase):
    metadata = metadata
    # Each Python type has one column type: a ``Mapped[...]`` annotation alone declares the column.
    type_annotation_map = {str: Text, int: Int64, float: Seconds}


# --- rooms and the event log -------------------------------------------------------------------------


class Room(Base):
    """A hosted Group Chat room: identity, membership, authority lineage and log counters."""

    __tablename__ = "hosted_rooms"
    __table_args__ = (
        PrimaryKeyConstraint("room_id"),
        *_at_least(authority_epoch=1, next_seq=1, event_bytes=0, revision=1),
        # list_rooms orders by updated_at (then room_id): both planners walk this index and stop after the page
        # instead of sorting every room; rooms changed at the same instant are ordered by id among themselves.
        Index("idx_hosted_rooms_updated", "updated_at"),
    )

    room_id: Mapped[str]
    name: Mapped[str]
    members_json: Mapped[str]
    authority_gateway_id: Mapped[str]
    authority_epoch: Mapped[int] = mapped_column(server_default=text("1"))
    next_seq: Mapped[int] = mapped_column(server_default=text("1"))
    event_bytes: Mapped[int] = mapped_column(server_default=text("0"))
    revision: Mapped[int] = mapped_column(server_default=text("1"))
    created_at: Mapped[float]
    updated_at: Mapped[float]
    disbanded_at: Mapped[float | None]


class _LogEntry:
    """The columns of one entry of a room's log: the same in the room's own log and in a replica of it."""

    room_id: Mapped[str]
    seq: Mapped[int]
    event_id: Mapped[str]
    kind: Mapped[str]
    actor_json: Mapped[str]
    authority_epoch: Mapped[int | None]
    payload_json: Mapped[str]
    created_at: Mapped[float]


class RoomEvent(_LogEntry, Base):
    """One entry of a room's append-only log, at a contiguous per-room ``seq``."""

    __tablename__ = "hosted_room_events"
    __table_args__ = (
        PrimaryKeyConstraint("room_id", "seq"),
        UniqueConstraint("room_id", "event_id"),
        ForeignKeyConstraint(["room_id"], ["hosted_rooms.room_id"]),
        *_at_least(seq=1),
        CheckConstraint("authority_epoch IS NULL OR authority_epoch >= 1", name="authority_epoch_positive"),
        # Only its name is kept: the reference's own readiness check on SQLite asks for it by name. It would
        # duplicate the primary key's index, so it indexes no row (``WHERE 0``: no append writes to it, no query
        # plans with it; 0012). 0008 dropped it on PostgreSQL.
        only_on("sqlite", Index("idx_hosted_room_events_cursor", "room_id", "seq", sqlite_where=text("0"))),
        # room_state's claim lookup (the latest claim of an epoch) without walking the log: only claim events
        # are indexed, so appends of every other kind pay nothing for it.
        Index("idx_hosted_room_events_claims", "room_id", "authority_epoch", "seq",
              sqlite_where=text(CLAIM_KIND_CONDITION), postgresql_where=text(CLAIM_KIND_CONDITION)),
    )



class BudgetShard(Base):
    """One shard of the gateway's event-byte budget (an escrow): the shards' ``used`` sum to every room's
    ``event_bytes``; an append adds its bytes to one shard within that shard's ``allowance``, and the allowances
    were spread (by the last writer holding every shard) for a gateway limit of ``spread_limit``. See
    :mod:`hostedrooms.rooms.transaction`."""

    __tablename__ = "hosted_room_budget"
    __table_args__ = (
        PrimaryKeyConstraint("shard"),
        *_at_least(shard=0, used=0),
        CheckConstraint("used <= allowance", name="used_within_allowance"),
    )

    shard: Mapped[int] = mapped_column(autoincrement=False)
    used: Mapped[int] = mapped_column(server_default=text("0"))
    allowance: Mapped[int] = mapped_column(server_default=text("0"))
    spread_limit: Mapped[int] = mapped_column(server_default=text("0"))


class RetiredRoomId(Base):
    """A room id that may never name another Group Chat (kept after its history is pruned)."""

    __tablename__ = "hosted_room_retired_ids"
    __table_args__ = (PrimaryKeyConstraint("room_id"),)

    room_id: Mapped[str]
    retired_at: Mapped[float]


# --- peer routing state ------------------------------------------------------------------------------


class RoomLink(Base):
    """A private peer route for one room member. ``grant`` is a secret: never log or format it."""

    __tablename__ = "hosted_room_links"
    __table_args__ = (PrimaryKeyConstraint("room_id", "member_id"),)

    room_id: Mapped[str]
    member_id: Mapped[str]
    target_url: Mapped[str]
    target_profile: Mapped[str]
    grant: Mapped[str]
    catalog_json: Mapped[str]
    cancellation_scope_id: Mapped[str]
    trace_id: Mapped[str]
    transport_security: Mapped[str]
    status: Mapped[str] = mapped_column(server_default=text("'ready'"))
    updated_at: Mapped[float]

    def __repr__(self) -> str:  # the default repr would include the grant
        return f"RoomLink(room_id={self.room_id!r}, member_id={self.member_id!r}, status={self.status!r})"


#: The logical identity of a remote run, in primary-key order.
REMOTE_RUN_IDENTITY_COLUMNS = (
    "room_id",
    "home_install_id",
    "authority_gateway_id",
    "authority_epoch",
    "member_id",
    "target_install_id",
    "target_profile",
    "task_id",
    "execution_generation",
)


class RemoteRun(Base):
    """A receipt binding one logical remote task (the 9-column identity) to one run and session."""

    __tablename__ = "hosted_room_remote_runs"
    __table_args__ = (
        PrimaryKeyConstraint(*REMOTE_RUN_IDENTITY_COLUMNS),
        *_at_least(authority_epoch=1, execution_generation=1),
    )

    room_id: Mapped[str]
    home_install_id: Mapped[str]
    authority_gateway_id: Mapped[str]
    authority_epoch: Mapped[int]
    member_id: Mapped[str]
    task_id: Mapped[str]
    execution_generation: Mapped[int]
    target_install_id: Mapped[str]
    target_profile: Mapped[str]
    run_id: Mapped[str]
    session_id: Mapped[str]
    created_at: Mapped[float]
    updated_at: Mapped[float]


class RevokedGrant(Base):
    """A revoked grant scope (sha256 of its seven scope fields): grants issued before the fence are dead."""

    __tablename__ = "hosted_room_revoked_grants"
    __table_args__ = (PrimaryKeyConstraint("scope_key"),)

    scope_key: Mapped[str]
    expires_at: Mapped[float]
    revoked_before: Mapped[float]


class PeerReservation(Base):
    """A peer gateway's reservation of a room/profile at an authority epoch."""

    __tablename__ = "hosted_room_peer_reservations"
    __table_args__ = (PrimaryKeyConstraint("room_id", "member_id", "target_profile"), *_at_least(authority_epoch=1))

    room_id: Mapped[str]
    member_id: Mapped[str]
    target_profile: Mapped[str]
    authority_gateway_id: Mapped[str]
    authority_epoch: Mapped[int]
    expires_at: Mapped[float]
    revoked_at: Mapped[float | None]
    created_at: Mapped[float]
    updated_at: Mapped[float]


# --- replicas ----------------------------------------------------------------------------------------


class Replica(Base):
    """A follower copy of another gateway's room, fed by its ``read_events`` pages."""

    __tablename__ = "hosted_room_replicas"
    __table_args__ = (PrimaryKeyConstraint("room_id"), *_at_least(authority_epoch=1, last_seq=0))

    room_id: Mapped[str]
    name: Mapped[str]
    members_json: Mapped[str]
    authority_gateway_id: Mapped[str]
    authority_epoch: Mapped[int]
    last_seq: Mapped[int] = mapped_column(server_default=text("0"))
    latest_seq: Mapped[int] = mapped_column(server_default=text("0"))
    event_bytes: Mapped[int] = mapped_column(server_default=text("0"))
    created_at: Mapped[float]
    updated_at: Mapped[float]


class ReplicaEvent(_LogEntry, Base):
    """One replicated log entry, stored verbatim from the authority's page."""

    __tablename__ = "hosted_room_replica_events"
    __table_args__ = (
        PrimaryKeyConstraint("room_id", "seq"),
        *_at_least(seq=1),
        # An ingested page's new event ids are checked against the stored replica (ids are unique in a log): an
        # index probe per id, instead of reading the whole replicated room for every page.
        Index("idx_hosted_room_replica_events_event_id", "room_id", "event_id"),
    )



# --- secure-peer delivery ledger ---------------------------------------------------------------------

DELIVERY_STATES = ("prepared", "authorized", "queued", "running", "completed", "failed")
OUTBOUND_STATES = ("pending", "committed", "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    # Literal constants of this module only; never input.
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


class Delivery(Base):
    """One inbound secure-peer delivery and its local admission, run and response state."""

    __tablename__ = "secure_peer_deliveries"
    __table_args__ = (
        PrimaryKeyConstraint("envelope_id"),
        CheckConstraint(_in("transport_role", ("host", "client")), name="transport_role"),
        CheckConstraint(_in("action", ("instruction", "request_reply")), name="action"),
        CheckConstraint(_in("kind", ("instruction", "request_reply", "response")), name="kind"),
        CheckConstraint("used_legs BETWEEN 1 AND 6", name="used_legs"),
        CheckConstraint("max_legs = 6", name="max_legs"),
        CheckConstraint(_in("state", DELIVERY_STATES), name="state"),
        CheckConstraint("response_committed IN (0, 1)", name="response_committed"),
        CheckConstraint(
            "response_request_response IS NULL OR response_request_response IN (0, 1)",
            name="response_request_response",
        ),
        Index("secure_peer_delivery_state", "state", "updated_at"),
        Index("secure_peer_delivery_run", "run_id", "state"),
        _unique_when_set("secure_peer_delivery_queued_owner", "queued_id"),
        _unique_when_set("secure_peer_delivery_run_owner", "run_id"),
    )

    envelope_id: Mapped[str]
    request_id: Mapped[str]
    claim_digest: Mapped[str]
    transport_role: Mapped[str]
    connection_id: Mapped[str]
    lease_token: Mapped[str]
    team_id: Mapped[str]
    source_peer_id: Mapped[str | None]
    source_server_identity: Mapped[str]
    source_route_id: Mapped[str]
    source_route_revision: Mapped[str]
    target_peer_id: Mapped[str | None]
    target_server_identity: Mapped[str]
    target_route_id: Mapped[str]
    target_route_revision: Mapped[str]
    target_chat_id: Mapped[str]
    action: Mapped[str]
    kind: Mapped[str]
    exchange_id: Mapped[str]
    parent_envelope_id: Mapped[str | None]
    parent_leg: Mapped[int | None]
    used_legs: Mapped[int]
    max_legs: Mapped[int]
    expires_at: Mapped[int]
    body_json: Mapped[str]
    state: Mapped[str]
    queued_id: Mapped[str | None]
    run_id: Mapped[str | None]
    admission_retry_at: Mapped[int | None]
    admission_attempts: Mapped[int] = mapped_column(server_default=text("0"))
    admission_last_error: Mapped[str | None]
    response_committed: Mapped[int] = mapped_column(server_default=text("0"))
    response_request_id: Mapped[str | None]
    response_request_digest: Mapped[str | None]
    response_body: Mapped[str | None]
    response_request_response: Mapped[int | None]
    response_retry_at: Mapped[int | None]
    response_attempts: Mapped[int] = mapped_column(server_default=text("0"))
    response_last_error: Mapped[str | None]
    result_hash: Mapped[str | None]
    error: Mapped[str | None]
    created_at: Mapped[int]
    updated_at: Mapped[int]


class OutboundIntent(Base):
    """One outbound secure-peer request, bound to its digest before it is sent."""

    __tablename__ = "secure_peer_outbound_intents"
    __table_args__ = (
        PrimaryKeyConstraint("request_id"),
        CheckConstraint(_in("action", ("instruction", "request_reply")), name="action"),
        CheckConstraint(_in("state", OUTBOUND_STATES), name="state"),
        Index("secure_peer_outbound_pending", "state", "retry_at", "created_at"),
        Index("secure_peer_outbound_source", "state", "source_session_id", "created_at"),
        Index("secure_peer_outbound_connection", "state", "connection_id", "created_at"),
    )

    request_id: Mapped[str]
    intent_digest: Mapped[str]
    source_session_id: Mapped[str]
    source_run_id: Mapped[str]
    connection_id: Mapped[str]
    source_route_id: Mapped[str]
    source_route_revision: Mapped[str]
    snapshot_json: Mapped[str]
    body: Mapped[str]
    action: Mapped[str]
    expires_at: Mapped[int]
    state: Mapped[str]
    response_json: Mapped[str | None]
    retry_at: Mapped[int | None]
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    last_error: Mapped[str | None]
    created_at: Mapped[int]
    updated_at: Mapped[int]


#: Handy Core handles for hot paths (Core statements avoid ORM object churn).
rooms = cast(Table, Room.__table__)
events = cast(Table, RoomEvent.__table__)
retired_ids = cast(Table, RetiredRoomId.__table__)
budget = cast(Table, BudgetShard.__table__)
links = cast(Table, RoomLink.__table__)
remote_runs = cast(Table, RemoteRun.__table__)
revoked_grants = cast(Table, RevokedGrant.__table__)
peer_reservations = cast(Table, PeerReservation.__table__)
replicas = cast(Table, Replica.__table__)
replica_events = cast(Table, ReplicaEvent.__table__)
deliveries = cast(Table, Delivery.__table__)
outbound_intents = cast(Table, OutboundIntent.__table__)
