"""Migrations for asyncio: :mod:`hostedrooms.migrate`'s ``upgrade``, ``downgrade``, ``current_revision`` and
``is_at_head`` on an AsyncEngine. Inside an AsyncConnection of your own, use SQLAlchemy's bridge instead:
``await connection.run_sync(hostedrooms.migrate.upgrade)``."""

from __future__ import annotations

from .. import migrate as _migrate
from ..migrate import head_revision
from .derive import service

__all__ = ["current_revision", "downgrade", "head_revision", "is_at_head", "upgrade"]

upgrade = service(_migrate.upgrade)
downgrade = service(_migrate.downgrade)
current_revision = service(_migrate.current_revision)
is_at_head = service(_migrate.is_at_head)
