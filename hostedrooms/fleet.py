"""Upgrading a fleet: many gateways' schemas on one PostgreSQL server, from one command.

:func:`upgrade_schemas` upgrades a list of schemas to head and reports each one: ``upgraded`` (with the
revision it was at), ``current`` (already at head: nothing run) or ``failed`` (with the error, any password
masked). A failure in one schema never stops the others, and a rerun skips the schemas already at head, so an
interrupted or partly failed run is finished by running it again. :func:`select_schemas` lists the schemas of a
``LIKE`` pattern: those holding hostedrooms' version table, and the empty ones (a schema a database owner
created for a new gateway); a schema holding other tables but no hostedrooms version table is never selected.

Why worker processes rather than threads: Alembic's ``op`` (what every migration script calls) is one
module-level proxy per process, so two migrations running in threads of one process would send each other's DDL
to the wrong connection. With ``workers=1`` every schema is upgraded in this process, one after the other; with
more, a pool of that many worker processes, each started once (one interpreter start-up per worker, not per
schema), takes the schemas in turn. Each schema's migration takes that schema's own advisory lock (see
:mod:`hostedrooms.backends.pg_namespaces`), so the workers never wait for each other; ``lock_timeout`` bounds
the wait for another upgrader of the same schema (that schema is then reported failed, the others go on).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc

from . import migrate
from .backends import check_schema_name, fleet_schemas
from .db import create_engine, resolve_url
from .errors import InvalidInputError, SchemaMissingError, StoreConfigurationError, redact, translate

__all__ = ["FleetReport", "SchemaOutcome", "Status", "select_schemas", "upgrade_schemas"]

#: What happened to one schema.
Status = Literal["upgraded", "current", "failed"]

#: The most worker processes :func:`upgrade_schemas` starts (each holds one connection at a time).
MAX_WORKERS = 64

#: In this process, one migration at a time: Alembic's ``op`` proxy is process-wide (see the module docstring).
_IN_PROCESS = threading.Lock()


@dataclass(frozen=True)
class SchemaOutcome:
    """One schema's result: its status, its revision before and after, and the error (password masked) when it
    failed (``after`` is then what it holds now: a failed upgrade changed nothing)."""

    schema: str
    status: Status
    before: str | None = None
    after: str | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class FleetReport:
    """Every schema's :class:`SchemaOutcome`, in the order the schemas were given; ``head`` the target revision."""

    head: str | None
    outcomes: tuple[SchemaOutcome, ...] = field(default_factory=tuple)

    def of(self, status: Status) -> list[str]:
        """The schemas whose outcome is ``status``.

        :param status: an outcome's status (``"upgraded"``, ``"current"`` or ``"failed"``).
        :returns: the schema names with that outcome, in the report's order.
        """
        return [outcome.schema for outcome in self.outcomes if outcome.status == status]

    @property
    def ok(self) -> bool:
        """True when every schema is at head (upgraded now or already): the CLI's exit code 0."""
        return all(outcome.status != "failed" for outcome in self.outcomes)


def _postgresql_url(url: str) -> str:
    """``url`` if it names a PostgreSQL database; a StoreConfigurationError otherwise (SQLite has no schemas)."""
    resolved = resolve_url(url)
    if resolved.get_backend_name() != "postgresql":
        raise StoreConfigurationError(
            "a fleet upgrade needs a PostgreSQL URL (schemas are PostgreSQL's); upgrade a SQLite file with "
            "`hostedrooms upgrade --url PATH`")
    return url


def _checked(schemas: Iterable[object]) -> list[str]:
    """The schema names, each checked, duplicates dropped (the first place kept)."""
    if isinstance(schemas, (str, bytes)):
        raise InvalidInputError("schemas must be a list of schema names, not one string", field="schemas")
    return list(dict.fromkeys(check_schema_name(schema) for schema in schemas))


def select_schemas(url: str, pattern: str) -> list[str]:
    """The schemas of ``url`` whose name is ``LIKE pattern`` (``gw_%``; ``_`` matches any one character, ``\\_``
    an underscore) and that hold hostedrooms' version table or are empty, in name order.

    :param url: the PostgreSQL database.
    :param pattern: a SQL ``LIKE`` pattern for the schema names.
    :returns: the matching schema names, in name order.
    :raises InvalidInputError: ``pattern`` is empty, longer than 256 characters or holds a NUL.
    :raises StoreConfigurationError: ``url`` does not name a PostgreSQL database.
    :raises StorageError: the database could not be read.
    """
    if not isinstance(pattern, str) or not pattern or len(pattern) > 256 or "\x00" in pattern:
        raise InvalidInputError("schema pattern must be a non-empty LIKE pattern of at most 256 characters",
                                field="pattern")
    engine = create_engine(_postgresql_url(url))
    try:
        with engine.connect() as connection:
            return fleet_schemas(connection, pattern)
    except sa_exc.SQLAlchemyError as exc:
        raise translate(exc, engine.url) from exc
    finally:
        engine.dispose()


def upgrade_schemas(url: str, schemas: Sequence[str], *, workers: int = 4,
                    lock_timeout: float | None = None) -> FleetReport:
    """Upgrade each of ``schemas`` (of the PostgreSQL database ``url``) to head; missing schemas are created.

    ``workers``: how many schemas migrate at once (worker processes; 1: all in this process). ``lock_timeout``
    (seconds): how long a schema's migration may wait for a lock another session holds (another upgrader of the
    same schema, a long transaction on its tables) before that schema is reported failed; None waits as long as
    it takes. Nothing is raised for a schema that fails: see :class:`FleetReport`. Bad arguments raise
    :class:`~hostedrooms.errors.InvalidInputError` or :class:`~hostedrooms.errors.StoreConfigurationError`
    before any schema is touched.

    :param url: the PostgreSQL database.
    :param schemas: the schema names (a list, not one string).
    :param workers: how many schemas migrate at once, 1 to MAX_WORKERS.
    :param lock_timeout: the longest wait for a lock, in seconds (above 0, at most 86400), or None.
    :returns: the head revision and each schema's outcome.
    :raises InvalidInputError: a schema name, ``workers`` or ``lock_timeout`` is invalid.
    :raises StoreConfigurationError: ``url`` does not name a PostgreSQL database.
    """
    _postgresql_url(url)
    names = _checked(schemas)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InvalidInputError(f"workers must be an integer from 1 to {MAX_WORKERS}", field="workers")
    if lock_timeout is not None and (isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float))
                                     or not 0 < lock_timeout <= 86_400):
        raise InvalidInputError("lock_timeout must be a number of seconds above 0, at most 86400",
                                field="lock_timeout")
    head = migrate.head_revision()
    if workers == 1 or len(names) <= 1:
        outcomes = [upgrade_one(url, name, lock_timeout) for name in names]
    else:
        outcomes = _in_workers(url, names, min(workers, len(names)), lock_timeout)
    return FleetReport(head=head, outcomes=tuple(outcomes))


def _in_workers(url: str, names: list[str], workers: int, lock_timeout: float | None) -> list[SchemaOutcome]:
    """Each schema upgraded by one of ``workers`` fresh processes (spawned: no state of this one is inherited)."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    try:
        futures: list[Future[SchemaOutcome]] = [
            pool.submit(upgrade_one, url, name, lock_timeout) for name in names]
        return [_outcome_of(name, future) for name, future in zip(names, futures, strict=True)]
    except BaseException:  # Ctrl-C: no schema not yet started is started (a rerun resumes)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def _outcome_of(name: str, future: Future[SchemaOutcome]) -> SchemaOutcome:
    """A worker's outcome; a worker that died (killed, out of memory) fails its schema, not the run."""
    try:
        return future.result()
    except Exception as exc:  # BrokenProcessPool and the like: the schema's state is unknown, a rerun tells
        return SchemaOutcome(name, "failed", error=_error_text(exc))


def upgrade_one(url: str, schema: str, lock_timeout: float | None = None) -> SchemaOutcome:
    """Upgrade one schema to head and say what happened; never raises for the schema's own failure.

    :param url: the PostgreSQL database.
    :param schema: the schema to upgrade (created when missing).
    :param lock_timeout: the longest wait for a lock, in seconds (None: no bound).
    :returns: the schema's outcome (``"failed"`` with the error's text when it failed).
    """
    started = time.monotonic()
    engine = create_engine(url, schema=schema)
    if lock_timeout is not None:
        _bound_lock_waits(engine, lock_timeout)
    before: str | None = None
    try:
        before = _revision(engine)
        head = migrate.head_revision()
        if before == head:
            return SchemaOutcome(schema, "current", before, before, seconds=time.monotonic() - started)
        with _IN_PROCESS:
            migrate.upgrade(engine)
        after = _revision(engine)
        return SchemaOutcome(schema, "upgraded", before, after, seconds=time.monotonic() - started)
    except Exception as exc:  # one schema's failure is reported; the fleet goes on
        return SchemaOutcome(schema, "failed", before, before, _error_text(exc), time.monotonic() - started)
    finally:
        engine.dispose()


def _revision(engine: Engine) -> str | None:
    """The schema's revision; None when the schema does not exist yet (the upgrade creates it)."""
    try:
        return migrate.current_revision(engine)
    except SchemaMissingError:
        return None


def _bound_lock_waits(engine: Engine, seconds: float) -> None:
    """Every connection of ``engine`` waits at most ``seconds`` for a lock (PostgreSQL's ``lock_timeout``, which
    advisory locks obey too); the value is a checked number, never text from input."""
    milliseconds = max(1, int(seconds * 1000))

    @event.listens_for(engine, "connect")
    def _lock_timeout(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"SET lock_timeout = {milliseconds}")
        finally:
            cursor.close()
        dbapi_connection.commit()


def _error_text(exc: BaseException) -> str:
    """One line naming the error class, any password masked."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)
