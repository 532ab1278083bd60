# migrations/env.py of your application
from logging.config import fileConfig

from alembic import context
from hostedrooms import migrate as hostedrooms_migrate
from sqlalchemy import engine_from_config, pool

from myapp.models import metadata  # your application's tables

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)


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
