"""``hostedrooms status`` and :mod:`hostedrooms.status`: a store of known contents read in one snapshot, the exact
figures, the verdict and its exit codes at and across thresholds, and a store that cannot be read (3, unknown)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import lowered, prepare
from factories import run_cli as _run
from sqlalchemy import Engine

import hostedrooms.limits
from hostedrooms import UnitOfWork, migrate, testing
from hostedrooms.backends import backend_for
from hostedrooms.cli import inspect as cli
from hostedrooms.errors import InvalidInputError, SchemaMissingError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.models import replicas, rooms
from hostedrooms.status import Assessment, Thresholds, assess, store_status

NOW = 10_000
A, B = "install:gw-a", "install:gw-b"
LIMITS = {"MAX_ACTIVE_ROOMS": 4, "MAX_DISBANDED_ROOM_TOMBSTONES": 4, "MAX_EVENTS_PER_ROOM": 100,
          "MAX_ROOM_EVENT_BYTES": 1000, "MAX_GATEWAY_EVENT_BYTES": 10_000, "MAX_REPLICA_ROOMS": 4,
          "MAX_REPLICA_EVENT_BYTES": 1000, "MAX_NONTERMINAL_DELIVERIES": 10}


def _room(room_id: str, events: int, size: int, disbanded_at: float | None = None) -> dict[str, Any]:
    return {"room_id": room_id, "name": room_id, "members_json": "[]", "authority_gateway_id": A,
            "authority_epoch": 1, "next_seq": events + 1, "event_bytes": size, "created_at": 1.0,
            "updated_at": 1.0, "disbanded_at": disbanded_at}


def _replica(room_id: str, gateway: str, epoch: int, last: int, latest: int, size: int,
             updated_at: float) -> dict[str, Any]:
    return {"room_id": room_id, "name": room_id, "members_json": "[]", "authority_gateway_id": gateway,
            "authority_epoch": epoch, "last_seq": last, "latest_seq": latest, "event_bytes": size,
            "created_at": 1.0, "updated_at": updated_at}


def _ledger(engine: Engine) -> None:
    """A delivery in each state, created at a known time, outbound intents in each state, one response intent."""
    now = [0]
    ledger = DeliveryLedger(engine, clock=lambda: now[0])

    def at(timestamp: int) -> None:
        now[0] = timestamp

    at(9_000)
    prepare(ledger, 1)
    at(9_400)
    prepare(ledger, 2)
    ledger.authorize("env-2")
    at(9_700)
    prepare(ledger, 3)
    ledger.authorize("env-3")
    ledger.bind_owner("env-3", queued_id="q-3", run_id=None)
    at(9_800)
    prepare(ledger, 4)
    ledger.authorize("env-4")
    ledger.bind_owner("env-4", queued_id=None, run_id="run-4")
    ledger.prepare_response("env-4", request_id="resp-4", body="answer", request_response=False)
    at(5_000)
    prepare(ledger, 5)
    ledger.authorize("env-5")
    ledger.bind_owner("env-5", queued_id=None, run_id="run-5")
    ledger.finish("env-5", succeeded=True, result_text="done")
    at(6_000)
    prepare(ledger, 6)
    ledger.finish("env-6", succeeded=False, error="gave up")
    for request_id, created, end in (("out-1", 9_900, None), ("out-2", 8_000, "commit"), ("out-3", 7_000, "fail")):
        at(created)
        ledger.prepare_outbound(request_id=request_id, source_session_id="chat-1", source_run_id="run-1",
                                snapshot={"connection_id": "conn-1", "source_route_id": "route-a",
                                          "source_route_revision": "rev-1", "source_chat_id": "chat-1",
                                          "action": "request_reply"},
                                body="hello", action="request_reply", expires_at=2**40)
        if end == "commit":
            ledger.commit_outbound(request_id, {"ok": True})
        elif end == "fail":
            ledger.fail_outbound(request_id, "unreachable")


@pytest.fixture
def known(engine: Engine) -> Engine:
    """The store of known contents (with :data:`LIMITS`): rooms at 90% / 85% / 0% of their per-room limits, one
    disbanded room, replicas 10, 0 and 3 events behind, the ledger above."""
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(rooms), [_room("alpha", 90, 500), _room("beta", 10, 850), _room("gamma", 0, 0),
                                       _room("old", 5, 2000, disbanded_at=5_000.0)])
        uow.execute(sa.insert(replicas), [_replica("rep-a", A, 2, 40, 50, 900, 9_000.0),
                                          _replica("rep-b", B, 1, 7, 7, 100, 9_990.0),
                                          _replica("rep-c", A, 1, 0, 3, 0, 9_500.0)])
        uow.commit()
    _ledger(engine)
    return engine


def _cap(used: int, limit: int, percent: float, name: str) -> dict[str, Any]:
    return {"used": used, "limit": limit, "percent": percent, "limit_name": f"MAX_{name}"}


def _backlog(count: int, age: float | None) -> dict[str, Any]:
    return {"count": count, "oldest_age": age}


EV, RB, REP = "EVENTS_PER_ROOM", "ROOM_EVENT_BYTES", "REPLICA_EVENT_BYTES"
EXPECTED_ROOMS = {
    "live": _cap(3, 4, 75.0, "ACTIVE_ROOMS"), "disbanded": _cap(1, 4, 25.0, "DISBANDED_ROOM_TOMBSTONES"),
    "events": 105, "bytes": _cap(3350, 10_000, 33.5, "GATEWAY_EVENT_BYTES"), "disbanded_bytes": 2000,
    "most_events": _cap(90, 100, 90.0, EV), "most_bytes": _cap(850, 1000, 85.0, RB),
    "fullest": [
        {"room_id": "alpha", "events": _cap(90, 100, 90.0, EV), "bytes": _cap(500, 1000, 50.0, RB)},
        {"room_id": "beta", "events": _cap(10, 100, 10.0, EV), "bytes": _cap(850, 1000, 85.0, RB)},
        {"room_id": "gamma", "events": _cap(0, 100, 0.0, EV), "bytes": _cap(0, 1000, 0.0, RB)}]}
EXPECTED_REPLICAS = {
    "rooms": _cap(3, 4, 75.0, "REPLICA_ROOMS"), "behind": 2, "lag": 13, "max_lag": 10,
    "largest": _cap(900, 1000, 90.0, REP),
    "most_behind": [
        {"room_id": "rep-a", "authority": {"gateway_id": A, "epoch": 2}, "last_seq": 40, "latest_seq": 50, "lag": 10,
         "bytes": _cap(900, 1000, 90.0, REP), "updated_at": 9_000.0, "since_update": 1_000.0},
        {"room_id": "rep-c", "authority": {"gateway_id": A, "epoch": 1}, "last_seq": 0, "latest_seq": 3, "lag": 3,
         "bytes": _cap(0, 1000, 0.0, REP), "updated_at": 9_500.0, "since_update": 500.0},
        {"room_id": "rep-b", "authority": {"gateway_id": B, "epoch": 1}, "last_seq": 7, "latest_seq": 7, "lag": 0,
         "bytes": _cap(100, 1000, 10.0, REP), "updated_at": 9_990.0, "since_update": 10.0}]}
EXPECTED_LEDGER = {
    "deliveries": {"prepared": _backlog(1, 1_000.0), "authorized": _backlog(1, 600.0), "queued": _backlog(1, 300.0),
                   "running": _backlog(1, 200.0), "completed": _backlog(1, 5_000.0),
                   "failed": _backlog(1, 4_000.0)},
    "outbound": {"pending": _backlog(1, 100.0), "committed": _backlog(1, 2_000.0), "failed": _backlog(1, 3_000.0)},
    "in_flight": _cap(4, 10, 40.0, "NONTERMINAL_DELIVERIES"), "responses_pending": 1, "backlog": _backlog(5, 1_000.0)}


def test_the_exact_figures_of_a_known_store(known: Engine, backend: str) -> None:
    status = store_status(known, now=NOW, limits=lowered(**LIMITS))
    assert status["now"] == NOW and status["backend"] == backend
    assert status["schema"] == {"revision": migrate.head_revision(), "head": migrate.head_revision(), "at_head": True}
    assert status["rooms"] == EXPECTED_ROOMS
    assert status["replicas"] == EXPECTED_REPLICAS
    assert status["ledger"] == EXPECTED_LEDGER
    # top bounds both lists, never the totals; an age is never negative (a row stamped after now).
    short = store_status(known, now=8_000, limits=lowered(**LIMITS), top=1)
    assert [room["room_id"] for room in short["rooms"]["fullest"]] == ["alpha"]
    assert [item["room_id"] for item in short["replicas"]["most_behind"]] == ["rep-a"]
    assert short["replicas"]["lag"] == 13 and short["ledger"]["deliveries"]["prepared"]["oldest_age"] == 0.0
    assert short["replicas"]["most_behind"][0]["since_update"] == 0.0


def test_an_empty_store_and_the_default_limits(engine: Engine) -> None:
    status = store_status(engine, now=NOW, top=0)
    assert status["rooms"]["live"] == _cap(0, 256, 0.0, "ACTIVE_ROOMS") and status["rooms"]["fullest"] == []
    assert status["ledger"]["backlog"] == _backlog(0, None)
    assert assess(status) == {"state": "ok", "exit_code": 0, "findings": []}


@pytest.mark.parametrize(("now", "top", "field"), [(float("nan"), 10, "now"), ("soon", 10, "now"),
                                                   (NOW, -1, "top"), (NOW, 501, "top"), (NOW, True, "top")])
def test_bad_arguments_are_refused_before_any_read(now: Any, top: Any, field: str) -> None:
    def never() -> Engine:
        raise AssertionError("the store was opened")

    with pytest.raises(InvalidInputError) as caught:
        store_status(never, now=now, top=top)
    assert caught.value.field == field


def _verdict(engine: Engine, **thresholds: Any) -> tuple[str, list[str]]:
    result = assess(store_status(engine, now=NOW, limits=lowered(**LIMITS)), Thresholds(**thresholds))
    return result["state"], [f"{item['state']}:{item['check']}" for item in result["findings"]]


def test_the_verdict_at_and_across_each_threshold(known: Engine) -> None:
    # Defaults (80%, 95%): the fullest room's events (90%), its bytes (85%) and the largest replica (90%) warn.
    assert _verdict(known) == ("warning", ["warning:rooms.room_events", "warning:rooms.room_bytes",
                                           "warning:replicas.replica_bytes"])
    assert _verdict(known, warn_percent=90.01) == ("ok", [])
    # A value at a threshold crosses it.
    assert _verdict(known, critical_percent=90) == ("critical", [
        "critical:rooms.room_events", "critical:replicas.replica_bytes", "warning:rooms.room_bytes"])
    assert _verdict(known, warn_percent=75, critical_percent=100)[1] == [
        "warning:rooms.live", "warning:rooms.room_events", "warning:rooms.room_bytes", "warning:replicas.rooms",
        "warning:replicas.replica_bytes"]
    # Gateway bytes count live rooms only (13.5%: the disbanded room's 2000 bytes are pruned before a refusal).
    assert "warning:rooms.bytes" in _verdict(known, warn_percent=13.5, critical_percent=100)[1]
    assert "warning:rooms.bytes" not in _verdict(known, warn_percent=13.6, critical_percent=100)[1]
    quiet = {"warn_percent": None, "critical_percent": None}
    assert _verdict(known, **quiet) == ("ok", [])
    # The oldest unfinished item (the prepared delivery) is 1000 s old.
    assert _verdict(known, **quiet, warn_backlog_age=1000) == ("warning", ["warning:ledger.backlog_age"])
    assert _verdict(known, **quiet, warn_backlog_age=1001) == ("ok", [])
    assert _verdict(known, **quiet, warn_backlog_age=10, critical_backlog_age=1000) == (
        "critical", ["critical:ledger.backlog_age"])
    # The most lagging replica is 10 events behind.
    # Lag thresholds are crossed when passed (Nagios's convention; tests/services/test_status_fixes.py).
    assert _verdict(known, **quiet, warn_lag=9, critical_lag=10) == ("warning", ["warning:replicas.lag"])
    assert _verdict(known, **quiet, warn_lag=3, critical_lag=9) == ("critical", ["critical:replicas.lag"])
    assert _verdict(known, **quiet, warn_lag=10) == ("ok", [])


def test_a_schema_behind_head_warns_unless_told_otherwise(engine: Engine) -> None:
    status = store_status(engine, now=NOW)
    behind = {**status, "schema": {"revision": "0006_x", "head": "0007_y", "at_head": False}}
    assert assess(behind)["state"] == "warning"  # type: ignore[arg-type]
    assert assess(behind, Thresholds(schema_behind="critical"))["exit_code"] == 2  # type: ignore[arg-type]
    assert assess(behind, Thresholds(schema_behind="ok"))["state"] == "ok"  # type: ignore[arg-type]


@pytest.mark.parametrize("thresholds", [
    {"warn_percent": 96}, {"warn_backlog_age": 10, "critical_backlog_age": 5}, {"warn_lag": -1},
    {"critical_percent": float("inf")}, {"warn_lag": "3"}, {"schema_behind": "panic"}])
def test_bad_thresholds_are_refused(thresholds: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        Thresholds(**thresholds)


def test_a_read_only_store_is_read_and_never_written(known: Engine, target: str, backend: str) -> None:
    """A hot standby refuses every write: the status reads it all the same (and never migrates)."""
    if backend == "sqlite":
        url = f"sqlite:///file:{target}?mode=ro&uri=true"
    else:
        standby = sa.make_url(target).update_query_dict({"options": "-c default_transaction_read_only=on"})
        url = standby.render_as_string(hide_password=False)
    with testing.open_engine(url) as read_only:
        with pytest.raises(sa.exc.DBAPIError), read_only.begin() as connection:  # it is read-only indeed
            connection.execute(sa.delete(rooms))
        assert store_status(read_only, now=NOW, limits=lowered(**LIMITS))["rooms"] == EXPECTED_ROOMS


def test_a_store_without_the_schema_is_refused(empty_target: str, backend: str) -> None:
    if backend == "sqlite":
        sqlite3.connect(empty_target).close()
    with testing.open_engine(empty_target) as empty, pytest.raises(SchemaMissingError):
        store_status(empty, now=NOW)
    if backend == "sqlite":
        assert sqlite3.connect(empty_target).execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


# --- the command --------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_store(known: Engine, target: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in LIMITS.items():
        monkeypatch.setattr(hostedrooms.limits, name, value)
    monkeypatch.setattr(cli, "status_clock", lambda: float(NOW))
    return target


def test_the_command_prints_one_screen(cli_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "status", "--url", cli_store)
    lines = out.splitlines()
    assert code == 1 and err == ""
    assert lines[0].startswith("WARNING: rooms.room_events: 90 of MAX_EVENTS_PER_ROOM")
    assert lines[0].endswith(  # the Nagios performance data
        " | rooms.live=75%;80;95;0; rooms.bytes=13.5%;80;95;0; rooms.room_events=90%;80;95;0; "
        "rooms.room_bytes=85%;80;95;0; replicas.rooms=75%;80;95;0; replicas.replica_bytes=90%;80;95;0; "
        "ledger.in_flight=40%;80;95;0; ledger.backlog_age=1000s;;;0; replicas.lag=10;;;0;")
    assert "rooms       live 3 of 4 (75%); disbanded 1 of 4 (25%)" in lines
    assert "events      105 in every room's log" in lines
    assert ("bytes       3,350 of 10,000 (33.5%) of the gateway budget (MAX_GATEWAY_EVENT_BYTES, every room "
            "together); 2,000 in disbanded rooms") in lines
    assert "alpha  90 of 100 (90%)     500 of 1,000 (50%)" in lines
    assert "replicas    3 of 4 (75%); 2 behind, lag 13 events in all, 10 at most; largest 900 of 1,000 (90%)" in lines
    assert "rep-a    install:gw-a  2      40        50             10   1,000 s" in lines
    assert ("ledger      in flight 4 of 10 (40%); backlog 5, oldest 1,000 s; 1 response intents pending"
            in lines)
    assert "delivery  prepared    1      1,000 s" in lines and "outbound  committed   1      2,000 s" in lines


def test_the_command_json_holds_the_status_and_the_verdict(cli_store: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "status", "--url", cli_store, "--json", "--critical-percent", "90")
    document = json.loads(out)
    assert code == 2 and document["state"] == "critical" and document["exit_code"] == 2
    assert [item["check"] for item in document["findings"]] == [
        "rooms.room_events", "replicas.replica_bytes", "rooms.room_bytes"]
    assert document["status"]["rooms"] == EXPECTED_ROOMS and document["status"]["ledger"] == EXPECTED_LEDGER
    assert document["status"]["replicas"] == EXPECTED_REPLICAS


EXIT_CODES = [
    ((), 1), (("--warn-percent", "91"), 0), (("--critical-percent", "90"), 2),
    (("--warn-percent", "99", "--critical-percent", "100", "--warn-backlog-age", "1000"), 1),
    (("--warn-percent", "99", "--critical-percent", "100", "--critical-backlog-age", "999"), 2),
    (("--warn-percent", "99", "--critical-percent", "100", "--warn-lag", "9"), 1),
    (("--warn-percent", "99", "--critical-percent", "100", "--critical-lag", "9"), 2),
    (("--warn-percent", "99", "--critical-percent", "100", "--warn-lag", "10"), 0),
]


def test_every_exit_code(cli_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    codes = [_run(capsys, "status", "--url", cli_store, *options)[0] for options, _ in EXIT_CODES]
    assert codes == [code for _, code in EXIT_CODES]


@pytest.mark.parametrize(("options", "message"), [
    (("--warn-percent", "abc"), "argument --warn-percent: invalid"),
    (("--warn-percent", "nan"), "argument --warn-percent: must be a finite percentage"),
    (("--critical-backlog-age", "-1"), "argument --critical-backlog-age: must be a finite number of seconds"),
    (("--warn-lag", "1.5"), "argument --warn-lag: invalid"),
    (("--bogus",), "unrecognized arguments: --bogus"),
    (("--warn-percent", "96"), "--warn-percent (96) is above --critical-percent (95)"),
    (("--warn-lag", "5", "--critical-lag", "4"), "--warn-lag (5) is above --critical-lag (4)"),
    (("--top", "501"), "argument --top: must be between 0 and 500"),
])
def test_bad_options_are_unknown_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    options: tuple[str, ...], message: str) -> None:
    """Refused before the store is opened (the file named does not exist, and is not created)."""
    try:
        code, out, err = _run(capsys, "status", "--url", str(tmp_path / "state.db"), *options)
        err = out + err  # the thresholds' own refusals: the UNKNOWN line on stdout
    except SystemExit as exit_:  # argparse's own errors
        code, err = int(str(exit_.code)), capsys.readouterr().err
    assert code == 3 and message in err and not (tmp_path / "state.db").exists()


def test_a_store_that_cannot_be_read_is_unknown(empty_target: str, backend: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.db")
    code, out, err = _run(capsys, "status", "--url", missing)
    assert code == 3 and out.startswith("UNKNOWN: ") and "does not exist" in out and err == ""
    assert not Path(missing).exists()
    if backend == "sqlite":
        sqlite3.connect(empty_target).close()
    code, out, err = _run(capsys, "status", "--url", empty_target, "--json")
    document = json.loads(out)
    assert code == 3 and document["state"] == "unknown" and document["exit_code"] == 3
    assert "no hostedrooms schema" in document["error"] and err == ""



def test_the_result_follows_its_type(known: Engine) -> None:
    """What a type checker and pydantic (a FastAPI response model) are told is what a status holds."""
    import pydantic
    from test_records import Checked

    Checked()(store_status, known, now=NOW, limits=lowered(**LIMITS))
    verdict = assess(store_status(known, now=NOW, limits=lowered(**LIMITS)), Thresholds(warn_lag=3))
    assert len(verdict["findings"]) == 4
    pydantic.TypeAdapter(Assessment).validate_python(verdict, strict=True)


def test_the_status_reads_one_snapshot(engine: Engine, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every statement of a status sees the same snapshot: a room committed between two of its reads is not seen
    (PostgreSQL at READ COMMITTED gives each statement its own snapshot unless told otherwise)."""
    def count(uow: UnitOfWork) -> int:
        return int(uow.execute(sa.select(sa.func.count()).select_from(rooms)).scalar_one())

    with UnitOfWork(engine, write=False) as reader:
        reader.backend.snapshot_reads(reader.connection)
        assert count(reader) == 0
        with UnitOfWork(engine) as writer:
            writer.execute(sa.insert(rooms).values(_room("late", 0, 0)))
            writer.commit()
        assert count(reader) == 0
        if backend == "postgresql":  # and read-only (SQLite's read transaction is one already)
            with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
                reader.execute(sa.delete(rooms))
    dialect, calls = backend_for(engine), []
    snapshot = dialect.snapshot_reads
    monkeypatch.setattr(dialect, "snapshot_reads", lambda connection: calls.append(snapshot(connection)))
    assert store_status(engine, now=NOW)["rooms"]["live"]["used"] == 1 and len(calls) == 1
