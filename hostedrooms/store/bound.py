"""What every store shares: built once per backend (the prototype, holding its compiled statements) and bound, per
unit of work, to that unit's connection (:meth:`BoundStore.bind`; ``uow.rooms`` and the other accessors of
:class:`hostedrooms.uow.UnitOfWork` do it once per unit)."""

from __future__ import annotations

from typing import Self

from sqlalchemy import Connection

__all__ = ["BoundStore"]


class BoundStore:
    """A store whose methods run on :attr:`connection` (the unit's), inside the unit's transaction."""

    #: The connection of the unit of work this store is bound to (absent on the backend's prototype).
    connection: Connection

    def bind(self, connection: Connection) -> Self:
        """This store on ``connection``: a copy sharing the prototype's statements and switches as they stand now
        (the unit of work's accessors do the same inline)."""
        bound = object.__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound.connection = connection
        return bound
