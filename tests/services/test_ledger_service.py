"""DeliveryLedger contract on SQLite and PostgreSQL: deliveries, response intents, outbound intents, prune."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from apis import use_api
from sqlalchemy import Engine

from hostedrooms import limits
from hostedrooms.compat import secure_peer_delivery as facade
from hostedrooms.errors import StoreIntegrityError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.limits import LimitValues
from hostedrooms.models import deliveries, outbound_intents

_api = use_api("DeliveryLedger")  # the tests on a database run on both APIs

START = 1_000_000


class FakeClock:
    """A settable clock; the ledger truncates it to whole seconds."""

    def __init__(self, now: float = START + 0.9) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(engine: Engine, clock: FakeClock) -> DeliveryLedger:
    return DeliveryLedger(engine, clock=clock)


# This file's envelopes expire an hour after START and carry a message that is not ASCII.
envelope = partial(factories.envelope, expires_at=START + 3600, message="please answer é")
prepare = partial(factories.prepare, expires_at=START + 3600, message="please answer é")
snapshot_tables = partial(factories.snapshot, tables=(deliveries, outbound_intents))


def ids(rows: list[dict[str, Any]], key: str = "envelope_id") -> list[str]:
    return [row[key] for row in rows]


# --- deliveries -------------------------------------------------------------------------------------------


def test_delivery_lifecycle(ledger: DeliveryLedger, clock: FakeClock) -> None:
    row, created = prepare(ledger, 1)
    assert created is True and row["state"] == "prepared" and row["body"] == {"message": "please answer é"}
    assert "body_json" not in row and len(row["claim_digest"]) == 64
    assert (row["created_at"], row["updated_at"]) == (START, START)  # int(clock()), truncated
    assert ledger.get("env-1") == row and ledger.get("missing") is None

    clock.advance(5)
    authorized = ledger.authorize("env-1")
    assert authorized is not None and authorized["state"] == "authorized" and authorized["updated_at"] == START + 5
    assert ledger.authorize("env-1") is not None  # idempotent
    assert ledger.authorize("missing") is None

    queued = ledger.bind_owner("env-1", queued_id="q-1", run_id=None)
    assert queued is not None and (queued["state"], queued["queued_id"]) == ("queued", "q-1")
    assert ledger.bind_owner("env-1", queued_id="q-other", run_id=None) is None
    assert ledger.bind_owner("env-1", queued_id="q-1", run_id=None) == queued
    running = ledger.bind_owner("env-1", queued_id="q-1", run_id="run-1")
    assert running is not None and (running["state"], running["run_id"]) == ("running", "run-1")
    assert ledger.bind_owner("env-1", queued_id="q-1", run_id="run-1") == running
    assert ledger.bind_owner("env-1", queued_id="q-1", run_id="run-2") is None
    assert ledger.bind_owner("env-1", queued_id=None, run_id="run-1") is None
    assert ledger.bind_owner("missing", queued_id="q", run_id=None) is None
    assert ledger.for_run("run-1") == running and ledger.for_run("nope") is None
    assert ids(ledger.nonterminal_for_chat("chat-1")) == ["env-1"] and ledger.nonterminal_for_chat("chat-2") == []
    assert ids(ledger.nonterminal_for_connection("conn-1")) == ["env-1"]
    assert ids(ledger.recoverable()) == ["env-1"]

    done = ledger.finish("env-1", succeeded=True, result_text="answer")
    assert done is not None and done["state"] == "completed"
    assert done["result_hash"] == hashlib.sha256(b"answer").hexdigest()
    assert ledger.finish("env-1", succeeded=False, error="late") is None  # terminal: the transition lost
    assert ledger.get("env-1") == done
    assert ledger.recoverable() == [] and ledger.nonterminal_for_chat("chat-1") == []
    assert ledger.for_run("run-1") == done


def test_authorized_binds_straight_to_a_run_and_prepared_cannot_bind(ledger: DeliveryLedger) -> None:
    prepare(ledger, 1)
    assert ledger.bind_owner("env-1", queued_id="q-1", run_id=None) is None  # not yet authorized
    ledger.authorize("env-1")
    running = ledger.bind_owner("env-1", queued_id=None, run_id="run-1")
    assert running is not None and (running["state"], running["queued_id"]) == ("running", None)
    assert ledger.authorize("env-1") is None  # running cannot go back


def test_finish_failure_paths(ledger: DeliveryLedger) -> None:
    prepare(ledger, 1)
    assert ledger.finish("env-1", succeeded=True, result_text="x") is None  # prepared cannot complete
    failed = ledger.finish("env-1", succeeded=False, error="target offline")
    assert failed is not None and (failed["state"], failed["error"], failed["result_hash"]) == (
        "failed", "target offline", None)
    prepare(ledger, 2)
    ledger.authorize("env-2")
    finished = ledger.finish("env-2", succeeded=True)
    assert finished is not None and finished["result_hash"] is None and finished["error"] is None


def test_finish_bounds_the_recorded_error(ledger: DeliveryLedger) -> None:
    """A 1 MB error text is cut to MAX_FINISH_ERROR_CHARS and marked; one at the bound is kept whole."""
    from hostedrooms.ledger import FINISH_ERROR_CUT_MARK, MAX_FINISH_ERROR_CHARS

    prepare(ledger, 1)
    huge = "x" * 1_000_000
    failed = ledger.finish("env-1", succeeded=False, error=huge)
    assert failed is not None and failed["state"] == "failed"
    assert len(failed["error"]) == MAX_FINISH_ERROR_CHARS and failed["error"].endswith(FINISH_ERROR_CUT_MARK)
    assert failed["error"] == huge[:MAX_FINISH_ERROR_CHARS - len(FINISH_ERROR_CUT_MARK)] + FINISH_ERROR_CUT_MARK
    stored = ledger.get("env-1")
    assert stored is not None and stored["error"] == failed["error"]
    prepare(ledger, 2)
    whole = "y" * MAX_FINISH_ERROR_CHARS
    kept = ledger.finish("env-2", succeeded=False, error=whole)
    assert kept is not None and kept["error"] == whole


def test_fail_ownerless_authorized(ledger: DeliveryLedger) -> None:
    prepare(ledger, 1)
    untouched = ledger.fail_ownerless_authorized("env-1", error="x")
    assert untouched is not None and untouched["state"] == "prepared"
    ledger.authorize("env-1")
    failed = ledger.fail_ownerless_authorized("env-1", error="e" * 500)
    assert failed is not None and failed["state"] == "failed" and failed["error"] == "e" * 400
    prepare(ledger, 2)
    ledger.authorize("env-2")
    ledger.bind_owner("env-2", queued_id="q-2", run_id=None)
    owned = ledger.fail_ownerless_authorized("env-2", error="x")
    assert owned is not None and owned["state"] == "queued"
    assert ledger.fail_ownerless_authorized("missing", error="x") is None


def test_prepare_replay_lease_refresh_and_digest_change(ledger: DeliveryLedger, clock: FakeClock) -> None:
    first, _ = prepare(ledger, 1)
    clock.advance(10)
    again, created = prepare(ledger, 1)
    assert created is False and again == first  # same lease: nothing changes
    refreshed, created = prepare(ledger, 1, lease_token="lease-2")
    assert created is False and refreshed["lease_token"] == "lease-2" and refreshed["updated_at"] == START + 10
    assert refreshed["claim_digest"] == first["claim_digest"]
    ledger.authorize("env-1")
    kept, created = prepare(ledger, 1, lease_token="lease-3")
    assert created is False and kept["lease_token"] == "lease-2"  # only a prepared claim takes a new token
    before = snapshot_tables(ledger.engine)
    for changed in ({"body": {"message": "different"}}, {"connection_id": "conn-2"}, {"target_chat_id": "chat-2"}):
        with pytest.raises(RuntimeError, match="^secure peer envelope identity changed$"):
            prepare(ledger, 1, **changed)
    assert snapshot_tables(ledger.engine) == before


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"transport_role": "peer"}, "secure peer delivery role is invalid"),
        ({"envelope": {"body": {"message": " "}}}, "secure peer delivery body is invalid"),
        ({"envelope": {"action": "other"}}, "secure peer delivery action is invalid"),
        ({"envelope": {"kind": "other"}}, "secure peer delivery kind is invalid"),
        ({"envelope": {"team_id": ""}}, "secure peer delivery identity is incomplete"),
        ({"lease_token": ""}, "secure peer delivery identity is incomplete"),
        ({"envelope": {"used_legs": 7}}, "secure peer delivery leg budget is invalid"),
    ],
)
def test_prepare_refusals_leave_the_store_unchanged(
    ledger: DeliveryLedger, arguments: dict[str, Any], message: str
) -> None:
    prepare(ledger, 1)
    before = snapshot_tables(ledger.engine)
    call: dict[str, Any] = {"transport_role": "host", "connection_id": "c", "lease_token": "l",
                            "target_chat_id": "chat"}
    call.update({key: value for key, value in arguments.items() if key != "envelope"})
    overrides = arguments.get("envelope", {})
    with pytest.raises(ValueError, match=f"^{message}$"):
        ledger.prepare(envelope(9, **overrides), **call)
    assert snapshot_tables(ledger.engine) == before


def test_expired_prepared_rows_fail_when_a_new_envelope_arrives(ledger: DeliveryLedger, clock: FakeClock) -> None:
    stale, _ = prepare(ledger, 1, expires_at=START - 5)  # accepted, like the reference
    assert stale["state"] == "prepared"
    prepare(ledger, 2, expires_at=START + 5)
    prepare(ledger, 3)
    ledger.authorize("env-3")
    expired = ledger.get("env-1")
    assert expired is not None and (expired["state"], expired["error"]) == ("failed", "secure peer exchange expired")
    clock.advance(5)  # env-2 expires now (expires_at <= now); an authorized env-3 never expires here
    prepare(ledger, 1, expires_at=START - 5)  # a replay of a known envelope does not sweep
    assert ledger.get("env-2")["state"] == "prepared"  # type: ignore[index]
    prepare(ledger, 4)
    assert [row["state"] for row in map(ledger.get, ("env-2", "env-3"))] == ["failed", "authorized"]  # type: ignore[index]


def test_capacity_counts_nonterminal_deliveries(
    ledger: DeliveryLedger, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    monkeypatch.setattr(limits, "MAX_NONTERMINAL_DELIVERIES", 2)  # read at call time
    prepare(ledger, 1, expires_at=START + 10)
    prepare(ledger, 2)
    before = snapshot_tables(ledger.engine)
    with pytest.raises(RuntimeError, match="^secure peer delivery capacity is full$"):
        prepare(ledger, 3)
    assert snapshot_tables(ledger.engine) == before
    assert prepare(ledger, 2, lease_token="lease-2")[1] is False  # known envelopes are not capacity-checked
    ledger.finish("env-2", succeeded=False)
    assert prepare(ledger, 3)[1] is True
    clock.advance(10)  # env-1 expires: the sweep runs before the count, freeing its slot
    assert prepare(ledger, 4)[1] is True
    assert ledger.get("env-1")["state"] == "failed"  # type: ignore[index]


def test_facade_capacity_is_read_from_the_facade_module(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facade, "MAX_NONTERMINAL_DELIVERIES", 1)
    compat = facade.SecurePeerDeliveryLedger(target)
    try:
        prepare(compat, 1, expires_at=2**40)
        with pytest.raises(RuntimeError, match="capacity is full"):
            prepare(compat, 2, expires_at=2**40)
        compat.authorize("env-1")
        compat.prepare_response("env-1", request_id="r", body="b", request_response=False)
        assert len(compat.pending_responses(limit=1, now=2**40)) == 1
        with pytest.raises(ValueError, match="^secure peer response retry limit is invalid$"):
            compat.pending_responses(limit=2)  # the limit cap is the capacity, read at call time too
    finally:
        compat.close()


def test_admission_retries_back_off_and_come_due_in_order(ledger: DeliveryLedger, clock: FakeClock) -> None:
    for name in ("env-b", "env-a", "env-C"):
        prepare(ledger, name)
        ledger.authorize(name)
    # same created_at: ties break on the envelope id in code-point order ("C" < "a" < "b")
    assert ids(ledger.pending_admissions(now=START)) == ["env-C", "env-a", "env-b"]
    assert ids(ledger.pending_admissions(limit=1, now=START)) == ["env-C"]
    rows = [ledger.defer_admission("env-a", error="queue full") or {} for _ in range(9)]
    assert [row["admission_retry_at"] - START for row in rows] == [2, 4, 8, 16, 32, 64, 128, 256, 256]
    assert rows[-1]["admission_attempts"] == 9 and rows[-1]["admission_last_error"] == "queue full"
    ledger.defer_admission("env-b", error="x" * 1000)
    assert ids(ledger.pending_admissions(now=START)) == ["env-C"]
    assert ids(ledger.pending_admissions(now=START + 2)) == ["env-C", "env-b"]
    assert ids(ledger.pending_admissions(now=START + 256)) == ["env-C", "env-b", "env-a"]
    assert ledger.get("env-b")["admission_last_error"] == "x" * 400  # type: ignore[index]
    bound = ledger.bind_owner("env-a", queued_id="q", run_id=None)
    assert bound is not None and bound["admission_retry_at"] is None and bound["admission_last_error"] is None
    assert ledger.defer_admission("env-a", error="late") == bound  # owned: unchanged, returned
    assert ledger.defer_admission("missing", error="x") is None
    for limit in (0, 51, True, "5"):
        with pytest.raises(ValueError, match="^secure peer admission retry limit is invalid$"):
            ledger.pending_admissions(limit=limit)  # type: ignore[arg-type]


def test_bind_owner_refusals(ledger: DeliveryLedger) -> None:
    with pytest.raises(ValueError, match="^secure peer delivery owner is empty$"):
        ledger.bind_owner("env-1", queued_id=None, run_id=None)
    with pytest.raises(ValueError, match="must be a string"):
        ledger.bind_owner("env-1", queued_id=5, run_id=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a string"):
        ledger.get(5)  # type: ignore[arg-type]


# --- response intents -------------------------------------------------------------------------------------


def test_response_intents(ledger: DeliveryLedger, clock: FakeClock) -> None:
    prepare(ledger, 1)
    assert ledger.prepare_response("env-1", request_id="resp-1", body="answer", request_response=False) is None
    ledger.authorize("env-1")
    for bad in ({"body": " "}, {"request_response": 1}, {"request_id": ""}, {"body": "x" * 100_001}):
        arguments: dict[str, Any] = {"request_id": "resp-1", "body": "x", "request_response": False, **bad}
        with pytest.raises(ValueError, match="^secure peer response intent is invalid$"):
            ledger.prepare_response("env-1", **arguments)
    intent = ledger.prepare_response("env-1", request_id="resp-1", body="answer", request_response=True)
    assert intent is not None and intent["response_request_response"] == 1 and intent["response_retry_at"] == START
    assert ledger.prepare_response("env-1", request_id="resp-1", body="answer", request_response=True) == intent
    with pytest.raises(RuntimeError, match="^secure peer response intent changed$"):
        ledger.prepare_response("env-1", request_id="resp-1", body="other", request_response=True)
    assert ids(ledger.pending_responses(now=START)) == ["env-1"]
    for limit in (0, 2049):
        with pytest.raises(ValueError, match="^secure peer response retry limit is invalid$"):
            ledger.pending_responses(limit=limit)
    deferred = ledger.defer_response("env-1", request_id="resp-1", error="hub busy")
    assert deferred is not None and (deferred["response_attempts"], deferred["response_retry_at"]) == (1, START + 2)
    assert ledger.pending_responses(now=START + 1) == []
    assert ids(ledger.pending_responses(now=START + 2)) == ["env-1"]
    assert ledger.defer_response("env-1", request_id="other", error="x") == deferred
    cleared = ledger.clear_response_intent("env-1", request_id="resp-1")
    assert cleared is not None and cleared["response_request_id"] is None and cleared["response_attempts"] == 0
    assert ledger.pending_responses(now=START + 1000) == []
    ledger.prepare_response("env-1", request_id="resp-2", body="answer 2", request_response=False)
    assert ledger.mark_response_committed("env-1", request_id="wrong")["response_committed"] == 0  # type: ignore[index]
    committed = ledger.mark_response_committed("env-1", request_id="resp-2")
    assert committed is not None and committed["response_committed"] == 1 and committed["response_retry_at"] is None
    assert ledger.clear_response_intent("env-1", request_id="resp-2") == committed  # committed: kept
    assert ledger.defer_response("env-1", request_id="resp-2", error="x") == committed
    assert ledger.pending_responses(now=START + 1000) == []
    assert ledger.mark_response_committed("missing") is None


def test_responses_only_for_admitted_request_deliveries(ledger: DeliveryLedger) -> None:
    prepare(ledger, 2, action="instruction", kind="instruction")
    ledger.authorize("env-2")
    assert ledger.prepare_response("env-2", request_id="r", body="x", request_response=False) is None
    prepare(ledger, 3)
    ledger.authorize("env-3")
    committed = ledger.mark_response_committed("env-3")  # no intent needed when request_id is None
    assert committed is not None and committed["response_committed"] == 1
    unchanged = ledger.prepare_response("env-3", request_id="r", body="x", request_response=False)
    assert unchanged is not None and unchanged["response_request_id"] is None
    ledger.finish("env-3", succeeded=True)
    assert ledger.prepare_response("env-3", request_id="r", body="x", request_response=False) is None


# --- outbound intents -------------------------------------------------------------------------------------

SNAPSHOT = {"connection_id": "c1", "source_route_id": "sr1", "source_route_revision": "v1",
            "source_chat_id": "chat-1", "action": "request_reply", "note": "é"}


outbound_args = partial(factories.outbound, source_run_id="run-x", snapshot=SNAPSHOT, expires_at=START + 600)


def test_outbound_lifecycle(ledger: DeliveryLedger, clock: FakeClock) -> None:
    row, created = ledger.prepare_outbound(**outbound_args())
    assert created is True and row["state"] == "pending" and row["snapshot"] == SNAPSHOT and row["response"] is None
    assert (row["connection_id"], row["source_route_id"], row["source_route_revision"]) == ("c1", "sr1", "v1")
    assert row["retry_at"] == START and "snapshot_json" not in row and "response_json" not in row
    assert ledger.prepare_outbound(**outbound_args()) == (row, False)
    before = snapshot_tables(ledger.engine)
    with pytest.raises(RuntimeError, match="^secure peer outbound intent changed$"):
        ledger.prepare_outbound(**outbound_args(body="changed"))
    for bad in ({"action": "instruction"}, {"snapshot": {**SNAPSHOT, "connection_id": ""}},
                {"snapshot": ("not", "a", "mapping")}, {"body": ""}, {"source_run_id": ""}):
        with pytest.raises(ValueError, match="^secure peer outbound intent is invalid$"):
            ledger.prepare_outbound(**outbound_args(request_id="out-9", **bad))
    assert snapshot_tables(ledger.engine) == before
    assert ledger.outbound("out-1") == row and ledger.outbound("missing") is None
    assert ids(ledger.pending_outbound_for_chat("chat-1", now=START), "request_id") == ["out-1"]
    assert ids(ledger.pending_outbound_for_route("c1", "sr1", "v1", now=START), "request_id") == ["out-1"]
    assert ledger.pending_outbound_for_route("c1", "sr1", "v2", now=START) == []
    assert ids(ledger.pending_outbound_for_connection("c1", now=START), "request_id") == ["out-1"]
    assert ids(ledger.pending_outbound(now=START), "request_id") == ["out-1"]
    for limit in (0, 51):
        with pytest.raises(ValueError, match="^secure peer outbound retry limit is invalid$"):
            ledger.pending_outbound(limit=limit)
        with pytest.raises(ValueError, match="^secure peer outbound recovery limit is invalid$"):
            ledger.recoverable_outbound(limit=limit)

    deferred = ledger.defer_outbound("out-1", "hub unreachable")
    assert deferred is not None and (deferred["attempts"], deferred["retry_at"]) == (1, START + 2)
    assert ledger.pending_outbound(now=START + 1) == []
    assert ids(ledger.recoverable_outbound(), "request_id") == ["out-1"]  # future retries included
    committed = ledger.commit_outbound("out-1", {"ok": True, "text": "é"})
    assert committed is not None and committed["state"] == "committed"
    assert committed["response"] == {"ok": True, "text": "é"} and committed["retry_at"] is None
    assert ledger.commit_outbound("out-1", {"text": "é", "ok": True}) == committed
    with pytest.raises(RuntimeError, match="^secure peer outbound result changed$"):
        ledger.commit_outbound("out-1", {"ok": False})
    with pytest.raises(ValueError, match="^secure peer outbound result is invalid$"):
        ledger.commit_outbound("out-1", {"bad": object()})
    assert ledger.commit_outbound("missing", {}) is None
    assert ledger.defer_outbound("out-1", "late") == committed
    ledger.prepare_outbound(**outbound_args(request_id="out-2"))
    failed = ledger.fail_outbound("out-2", "cancelled by user")
    assert failed is not None and (failed["state"], failed["last_error"]) == ("failed", "cancelled by user")
    assert ledger.commit_outbound("out-2", {"ok": True}) == failed
    assert ledger.fail_outbound("missing", "x") is None and ledger.defer_outbound("missing", "x") is None
    assert ledger.recoverable_outbound() == []


def test_outbound_due_order_and_expiry_sweeps(ledger: DeliveryLedger, clock: FakeClock) -> None:
    ledger.prepare_outbound(**outbound_args(request_id="out-b"))
    ledger.prepare_outbound(**outbound_args(request_id="out-A", expires_at=START + 5))
    clock.advance(1)
    ledger.prepare_outbound(**outbound_args(request_id="out-c"))
    assert ids(ledger.pending_outbound(now=START + 1), "request_id") == ["out-A", "out-b", "out-c"]
    ledger.defer_outbound("out-A", "x")  # due at START + 1 + 2
    assert ids(ledger.pending_outbound(now=START + 2), "request_id") == ["out-b", "out-c"]
    assert ids(ledger.pending_outbound(limit=1, now=START + 3), "request_id") == ["out-b"]
    assert ids(ledger.pending_outbound_for_connection("c1", now=START + 5), "request_id") == ["out-b", "out-c"]
    expired = ledger.outbound("out-A")
    assert expired is not None and (expired["state"], expired["retry_at"], expired["last_error"]) == (
        "failed", None, "secure peer exchange expired")
    assert expired["updated_at"] == START + 5
    # each pending_outbound_for_* call fails intents expiring by its `now` first (expires_at <= now)
    sweeps: list[Callable[[int], list[dict[str, Any]]]] = [
        lambda now: ledger.pending_outbound_for_connection("c1", now=now),
        lambda now: ledger.pending_outbound_for_route("c1", "sr1", "v1", now=now),
        lambda now: ledger.pending_outbound_for_chat("chat-1", now=now),
    ]
    for offset, sweep in enumerate(sweeps):
        name, deadline = f"exp-{offset}", START + 10 + offset
        ledger.prepare_outbound(**outbound_args(request_id=name, expires_at=deadline))
        assert name in ids(sweep(deadline - 1), "request_id")
        assert name not in ids(sweep(deadline), "request_id")
        assert (ledger.outbound(name) or {}).get("state") == "failed"


# --- prune ------------------------------------------------------------------------------------------------


def test_prune_counts_terminal_rows_past_retention(ledger: DeliveryLedger, clock: FakeClock) -> None:
    prepare(ledger, 1)
    ledger.finish("env-1", succeeded=False, error="x")
    prepare(ledger, 2)  # still in flight: never pruned
    ledger.prepare_outbound(**outbound_args())
    ledger.commit_outbound("out-1", {"ok": True})
    ledger.prepare_outbound(**outbound_args(request_id="out-2"))
    ledger.fail_outbound("out-2", "x")
    ledger.prepare_outbound(**outbound_args(request_id="out-3"))
    assert ledger.prune() == 0
    clock.advance(100)
    assert ledger.prune(retain_seconds=100) == 0  # updated_at must be strictly older than the cutoff
    clock.advance(1)
    before = snapshot_tables(ledger.engine)
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="^secure peer ledger retention is invalid$"):
            ledger.prune(retain_seconds=bad)  # type: ignore[arg-type]
    assert snapshot_tables(ledger.engine) == before
    assert ledger.prune(retain_seconds=100) == 3
    assert ledger.get("env-1") is None and ledger.outbound("out-1") is None and ledger.outbound("out-2") is None
    assert ids(ledger.recoverable()) == ["env-2"] and ids(ledger.recoverable_outbound(), "request_id") == ["out-3"]


def test_default_clock_is_time_time_read_at_call_time(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = DeliveryLedger(engine)
    monkeypatch.setattr("time.time", lambda: 4242.99)
    row, _ = prepare(ledger, 1)
    assert row["created_at"] == 4242


def test_an_owner_bound_twice_is_a_translated_integrity_error(ledger: DeliveryLedger) -> None:
    for n in (1, 2):
        prepare(ledger, n)
        ledger.authorize(f"env-{n}")
    ledger.bind_owner("env-1", queued_id="q-1", run_id=None)
    before = snapshot_tables(ledger.engine)
    with pytest.raises(StoreIntegrityError):  # a ValueError; the driver error is its __cause__
        ledger.bind_owner("env-2", queued_id="q-1", run_id=None)
    assert snapshot_tables(ledger.engine) == before


def test_timestamps_out_of_range_are_refused_before_the_database(ledger: DeliveryLedger) -> None:
    for bad in (2**63, "soon", [1]):
        with pytest.raises(ValueError, match="^secure peer ledger timestamp is invalid$"):
            ledger.pending_outbound(now=bad)  # type: ignore[arg-type]


# --- the shared retry/fail transition ---------------------------------------------------------------------
# Admission, response and outbound retries are one state machine (hostedrooms/ledger/retries.py): each case
# below runs it through every public call that uses it. Every row a call returns comes from UPDATE ... RETURNING
# or from the row it locked; the tests compare it with the row read back afterwards.


def _admission(ledger: DeliveryLedger) -> str:
    prepare(ledger, "env-r")
    ledger.authorize("env-r")
    return "env-r"


def _response(ledger: DeliveryLedger) -> str:
    _admission(ledger)
    ledger.prepare_response("env-r", request_id="resp-r", body="answer", request_response=False)
    return "env-r"


def _send(ledger: DeliveryLedger) -> str:
    ledger.prepare_outbound(**outbound_args(request_id="out-r", expires_at=START + 10**6))
    return "out-r"


# name: (set up a retryable row, retry, fail (None: no failure), read back, the queue of due retries at `now`,
#        the columns (attempts, retry_at, last_error))
MACHINES: dict[str, tuple[Any, ...]] = {
    "admission": (_admission, lambda ledger, key, error: ledger.defer_admission(key, error=error),
                  lambda ledger, key, error: ledger.fail_ownerless_authorized(key, error=error),
                  lambda ledger, key: ledger.get(key), lambda ledger, now: ids(ledger.pending_admissions(now=now)),
                  ("admission_attempts", "admission_retry_at", "admission_last_error")),
    "response": (_response, lambda ledger, key, error: ledger.defer_response(key, request_id="resp-r", error=error),
                 None, lambda ledger, key: ledger.get(key), lambda ledger, now: ids(ledger.pending_responses(now=now)),
                 ("response_attempts", "response_retry_at", "response_last_error")),
    # Methods through the instance (never DeliveryLedger.x): the asyncio API's ledger runs them too.
    "outbound": (_send, lambda ledger, key, error: ledger.defer_outbound(key, error),
                 lambda ledger, key, error: ledger.fail_outbound(key, error), lambda ledger, key: ledger.outbound(key),
                 lambda ledger, now: ids(ledger.pending_outbound(now=now), "request_id"),
                 ("attempts", "retry_at", "last_error")),
}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_retry_counts_attempts_and_backs_off(ledger: DeliveryLedger, clock: FakeClock, machine: str) -> None:
    setup, retry, _, read, due, (attempts, retry_at, last_error) = MACHINES[machine]
    key = setup(ledger)
    schedule = []
    for n in range(1, 11):
        clock.advance(1)
        now = int(clock.now)
        row = retry(ledger, key, f"try {n}\x00" + "x" * 500)
        assert row == read(ledger, key)  # RETURNING gives the row as stored
        assert (row[attempts], row[last_error], row["updated_at"]) == (n, (f"try {n}\\x00" + "x" * 500)[:400], now)
        schedule.append(row[retry_at] - now)
        assert due(ledger, row[retry_at] - 1) == [] and due(ledger, row[retry_at]) == [key]
    assert schedule == [2, 4, 8, 16, 32, 64, 128, 256, 256, 256]


@pytest.mark.parametrize("machine", ["admission", "outbound"])
def test_fail_is_terminal(ledger: DeliveryLedger, clock: FakeClock, machine: str) -> None:
    setup, retry, fail, read, due, (attempts, retry_at, last_error) = MACHINES[machine]
    key = setup(ledger)
    retry(ledger, key, "first")
    clock.advance(3)
    failed = fail(ledger, key, "given up\x00")
    assert failed == read(ledger, key) and failed["state"] == "failed" and failed["updated_at"] == int(clock.now)
    error = failed["error"] if machine == "admission" else failed[last_error]
    assert (error, failed[attempts], failed[retry_at]) == ("given up\\x00", 1, None)
    before = snapshot_tables(ledger.engine)
    clock.advance(3)
    assert retry(ledger, key, "again") == failed and fail(ledger, key, "twice") == failed
    assert due(ledger, 2**40) == []
    if machine == "admission":
        assert ledger.bind_owner(key, queued_id="q", run_id=None) is None and ledger.recoverable() == []
    else:
        assert ledger.commit_outbound(key, {"ok": True}) == failed and ledger.recoverable_outbound() == []
    assert snapshot_tables(ledger.engine) == before


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_a_missed_guard_returns_the_row_as_it_stands_and_changes_nothing(
    ledger: DeliveryLedger, clock: FakeClock, machine: str
) -> None:
    setup, retry, fail, read, _, _ = MACHINES[machine]
    calls = [retry] if fail is None else [retry, fail]
    for call in calls:
        assert call(ledger, "missing", "x") is None
    key = setup(ledger)
    # the row leaves the machine: owned (admission), committed (response, outbound)
    if machine == "admission":
        ledger.bind_owner(key, queued_id="q", run_id=None)
    elif machine == "response":
        ledger.mark_response_committed(key)
    else:
        ledger.commit_outbound(key, {"ok": True})
    current = read(ledger, key)
    before = snapshot_tables(ledger.engine)
    clock.advance(5)
    for call in calls:
        assert call(ledger, key, "late") == current
    if machine == "response":  # another intent's id misses the guard too
        ledger.clear_response_intent(key, request_id="resp-r")
        assert ledger.defer_response(key, request_id="other", error="x") == read(ledger, key)
    else:
        assert snapshot_tables(ledger.engine) == before


def _blocked_on_a_lock(engine: Engine) -> None:
    """Wait (generously) until another session of this PostgreSQL database waits for a lock; SQLite gives no
    such view, so there the loser is only given a head start (the outcome is the same whichever runs first)."""
    if engine.dialect.name == "sqlite":
        time.sleep(0.3)
        return
    waiting = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND wait_event_type = 'Lock'")
    deadline = time.monotonic() + 30
    with engine.connect() as connection:
        while connection.execute(waiting).scalar_one() == 0:
            assert time.monotonic() < deadline, "the losing call never waited for the row"
            time.sleep(0.01)
            connection.rollback()


@pytest.mark.sync_api_only  # several threads call the services at once
@pytest.mark.parametrize(("machine", "call"), [("admission", 1), ("admission", 2), ("outbound", 1), ("outbound", 2)])
def test_a_lost_race_returns_the_winners_row(ledger: DeliveryLedger, machine: str, call: int) -> None:
    setup, *calls = MACHINES[machine]
    read = calls[2]
    key = setup(ledger)
    table, column, winner = (
        (deliveries, deliveries.c.envelope_id, {"state": "queued", "queued_id": "q-winner"}) if machine == "admission"
        else (outbound_intents, outbound_intents.c.request_id, {"state": "committed", "response_json": "{}"}))
    result: list[Any] = []
    with ledger.engine.connect() as connection:
        connection.begin()  # SQLite: BEGIN IMMEDIATE, the write lock; PostgreSQL: the row lock below
        connection.execute(sa.update(table).where(column == key).values(**winner))
        loser = threading.Thread(target=lambda: result.append(calls[call - 1](ledger, key, "lost")))
        loser.start()
        _blocked_on_a_lock(ledger.engine)
        connection.commit()
    loser.join(timeout=60)
    assert not loser.is_alive()
    won = read(ledger, key)
    assert result == [won] and won["state"] == winner["state"]
    assert won["attempts" if machine == "outbound" else "admission_attempts"] == 0


# --- the limits seam --------------------------------------------------------------------------------------


def test_capacity_is_read_from_the_limits_given_at_call_time(engine: Engine, clock: FakeClock) -> None:
    capacity = [1]
    provided = DeliveryLedger(engine, clock=clock, limits=lambda: LimitValues.read(
        SimpleNamespace(MAX_NONTERMINAL_DELIVERIES=capacity[0])))
    prepare(provided, 1)
    with pytest.raises(RuntimeError, match="^secure peer delivery capacity is full$"):
        prepare(provided, 2)
    with pytest.raises(ValueError, match="^secure peer response retry limit is invalid$"):
        provided.pending_responses(limit=2)
    capacity[0] = 2  # a provider is called at call time
    assert prepare(provided, 2)[1] is True and provided.pending_responses(limit=2) == []
    fixed = DeliveryLedger(engine, clock=clock, limits=LimitValues.read(SimpleNamespace(MAX_NONTERMINAL_DELIVERIES=3)))
    assert prepare(fixed, 3)[1] is True
    with pytest.raises(RuntimeError, match="^secure peer delivery capacity is full$"):
        prepare(fixed, 4)
