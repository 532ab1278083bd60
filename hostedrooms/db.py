"""Engines: turn a target (filesystem path, URL or Engine) into a configured SQLAlchemy Engine.

A URL string is read as libpq reads it (:func:`parse_url`: the last ``@`` before the host ends the user info,
user and password are percent-decoded, several hosts become ``?host=``); a libpq keyword DSN or a URL missing its
``//`` is refused without being quoted, never taken for a file name. A filesystem path means a SQLite file
(WAL, ``synchronous=FULL``, foreign keys, a busy timeout, and ``BEGIN IMMEDIATE`` for write transactions). A
``postgresql://`` URL uses psycopg 3. Bad targets raise
:class:`~hostedrooms.errors.HostedRoomError` naming the target with its password masked; a URL naming another
driver (``postgresql+asyncpg://``) :class:`~hostedrooms.errors.StoreConfigurationError` naming the URL to give.

SQLite creates a database file (and hostedrooms its parent folders) on first use; ``create=False`` opens only
a file that already exists, for tools that must never leave a stray file behind a typo.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import unquote

from sqlalchemy import URL, Engine, make_url
from sqlalchemy import exc as sa_exc

from . import held_autocommit
from .backends import (
    POOLERS,
    Backend,
    backend_for_url,
    backend_named,
    check_schema_name,
    sa_create_engine,
)
from .engine_profile import EngineProfile, Pooler, install, profile_of
from .errors import (
    HostedRoomError,
    InvalidInputError,
    MisuseError,
    StoreConfigurationError,
    describe_target,
)

Target = str | os.PathLike[str] | URL | Engine

#: Environment variable naming the default database URL (CLI, Alembic, tests).
DATABASE_URL_ENV = "HOSTEDROOMS_DATABASE_URL"
DEFAULT_BUSY_TIMEOUT = 10.0
#: The longest ``busy_timeout`` (seconds): a day; SQLite takes milliseconds as a 32-bit int.
MAX_BUSY_TIMEOUT = 86_400.0
SYNCHRONOUS_MODES = frozenset({"FULL", "EXTRA", "NORMAL"})

_E = TypeVar("_E")


def reject_async(target: object) -> None:
    """Refuse an asyncio engine or connection: every hostedrooms call is synchronous and needs an Engine."""
    if isinstance(target, Engine):
        return
    if getattr(target, "sync_engine", None) is not None or type(target).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise MisuseError(
            f"hostedrooms needs a synchronous SQLAlchemy Engine, not {type(target).__name__}; "
            "build one with hostedrooms.create_engine(url), or call hostedrooms.aio with the AsyncEngine")


def resolve_url(target: str | os.PathLike[str] | URL) -> URL:
    """The SQLAlchemy URL for a target; a plain path becomes an absolute SQLite file URL, a URL string is read
    by :func:`parse_url`. A libpq keyword DSN (``host=... password=...``) or a URL missing its ``//`` is refused
    (an :class:`~hostedrooms.errors.InvalidInputError` that does not quote it), never taken for a file name."""
    reject_async(target)
    if isinstance(target, URL):
        url = target
    elif isinstance(target, os.PathLike) or "://" not in str(target):
        text = os.fspath(target)
        if not isinstance(text, str):
            raise InvalidInputError(f"database target must be a path or a URL, not {type(text).__name__}",
                                    field="target")
        if not text:
            raise HostedRoomError("database target must not be empty")
        _refuse_unparsed(text)
        return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))
    else:
        url = parse_url(str(target))
    backend = backend_named(url.get_backend_name())
    if backend is None:
        raise HostedRoomError(
            f"unsupported database dialect {url.get_backend_name()!r} in {describe_target(url)}; "
            "use sqlite or postgresql")
    return _own_driver(backend, backend.normalise_url(url))


#: libpq's connection keywords (a keyword DSN names at least one of them).
_LIBPQ_KEYWORDS = frozenset({
    "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "require_auth", "channel_binding",
    "connect_timeout", "client_encoding", "options", "application_name", "fallback_application_name",
    "keepalives", "sslmode", "sslcert", "sslkey", "sslpassword", "sslrootcert", "sslcrl", "service",
    "target_session_attrs", "load_balance_hosts", "gssencmode", "krbsrvname", "requiressl", "sslnegotiation"})
_KEYWORD_PAIR = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(?:'(?:[^'\\]|\\.)*'|[^\s']*)\s*")
#: A database URL scheme written without ``//`` (``postgresql:u:pw@h/db``, ``sqlite:state.db``).
_SCHEME_WITHOUT_SLASHES = re.compile(
    r"(?i)(?:postgres|postgresql|sqlite|mysql|mariadb|oracle|mssql|cockroachdb|http|https)(?:\+[\w.-]+)?:")
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+._-]*")
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def is_keyword_dsn(text: str) -> bool:
    """Whether ``text`` is a libpq keyword DSN: only ``key=value`` pairs, at least one a libpq keyword."""
    position, keys = 0, set()
    while position < len(text):
        match = _KEYWORD_PAIR.match(text, position)
        if match is None or match.end() == position:
            return False
        keys.add(match.group(1).lower())
        position = match.end()
    return bool(keys & _LIBPQ_KEYWORDS)


def looks_like_target(text: str) -> bool:
    """Whether ``text`` looks like a database URL or a libpq keyword DSN (a file name argument that does may be
    a misplaced URL, with its password)."""
    return "://" in text or is_keyword_dsn(text) or _SCHEME_WITHOUT_SLASHES.match(text) is not None


def _refuse_unparsed(text: str) -> None:
    """Refuse a target that is neither a path nor a URL hostedrooms reads, without quoting it (it may hold a
    password)."""
    if is_keyword_dsn(text):
        raise InvalidInputError(
            "a libpq keyword DSN (host=... dbname=... password=...) is not a hostedrooms target: give a URL, "
            "postgresql://USER:PASSWORD@HOST:PORT/DBNAME (percent-encode reserved characters of the password)",
            field="target")
    if _SCHEME_WITHOUT_SLASHES.match(text):
        raise InvalidInputError(
            "the database target looks like a URL without '//' after its scheme: write scheme://..., or give a "
            "path that does not start with a URL scheme", field="target")


def parse_url(text: str) -> URL:
    """A database URL string as libpq reads it, to a SQLAlchemy URL.

    ``scheme://[user[:password]@][host[:port][,host[:port]...]][/dbname][?key=value&...]``: the user info ends
    at the LAST ``@`` before the host part (which ends at the first ``/`` or ``?`` after it), so a password may
    hold a raw ``@``, ``:`` or ``#``; the user and password are then percent-decoded (``%40`` is ``@``). A raw
    ``/``, ``?`` or ``%`` in a password cannot be told from the URL's own delimiters: a ``%`` not followed by
    two hex digits is refused, and so is an ``@`` after the host part (a password holding ``/`` or ``?``, or an
    ``@`` in the database name), each with a message that masks the password. Several hosts
    (``h1:p1,h2:p2``) become libpq's ``?host=h1:p1,h2:p2``. Any refusal is an
    :class:`~hostedrooms.errors.InvalidInputError` quoting the URL through
    :func:`~hostedrooms.errors.describe_target`.
    """
    scheme, _, rest = text.partition("://")
    if not _URL_SCHEME.fullmatch(scheme):
        raise InvalidInputError(f"malformed database URL: {describe_target(text)}", field="target")
    delimiters = [index for index in (rest.find("/"), rest.find("?")) if index >= 0]
    at = rest.rfind("@", 0, min(delimiters, default=len(rest)))
    host_start = at + 1
    host_end = min([index for index in (rest.find("/", host_start), rest.find("?", host_start)) if index >= 0],
                   default=len(rest))
    if host_end > 0 and "@" in rest[host_end:]:
        raise InvalidInputError(
            f"ambiguous database URL {describe_target(text)}: an '@' follows the host part; percent-encode it "
            "(%40), and in a password also '/' (%2F), '?' (%3F) and '%' (%25)", field="target")
    userinfo, hostport, tail = rest[:max(at, 0)], rest[host_start:host_end], rest[host_end:]
    if _PERCENT.search(userinfo):
        raise InvalidInputError(
            f"malformed database URL {describe_target(text)}: a '%' in the user or password must be "
            "percent-encoded (%25)", field="target")
    hosts = hostport.split(",") if "," in hostport else None
    try:
        url = make_url(f"{scheme}://{'' if hosts else hostport}{tail}")
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise InvalidInputError(f"malformed database URL: {describe_target(text)}", field="target") from exc
    if hosts:
        url = url.update_query_dict({"host": ",".join(hosts)})
    if at < 0:
        return url
    user, has_password, password = userinfo.partition(":")
    return url.set(username=unquote(user) or None, password=unquote(password) if has_password else None)


def _own_driver(backend: Backend, url: URL) -> URL:
    """``url`` if it names hostedrooms' driver for its backend or the asyncio one (psycopg; pysqlite, aiosqlite);
    any other driver is refused, never swapped silently (``postgresql+asyncpg://`` ran on psycopg)."""
    own = backend.normalise_url(url.set(drivername=url.get_backend_name()))
    if url.get_driver_name() in (own.get_driver_name(), backend.async_driver):
        return url
    raise StoreConfigurationError(
        f"hosted room store {describe_target(url)} names the driver {url.get_driver_name()!r}, which hostedrooms "
        f"does not use: give {describe_target(own)} (hostedrooms.aio runs it with {backend.async_driver})")


def create_engine(
    target: Target,
    *,
    synchronous: str = "FULL",
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    create: bool = True,
    schema: str | None = None,
    pooler: str | None = None,
    listen_url: str | URL | None = None,
    held_connections: int | None = None,
    **engine_kwargs: Any,
) -> Engine:
    """Build (or adopt) an Engine configured for hostedrooms.

    Secrets stay out of logs and errors on every engine built or adopted here: bound parameters are hidden and
    fetched rows are never logged, whatever the echo flag or logging level (statements still are, at INFO).

    :param target: a SQLite file path, a database URL (text or :class:`~sqlalchemy.engine.URL`), or an Engine to
        adopt (configured in place).
    :param synchronous: SQLite only: ``FULL`` (the default) makes every commit durable; ``NORMAL`` is an explicit
        opt-in that may lose the last commits on power loss (never on a process crash).
    :param busy_timeout: seconds a statement waits for another writer's lock before it fails.
    :param create: SQLite: whether a missing file (and its folder) is created; with False, a missing file raises
        :class:`~hostedrooms.errors.StoreMissingError`. A server never creates a database, so PostgreSQL ignores it.
    :param schema: PostgreSQL: this gateway's namespace in a shared database. Every connection's ``search_path`` is
        that schema alone (checked), and its tables, version table, advisory locks and wake-up channels are its
        own; a missing one raises :class:`~hostedrooms.errors.SchemaMissingError` naming ``hostedrooms upgrade
        --schema NAME``, which creates it.
    :param pooler: PostgreSQL: what stands between the engine and the server. None or ``"session"``: nothing
        changes. ``"transaction"`` (PgBouncer's ``pool_mode = transaction``): nothing is prepared on the server,
        no session state is kept, and ``schema=`` is refused (give each gateway a database of its own).
    :param listen_url: a direct connection to the same database, bypassing the pooler, for the engine's one
        waiting connection (``LISTEN`` through a transaction pooler is lost); without it, with
        ``pooler="transaction"``, ``follow()`` and ledger wake-ups raise StoreConfigurationError.
    :param held_connections: PostgreSQL (psycopg): how many autocommit connections the engine may hold, one per
        thread that appends, for the single append's first attempt (:mod:`hostedrooms.held_autocommit`), beside its
        pool (with ``pooler="transaction"``: client connections to the pooler). None (the default): as many as
        ``pool_size``; 0: none (every append takes the pool, one more round trip each: for a tight connection
        budget). Other backends hold none.
    :param engine_kwargs: passed to :func:`sqlalchemy.create_engine` (a path or URL only).
    :returns: the Engine every hostedrooms call takes.
    :raises MisuseError: ``target`` is an async engine, or ``synchronous`` is no SQLite mode.
    :raises InvalidInputError: ``busy_timeout``, ``create`` or ``held_connections`` is invalid.
    :raises StoreConfigurationError: ``schema=`` on SQLite, an engine with a ``schema_translate_map``, an invalid
        ``schema``, ``pooler`` or ``listen_url``, or a target that cannot be understood.
    :raises StoreMissingError: ``create=False`` and the SQLite file does not exist.
    """
    reject_async(target)
    check_synchronous(synchronous)
    check_engine_options(busy_timeout, create, schema)
    check_held_connections(held_connections)
    if isinstance(target, Engine):
        return _adopt_engine(target, synchronous=synchronous, busy_timeout=busy_timeout, schema=schema,
                             pooler=pooler, listen_url=listen_url)
    return build_configured(resolve_url(target), sa_create_engine, synchronous=synchronous,
                            busy_timeout=busy_timeout, create=create, schema=schema, pooler=pooler,
                            listen_url=listen_url, held_connections=held_connections, **engine_kwargs)


def check_held_connections(held_connections: object) -> None:
    """Refuse a ``held_connections`` that is not None or a count from 0."""
    if held_connections is not None and (isinstance(held_connections, bool) or not isinstance(held_connections, int)
                                         or held_connections < 0):
        raise InvalidInputError("held_connections must be None or a number of connections from 0",
                                field="held_connections")


def check_pooler(backend: Backend, url: URL, schema: str | None, pooler: object,
                 listen_url: object) -> Pooler | None:
    """What ``pooler=`` and ``listen_url=`` ask for (None: neither given); a StoreConfigurationError for a value
    hostedrooms does not offer, a backend without poolers, or ``schema=`` under transaction pooling."""
    if pooler is None and listen_url is None:
        return None
    if pooler not in POOLERS:
        raise StoreConfigurationError(
            f"pooler must be None, 'session' or 'transaction'; got {pooler!r}")
    if not backend.has_poolers:
        raise StoreConfigurationError(
            f"pooler= and listen_url= apply to PostgreSQL; {describe_target(url)} is a {backend.name} database")
    if pooler == "transaction" and schema is not None:
        raise StoreConfigurationError(
            f"schema={schema!r} cannot be kept through a transaction pooler (a search_path is session state, and "
            "each transaction may run on another server connection): give each gateway a database of its own, "
            "or use session pooling")
    listen = None
    if listen_url is not None:
        if not isinstance(listen_url, str | URL):
            raise StoreConfigurationError(f"listen_url must be a PostgreSQL URL, not {type(listen_url).__name__}")
        listen = resolve_url(listen_url)
        if listen.get_backend_name() != url.get_backend_name():
            raise StoreConfigurationError(
                f"listen_url {describe_target(listen)} must name the same {backend.name} database as "
                f"{describe_target(url)}, directly")
        listen = backend.normalise_url(listen.set(drivername=listen.get_backend_name()))  # the waiter is synchronous
    return Pooler(pooler if isinstance(pooler, str) else None, listen)


def check_schema(backend: Backend, schema: object, url: URL) -> None:
    """Refuse ``schema=`` where the backend has no schemas, or a name hostedrooms does not accept."""
    if not backend.has_schemas:
        raise StoreConfigurationError(
            f"schema={schema!r} needs a database server with schemas (PostgreSQL); {describe_target(url)} is a "
            f"{backend.name} database, which has none")
    check_schema_name(schema)


def engine_schema(engine: Engine) -> str | None:
    """The ``schema=`` an engine was built (or adopted) with, or None."""
    profile = profile_of(engine)
    return None if profile is None else profile.schema


def refuse_translate_map(engine: Engine) -> None:
    """Refuse an engine with a ``schema_translate_map``: hostedrooms' compiled statements ignore it, so one
    gateway would read and write in two schemas."""
    if engine.get_execution_options().get("schema_translate_map"):
        raise StoreConfigurationError(
            f"hosted room store {describe_target(engine.url)}: engines with a schema_translate_map are not "
            "supported (hostedrooms' compiled statements would ignore it); pass schema=NAME to "
            "hostedrooms.create_engine instead")


def check_synchronous(synchronous: str) -> None:
    """Refuse a SQLite ``synchronous`` mode hostedrooms does not offer."""
    if not isinstance(synchronous, str) or synchronous not in SYNCHRONOUS_MODES:
        raise MisuseError(f"synchronous must be one of {', '.join(sorted(SYNCHRONOUS_MODES))}")


def check_engine_options(busy_timeout: object, create: object, schema: object) -> None:
    """Refuse ``busy_timeout``, ``create`` or ``schema`` of the wrong type or range (before anything opens)."""
    if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or not (
            math.isfinite(busy_timeout) and 0 <= busy_timeout <= MAX_BUSY_TIMEOUT):
        raise InvalidInputError(f"busy_timeout must be a number of seconds from 0 to {MAX_BUSY_TIMEOUT:g}",
                                field="busy_timeout")
    if not isinstance(create, bool):
        raise InvalidInputError("create must be True or False", field="create")
    if schema is not None and not isinstance(schema, str):
        raise StoreConfigurationError(f"schema must be None or a schema name, not {type(schema).__name__}")


def build_configured(
    url: URL, factory: Callable[..., _E], *, synchronous: str, busy_timeout: float, create: bool,
    schema: str | None = None, pooler: str | None = None, listen_url: str | URL | None = None,
    held_connections: int | None = None, **engine_kwargs: Any,
) -> _E:
    """``factory(url, ...)`` (SQLAlchemy's ``create_engine`` or ``create_async_engine``) with the backend's
    defaults, its connection hooks and secrets kept out of logs; installed on the synchronous Engine (an
    AsyncEngine's ``sync_engine``), where SQLAlchemy runs them for both."""
    backend = backend_for_url(url)
    if schema is not None:
        check_schema(backend, schema, url)
    pooled = check_pooler(backend, url, schema, pooler, listen_url)
    try:
        built = backend.build_with(factory, url, create=create, **engine_kwargs)
    except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as exc:
        raise HostedRoomError(f"cannot use database {describe_target(url)}: {exc}") from exc
    engine = cast(Engine, getattr(built, "sync_engine", built))
    refuse_translate_map(engine)
    install(engine, EngineProfile(backend, synchronous, busy_timeout, schema, pooled))
    # PostgreSQL's one-statement append on a connection held per thread, where it can.
    held_autocommit.allow(engine, held_connections)
    return built


def _adopt_engine(engine: Engine, *, synchronous: str, busy_timeout: float, schema: str | None = None,
                  pooler: str | None = None, listen_url: str | URL | None = None) -> Engine:
    """Use a caller's Engine as given, installing our connection hooks once if it lacks them."""
    if configure_adopted(engine, synchronous=synchronous, busy_timeout=busy_timeout, schema=schema, pooler=pooler,
                         listen_url=listen_url):
        engine.pool.dispose()  # pooled connections predate the hooks
    return engine


def configure_adopted(engine: Engine, *, synchronous: str, busy_timeout: float, schema: str | None = None,
                      pooler: str | None = None, listen_url: str | URL | None = None) -> bool:
    """Install our connection hooks on a caller's Engine (an AsyncEngine's ``sync_engine``) unless it has them;
    whether it had to (the caller then disposes the pool: its connections predate the hooks). ``schema``: as
    for :func:`create_engine`; an engine already configured must have been given the same one."""
    backend = backend_named(engine.dialect.name)
    if backend is None:
        raise HostedRoomError(
            f"unsupported database dialect {engine.dialect.name!r} in {describe_target(engine.url)}")
    refuse_translate_map(engine)
    profile = profile_of(engine)
    built_schema = None if profile is None else profile.schema
    pooled = check_pooler(backend, engine.url, schema if schema is not None else built_schema, pooler, listen_url)
    if profile is not None:
        if schema is not None and built_schema != schema:
            raise StoreConfigurationError(
                f"this engine of {describe_target(engine.url)} was built with schema={built_schema!r}; "
                f"build another one for schema={schema!r}")
        if pooled is not None and profile.pooler != pooled:
            raise StoreConfigurationError(
                f"this engine of {describe_target(engine.url)} was built with another pooler= or listen_url=; "
                "build another one")
        return False
    if schema is not None:
        check_schema(backend, schema, engine.url)
    install(engine, EngineProfile(backend, synchronous, busy_timeout, schema, pooled))
    return True


def sqlite_path(engine: Engine) -> Path | None:
    """The file behind a SQLite engine, or None (PostgreSQL, in-memory)."""
    reject_async(engine)
    backend = backend_named(engine.dialect.name)
    return None if backend is None else backend.file_path(engine.url)
