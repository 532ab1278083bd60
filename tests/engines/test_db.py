"""Engines from paths, URLs and Engines; bad targets get a clear HostedRoomError with the password masked."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from factories import connect_error

from hostedrooms import HostedRoomError, StoreUnavailableError, UnitOfWork
from hostedrooms.db import create_engine, resolve_url


def _pragma(engine: sa.Engine, name: str) -> object:
    with engine.connect() as connection:
        return connection.exec_driver_sql(f"PRAGMA {name}").scalar_one()


def test_a_path_is_a_durable_wal_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "state.db"
    engine = create_engine(path)
    try:
        assert _pragma(engine, "journal_mode") == "wal"
        assert _pragma(engine, "synchronous") == 2  # FULL
        assert _pragma(engine, "foreign_keys") == 1
        assert int(str(_pragma(engine, "busy_timeout"))) > 0
        assert path.is_file()
    finally:
        engine.dispose()


def test_normal_synchronous_is_an_explicit_opt_in(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "fast.db", synchronous="NORMAL")
    try:
        assert _pragma(engine, "synchronous") == 1
    finally:
        engine.dispose()
    with pytest.raises(HostedRoomError, match="synchronous must be one of"):
        create_engine(tmp_path / "x.db", synchronous="OFF")


def test_a_foreign_sqlite_engine_is_adopted_with_our_hooks(tmp_path: Path) -> None:
    plain = sa.create_engine(f"sqlite:///{tmp_path / 'plain.db'}")
    adopted = create_engine(plain)
    try:
        assert adopted is plain
        assert _pragma(adopted, "journal_mode") == "wal"
        with UnitOfWork(adopted) as uow:  # BEGIN IMMEDIATE: the write lock is held from the start
            other = sa.create_engine(f"sqlite:///{tmp_path / 'plain.db'}", connect_args={"timeout": 0.05})
            with other.connect() as connection, pytest.raises(sa.exc.OperationalError, match="locked"):
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            other.dispose()
            uow.commit()
    finally:
        adopted.dispose()


def test_postgresql_urls_use_psycopg3() -> None:
    assert resolve_url("postgresql://u:p@localhost/db").drivername == "postgresql+psycopg"
    assert resolve_url("postgresql+psycopg://u:p@localhost/db").drivername == "postgresql+psycopg"


@pytest.mark.parametrize("target", ["mysql://alice:s3cret-pw@db.example/rooms", "oracle://alice:s3cret-pw@h/x"])
def test_unsupported_dialect_is_refused_with_the_password_masked(target: str) -> None:
    with pytest.raises(HostedRoomError, match="unsupported database dialect") as caught:
        create_engine(target)
    assert "s3cret-pw" not in str(caught.value)
    assert "alice" in str(caught.value)


def test_malformed_url_is_refused_with_the_password_masked() -> None:
    with pytest.raises(HostedRoomError, match="malformed database URL") as caught:
        create_engine("postgresql://alice:s3cret-pw@localhost:notaport/db")
    assert "s3cret-pw" not in str(caught.value)


def test_empty_target_is_refused() -> None:
    with pytest.raises(HostedRoomError, match="must not be empty"):
        create_engine("")


def test_unreachable_database_names_the_target_and_masks_the_password() -> None:
    error = connect_error("postgresql://alice:s3cret-pw@127.0.0.1:1/rooms", StoreUnavailableError, connect_timeout=2)
    message = str(error)
    assert "127.0.0.1:1/rooms" in message and "***" in message
    assert "s3cret-pw" not in message
    assert isinstance(error.__cause__, sa.exc.OperationalError)


def test_statement_parameters_stay_out_of_errors(tmp_path: Path) -> None:
    from hostedrooms import StoreIntegrityError, migrate
    from hostedrooms.models import retired_ids

    migrate.upgrade(tmp_path / "p.db")
    engine = create_engine(tmp_path / "p.db")
    try:
        with UnitOfWork(engine) as uow:
            uow.execute(sa.insert(retired_ids).values(room_id="private-value-123", retired_at=1.0))
            uow.commit()
        with pytest.raises(StoreIntegrityError) as caught, UnitOfWork(engine) as uow:
            uow.execute(sa.insert(retired_ids).values(room_id="private-value-123", retired_at=2.0))
    finally:
        engine.dispose()
    assert "private-value-123" not in str(caught.value)
    assert "private-value-123" not in str(caught.value.__cause__)
