"""The seed-compatible facade (hostedrooms.compat.hosted_rooms) for links, grants, reservations, receipts, probes."""

from __future__ import annotations

import contextlib
import inspect
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from hostedrooms import errors, peers
from hostedrooms.compat import _peers_api
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.compat._engine import forget_engines

LOCAL, REMOTE, OTHER = "install:local", "install:remote", "install:other"
PEER_FUNCTIONS = (
    "list_room_link_records", "upsert_room_link_record", "update_room_link_status", "delete_room_link_records",
    "revoke_room_grant_scope", "room_grant_is_revoked", "reserve_peer_room", "peer_room_is_reserved",
    "peer_room_grant_is_current", "upsert_remote_run_receipt", "list_remote_run_receipts", "remote_run_receipt",
    "probe_hosted_room", "probe_peer_room_reservation")


@pytest.fixture(autouse=True)
def _fresh_engines() -> Iterator[None]:
    yield
    forget_engines()
    peers.forget_probe_engines()


def test_facade_exports_every_peer_function_with_db_path_first() -> None:
    assert sorted(_peers_api.__all__) == sorted(PEER_FUNCTIONS)
    for name in PEER_FUNCTIONS:
        function = getattr(hr, name)
        assert function is getattr(_peers_api, name)
        parameters = list(inspect.signature(function).parameters.values())
        assert parameters[0].name == "db_path"
        assert all(parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in parameters[1:])


def test_room_links_scenario(target: str) -> None:
    record = {"room_id": "room-1", "member_id": "m1", "target_url": "https://peer.example/x",
              "target_profile": "alpha", "grant": "secret-grant", "catalog_json": "{}",
              "cancellation_scope_id": "scope-1", "trace_id": "t-1", "transport_security": "tls", "status": "ready",
              "updated_at": 10.0}
    hr.upsert_room_link_record(target, record=record, max_links=2)
    hr.upsert_room_link_record(target, record={**record, "grant": "rotated"}, max_links=2)
    hr.upsert_room_link_record(target, record={**record, "member_id": "m2"}, max_links=2)
    with pytest.raises(errors.HostedRoomError, match="too many stored room links"):
        hr.upsert_room_link_record(target, record={**record, "member_id": "m3"}, max_links=2)
    links = hr.list_room_link_records(target)
    assert [(link["member_id"], link["grant"]) for link in links] == [("m1", "rotated"), ("m2", "secret-grant")]
    assert set(links[0]) == set(record)
    assert hr.update_room_link_status(target, room_id="room-1", member_id="m1", status="degraded", now=20) is True
    assert hr.update_room_link_status(target, room_id="room-1", member_id="zz", status="degraded") is False
    assert hr.list_room_link_records(target)[0]["status"] == "degraded"
    assert hr.delete_room_link_records(target, room_id="room-1") == 2
    assert hr.list_room_link_records(target) == []


def test_grants_and_reservations_scenario(target: str) -> None:
    now = 10_000.0
    claims = {"room_id": "room-1", "home_install_id": "home-1", "authority_gateway_id": REMOTE, "authority_epoch": 1,
              "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "issued_at": now - 5}
    hr.reserve_peer_room(target, claims=claims, expires_at=now + 100, now=now)
    assert hr.peer_room_is_reserved(target, room_id="room-1", target_profile="alpha", now=now) is True
    assert hr.peer_room_is_reserved(target, room_id="room-1", target_profile="beta", now=now) is False
    assert hr.peer_room_is_reserved(target, room_id="room-1", target_profile="alpha", now=now + 101) is False
    assert hr.probe_peer_room_reservation(target, room_id="room-1", target_profile="alpha", now=now) is True
    assert hr.peer_room_grant_is_current(target, claims=claims, now=now) is True
    with pytest.raises(errors.HostedRoomError, match="must expire in the future"):
        hr.reserve_peer_room(target, claims=claims, expires_at=now, now=now)
    with pytest.raises(errors.HostedRoomError, match="authority_epoch must be positive"):
        hr.reserve_peer_room(target, claims={**claims, "authority_epoch": 0}, expires_at=now + 5, now=now)
    newer = {**claims, "authority_epoch": 2, "authority_gateway_id": OTHER}
    hr.reserve_peer_room(target, claims=newer, expires_at=now + 200, now=now + 1)
    assert hr.peer_room_grant_is_current(target, claims=claims, now=now + 1) is False
    assert hr.peer_room_grant_is_current(target, claims=newer, now=now + 1) is True
    with pytest.raises(errors.AuthorityConflictError, match="reservation authority changed"):
        hr.reserve_peer_room(target, claims=claims, expires_at=now + 300, now=now + 2)
    with pytest.raises(errors.AuthorityConflictError):
        hr.reserve_peer_room(target, claims={**newer, "authority_gateway_id": LOCAL}, expires_at=now + 300, now=now + 2)
    assert hr.room_grant_is_revoked(target, claims=newer, now=now + 2) is False
    hr.revoke_room_grant_scope(target, claims=newer, expires_at=now + 1000, now=now + 10)
    assert hr.room_grant_is_revoked(target, claims=newer, now=now + 11) is True
    assert hr.room_grant_is_revoked(target, claims={**newer, "issued_at": now + 20}, now=now + 21) is False
    assert hr.room_grant_is_revoked(target, claims=newer, now=now + 1001) is False
    assert hr.peer_room_is_reserved(target, room_id="room-1", target_profile="alpha", now=now + 11) is False
    hr.revoke_room_grant_scope(target, claims=claims, expires_at=now, now=now + 50)  # already expired: no-op
    assert hr.room_grant_is_revoked(target, claims=claims, now=now + 51) is False
    with pytest.raises(errors.HostedRoomError, match="room grant scope is incomplete"):
        hr.room_grant_is_revoked(target, claims={"room_id": "room-1"})


def test_remote_run_receipts_scenario(target: str) -> None:
    record = {"room_id": "room-1", "home_install_id": "home-1", "authority_gateway_id": LOCAL, "authority_epoch": 1,
              "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "task_id": "task-1",
              "execution_generation": 1, "run_id": "run-1", "session_id": "session-1"}
    hr.upsert_remote_run_receipt(target, record=record, now=10)
    hr.upsert_remote_run_receipt(target, record=record, now=20)
    hr.upsert_remote_run_receipt(target, record={**record, "task_id": "task-2", "run_id": "run-2"}, now=15)
    receipt = hr.remote_run_receipt(target, record=record)
    assert receipt is not None and receipt["run_id"] == "run-1"
    assert (receipt["created_at"], receipt["updated_at"]) == (10.0, 20.0)
    assert hr.remote_run_receipt(target, record={**record, "execution_generation": 2}) is None
    with pytest.raises(errors.HostedRoomError, match="conflicts with its logical task"):
        hr.upsert_remote_run_receipt(target, record={**record, "run_id": "run-other"})
    assert [r["task_id"] for r in hr.list_remote_run_receipts(target)] == ["task-1", "task-2"]
    assert [r["task_id"] for r in hr.list_remote_run_receipts(
        target, room_id="room-1", target_profile="alpha", session_id="session-1")] == ["task-1", "task-2"]
    assert hr.list_remote_run_receipts(target, session_id="nope") == []


def test_facade_accepts_an_engine_as_db_path(engine: Engine) -> None:
    hr.reserve_peer_room(engine, claims={"room_id": "room-1", "member_id": "m1", "target_profile": "alpha",
                                         "authority_gateway_id": LOCAL, "authority_epoch": 1},
                         expires_at=200, now=100)
    assert hr.peer_room_is_reserved(engine, room_id="room-1", target_profile="alpha", now=150) is True
    assert hr.probe_peer_room_reservation(engine, room_id="room-1", target_profile="alpha", now=150) is True


# --- limits lowered on the facade module -------------------------------------------------------------


def test_lowering_id_limits_on_the_facade_takes_effect(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    claims = {"room_id": "room-1", "member_id": "m1", "target_profile": "alpha", "authority_gateway_id": "gw-1",
              "authority_epoch": 1}
    monkeypatch.setattr(hr, "MAX_ROOM_ID_CHARS", 6)
    monkeypatch.setattr(hr, "MAX_ACTOR_ID_CHARS", 5)
    hr.reserve_peer_room(target, claims=claims, expires_at=200, now=100)  # every id fits exactly
    with pytest.raises(errors.HostedRoomError, match="^invalid room_id$"):
        hr.reserve_peer_room(target, claims={**claims, "room_id": "room-12"}, expires_at=200, now=100)
    with pytest.raises(errors.HostedRoomError, match="^invalid target_profile$"):
        hr.peer_room_is_reserved(target, room_id="room-1", target_profile="alphas", now=100)
    with pytest.raises(errors.HostedRoomError, match="^invalid member_id$"):
        hr.peer_room_grant_is_current(target, claims={**claims, "member_id": "member"}, now=100)
    with pytest.raises(errors.HostedRoomError, match="^invalid room_id$"):
        hr.probe_hosted_room(target, room_id="room-12")
    with pytest.raises(errors.HostedRoomError, match="^invalid target_profile$"):
        hr.probe_peer_room_reservation(target, room_id="room-1", target_profile="alphas", now=100)
    monkeypatch.undo()
    assert hr.peer_room_is_reserved(target, room_id="room-1", target_profile="alphas", now=100) is False


# --- bad input and probes never create or migrate ----------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[Path], Any], str]] = [
    ("link", lambda p: hr.upsert_room_link_record(p, record={"room_id": "r"}, max_links=5), "missing member_id"),
    ("status", lambda p: hr.update_room_link_status(p, room_id=None, member_id="m", status="s"), "room_id must be"),
    ("delete", lambda p: hr.delete_room_link_records(p, room_id=3), "room_id must be a string"),
    ("revoke", lambda p: hr.revoke_room_grant_scope(p, claims={"room_id": "r"}, expires_at=9, now=1), "incomplete"),
    ("revoked", lambda p: hr.room_grant_is_revoked(p, claims={}), "room grant scope is incomplete"),
    ("reserve", lambda p: hr.reserve_peer_room(p, claims={"room_id": ""}, expires_at=9, now=1), "invalid room_id"),
    ("reserved", lambda p: hr.peer_room_is_reserved(p, room_id="r", target_profile=""), "invalid target_profile"),
    ("current", lambda p: hr.peer_room_grant_is_current(p, claims={"room_id": "r"}), "member_id must be a string"),
    ("receipt", lambda p: hr.upsert_remote_run_receipt(p, record={}), "missing room_id"),
    ("receipts", lambda p: hr.list_remote_run_receipts(p, session_id=1), "session_id must be a string"),
    ("lookup", lambda p: hr.remote_run_receipt(p, record={"room_id": "r"}), "missing home_install_id"),
    ("probe", lambda p: hr.probe_hosted_room(p, room_id=None), "room_id must be a string"),
]


@pytest.mark.parametrize(("name", "call", "message"), BAD_CALLS, ids=[name for name, _, _ in BAD_CALLS])
def test_bad_input_never_creates_a_database(
    tmp_path: Path, name: str, call: Callable[[Path], Any], message: str
) -> None:
    path = tmp_path / "absent" / "state.db"
    with pytest.raises(errors.HostedRoomError, match=message):
        call(path)
    assert not path.parent.exists()


def test_facade_probes_answer_false_for_a_missing_store_without_creating_it(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "state.db"
    assert hr.probe_hosted_room(path, room_id="room-1") is False
    assert hr.probe_peer_room_reservation(str(path), room_id="room-1", target_profile="alpha") is False
    assert not path.parent.exists()


def test_facade_probes_never_migrate_an_existing_store(tmp_path: Path) -> None:
    path = tmp_path / "legacy.db"
    with contextlib.closing(sqlite3.connect(path)) as raw:  # the reference's oldest shape: rooms only
        raw.execute("CREATE TABLE hosted_rooms (room_id TEXT PRIMARY KEY, name TEXT NOT NULL, members_json TEXT"
                    " NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL, disbanded_at REAL)")
        raw.execute("INSERT INTO hosted_rooms VALUES ('room-1', 'r', '[]', 1, 1, NULL)")
        raw.commit()
    assert hr.probe_hosted_room(path, room_id="room-1") is True
    assert hr.probe_peer_room_reservation(path, room_id="room-1", target_profile="alpha") is False
    with contextlib.closing(sqlite3.connect(path)) as raw:
        tables = [row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        columns = [row[1] for row in raw.execute("PRAGMA table_info(hosted_rooms)")]
    assert tables == ["hosted_rooms"]
    assert "authority_epoch" not in columns
