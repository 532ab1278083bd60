"""Retrying a call that failed for a transient reason, with jittered exponential back-off.

:class:`~hostedrooms.errors.StoreUnavailableError` means the database could not be reached, stayed locked, is
restarting or aborted the transaction to resolve a conflict: nothing was committed and the same call may succeed
later. Every public call is one transaction, so running it again is safe (appends and claims are idempotent by
their ids). :func:`retry` runs a call again after such an error, waiting between attempts:

    from hostedrooms import retry, rooms

    event = retry.retry(lambda: rooms.append_event(engine, room_id="r", event_id="e-1", kind="message.user",
                                                   actor=actor, payload={}), attempts=5, base=0.1, cap=5.0)

The waits come from :class:`JitteredBackoff`: attempt ``n``'s ceiling is ``min(cap, base * 2 ** (n - 1))``, and
with ``jitter="full"`` (the default, the "full jitter" of AWS's architecture blog, "Exponential Backoff And
Jitter") each wait is drawn uniformly from ``[0, ceiling)``, so clients that failed together do not come back
together. ``jitter="equal"`` draws from ``[ceiling / 2, ceiling)`` (a loop that must not spin keeps half the
wait); ``jitter="none"`` waits the ceiling. The clock (``sleep``) and the randomness (``random``, a function
returning a float in ``[0, 1)``) are injected, so a test runs it without waiting.

Any other error passes through at once (a bad argument, a conflict, a full room: retrying cannot help). After
the last attempt the last error is raised as it was. Bad arguments raise :class:`RetryArgumentError` (an
:class:`~hostedrooms.errors.InvalidInputError`) before the call is made once.

The standby's ``Replicator.run`` waits this way after a failed pass (equal jitter), and the shared waiter of
``follow()`` between reconnections (:mod:`hostedrooms.wakeup`).
"""

from __future__ import annotations

import math
import random as _random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from .errors import InvalidInputError, StoreUnavailableError

__all__ = ["JITTERS", "Jitter", "JitteredBackoff", "RetryArgumentError", "retry"]

T = TypeVar("T")
#: How a wait is drawn below its ceiling: ``full`` from [0, ceiling), ``equal`` from [ceiling/2, ceiling),
#: ``none``: the ceiling itself.
Jitter = Literal["full", "equal", "none"]
JITTERS: tuple[str, ...] = ("full", "equal", "none")
#: The most attempts :func:`retry` takes (a call retried forever is a loop, not a retry).
MAX_ATTEMPTS = 1000
# 2 ** 62 times any positive base is past every cap a float can hold usefully; the exponent stops growing there.
_MAX_DOUBLINGS = 62


class RetryArgumentError(InvalidInputError):
    """An argument of :func:`retry` or :class:`JitteredBackoff` is invalid (``field`` names it); the call was not
    made."""


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise RetryArgumentError(f"{name} must be a finite number of seconds, 0 or more", field=name)
    return float(value)


def _callable(value: object, name: str) -> None:
    if not callable(value):
        raise RetryArgumentError(f"{name} must be callable", field=name)


@dataclass(frozen=True, slots=True)
class JitteredBackoff:
    """The waits of exponential back-off with jitter: :meth:`delay` of attempt ``n`` (1 for the wait after the
    first failure) is drawn below ``min(cap, base * 2 ** (n - 1))`` as ``jitter`` says (see the module
    docstring); iterating gives the waits of attempts 1, 2, 3, ... without end.

    ``base`` and ``cap`` are seconds (finite, 0 or more, ``base <= cap``); ``random`` returns a float in
    ``[0, 1)`` (default :func:`random.random`). Bad values raise :class:`RetryArgumentError`."""

    base: float = 0.1
    cap: float = 30.0
    jitter: Jitter = "full"
    random: Callable[[], float] = field(default=_random.random, compare=False)

    def __post_init__(self) -> None:
        base, cap = _seconds(self.base, "base"), _seconds(self.cap, "cap")
        if base > cap:
            raise RetryArgumentError(f"base ({base:g}) is above cap ({cap:g})", field="base")
        if self.jitter not in JITTERS:
            raise RetryArgumentError("jitter must be 'full', 'equal' or 'none'", field="jitter")
        _callable(self.random, "random")

    def ceiling(self, attempt: int) -> float:
        """The most attempt ``attempt`` waits: ``min(cap, base * 2 ** (attempt - 1))``.

        :param attempt: the failed attempt's number, from 1.
        :returns: the longest wait after it, in seconds.
        :raises RetryArgumentError: ``attempt`` is not an integer of 1 or more.
        """
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise RetryArgumentError("attempt must be an integer, 1 or more", field="attempt")
        return float(min(self.cap, self.base * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS)))

    def delay(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt``, drawn below its :meth:`ceiling`.

        :param attempt: the failed attempt's number, from 1.
        :returns: the wait after it, in seconds.
        :raises RetryArgumentError: ``attempt`` is not an integer of 1 or more.
        """
        ceiling = self.ceiling(attempt)
        if self.jitter == "none":
            return ceiling
        drawn = min(max(float(self.random()), 0.0), 1.0)  # a bad source of randomness never leaves the bounds
        if self.jitter == "equal":
            return ceiling / 2 + ceiling / 2 * drawn
        return ceiling * drawn

    def __iter__(self) -> Iterator[float]:
        attempt = 1
        while True:
            yield self.delay(attempt)
            attempt += 1


def retry(
    call: Callable[[], T], *, attempts: int = 5, base: float = 0.1, cap: float = 30.0, jitter: Jitter = "full",
    retry_on: tuple[type[BaseException], ...] = (StoreUnavailableError,),
    sleep: Callable[[float], object] = time.sleep, random: Callable[[], float] = _random.random,
    on_retry: Callable[[int, BaseException, float], object] | None = None,
) -> T:
    """Call ``call()`` (no arguments: bind them with a lambda or :func:`functools.partial`) up to ``attempts``
    times while it raises one of ``retry_on`` (default: :class:`~hostedrooms.errors.StoreUnavailableError`),
    waiting ``sleep(delay)`` between attempts, each delay from :class:`JitteredBackoff` (``base``, ``cap``,
    ``jitter``, ``random``). ``on_retry(attempt, error, delay)``, if given, is told of each failure before its wait
    (to log it).

    :param call: the call to make, without arguments.
    :param attempts: the most calls, 1 to MAX_ATTEMPTS.
    :param base: the first wait's ceiling, in seconds.
    :param cap: the longest wait, in seconds.
    :param jitter: how each wait is drawn below its ceiling, one of :data:`JITTERS`.
    :param retry_on: the exception classes that are retried.
    :param sleep: waits the given seconds (default: :func:`time.sleep`).
    :param random: returns a float in ``[0, 1)`` (default: :func:`random.random`).
    :param on_retry: told ``(attempt, error, delay)`` of each failure before its wait, or None.
    :returns: what ``call`` returned on the first attempt that did not raise.
    :raises BaseException: the error of the last attempt, as it was raised, once ``attempts`` are spent; at once,
        any error not in ``retry_on``.
    :raises RetryArgumentError: a bad argument (``attempts`` an integer from 1 to 1000, ``base``/``cap`` finite
        seconds with ``base <= cap``, ``jitter`` one of :data:`JITTERS`, ``retry_on`` a tuple of exception classes,
        ``call``/``sleep``/``random``/``on_retry`` callables), before any call.
    """
    _callable(call, "call")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS:
        raise RetryArgumentError(f"attempts must be an integer from 1 to {MAX_ATTEMPTS}", field="attempts")
    if not isinstance(retry_on, tuple) or not retry_on or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in retry_on):
        raise RetryArgumentError("retry_on must be a non-empty tuple of exception classes", field="retry_on")
    _callable(sleep, "sleep")
    if on_retry is not None:
        _callable(on_retry, "on_retry")
    backoff = JitteredBackoff(base=base, cap=cap, jitter=jitter, random=random)
    attempt = 1
    while True:
        try:
            return call()
        except retry_on as error:
            if attempt >= attempts:
                raise
            delay = backoff.delay(attempt)
            if on_retry is not None:
                on_retry(attempt, error, delay)
            sleep(delay)
            attempt += 1
