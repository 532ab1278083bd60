"""The secure-peer delivery ledger for asyncio: :class:`AsyncDeliveryLedger`, whose every method is the
:class:`~hostedrooms.ledger.DeliveryLedger` method of the same name as a coroutine (same arguments, results,
errors and messages), on an AsyncEngine. Open one with ``await open_ledger(engine, clock=..., ...)`` (the
constructor's checks read the store), and wait for due work with :meth:`AsyncDeliveryLedger.work_wakeup`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from ..ledger import DeliveryLedger
from .derive import method, retitled
from .engines import Runner, runner_for
from .wakeup import AsyncWakeup, ledger_wakeup

__all__ = ["AsyncDeliveryLedger", "open_ledger"]

P = ParamSpec("P")


class AsyncDeliveryLedger:
    """A :class:`~hostedrooms.ledger.DeliveryLedger` for asyncio (build it with :func:`open_ledger`).

    :param ledger: the synchronous ledger each call runs.
    :param runner: the engine's runner that runs it.
    :param engine: the AsyncEngine.
    """

    def __init__(self, ledger: DeliveryLedger, runner: Runner, engine: AsyncEngine) -> None:
        self._sync, self._runner, self.engine = ledger, runner, engine

    @property
    def sync(self) -> DeliveryLedger:
        """The synchronous ledger each call runs (on :attr:`runner`)."""
        return self._sync

    @property
    def runner(self) -> Runner:
        return self._runner

    @property
    def file(self) -> Any:
        """The guarded SQLite file (None on PostgreSQL)."""
        return self._sync.file

    def work_wakeup(
        self, *, poll_interval: float | None = None, reconnect_deadline: float | None = None
    ) -> AsyncWakeup:
        """An async context manager whose ``await wait(timeout)`` returns once a ledger transition made work due
        (a delivery authorised or queued, a response or outbound intent prepared) or ``timeout`` passed; enter it
        before reading the queues, so no wake-up is missed between the read and the wait; ``reconnect_deadline`` as
        the synchronous ``work_wakeup``.

        :param poll_interval: SQLite: how often to look for a commit, in seconds (default: the waiter's).
        :param reconnect_deadline: how long ``wait`` may go without a waiting connection, in seconds.
        :returns: the wake-up, to use as an async context manager.
        """
        return ledger_wakeup(self.engine, poll_interval=poll_interval, reconnect_deadline=reconnect_deadline)

    prepare = method(DeliveryLedger.prepare)
    get = method(DeliveryLedger.get)
    authorize = method(DeliveryLedger.authorize)
    fail_ownerless_authorized = method(DeliveryLedger.fail_ownerless_authorized)
    bind_owner = method(DeliveryLedger.bind_owner)
    defer_admission = method(DeliveryLedger.defer_admission)
    pending_admissions = method(DeliveryLedger.pending_admissions)
    nonterminal_for_chat = method(DeliveryLedger.nonterminal_for_chat)
    finish = method(DeliveryLedger.finish)
    recoverable = method(DeliveryLedger.recoverable)
    for_run = method(DeliveryLedger.for_run)
    nonterminal_for_connection = method(DeliveryLedger.nonterminal_for_connection)
    prepare_response = method(DeliveryLedger.prepare_response)
    mark_response_committed = method(DeliveryLedger.mark_response_committed)
    clear_response_intent = method(DeliveryLedger.clear_response_intent)
    defer_response = method(DeliveryLedger.defer_response)
    pending_responses = method(DeliveryLedger.pending_responses)
    prepare_outbound = method(DeliveryLedger.prepare_outbound)
    pending_outbound_for_chat = method(DeliveryLedger.pending_outbound_for_chat)
    pending_outbound_for_route = method(DeliveryLedger.pending_outbound_for_route)
    pending_outbound_for_connection = method(DeliveryLedger.pending_outbound_for_connection)
    outbound = method(DeliveryLedger.outbound)
    commit_outbound = method(DeliveryLedger.commit_outbound)
    defer_outbound = method(DeliveryLedger.defer_outbound)
    fail_outbound = method(DeliveryLedger.fail_outbound)
    pending_outbound = method(DeliveryLedger.pending_outbound)
    recoverable_outbound = method(DeliveryLedger.recoverable_outbound)
    prune = method(DeliveryLedger.prune)
    backlog = method(DeliveryLedger.backlog)
    close = method(DeliveryLedger.close)


_OPEN_DOC = """:class:`~hostedrooms.ledger.DeliveryLedger`'s constructor for asyncio: the same arguments and checks
(the ledger file's guard, crash-safe commits), run without blocking the loop; returns an AsyncDeliveryLedger."""


def _opener(
    build: Callable[Concatenate[Engine, P], DeliveryLedger],
) -> Callable[Concatenate[AsyncEngine, P], Coroutine[Any, Any, AsyncDeliveryLedger]]:
    async def open_ledger(engine: AsyncEngine, /, *args: P.args, **kwargs: P.kwargs) -> AsyncDeliveryLedger:
        runner = await runner_for(engine)
        ledger = await runner.run(build, runner.engine, *args, **kwargs)
        return AsyncDeliveryLedger(ledger, runner, engine)

    retitled(build, open_ledger, "AsyncEngine")
    open_ledger.__name__ = open_ledger.__qualname__ = "open_ledger"
    open_ledger.__doc__ = _OPEN_DOC
    signature = inspect.signature(open_ledger)
    open_ledger.__signature__ = signature.replace(return_annotation="AsyncDeliveryLedger")  # type: ignore[attr-defined]
    return open_ledger


open_ledger = _opener(DeliveryLedger)
"""``await open_ledger(engine, clock=..., path=..., limits=...)``: :class:`~hostedrooms.ledger.DeliveryLedger`'s
constructor for asyncio (the same arguments and checks), returning an :class:`AsyncDeliveryLedger`."""
