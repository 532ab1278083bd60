"""The error classes a caller maps without reading messages (#28 items 1 and 7).

Bad input is :class:`InvalidInputError` (naming the field), a capacity limit :class:`CapacityExceededError`
(naming the limit), a wrong call :class:`MisuseError`, the ledger's refusals its own classes inside the hierarchy
that keep the reference's ``ValueError``/``RuntimeError``/``PermissionError`` bases. Messages are the reference's:
only the class says more. Each public call is walked with bad input, over capacity and misused, on both APIs and
both backends; ``follow()`` refuses an unknown room when called; an asyncio driver hostedrooms does not use is
refused by name; and the "Errors" table (docs/errors.md) lists every class.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
from pathlib import Path
from typing import Any

import factories
import pytest
from apis import use_api
from factories import LOCAL as GATEWAY
from factories import lowered, make_room, outbound, outbound_snapshot, prepare, replica_page
from sqlalchemy import Engine
from test_readme import readme_block

import hostedrooms
from hostedrooms import aio, errors, peers, replicas, rooms
from hostedrooms.compat import secure_peer_delivery as facade
from hostedrooms.errors import (
    CapacityExceededError,
    HostedRoomError,
    InvalidInputError,
    LedgerCapacityError,
    LedgerInputError,
    LedgerPermissionError,
    LedgerStateError,
    MisuseError,
    ReplicaCapacityError,
    ReplicaError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    StoreConfigurationError,
    StoreLineageError,
)

_api = use_api("rooms", "peers", "replicas")  # the tests on a database run on both APIs

ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"  # the full table (README: a short one)
USER = {"kind": "user", "id": "u1"}


def _refusal(call: Any, *args: Any, **kwargs: Any) -> BaseException:
    with pytest.raises(Exception) as caught:
        call(*args, **kwargs)
    return caught.value


# --- the classes ------------------------------------------------------------------------------------------------


def test_each_class_keeps_the_base_the_reference_raised() -> None:
    assert issubclass(InvalidInputError, HostedRoomError) and issubclass(InvalidInputError, ValueError)
    assert issubclass(CapacityExceededError, HostedRoomError)
    assert issubclass(MisuseError, HostedRoomError) and issubclass(MisuseError, TypeError)
    assert issubclass(ReplicaCapacityError, ReplicaError) and issubclass(ReplicaCapacityError, CapacityExceededError)
    assert issubclass(LedgerInputError, InvalidInputError) and issubclass(LedgerInputError, ValueError)
    assert issubclass(LedgerStateError, HostedRoomError) and issubclass(LedgerStateError, RuntimeError)
    assert issubclass(LedgerCapacityError, LedgerStateError) and issubclass(LedgerCapacityError, CapacityExceededError)
    assert issubclass(LedgerPermissionError, HostedRoomError) and issubclass(LedgerPermissionError, PermissionError)


@pytest.mark.parametrize("exc", [
    InvalidInputError("invalid room_id", field="room_id"), LedgerInputError("x is invalid", field="x"),
    CapacityExceededError("full", limit="MAX_ACTIVE_ROOMS"), LedgerCapacityError("full", limit="L"),
    ReplicaCapacityError("full", limit="MAX_REPLICA_ROOMS"), MisuseError("wrong"), LedgerStateError("changed"),
    LedgerPermissionError("secure peer delivery ledger is unsafe"),
    StoreLineageError("lost", room_id="r1", seq=3, previous="postgresql:1:1", current="postgresql:1:2")],
    ids=lambda exc: type(exc).__name__)
def test_messages_and_attributes_survive_pickling(exc: BaseException) -> None:
    copy = pickle.loads(pickle.dumps(exc))
    assert (type(copy), str(copy), vars(copy)) == (type(exc), str(exc), vars(exc))
    assert str(exc) == exc.args[0]  # the message alone: nothing appended


def test_field_and_limit_default_to_none() -> None:
    assert InvalidInputError("m").field is None and CapacityExceededError("m").limit is None


# --- rooms: bad input, capacity --------------------------------------------------------------------------------

BAD_INPUT: list[tuple[str, dict[str, Any], str, str]] = [
    ("create_room", {"room_id": "bad id", "name": "T", "members": [], "authority_gateway_id": GATEWAY},
     "room_id", "invalid room_id"),
    ("create_room", {"room_id": "r2", "name": "T", "members": {}, "authority_gateway_id": GATEWAY},
     "members", "members must be a list"),
    ("create_room", {"room_id": "r2", "name": "T", "members": [], "authority_gateway_id": GATEWAY, "now": "x"},
     "now", "now must be a number"),
    ("append_event", {"room_id": "room-1", "event_id": "e", "kind": "message.user", "actor": {"kind": "robot"},
                      "payload": {}, "authority_gateway_id": GATEWAY, "authority_epoch": 1},
     "actor.kind", "invalid actor.kind"),
    ("append_event", {"room_id": "room-1", "event_id": "e", "kind": "message.user", "actor": USER, "payload": [],
                      "authority_gateway_id": GATEWAY, "authority_epoch": 1}, "payload", "payload must be an object"),
    ("append_event", {"room_id": "room-1", "event_id": "e", "kind": "message.user", "actor": USER, "payload": {},
                      "authority_gateway_id": GATEWAY, "authority_epoch": 0},
     "authority_epoch", "authority_epoch must be a positive integer"),
    ("append_event", {"room_id": "room-1", "event_id": "e", "kind": "message.user",
                      "actor": {**USER, "display_name": 5}, "payload": {}, "authority_gateway_id": GATEWAY,
                      "authority_epoch": 1}, "actor.display_name", "actor.display_name must be a string"),
    ("append_events", {"room_id": "room-1", "events": [], "authority_gateway_id": GATEWAY, "authority_epoch": 1},
     "events", "events must be a non-empty list"),
    ("read_events", {"room_id": "room-1", "limit": 0}, "limit", "limit must be between 1 and 500"),
    ("read_events", {"room_id": "room-1", "since_seq": 99}, "since_seq", "since_seq is ahead of the hosted room log"),
    ("list_rooms", {"offset": -1}, "offset", "offset must be a non-negative integer"),
    ("rename_room", {"room_id": "room-1", "event_id": "r", "name": " "}, "name", "invalid room name"),
    ("claim_authority", {"room_id": "room-1", "event_id": "c", "expected_gateway_id": 5,
                         "expected_epoch": 1, "new_gateway_id": "install:b"},
     "expected_gateway_id", "expected_gateway_id must be a string"),
    ("request_room_stop", {"room_id": "room-1", "cancel_id": "bad id", "expected_gateway_id": GATEWAY,
                           "expected_epoch": 1}, "cancel_id", "invalid cancel_id"),
]


@pytest.mark.parametrize(("function", "kwargs", "field", "message"), BAD_INPUT,
                         ids=[f"{case[0]}-{case[2]}" for case in BAD_INPUT])
def test_bad_room_input_is_invalid_input_naming_the_field(
    engine: Engine, function: str, kwargs: dict[str, Any], field: str, message: str
) -> None:
    make_room(engine, gateway=GATEWAY)
    exc = _refusal(getattr(rooms, function), engine, **kwargs)
    assert (type(exc), str(exc), exc.field) == (InvalidInputError, message, field)  # type: ignore[attr-defined]


#: Calls that check another argument before ``room_id`` (the reference's order), and which.
_CHECKED_FIRST = {"request_room_stop": "cancel_id"}


@pytest.mark.parametrize("module_name", ["rooms", "peers", "replicas"])
def test_every_public_call_taking_a_room_id_refuses_a_bad_one_naming_it(engine: Engine, module_name: str) -> None:
    """Every public call with a ``room_id`` (its other required arguments None): InvalidInputError naming the
    field, and the database unchanged."""
    make_room(engine, gateway=GATEWAY)
    before = factories.snapshot(engine)
    sync_module, module = getattr(hostedrooms, module_name), globals()[module_name]
    called = []
    for name in sync_module.__all__:
        function = getattr(sync_module, name)
        if not inspect.isfunction(function) or "room_id" not in inspect.signature(function).parameters:
            continue
        first, *rest = inspect.signature(function).parameters.values()
        source = engine if first.name == "engine" else engine.url.render_as_string(hide_password=False)
        kwargs = {parameter.name: 42 if parameter.name == "room_id" else None for parameter in rest
                  if parameter.name == "room_id" or parameter.default is inspect.Parameter.empty}
        exc = _refusal(getattr(module, name), source, **kwargs)
        field = _CHECKED_FIRST.get(name, "room_id")
        assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
            InvalidInputError, f"{field} must be a string", field), name
        called.append(name)
    assert len(called) >= {"rooms": 10, "peers": 6, "replicas": 5}[module_name], called
    assert factories.snapshot(engine) == before


def _append(engine: Engine, event_id: str, **kwargs: Any) -> Any:
    return rooms.append_event(engine, room_id="room-1", event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": "hello"}, authority_gateway_id=GATEWAY, authority_epoch=1, **kwargs)


@pytest.mark.parametrize(("limit", "message"), [
    ("MAX_EVENTS_PER_ROOM", "This Group Chat reached its history limit. Start a new Group Chat to continue."),
    ("MAX_ROOM_EVENT_BYTES", "This Group Chat reached its storage limit. Start a new Group Chat to continue."),
    ("MAX_GATEWAY_EVENT_BYTES", "Group Chat storage is full on this host. Delete an old Group Chat and try again."),
])
def test_a_full_room_or_host_is_capacity_exceeded_naming_the_limit(engine: Engine, limit: str, message: str) -> None:
    make_room(engine, gateway=GATEWAY)
    _append(engine, "e1")
    state = hostedrooms.rooms.room_state(engine, room_id="room-1")
    # The room's event count as the limit (one more is over), or fewer bytes than it already holds.
    exc = _refusal(_append, engine, "e2", limits=lowered(**{limit: state["latest_seq"] if "EVENTS" in limit else 1}))
    assert (type(exc), str(exc), exc.limit) == (CapacityExceededError, message, limit)  # type: ignore[attr-defined]
    assert hostedrooms.rooms.room_state(engine, room_id="room-1")["latest_seq"] == state["latest_seq"]


def test_too_many_active_rooms_is_capacity_exceeded(engine: Engine) -> None:
    make_room(engine, gateway=GATEWAY)
    exc = _refusal(make_room, engine, "room-2", gateway=GATEWAY, limits=lowered(MAX_ACTIVE_ROOMS=1))
    assert (type(exc), str(exc), exc.limit) == (  # type: ignore[attr-defined]
        CapacityExceededError, "This host has too many active Group Chats. Delete one and try again.",
        "MAX_ACTIVE_ROOMS")


# --- follow(): the room is checked when it is called -----------------------------------------------------------


QUICK = {"poll_interval": 0.01, "fallback_interval": 0.05}


def test_follow_refuses_an_unknown_room_when_called_not_when_iterated(engine: Engine) -> None:
    make_room(engine, gateway=GATEWAY)
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
        hostedrooms.rooms.follow(engine, "nope", 0, **QUICK)  # not iterated: the call itself refuses
    exc = _refusal(hostedrooms.rooms.follow, engine, "room-1", 5, **QUICK)
    assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
        InvalidInputError, "since_seq is ahead of the hosted room log", "since_seq")
    hostedrooms.rooms.disband_room(engine, room_id="room-1", expected_gateway_id=GATEWAY, expected_epoch=1)
    hostedrooms.rooms.prune_disbanded_rooms(engine, now=10.0**10)
    with pytest.raises(RoomHistoryExpiredError):
        hostedrooms.rooms.follow(engine, "room-1", 0, **QUICK)
    assert engine.pool.checkedout() == 0


def test_aio_open_follow_checks_the_room_before_returning_the_iterator(engine: Engine) -> None:
    make_room(engine, gateway=GATEWAY)
    _append(engine, "e1")

    async def scenario() -> None:
        async_engine = aio.create_async_engine(engine.url)
        try:
            with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
                await aio.rooms.open_follow(async_engine, "nope", **QUICK)
            with pytest.raises(InvalidInputError, match="^since_seq is ahead of the hosted room log$"):
                await aio.open_follow(async_engine, "room-1", 9, **QUICK)
            # follow() cannot await when called: it refuses on the first __anext__, before yielding anything.
            plain = aio.rooms.follow(async_engine, "nope", **QUICK)
            with pytest.raises(RoomNotFoundError):
                await plain.__anext__()
            events = await aio.rooms.open_follow(async_engine, "room-1", 0, **QUICK)
            try:
                first = await events.__anext__()
            finally:
                await events.aclose()
            assert first["event_id"] == hostedrooms.rooms.read_events(engine, room_id="room-1")["events"][0][
                "event_id"]
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())


def test_open_follow_takes_follows_arguments() -> None:
    assert inspect.signature(aio.rooms.open_follow).parameters == inspect.signature(aio.rooms.follow).parameters


# --- peers -------------------------------------------------------------------------------------------------------


def test_peers_bad_input_capacity_and_conflict(engine: Engine) -> None:
    exc = _refusal(peers.upsert_room_link_record, engine, record=factories.link(updated_at="soon"), max_links=5)
    assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
        InvalidInputError, "room link updated_at must be a number", "room link updated_at")
    record = factories.link()
    del record["grant"]
    exc = _refusal(peers.upsert_room_link_record, engine, record=record, max_links=5)
    assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
        InvalidInputError, "room link record is missing grant", "grant")
    peers.upsert_room_link_record(engine, record=factories.link("m1"), max_links=1)
    exc = _refusal(peers.upsert_room_link_record, engine, record=factories.link("m2"), max_links=1)
    assert (type(exc), str(exc), exc.limit) == (  # type: ignore[attr-defined]
        CapacityExceededError, "too many stored room links", "max_links")
    exc = _refusal(peers.reserve_peer_room, engine, claims={}, expires_at=1.0, now=2.0)
    assert (type(exc), exc.field) == (InvalidInputError, "expires_at")  # type: ignore[attr-defined]
    receipt = {"room_id": "room-1", "home_install_id": "home-1", "authority_gateway_id": "install:home",
               "authority_epoch": 1, "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha",
               "task_id": "task-1", "execution_generation": 1, "run_id": "run-1", "session_id": "session-1"}
    peers.upsert_remote_run_receipt(engine, record=receipt, now=10)
    exc = _refusal(peers.upsert_remote_run_receipt, engine, record={**receipt, "run_id": "run-2"}, now=11)
    assert (type(exc), str(exc)) == (RoomConflictError, "remote run receipt conflicts with its logical task")
    exc = _refusal(peers.upsert_remote_run_receipt, engine, record={**receipt, "execution_generation": 0})
    assert (type(exc), exc.field) == (InvalidInputError, "execution_generation")  # type: ignore[attr-defined]


def test_an_incomplete_grant_scope_names_the_missing_field() -> None:
    claims = {"room_id": "r", "home_install_id": "h", "authority_gateway_id": "g", "authority_epoch": 1,
              "member_id": "", "target_install_id": "t", "target_profile": "p"}
    exc = _refusal(hostedrooms.peers.room_grant_scope_key, claims)
    assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
        InvalidInputError, "room grant scope is incomplete", "member_id")


# --- replicas ------------------------------------------------------------------------------------------------------


def test_replica_capacity_is_a_replica_error_naming_the_limit(engine: Engine) -> None:
    page = replica_page(1, 2)
    exc = _refusal(replicas.ingest_page, engine, room_id="r1", room_name="Team", members=factories.MEMBERS,
                   page=page, now=1000.0, limits=lowered(MAX_REPLICA_ROOMS=0))
    assert (type(exc), str(exc), exc.limit) == (  # type: ignore[attr-defined]
        ReplicaCapacityError, "replica room capacity exhausted", "MAX_REPLICA_ROOMS")
    exc = _refusal(replicas.ingest_page, engine, room_id="r1", room_name="Team", members=factories.MEMBERS,
                   page=page, now=1000.0, limits=lowered(MAX_REPLICA_EVENT_BYTES=1))
    assert (type(exc), str(exc), exc.limit) == (  # type: ignore[attr-defined]
        ReplicaCapacityError, "replica event storage exhausted", "MAX_REPLICA_EVENT_BYTES")
    exc = _refusal(replicas.replica_state, engine, room_id="bad id")
    assert (type(exc), exc.field) == (InvalidInputError, "room_id")  # type: ignore[attr-defined]
    exc = _refusal(replicas.promote_replica, engine, room_id="r1", local_gateway_id="bad id")
    assert (type(exc), str(exc), exc.field) == (  # type: ignore[attr-defined]
        InvalidInputError, "invalid authority_gateway_id", "authority_gateway_id")


# --- the ledger ----------------------------------------------------------------------------------------------------


def test_ledger_bad_input_names_the_field_the_message_does_not(engine: Engine, api: Any) -> None:
    ledger = api.DeliveryLedger(engine)
    cases: list[tuple[Any, str, str]] = [
        (lambda: prepare(ledger, 1, transport_role="peer"), "secure peer delivery role is invalid", "transport_role"),
        (lambda: prepare(ledger, 1, team_id=""), "secure peer delivery identity is incomplete", "team_id"),
        (lambda: prepare(ledger, 1, used_legs=7), "secure peer delivery leg budget is invalid", "used_legs"),
        (lambda: prepare(ledger, 1, lease_token="a\x00b"), "secure peer delivery identity is invalid",
         "lease_token"),
        (lambda: prepare(ledger, 1, expires_at="soon"), "secure peer delivery expiry is invalid", "expires_at"),
        (lambda: ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(source_chat_id="other"))),
         "secure peer outbound intent is invalid", "snapshot.source_chat_id"),
        (lambda: ledger.prepare_outbound(**outbound(body=" ")), "secure peer outbound intent is invalid", "body"),
        (lambda: ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(source_route_id=""))),
         "secure peer outbound intent is invalid", "snapshot.source_route_id"),
        (lambda: ledger.prepare_outbound(**outbound(expires_at="never")), "secure peer outbound intent is invalid",
         "expires_at"),
        (lambda: ledger.bind_owner("env-1", queued_id=None, run_id=None), "secure peer delivery owner is empty",
         None),
        (lambda: ledger.get(5), "secure peer ledger envelope_id must be a string", "envelope_id"),
        (lambda: ledger.pending_admissions(limit=0), "secure peer admission retry limit is invalid", "limit"),
        (lambda: ledger.prune(retain_seconds=-1), "secure peer ledger retention is invalid", "retain_seconds"),
    ]
    for call, message, field in cases:
        exc = _refusal(call)
        assert (type(exc), str(exc), exc.field) == (LedgerInputError, message, field)  # type: ignore[attr-defined]
        assert isinstance(exc, ValueError)


def test_ledger_state_and_capacity_stay_runtime_errors(engine: Engine, api: Any) -> None:
    ledger = api.DeliveryLedger(engine, limits=lowered(MAX_NONTERMINAL_DELIVERIES=1))
    prepare(ledger, 1)
    exc = _refusal(prepare, ledger, 1, message="another body")
    assert (type(exc), str(exc)) == (LedgerStateError, "secure peer envelope identity changed")
    exc = _refusal(prepare, ledger, 2)
    assert (type(exc), str(exc), exc.limit) == (  # type: ignore[attr-defined]
        LedgerCapacityError, "secure peer delivery capacity is full", "MAX_NONTERMINAL_DELIVERIES")
    assert isinstance(exc, RuntimeError) and isinstance(exc, CapacityExceededError)
    ledger.prepare_outbound(**outbound())
    exc = _refusal(ledger.prepare_outbound, **outbound(body="changed"))
    assert (type(exc), str(exc)) == (LedgerStateError, "secure peer outbound intent changed")


def test_an_unsafe_ledger_file_is_a_ledger_permission_error(tmp_path: Path) -> None:
    real = tmp_path / "private" / "ledger.db"
    facade.SecurePeerDeliveryLedger(real).close()
    link = tmp_path / "private" / "link.db"
    link.symlink_to(real)
    exc = _refusal(facade.SecurePeerDeliveryLedger, link)
    assert (type(exc), str(exc)) == (LedgerPermissionError, "secure peer delivery ledger must not be a symlink")
    assert isinstance(exc, PermissionError) and isinstance(exc, HostedRoomError)
    linked_folder = tmp_path / "linked"
    linked_folder.symlink_to(tmp_path / "private")
    exc = _refusal(facade.SecurePeerDeliveryLedger, linked_folder / "ledger.db")
    assert (type(exc), str(exc)) == (LedgerPermissionError, f"private directory must not be a symlink: {linked_folder}")


# --- misuse ---------------------------------------------------------------------------------------------------------


def test_a_synchronous_engine_given_to_aio_is_misuse(engine: Engine) -> None:
    exc = _refusal(asyncio.run, aio.rooms.room_state(engine, room_id="room-1"))  # type: ignore[arg-type]
    assert type(exc) is MisuseError and isinstance(exc, TypeError)
    assert str(exc).startswith("hostedrooms.aio needs a SQLAlchemy AsyncEngine, not Engine")
    exc = _refusal(aio.create_async_engine, engine)  # type: ignore[arg-type]
    assert type(exc) is MisuseError and "not a synchronous Engine" in str(exc)
    exc = _refusal(aio.rooms.follow, engine, "room-1")
    assert type(exc) is MisuseError
    exc = _refusal(asyncio.run, aio.open_ledger(engine))  # type: ignore[arg-type]
    assert type(exc) is MisuseError


def test_an_option_aio_does_not_offer_is_misuse(tmp_path: Path) -> None:
    exc = _refusal(aio.create_async_engine, tmp_path / "state.db", services="processes")
    assert (type(exc), str(exc)) == (MisuseError, "services must be one of threads, awaited")


def test_an_asyncio_engine_given_to_the_synchronous_api_is_misuse(tmp_path: Path) -> None:
    async def scenario() -> None:
        async_engine = aio.create_async_engine(tmp_path / "state.db")
        try:
            exc = _refusal(hostedrooms.rooms.room_state, async_engine, room_id="room-1")
            assert type(exc) is MisuseError and str(exc).startswith(
                "hostedrooms needs a synchronous SQLAlchemy Engine, not AsyncEngine")
            assert type(_refusal(hostedrooms.create_engine, async_engine)) is MisuseError
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    exc = _refusal(hostedrooms.rooms.room_state, 42, room_id="room-1")
    assert (type(exc), str(exc)) == (MisuseError, "hostedrooms needs a SQLAlchemy Engine, not int")
    exc = _refusal(hostedrooms.create_engine, tmp_path / "state.db", synchronous="OFF")
    assert (type(exc), str(exc)) == (MisuseError, "synchronous must be one of EXTRA, FULL, NORMAL")


# --- a driver hostedrooms does not use is refused, never swapped (#28 item 7) ---------------------------------------


@pytest.mark.parametrize(("url", "instead"), [
    ("postgresql+asyncpg://app:s3cret@db.example/rooms", "postgresql+psycopg://app:***@db.example/rooms"),
    ("postgresql+pg8000://app:s3cret@db.example/rooms", "postgresql+psycopg://app:***@db.example/rooms"),
    ("sqlite+pysqlcipher:////tmp/rooms.db", "sqlite:////tmp/rooms.db"),
])
def test_a_foreign_driver_is_refused_naming_the_url_to_give(url: str, instead: str) -> None:
    driver = url.split("+", 1)[1].split(":", 1)[0]
    for build in (hostedrooms.create_engine, aio.create_async_engine):
        exc = _refusal(build, url)
        assert type(exc) is StoreConfigurationError, (build, exc)
        assert f"names the driver {driver!r}, which hostedrooms does not use: give {instead} " in str(exc)
        assert "s3cret" not in str(exc)


@pytest.mark.parametrize(("url", "sync_driver", "async_driver"), [
    ("postgresql://db.example/rooms", "psycopg", "psycopg_async"),
    ("postgresql+psycopg2://db.example/rooms", "psycopg", "psycopg_async"),
    ("postgresql+psycopg_async://db.example/rooms", "psycopg_async", "psycopg_async"),
    ("sqlite:////tmp/rooms.db", "pysqlite", "aiosqlite"),
    ("sqlite+aiosqlite:////tmp/rooms.db", "aiosqlite", "aiosqlite"),
])
def test_hostedrooms_drivers_are_accepted(url: str, sync_driver: str, async_driver: str) -> None:
    engine = hostedrooms.create_engine(url)
    try:
        assert engine.url.get_driver_name() == sync_driver
    finally:
        engine.dispose()

    async def build() -> str:
        async_engine = aio.create_async_engine(url)
        try:
            return async_engine.url.get_driver_name()
        finally:
            await async_engine.dispose()

    assert asyncio.run(build()) == async_driver


# --- the errors table ------------------------------------------------------------------------------------------


def public_error_classes() -> list[str]:
    """Every exception class hostedrooms.errors defines (not underscored), whoever added it."""
    return sorted(name for name, value in vars(errors).items()
                  if inspect.isclass(value) and issubclass(value, BaseException) and not name.startswith("_")
                  and value.__module__ == errors.__name__)


def readme_error_rows() -> dict[str, list[str]]:
    """The rows of the table under docs/errors.md's "# Errors" heading: class name -> the other cells."""
    text = re.sub(r"^```.*?^```", "", ERRORS_PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    section = re.search(r"^# Errors\s*$(.*?)(?=^#{1,3} )", text + "\n# end", re.MULTILINE | re.DOTALL)
    assert section is not None, 'docs/errors.md has no "# Errors" section'
    rows: dict[str, list[str]] = {}
    for line in section.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`?([A-Za-z]+Error)`?(?: \(.*\))?", cells[0]) if line.lstrip().startswith("|") else None
        if name is not None:
            rows[name.group(1)] = cells[1:]
    return rows


def test_the_readme_table_lists_every_error_class_with_retry_and_status() -> None:
    rows = readme_error_rows()
    assert sorted(set(public_error_classes()) - set(rows)) == []
    assert sorted(set(rows) - set(public_error_classes())) == []
    for name, cells in rows.items():
        assert len(cells) >= 3 and all(cells[:3]), (name, cells)  # meaning, retry, HTTP status
        assert re.search(r"\b[45]\d\d\b", cells[2]), (name, cells)


def test_the_readme_status_lookup_takes_the_most_specific_class() -> None:
    """The errors page's ``status_of`` (a ``py`` block marked tested: status-of) runs as written."""
    block = readme_block("def status_of", "py")
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/errors.md status_of", "exec"), namespace)
    status_of = namespace["status_of"]
    assert status_of(InvalidInputError("invalid room_id", field="room_id")) == 400
    assert status_of(LedgerInputError("secure peer delivery role is invalid")) == 400
    assert status_of(RoomHistoryExpiredError("Group Chat history expired")) == 410
    assert status_of(RoomNotFoundError("hosted room not found")) == 404
    assert status_of(LedgerCapacityError("secure peer delivery capacity is full")) == 503
    assert status_of(ReplicaCapacityError("replica room capacity exhausted")) == 507
    assert status_of(MisuseError("wrong")) == 500
