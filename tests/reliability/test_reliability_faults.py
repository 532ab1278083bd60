"""Fault injection: every write fails cleanly whichever of its database statements fails.

For each write operation the n-th statement it sends (n = 1, 2, ...) raises a driver error (the backend's own
DBAPI ``OperationalError``), and then its COMMIT fails too; after each failure the database must be exactly as
before the call (a snapshot of every table) and the caller must see a documented error
(:class:`~hostedrooms.errors.StoreUnavailableError`), never a raw driver error. The loop ends when the operation
runs to completion without reaching the fault (so every statement it sends has failed once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from factories import every_text, link, make_room, message, outbound, prepare, snapshot
from sqlalchemy import Engine, event

import hostedrooms
from hostedrooms import peers, rooms
from hostedrooms.backends import backend_for
from hostedrooms.errors import HostedRoomError, StoreUnavailableError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.store import room_store

LOCAL = "install:gw-local"
REMOTE = "install:gw-remote"
GRANT = "grant-secret-7f3a9c"
NOW = 1_000.0


@dataclass
class Injector:
    """Counts the statements sent on ``engine``; the ``fail_at``-th one (or the COMMIT) raises."""

    engine: Engine
    fail_at: int | None = None
    fail_commit: bool = False
    seen: int = 0
    fired: bool = False

    def error(self) -> BaseException:
        self.fired = True
        dbapi_error: type[BaseException] = self.engine.dialect.loaded_dbapi.OperationalError
        return dbapi_error("injected fault: disk I/O error")

    def before_cursor_execute(self, *_args: Any) -> None:
        self.seen += 1
        if self.fail_at is not None and self.seen == self.fail_at:
            raise self.error()

    def commit(self, _connection: Any) -> None:
        if self.fail_commit:
            raise self.error()


@contextmanager
def injected(engine: Engine) -> Iterator[Injector]:
    injector = Injector(engine)
    event.listen(engine, "before_cursor_execute", injector.before_cursor_execute)
    original_commit = engine.dialect.do_commit

    def do_commit(dbapi_connection: Any) -> None:
        injector.commit(dbapi_connection)
        original_commit(dbapi_connection)

    engine.dialect.do_commit = do_commit  # type: ignore[method-assign]
    try:
        yield injector
    finally:
        engine.dialect.do_commit = original_commit  # type: ignore[method-assign]
        event.remove(engine, "before_cursor_execute", injector.before_cursor_execute)


def exercise(engine: Engine, operation: Callable[[], Any], *, secret: str | None = None) -> int:
    """Fail statement 1, 2, ... of ``operation`` until it completes without reaching the fault.

    Returns how many statements the fault-free run sent (each of them was failed once before).
    """
    before = snapshot(engine)
    n = 1
    with injected(engine) as injector:
        while True:
            injector.fail_at, injector.seen, injector.fired = n, 0, False
            try:
                result = operation()
            except HostedRoomError as exc:
                assert injector.fired, f"statement {n}: {exc!r} without an injected fault"
                assert isinstance(exc, StoreUnavailableError), f"statement {n}: {exc!r}"
                assert "injected fault" in str(exc)
                if secret is not None:
                    assert secret not in every_text(exc)
                assert snapshot(engine) == before, f"statement {n} failed but the database changed"
                n += 1
                continue
            assert not injector.fired, f"statement {n} failed but the operation returned {result!r}"
            break
    assert injector.seen == n - 1 >= 1
    return injector.seen


@dataclass
class Case:
    name: str
    setup: Callable[[Engine], Any]
    operation: Callable[[Engine, Any], Any]
    secret: str | None = None


def room_with_history(engine: Engine) -> None:
    make_room(engine)
    message(engine, "room-1", "e-1", "e-1", now=NOW + 1)


def disbanded_room(engine: Engine) -> None:
    room_with_history(engine)
    rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, now=NOW + 2)


CLAIMS = {"room_id": "room-1", "home_install_id": "install:home", "authority_gateway_id": LOCAL,
          "authority_epoch": 1, "member_id": "m1", "target_install_id": "install:target",
          "target_profile": "default"}
RECEIPT = {"room_id": "room-1", "home_install_id": "install:home", "authority_gateway_id": LOCAL,
           "authority_epoch": 1, "member_id": "m1", "target_install_id": "install:target",
           "target_profile": "default", "task_id": "task-1", "execution_generation": 1, "run_id": "run-1",
           "session_id": "session-1"}


def prepared_ledger(engine: Engine) -> DeliveryLedger:
    ledger = DeliveryLedger(engine, clock=lambda: NOW)
    prepare(ledger, 1)
    return ledger


def authorized_ledger(engine: Engine) -> DeliveryLedger:
    ledger = prepared_ledger(engine)
    ledger.authorize("env-1")
    return ledger


def outbound_ledger(engine: Engine) -> DeliveryLedger:
    ledger = DeliveryLedger(engine, clock=lambda: NOW)
    ledger.prepare_outbound(**outbound())
    return ledger


def nothing(_engine: Engine) -> None:
    return None


CASES = [
    Case("create_room", nothing, lambda e, _: make_room(e)),
    Case("create_room replay", lambda e: make_room(e), lambda e, _: make_room(e)),
    Case("append_event", lambda e: make_room(e), lambda e, _: message(e, "room-1", "e-1", "e-1", now=NOW + 1)),
    Case("append_event replay", room_with_history, lambda e, _: message(e, "room-1", "e-1", "e-1", now=NOW + 1)),
    Case("append_events", room_with_history, lambda e, _: rooms.append_events(
        e, "room-1", [{"event_id": f"b-{i}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
                       "payload": {"i": i}} for i in range(3)], LOCAL, 1, now=NOW + 1)),
    Case("rename_room", room_with_history, lambda e, _: rooms.rename_room(
        e, room_id="room-1", event_id="rename-1", name="Renamed", now=NOW + 1)),
    Case("request_room_stop", room_with_history, lambda e, _: rooms.request_room_stop(
        e, room_id="room-1", cancel_id="cancel-1", expected_gateway_id=LOCAL, expected_epoch=1)),
    Case("claim_authority", room_with_history, lambda e, _: rooms.claim_authority(
        e, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, new_gateway_id=REMOTE,
        event_id="claim-1", now=NOW + 1)),
    Case("disband_room", room_with_history, lambda e, _: rooms.disband_room(
        e, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, now=NOW + 2)),
    Case("prune_disbanded_rooms", disbanded_room, lambda e, _: rooms.prune_disbanded_rooms(
        e, now=NOW + 10**9)),
    Case("upsert_room_link_record", nothing, lambda e, _: peers.upsert_room_link_record(
        e, record=link(grant=GRANT), max_links=5), secret=GRANT),
    Case("upsert_room_link_record replace",
         lambda e: peers.upsert_room_link_record(e, record=link(grant=GRANT), max_links=5),
         lambda e, _: peers.upsert_room_link_record(e, record={**link(grant=GRANT), "status": "down"}, max_links=5),
         secret=GRANT),
    Case("update_room_link_status",
         lambda e: peers.upsert_room_link_record(e, record=link(grant=GRANT), max_links=5),
         lambda e, _: peers.update_room_link_status(e, room_id="room-1", member_id="m1", status="down", now=NOW)),
    Case("delete_room_link_records",
         lambda e: peers.upsert_room_link_record(e, record=link(grant=GRANT), max_links=5),
         lambda e, _: peers.delete_room_link_records(e, room_id="room-1")),
    Case("revoke_room_grant_scope", lambda e: peers.reserve_peer_room(
        e, claims=CLAIMS, expires_at=NOW + 100, now=NOW),
         lambda e, _: peers.revoke_room_grant_scope(e, claims=CLAIMS, expires_at=NOW + 100, now=NOW + 1)),
    Case("reserve_peer_room", nothing, lambda e, _: peers.reserve_peer_room(
        e, claims=CLAIMS, expires_at=NOW + 100, now=NOW)),
    Case("upsert_remote_run_receipt", nothing, lambda e, _: peers.upsert_remote_run_receipt(
        e, record=RECEIPT, now=NOW)),
    Case("upsert_remote_run_receipt again", lambda e: peers.upsert_remote_run_receipt(e, record=RECEIPT, now=NOW),
         lambda e, _: peers.upsert_remote_run_receipt(e, record=RECEIPT, now=NOW + 1)),
    Case("ledger.prepare", lambda e: DeliveryLedger(e, clock=lambda: NOW), lambda _, ledger: prepare(ledger, 1)),
    Case("ledger.authorize", prepared_ledger, lambda _, ledger: ledger.authorize("env-1")),
    Case("ledger.bind_owner", authorized_ledger, lambda _, ledger: ledger.bind_owner(
        "env-1", queued_id="q-1", run_id="run-1")),
    Case("ledger.prepare_response", authorized_ledger, lambda _, ledger: ledger.prepare_response(
        "env-1", request_id="resp-1", body="answer", request_response=False)),
    Case("ledger.finish", authorized_ledger, lambda _, ledger: ledger.finish(
        "env-1", succeeded=True, result_text="done")),
    Case("ledger.defer_admission", authorized_ledger, lambda _, ledger: ledger.defer_admission(
        "env-1", error="busy")),
    Case("ledger.prepare_outbound", lambda e: DeliveryLedger(e, clock=lambda: NOW),
         lambda _, ledger: ledger.prepare_outbound(**outbound())),
    Case("ledger.commit_outbound", outbound_ledger, lambda _, ledger: ledger.commit_outbound(
        "out-1", {"ok": True})),
    Case("ledger.defer_outbound", outbound_ledger, lambda _, ledger: ledger.defer_outbound("out-1", "busy")),
    Case("ledger.prune", lambda e: _finished(authorized_ledger(e)), lambda _, ledger: ledger.prune(retain_seconds=0)),
]


def _finished(ledger: DeliveryLedger) -> DeliveryLedger:
    ledger.finish("env-1", succeeded=False, error="gone")
    ledger._clock = lambda: NOW + 10  # later, so the finished row is past retention 0
    return ledger


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_failed_statement_leaves_the_store_untouched(engine: Engine, case: Case) -> None:
    state = case.setup(engine)
    assert exercise(engine, lambda: case.operation(engine, state), secret=case.secret) >= 1
    assert hostedrooms.verify(engine) == []


# Regression: after a failed COMMIT the driver may still hold the transaction open while SQLAlchemy considers it
# over; the unit of work must discard that connection, or the next unit inherits the failed unit's writes (on
# SQLite its BEGIN IMMEDIATE fails with "cannot start a transaction within a transaction").
@pytest.mark.parametrize("case", [c for c in CASES if c.name in {"append_events", "claim_authority", "create_room",
                                                                  "ledger.bind_owner"}],
                         ids=lambda case: case.name)
def test_a_failed_commit_leaves_the_store_untouched(engine: Engine, case: Case) -> None:
    state = case.setup(engine)
    before = snapshot(engine)
    # PostgreSQL's one-statement append commits with its statement (autocommit): no COMMIT to fail there, so the
    # append takes the full path, whose COMMIT this checks (a failed statement is the test above).
    with injected(engine) as injector, room_store(backend_for(engine)).without_one_statement():
        injector.fail_commit = True
        with pytest.raises(StoreUnavailableError, match="injected fault"):
            case.operation(engine, state)
        assert injector.fired
    assert snapshot(engine) == before
    case.operation(engine, state)  # and without the fault it succeeds
    assert snapshot(engine) != before
