"""Remote-run receipts: one run and session per 9-column logical task identity."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from apis import use_api
from sqlalchemy import Engine

from hostedrooms import models, peers
from hostedrooms.errors import HostedRoomError

_api = use_api("peers")  # the tests on a database run on both APIs

CONFLICT = "^remote run receipt conflicts with its logical task$"


def receipt(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "room_id": "room-1", "home_install_id": "home-1", "authority_gateway_id": "install:home",
        "authority_epoch": 1, "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha",
        "task_id": "task-1", "execution_generation": 1, "run_id": "run-1", "session_id": "session-1"}
    record.update(changes)
    return record


def test_receipt_round_trips_with_created_and_updated_times(engine: Engine) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=10)
    assert peers.remote_run_receipt(engine, record=receipt()) == {**receipt(), "created_at": 10.0, "updated_at": 10.0}


def test_the_same_record_again_only_touches_updated_at(engine: Engine) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=10)
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=20)
    found = peers.remote_run_receipt(engine, record=receipt())
    assert found is not None and (found["created_at"], found["updated_at"]) == (10.0, 20.0)
    assert len(peers.list_remote_run_receipts(engine)) == 1


@pytest.mark.parametrize("changes", [{"run_id": "run-other"}, {"session_id": "session-other"}])
def test_a_different_run_or_session_conflicts(engine: Engine, changes: dict[str, Any]) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=10)
    with pytest.raises(HostedRoomError, match=CONFLICT):
        peers.upsert_remote_run_receipt(engine, record=receipt(**changes), now=30)
    found = peers.remote_run_receipt(engine, record=receipt(**changes))
    assert found == {**receipt(), "created_at": 10.0, "updated_at": 10.0}


@pytest.mark.parametrize("column", models.REMOTE_RUN_IDENTITY_COLUMNS)
def test_every_identity_column_distinguishes_tasks(engine: Engine, column: str) -> None:
    other = receipt(**{column: 2 if column in ("authority_epoch", "execution_generation") else "other"})
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=10)
    assert peers.remote_run_receipt(engine, record=other) is None
    peers.upsert_remote_run_receipt(engine, record={**other, "run_id": "run-2"}, now=11)
    assert len(peers.list_remote_run_receipts(engine)) == 2


def test_list_filters_and_durable_order(engine: Engine) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(task_id="task-b"), now=10)
    peers.upsert_remote_run_receipt(engine, record=receipt(task_id="task-a", execution_generation=2), now=10)
    peers.upsert_remote_run_receipt(engine, record=receipt(task_id="task-a"), now=10)
    peers.upsert_remote_run_receipt(engine, record=receipt(task_id="Task-z"), now=10)
    peers.upsert_remote_run_receipt(engine, record=receipt(task_id="task-0"), now=5)
    peers.upsert_remote_run_receipt(
        engine, record=receipt(task_id="task-p", target_profile="beta", session_id="session-2"), now=7)
    order = [(row["task_id"], row["execution_generation"]) for row in peers.list_remote_run_receipts(engine)]
    assert order == [("task-0", 1), ("task-p", 1), ("Task-z", 1), ("task-a", 1), ("task-a", 2), ("task-b", 1)]
    assert [row["task_id"] for row in peers.list_remote_run_receipts(engine, target_profile="beta")] == ["task-p"]
    assert [row["task_id"] for row in peers.list_remote_run_receipts(
        engine, room_id="room-1", target_profile="alpha", session_id="session-1")] == [
        "task-0", "Task-z", "task-a", "task-a", "task-b"]
    assert peers.list_remote_run_receipts(engine, session_id="nope") == []
    assert peers.list_remote_run_receipts(engine, room_id="room-2") == []


def test_list_returns_every_column(engine: Engine) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=3)
    [row] = peers.list_remote_run_receipts(engine)
    assert list(row) == [column.name for column in models.remote_runs.columns]


@pytest.mark.parametrize("missing", peers.REMOTE_RUN_COLUMNS)
def test_missing_key_names_the_key_and_changes_nothing(engine: Engine, missing: str) -> None:
    record = receipt()
    del record[missing]
    with pytest.raises(HostedRoomError, match=f"^remote run record is missing {missing}$"):
        peers.upsert_remote_run_receipt(engine, record=record, now=1)
    assert peers.list_remote_run_receipts(engine) == []


@pytest.mark.parametrize("missing", models.REMOTE_RUN_IDENTITY_COLUMNS)
def test_lookup_with_a_missing_identity_key_names_it(engine: Engine, missing: str) -> None:
    record = receipt()
    del record[missing]
    with pytest.raises(HostedRoomError, match=f"^remote run record is missing {missing}$"):
        peers.remote_run_receipt(engine, record=record)


def test_lookup_needs_only_the_identity(engine: Engine) -> None:
    peers.upsert_remote_run_receipt(engine, record=receipt(), now=1)
    identity = {column: receipt()[column] for column in models.REMOTE_RUN_IDENTITY_COLUMNS}
    found = peers.remote_run_receipt(engine, record=identity)
    assert found is not None and found["run_id"] == "run-1"


@pytest.mark.parametrize(("changes", "message"), [
    ({"authority_epoch": 0}, "remote run authority_epoch must be a positive integer"),
    ({"authority_epoch": "1"}, "remote run authority_epoch must be a positive integer"),
    ({"authority_epoch": True}, "remote run authority_epoch must be a positive integer"),
    ({"execution_generation": 1.0}, "remote run execution_generation must be a positive integer"),
    ({"execution_generation": 2**63}, "remote run execution_generation must be a positive integer"),  # > 64 bits
    ({"authority_epoch": 2**63}, "remote run authority_epoch must be a positive integer"),
    ({"task_id": 5}, "remote run task_id must be a string"),
    ({"run_id": None}, "remote run run_id must be a string"),
])
def test_bad_values_are_refused_before_touching_the_store(
    engine: Engine, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(HostedRoomError, match=f"^{message}$"):
        peers.upsert_remote_run_receipt(engine, record=receipt(**changes), now=1)
    assert peers.list_remote_run_receipts(engine) == []


def test_non_string_filters_and_non_mapping_records_are_refused(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^session_id must be a string$"):
        peers.list_remote_run_receipts(engine, session_id=3)  # type: ignore[arg-type]
    with pytest.raises(HostedRoomError, match="^remote run record must be a mapping$"):
        peers.upsert_remote_run_receipt(engine, record="task-1", now=1)  # type: ignore[arg-type]


@pytest.mark.sync_api_only  # several threads call the services at once
def test_concurrent_upserts_of_one_task_bind_exactly_one_run(engine: Engine) -> None:
    count = 8
    barrier = threading.Barrier(count, timeout=60)

    def bind(index: int) -> str:
        barrier.wait()
        try:
            peers.upsert_remote_run_receipt(engine, record=receipt(run_id=f"run-{index}"), now=10 + index)
        except HostedRoomError as exc:
            assert str(exc) == "remote run receipt conflicts with its logical task"
            return "conflict"
        return f"run-{index}"

    with ThreadPoolExecutor(max_workers=count) as pool:
        outcomes = list(pool.map(bind, range(count), timeout=120))
    winners = [outcome for outcome in outcomes if outcome != "conflict"]
    assert len(winners) == 1
    [row] = peers.list_remote_run_receipts(engine)
    assert row["run_id"] == winners[0]
