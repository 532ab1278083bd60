"""The room log's store (:class:`hostedrooms.store.rooms.RoomStore`): each public method's contract, the budget
protocol, and the one-statement append returning None, having written nothing, on every guard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from hostedrooms import models
from hostedrooms.backends import ROOM_EVENTS_CHANNEL, Backend, backend_for
from hostedrooms.errors import StoreUnavailableError, translate
from hostedrooms.limits import LimitValues
from hostedrooms.store import REPLAY_COLUMNS, PostgreSQLRoomStore, RoomChange, RoomStore, SQLiteRoomStore, room_store
from hostedrooms.uow import UnitOfWork

from .support import SHORT_WAIT, Ev, OnBackend, in_thread, listening, lowered, room_values, snapshot

_rooms, _events, _budget = models.rooms, models.events, models.budget
#: A byte count far above anything these tests store.
ROOMY = 10**9
#: The gateway limit the default limits set: budgets are spread for it.
GATEWAY_LIMIT = LimitValues.read().MAX_GATEWAY_EVENT_BYTES


def _events_of(engine: Engine, room_id: str = "room-1") -> list[tuple[Any, ...]]:
    with UnitOfWork(engine, write=False) as uow:
        return [tuple(row) for row in uow.connection.execute(
            sa.select(_events).where(_events.c.room_id == room_id).order_by(_events.c.seq))]


def _room(engine: Engine, room_id: str = "room-1") -> dict[str, Any]:
    with UnitOfWork(engine, write=False) as uow:
        return dict(uow.connection.execute(sa.select(_rooms).where(_rooms.c.room_id == room_id)).mappings().one())


def _used(engine: Engine) -> int:
    with UnitOfWork(engine, write=False) as uow:
        return int(uow.connection.execute(sa.select(sa.func.coalesce(sa.func.sum(_budget.c.used), 0))).scalar_one())


class RoomStoreContract(OnBackend):
    """What every :class:`RoomStore` promises; a subclass names the backend and its store class."""

    store_class: ClassVar[type[RoomStore]]
    #: Whether a stored event id is answered with its stored row (else it surfaces as None: the full path decides).
    probes_stored_ids: ClassVar[bool]

    # -- helpers ---------------------------------------------------------------------------------------------

    def seed(self, engine: Engine, *rooms: dict[str, Any], events: Sequence[tuple[str, Ev]] = (),
             funded: int = GATEWAY_LIMIT) -> None:
        """Commit ``rooms`` (room_values), then ``events`` appended on the full path; the budget shards then rebuilt
        from the rooms' bytes (lock_budget's repair) and spread for a gateway limit of ``funded`` bytes."""
        with UnitOfWork(engine) as uow:
            for values in rooms:
                uow.rooms.insert_room(values)
            for room_id, event in events:
                head = uow.rooms.lock_room(room_id)
                assert head is not None
                assert uow.rooms.append_locked(room_id, int(head["next_seq"]), [event], now=1001.0) is not None
            uow.connection.execute(sa.delete(_budget))
            uow.rooms.lock_budget(funded)
            uow.commit()

    def append_once(self, engine: Engine, events: Sequence[Ev], *, gateway: str = "gw-local",
                    limits: LimitValues | None = None, room_id: str = "room-1") -> Any:
        """``append_one_statement`` in the unit the services give it, committed whatever it returned (a guard must
        have written nothing), except after an integrity failure, which the caller rolls back (as documented)."""
        one_statement = room_store(backend_for(engine)).one_statement_autocommits
        with (UnitOfWork.one_statement(engine) if one_statement else UnitOfWork(engine)) as uow:
            found = uow.rooms.append_one_statement(
                room_id, events, gateway_id=gateway, now=2000.0, limits=limits or LimitValues.read())
            uow.commit()
        return found

    # -- the registry ----------------------------------------------------------------------------------------

    def test_each_unit_binds_the_backends_store(self, engine: Engine, impl: Backend) -> None:
        with UnitOfWork(engine, write=False) as uow:
            assert type(uow.rooms) is self.store_class
            assert uow.rooms.connection is uow.connection and uow.rooms.backend is impl
            assert uow.rooms.budget_shards >= 1

    # -- reads of a room -------------------------------------------------------------------------------------

    def test_room_head_and_room_read_the_row_or_none(self, engine: Engine) -> None:
        self.seed(engine, room_values(epoch=3, next_seq=1), events=[("room-1", Ev("e1", authority_epoch=3))])
        with UnitOfWork(engine, write=False) as uow:
            assert uow.rooms.room_head("room-1") == {
                "next_seq": 2, "authority_gateway_id": "gw-local", "authority_epoch": 3, "disbanded_at": None}
            assert uow.rooms.room("room-1") == _room(engine)
            assert uow.rooms.room_head("absent") is None and uow.rooms.room("absent") is None
            assert uow.rooms.lock_room("absent") is None

    def test_lock_room_row_locks_the_room_until_the_unit_ends(self, engine: Engine, quick_engine: Engine,
                                                              impl: Backend) -> None:
        self.seed(engine, room_values(), room_values("room-2"))

        def touch(room_id: str) -> None:
            with quick_engine.connect() as connection:
                connection.begin()
                with impl.probe_timeouts(connection, SHORT_WAIT):
                    connection.execute(sa.update(_rooms).where(_rooms.c.room_id == room_id).values(name="X"))
                connection.commit()

        with UnitOfWork(engine) as uow:
            assert dict(uow.rooms.lock_room("room-1") or {}) == _room(engine)
            with pytest.raises(StoreUnavailableError):
                in_thread(lambda: _translated(touch, quick_engine, "room-1"))
            if uow.rooms.concurrent_writers:  # a row lock: the other room stays writable
                in_thread(lambda: touch("room-2"))
        in_thread(lambda: touch("room-1"))
        assert _room(engine)["name"] == "X"

    def test_lock_room_creation_excludes_a_second_creator(self, engine: Engine, quick_engine: Engine,
                                                          impl: Backend) -> None:
        def create() -> None:
            with quick_engine.connect() as connection:
                connection.begin()
                with impl.probe_timeouts(connection, SHORT_WAIT):
                    room_store(impl).bind(connection).lock_room_creation()
                    connection.execute(sa.insert(_rooms).values(**room_values("room-2")))
                connection.commit()

        with UnitOfWork(engine) as uow:
            uow.rooms.lock_room_creation()
            with pytest.raises(StoreUnavailableError):
                in_thread(lambda: _translated(create, quick_engine))
        in_thread(create)
        assert _room(engine, "room-2")["name"] == "Team"

    # -- writes ----------------------------------------------------------------------------------------------

    def test_advance_room_applies_only_at_the_expected_seq_and_fence(self, engine: Engine) -> None:
        self.seed(engine, room_values(gateway="gw-a", epoch=2))
        events = [Ev("e1"), Ev("e2")]
        with UnitOfWork(engine) as uow:
            store = uow.rooms
            assert not store.advance_room("room-1", 2, events, now=5.0)  # next_seq is 1
            assert not store.advance_room("room-1", 1, events, now=5.0, change=RoomChange(fence=("gw-b", 2)))
            assert not store.advance_room("room-1", 1, events, now=5.0, change=RoomChange(fence=("gw-a", 1)))
            assert store.advance_room("room-1", 1, events, now=5.0,
                                      change=RoomChange(name="Renamed", authority_epoch=3, fence=("gw-a", 2)))
            uow.commit()
        room = _room(engine)
        assert (room["next_seq"], room["event_bytes"], room["updated_at"]) == (3, sum(e.size for e in events), 5.0)
        assert (room["name"], room["authority_epoch"], room["revision"]) == ("Renamed", 3, 2)
        assert _events_of(engine) == []  # advance_room writes no event rows

    def test_append_locked_writes_rows_and_notifies_on_commit(self, engine: Engine) -> None:
        self.seed(engine, room_values())
        events = [Ev("e1"), Ev("e2", kind="message.edited")]
        with listening(engine, ROOM_EVENTS_CHANNEL) as received:
            with UnitOfWork(engine) as uow:
                rows = uow.rooms.append_locked("room-1", 1, events, now=7.0)
                assert rows is not None and [row["seq"] for row in rows] == [1, 2]
                assert received() == []  # not before the commit
                uow.commit()
            assert received(expected=True) == (["room-1"] if backend_for(engine).notifies else [])
        assert _events_of(engine) == [tuple(row[c.name] for c in _events.c) for row in rows]
        assert _room(engine)["next_seq"] == 3 and _room(engine)["event_bytes"] == sum(e.size for e in events)

    def test_append_locked_writes_nothing_when_the_fence_fails(self, engine: Engine) -> None:
        self.seed(engine, room_values(gateway="gw-a"))
        before = snapshot(engine)
        with UnitOfWork(engine) as uow:
            assert uow.rooms.append_locked("room-1", 2, [Ev("e1")], now=7.0) is None
            assert uow.rooms.append_locked("room-1", 1, [Ev("e1")], now=7.0,
                                           change=RoomChange(fence=("gw-b", 1))) is None
            uow.commit()
        assert snapshot(engine) == before

    def test_insert_events_and_the_event_lookups(self, engine: Engine) -> None:
        self.seed(engine, room_values(next_seq=4))
        rows = [{"room_id": "room-1", "seq": seq, "event_id": f"e{seq}", "kind": "message.created",
                 "actor_json": "{}", "authority_epoch": 1, "payload_json": "{}", "created_at": 1.0}
                for seq in (1, 2, 3)]
        with UnitOfWork(engine) as uow:
            uow.rooms.insert_events(rows[:1])
            uow.rooms.insert_events(rows[1:])
            uow.commit()
        with UnitOfWork(engine, write=False) as uow:
            assert dict(uow.rooms.event("room-1", "e2") or {}) == rows[1]
            assert uow.rooms.event("room-1", "nope") is None and uow.rooms.event("room-2", "e2") is None
            assert {key: dict(row) for key, row in uow.rooms.events("room-1", ["e1", "e3", "nope"]).items()} == {
                "e1": rows[0], "e3": rows[2]}
            assert uow.rooms.event_id_at("room-1", 3) == "e3" and uow.rooms.event_id_at("room-1", 4) is None

    def test_claim_event_is_the_latest_claim_of_the_epoch(self, engine: Engine) -> None:
        claim = "authority.claimed"
        self.seed(engine, room_values(), events=[
            ("room-1", Ev("c1", kind=claim, authority_epoch=1)), ("room-1", Ev("m1")),
            ("room-1", Ev("c2", kind=claim, authority_epoch=1)), ("room-1", Ev("m2", authority_epoch=2))])
        with UnitOfWork(engine, write=False) as uow:
            found = uow.rooms.claim_event("room-1", 1)
            assert found is not None and (found["event_id"], found["seq"]) == ("c2", 3)
            assert uow.rooms.claim_event("room-1", 2) is None  # m2 is no claim
            assert uow.rooms.claim_event("room-2", 1) is None

    def test_counts_gateway_bytes_and_active_rooms(self, engine: Engine) -> None:
        self.seed(engine, room_values(event_bytes=5), room_values("room-2", event_bytes=7, disbanded_at=9.0))
        with UnitOfWork(engine, write=False) as uow:
            assert uow.rooms.gateway_bytes() == 12  # disbanded rooms count too
            assert uow.rooms.active_rooms() == 1

    def test_list_rooms_by_latest_change_then_code_point(self, engine: Engine) -> None:
        self.seed(engine, room_values("b", now=5.0), room_values("B", now=5.0), room_values("a", now=3.0),
                  room_values("é", now=5.0), room_values("gone", now=9.0, disbanded_at=9.0))
        with UnitOfWork(engine, write=False) as uow:
            def ids(**kwargs: Any) -> list[str]:
                return [row["room_id"] for row in uow.rooms.list_rooms(**kwargs)]

            assert ids(include_disbanded=False, limit=10, offset=0) == ["B", "b", "é", "a"]
            assert ids(include_disbanded=True, limit=10, offset=0) == ["gone", "B", "b", "é", "a"]
            assert ids(include_disbanded=True, limit=2, offset=2) == ["b", "é"]
            assert uow.rooms.list_rooms(include_disbanded=False, limit=1, offset=0)[0] == _room(engine, "B")

    # -- replay ----------------------------------------------------------------------------------------------

    def test_replay_rows_stop_at_the_byte_bound(self, engine: Engine) -> None:
        events = [Ev(f"e{index}") for index in range(1, 6)]
        size = events[0].size
        self.seed(engine, room_values(), events=[("room-1", event) for event in events])
        stored = _events_of(engine)
        with UnitOfWork(engine, write=False) as uow:
            def replay(*, since: int = 0, latest: int = 5, limit: int = 10, max_bytes: int) -> tuple[list[int], int]:
                rows, total = uow.rooms.replay_rows("room-1", since=since, latest_seq=latest, limit=limit,
                                                    max_bytes=max_bytes, max_event_bytes=size)
                for row in rows:  # the replay columns in order, then the backend's own value
                    assert tuple(row[:len(REPLAY_COLUMNS)]) == stored[int(row[1]) - 1]
                page = uow.rooms.event_page("room-1", since=since, latest_seq=latest, limit=limit,
                                            max_bytes=max_bytes)
                assert [int(row["seq"]) for row in page] == [int(row[1]) for row in rows]  # the plain path agrees
                return [int(row[1]) for row in rows], total

            assert replay(max_bytes=3 * size) == ([1, 2, 3], 3 * size)
            assert replay(max_bytes=3 * size - 1) == ([1, 2], 2 * size)
            assert replay(max_bytes=size - 1) == ([], 0)
            assert replay(max_bytes=ROOMY, limit=2) == ([1, 2], 2 * size)
            assert replay(max_bytes=ROOMY, since=1, latest=4) == ([2, 3, 4], 3 * size)

    def test_read_page_is_the_head_and_its_rows(self, engine: Engine) -> None:
        events = [Ev(f"e{index}") for index in range(1, 4)]
        self.seed(engine, room_values(), events=[("room-1", event) for event in events])
        with UnitOfWork(engine, write=False) as uow:
            head, rows, total = uow.rooms.read_page("room-1", since=1, limit=10, max_bytes=ROOMY,
                                                    max_event_bytes=events[0].size)
            assert head == uow.rooms.room_head("room-1")
            assert [row[1] for row in rows] == [2, 3] and total == 2 * events[0].size
            assert uow.rooms.read_page("absent", since=0, limit=10, max_bytes=ROOMY, max_event_bytes=1) == (
                None, [], 0)

    # -- retirement and purging ---------------------------------------------------------------------------------

    def test_retire_reserves_only_disbanded_rooms_and_is_idempotent(self, engine: Engine) -> None:
        self.seed(engine, room_values("live"), room_values("gone", disbanded_at=42.0))
        with UnitOfWork(engine) as uow:
            uow.rooms.retire(["live", "gone", "absent"])
            uow.rooms.retire(["gone"])
            uow.commit()
        with UnitOfWork(engine, write=False) as uow:
            assert uow.rooms.is_retired("gone") and uow.rooms.retired_at("gone") == 42.0
            assert not uow.rooms.is_retired("live") and uow.rooms.retired_at("live") is None
            assert not uow.rooms.is_retired("absent")

    def test_prunable_and_oldest_disbanded(self, engine: Engine) -> None:
        self.seed(engine, room_values("live"), room_values("d1", disbanded_at=10.0, event_bytes=3),
                  room_values("d2", disbanded_at=20.0, event_bytes=4), room_values("d3", disbanded_at=30.0))
        with UnitOfWork(engine, write=False) as uow:
            assert uow.rooms.disbanded_oldest_first() == [("d1", 3), ("d2", 4), ("d3", 0)]
            assert uow.rooms.prunable_rooms(disbanded_before=None, keep=1) == {"d1", "d2"}
            assert uow.rooms.prunable_rooms(disbanded_before=10.0, keep=5) == {"d1"}
            assert uow.rooms.prunable_rooms(disbanded_before=None, keep=3) == set()

    def test_purge_retires_and_deletes_every_dependent_row(self, engine: Engine) -> None:
        self.seed(engine, room_values("keep"), room_values("gone"), events=[("gone", Ev("e1")), ("keep", Ev("e1"))])
        with UnitOfWork(engine) as uow:
            uow.connection.execute(sa.update(_rooms).where(_rooms.c.room_id == "gone").values(disbanded_at=50.0))
            _dependents(uow.connection, "gone")
            _dependents(uow.connection, "keep")
            assert uow.rooms.purge(["gone"]) == Ev("e1").size
            uow.commit()
        after = snapshot(engine)
        for table in (models.links, models.peer_reservations, models.remote_runs, models.events, models.rooms):
            assert {row[0] for row in after[table.name]} == {"keep"}, table.name
        assert after[models.retired_ids.name] == [("gone", 50.0)]

    def test_copy_replica_log_copies_row_for_row(self, engine: Engine) -> None:
        self.seed(engine, room_values(next_seq=3))
        rows = [{"room_id": "room-1", "seq": seq, "event_id": f"e{seq}", "kind": "k", "actor_json": "{}",
                 "authority_epoch": 1, "payload_json": "{}", "created_at": 1.0} for seq in (1, 2)]
        with UnitOfWork(engine) as uow:
            uow.connection.execute(sa.insert(models.replicas).values(
                room_id="room-1", name="n", members_json="[]", authority_gateway_id="gw-a", authority_epoch=1,
                last_seq=2, latest_seq=2, event_bytes=0, created_at=1.0, updated_at=1.0))
            uow.connection.execute(sa.insert(models.replica_events), rows)
            uow.rooms.copy_replica_log("room-1")
            uow.commit()
        assert _events_of(engine) == [tuple(row.values()) for row in rows]

    # -- the gateway budget ------------------------------------------------------------------------------------

    def test_lock_budget_restores_missing_shards_and_reads_the_exact_total(self, engine: Engine) -> None:
        self.seed(engine, room_values(event_bytes=30), room_values("room-2", event_bytes=12))
        with UnitOfWork(engine) as uow:
            uow.connection.execute(sa.delete(_budget))
            assert uow.rooms.lock_budget(100) == 42
            shards = uow.connection.execute(sa.select(_budget).order_by(_budget.c.shard)).mappings().all()
            assert [row["shard"] for row in shards] == list(range(uow.rooms.budget_shards))
            assert sum(row["used"] for row in shards) == 42
            assert sum(row["allowance"] - row["used"] for row in shards) == 100 - 42
            assert {row["spread_limit"] for row in shards} == {100}

    def test_settle_spreads_the_free_bytes_and_take_budget_stays_within_them(self, engine: Engine) -> None:
        self.seed(engine, room_values(event_bytes=10))
        with UnitOfWork(engine) as uow:
            store = uow.rooms
            total = store.lock_budget(50)
            assert total == 10
            store.settle_budget(total, 50)
            shards = uow.connection.execute(sa.select(_budget.c.used, _budget.c.allowance)).all()
            assert sum(used for used, _ in shards) == 10 and sum(a - u for u, a in shards) == 40
            assert not store.take_budget(5, 49)  # spread for a higher limit than the caller's
            free = max(allowance - used for used, allowance in shards)
            assert not store.take_budget(free + 1, 50)
            assert store.take_budget(free, 50)
            assert sum(uow.connection.execute(sa.select(_budget.c.used)).scalars()) == 10 + free
            store.settle_budget(60, 50)  # at or above the limit: nothing free anywhere
            assert not store.take_budget(1, 50)
            assert sum(uow.connection.execute(sa.select(_budget.c.used)).scalars()) == 60

    def test_lock_budget_excludes_a_concurrent_taker(self, engine: Engine, quick_engine: Engine,
                                                     impl: Backend) -> None:
        self.seed(engine, room_values())

        def take() -> bool:
            with quick_engine.connect() as connection:
                connection.begin()
                with impl.probe_timeouts(connection, SHORT_WAIT):
                    taken = room_store(impl).bind(connection).take_budget(1, ROOMY)
                connection.commit()
                return taken

        with UnitOfWork(engine) as uow:
            uow.rooms.lock_budget(ROOMY)
            if uow.rooms.concurrent_writers:  # a taker skips locked shards (never waits): none is left to it
                assert in_thread(take) is False
            else:  # the one shard: the taker waits for it, here past its bound
                with pytest.raises(StoreUnavailableError):
                    in_thread(lambda: _translated(take, quick_engine))
        assert in_thread(take)

    # -- the one-statement append --------------------------------------------------------------------------------

    def test_append_one_statement_writes_what_the_full_path_writes(self, engine: Engine) -> None:
        events = [Ev("e1"), Ev("e2", payload_json='{"text":"\u00e9"}')]
        self.seed(engine, room_values(), room_values("room-2"))
        with listening(engine, ROOM_EVENTS_CHANNEL) as received:
            written, stored = self.append_once(engine, events[:1])
            assert received(expected=True) == (["room-1"] if backend_for(engine).notifies else [])
        batch, _ = self.append_once(engine, [*events[1:], Ev("e3")])
        assert stored == {} and [row["seq"] for row in [*written, *batch]] == [1, 2, 3]
        with UnitOfWork(engine) as uow:  # the full path, on the twin room
            full = uow.rooms.append_locked("room-2", 1, events[:1], now=2000.0)
            full += uow.rooms.append_locked("room-2", 2, [*events[1:], Ev("e3")], now=2000.0) or []
            uow.commit()
        assert [row[1:] for row in _events_of(engine)] == [row[1:] for row in _events_of(engine, "room-2")]
        assert [{**row, "room_id": "room-2"} for row in [*written, *batch]] == full
        one, other = _room(engine), _room(engine, "room-2")
        assert (one["next_seq"], one["event_bytes"]) == (other["next_seq"], other["event_bytes"]) == (
            4, sum(e.size for e in events) + Ev("e3").size)
        assert _used(engine) == one["event_bytes"]  # only the one-statement path charges the budget here

    @pytest.mark.parametrize("case", [
        "wrong gateway", "wrong epoch", "disbanded", "count cap", "room byte cap", "budget short",
        "spread for a higher limit", "control in a batch", "absent room"])
    def test_append_one_statement_guards_return_none_and_write_nothing(self, engine: Engine, case: str) -> None:
        limits = LimitValues.read()
        events = [Ev("e9")]
        funded = GATEWAY_LIMIT
        room = room_values(gateway="gw-local", epoch=2, next_seq=5, event_bytes=100)
        gateway, room_id = "gw-local", "room-1"
        if case == "wrong gateway":
            gateway = "gw-other"
        elif case == "wrong epoch":
            events = [Ev("e9", authority_epoch=1)]
        elif case == "disbanded":
            room["disbanded_at"] = 1500.0
        elif case == "count cap":
            limits = lowered(MAX_EVENTS_PER_ROOM=4)
        elif case == "room byte cap":
            limits = lowered(MAX_ROOM_EVENT_BYTES=100 + Ev("e9").size - 1)
        elif case == "budget short":
            funded = 100 + Ev("e9").size - 1
        elif case == "spread for a higher limit":
            limits = lowered(MAX_GATEWAY_EVENT_BYTES=GATEWAY_LIMIT - 1)
        elif case == "control in a batch":
            events = [Ev("e8", authority_epoch=2), Ev("e9", kind="room.renamed", authority_epoch=2, control=True)]
        else:
            room_id = "room-2"
        if case not in ("wrong epoch", "control in a batch"):
            events = [Ev("e9", authority_epoch=2)]
        self.seed(engine, room, funded=funded)
        before = snapshot(engine)
        assert self.append_once(engine, events, gateway=gateway, limits=limits, room_id=room_id) is None
        assert snapshot(engine) == before

    def test_append_one_statement_applies_at_the_caps(self, engine: Engine) -> None:
        """The guards' boundaries: one event that just fits the room's caps applies (the guards above are not loose).
        (The gateway budget's boundary is a shard's allowance, a share of the free bytes where there are several.)"""
        event = Ev("e9", authority_epoch=2)
        self.seed(engine, room_values(epoch=2, next_seq=5, event_bytes=100))
        limits = lowered(MAX_EVENTS_PER_ROOM=5, MAX_ROOM_EVENT_BYTES=100 + event.size)
        written, _ = self.append_once(engine, [event], limits=limits)
        assert [row["seq"] for row in written] == [5]

    def test_append_one_statement_of_a_stored_id_writes_nothing(self, engine: Engine) -> None:
        self.seed(engine, room_values(), events=[("room-1", Ev("e1"))])
        before = snapshot(engine)
        one_statement = room_store(backend_for(engine)).one_statement_autocommits
        with (UnitOfWork.one_statement(engine) if one_statement else UnitOfWork(engine)) as uow:
            found = uow.rooms.append_one_statement("room-1", [Ev("e1")], gateway_id="gw-local", now=2000.0,
                                                   limits=LimitValues.read())
            if self.probes_stored_ids:
                assert found is not None and found[0] == []
                assert {key: dict(row) for key, row in found[1].items()} == {
                    "e1": dict(zip([c.name for c in _events.c], _events_of(engine)[0], strict=True))}
                uow.commit()
            else:  # the unique constraint refused it: the caller rolls back
                assert found is None
        assert snapshot(engine) == before

    def test_append_one_statement_of_a_repeated_id_in_a_batch_writes_nothing(self, engine: Engine) -> None:
        self.seed(engine, room_values())
        before = snapshot(engine)
        one_statement = room_store(backend_for(engine)).one_statement_autocommits
        with (UnitOfWork.one_statement(engine) if one_statement else UnitOfWork(engine)) as uow:
            assert uow.rooms.append_one_statement("room-1", [Ev("e1"), Ev("e1")], gateway_id="gw-local",
                                                  now=2000.0, limits=LimitValues.read()) is None
        assert snapshot(engine) == before


def _translated(work: Any, engine: Engine, *args: Any) -> Any:
    """``work(*args)`` with its driver error translated (as a unit of work would)."""
    try:
        return work(*args)
    except sa_exc.SQLAlchemyError as exc:
        raise translate(exc, engine.url) from exc


def _dependents(connection: sa.Connection, room_id: str) -> None:
    """One row of each table that depends on room ``room_id`` (a link, a reservation, a remote-run receipt)."""
    connection.execute(sa.insert(models.links).values(
        room_id=room_id, member_id="m1", target_url="https://peer.invalid", target_profile="p", grant="g",
        catalog_json="{}", cancellation_scope_id="c", trace_id="t", transport_security="tls", status="ready",
        updated_at=1.0))
    connection.execute(sa.insert(models.peer_reservations).values(
        room_id=room_id, member_id="m1", target_profile="p", authority_gateway_id="gw-a", authority_epoch=1,
        expires_at=99.0, revoked_at=None, created_at=1.0, updated_at=1.0))
    connection.execute(sa.insert(models.remote_runs).values(
        room_id=room_id, home_install_id="h", authority_gateway_id="gw-a", authority_epoch=1, member_id="m1",
        target_install_id="t", target_profile="p", task_id="task", execution_generation=1, run_id="run",
        session_id="s", created_at=1.0, updated_at=1.0))


class TestRoomStoreSQLite(RoomStoreContract):
    backend_name = "sqlite"
    store_class = SQLiteRoomStore
    probes_stored_ids = False


class TestRoomStorePostgreSQL(RoomStoreContract):
    backend_name = "postgresql"
    store_class = PostgreSQLRoomStore
    probes_stored_ids = True
