"""The harness gives every backend a migrated, empty database."""

from __future__ import annotations

import sqlalchemy as sa

from hostedrooms import migrate
from hostedrooms.models import metadata


def test_engine_is_migrated_and_empty(engine: sa.Engine) -> None:
    assert migrate.is_at_head(engine)
    with engine.connect() as connection:
        tables = set(sa.inspect(connection).get_table_names())
        assert set(metadata.tables) <= tables
        for table in metadata.sorted_tables:
            assert connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0
