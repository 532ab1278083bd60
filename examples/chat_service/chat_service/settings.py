"""Where the service's database is, read once for the service and for its Alembic history alike."""

from __future__ import annotations

import os

#: The environment variable naming the database: a SQLite path or a ``postgresql://`` URL.
DATABASE_ENV = "CHAT_SERVICE_DATABASE"

#: The database when :data:`DATABASE_ENV` is unset (relative to the working directory; on SQLite the ledger makes
#: the file's folder owner-private, so it sits in a folder of its own).
DEFAULT_DATABASE = "var/chat.db"


def database() -> str:
    """The database of this process: ``$CHAT_SERVICE_DATABASE``, or :data:`DEFAULT_DATABASE` when it is unset (an
    empty value is passed on, and refused, rather than taken for unset)."""
    return os.environ.get(DATABASE_ENV, DEFAULT_DATABASE)
