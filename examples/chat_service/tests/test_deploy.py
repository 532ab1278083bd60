"""The README's deploy, as a deploy runs it: ``hostedrooms upgrade`` then the service's ``alembic upgrade head``
on an empty database named by ``$CHAT_SERVICE_DATABASE`` alone (the service's own setting; ``alembic.ini`` names
no URL), then the service serves it, from the same variable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostedrooms import migrate, testing
from hostedrooms.testing import open_engine

from chat_service import create_app, settings
from chat_service.settings import DATABASE_ENV
from conftest import SERVICE, FakeSender, served

BIN = Path(sys.executable).parent


@pytest.fixture
def empty_database(hostedrooms_postgres_url: str | None, tmp_path: Path) -> Iterator[str]:
    """A database never migrated, on the backend of this run."""
    if hostedrooms_postgres_url is None:
        yield str(tmp_path / "chat.db")
        return
    with testing.postgres_database(hostedrooms_postgres_url, testing.unique_name("chat_deploy")) as url:
        yield url


def _run(*argv: str, database: str, cwd: Path) -> None:
    env = {**os.environ, DATABASE_ENV: database}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.anyio
async def test_deploy_then_serve(
        empty_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ini = str(SERVICE / "alembic.ini")
    _run(str(BIN / "hostedrooms"), "upgrade", "--url", empty_database, database=empty_database, cwd=tmp_path)
    _run(str(BIN / "alembic"), "-c", ini, "upgrade", "head", database=empty_database, cwd=tmp_path)
    # the models match the history; hostedrooms' tables ignored
    _run(str(BIN / "alembic"), "-c", ini, "check", database=empty_database, cwd=tmp_path)
    assert not (tmp_path / "var").exists()  # the default database was never opened
    with open_engine(empty_database) as engine:
        assert migrate.is_at_head(engine)
    sender = FakeSender()
    monkeypatch.setenv(DATABASE_ENV, empty_database)
    app = create_app(settings.database(), sender=sender)  # what from_environment() serves, with a fake sender
    async with served(app) as client:
        created = await client.post("/rooms", json={"room_id": "r1", "name": "R", "webhook_url": "https://h.example"})
        assert created.status_code == 201
        webhook = await client.post("/rooms/r1/webhook", json={"request_id": "w1", "text": "deployed"})
        assert webhook.status_code == 201
    assert [intent["body"] for intent in sender.calls] == ["deployed"]
