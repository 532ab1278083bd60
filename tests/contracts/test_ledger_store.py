"""The delivery ledger's store (:class:`hostedrooms.store.ledger.LedgerStore`): each method's contract, on both of
its paths (compiled-once statements on the cursor, and ``Connection.execute`` inside ``without_one_statement``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models
from hostedrooms.backends import LEDGER_WORK_CHANNEL, Backend
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.ledger.retries import ERROR, RetryMachine, retry_machine
from hostedrooms.store.ledger import EXPIRED_ERROR, OUTBOUND_WAITING, LedgerStore, ledger_statements
from hostedrooms.uow import UnitOfWork

from .support import OnBackend, contend, listening

_deliveries, _outbound = models.deliveries, models.outbound_intents


def delivery(envelope_id: str = "env-1", *, state: str = "prepared", created_at: int = 100,
             **overrides: Any) -> dict[str, Any]:
    """Every column prepare() inserts (DELIVERY_INSERT_COLUMNS)."""
    values = {
        "envelope_id": envelope_id, "request_id": f"req-{envelope_id}", "transport_role": "host",
        "connection_id": "conn", "lease_token": "lease-1", "team_id": "team", "source_peer_id": None,
        "source_server_identity": "src", "source_route_id": "route", "source_route_revision": "1",
        "target_peer_id": None, "target_server_identity": "dst", "target_route_id": "route2",
        "target_route_revision": "1", "target_chat_id": "chat", "action": "request_reply", "kind": "request_reply",
        "exchange_id": "ex", "parent_envelope_id": None, "parent_leg": None, "used_legs": 1, "max_legs": 6,
        "expires_at": 1000, "claim_digest": "digest", "body_json": "{}", "state": state, "created_at": created_at,
        "updated_at": created_at}
    return {**values, **overrides}


def outbound(request_id: str = "out-1", *, created_at: int = 100, **overrides: Any) -> dict[str, Any]:
    """Every column prepare_outbound() inserts (OUTBOUND_INSERT_COLUMNS)."""
    values = {
        "request_id": request_id, "source_session_id": "sess", "source_run_id": "run", "body": "{}",
        "action": "request_reply", "expires_at": 1000, "connection_id": "conn", "source_route_id": "route",
        "source_route_revision": "1", "intent_digest": "digest", "snapshot_json": "{}", "state": "pending",
        "retry_at": None, "created_at": created_at, "updated_at": created_at}
    return {**values, **overrides}


#: A retry machine over outbound intents (what the ledger's send machine is).
SEND: RetryMachine[Any] = retry_machine(
    "contract_send", _outbound, "request_id", OUTBOUND_WAITING, retryable=lambda row, _: row["state"] == "pending",
    attempts="attempts", retry_at="retry_at", last_error="last_error",
    failed={"state": "failed", "retry_at": None, "last_error": ERROR},
    fetch=lambda store, key, lock=False: store.outbound(key, lock=lock), public=lambda row: row)


class LedgerStoreContract(OnBackend):
    """What the ledger store promises on every backend, on each of its two paths."""

    @pytest.fixture(params=["one_statement", "execute"])
    def path(self, request: pytest.FixtureRequest, impl: Backend) -> Iterator[str]:
        if request.param == "one_statement":
            yield request.param
            return
        with ledger_statements(impl).without_one_statement():
            yield request.param

    def seed(self, engine: Engine, *deliveries: dict[str, Any], intents: tuple[dict[str, Any], ...] = ()) -> None:
        with UnitOfWork(engine) as uow:
            for values in deliveries:
                uow.ledger.insert_delivery(values)
            for values in intents:
                uow.ledger.insert_outbound(values)
            uow.commit()

    def test_each_unit_binds_a_ledger_store(self, engine: Engine, impl: Backend, path: str) -> None:
        with UnitOfWork(engine, write=False) as uow:
            assert isinstance(uow.ledger, LedgerStore) and uow.ledger.connection is uow.connection
            assert uow.ledger.statements is ledger_statements(impl)
            assert uow.ledger.one_statement is (path == "one_statement")

    # -- deliveries ----------------------------------------------------------------------------------------------

    def test_insert_delivery_returns_the_stored_row(self, engine: Engine, path: str) -> None:
        with UnitOfWork(engine) as uow:
            row = uow.ledger.insert_delivery(delivery())
            assert row == {**{c.name: None for c in _deliveries.c}, **delivery(), "admission_attempts": 0,
                           "response_committed": 0, "response_attempts": 0}
            assert uow.ledger.delivery("env-1") == row == uow.ledger.delivery("env-1", lock=True)
            assert uow.ledger.delivery("absent") is None and uow.ledger.delivery_of_run("run") is None

    def test_insert_delivery_within_capacity_counts_only_unfinished(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("a", state="authorized"), delivery("b", state="completed"),
                  delivery("c", state="failed"))
        with UnitOfWork(engine) as uow:
            assert uow.ledger.in_flight() == 1
            assert uow.ledger.insert_delivery_within(delivery("d"), 1) is None
            assert uow.ledger.insert_delivery_within(delivery("d"), 0) is None
            assert uow.ledger.in_flight() == 1
            row = uow.ledger.insert_delivery_within(delivery("d"), 2)
            assert row is not None and row["envelope_id"] == "d"
            assert uow.ledger.insert_delivery_within(delivery("e"), 2**64) is not None  # beyond any count
            assert uow.ledger.in_flight() == 3

    def test_expire_prepared_fails_only_expired_prepared_rows(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("old", expires_at=50), delivery("new", expires_at=51),
                  delivery("queued", state="queued", expires_at=10))
        with UnitOfWork(engine) as uow:
            uow.ledger.expire_prepared(50)
            states = {key: (uow.ledger.delivery(key) or {}) for key in ("old", "new", "queued")}
        assert (states["old"]["state"], states["old"]["error"], states["old"]["updated_at"]) == (
            "failed", EXPIRED_ERROR, 50)
        assert states["new"]["state"] == "prepared" and states["queued"]["state"] == "queued"

    def test_refresh_lease_only_of_a_prepared_row_of_that_claim(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("p"), delivery("q", state="queued"))
        with UnitOfWork(engine) as uow:
            assert uow.ledger.refresh_lease("p", digest="other", lease="l2", now=7) is None
            assert uow.ledger.refresh_lease("q", digest="digest", lease="l2", now=7) is None
            row = uow.ledger.refresh_lease("p", digest="digest", lease="l2", now=7)
            assert row is not None and (row["lease_token"], row["updated_at"]) == ("l2", 7)

    def test_transition_applies_only_from_the_expected_states(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery())
        with UnitOfWork(engine) as uow:
            assert uow.ledger.transition("env-1", expected=("queued",), values={"state": "running"}, now=5) is None
            row = uow.ledger.transition("env-1", expected=("authorized", "prepared"),
                                        values={"state": "authorized", "lease_token": "l3"}, now=6)
            assert row is not None and (row["state"], row["lease_token"], row["updated_at"]) == ("authorized", "l3", 6)
            assert uow.ledger.transition("absent", expected=("prepared",), values={"state": "failed"}, now=7) is None

    def test_bind_authorized_and_bind_run(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("a", state="authorized"), delivery("b", state="authorized"),
                  delivery("p", state="prepared"))
        with UnitOfWork(engine) as uow:
            ledger = uow.ledger
            assert ledger.bind_authorized("p", queued_id="q0", run_id=None, now=5) is None  # not authorized
            queued = ledger.bind_authorized("a", queued_id="q1", run_id=None, now=5)
            assert queued is not None and (queued["state"], queued["queued_id"]) == ("queued", "q1")
            assert ledger.bind_authorized("a", queued_id="q2", run_id=None, now=6) is None  # owned now
            running = ledger.bind_authorized("b", queued_id=None, run_id="run-b", now=5)
            assert running is not None and (running["state"], running["run_id"]) == ("running", "run-b")
            assert ledger.bind_run("a", queued_id="other", run_id="run-a", now=7) is None
            bound = ledger.bind_run("a", queued_id="q1", run_id="run-a", now=7)
            assert bound is not None and (bound["state"], bound["run_id"], bound["updated_at"]) == (
                "running", "run-a", 7)
            assert ledger.bind_run("a", queued_id="q1", run_id="run-x", now=8) is None
            assert (ledger.delivery_of_run("run-a") or {})["envelope_id"] == "a"

    # -- response intents ----------------------------------------------------------------------------------------

    def test_response_intent_prepare_commit_clear(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("r", state="running"), delivery("i", state="running", kind="instruction"),
                  delivery("c", state="completed"))
        params = {"request": "resp-1", "digest": "d1", "body": "{}", "request_response": 1, "now": 9}
        with UnitOfWork(engine) as uow:
            ledger = uow.ledger
            assert ledger.prepare_response("c", direct=False, params=params) is None  # not admitted
            assert ledger.prepare_response("i", direct=True, params=params) is None  # an instruction
            assert ledger.prepare_response("i", direct=False, params=params) is not None
            row = ledger.prepare_response("r", direct=True, params=params)
            assert row is not None and (row["response_request_id"], row["response_retry_at"]) == ("resp-1", 9)
            assert ledger.prepare_response("r", direct=False, params=params) is None  # one intent at a time
            assert ledger.clear_response("r", request_id="other", now=10) is None
            cleared = ledger.clear_response("r", request_id="resp-1", now=10)
            assert cleared is not None and cleared["response_request_id"] is None
            ledger.prepare_response("r", direct=False, params=params)
            assert ledger.commit_response("r", request_id="other", now=11) == []
            committed = ledger.commit_response("r", request_id="resp-1", now=11)
            assert [(row["envelope_id"], row["response_committed"]) for row in committed] == [("r", 1)]
            assert ledger.commit_response("r", request_id=None, now=12) == []
            assert ledger.clear_response("r", request_id="resp-1", now=12) is None  # committed: stays
            assert len(ledger.commit_response("i", request_id=None, now=13)) == 1  # any intent

    # -- outbound intents ----------------------------------------------------------------------------------------

    def test_outbound_insert_once_commit_once_and_expire(self, engine: Engine, path: str) -> None:
        with UnitOfWork(engine) as uow:
            ledger = uow.ledger
            row = ledger.insert_outbound(outbound())
            assert row is not None and row == ledger.outbound("out-1") == ledger.outbound("out-1", lock=True)
            assert ledger.insert_outbound(outbound(body="other")) is None  # the id exists: unchanged
            assert (ledger.outbound("out-1") or {})["body"] == "{}"
            done = ledger.commit_outbound("out-1", response='{"ok":1}', now=20)
            assert done is not None and (done["state"], done["response_json"]) == ("committed", '{"ok":1}')
            assert ledger.commit_outbound("out-1", response="again", now=21) is None
            ledger.insert_outbound(outbound("old", expires_at=30))
            ledger.insert_outbound(outbound("new", expires_at=31))
            ledger.expire_pending(30)
            assert (ledger.outbound("old") or {})["last_error"] == EXPIRED_ERROR
            assert [(ledger.outbound(key) or {})["state"] for key in ("old", "new")] == ["failed", "pending"]
            assert ledger.outbound("absent") is None

    # -- retries -------------------------------------------------------------------------------------------------

    def test_retry_machine_statements_are_guarded(self, engine: Engine, path: str) -> None:
        self.seed(engine, intents=(outbound("a"), outbound("b", state="committed")))
        with UnitOfWork(engine) as uow:
            ledger = uow.ledger
            retried = ledger.retry_waiting(SEND, {"key": "a", "v_attempts": 3, "v_retry_at": 40, "v_error": "e1",
                                                  "v_now": 30})
            assert retried is not None and (retried["attempts"], retried["retry_at"], retried["last_error"]) == (
                3, 40, "e1")
            direct = ledger.retry_directly(SEND, {"key": "a", "v_error": "e2", "v_now": 50})
            assert direct is not None and (direct["attempts"], direct["retry_at"], direct["updated_at"]) == (
                4, 50 + 16, 50)
            assert ledger.retry_waiting(SEND, {"key": "b", "v_attempts": 1, "v_retry_at": 1, "v_error": "x",
                                               "v_now": 1}) is None  # not waiting
            assert ledger.retry_directly(SEND, {"key": "b", "v_error": "x", "v_now": 1}) is None
            failed = ledger.fail_waiting(SEND, {"key": "a", "v_error": "gone", "v_now": 60})
            assert failed is not None and (failed["state"], failed["last_error"]) == ("failed", "gone")
            assert ledger.fail_waiting(SEND, {"key": "a", "v_error": "again", "v_now": 61}) is None

    # -- listings and pruning -------------------------------------------------------------------------------------

    def test_listings_oldest_first_then_code_point(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("b", state="queued", created_at=5), delivery("B", state="queued", created_at=5),
                  delivery("a", state="queued", created_at=6), delivery("done", state="completed", created_at=1),
                  intents=(outbound("y", created_at=5), outbound("Y", created_at=5), outbound("x", created_at=4),
                           outbound("sent", created_at=1, state="committed")))
        with UnitOfWork(engine) as uow:
            ledger = uow.ledger

            def keys(statement: sa.Select[Any], key: str) -> list[str]:
                return [row[key] for row in uow.connection.execute(statement).mappings()]

            assert keys(ledger.deliveries_where(), "envelope_id") == ["B", "b", "a"]
            assert keys(ledger.deliveries_where(_deliveries.c.envelope_id != "B"), "envelope_id") == ["b", "a"]
            assert keys(ledger.pending_outbound_where(), "request_id") == ["x", "Y", "y"]
            ledger.retry_waiting(SEND, {"key": "x", "v_attempts": 1, "v_retry_at": 90, "v_error": "e", "v_now": 8})
            assert keys(ledger.due(SEND, 89), "request_id") == ["Y", "y"]  # never tried: due at once
            assert keys(ledger.due(SEND, 90), "request_id") == ["Y", "y", "x"]

    def test_backlog_counts_every_waiting_state_zeros_included(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("a", state="queued"), delivery("b", state="queued"),
                  delivery("c", state="completed"), intents=(outbound("o"),))
        with UnitOfWork(engine, write=False) as uow:
            assert uow.ledger.backlog() == {
                ("deliveries", "authorized"): 0, ("deliveries", "prepared"): 0, ("deliveries", "queued"): 2,
                ("deliveries", "running"): 0, ("outbound", "pending"): 1}

    def test_prune_deletes_finished_rows_before_the_cutoff(self, engine: Engine, path: str) -> None:
        self.seed(engine, delivery("done", state="completed", created_at=10),
                  delivery("late", state="failed", created_at=20), delivery("open", state="queued", created_at=1),
                  intents=(outbound("sent", state="committed", created_at=10), outbound("wait", created_at=1)))
        with UnitOfWork(engine) as uow:
            assert uow.ledger.prune(20) == 2
            assert uow.ledger.prune(20) == 0
            left = (uow.connection.execute(sa.select(_deliveries.c.envelope_id)).scalars().all(),
                    uow.connection.execute(sa.select(_outbound.c.request_id)).scalars().all())
        assert (sorted(left[0]), left[1]) == (["late", "open"], ["wait"])

    # -- lock and wake-up ----------------------------------------------------------------------------------------

    def test_lock_prepares_excludes_a_second_preparer(self, engine: Engine, quick_engine: Engine, impl: Backend,
                                                      path: str) -> None:
        def prepare(connection: sa.Connection) -> None:
            LedgerStore(impl, connection).lock_prepares()

        with UnitOfWork(engine) as uow:
            uow.ledger.lock_prepares()
            with pytest.raises(StoreUnavailableError):
                contend(quick_engine, prepare)
        contend(quick_engine, prepare)

    def test_wake_notifies_when_the_unit_commits(self, engine: Engine, impl: Backend, path: str) -> None:
        with listening(engine, LEDGER_WORK_CHANNEL) as received:
            with UnitOfWork(engine) as uow:
                uow.ledger.wake("delivery")
                assert received() == []
                uow.commit()
            assert received(expected=True) == (["delivery"] if impl.notifies else [])
            with UnitOfWork(engine) as uow:
                uow.ledger.wake("outbound")  # rolled back: no wake-up
            assert received() == []


class TestLedgerStoreSQLite(LedgerStoreContract):
    backend_name = "sqlite"


class TestLedgerStorePostgreSQL(LedgerStoreContract):
    backend_name = "postgresql"
