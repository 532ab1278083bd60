"""The typed shapes of the public API: what the services accept and return, as ``TypedDict``\\ s.

They are plain dicts at runtime (the reference implementation's shapes, keys and values); the types only tell a
type checker which keys a result has and what each holds, so ``page["cursr"]`` or a room id passed as an int is
an error under ``mypy --strict``. A key marked ``NotRequired`` is present in some results only (the docstring of
each says when). ``tests/services/test_records.py`` checks every service's runtime results against these keys, on both
backends, so the types follow what the code returns.

Inputs with a fixed shape that a caller builds (an actor, a new event, a room link record, a remote-run record)
are TypedDicts too; free-form JSON (payloads, members, snapshots) is ``dict[str, Any]``, and data that usually
arrives from a peer as decoded JSON (grant claims, relay envelopes, the Hub's responses) is accepted as any
``Mapping[str, Any]`` (:class:`GrantClaims` and :class:`ReservationClaims` name the keys read from claims).
"""

# No ``from __future__ import annotations`` here: Python 3.11 reads ``NotRequired`` only from evaluated
# annotations (``__required_keys__`` / ``__optional_keys__`` would be wrong with string annotations).
# ``typing_extensions``' TypedDict, not ``typing``'s: pydantic (FastAPI's response models) refuses the latter
# on Python < 3.12.
from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

#: A delivery's state (:class:`DeliveryRecord`).
DeliveryState = Literal["prepared", "authorized", "queued", "running", "completed", "failed"]
#: An outbound intent's state (:class:`OutboundRecord`).
OutboundState = Literal["pending", "committed", "failed"]

__all__ = [
    "Actor",
    "Authority",
    "Backlog",
    "CapUse",
    "ClaimedRoom",
    "CreatedRoom",
    "DeliveryBacklog",
    "DeliveryRecord",
    "DeliveryState",
    "DemotionResult",
    "DisbandedRoom",
    "EventPage",
    "EventRecord",
    "GrantClaims",
    "IngestResult",
    "LedgerStatus",
    "MessageBody",
    "NewEvent",
    "OutboundBacklog",
    "OutboundRecord",
    "OutboundState",
    "PromotionResult",
    "RemoteRunIdentity",
    "RemoteRunReceipt",
    "RemoteRunRecord",
    "RenamedRoom",
    "ReplayPage",
    "ReplicaLag",
    "ReplicaState",
    "ReplicasStatus",
    "ReservationClaims",
    "RoomBase",
    "RoomLinkRecord",
    "RoomRecord",
    "RoomState",
    "RoomUse",
    "RoomsStatus",
    "SchemaStatus",
    "StoreStatus",
]


# --- rooms and the event log ---------------------------------------------------------------------------------


class Actor(TypedDict):
    """Who appends an event (an input): ``kind`` is ``user``, ``member``, ``gateway`` or ``system`` and decides
    which event kinds it may append; a ``gateway`` actor's ``id`` must be the authority gateway. The optional
    labels are stripped; an empty one is dropped. Stored and returned normalised (an event's ``actor``)."""

    kind: str
    id: str
    display_name: NotRequired[str]
    profile: NotRequired[str]
    connection_id: NotRequired[str]


class NewEvent(TypedDict):
    """One item of :func:`hostedrooms.rooms.append_events` (the keyword arguments of ``append_event``)."""

    event_id: str
    kind: str
    actor: Actor
    payload: dict[str, Any]


class EventRecord(TypedDict):
    """One event of a room log, as appended, replayed or read.

    ``actor`` and ``payload`` are the stored JSON decoded: an actor object normalised by the append rules and a
    payload object for every event appended here; an event that came into the log through a promoted replica
    carries what its authority's page held (an object actor, any JSON payload). ``authority_epoch`` is None only
    on events written before epochs were stamped. ``idempotent`` is True when the call replayed an existing event.
    """

    room_id: str
    seq: int
    event_id: str
    kind: str
    actor: dict[str, Any]
    authority_epoch: int | None
    payload: Any
    created_at: float
    idempotent: bool


class Authority(TypedDict):
    """The authority a page (or a replica) was written under: its gateway and epoch."""

    gateway_id: str
    epoch: int


class ReplayPage(TypedDict):
    """The reference's replay page: ``events`` after the requested seq, ``cursor`` (the last seq returned, to pass
    as the next ``since_seq``), the room's ``latest_seq``, ``has_more`` (cursor < latest_seq) and the
    ``authority`` that wrote the log (what :func:`hostedrooms.replicas.ingest_page` needs). Its serialized form
    fits MAX_LOG_PAGE_BYTES."""

    events: list[EventRecord]
    cursor: int
    latest_seq: int
    has_more: bool
    authority: Authority


class EventPage(ReplayPage):
    """A page of :func:`hostedrooms.rooms.read_events`: a :class:`ReplayPage` and the store's ``lineage``
    (:mod:`hostedrooms.lineage`; added after the page was fitted to MAX_LOG_PAGE_BYTES, at most 128 characters
    more). A page given to ``ingest_page`` may leave ``lineage`` out (a source that predates it)."""

    lineage: str


class RoomBase(TypedDict):
    """The keys of every room result. ``members`` is the stored member list; ``idempotent`` is True when the call
    changed nothing (a replay)."""

    room_id: str
    name: str
    members: list[dict[str, Any]]
    authority_gateway_id: str
    authority_epoch: int
    revision: int
    created_at: float
    updated_at: float
    idempotent: bool


class RoomRecord(RoomBase):
    """A room as :func:`hostedrooms.rooms.list_rooms` lists it: with ``latest_seq``, the last seq of its log, and
    ``disbanded_at`` for a disbanded room (listed with ``include_disbanded=True``)."""

    latest_seq: NotRequired[int]
    disbanded_at: NotRequired[float]


class RoomState(RoomRecord):
    """The result of :func:`hostedrooms.rooms.room_state`: the room, with ``authority_claim``, the
    ``authority.claimed`` event of the current epoch, when there is one."""

    authority_claim: NotRequired[EventRecord]


class CreatedRoom(RoomBase):
    """The result of :func:`hostedrooms.rooms.create_room`. ``latest_seq`` is absent when the call created the room
    (the reference's reload omits it) and present when it returned an existing one; ``adopted`` (True) and the
    ``claim_event`` are present only when a ``legacy``-authority room was adopted by a real gateway."""

    latest_seq: NotRequired[int]
    adopted: NotRequired[bool]
    claim_event: NotRequired[EventRecord]


class RenamedRoom(RoomBase):
    """The result of :func:`hostedrooms.rooms.rename_room`: the room and its ``room.renamed`` event."""

    latest_seq: int
    event: EventRecord


class ClaimedRoom(RoomBase):
    """The result of :func:`hostedrooms.rooms.claim_authority`: the room and its ``authority.claimed`` event."""

    latest_seq: int
    claim_event: EventRecord


class DisbandedRoom(TypedDict):
    """The result of :func:`hostedrooms.rooms.disband_room`. ``event`` (the ``room.disbanded`` event) is absent
    once the room's history was pruned: such a replay has ``history_expired`` (True) instead."""

    room_id: str
    disbanded_at: float
    idempotent: bool
    event: NotRequired[EventRecord]
    history_expired: NotRequired[bool]


# --- replicas --------------------------------------------------------------------------------------------------


class IngestResult(TypedDict):
    """The result of :func:`hostedrooms.replicas.ingest_page`: the replica's last stored seq, how many events
    this page added, the page's authority, and whether the replica now holds the authority's whole log."""

    room_id: str
    stored_seq: int
    ingested: int
    authority: Authority
    caught_up: bool


class ReplicaState(TypedDict):
    """The result of :func:`hostedrooms.replicas.replica_state`: coverage (``last_seq`` stored of the
    authority's ``latest_seq``), lineage (``authority``) and the accounted bytes of the replicated events."""

    room_id: str
    name: str
    members: list[dict[str, Any]]
    authority: Authority
    last_seq: int
    latest_seq: int
    event_bytes: int
    created_at: float
    updated_at: float


class PromotionResult(TypedDict):
    """The result of :func:`hostedrooms.replicas.promote_replica`: the room's new (local) authority, the one it
    was promoted from, and the seq of the ``authority.claimed`` event (the room's ``latest_seq``)."""

    room_id: str
    authority_gateway_id: str
    authority_epoch: int
    previous_gateway_id: str
    previous_epoch: int
    claim_seq: int
    latest_seq: int


class DemotionResult(TypedDict):
    """The result of :func:`hostedrooms.replicas.demote_room`: the authority the room now records."""

    room_id: str
    authority_gateway_id: str
    authority_epoch: int
    idempotent: bool


# --- peer routing state ------------------------------------------------------------------------------------------


class RoomLinkRecord(TypedDict):
    """A private room link (:mod:`hostedrooms.peers`), as stored and listed. ``grant`` is a secret."""

    room_id: str
    member_id: str
    target_url: str
    target_profile: str
    grant: str
    catalog_json: str
    cancellation_scope_id: str
    trace_id: str
    transport_security: str
    status: str
    updated_at: float


class RemoteRunIdentity(TypedDict):
    """The logical identity of one remote task attempt (the receipt lookup's ``record``)."""

    room_id: str
    home_install_id: str
    authority_gateway_id: str
    authority_epoch: int
    member_id: str
    target_install_id: str
    target_profile: str
    task_id: str
    execution_generation: int


class RemoteRunRecord(RemoteRunIdentity):
    """A task attempt bound to its run and session (the ``record`` of ``upsert_remote_run_receipt``)."""

    run_id: str
    session_id: str


class RemoteRunReceipt(RemoteRunRecord):
    """A stored remote-run receipt, as listed and looked up."""

    created_at: float
    updated_at: float


class ReservationClaims(TypedDict):
    """The claims a peer reservation reads (``reserve_peer_room``, ``peer_room_grant_is_current``).

    The services accept any mapping (claims usually arrive decoded from a grant); ``authority_epoch`` is read
    leniently like the reference (``int(value or 0)``), so this is the shape to build, not all that is accepted.
    """

    room_id: str
    member_id: str
    target_profile: str
    authority_gateway_id: str
    authority_epoch: int


class GrantClaims(ReservationClaims):
    """The claims of a grant: its seven scope fields (``room_grant_scope_key``), and ``issued_at`` (read by
    ``room_grant_is_revoked``; 0 when absent)."""

    home_install_id: str
    target_install_id: str
    issued_at: NotRequired[float]


# --- the secure-peer delivery ledger -----------------------------------------------------------------------------


class MessageBody(TypedDict):
    """A delivery's body: exactly one non-blank ``message``."""

    message: str


class DeliveryRecord(TypedDict):
    """One delivery of :class:`hostedrooms.ledger.DeliveryLedger` (every column, ``body`` decoded).

    Timestamps are integer seconds. ``state`` is one of ``prepared``, ``authorized``, ``queued``, ``running``,
    ``completed``, ``failed``; ``response_committed`` and ``response_request_response`` are 0/1 integers.
    """

    envelope_id: str
    request_id: str
    claim_digest: str
    transport_role: str
    connection_id: str
    lease_token: str
    team_id: str
    source_peer_id: str | None
    source_server_identity: str
    source_route_id: str
    source_route_revision: str
    target_peer_id: str | None
    target_server_identity: str
    target_route_id: str
    target_route_revision: str
    target_chat_id: str
    action: str
    kind: str
    exchange_id: str
    parent_envelope_id: str | None
    parent_leg: int | None
    used_legs: int
    max_legs: int
    expires_at: int
    state: DeliveryState
    queued_id: str | None
    run_id: str | None
    admission_retry_at: int | None
    admission_attempts: int
    admission_last_error: str | None
    response_committed: int
    response_request_id: str | None
    response_request_digest: str | None
    response_body: str | None
    response_request_response: int | None
    response_retry_at: int | None
    response_attempts: int
    response_last_error: str | None
    result_hash: str | None
    error: str | None
    created_at: int
    updated_at: int
    body: MessageBody


class OutboundRecord(TypedDict):
    """One outbound intent of :class:`hostedrooms.ledger.DeliveryLedger` (every column, ``snapshot`` and
    ``response`` decoded; ``response`` is None until the Hub's response is committed). ``state`` is ``pending``,
    ``committed`` or ``failed``; timestamps are integer seconds."""

    request_id: str
    intent_digest: str
    source_session_id: str
    source_run_id: str
    connection_id: str
    source_route_id: str
    source_route_revision: str
    body: str
    action: str
    expires_at: int
    state: OutboundState
    retry_at: int | None
    attempts: int
    last_error: str | None
    created_at: int
    updated_at: int
    snapshot: dict[str, Any]
    response: dict[str, Any] | None


# --- a store's status ------------------------------------------------------------------------------------------


class CapUse(TypedDict):
    """How much of one limit is used: ``used`` of ``limit``, and ``percent`` (``used / limit * 100``, rounded to
    two decimals; 100.0 for a limit of 0). Counts and bytes may pass a limit (the control reserves, a lowered
    limit): ``percent`` then exceeds 100. ``limit_name`` names the limit (``MAX_GATEWAY_EVENT_BYTES``, the
    gateway's budget for every room together, is not ``MAX_ROOM_EVENT_BYTES``, one room's cap)."""

    used: int
    limit: int
    percent: float
    limit_name: str


class RoomUse(TypedDict):
    """A live room against its per-room limits: ``events`` (its log's length) of ``MAX_EVENTS_PER_ROOM`` and
    ``bytes`` (its accounted event bytes) of ``MAX_ROOM_EVENT_BYTES``."""

    room_id: str
    events: CapUse
    bytes: CapUse


class RoomsStatus(TypedDict):
    """The rooms of a store (:func:`hostedrooms.status.store_status`).

    ``live`` of ``MAX_ACTIVE_ROOMS``; ``disbanded`` (tombstones) of ``MAX_DISBANDED_ROOM_TOMBSTONES``; ``events``,
    the events in every room's log (live and disbanded); ``bytes``, the accounted event bytes of every room (what
    the gateway budget counts) of ``MAX_GATEWAY_EVENT_BYTES``, of which ``disbanded_bytes`` are in disbanded rooms
    (an append that would not fit prunes those first); ``most_events`` and ``most_bytes``, the live room with the
    most events and the one with the most bytes against the per-room limits (0 used when there is no live room);
    ``fullest``, up to ``top`` live rooms closest to a per-room limit, the fullest first."""

    live: CapUse
    disbanded: CapUse
    events: int
    bytes: CapUse
    disbanded_bytes: int
    most_events: CapUse
    most_bytes: CapUse
    fullest: list[RoomUse]


class ReplicaLag(TypedDict):
    """One replica as its own store records it. ``last_seq``: the last seq ingested (the replica's head);
    ``latest_seq``: the source's latest seq as the last ingested page reported it; ``lag`` = ``latest_seq -
    last_seq``, the events the source was known to hold that this store does not, as of ``updated_at`` (when
    the last page was ingested; ``since_update`` = now - updated_at). The source may have appended more since:
    the lag is a lower bound. ``bytes``: the replica's event bytes of ``MAX_REPLICA_EVENT_BYTES``."""

    room_id: str
    authority: Authority
    last_seq: int
    latest_seq: int
    lag: int
    bytes: CapUse
    updated_at: float
    since_update: float


class ReplicasStatus(TypedDict):
    """The replicas of a store: ``rooms`` of ``MAX_REPLICA_ROOMS``; ``behind``, how many have a ``lag`` above 0;
    ``lag``, the sum of their lags, ``max_lag`` the largest; ``largest``, the biggest replica's bytes of
    ``MAX_REPLICA_EVENT_BYTES``; ``most_behind``, up to ``top`` replicas, the largest lag first (see
    :class:`ReplicaLag`)."""

    rooms: CapUse
    behind: int
    lag: int
    max_lag: int
    largest: CapUse
    most_behind: list[ReplicaLag]


class Backlog(TypedDict):
    """How many ledger rows are in one state, and ``oldest_age``, the seconds since the oldest of them was
    created (None when there are none; 0 for a row stamped after ``now``)."""

    count: int
    oldest_age: float | None


class DeliveryBacklog(TypedDict):
    """The deliveries of the ledger by state."""

    prepared: Backlog
    authorized: Backlog
    queued: Backlog
    running: Backlog
    completed: Backlog
    failed: Backlog


class OutboundBacklog(TypedDict):
    """The outbound intents of the ledger by state."""

    pending: Backlog
    committed: Backlog
    failed: Backlog


class LedgerStatus(TypedDict):
    """The delivery ledger of a store: ``deliveries`` and ``outbound`` intents by state; ``in_flight``, the
    non-terminal deliveries of ``MAX_NONTERMINAL_DELIVERIES``; ``responses_pending``, the response intents not yet
    committed to the Hub; ``backlog``, the work not finished: the non-terminal deliveries and the pending outbound
    intents together, with the oldest one's age."""

    deliveries: DeliveryBacklog
    outbound: OutboundBacklog
    in_flight: CapUse
    responses_pending: int
    backlog: Backlog


class SchemaStatus(TypedDict):
    """The store's schema ``revision``, the newest one this installation ships (``head``), and whether they are
    the same."""

    revision: str
    head: str | None
    at_head: bool


class StoreStatus(TypedDict):
    """The result of :func:`hostedrooms.status.store_status`: one read of a store at ``now``, on ``backend``
    (``sqlite`` or ``postgresql``)."""

    now: float
    backend: str
    schema: SchemaStatus
    rooms: RoomsStatus
    replicas: ReplicasStatus
    ledger: LedgerStatus
