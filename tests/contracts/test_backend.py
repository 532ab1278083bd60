"""The backend interface (:class:`hostedrooms.backends.Backend`): transaction kinds, locks, lineage, namespaces,
error classification and the SQL fragments every store builds on, on a migrated, empty store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from hostedrooms import models
from hostedrooms.advisory_keys import PREPARE_LOCK_KEY, ROOM_CREATION_LOCK_KEY
from hostedrooms.backends import (
    Backend,
    PostgreSQLBackend,
    SQLiteBackend,
    backend_for,
    backend_for_url,
    backend_named,
)
from hostedrooms.errors import StoreReadOnlyError, StoreUnavailableError, translate

from .support import SHORT_WAIT, OnBackend, in_thread

_retired = models.retired_ids
_COUNT = sa.select(sa.func.count()).select_from(_retired)


def _retire(engine: Engine, room_id: str, *, backend: Backend) -> None:
    """Commit one retired id from a new transaction on ``engine`` whose lock waits end after SHORT_WAIT."""
    with engine.connect() as connection:
        connection.begin()
        with backend.probe_timeouts(connection, SHORT_WAIT):
            connection.execute(sa.insert(_retired).values(room_id=room_id, retired_at=1.0))
        connection.commit()


def _refused(engine: Engine, attempt: object) -> BaseException:
    """The translated error of ``attempt()`` (it must fail), checked to be the "locked, retry later" class."""
    with pytest.raises(sa_exc.OperationalError) as caught:
        in_thread(attempt)  # type: ignore[arg-type]
    translated = translate(caught.value, engine.url)
    assert isinstance(translated, StoreUnavailableError), translated
    return caught.value


class BackendContract(OnBackend):
    """What every :class:`Backend` promises. A subclass names the backend and its documented differences."""

    backend_class: ClassVar[type[Backend]]
    #: Whether beginning a write transaction (before any statement) excludes every other writer.
    write_begin_excludes_writers: ClassVar[bool]
    #: Whether statement-snapshot reads (:meth:`Backend.begin_statement_reads`) see commits made between them.
    statement_reads_see_each_commit: ClassVar[bool]
    #: Whether a snapshot read transaction refuses writes.
    snapshot_reads_refuse_writes: ClassVar[bool]
    #: Whether two different advisory keys are held independently (else every writer serialises).
    keys_are_independent: ClassVar[bool]
    lineage_pattern: ClassVar[str]

    @pytest.fixture
    def holder(self, engine: Engine) -> Iterator[Connection]:
        """A connection of the test's engine (its transaction rolled back at the end)."""
        with engine.connect() as connection:
            yield connection

    def lock_wait_setting(self, connection: Connection) -> str:
        """The connection's current bound on lock waits, as the backend states it."""
        raise NotImplementedError

    def linguistic(self, expr: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
        """``expr`` under a collation that is not code point order, where the backend has one (else ``expr``)."""
        return expr

    # -- the registry ----------------------------------------------------------------------------------------

    def test_the_registry_serves_this_backend(self, engine: Engine, impl: Backend) -> None:
        assert isinstance(impl, self.backend_class)
        assert impl.name == self.backend_name == engine.dialect.name
        assert backend_named(self.backend_name) is impl is backend_for_url(engine.url)
        with engine.connect() as connection:
            assert backend_for(connection) is impl

    # -- transaction kinds -----------------------------------------------------------------------------------

    def test_a_write_transaction_takes_the_write_lock_at_begin(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        holder.begin()  # a write transaction, no statement run yet
        if self.write_begin_excludes_writers:
            _refused(quick_engine, lambda: _retire(quick_engine, "r1", backend=impl))
            holder.rollback()
        else:  # writers of other rows run beside it
            in_thread(lambda: _retire(quick_engine, "r1", backend=impl))
            holder.rollback()
        with quick_engine.connect() as connection:
            assert connection.execute(_COUNT).scalar_one() == (0 if self.write_begin_excludes_writers else 1)

    def test_a_deferred_read_takes_no_write_lock(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        impl.defer_begin(holder)
        holder.begin()
        assert holder.execute(_COUNT).scalar_one() == 0
        in_thread(lambda: _retire(quick_engine, "r1", backend=impl))  # a writer beside the read commits
        holder.rollback()
        assert holder.execute(_COUNT).scalar_one() == 1

    def test_snapshot_reads_agree_with_each_other(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        impl.defer_begin(holder)
        holder.begin()
        impl.snapshot_reads(holder)
        assert holder.execute(_COUNT).scalar_one() == 0
        in_thread(lambda: _retire(quick_engine, "r1", backend=impl))
        assert holder.execute(_COUNT).scalar_one() == 0  # the transaction's one snapshot
        if self.snapshot_reads_refuse_writes:
            with pytest.raises(sa_exc.DBAPIError) as caught:
                holder.execute(sa.insert(_retired).values(room_id="r2", retired_at=1.0))
            assert isinstance(translate(caught.value, holder.engine.url), StoreReadOnlyError)
        holder.rollback()
        assert holder.execute(_COUNT).scalar_one() == 1

    def test_statement_reads_take_no_write_lock(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        impl.begin_statement_reads(holder)
        holder.begin()
        assert holder.execute(_COUNT).scalar_one() == 0
        in_thread(lambda: _retire(quick_engine, "r1", backend=impl))
        assert holder.execute(_COUNT).scalar_one() == (1 if self.statement_reads_see_each_commit else 0)
        holder.rollback()

    # -- locking ---------------------------------------------------------------------------------------------

    def _take(self, engine: Engine, impl: Backend, key: int) -> Connection:
        connection = engine.connect()
        try:
            connection.begin()
            with impl.probe_timeouts(connection, SHORT_WAIT):
                impl.advisory_lock(connection, key)
        except BaseException:
            connection.close()
            raise
        return connection

    def test_an_advisory_lock_excludes_a_second_holder_until_its_transaction_ends(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        holder.begin()
        impl.advisory_lock(holder, ROOM_CREATION_LOCK_KEY)
        refused = _refused(quick_engine, lambda: self._take(quick_engine, impl, ROOM_CREATION_LOCK_KEY).close())
        assert not impl.is_missing_store(refused)
        if self.keys_are_independent:
            in_thread(lambda: self._take(quick_engine, impl, PREPARE_LOCK_KEY).close())
        holder.rollback()
        second = in_thread(lambda: self._take(quick_engine, impl, ROOM_CREATION_LOCK_KEY))
        try:  # the key passed to the second holder, which now excludes the next
            _refused(quick_engine, lambda: self._take(quick_engine, impl, ROOM_CREATION_LOCK_KEY).close())
        finally:
            second.close()

    def test_probe_timeouts_bound_lock_waits_within_the_block(self, holder: Connection, impl: Backend) -> None:
        holder.begin()
        before = self.lock_wait_setting(holder)
        with impl.probe_timeouts(holder, 0.25):
            assert self.lock_wait_setting(holder) == "250"
        holder.rollback()
        assert self.lock_wait_setting(holder) == before != "250"

    def test_for_update_locks_the_selected_rows(
        self, holder: Connection, quick_engine: Engine, impl: Backend
    ) -> None:
        with holder.begin():
            holder.execute(sa.insert(_retired).values(room_id="r0", retired_at=1.0))
        locking = impl.for_update(sa.select(_retired.c.retired_at).where(_retired.c.room_id == "r0"))
        impl.defer_begin(holder)  # a read transaction: only for_update's row lock keeps writers out
        holder.begin()
        assert holder.execute(locking).all() == [(1.0,)]

        def write_the_row() -> None:
            with quick_engine.connect() as connection:
                connection.begin()
                with impl.probe_timeouts(connection, SHORT_WAIT):
                    connection.execute(sa.update(_retired).where(_retired.c.room_id == "r0").values(retired_at=2.0))
                connection.commit()

        if self.write_begin_excludes_writers:
            # SQLite locks the database, not rows: a write transaction (BEGIN IMMEDIATE) is what excludes writers,
            # and the read above holds no lock; for_update leaves the statement as it was.
            assert "FOR UPDATE" not in str(locking.compile(dialect=holder.dialect))
            holder.rollback()
            holder.begin()
            holder.execute(locking).all()
        _refused(quick_engine, write_the_row)
        holder.rollback()
        in_thread(write_the_row)

    # -- lineage, namespace, error classification ---------------------------------------------------------------

    def test_lineage_names_the_history_and_stays_put(self, engine: Engine, impl: Backend) -> None:
        with engine.connect() as first, engine.connect() as second:
            lineage = impl.lineage(first)
            assert re.fullmatch(self.lineage_pattern, lineage), lineage
            assert impl.lineage(first) == impl.lineage(second) == lineage

    def test_the_legacy_namespace_is_none(self, engine: Engine, impl: Backend) -> None:
        with engine.connect() as connection:
            assert impl.namespace(connection) is None
            raw = connection.connection.dbapi_connection
            assert impl.raw_namespace(engine.dialect, raw, engine.url) is None

    def test_is_missing_store_only_for_a_missing_database(self, engine: Engine, impl: Backend, tmp_path: Path
    ) -> None:
        assert not impl.is_missing_store(sa_exc.OperationalError("SELECT 1", {}, Exception("database is locked")))
        if impl.name == "sqlite":  # SQLite finds a missing file before connecting
            assert impl.store_absent(sa.make_url(f"sqlite:///{tmp_path / 'absent.db'}"))
            assert not impl.store_absent(engine.url)
            return
        missing = engine.url.set(database="hostedrooms_no_such_database")
        probe = impl.probe_engine(missing, 5.0)
        try:
            with pytest.raises(sa_exc.OperationalError) as caught:
                probe.connect().close()
        finally:
            probe.dispose()
        assert impl.is_missing_store(caught.value)

    # -- SQL fragments -----------------------------------------------------------------------------------------

    def test_insert_on_conflict_do_nothing_keeps_the_stored_row(self, holder: Connection, impl: Backend) -> None:
        holder.execute(sa.insert(_retired).values(room_id="r1", retired_at=1.0))
        stmt = impl.insert(_retired).values(room_id="r1", retired_at=2.0)
        # Asked to keep it (SQLAlchemy drops an INSERT's rowcount otherwise), the rowcount says whether the row was
        # inserted (1) or skipped (0): PeerStore.insert_receipt relies on it.
        kept = {"preserve_rowcount": True}
        skipped = stmt.on_conflict_do_nothing(index_elements=[_retired.c.room_id]).execution_options(**kept)
        assert holder.execute(skipped).rowcount == 0
        fresh = impl.insert(_retired).values(room_id="r2", retired_at=2.0).on_conflict_do_nothing()
        assert holder.execute(fresh.execution_options(**kept)).rowcount == 1
        assert holder.execute(sa.select(_retired).order_by(_retired.c.room_id)).all() == [("r1", 1.0), ("r2", 2.0)]

    def test_insert_on_conflict_do_update_replaces_where_allowed(self, holder: Connection, impl: Backend) -> None:
        holder.execute(sa.insert(_retired).values(room_id="r1", retired_at=5.0))

        def upsert(at: float) -> None:
            stmt = impl.insert(_retired).values(room_id="r1", retired_at=at)
            holder.execute(stmt.on_conflict_do_update(
                index_elements=[_retired.c.room_id], set_={"retired_at": stmt.excluded.retired_at},
                where=stmt.excluded.retired_at > _retired.c.retired_at))

        upsert(3.0)  # the WHERE refuses: the row stays
        assert holder.execute(sa.select(_retired.c.retired_at)).scalar_one() == 5.0
        upsert(7.0)
        assert holder.execute(sa.select(_retired.c.retired_at)).scalar_one() == 7.0
        assert holder.execute(_COUNT).scalar_one() == 1

    def test_greatest_is_the_scalar_maximum(self, holder: Connection, impl: Backend) -> None:
        assert holder.execute(sa.select(impl.greatest(sa.literal(2), sa.literal(9), sa.literal(4)))).scalar() == 9
        assert holder.execute(sa.select(impl.greatest(sa.literal(-1.5), sa.literal(-2.5)))).scalar() == -1.5
        holder.execute(sa.insert(_retired).values(room_id="r1", retired_at=5.0))
        column = sa.select(impl.greatest(_retired.c.retired_at, sa.literal(6.0)))
        assert holder.execute(column).scalar() == 6.0

    def test_bytewise_orders_by_code_point(self, holder: Connection, impl: Backend) -> None:
        ids = ["b", "B", "a", "_x", "Z", "aa", "a-b", "ab", "é", "e", "\u20ac", "\U0001f600"]
        holder.execute(sa.insert(_retired), [{"room_id": room_id, "retired_at": 1.0} for room_id in ids])
        column = self.linguistic(_retired.c.room_id)
        ordered = holder.execute(sa.select(_retired.c.room_id).order_by(impl.bytewise(column))).scalars().all()
        assert ordered == sorted(ids)

    def test_byte_length_counts_utf8_bytes(self, holder: Connection, impl: Backend) -> None:
        text = "a\u00e9\u20ac\U0001f600"  # 1 + 2 + 3 + 4 bytes
        assert holder.execute(sa.select(impl.byte_length(sa.literal(text)))).scalar() == 10
        holder.execute(sa.insert(_retired).values(room_id=text, retired_at=1.0))
        assert holder.execute(sa.select(impl.byte_length(_retired.c.room_id))).scalar() == 10
        assert holder.execute(sa.select(impl.byte_length(sa.literal("")))).scalar() == 0


class TestBackendSQLite(BackendContract):
    backend_name = "sqlite"
    backend_class = SQLiteBackend
    write_begin_excludes_writers = True
    statement_reads_see_each_commit = False
    snapshot_reads_refuse_writes = False
    keys_are_independent = False
    lineage_pattern = "sqlite"

    def lock_wait_setting(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("PRAGMA busy_timeout").scalar())


class TestBackendPostgreSQL(BackendContract):
    backend_name = "postgresql"
    backend_class = PostgreSQLBackend
    write_begin_excludes_writers = False
    statement_reads_see_each_commit = True
    snapshot_reads_refuse_writes = True
    keys_are_independent = True
    lineage_pattern = r"postgresql:\d+:\d+"

    def lock_wait_setting(self, connection: Connection) -> str:
        return str(connection.exec_driver_sql("SHOW lock_timeout").scalar()).removesuffix("ms")

    def linguistic(self, expr: sa.ColumnElement[str]) -> sa.ColumnElement[str]:
        # The test cluster's default collation already is code point order (C.UTF-8); an ICU collation is not.
        return expr.collate("und-x-icu")
