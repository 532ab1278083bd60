"""The integrity verifier: clean on a consistent store; each invariant caught when broken on purpose."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

from hostedrooms import UnitOfWork, migrate
from hostedrooms.db import create_engine
from hostedrooms.integrity import verify
from hostedrooms.models import budget, deliveries, events, replica_events, replicas, retired_ids, rooms
from hostedrooms.validation import utf8_len


def _event(room_id: str, seq: int, epoch: int = 1, text: str = "hello") -> dict[str, object]:
    return {"room_id": room_id, "seq": seq, "event_id": f"e{seq}", "kind": "message.user",
            "actor_json": '{"id":"u1","kind":"user"}', "authority_epoch": epoch,
            "payload_json": json.dumps({"text": text}, ensure_ascii=False, separators=(",", ":")),
            "created_at": 10.0 + seq}


def _bytes(rows: list[dict[str, object]]) -> int:
    return sum(utf8_len(*(str(row[key]) for key in ("event_id", "kind", "actor_json", "payload_json")))
               for row in rows)


def _room(room_id: str, rows: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {"room_id": room_id, "name": "Room", "members_json": "[]", "authority_gateway_id": "install:a",
            "authority_epoch": 2, "next_seq": len(rows) + 1, "event_bytes": _bytes(rows), "created_at": 1.0,
            "updated_at": 1.0, "disbanded_at": None, **extra}


def _delivery(envelope_id: str, **extra: object) -> dict[str, object]:
    values: dict[str, object] = {
        "envelope_id": envelope_id, "request_id": f"req-{envelope_id}", "claim_digest": "d", "transport_role": "host",
        "connection_id": "c", "lease_token": "t", "team_id": "team", "source_server_identity": "s",
        "source_route_id": "sr", "source_route_revision": "1", "target_server_identity": "t",
        "target_route_id": "tr", "target_route_revision": "1", "target_chat_id": "chat",
        "action": "instruction", "kind": "instruction", "exchange_id": "x", "used_legs": 1, "max_legs": 6,
        "expires_at": 100, "body_json": "{}", "state": "running", "created_at": 1, "updated_at": 1,
        "queued_id": None, "run_id": None, "response_committed": 0, "response_request_id": None}
    values.update(extra)
    return values


def _populate(engine: sa.Engine) -> None:
    live = [_event("live", seq, epoch=1 if seq < 3 else 2, text="héllo ✓") for seq in (1, 2, 3)]
    gone = [_event("gone", 1)]
    copied = [_event("replica", seq) for seq in (1, 2)]
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(rooms), [_room("live", live), _room("gone", gone, disbanded_at=5.0), _room("empty", [])])
        uow.execute(sa.insert(events), live + gone)
        total = _bytes(live) + _bytes(gone)  # the budget accounts for every room's bytes, as the services keep it
        uow.execute(sa.delete(budget))
        uow.execute(sa.insert(budget).values(shard=0, used=total, allowance=total, spread_limit=0))
        uow.execute(sa.insert(retired_ids).values(room_id="gone", retired_at=5.0))
        uow.execute(sa.insert(replicas).values(
            room_id="replica", name="R", members_json="[]", authority_gateway_id="install:b", authority_epoch=1,
            last_seq=2, latest_seq=4, event_bytes=_bytes(copied), created_at=1.0, updated_at=1.0))
        uow.execute(sa.insert(replica_events), copied)
        uow.execute(sa.insert(deliveries), [_delivery("d1", queued_id="q1", run_id="run1"),
                                            _delivery("d2", run_id="run2", response_committed=1,
                                                      response_request_id="rq")])
        uow.commit()


def _drop_constraint(engine: sa.Engine, table: str, name: str, type_: str) -> None:
    with engine.begin() as connection:
        operations = Operations(MigrationContext.configure(connection))
        with operations.batch_alter_table(table) as batch:
            batch.drop_constraint(name, type_=type_)


def _write(engine: sa.Engine, *statements: sa.Executable) -> None:
    with UnitOfWork(engine) as uow:
        for statement in statements:
            uow.execute(statement)
        uow.commit()


def _gap(engine: sa.Engine) -> None:  # seqs 1, 2, 4 with next_seq 5: bytes still add up
    _write(engine, sa.update(events).where(events.c.room_id == "live", events.c.seq == 3).values(seq=4),
           sa.update(rooms).where(rooms.c.room_id == "live").values(next_seq=5))


def _extra_seq(engine: sa.Engine) -> None:
    _write(engine, sa.update(rooms).where(rooms.c.room_id == "live").values(next_seq=3))


def _bytes_drift(engine: sa.Engine) -> None:  # (the budget follows the room's bytes: only the events disagree)
    _write(engine, sa.update(rooms).where(rooms.c.room_id == "live").values(event_bytes=rooms.c.event_bytes + 1),
           sa.update(budget).values(used=budget.c.used + 1, allowance=budget.c.allowance + 1))


def _budget_drift(engine: sa.Engine) -> None:
    _write(engine, sa.update(budget).values(used=budget.c.used + 1, allowance=budget.c.allowance + 1))


def _budget_overpromised(engine: sa.Engine) -> None:
    _write(engine, sa.update(budget).values(allowance=budget.c.used + 10, spread_limit=budget.c.used + 9))


def _payload_changed(engine: sa.Engine) -> None:
    _write(engine, sa.update(events).where(events.c.room_id == "live", events.c.seq == 1)
           .values(payload_json='{"text":"hellö"}'))  # same characters, one more byte


def _duplicate_event_id(engine: sa.Engine) -> None:
    _drop_constraint(engine, "hosted_room_events", "uq_hosted_room_events_room_id_event_id", "unique")
    _write(engine, sa.update(events).where(events.c.room_id == "live", events.c.seq == 2).values(event_id="e1"))


def _epoch_above_room(engine: sa.Engine) -> None:
    _write(engine, sa.update(events).where(events.c.room_id == "live", events.c.seq == 3).values(authority_epoch=3))


def _unretired(engine: sa.Engine) -> None:
    _write(engine, sa.delete(retired_ids).where(retired_ids.c.room_id == "gone"))


def _orphan(engine: sa.Engine) -> None:
    _drop_constraint(engine, "hosted_room_events", "fk_hosted_room_events_room_id_hosted_rooms", "foreignkey")
    _write(engine, sa.insert(events).values(_event("nowhere", 1)))


def _replica_gap(engine: sa.Engine) -> None:
    _write(engine, sa.delete(replica_events).where(replica_events.c.seq == 1))


def _replica_overclaim(engine: sa.Engine) -> None:
    _write(engine, sa.update(replicas).values(last_seq=3))


def _replica_behind_latest(engine: sa.Engine) -> None:
    _write(engine, sa.update(replicas).values(latest_seq=1))


def _duplicate_owner(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        connection.execute(sa.text("DROP INDEX secure_peer_delivery_run_owner"))
    _write(engine, sa.update(deliveries).where(deliveries.c.envelope_id == "d2").values(run_id="run1"))


def _committed_without_request(engine: sa.Engine) -> None:
    _write(engine, sa.update(deliveries).where(deliveries.c.envelope_id == "d2").values(response_request_id=None))


CORRUPTIONS: dict[str, tuple[Callable[[sa.Engine], None], str, str]] = {
    "seq gap": (_gap, "room_seqs", "live"),
    "next_seq beyond the log": (_extra_seq, "room_seqs", "live"),
    "event_bytes drift": (_bytes_drift, "event_bytes", "live"),
    "budget shards differ from the rooms' bytes": (_budget_drift, "budget", "gateway"),
    "budget allowances above their spread limit": (_budget_overpromised, "budget", "gateway"),
    "payload bytes changed": (_payload_changed, "event_bytes", "live"),
    "duplicate event id": (_duplicate_event_id, "event_ids_unique", "live"),
    "event epoch above room": (_epoch_above_room, "event_epochs", "live"),
    "disbanded but not retired": (_unretired, "disbanded_retired", "gone"),
    "orphan event": (_orphan, "orphan_events", "nowhere"),
    "replica gap": (_replica_gap, "replica_log", "replica"),
    "replica last_seq beyond its events": (_replica_overclaim, "replica_log", "replica"),
    "replica latest_seq below last_seq": (_replica_behind_latest, "replica_log", "replica"),
    "two deliveries share a run owner": (_duplicate_owner, "delivery_owners", "run1"),
    "committed response without request id": (_committed_without_request, "delivery_states", "d2"),
}


def test_a_consistent_store_verifies_clean(engine: sa.Engine) -> None:
    assert verify(engine) == []
    _populate(engine)
    seen: list[str] = []
    assert verify(engine, progress=seen.append) == []
    assert "room_seqs" in seen and "storage" in seen


#: Corruptions that drop a constraint or an index: on PostgreSQL they get a database of their own, since the
#: worker's shared database would keep the weakened schema for every later test.
SCHEMA_ALTERING = frozenset({"duplicate event id", "orphan event", "two deliveries share a run owner"})


@pytest.fixture
def corruptible(request: pytest.FixtureRequest, backend: str) -> Iterator[Callable[[str], sa.Engine]]:
    """``corruptible(corruption)``: the test's engine, or a private migrated database for schema-altering ones."""
    engines: list[sa.Engine] = []

    def open_for(corruption: str) -> sa.Engine:
        if corruption in SCHEMA_ALTERING and backend == "postgresql":
            target = request.getfixturevalue("empty_target")
            migrate.upgrade(target)
            engines.append(create_engine(target))
            return engines[-1]
        engine: sa.Engine = request.getfixturevalue("engine")
        return engine

    yield open_for
    for engine in engines:
        engine.dispose()


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_each_broken_invariant_is_reported(corruptible: Callable[[str], sa.Engine], corruption: str) -> None:
    corrupt, check, subject = CORRUPTIONS[corruption]
    engine = corruptible(corruption)
    _populate(engine)
    corrupt(engine)
    found = verify(engine)
    assert [(violation.check, violation.subject) for violation in found] == [(check, subject)], found


#: Texts that decode to a value whose canonical text (sorted keys, no whitespace, non-ASCII as is) differs.
NON_CANONICAL = ('{"text": "hello"}', '{"text":"h\\u00e9llo"}', '{"b":1,"a":2}', '{"a":1,"a":2}', '{"x":1e15}',
                 '{"x":-0}', ' {}', '["\\/"]')


@pytest.mark.parametrize("text", NON_CANONICAL)
def test_a_non_canonical_stored_text_is_reported(engine: sa.Engine, text: str) -> None:
    _populate(engine)
    added = utf8_len(text) - utf8_len(_event("live", 2, text="héllo ✓")["payload_json"])  # type: ignore[arg-type]
    _write(engine,
           sa.update(events).where(events.c.room_id == "live", events.c.seq == 2).values(payload_json=text),
           sa.update(rooms).where(rooms.c.room_id == "live").values(event_bytes=rooms.c.event_bytes + added),
           sa.update(budget).values(used=budget.c.used + added, allowance=budget.c.used + added),
           sa.update(replica_events).where(replica_events.c.seq == 1).values(actor_json=text),
           sa.update(replicas).values(event_bytes=replicas.c.event_bytes + utf8_len(text)
                                      - len('{"id":"u1","kind":"user"}')))
    assert [str(violation) for violation in verify(engine)] == [
        "canonical_events: live: seq 2: its payload_json is not canonical JSON",
        "canonical_replica_events: replica: seq 1: its actor_json is not canonical JSON"]


def test_canonical_texts_of_every_kind_verify_clean(engine: sa.Engine) -> None:
    """What the reference's writer produces is canonical: unicode unescaped, control characters escaped, NaN."""
    _populate(engine)
    text = json.dumps({"z": [1.5, 1e100, None, True], "a": "é\x00\u2028\"😀", "n": float("nan")},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    added = utf8_len(text) - utf8_len(_event("live", 2, text="héllo ✓")["payload_json"])  # type: ignore[arg-type]
    _write(engine,
           sa.update(events).where(events.c.room_id == "live", events.c.seq == 2).values(payload_json=text),
           sa.update(rooms).where(rooms.c.room_id == "live").values(event_bytes=rooms.c.event_bytes + added),
           sa.update(budget).values(used=budget.c.used + added, allowance=budget.c.used + added))
    assert verify(engine) == []


def test_sqlite_page_corruption_is_reported(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "corrupt.db"
    migrate.upgrade(path)
    engine = create_engine(path)
    _populate(engine)
    with engine.begin() as connection:  # make an index disagree with its table
        connection.exec_driver_sql("PRAGMA writable_schema=ON")
        connection.exec_driver_sql(
            "UPDATE sqlite_master SET sql=replace(sql, 'state, updated_at', 'updated_at, state') "
            "WHERE name='secure_peer_delivery_state'")
    engine.dispose()
    engine = create_engine(path)
    try:
        found = verify(engine)
    finally:
        engine.dispose()
    assert any(violation.check == "storage" for violation in found), found
