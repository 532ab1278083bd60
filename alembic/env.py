"""Alembic environment for hostedrooms (library-grade).

- Its own version table, ``hostedrooms_alembic_version``, so hostedrooms' history coexists with a host
  application's own Alembic history (and tables) in one database; autogenerate and ``alembic check`` look
  only at hostedrooms' tables.
- The database comes from ``config.attributes["connection"]`` (a Connection or an Engine, as pytest-alembic
  and host applications hand it in), else ``-x url=...``, else ``$HOSTEDROOMS_DATABASE_URL``, else
  ``sqlalchemy.url`` in alembic.ini.
- ``-x schema=NAME`` (else ``$HOSTEDROOMS_SCHEMA``), PostgreSQL: the gateway's own schema in a shared database,
  created when missing; its tables, its version table and its migration lock are that schema's alone.
- The whole upgrade runs in one transaction (SQLite DDL is transactional under our ``BEGIN IMMEDIATE``), with
  ``render_as_batch`` on SQLite and an advisory lock on PostgreSQL, so a failed upgrade changes nothing and
  concurrent upgraders wait for each other.
"""

from __future__ import annotations

from alembic import context

from hostedrooms.migrate import run_alembic_env

run_alembic_env(context)
