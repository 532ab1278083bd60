"""The facades' module namespaces against the reference modules': every public top-level name of each reference
module is decided here (and in docs/migrating.md, "Migrating from the reference implementation"), one test per name.

Callers and test suites written for the reference read and patch module attributes
(``monkeypatch.setattr(hosted_room_replicas, "local_authority_gateway_id", ...)``). A name the reference looks up
at call time is looked up at call time here too, and patching it changes the facade's behaviour the way it
changes the reference's; the expected behaviour below is the reference's, written out (the project's tests do
not depend on the reference code).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from factories import prepare, replica_page
from test_readme import documents

from hostedrooms import migrate
from hostedrooms.compat import _engine
from hostedrooms.compat import hosted_room_replicas as hrr
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.compat import secure_peer_delivery as spd
from hostedrooms.errors import HostedRoomError

# --- every public top-level name of the reference modules, and the decision for each -----------------------------

#: Looked up by the reference at call time; here too (patching changes behaviour): tested one by one below.
PATCHABLE = {
    "hosted_rooms": {
        "append_event", "time",
        "CONTROL_EVENT_BYTE_RESERVE", "CONTROL_EVENT_COUNT_RESERVE", "DISBANDED_ROOM_RETENTION_SECONDS",
        "MAX_ACTIVE_ROOMS", "MAX_ACTOR_ID_CHARS", "MAX_ACTOR_LABEL_CHARS", "MAX_DISBANDED_ROOM_TOMBSTONES",
        "MAX_EVENTS_PER_ROOM", "MAX_EVENT_ID_CHARS", "MAX_EVENT_JSON_BYTES", "MAX_EVENT_KIND_CHARS",
        "MAX_GATEWAY_EVENT_BYTES", "MAX_LOG_LIMIT", "MAX_LOG_PAGE_BYTES", "MAX_MEMBERS", "MAX_MEMBERS_JSON_BYTES",
        "MAX_ROOM_EVENT_BYTES", "MAX_ROOM_ID_CHARS", "MAX_ROOM_LIST_LIMIT", "MAX_ROOM_NAME_CHARS",
    },
    "hosted_room_replicas": {
        "local_authority_gateway_id", "time",
        "MAX_ACTOR_ID_CHARS", "MAX_EVENT_JSON_BYTES", "MAX_REPLICA_EVENT_BYTES", "MAX_REPLICA_ROOMS",
        "MAX_ROOM_ID_CHARS",
    },
    "secure_peer_delivery": {"time", "os", "ensure_private_directory", "MAX_NONTERMINAL_DELIVERIES"},
}

#: Provided for reading and calling; nothing inside the facade reads them back, so replacing the attribute changes
#: only what its callers get (as in the reference, except where the README says otherwise).
READ = {
    "hosted_rooms": {
        "annotations", "PROTOCOL_VERSION", "DbPath", "default_db_path", "local_authority_gateway_id",
        "identifier", "bounded_int", "canonical_json", "compact_json", "utf8_len",
        "HostedRoomError", "RoomNotFoundError", "RoomHistoryExpiredError", "RoomConflictError",
        "RoomProbeUnavailableError", "EventConflictError", "AuthorityConflictError", "AuthoritySupersededError",
        "user_event_id", "prune_disbanded_rooms", "list_room_link_records", "upsert_room_link_record",
        "update_room_link_status", "delete_room_link_records", "revoke_room_grant_scope", "reserve_peer_room",
        "peer_room_is_reserved", "peer_room_grant_is_current", "room_grant_is_revoked", "upsert_remote_run_receipt",
        "list_remote_run_receipts", "remote_run_receipt", "create_room", "list_rooms", "rename_room",
        "probe_hosted_room", "probe_peer_room_reservation", "room_state", "request_room_stop", "claim_authority",
        "disband_room", "read_events",
    },
    "hosted_room_replicas": {
        "annotations", "HostedRoomError", "RoomConflictError", "ReplicaError", "ReplicaGapError",
        "ReplicaEpochRegressionError", "ingest_page", "replica_state", "promote_replica", "demote_room",
    },
    "secure_peer_delivery": {
        "annotations", "DELIVERY_STATES", "TERMINAL_DELIVERY_STATES", "SecurePeerDeliveryLedger", "canonical_json",
    },
}

#: Deliberately not provided (README): the reference's raw sqlite3 plumbing, and standard modules it used inside.
ABSENT = {
    "hosted_rooms": {"sqlite3", "connect", "open_sqlite", "transaction", "table_columns", "table_exists",
                     "hashlib", "json", "re"},
    "hosted_room_replicas": {"sqlite3", "json"},
    "secure_peer_delivery": {"sqlite3", "hashlib", "json", "stat", "threading"},
}

#: Typing and helper names the reference imported for its own code: not part of the facade's API. A facade that
#: uses one itself holds the standard object, never something else under that name.
STANDARD = {
    "hosted_rooms": {"Any": "typing", "Mapping": "typing", "Iterator": "typing", "NoReturn": "typing",
                     "Path": "pathlib", "partial": "functools", "closing": "contextlib",
                     "contextmanager": "contextlib"},
    "hosted_room_replicas": {"Any": "typing", "Path": "pathlib"},
    "secure_peer_delivery": {"Any": "typing", "Iterator": "typing", "Mapping": "typing", "Path": "pathlib",
                             "contextmanager": "contextlib"},
}

#: The public top-level names of each reference module (its functions, classes, constants and imports).
REFERENCE_NAMES = {
    "hosted_rooms": {
        "annotations", "hashlib", "json", "re", "sqlite3", "closing", "partial", "Path", "Any", "Mapping", "DbPath",
        "bounded_int", "canonical_json", "compact_json", "connect", "identifier", "open_sqlite", "table_columns",
        "table_exists", "transaction", "utf8_len", "PROTOCOL_VERSION", "MAX_ROOM_ID_CHARS", "MAX_EVENT_ID_CHARS",
        "MAX_ROOM_NAME_CHARS", "MAX_EVENT_KIND_CHARS", "MAX_ACTOR_ID_CHARS", "MAX_ACTOR_LABEL_CHARS", "MAX_MEMBERS",
        "MAX_MEMBERS_JSON_BYTES", "MAX_EVENT_JSON_BYTES", "MAX_LOG_LIMIT", "MAX_LOG_PAGE_BYTES",
        "MAX_ROOM_LIST_LIMIT", "MAX_ACTIVE_ROOMS", "MAX_DISBANDED_ROOM_TOMBSTONES",
        "DISBANDED_ROOM_RETENTION_SECONDS", "MAX_EVENTS_PER_ROOM", "MAX_ROOM_EVENT_BYTES", "MAX_GATEWAY_EVENT_BYTES",
        "CONTROL_EVENT_COUNT_RESERVE", "CONTROL_EVENT_BYTE_RESERVE", "HostedRoomError", "RoomNotFoundError",
        "RoomHistoryExpiredError", "RoomConflictError", "RoomProbeUnavailableError", "EventConflictError",
        "AuthorityConflictError", "AuthoritySupersededError", "user_event_id", "default_db_path",
        "local_authority_gateway_id", "prune_disbanded_rooms", "list_room_link_records", "upsert_room_link_record",
        "update_room_link_status", "delete_room_link_records", "revoke_room_grant_scope", "reserve_peer_room",
        "peer_room_is_reserved", "peer_room_grant_is_current", "room_grant_is_revoked", "upsert_remote_run_receipt",
        "list_remote_run_receipts", "remote_run_receipt", "create_room", "list_rooms", "rename_room",
        "append_event", "probe_hosted_room", "probe_peer_room_reservation", "room_state", "request_room_stop",
        "claim_authority", "disband_room", "read_events", "Iterator", "NoReturn", "contextmanager", "time",
    },
    "hosted_room_replicas": {
        "annotations", "json", "sqlite3", "time", "Path", "Any", "MAX_ACTOR_ID_CHARS", "MAX_EVENT_JSON_BYTES",
        "MAX_ROOM_ID_CHARS", "HostedRoomError", "RoomConflictError", "local_authority_gateway_id",
        "MAX_REPLICA_ROOMS", "MAX_REPLICA_EVENT_BYTES", "ReplicaError", "ReplicaGapError",
        "ReplicaEpochRegressionError", "ingest_page", "replica_state", "promote_replica", "demote_room",
    },
    "secure_peer_delivery": {
        "annotations", "contextmanager", "hashlib", "json", "os", "Path", "sqlite3", "stat", "threading", "time",
        "Any", "Iterator", "Mapping", "canonical_json", "ensure_private_directory", "DELIVERY_STATES",
        "TERMINAL_DELIVERY_STATES", "MAX_NONTERMINAL_DELIVERIES", "SecurePeerDeliveryLedger",
    },
}

FACADES: dict[str, ModuleType] = {"hosted_rooms": hr, "hosted_room_replicas": hrr, "secure_peer_delivery": spd}


def _cases(table: dict[str, set[str]] | dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    return [(module, name) for module in sorted(table) for name in sorted(table[module])]


@pytest.mark.parametrize("module", sorted(FACADES))
def test_every_reference_name_has_exactly_one_decision(module: str) -> None:
    groups = [PATCHABLE[module], READ[module], ABSENT[module], set(STANDARD[module])]
    assert sum(len(group) for group in groups) == len(set().union(*groups)), "a name is decided twice"
    assert set().union(*groups) == REFERENCE_NAMES[module]


@pytest.mark.parametrize(("module", "name"), _cases(PATCHABLE) + _cases(READ))
def test_name_is_present(module: str, name: str) -> None:
    assert hasattr(FACADES[module], name)


@pytest.mark.parametrize(("module", "name"), _cases(ABSENT))
def test_name_is_deliberately_absent_and_documented(module: str, name: str) -> None:
    assert not hasattr(FACADES[module], name)
    documented = "".join(path.read_text(encoding="utf-8") for path in documents())  # README.md and docs/
    assert f"`{name}`" in documented


@pytest.mark.parametrize(("module", "name"), _cases(STANDARD))
def test_standard_names_are_never_shadowed(module: str, name: str) -> None:
    import importlib

    facade = FACADES[module]
    if hasattr(facade, name):
        assert getattr(facade, name) is getattr(importlib.import_module(STANDARD[module][name]), name)


# --- fixtures ----------------------------------------------------------------------------------------------------

GATEWAY = "install:gw-home"
NOW = 1_000.0


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("names") / "template.db"
    migrate.upgrade(path)
    return path


@pytest.fixture
def db(template: Path, tmp_path: Path) -> Iterator[str]:
    """A migrated SQLite file for the facades (the engine cache is emptied afterwards)."""
    path = tmp_path / "state.db"
    shutil.copyfile(template, path)
    yield str(path)
    _engine.forget_engines()


@pytest.fixture
def install_id(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-home")
    return GATEWAY


def _room(db: str, room_id: str = "r1", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"room_id": room_id, "name": "Room", "members": [{"id": "m1"}],
                            "authority_gateway_id": GATEWAY, "now": NOW, **overrides}
    return hr.create_room(db, **args)


def _append(db: str, event_id: str = "e1", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"room_id": "r1", "event_id": event_id, "kind": "message.user",
                            "actor": {"kind": "user", "id": "u1"}, "payload": {"text": "hello"},
                            "authority_gateway_id": GATEWAY, "authority_epoch": 1, "now": NOW, **overrides}
    return hr.append_event(db, **args)


def _stop(db: str) -> dict[str, Any]:
    return hr.request_room_stop(db, room_id="r1", cancel_id="c1", expected_gateway_id=GATEWAY, expected_epoch=1)


def _disband_then_prune(db: str) -> None:
    _room(db)
    hr.disband_room(db, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1, now=NOW)
    hr.prune_disbanded_rooms(db, now=NOW + 1)
    hr.room_state(db, room_id="r1", include_disbanded=True)  # history still readable unless pruned


def _ingest(db: str, room_id: str = "r1", gateway: str = "install:gw-other") -> dict[str, Any]:
    return hrr.ingest_page(db, room_id=room_id, room_name="Room", members=[{"id": "m1"}],
                           page=replica_page(1, 1, gateway=gateway, room_id=room_id), now=NOW)


# --- limits: lowering one on the facade module takes effect ------------------------------------------------------

Scenario = Callable[[str], Any]

#: name -> (facade, lowered value, scenario that succeeds with the default and fails with the lowered value,
#: limits set in both runs, the refusal).
LIMITS: dict[str, tuple[ModuleType, int, Scenario, dict[str, int], str]] = {
    "MAX_ROOM_ID_CHARS": (hr, 2, lambda db: _room(db, "abc"), {}, "invalid room_id"),
    "MAX_EVENT_ID_CHARS": (hr, 2, lambda db: (_room(db), _append(db, "abc")), {}, "invalid event_id"),
    "MAX_ROOM_NAME_CHARS": (hr, 2, lambda db: _room(db, name="abc"), {}, "invalid room name"),
    "MAX_EVENT_KIND_CHARS": (hr, 5, lambda db: (_room(db), _append(db)), {}, "invalid event kind"),
    "MAX_ACTOR_ID_CHARS": (hr, 5, lambda db: _room(db), {}, "invalid authority_gateway_id"),
    "MAX_ACTOR_LABEL_CHARS": (hr, 2, lambda db: (_room(db), _append(
        db, actor={"kind": "user", "id": "u1", "display_name": "Ann"})), {}, "display_name is too long"),
    "MAX_MEMBERS": (hr, 1, lambda db: _room(db, members=[{"id": "m1"}, {"id": "m2"}]), {}, "too many room members"),
    "MAX_MEMBERS_JSON_BYTES": (hr, 5, lambda db: _room(db), {}, "members is too large"),
    "MAX_EVENT_JSON_BYTES": (hr, 5, lambda db: (_room(db), _append(db)), {}, "payload is too large"),
    "MAX_LOG_LIMIT": (hr, 2, lambda db: (_room(db), hr.read_events(db, room_id="r1", limit=3)), {},
                      "limit must be between 1 and 2"),
    "MAX_LOG_PAGE_BYTES": (hr, 50, lambda db: (_room(db), _append(db), hr.read_events(db, room_id="r1")), {},
                           "exceeds replay page limit"),
    "MAX_ROOM_LIST_LIMIT": (hr, 2, lambda db: hr.list_rooms(db, limit=3), {}, "limit must be between 1 and 2"),
    "MAX_ACTIVE_ROOMS": (hr, 1, lambda db: (_room(db, "r1"), _room(db, "r2")), {}, "too many active Group Chats"),
    "MAX_DISBANDED_ROOM_TOMBSTONES": (hr, 0, _disband_then_prune, {}, "history expired"),
    "DISBANDED_ROOM_RETENTION_SECONDS": (hr, 0, _disband_then_prune, {}, "history expired"),
    "MAX_EVENTS_PER_ROOM": (hr, 0, lambda db: (_room(db), _append(db)), {}, "history limit"),
    "MAX_ROOM_EVENT_BYTES": (hr, 0, lambda db: (_room(db), _append(db)), {}, "storage limit"),
    "MAX_GATEWAY_EVENT_BYTES": (hr, 0, lambda db: (_room(db), _append(db)), {}, "storage is full on this host"),
    # The reserves admit control events (a stop request) beyond the user limits.
    "CONTROL_EVENT_COUNT_RESERVE": (hr, 0, lambda db: (_room(db), _stop(db)), {"MAX_EVENTS_PER_ROOM": 0},
                                    "history limit"),
    "CONTROL_EVENT_BYTE_RESERVE": (hr, 0, lambda db: (_room(db), _stop(db)), {"MAX_ROOM_EVENT_BYTES": 0},
                                   "storage limit"),
    # The replicas module's own bindings.
    "hrr.MAX_ROOM_ID_CHARS": (hrr, 1, lambda db: _ingest(db), {}, "invalid room_id"),
    "hrr.MAX_ACTOR_ID_CHARS": (hrr, 5, lambda db: _ingest(db), {}, "invalid page.authority.gateway_id"),
    "hrr.MAX_EVENT_JSON_BYTES": (hrr, 5, lambda db: _ingest(db), {}, "payload is too large"),
    "hrr.MAX_REPLICA_ROOMS": (hrr, 1, lambda db: (_ingest(db, "r1"), _ingest(db, "r2")), {},
                              "replica room capacity exhausted"),
    "hrr.MAX_REPLICA_EVENT_BYTES": (hrr, 10, lambda db: _ingest(db), {}, "replica event storage exhausted"),
}


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_lowering_a_limit_on_the_facade_takes_effect(key: str, db: str, template: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    module, lowered, scenario, base, refusal = LIMITS[key]
    name = key.rsplit(".", 1)[-1]
    for other, value in base.items():
        monkeypatch.setattr(module, other, value)
    scenario(db)  # the default limit admits it
    fresh = tmp_path / "fresh.db"
    shutil.copyfile(template, fresh)
    monkeypatch.setattr(module, name, lowered)
    with pytest.raises(HostedRoomError, match=refusal):
        scenario(str(fresh))


def test_lowering_the_ledger_capacity_on_the_facade_takes_effect(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spd, "MAX_NONTERMINAL_DELIVERIES", 1)
    ledger = spd.SecurePeerDeliveryLedger(tmp_path / "ledger" / "ledger.db")
    try:
        prepare(ledger, 1)
        with pytest.raises(RuntimeError):
            prepare(ledger, 2)
    finally:
        ledger.close()


# --- hosted_room_replicas.local_authority_gateway_id ---------------------------------------------------------------


def _caught_up(db: str) -> None:
    _ingest(db, gateway="install:gw-old")


def test_replicas_local_authority_gateway_id_is_the_room_facades_by_default(db: str, install_id: str) -> None:
    assert hrr.local_authority_gateway_id is hr.local_authority_gateway_id
    assert hrr.local_authority_gateway_id() == install_id
    _caught_up(db)
    assert hrr.promote_replica(db, room_id="r1", now=NOW)["authority_gateway_id"] == install_id


def test_patching_replicas_local_authority_gateway_id_moves_promote_and_demote(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTEDROOMS_INSTALL_ID", raising=False)  # only the patched name can answer
    calls: list[None] = []

    def patched() -> str:
        calls.append(None)
        return "install:gw-patched"

    monkeypatch.setattr(hrr, "local_authority_gateway_id", patched)
    _caught_up(db)
    promoted = hrr.promote_replica(db, room_id="r1", now=NOW)
    assert promoted["authority_gateway_id"] == "install:gw-patched" and promoted["authority_epoch"] == 2
    demoted = hrr.demote_room(db, room_id="r1", observed_gateway_id="install:gw-new", observed_epoch=3, now=NOW)
    assert demoted["authority_gateway_id"] == "install:gw-new"
    lost = [e for e in hr.read_events(db, room_id="r1")["events"] if e["kind"] == "authority.lost"]
    assert lost[0]["payload"]["previous_gateway_id"] == "install:gw-patched"
    assert len(calls) == 2  # looked up once per call, at call time


def test_replicas_identity_is_looked_up_after_the_arguments_validated(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> str:
        raise HostedRoomError("stable gateway install identity is unavailable")

    monkeypatch.setattr(hrr, "local_authority_gateway_id", unavailable)
    with pytest.raises(HostedRoomError, match="invalid room_id"):
        hrr.promote_replica(db, room_id="  ", now=NOW)
    with pytest.raises(HostedRoomError, match="observed_epoch must be a positive integer"):
        hrr.demote_room(db, room_id="r1", observed_gateway_id="install:x", observed_epoch=0, now=NOW)
    _caught_up(db)
    with pytest.raises(HostedRoomError, match="identity is unavailable"):
        hrr.promote_replica(db, room_id="r1", now=NOW)


def test_patching_the_room_facades_identity_does_not_reach_the_replicas_module(
        db: str, install_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reference's replicas module imported the function into its own namespace: only its own name counts.
    monkeypatch.setattr(hr, "local_authority_gateway_id", lambda: "install:gw-elsewhere")
    _caught_up(db)
    assert hrr.promote_replica(db, room_id="r1", now=NOW)["authority_gateway_id"] == install_id


# --- the clocks: time --------------------------------------------------------------------------------------------


def test_room_facade_time_is_the_standard_module_and_drives_the_clock(db: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert hr.time is time
    monkeypatch.setattr(hr.time, "time", lambda: 4242.0)
    room = _room(db, now=None)
    assert room["created_at"] == room["updated_at"] == 4242.0


def test_replicas_time_is_read_from_the_module_at_call_time(db: str, install_id: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert hrr.time is time
    monkeypatch.setattr(hrr, "time", SimpleNamespace(time=lambda: 4242.0))
    hrr.ingest_page(db, room_id="r1", room_name="Room", members=[], page=replica_page(1, 1, gateway="install:gw-old"))
    assert hrr.replica_state(db, room_id="r1")["updated_at"] == 4242.0
    monkeypatch.setattr(hrr, "time", SimpleNamespace(time=lambda: 5151.0))
    hrr.promote_replica(db, room_id="r1")
    claim = [e for e in hr.read_events(db, room_id="r1")["events"] if e["kind"] == "authority.claimed"]
    assert claim[0]["created_at"] == 5151.0
    monkeypatch.setattr(hrr, "time", SimpleNamespace(time=lambda: 6161.0))
    hrr.demote_room(db, room_id="r1", observed_gateway_id="install:gw-new", observed_epoch=3)
    assert hr.room_state(db, room_id="r1")["updated_at"] == 6161.0


def test_ledger_time_is_read_from_the_module_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spd.time is time
    ledger = spd.SecurePeerDeliveryLedger(tmp_path / "ledger" / "ledger.db")
    try:
        monkeypatch.setattr(spd, "time", SimpleNamespace(time=lambda: 5000.7))
        record, created = prepare(ledger, 1)
        assert created and record["created_at"] == record["updated_at"] == 5000  # int(time.time())
        monkeypatch.setattr(spd, "time", SimpleNamespace(time=lambda: 6000.0))
        authorized = ledger.authorize("env-1")
        assert authorized is not None and authorized["updated_at"] == 6000
    finally:
        ledger.close()


# --- hosted_rooms.append_event, seen by request_room_stop ----------------------------------------------------------


def test_request_room_stop_goes_through_the_modules_append_event(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    sentinel = {"spied": True}

    def spy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((args, kwargs))
        return sentinel

    monkeypatch.setattr(hr, "append_event", spy)
    assert hr.request_room_stop(db, room_id="r1", cancel_id=" c1 ", expected_gateway_id=GATEWAY,
                                expected_epoch=1) is sentinel
    digest = hashlib.sha256(b"c1").hexdigest()[:32]
    assert calls == [((db,), {
        "room_id": "r1", "event_id": f"room-stop:{digest}", "kind": "room.stop_requested",
        "actor": {"kind": "gateway", "id": GATEWAY}, "payload": {"cancel_id": "c1"},
        "authority_gateway_id": GATEWAY, "authority_epoch": 1})]
    with pytest.raises(HostedRoomError, match="invalid cancel_id"):  # validated before append_event is called
        hr.request_room_stop(db, room_id="r1", cancel_id="", expected_gateway_id=GATEWAY, expected_epoch=1)
    assert len(calls) == 1


def test_request_room_stop_unpatched_appends_the_fence(db: str) -> None:
    _room(db)
    stop = _stop(db)
    assert stop["kind"] == "room.stop_requested" and stop["payload"] == {"cancel_id": "c1"}
    assert _stop(db)["idempotent"] is True


# --- secure_peer_delivery.ensure_private_directory and os -----------------------------------------------------------


def test_ledger_prepares_its_folder_through_the_modules_ensure_private_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)  # a folder the caller does not want made private (the patch's usual purpose)
    seen: list[Path] = []
    monkeypatch.setattr(spd, "ensure_private_directory", lambda path: seen.append(Path(path)))
    ledger = spd.SecurePeerDeliveryLedger(folder / "ledger.db")
    try:
        prepare(ledger, 1)
    finally:
        ledger.close()
    assert seen == [folder]  # called once, like the reference's __init__
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755  # nothing else made it 0700
    assert stat.S_IMODE(os.stat(folder / "ledger.db").st_mode) == 0o600  # the file itself stays private


def test_ledger_default_folder_preparation_is_private(tmp_path: Path) -> None:
    assert spd.ensure_private_directory.__module__ == "hostedrooms.files"
    ledger = spd.SecurePeerDeliveryLedger(tmp_path / "new" / "ledger.db")
    ledger.close()
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700


def test_ledger_os_is_the_standard_module_and_its_owner_checks_read_it_at_call_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert spd.os is os
    real = os.getuid()
    monkeypatch.setattr(spd.os, "getuid", lambda: real + 1)  # as if another user owned the files
    with pytest.raises(PermissionError):
        spd.SecurePeerDeliveryLedger(tmp_path / "ledger" / "ledger.db")


# --- helpers with the reference's contracts (read, not patched) --------------------------------------------------


def test_identifier_contract() -> None:
    assert hr.identifier("  room-1 ", error=HostedRoomError, label="room_id") == "room-1"
    with pytest.raises(HostedRoomError, match="^room_id must be a string$"):
        hr.identifier(1, error=HostedRoomError, label="room_id")
    with pytest.raises(HostedRoomError, match="^invalid room_id$"):
        hr.identifier("a b", error=HostedRoomError, label="room_id")
    with pytest.raises(ValueError, match="^too long$"):
        hr.identifier("abc", error=ValueError, label="x", max_chars=2, invalid="too long")
    assert hr.identifier(" free text ", error=ValueError, label="name", pattern=None) == "free text"


def test_bounded_int_contract() -> None:
    assert hr.bounded_int(5, error=HostedRoomError, message="m", low=1, high=5) == 5
    for bad in (True, 1.0, "1", 0, 6):
        with pytest.raises(HostedRoomError, match="^exact text$"):
            hr.bounded_int(bad, error=HostedRoomError, message="exact text", low=1, high=5)


def test_json_helpers_contract() -> None:
    assert hr.compact_json({"b": 1, "a": "é"}) == '{"a":"\\u00e9","b":1}'
    assert hr.compact_json({"a": "é"}, ensure_ascii=False) == '{"a":"é"}'
    assert hr.canonical_json({"b": [1], "a": "é"}, error=HostedRoomError, label="payload",
                             max_bytes=100) == '{"a":"é","b":[1]}'
    with pytest.raises(HostedRoomError, match="^payload must be JSON-serializable$"):
        hr.canonical_json({1, 2}, error=HostedRoomError, label="payload", max_bytes=100)
    with pytest.raises(HostedRoomError, match="^payload is too large$"):
        hr.canonical_json("é" * 3, error=HostedRoomError, label="payload", max_bytes=7)
    assert hr.utf8_len("é", "ab", "") == 4
    assert spd.canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    with pytest.raises(ValueError):
        spd.canonical_json({"a": float("nan")})


def test_scope_key_and_byte_accounting_do_not_follow_patched_helpers(db: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented deviation: they define stored values that every reader must agree on."""
    claims = {"room_id": "r1", "home_install_id": "home", "authority_gateway_id": GATEWAY, "authority_epoch": 1,
              "target_install_id": "t", "target_profile": "p", "member_id": "m1", "issued_at": NOW - 10}
    hr.revoke_room_grant_scope(db, claims=claims, expires_at=NOW + 100, now=NOW)
    _room(db)
    monkeypatch.setattr(hr, "compact_json", lambda *_args, **_kwargs: "patched")
    monkeypatch.setattr(hr, "utf8_len", lambda *_parts: 0)
    assert hr.room_grant_is_revoked(db, claims=claims, now=NOW) is True
    _append(db)
    from hostedrooms import verify

    assert verify(db) == []  # event_bytes still counts the event's real bytes


def test_constants_and_classes_read_like_the_reference() -> None:
    assert hr.PROTOCOL_VERSION == 2
    assert spd.DELIVERY_STATES == frozenset({"prepared", "authorized", "queued", "running", "completed", "failed"})
    assert spd.TERMINAL_DELIVERY_STATES == frozenset({"completed", "failed"})
    assert issubclass(hrr.ReplicaGapError, hrr.ReplicaError) and issubclass(hrr.ReplicaError, hrr.HostedRoomError)
    assert hrr.HostedRoomError is hr.HostedRoomError and hrr.RoomConflictError is hr.RoomConflictError
