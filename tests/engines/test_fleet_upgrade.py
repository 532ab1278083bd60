"""One command upgrades a fleet (#37): ``fleet.upgrade_schemas`` and ``hostedrooms upgrade --schemas`` over many
gateways' schemas of one PostgreSQL database: fresh, older and current schemas together, one broken schema that
fails alone, a rerun that finishes only what is left, two fleet runs at once, and the CLI agreeing with the
library. Schemas are PostgreSQL's: on SQLite these tests are skipped (the refusal itself is tested)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from factories import run_cli

from hostedrooms import fleet, migrate, testing
from hostedrooms.cli.store import fleet_lines
from hostedrooms.errors import InvalidInputError, StoreConfigurationError
from hostedrooms.uow import UnitOfWork

OLD = "0008_budget_shards"
#: The index the head revision creates; a schema already holding one of that name cannot be upgraded.
CONFLICT = "idx_hosted_room_replica_events_event_id"
#: A bound on any one fleet run here (a few seconds normally): a deadlock fails the test instead of hanging it.
BOUND = 240.0


def _skip_sqlite(backend: str) -> None:
    if backend == "sqlite":
        pytest.skip("a fleet is many schemas of one PostgreSQL database; SQLite has no schemas "
                    "(test_sqlite_is_refused covers it)")


def _create_fleet(url: str, prefix: str) -> dict[str, list[str]]:
    """Twenty schemas named ``{prefix}_NN``: 8 fresh (created empty, as a database owner would), 6 at an older
    revision, 5 at head, and ``{prefix}_broken`` at the older revision holding an index the next one creates."""
    kinds = {"fresh": [f"{prefix}_{n:02}" for n in range(8)],
             "old": [f"{prefix}_{n:02}" for n in range(8, 14)],
             "head": [f"{prefix}_{n:02}" for n in range(14, 19)],
             "broken": [f"{prefix}_broken"]}
    with testing.open_engine(url) as engine, engine.begin() as connection:
        for schema in kinds["fresh"]:
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    for schema in kinds["old"] + kinds["broken"]:
        migrate.upgrade(url, OLD, schema=schema)
    for schema in kinds["head"]:
        migrate.upgrade(url, schema=schema)
    _break(url, kinds["broken"][0])
    return kinds


def _break(url: str, schema: str) -> None:
    with testing.open_engine(url) as engine, engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE INDEX {CONFLICT} ON {schema}.hosted_room_replica_events (room_id)")


def _mend(url: str, schema: str) -> None:
    with testing.open_engine(url) as engine, engine.begin() as connection:
        connection.exec_driver_sql(f"DROP INDEX {schema}.{CONFLICT}")


def _statuses(report: fleet.FleetReport) -> dict[str, str]:
    return {outcome.schema: outcome.status for outcome in report.outcomes}


@pytest.fixture
def fleet_url(request: pytest.FixtureRequest, backend: str) -> Iterator[str]:
    """A database of its own for one fleet test."""
    _skip_sqlite(backend)
    admin: str = request.getfixturevalue("pg_admin_url")
    with testing.postgres_database(admin, testing.unique_name("hostedrooms_fleetup")) as url:
        yield url


def _run_bounded(call: Callable[[], fleet.FleetReport]) -> fleet.FleetReport:
    """``call()`` in a thread, joined with a bound (a deadlocked fleet run fails the test)."""
    result: list[fleet.FleetReport] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=BOUND)
    assert not thread.is_alive(), f"a fleet upgrade took over {BOUND} s: deadlocked?"
    return result[0]


def test_fleet_upgrades_all_but_the_broken_one_then_a_rerun_finishes_it(fleet_url: str) -> None:
    kinds = _create_fleet(fleet_url, "gw")
    head = migrate.head_revision()
    schemas = sorted(name for names in kinds.values() for name in names)
    report = _run_bounded(lambda: fleet.upgrade_schemas(fleet_url, schemas, workers=3))
    assert [outcome.schema for outcome in report.outcomes] == schemas  # the order given
    assert sorted(report.of("upgraded")) == kinds["fresh"] + kinds["old"]
    assert report.of("current") == kinds["head"]
    assert report.of("failed") == ["gw_broken"] and not report.ok
    broken = report.outcomes[schemas.index("gw_broken")]
    assert broken.before == OLD and broken.after == OLD and CONFLICT in (broken.error or "")
    for outcome in report.outcomes:
        if outcome.status == "upgraded":
            assert outcome.after == head
            assert outcome.before == (OLD if outcome.schema in kinds["old"] else None)
    for schema in schemas:  # what the report says is what the database holds; the failed one is unchanged
        expected = OLD if schema == "gw_broken" else head
        assert migrate.current_revision(fleet_url, schema=schema) == expected

    _mend(fleet_url, "gw_broken")
    rerun = _run_bounded(lambda: fleet.upgrade_schemas(fleet_url, schemas, workers=3))
    assert rerun.of("upgraded") == ["gw_broken"] and rerun.ok
    assert sorted(rerun.of("current")) == sorted(set(schemas) - {"gw_broken"})
    assert migrate.current_revision(fleet_url, schema="gw_broken") == head


def test_the_cli_agrees_with_the_library(fleet_url: str, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    kinds = _create_fleet(fleet_url, "cli")
    with testing.open_engine(fleet_url) as engine, engine.begin() as connection:
        connection.exec_driver_sql("CREATE SCHEMA cli_other")  # holds a table of its own: never selected
        connection.exec_driver_sql("CREATE TABLE cli_other.host_table (id int)")
    selected = fleet.select_schemas(fleet_url, "cli\\_%")
    assert selected == sorted(name for names in kinds.values() for name in names)
    code, out, err = run_cli(capsys, "upgrade", "--url", fleet_url, "--schema-pattern", "cli\\_%", "--workers", "2")
    assert code == 1, err
    lines = out.splitlines()
    status = {line.split(":")[0]: line.split(": ", 1)[1].split(" ")[0] for line in lines[:-1]}
    assert {name for name, word in status.items() if word == "upgraded"} == set(kinds["fresh"] + kinds["old"])
    assert {name for name, word in status.items() if word == "already"} == set(kinds["head"])
    assert {name for name, word in status.items() if word == "FAILED"} == {"cli_broken"}
    assert lines[-1].startswith("fleet: 14 upgraded, 5 already at head, 1 failed, of 20")

    _mend(fleet_url, "cli_broken")
    listed = tmp_path / "schemas.txt"
    listed.write_text("# the fleet\n" + "\n".join(selected) + "\n\n")
    code, out, _ = run_cli(capsys, "upgrade", "--url", fleet_url, "--schemas-from", str(listed), "--workers", "1")
    library = fleet.upgrade_schemas(fleet_url, selected, workers=1)  # all at head now: what the CLI left
    assert code == 0
    assert "cli_broken: upgraded" in out and out.count("already at head (") == 19
    assert library.ok and library.of("current") == selected
    assert fleet_lines(library)[:-1] == [f"{name}: already at head ({library.head})" for name in selected]


def test_two_fleet_runs_at_once_do_not_deadlock(fleet_url: str) -> None:
    """Two runs over the same schemas in opposite orders: each schema's own migration lock serialises them; both
    finish within the bound, every schema ends at head, none is reported failed."""
    schemas = [f"gw_{n:02}" for n in range(6)]
    reports: list[fleet.FleetReport] = []
    threads = [threading.Thread(target=lambda order=order: reports.append(
        fleet.upgrade_schemas(fleet_url, order, workers=2)), daemon=True) for order in (schemas, schemas[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=BOUND)
    assert not any(thread.is_alive() for thread in threads), "fleet runs deadlocked"
    assert len(reports) == 2 and all(report.ok for report in reports)
    for schema in schemas:
        assert migrate.is_at_head(fleet_url, schema=schema)


def test_a_held_migration_lock_fails_that_schema_alone_after_lock_timeout(fleet_url: str) -> None:
    """Another upgrader holds gw_held's own migration lock: gw_held fails after ``lock_timeout``, gw_free (whose
    lock is another key) upgrades meanwhile; nothing waits without a bound."""
    migrate.upgrade(fleet_url, OLD, schema="gw_held")
    with testing.open_engine(fleet_url, schema="gw_held") as held, UnitOfWork(held) as holder:
        holder.backend.lock_migrations(holder.connection)
        report = _run_bounded(lambda: fleet.upgrade_schemas(
            fleet_url, ["gw_held", "gw_free"], workers=2, lock_timeout=1.0))
    assert _statuses(report) == {"gw_held": "failed", "gw_free": "upgraded"}
    assert "lock timeout" in (report.outcomes[0].error or "")
    assert migrate.current_revision(fleet_url, schema="gw_held") == OLD
    assert fleet.upgrade_schemas(fleet_url, ["gw_held", "gw_free"], workers=1).of("upgraded") == ["gw_held"]


def test_passwords_are_never_shown(fleet_url: str) -> None:
    wrong = sa.make_url(fleet_url).set(database="no_such_db", password="s3cret-pw").render_as_string(
        hide_password=False)
    report = fleet.upgrade_schemas(wrong, ["gw_a", "gw_b"], workers=1)
    assert report.of("failed") == ["gw_a", "gw_b"]
    assert all("s3cret-pw" not in (outcome.error or "") for outcome in report.outcomes)


def test_bad_arguments_touch_nothing(fleet_url: str) -> None:
    with pytest.raises(StoreConfigurationError):
        fleet.upgrade_schemas(fleet_url, ["gw_ok", "bad-name"])
    with pytest.raises(InvalidInputError):
        fleet.upgrade_schemas(fleet_url, "gw_ok")
    with pytest.raises(InvalidInputError):
        fleet.upgrade_schemas(fleet_url, ["gw_ok"], workers=0)
    assert fleet.select_schemas(fleet_url, "gw\\_%") == []  # gw_ok was never created


def test_sqlite_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigurationError, match="PostgreSQL"):
        fleet.upgrade_schemas(str(tmp_path / "state.db"), ["gw_a"])
    assert not (tmp_path / "state.db").exists()
