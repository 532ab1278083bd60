"""``repair_budget`` (and ``hostedrooms repair-budget``): a drifted gateway budget is re-derived from the rooms.

A shard edited by hand makes the budget account for other bytes than the rooms hold: ``verify`` reports it, and
appends are admitted against the wrong total (past the limit, when the shards count too few bytes). The repair,
holding every shard, makes the shards account for the rooms' bytes again, after which appends are admitted exactly
to the limit; on a clean budget it changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import USER, lowered, run_cli
from sqlalchemy import Engine

from hostedrooms import integrity, rooms
from hostedrooms.db import create_engine
from hostedrooms.errors import CapacityExceededError
from hostedrooms.limits import LimitValues

LOCAL = "install:gw-local"


def _append(engine: Engine, n: int, limits: LimitValues | None = None) -> None:
    rooms.append_event(engine, room_id="r1", event_id=f"e{n:03d}", kind="message.user", actor=dict(USER),
                       payload={"text": "hi"}, authority_gateway_id=LOCAL, authority_epoch=1, limits=limits)


def _event_size(engine: Engine) -> int:
    """The accounted bytes of one event of :func:`_append` (every one the same): appends the first."""
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=LOCAL, now=1000.0)
    _append(engine, 0)
    return int(_shards(engine)["rooms"])


def _shards(engine: Engine) -> dict[str, Any]:
    with engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT shard, used, allowance, spread_limit FROM hosted_room_budget ORDER BY shard").all()
        held = connection.exec_driver_sql("SELECT COALESCE(SUM(event_bytes), 0) FROM hosted_rooms").scalar_one()
    return {"rows": [tuple(int(value) for value in row) for row in rows], "rooms": int(held)}


def _drift(engine: Engine, size: int) -> None:
    """By hand: a shard holding bytes forgets ``size`` of them (raw SQL, as an operator's edit would)."""
    with engine.begin() as connection:
        shard = connection.execute(sa.text(
            "SELECT shard FROM hosted_room_budget WHERE used >= :size ORDER BY shard LIMIT 1"), {"size": size}
        ).scalar_one()
        connection.execute(sa.text("UPDATE hosted_room_budget SET used = used - :size WHERE shard = :shard"),
                           {"size": size, "shard": shard})


def _budget_violations(engine: Engine) -> list[str]:
    return [str(violation) for violation in integrity.verify(engine) if violation.check == "budget"]


@pytest.mark.parametrize("repaired", [True, False], ids=["repaired", "left drifted"])
def test_a_drifted_budget_is_reported_repaired_and_admits_exactly_to_the_limit(
        engine: Engine, repaired: bool) -> None:
    size = _event_size(engine)
    limits = lowered(MAX_GATEWAY_EVENT_BYTES=10 * size)
    for n in range(1, 8):
        _append(engine, n, limits)  # 8 events held, room for 2 more
    _drift(engine, size)
    assert _budget_violations(engine) == [
        f"budget: gateway: budget shards account for {7 * size} bytes, rooms hold {8 * size}"]
    if repaired:
        repair = integrity.repair_budget(engine, limits=limits)
        assert repair.changed and [str(problem) for problem in repair.problems] == [
            f"budget: gateway: budget shards account for {7 * size} bytes, rooms hold {8 * size}"]
        assert (repair.shards_used, repair.rooms_bytes, repair.limit) == (7 * size, 8 * size, 10 * size)
        assert repair.allowance_after == 10 * size
        assert integrity.verify(engine) == []
    _append(engine, 8, limits)
    _append(engine, 9, limits)  # exactly at the limit
    if not repaired:  # what the repair prevents: the drifted shards admit one event too many
        _append(engine, 10, limits)
        assert _shards(engine)["rooms"] == 11 * size
        return
    with pytest.raises(CapacityExceededError) as refused:
        _append(engine, 10, limits)
    assert refused.value.limit == "MAX_GATEWAY_EVENT_BYTES"
    assert _shards(engine)["rooms"] == 10 * size and integrity.verify(engine) == []


def test_a_clean_budget_is_left_as_it_is(engine: Engine) -> None:
    size = _event_size(engine)
    for n in range(1, 12):
        _append(engine, n)
    before = _shards(engine)
    repair = integrity.repair_budget(engine)
    assert not repair.changed and repair.problems == ()
    assert repair.shards_used == repair.rooms_bytes == 12 * size
    assert repair.allowance_before == repair.allowance_after
    assert _shards(engine) == before


def test_a_missing_shard_is_restored(engine: Engine) -> None:
    size = _event_size(engine)
    with engine.begin() as connection:
        last = connection.exec_driver_sql("SELECT MAX(shard) FROM hosted_room_budget").scalar_one()
        connection.execute(sa.text("DELETE FROM hosted_room_budget WHERE shard = :shard"), {"shard": last})
    repair = integrity.repair_budget(engine)
    assert repair.changed and "budget shard(s) missing" in str(repair.problems[-1])
    assert integrity.verify(engine) == [] and _shards(engine)["rooms"] == size
    assert len(_shards(engine)["rows"]) == last + 1


def test_the_command_repairs_then_finds_nothing_to_do(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    engine = create_engine(target)
    try:
        size = _event_size(engine)
        _drift(engine, size)
    finally:
        engine.dispose()
    code, out, _ = run_cli(capsys, "verify", "--url", target)
    assert code == 1 and f"budget shards account for 0 bytes, rooms hold {size}" in out
    code, out, err = run_cli(capsys, "repair-budget", "--url", target)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"budget: gateway: budget shards account for 0 bytes, rooms hold {size}",
        f"repair-budget: repaired: shards accounted for 0 bytes, now {size} (what the rooms hold); allowances "
        "16777216 -> 16777216 bytes, spread for 16777216"]  # the default limit, spread before and after
    code, out, _ = run_cli(capsys, "verify", "--url", target)
    assert (code, out) == (0, "verify: clean\n")
    code, out, _ = run_cli(capsys, "repair-budget", "--url", target)
    assert (code, out) == (0, f"repair-budget: clean, nothing changed (shards account for {size} bytes)\n")


def test_the_command_refuses_a_missing_store_and_one_without_schema(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "repair-budget", "--url", str(tmp_path / "typo.db"))
    assert (code, out) == (1, "") and "does not exist" in err and not (tmp_path / "typo.db").exists()
    sa.create_engine(f"sqlite:///{tmp_path / 'empty.db'}").connect().close()
    code, out, err = run_cli(capsys, "repair-budget", "--url", str(tmp_path / "empty.db"))
    assert (code, out) == (1, "") and "no hostedrooms schema" in err
