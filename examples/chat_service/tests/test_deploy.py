"""The README's deploy, as a deploy runs it: ``hostedrooms upgrade`` then the service's ``alembic upgrade head``
on an empty database, then the service serves it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostedrooms import migrate, testing
from hostedrooms.testing import open_engine

from chat_service import create_app
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


def _alembic_ini(directory: Path, url: str) -> Path:
    """The service's alembic.ini with ``sqlalchemy.url`` pointing at ``url`` (what a deploy edits)."""
    text = (SERVICE / "alembic.ini").read_text().replace("%(here)s", str(SERVICE))
    assert "sqlalchemy.url = sqlite:///var/chat.db" in text
    text = text.replace("sqlalchemy.url = sqlite:///var/chat.db", f"sqlalchemy.url = {url.replace('%', '%%')}")
    path = directory / "alembic.ini"
    path.write_text(text)
    return path


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.anyio
async def test_deploy_then_serve(empty_database: str, tmp_path: Path) -> None:
    ini = str(_alembic_ini(tmp_path, empty_database if "://" in empty_database else f"sqlite:///{empty_database}"))
    _run(str(BIN / "hostedrooms"), "upgrade", "--url", empty_database)
    _run(str(BIN / "alembic"), "-c", ini, "upgrade", "head")
    _run(str(BIN / "alembic"), "-c", ini, "check")  # the models match the history; hostedrooms' tables ignored
    with open_engine(empty_database) as engine:
        assert migrate.is_at_head(engine)
    sender = FakeSender()
    async with served(create_app(empty_database, sender=sender)) as client:
        created = await client.post("/rooms", json={"room_id": "r1", "name": "R", "webhook_url": "https://h.example"})
        assert created.status_code == 201
        webhook = await client.post("/rooms/r1/webhook", json={"request_id": "w1", "text": "deployed"})
        assert webhook.status_code == 201
    assert [intent["body"] for intent in sender.calls] == ["deployed"]
