"""Alembic's env.py for the chat service: hostedrooms' (docs/host-alembic.md, "Inside your application's Alembic"),
as written, plus one block: the database is the service's own setting (``$CHAT_SERVICE_DATABASE``, a SQLite path
or a ``postgresql://`` URL, :mod:`chat_service.settings`), opened as the service opens it, so ``alembic upgrade
head`` migrates the database the service serves. ``alembic.ini`` names no URL."""

from logging.config import fileConfig

from alembic import context
from hostedrooms import create_engine
from hostedrooms import migrate as hostedrooms_migrate
from sqlalchemy import engine_from_config, pool

from chat_service.models import metadata  # the service's tables
from chat_service.settings import database

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

if config.attributes.get("connection") is None:  # no Engine handed over (by pytest-alembic, hostedrooms.testing)
    config.attributes["connection"] = create_engine(database(), poolclass=pool.NullPool)


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection") or engine_from_config(  # an Engine from pytest-alembic
        config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            include_name=hostedrooms_migrate.host_include_name,  # hostedrooms
            include_object=hostedrooms_migrate.host_include_object,  # hostedrooms
        )
        hostedrooms_migrate.upgrade_with_host(context, connection)  # hostedrooms first: the one-command shape
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
