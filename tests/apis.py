"""The two public APIs behind one set of names, so the contract tests run against both (the ``api`` fixture).

``SYNC`` is the real synchronous modules. An :class:`AsyncApi` exposes the same names as plain callables that run
``hostedrooms.aio``'s coroutine of the same name on the test's event loop, with the AsyncEngine twin of the
Engine the test passed (same database, built by ``hostedrooms.aio.create_async_engine(engine.url)``): a test
written for ``rooms.append_event(engine, ...)`` exercises ``await aio.rooms.append_event(async_engine, ...)``
unchanged. Names the asyncio API does not have (pure helpers, constants, classes) are the synchronous ones.

A test module opts in with ``_api = use_api("rooms", "peers")``: an autouse fixture that rebinds those module
globals to the API of the test's ``api`` parameter (each of its tests then runs once per API).
"""

from __future__ import annotations

import asyncio
import os
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import aio, integrity, migrate, peers, replicas, rooms
from hostedrooms.ledger import DeliveryLedger

SYNC = types.SimpleNamespace(rooms=rooms, peers=peers, replicas=replicas, migrate=migrate,
                             verify=integrity.verify, DeliveryLedger=DeliveryLedger, name="sync")


class AsyncApi:
    """The asyncio API driven from synchronous test code (see the module docstring)."""

    name = "async"

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self._twins: dict[int, tuple[Engine, Any]] = {}
        self.rooms = _Module(self, rooms, aio.rooms)
        self.peers = _Module(self, peers, aio.peers)
        self.replicas = _Module(self, replicas, aio.replicas)
        self.migrate = _Module(self, migrate, aio.migrate)
        self.verify = self.call(aio.verify)

    def twin(self, engine: Any) -> Any:
        """The AsyncEngine of the database ``engine`` points at: an Engine's, or a target's (a path or URL, which
        ``verify`` takes too); anything else is passed on as given, so the asyncio API's own refusal shows."""
        if isinstance(engine, Engine):
            where: Any = engine.url
        elif isinstance(engine, (str, os.PathLike)):
            where = engine
        else:
            return engine
        known = self._twins.get(id(engine))
        if known is None:
            known = self._twins[id(engine)] = (engine, aio.create_async_engine(where))
        return known[1]

    def run(self, coroutine: Any) -> Any:
        return self.runner.run(coroutine)

    def call(self, coroutine_function: Callable[..., Any]) -> Callable[..., Any]:
        def call(engine: Any, *args: Any, **kwargs: Any) -> Any:
            return self.run(coroutine_function(self.twin(engine), *args, **kwargs))

        call.__name__ = getattr(coroutine_function, "__name__", "call")
        return call

    def DeliveryLedger(self, engine: Any, *args: Any, **kwargs: Any) -> _Ledger:
        return _Ledger(self, self.run(aio.open_ledger(self.twin(engine), *args, **kwargs)), engine)

    def follow(self, engine: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """The async iterator (its arguments checked at once, as follow() does), consumed one event per loop run."""
        return self._events(aio.rooms.follow(self.twin(engine), *args, **kwargs))

    def _events(self, iterator: Any) -> Iterator[dict[str, Any]]:
        try:
            while True:
                try:
                    yield self.run(iterator.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self.run(iterator.aclose())  # type: ignore[attr-defined]

    def close(self) -> None:
        for _, twin in self._twins.values():
            self.run(twin.dispose())
        self._twins.clear()
        self.runner.close()


class _Module:
    """A module of the asyncio API seen synchronously; falls back to the synchronous module's names."""

    def __init__(self, api: AsyncApi, sync: types.ModuleType, asynchronous: types.ModuleType) -> None:
        self._api, self._sync, self._async = api, sync, asynchronous

    def __getattr__(self, name: str) -> Any:
        if name == "follow":
            return self._api.follow
        found = getattr(self._async, name, None)
        if found is not None and asyncio.iscoroutinefunction(found):
            return self._api.call(found)
        return getattr(self._sync, name)


class _Ledger:
    """An AsyncDeliveryLedger seen synchronously."""

    def __init__(self, api: AsyncApi, ledger: aio.AsyncDeliveryLedger, engine: Any) -> None:
        self._api, self._ledger, self._engine = api, ledger, engine

    @property
    def engine(self) -> Any:
        """The Engine the test gave (its checks read the tables through it)."""
        return self._engine

    @property
    def file(self) -> Any:
        return self._ledger.file

    def __getattr__(self, name: str) -> Any:
        bound = getattr(self._ledger, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._api.run(bound(*args, **kwargs))

        return call


def use_api(*names: str) -> Any:
    """An autouse fixture for a test module: its globals ``names`` become the ``api`` fixture's."""

    @pytest.fixture(autouse=True)
    def _use_api(api: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in names:
            monkeypatch.setattr(request.module, name, getattr(api, name))

    return _use_api


__all__ = ["SYNC", "AsyncApi", "hostedrooms", "use_api"]
