"""Every bad argument of the public API raises a documented error, and changes nothing (issue 34, item 10).

The public callables are enumerated from the public modules (``__all__`` of rooms, replicas, peers, status,
standby, engines, and the named functions of integrity, migrate, db and the ledger's ``DeliveryLedger``), the
synchronous ones and their :mod:`hostedrooms.aio` coroutines. Each keyword argument in turn gets
hypothesis-generated values of the wrong type or range (None, bools, floats, huge and negative ints, strings,
bytes, lists, dicts, objects), the others a plausible value: the call must succeed or raise a
:class:`~hostedrooms.errors.HostedRoomError` subclass (never a raw ``TypeError``, ``AttributeError``,
``ValueError``, ``KeyError`` or a driver error), and when it raised, the store's row counts are unchanged.

The default run is small (a few examples per argument, one migrated SQLite store reused; the families that
write also on PostgreSQL, with fewer); ``-m slow`` runs many more.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from hostedrooms import (
    HostedRoomError,
    InvalidInputError,
    integrity,
    migrate,
    models,
    peers,
    replicas,
    rooms,
    standby,
    status,
)
from hostedrooms.db import create_engine, sqlite_path
from hostedrooms.engines import resolve_engine
from hostedrooms.ledger import DeliveryLedger

GATEWAY = "install:gw-a"

#: Wrong types and ranges, as hypothesis draws them.
BAD_VALUES = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**63, 2**64 + 1, -1, -(2**63) - 1, 0, 10**30]), st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=8), st.sampled_from(["", " ", "\x00", "x" * 10_000, "postgresql://u:pw@h/db"]),
    st.binary(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                                  max_size=2),
    st.just(object()), st.just(math.nan), st.just(float("inf")), st.just([None]), st.just({"kind": None}),
)

#: Plausible values by argument name (the others under test stay valid enough to reach the one that is not).
PLAUSIBLE: dict[str, Any] = {
    "room_id": "r-1", "gateway_id": GATEWAY, "local_gateway_id": GATEWAY, "from_gateway": "install:gw-b",
    "name": "room", "new_name": "room 2", "event_id": "e-1", "kind": "message", "actor": {"kind": "user", "id": "u1"},
    "payload": {"text": "hi"}, "since_seq": 0, "limit": 10, "now": 1_700_000_000.0, "epoch": 1, "members": [],
    "idempotency_key": "k-1", "reason": "test", "max_links": 8, "events": [], "revision": "head",
    "authority_gateway_id": GATEWAY, "expected_gateway_id": GATEWAY, "new_gateway_id": "install:gw-b",
    "expected_epoch": 1, "authority_epoch": 1, "observed_gateway_id": GATEWAY, "observed_epoch": 1,
}


def _plausible(parameter: inspect.Parameter) -> Any:
    return PLAUSIBLE.get(parameter.name, "x")


def _public_functions() -> dict[str, Callable[..., Any]]:
    """The public functions taking a store, by qualified name (follow() is a generator: covered elsewhere)."""
    found: dict[str, Callable[..., Any]] = {}
    for module in (rooms, replicas, peers, status, standby):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isfunction(value) and not name.startswith("validate_") and name not in (
                    "decode_rows", "event_to_dict", "room_to_dict", "payload_json", "system_actor_json",
                    "user_event_id", "room_stop_event", "max_event_bytes", "event_page_checker", "run_room_write",
                    "room_grant_scope_key", "forget_probe_engines", "answer", "iter_rooms", "open_source",
                    "perfdata", "assess"):
                found[f"{module.__name__}.{name}"] = value
    found["hostedrooms.integrity.verify"] = integrity.verify
    for name in ("upgrade", "current_revision", "is_at_head"):
        found[f"hostedrooms.migrate.{name}"] = getattr(migrate, name)
    return found


FUNCTIONS = _public_functions()
#: Constructors and factories whose every keyword argument is checked too (no store written).
CONSTRUCTORS: dict[str, Callable[..., Any]] = {
    "DeliveryLedger": lambda engine, **kw: _closed_ledger(DeliveryLedger(
        engine, **{**kw, "path": _confined(kw["path"])} if "path" in kw else kw)),
    "Replicator": lambda engine, **kw: standby.Replicator(
        standby.EnginePageSource(engine), engine, **{"local_gateway_id": GATEWAY, **kw}),
    "EnginePageSource": standby.EnginePageSource, "create_engine": create_engine,
    "create_engine_url": lambda engine, **kw: _disposed(create_engine(str(sqlite_path(engine)), **kw)),
    "HttpPageSource": lambda engine, **kw: standby.HttpPageSource(kw.pop("base_url", "http://127.0.0.1:1/"), **kw),
    "PageServer": lambda engine, **kw: _closed(standby.PageServer(
        kw.pop("source", standby.EnginePageSource(engine)), **kw)),
    "resolve_engine": resolve_engine,
}


def _confined(path: Any) -> Any:
    """A drawn ``path=`` kept inside the working folder (a temporary one): no "/" and no "..", NULs kept."""
    return path.replace("/", "_").replace("..", "__") if isinstance(path, str) else path


def _closed_ledger(ledger: DeliveryLedger) -> None:
    ledger.close()


def _disposed(engine: Engine) -> None:
    engine.dispose()


def _closed(server: Any) -> None:
    server.server_close()


#: The signature each constructor case follows (a lambda stands in for it).
SIGNATURES: dict[str, Callable[..., Any]] = {
    "Replicator": standby.Replicator, "create_engine_url": create_engine, "HttpPageSource": standby.HttpPageSource,
    "PageServer": standby.PageServer, "DeliveryLedger": DeliveryLedger,
}


def _keywords(function: Callable[..., Any]) -> list[inspect.Parameter]:
    signature = inspect.signature(function)
    return [parameter for parameter in list(signature.parameters.values())[1:]
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)]


def _fingerprint(engine: Engine) -> tuple[int, ...]:
    with engine.connect() as connection:
        return tuple(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                     for table in models.metadata.sorted_tables)


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files a call creates from a drawn relative path (a ledger's ``path=``) land in a temporary folder."""
    monkeypatch.chdir(tmp_path)


def _call(function: Callable[..., Any], target: Any, keyword: str, value: Any) -> Any:
    arguments = {parameter.name: _plausible(parameter) for parameter in _keywords(function)
                 if parameter.default is inspect.Parameter.empty}
    arguments[keyword] = value
    return function(target, **arguments)


#: Tried for every argument on every run, before hypothesis draws more.
CANONICAL = [None, True, 1.5, math.nan, -1, 2**64, "", "x", b"x", [], {}, object()]


def check_call(function: Callable[..., Any], engine: Engine, keyword: str, value: Any) -> None:
    before = _fingerprint(engine)
    try:
        result = _call(function, engine, keyword, value)
        if inspect.isgenerator(result):
            result.close()
        close = getattr(result, "close", None)
        if callable(close) and not isinstance(result, Engine):
            close()
    except HostedRoomError:
        assert _fingerprint(engine) == before, (function, keyword, value)
    except Exception as exc:
        raise AssertionError(f"{getattr(function, '__qualname__', function)}({keyword}={value!r:.80}) raised "
                             f"{type(exc).__name__}: {exc}") from exc


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One migrated SQLite store, reused: each call that raised must have left it as it was."""
    path = tmp_path_factory.mktemp("bad-arguments") / "state.db"
    migrate.upgrade(str(path))
    engine = create_engine(str(path))
    rooms.create_room(engine, room_id="r-1", name="room", members=[], authority_gateway_id=GATEWAY,
                      now=1_700_000_000.0)
    try:
        yield engine
    finally:
        engine.dispose()


def test_the_examples_of_the_issue(store: Engine) -> None:
    with pytest.raises(InvalidInputError) as caught:
        integrity.verify(store, expect_heads=5)  # type: ignore[arg-type]
    assert caught.value.field == "expect_heads"
    with pytest.raises(HostedRoomError, match="must be a string"):
        standby.HttpPageSource(1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError) as caught:
        rooms.list_rooms(store, limits=object())  # type: ignore[arg-type]
    assert caught.value.field == "limits"
    with pytest.raises(InvalidInputError) as caught:
        migrate.upgrade(store, "no-such-revision")
    assert caught.value.field == "revision"


CASES = [(name, parameter.name) for name, function in sorted(FUNCTIONS.items())
         for parameter in _keywords(function)]


@pytest.mark.parametrize(("name", "keyword"), CASES, ids=[f"{n.rsplit('.', 1)[1]}-{k}" for n, k in CASES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=BAD_VALUES)
def test_every_bad_keyword_raises_a_documented_error(store: Engine, name: str, keyword: str, value: Any) -> None:
    check_call(FUNCTIONS[name], store, keyword, value)


@pytest.mark.parametrize(("name", "keyword"), CASES, ids=[f"{n.rsplit('.', 1)[1]}-{k}" for n, k in CASES])
def test_the_canonical_bad_values(store: Engine, name: str, keyword: str) -> None:
    for value in CANONICAL:
        check_call(FUNCTIONS[name], store, keyword, value)


def _all_parameters(function: Callable[..., Any]) -> list[str]:
    return [parameter.name for parameter in inspect.signature(function).parameters.values()
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)]


CONSTRUCTOR_CASES = [
    (name, keyword) for name in sorted(CONSTRUCTORS)
    for keyword in (_all_parameters(SIGNATURES[name]) if name in SIGNATURES
                    else _all_parameters(CONSTRUCTORS[name])[1:])
    if keyword not in ("engine_kwargs", "target", "engine", "self") and not (name == "Replicator" and keyword in (
        "source", "local_gateway_id"))]


@pytest.mark.parametrize(("name", "keyword"), CONSTRUCTOR_CASES, ids=[f"{n}-{k}" for n, k in CONSTRUCTOR_CASES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=BAD_VALUES)
def test_every_bad_constructor_argument_raises_a_documented_error(
    store: Engine, name: str, keyword: str, value: Any
) -> None:
    check_call(CONSTRUCTORS[name], store, keyword, value)


@pytest.mark.parametrize(("name", "keyword"), CONSTRUCTOR_CASES, ids=[f"{n}-{k}" for n, k in CONSTRUCTOR_CASES])
def test_the_canonical_bad_constructor_values(store: Engine, name: str, keyword: str) -> None:
    # a NUL and an over-long name: what the random run once found for a ledger's path
    for value in [*CANONICAL, "\x00", "a\x00b", "x" * 10_000]:
        check_call(CONSTRUCTORS[name], store, keyword, value)


# --- the delivery ledger's methods ------------------------------------------------------------------------------

LEDGER_METHODS = {name: function for name, function in inspect.getmembers(DeliveryLedger, inspect.isfunction)
                  if not name.startswith("_") and name != "close"}
LEDGER_CASES = [(name, parameter.name) for name, function in sorted(LEDGER_METHODS.items())
                for parameter in _keywords(function)]


@pytest.fixture(scope="module")
def ledger(store: Engine) -> Iterator[DeliveryLedger]:
    opened = DeliveryLedger(store, clock=lambda: 1_700_000_000)
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize(("name", "keyword"), LEDGER_CASES, ids=[f"ledger-{n}-{k}" for n, k in LEDGER_CASES])
def test_the_ledger_methods_raise_documented_errors(
    store: Engine, ledger: DeliveryLedger, name: str, keyword: str
) -> None:
    for value in CANONICAL:
        before = _fingerprint(store)
        try:
            result = _call(LEDGER_METHODS[name], ledger, keyword, value)
            close = getattr(result, "close", None)
            if callable(close):
                close()
        except HostedRoomError:
            assert _fingerprint(store) == before, (name, keyword, value)
        except Exception as exc:
            raise AssertionError(f"DeliveryLedger.{name}({keyword}={value!r:.80}) raised {type(exc).__name__}: "
                                 f"{exc}") from exc


# --- hostedrooms.aio: the same coroutines, the same errors -------------------------------------------------------

AIO_CASES = [(name, keyword) for name, keyword in CASES
             if name.split(".")[1] in ("rooms", "replicas", "peers") or name.endswith("integrity.verify")]


def _coroutine(name: str) -> Callable[..., Any]:
    import hostedrooms.aio as aio

    module, function = name.split(".")[1:]
    return getattr(aio, function) if module == "integrity" else getattr(getattr(aio, module), function)


@pytest.mark.parametrize(("name", "keyword"), AIO_CASES, ids=[f"aio-{n.rsplit('.', 1)[1]}-{k}" for n, k in AIO_CASES])
def test_the_asyncio_api_raises_the_same_documented_errors(store: Engine, name: str, keyword: str) -> None:
    pytest.importorskip("aiosqlite")
    from hostedrooms.aio import create_async_engine

    coroutine = _coroutine(name)
    signature_of = FUNCTIONS[name]

    async def run() -> None:
        engine = create_async_engine(str(sqlite_path(store)))
        try:
            for value in CANONICAL:
                before = _fingerprint(store)
                arguments = {parameter.name: _plausible(parameter) for parameter in _keywords(signature_of)
                             if parameter.default is inspect.Parameter.empty}
                arguments[keyword] = value
                try:
                    result = coroutine(engine, **arguments)
                    if inspect.isawaitable(result):
                        result = await result
                    if inspect.isasyncgen(result):
                        await result.aclose()
                except HostedRoomError:
                    assert _fingerprint(store) == before, (name, keyword, value)
                except Exception as exc:
                    raise AssertionError(f"aio {name}({keyword}={value!r:.80}) raised {type(exc).__name__}: "
                                         f"{exc}") from exc
        finally:
            await engine.dispose()

    asyncio.run(run())


# --- PostgreSQL: the families that write ------------------------------------------------------------------------

WRITE_CASES = [(name, keyword) for name, keyword in CASES if name.rsplit(".", 1)[1] in (
    "append_event", "append_events", "create_room", "claim_authority", "disband_room", "rename_room",
    "request_room_stop", "ingest_page", "promote_replica", "demote_room", "upsert_room_link_record",
    "reserve_peer_room", "upsert_remote_run_receipt", "revoke_room_grant_scope", "failover")]


@pytest.fixture(scope="module")
def pg_store(pg_worker_url: str) -> Iterator[Engine]:
    """The worker's PostgreSQL database, emptied, with one room."""
    engine = create_engine(pg_worker_url)
    with engine.begin() as connection:
        names = ", ".join(connection.dialect.identifier_preparer.quote(table.name)
                          for table in models.metadata.sorted_tables)
        connection.exec_driver_sql(f"TRUNCATE {names} CASCADE")
    rooms.create_room(engine, room_id="r-1", name="room", members=[], authority_gateway_id=GATEWAY,
                      now=1_700_000_000.0)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.mark.parametrize(("name", "keyword"), WRITE_CASES,
                         ids=[f"pg-{n.rsplit('.', 1)[1]}-{k}" for n, k in WRITE_CASES])
def test_writes_on_postgresql_raise_documented_errors(pg_store: Engine, name: str, keyword: str) -> None:
    for value in CANONICAL:
        check_call(FUNCTIONS[name], pg_store, keyword, value)


# --- the long run ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("name", "keyword"), CASES, ids=[f"slow-{n.rsplit('.', 1)[1]}-{k}" for n, k in CASES])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=BAD_VALUES)
def test_many_bad_values(store: Engine, name: str, keyword: str, value: Any) -> None:
    check_call(FUNCTIONS[name], store, keyword, value)
