"""Adopting reference ``state.db`` files in place: every legacy generation, every row kept (SQLite only, since
the reference wrote SQLite files; the fresh path on both backends is covered by test_migrations.py).

Row checks use Core selects on the models tables. TODO(lead): once hostedrooms.rooms / ledger exist, the
room/event checks (legacy actor, NULL epoch, authority 'legacy'@1, event_bytes) and the outbound-intent checks
should also read through the public API (read_events / room_state / pending_outbound_for_connection).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.util import load_python_file
from test_legacy_schemas import (
    BIG_PAYLOAD,
    DELIVERIES_DRAFT,
    DELIVERY_LATER,
    DELIVERY_STATES,
    EVENTS_DRAFT,
    HOST_TABLES,
    INTENTS_DRAFT,
    INTENTS_TOUCHED,
    LEDGER_CURRENT,
    LEGACY_ACTOR,
    LEGACY_INTENTS,
    REMOTE_RUNS_HOME,
    REMOTE_RUNS_OLDEST,
    REPLICA_TABLES,
    ROOM_TABLES_CURRENT,
    ROOMS_DRAFT,
    build,
    delivery,
    dump,
    insert,
    intent,
    rows,
)

import hostedrooms
from hostedrooms import migrate, models, peers
from hostedrooms import rooms as public_rooms
from hostedrooms.db import create_engine
from hostedrooms.errors import HostedRoomError
from hostedrooms.ledger import DeliveryLedger

HEAD = migrate.head_revision()

#: The frozen adoption code the revisions run, the very module objects they use (see alembic/versions/frozen).
legacy = load_python_file(migrate.script_location() / "versions" / "frozen", "__init__.py").load("adoption_0001")


def _upgrade(path: Path) -> sa.Engine:
    engine = create_engine(path)
    migrate.upgrade(engine)
    return engine


def _select(engine: sa.Engine, table: sa.Table) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        ordered = connection.execute(sa.select(table).order_by(*table.primary_key.columns))
        return [dict(row._mapping) for row in ordered]


def _drift(engine: sa.Engine) -> list[Any]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={
            "include_object": migrate.include_object, "compare_type": True, "compare_server_default": True})
        return list(compare_metadata(context, models.metadata))


def _generation(path: Path) -> legacy.Generation:
    engine = create_engine(path)
    try:
        with engine.connect() as connection:
            return legacy.detect_generation(connection)
    finally:
        engine.dispose()


def _host_state(path: Path) -> dict[str, Any]:
    data = dump(path)
    return {name: data["data"][name] for name in ("alembic_version", "host_orders", "host_log")} | {
        "schema": [entry for entry in data["schema"] if entry[2].startswith("host_") or entry[1] == "alembic_version"]}


def _room(room_id: str, **extra: Any) -> dict[str, Any]:
    row = {"room_id": room_id, "name": f"Rööm {room_id} ☃", "members_json": json.dumps(
        [{"id": "m1", "label": "Zoë"}], ensure_ascii=False), "next_seq": 1, "revision": 1, "created_at": 1.5,
        "updated_at": 2.25, "disbanded_at": None}
    row.update(extra)
    return row


def _utf8(*parts: str) -> int:
    return sum(len(part.encode("utf-8")) for part in parts)


# --- the generations -------------------------------------------------------------------------------------------


def _current_reference(path: Path) -> None:
    """Every table as the current reference writes it, one row of each kind, beside a host application."""
    db = build(path, *ROOM_TABLES_CURRENT, *REPLICA_TABLES, *LEDGER_CURRENT, *HOST_TABLES)
    insert(db, "hosted_rooms", _room("live", authority_gateway_id="install:a", authority_epoch=3, next_seq=2,
                                     event_bytes=_utf8("e1", "message.user", '{"id":"u","kind":"user"}', BIG_PAYLOAD)))
    insert(db, "hosted_rooms", _room("gone", authority_gateway_id="install:a", disbanded_at=9.5))
    insert(db, "hosted_room_retired_ids", {"room_id": "gone", "retired_at": 9.5})
    insert(db, "hosted_room_events", {"room_id": "live", "seq": 1, "event_id": "e1", "kind": "message.user",
                                      "actor_json": '{"id":"u","kind":"user"}', "authority_epoch": 3,
                                      "payload_json": BIG_PAYLOAD, "created_at": 2.0})
    insert(db, "hosted_room_links", {"room_id": "live", "member_id": "m1", "target_url": "https://x/ü",
                                     "target_profile": "p", "grant": "secret", "catalog_json": "{}",
                                     "cancellation_scope_id": "c", "trace_id": "t", "transport_security": "tls",
                                     "updated_at": 3.0})
    insert(db, "hosted_room_remote_runs", {"room_id": "live", "home_install_id": "h", "authority_gateway_id": "g",
                                           "authority_epoch": 2, "member_id": "m", "task_id": "t",
                                           "execution_generation": 1, "target_install_id": "ti",
                                           "target_profile": "tp", "run_id": "r", "session_id": "s",
                                           "created_at": 1.0, "updated_at": 2.0})
    insert(db, "hosted_room_revoked_grants", {"scope_key": "k" * 64, "expires_at": 99.0, "revoked_before": 5.0})
    insert(db, "hosted_room_peer_reservations", {"room_id": "live", "member_id": "m", "target_profile": "p",
                                                 "authority_gateway_id": "g", "authority_epoch": 1,
                                                 "expires_at": 50.0, "revoked_at": None, "created_at": 1.0,
                                                 "updated_at": 1.0})
    insert(db, "hosted_room_replicas", {"room_id": "rep", "name": "Replica ☃", "members_json": "[]",
                                        "authority_gateway_id": "install:b", "authority_epoch": 2, "last_seq": 1,
                                        "latest_seq": 4, "event_bytes": 10, "created_at": 1.0, "updated_at": 1.0})
    insert(db, "hosted_room_replica_events", {"room_id": "rep", "seq": 1, "event_id": "x", "kind": "room.created",
                                              "actor_json": "{}", "authority_epoch": None, "payload_json": "{}",
                                              "created_at": 1.0})
    for state in DELIVERY_STATES:
        insert(db, "secure_peer_deliveries", delivery(f"env-{state}", state, draft=False))
    insert(db, "secure_peer_outbound_intents", intent("req-1", "{}", route=("c", "r", "1"), state="committed"))
    insert(db, "host_orders", {"id": 1, "room_id": "live", "note": "kept ü"})
    db.close()


def _draft_rooms(path: Path) -> None:
    """Draft room layout (no authority, actor or byte columns), an old remote-run key, no retired-id table."""
    db = build(path, ROOMS_DRAFT, EVENTS_DRAFT, REMOTE_RUNS_OLDEST, *HOST_TABLES)
    insert(db, "hosted_rooms", _room("r1", next_seq=4, revision=3))
    insert(db, "hosted_rooms", _room("r2", next_seq=2, disbanded_at=7.25))
    insert(db, "hosted_rooms", _room("empty"))
    events = [("r1", 1, "e1", "room.created", '{"name":"Rööm"}'), ("r1", 2, "user:☃", "message.user", BIG_PAYLOAD),
              ("r1", 3, "e3", "room.renamed", "{}"), ("r2", 1, "e1", "room.disbanded", '{"why":"ünïcode"}')]
    for room_id, seq, event_id, kind, payload in events:
        insert(db, "hosted_room_events", {"room_id": room_id, "seq": seq, "event_id": event_id, "kind": kind,
                                          "payload_json": payload, "created_at": float(seq)})
    insert(db, "hosted_room_remote_runs", {"room_id": "r1", "member_id": "m", "task_id": "t",
                                           "execution_generation": 2, "target_install_id": "ti",
                                           "target_profile": "tp", "run_id": "run-ü", "session_id": "s",
                                           "created_at": 1.0, "updated_at": 2.0})
    insert(db, "host_orders", {"id": 1, "room_id": "r1", "note": "kept"})
    db.close()


def _draft_ledger(path: Path, intents: tuple[str, ...] = INTENTS_DRAFT) -> None:
    db = build(path, *DELIVERIES_DRAFT, *intents, *HOST_TABLES[:2], *HOST_TABLES[3:])
    for state in DELIVERY_STATES:
        insert(db, "secure_peer_deliveries", delivery(f"env-{state}", state, draft=True))
    for request_id, snapshot_json, _ in LEGACY_INTENTS:
        insert(db, "secure_peer_outbound_intents", intent(request_id, snapshot_json, route=None))
    db.close()


def _mixed(path: Path) -> None:
    """Rooms at the current layout with an old remote-run key, a draft ledger, replica tables missing."""
    statements = [s for s in ROOM_TABLES_CURRENT if "hosted_room_remote_runs" not in s]
    db = build(path, *statements, REMOTE_RUNS_HOME, *DELIVERIES_DRAFT, *INTENTS_TOUCHED, *HOST_TABLES)
    insert(db, "hosted_rooms", _room("live", authority_gateway_id="install:a"))
    insert(db, "hosted_room_remote_runs", {"room_id": "live", "home_install_id": "home", "member_id": "m",
                                           "task_id": "t", "execution_generation": 1, "target_install_id": "ti",
                                           "target_profile": "tp", "run_id": "r", "session_id": "s",
                                           "created_at": 1.0, "updated_at": 2.0})
    insert(db, "secure_peer_deliveries", delivery("env", "queued", draft=True))
    for request_id, snapshot_json, _ in LEGACY_INTENTS:
        insert(db, "secure_peer_outbound_intents", intent(request_id, snapshot_json, route=None))
    db.close()


GENERATIONS = {"current": _current_reference, "draft_rooms": _draft_rooms, "draft_ledger": _draft_ledger,
               "mixed": _mixed}


# --- detection ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("builder", "kind", "traits"), [
    ("current", legacy.REFERENCE, {"reference_layout"}),
    ("draft_rooms", legacy.LEGACY, {"draft_rooms", "draft_events", "remote_run_key", "unretired_disbanded",
                                    "reference_layout"}),
    ("draft_ledger", legacy.LEGACY, {"delivery_columns", "outbound_columns", "reference_layout"}),
    ("mixed", legacy.LEGACY, {"remote_run_key", "delivery_columns", "outbound_routes", "reference_layout"}),
])
def test_detect_generation_of_reference_files(tmp_path: Path, builder: str, kind: str, traits: set[str]) -> None:
    path = tmp_path / "state.db"
    GENERATIONS[builder](path)
    generation = _generation(path)
    assert (generation.kind, set(generation.traits)) == (kind, traits)
    # (The baseline's tables: those of later revisions, the budget of 0008, are not part of a generation.)
    assert generation.present | generation.missing == set(models.metadata.tables) - {models.budget.name}


def test_detect_generation_of_empty_and_managed_files(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    build(path, *HOST_TABLES[3:]).close()  # only a host application's table
    assert _generation(path).kind == legacy.EMPTY
    _upgrade(path).dispose()
    managed = _generation(path)
    assert (managed.kind, managed.missing, set(managed.traits)) == (legacy.MANAGED, frozenset(), set())


# --- adoption, generation by generation --------------------------------------------------------------------------


def test_current_reference_database_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _current_reference(path)
    before = dump(path)["data"]
    host = _host_state(path)
    engine = _upgrade(path)
    try:
        assert migrate.current_revision(engine) == HEAD
        after = dump(path)["data"]
        for table in set(models.metadata.tables) - {models.budget.name}:  # (0008 creates and fills the budget)
            assert sorted(after[table], key=repr) == sorted(before[table], key=repr), table
        assert _host_state(path) == host
        assert _drift(engine) == []
        assert hostedrooms.verify(engine) == []
    finally:
        engine.dispose()


def test_draft_room_layout_gets_the_reference_legacy_semantics(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    host = _host_state(path)
    engine = _upgrade(path)
    try:
        rooms = {row["room_id"]: row for row in _select(engine, models.rooms)}
        assert {r["authority_gateway_id"] for r in rooms.values()} == {"legacy"}
        assert {r["authority_epoch"] for r in rooms.values()} == {1}
        assert (rooms["r1"]["name"], rooms["r1"]["next_seq"], rooms["r1"]["revision"]) == ("Rööm r1 ☃", 4, 3)
        events = _select(engine, models.events)
        assert len(events) == 4
        assert {(e["actor_json"], e["authority_epoch"]) for e in events} == {(LEGACY_ACTOR, None)}
        assert json.loads(LEGACY_ACTOR) == {"kind": "system", "id": "legacy"}
        for room_id, room in rooms.items():
            expected = sum(_utf8(e["event_id"], e["kind"], e["actor_json"], e["payload_json"])
                           for e in events if e["room_id"] == room_id)
            assert room["event_bytes"] == expected, room_id
        assert rooms["r1"]["event_bytes"] > len(BIG_PAYLOAD)  # UTF-8 bytes, not characters
        assert rooms["empty"]["event_bytes"] == 0
        assert _select(engine, models.retired_ids) == [{"room_id": "r2", "retired_at": 7.25}]
        assert rooms["r2"]["disbanded_at"] == 7.25  # the room row itself is kept
        run = _select(engine, models.remote_runs)
        assert [(r["home_install_id"], r["authority_gateway_id"], r["authority_epoch"], r["run_id"]) for r in run] == [
            ("legacy", "legacy", 1, "run-ü")]
        assert _host_state(path) == host
        assert _drift(engine) == []
        # Through the public API, with the reference's legacy semantics.
        state = public_rooms.room_state(engine, room_id="r1")
        assert (state["authority_gateway_id"], state["authority_epoch"], state["latest_seq"]) == ("legacy", 1, 3)
        page = public_rooms.read_events(engine, room_id="r1", since_seq=0, limit=500)
        assert [event["seq"] for event in page["events"]] == [1, 2, 3]
        assert all(event["actor"] == {"kind": "system", "id": "legacy"} and event["authority_epoch"] is None
                   for event in page["events"])
        assert page["authority"] == {"gateway_id": "legacy", "epoch": 1}
        with pytest.raises(HostedRoomError):  # the disbanded room is not live, but its history is kept
            public_rooms.read_events(engine, room_id="r2")
        assert public_rooms.read_events(engine, room_id="r2", include_disbanded=True)["latest_seq"] >= 0
        receipts = peers.list_remote_run_receipts(engine)
        assert [(r["home_install_id"], r["authority_gateway_id"], r["authority_epoch"], r["run_id"])
                for r in receipts] == [("legacy", "legacy", 1, "run-ü")]
        # The draft's "user:☃" is kept and read locally, but no replica would ingest it (issue 14): verify says so.
        assert [str(v) for v in hostedrooms.verify(engine)] == [
            "readable_events: r1: seq 2: its event_id does not pass the append rules"]
    finally:
        engine.dispose()


def test_remote_runs_keep_known_lineage_and_take_the_identity_key(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _mixed(path)
    engine = _upgrade(path)
    try:
        runs = _select(engine, models.remote_runs)
        assert [(r["home_install_id"], r["authority_gateway_id"], r["authority_epoch"]) for r in runs] == [
            ("home", "legacy", 1)]
        with engine.connect() as connection:
            key = sa.inspect(connection).get_pk_constraint("hosted_room_remote_runs")
        assert tuple(key["constrained_columns"]) == models.REMOTE_RUN_IDENTITY_COLUMNS
        assert key["name"] == "pk_hosted_room_remote_runs"
    finally:
        engine.dispose()


@pytest.mark.parametrize("intents", [INTENTS_DRAFT, INTENTS_TOUCHED], ids=["columns-missing", "repair-never-committed"])
def test_legacy_ledger_is_backfilled_and_fails_closed(tmp_path: Path, intents: tuple[str, ...]) -> None:
    path = tmp_path / "state.db"
    _draft_ledger(path, intents)
    before = {row["envelope_id"]: row for row in _sqlite_rows(path, "secure_peer_deliveries")}
    engine = _upgrade(path)
    try:
        deliveries = {row["envelope_id"]: row for row in _select(engine, models.deliveries)}
        assert {row["state"] for row in deliveries.values()} == set(DELIVERY_STATES)
        for envelope_id, row in deliveries.items():
            assert {k: v for k, v in row.items() if k not in DELIVERY_LATER} == before[envelope_id]
            assert (row["request_id"], row["lease_token"], row["team_id"]) == ("", "", "")
            assert (row["admission_attempts"], row["response_attempts"]) == (0, 0)
            assert row["response_request_id"] is None and row["parent_leg"] is None
        intents_after = {row["request_id"]: row for row in _select(engine, models.outbound_intents)}
        for request_id, _, route in LEGACY_INTENTS:
            row = intents_after[request_id]
            got = (row["connection_id"], row["source_route_id"], row["source_route_revision"])
            if route is None:
                assert (row["state"], row["retry_at"], row["last_error"], got) == (
                    "failed", None, "invalid legacy secure peer route snapshot", ("", "", ""))
            else:
                expected = ("pending", 1_700_000_100, None, route)
                assert (row["state"], row["retry_at"], row["last_error"], got) == expected
            assert (row["attempts"], row["updated_at"], row["body"]) == (2, 1_700_000_005, "bödy ☃")
        with engine.connect() as connection:
            indexes = {ix["name"] for ix in sa.inspect(connection).get_indexes("secure_peer_outbound_intents")}
        assert {"secure_peer_outbound_source", "secure_peer_outbound_connection"} <= indexes
        assert _drift(engine) == []
        # Through the public API: every delivery reads back, and the backfilled routes find their intents
        # (the reference's repair never committed, so its own route queries never saw them).
        ledger = DeliveryLedger(engine)
        for envelope_id, row in deliveries.items():
            public = ledger.get(envelope_id)
            assert public is not None and public["state"] == row["state"]
            assert public["body"] == json.loads(row["body_json"])
        for request_id, _, route in LEGACY_INTENTS:
            if route is not None:
                pending = ledger.pending_outbound_for_route(*route, now=1_700_000_200)
                assert [item["request_id"] for item in pending] == [request_id]
        assert hostedrooms.verify(engine) == []
    finally:
        engine.dispose()


def _sqlite_rows(path: Path, table: str) -> list[dict[str, Any]]:
    db = build(path)
    try:
        return rows(db, table)
    finally:
        db.close()


def test_mixed_generations_with_host_application(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _mixed(path)
    host = _host_state(path)
    engine = _upgrade(path)
    try:
        assert migrate.current_revision(engine) == HEAD
        assert _host_state(path) == host
        assert _select(engine, models.replicas) == []  # created, empty
        command.check(migrate.alembic_config(engine))
        assert _generation(path).kind == legacy.MANAGED
        assert hostedrooms.verify(engine) == []
    finally:
        engine.dispose()


def test_second_upgrade_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    _upgrade(path).dispose()
    once = dump(path)
    _upgrade(path).dispose()
    assert dump(path) == once


def test_host_foreign_keys_and_indexes_on_our_tables_survive(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    db = build(path, "CREATE INDEX host_rooms_by_name ON hosted_rooms(name)",
               "CREATE TRIGGER host_touch AFTER UPDATE ON hosted_rooms BEGIN "
               "INSERT INTO host_log (line) VALUES ('touched ' || NEW.room_id); END")
    db.close()
    _upgrade(path).dispose()
    db = build(path)
    try:
        names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        assert {"host_rooms_by_name", "host_touch"} <= names
        db.execute("UPDATE hosted_rooms SET name='x' WHERE room_id='r1'")
        assert db.execute("SELECT line FROM host_log ORDER BY id DESC LIMIT 1").fetchone() == ("touched r1",)
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(Exception, match="FOREIGN KEY"):
            db.execute("INSERT INTO host_orders (id, room_id, note) VALUES (9, 'nope', 'x')")
    finally:
        db.close()


# --- failure, refusal, downgrade ---------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["rebuild_remote_runs", "add_ledger_columns", "conform_reference_tables"])
def test_failure_midway_leaves_the_file_exactly_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    db = build(path, *DELIVERIES_DRAFT, *INTENTS_DRAFT)
    insert(db, "secure_peer_outbound_intents", intent("x", LEGACY_INTENTS[0][1], route=None))
    db.close()
    before = dump(path)
    real = getattr(legacy, step)

    def boom(op: Any) -> None:
        real(op)  # the step's own writes happen too, then the upgrade fails
        raise RuntimeError("injected failure")

    monkeypatch.setattr(legacy, step, boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        _upgrade(path)
    assert dump(path) == before
    monkeypatch.undo()
    _upgrade(path).dispose()  # and a later upgrade still adopts it
    assert _generation(path).kind == legacy.MANAGED


def test_unknown_legacy_columns_are_refused_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = build(path, ROOMS_DRAFT.replace("disbanded_at REAL", "disbanded_at REAL, color TEXT"), EVENTS_DRAFT)
    insert(db, "hosted_rooms", _room("r", color="blue"))
    db.close()
    before = dump(path)
    with pytest.raises(HostedRoomError, match="unknown columns color would be lost"):
        _upgrade(path)
    assert dump(path) == before


def test_downgrade_to_baseline_keeps_adopted_rows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    engine = _upgrade(path)
    try:
        adopted = dump(path)["data"]
        with caplog.at_level(logging.INFO, logger="alembic.runtime.migration"):
            migrate.downgrade(engine, "0001_baseline")
        assert migrate.current_revision(engine) == "0001_baseline"
        assert "not returned to the reference's legacy layout" in caplog.text
        after = dump(path)["data"]
        baseline = set(models.metadata.tables) - {models.budget.name}
        assert {t: after[t] for t in baseline} == {t: adopted[t] for t in baseline}
        # The baseline layout is the models' but for what later revisions add (0007: the claim index; 0008: the
        # budget table; 0009: the listing index; 0010: the replica's event id index).
        assert sorted((change[0], change[1].name) for change in _drift(engine)) == [
            ("add_index", "idx_hosted_room_events_claims"), ("add_index", "idx_hosted_room_replica_events_event_id"),
            ("add_index", "idx_hosted_rooms_updated"), ("add_table", "hosted_room_budget")]
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == HEAD
    finally:
        engine.dispose()



# --- through the public API --------------------------------------------------------------------------------------


def test_adopted_legacy_room_is_claimed_by_create_room_as_the_reference_does(tmp_path: Path) -> None:
    from hostedrooms import rooms as room_api

    path = tmp_path / "state.db"
    _draft_rooms(path)
    engine = _upgrade(path)
    try:
        page = room_api.read_events(engine, room_id="r1", since_seq=0, limit=10)
        assert [(e["seq"], e["actor"], e["authority_epoch"]) for e in page["events"]] == [
            (seq, {"kind": "system", "id": "legacy"}, None) for seq in (1, 2, 3)]
        before = {row["room_id"]: row for row in _select(engine, models.rooms)}["r1"]
        # The draft room stored members without routing targets; adoption may add them.
        members = [{"id": "m1", "label": "Zoë", "target": {"url": "https://peer"}}]
        adopted = room_api.create_room(engine, room_id="r1", name="Rööm r1 ☃", members=members,
                                       authority_gateway_id="install:real", now=50.0)
        assert (adopted["adopted"], adopted["idempotent"]) == (True, True)
        assert (adopted["authority_gateway_id"], adopted["authority_epoch"], adopted["revision"]) == (
            "install:real", 2, before["revision"] + 1)
        claim = adopted["claim_event"]
        assert (claim["seq"], claim["event_id"], claim["kind"], claim["authority_epoch"]) == (
            4, "system:authority-adopted", "authority.claimed", 2)
        assert claim["actor"] == {"kind": "system", "id": "authority-control"}
        assert claim["payload"] == {"previous_gateway_id": "legacy", "authority_gateway_id": "install:real",
                                    "authority_epoch": 2}
        after = {row["room_id"]: row for row in _select(engine, models.rooms)}["r1"]
        claim_row = next(e for e in _select(engine, models.events) if e["event_id"] == "system:authority-adopted")
        assert after["next_seq"] == 5 and after["updated_at"] == 50.0
        assert after["event_bytes"] == before["event_bytes"] + _utf8(
            claim_row["event_id"], claim_row["kind"], claim_row["actor_json"], claim_row["payload_json"])
        with pytest.raises(HostedRoomError, match="disbanded room"):  # the retired id stays reserved
            room_api.create_room(engine, room_id="r2", name="Rööm r2 ☃", members=[{"id": "m1", "label": "Zoë"}],
                                 authority_gateway_id="install:real", now=51.0)
    finally:
        engine.dispose()
