"""Coroutines derived from the synchronous services, so there is one implementation and signatures cannot drift.

:func:`service` turns ``fn(engine, *args, **kwargs)`` into ``await coroutine(async_engine, *args, **kwargs)``
with the same parameters, result, errors and messages (the typed ParamSpec carries the signature: mypy checks
every async call against the synchronous definition). :class:`method` does the same for the methods of a class
wrapping a synchronous object (the ledger), :func:`threaded` for the probes, which take a database target and
open their own small engine.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from ..db import Target
from .engines import Runner, run_to_end, runner_for, sync_url

__all__ = ["Bound", "method", "retitled", "service", "threaded"]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


def retitled(fn: Callable[..., Any], call: Callable[..., Any], first: str) -> None:
    """``call`` documented as ``fn``: same name and docstring; its signature shows ``first`` as the first type."""
    functools.update_wrapper(call, fn)
    del call.__wrapped__  # type: ignore[attr-defined]  # the signature below is the async one
    signature = inspect.signature(fn)
    parameters = list(signature.parameters.values())
    if parameters:
        parameters[0] = parameters[0].replace(annotation=first)
    call.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]


def service(fn: Callable[Concatenate[Engine, P], R]) -> Callable[Concatenate[AsyncEngine, P], Coroutine[Any, Any, R]]:
    """The coroutine of a synchronous service ``fn(engine, ...)``: ``await it(async_engine, ...)``."""

    async def call(engine: AsyncEngine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        runner = await runner_for(engine)
        return await runner.run(fn, runner.engine, *args, **kwargs)

    retitled(fn, call, "AsyncEngine")
    return call


def threaded(fn: Callable[Concatenate[Target, P], R]) -> Callable[Concatenate[Target | AsyncEngine, P],
                                                                   Coroutine[Any, Any, R]]:
    """The coroutine of a synchronous probe ``fn(target, ...)``, run in a worker thread. An AsyncEngine stands
    for its database (the probe opens its own small synchronous engine there, as it does for any target).
    Cancelled, the probe still ends (its connection checked in) before the CancelledError is raised."""

    async def call(target: Target | AsyncEngine, /, *args: P.args, **kwargs: P.kwargs) -> R:
        where: Target = sync_url(target) if isinstance(target, AsyncEngine) else target
        return await run_to_end(asyncio.to_thread(fn, where, *args, **kwargs))

    retitled(fn, call, "Target | AsyncEngine")
    return call


class Bound(Protocol[S_co]):
    """What :class:`method` needs of its owner: the synchronous object and the runner to call it on."""

    @property
    def sync(self) -> S_co: ...

    @property
    def runner(self) -> Runner: ...


class method(Generic[S, P, R]):
    """A descriptor: ``owner.name(*args)`` awaits ``SyncClass.name(owner.sync, *args)`` on ``owner.runner``.

    Declared in the async class's body as ``prepare = method(DeliveryLedger.prepare)``: the parameters and result
    are those of the synchronous method (mypy sees them), and the docstring is its docstring.
    """

    def __init__(self, fn: Callable[Concatenate[S, P], R]) -> None:
        self._fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...

    @overload
    def __get__(self, instance: Bound[S], owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, instance: Bound[S] | None, owner: type) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if instance is None:
            return self
        fn, target, runner = self._fn, instance.sync, instance.runner

        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            return await runner.run(fn, target, *args, **kwargs)

        functools.update_wrapper(call, fn)
        return call
