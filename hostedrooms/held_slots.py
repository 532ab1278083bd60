"""What an engine holds outside its pool, per process: the SQLite held writer (:mod:`hostedrooms.writer`) and
PostgreSQL's held autocommit connections (:mod:`hostedrooms.held_autocommit`) share these rules.

- An engine keeps its held object in a :class:`HeldSlot` (in its
  :class:`~hostedrooms.engine_profile.EngineRuntime`), built at first use (:meth:`HeldSlot.current`).
- Each held object belongs to the process *generation* it was built in (:func:`generation`, bumped in every forked
  child). A child never uses nor closes its parent's connections (closing a SQLite file's descriptor there would
  drop the parent's locks; a PostgreSQL socket is shared with the parent's session): it keeps them referenced,
  untouched, and builds its own.
- ``engine.dispose()`` retires the current object (at once, or as the unit using it ends: the object's
  ``retire()``); ``dispose(close=False)``, what a forked child calls, lets go of it untouched.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import Engine

__all__ = ["Held", "HeldSlot", "generation"]

#: Bumped in every forked child: held objects of an older generation belong to the parent.
_generation = 0
#: Held objects inherited from the parent process: kept referenced so their connections are never closed here.
_inherited: list[Any] = []
_lock = threading.Lock()


class Held(Protocol):
    """A held object: the generation it was built in, and how ``dispose()`` retires it."""

    generation: int

    def retire(self) -> None: ...


_H = TypeVar("_H", bound=Held)


def generation() -> int:
    """This process's generation (0 until it forks; each forked child one more than its parent)."""
    return _generation


class HeldSlot(Generic[_H]):
    """An engine's current held object (None until first use; replaced after a dispose or a fork)."""

    def __init__(self) -> None:
        self.item: _H | None = None

    def current(self, build: Callable[[], _H]) -> _H:
        """The held object of this process's generation, built (``build()``) if there is none yet."""
        item = self.item
        if item is not None and item.generation == _generation:
            return item
        with _lock:
            item = self.item
            if item is not None and item.generation != _generation:
                _inherited.append(item)  # the parent's: never used, never closed here
                item = None
            if item is None:
                item = self.item = build()
            return item

    def retire_on_dispose(self, engine: Engine) -> None:
        """Make ``engine.dispose()`` retire the held object too (see the module docstring)."""
        original: Callable[..., None] = engine.dispose

        def dispose(close: bool = True) -> None:
            item, self.item = self.item, None
            if item is not None:
                if close and item.generation == _generation:
                    item.retire()
                else:  # dispose(close=False): a forked child lets go of the parent's connections untouched
                    _inherited.append(item)
            original(close)

        dispose.__doc__ = original.__doc__
        engine.dispose = dispose  # type: ignore[method-assign]


def _forked() -> None:
    global _generation, _lock
    _generation += 1
    _lock = threading.Lock()  # it may have been held by a thread that does not exist here


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forked)
