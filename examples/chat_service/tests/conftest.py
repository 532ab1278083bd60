"""Fixtures: hostedrooms' pytest plugin gives each test a database migrated with hostedrooms' history and this
service's own (SQLite by default; ``--hostedrooms-postgres-url=postgresql://admin@host/postgres`` for PostgreSQL);
the app is served by uvicorn on a loopback port, so server-sent events stream as they would in production."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from hostedrooms.records import OutboundRecord
from hostedrooms.testing import HostSetup, host_alembic

from chat_service import create_app
from chat_service.problems import PROBLEM_JSON, TYPE_BASE

SERVICE = Path(__file__).resolve().parents[1]
GATEWAY = "install:chat-test"
NOW = 1_800_000_000.0


#: The members a problem body may have: RFC 9457's, and this service's extension members.
PROBLEM_MEMBERS = {"type", "title", "status", "detail", "instance"}
EXTENSION_MEMBERS = {"field", "limit"}


def assert_problem(response: httpx.Response, status: int, kind: str, **extensions: object) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem of ``kind`` (a name under this service's type base, or
    ``about:blank``) with ``status``, its members well typed, ``instance`` the request's path, ``extensions`` (and
    no other extension member) present; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert PROBLEM_MEMBERS <= body.keys() <= PROBLEM_MEMBERS | EXTENSION_MEMBERS, body
    assert body["type"] == ("about:blank" if kind == "about:blank" else TYPE_BASE + kind)
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert "Traceback" not in body["detail"]
    assert body["instance"] == response.request.url.path
    assert {name: body[name] for name in body.keys() & EXTENSION_MEMBERS} == extensions
    assert (response.headers.get("retry-after") == "1") is (status == 503)
    return body


@pytest.fixture(scope="session")
def hostedrooms_host_setup() -> HostSetup:
    """The service's own Alembic history, run once on the template every test database is copied from."""
    return host_alembic(SERVICE / "alembic.ini")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeSender:
    """The webhook receiver: records each intent it is given; fails while ``failing``."""

    def __init__(self) -> None:
        self.calls: list[OutboundRecord] = []
        self.failing = False

    async def __call__(self, intent: OutboundRecord) -> Mapping[str, Any]:
        self.calls.append(intent)
        if self.failing:
            raise ConnectionError("receiver unreachable")
        return {"status": 202, "echo": intent["body"]}


@pytest.fixture
def sender() -> FakeSender:
    return FakeSender()


class FakeClock:
    """The service's clock: ``now`` until a test moves it."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` served by uvicorn on a loopback port, with its lifespan (startup and shutdown)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            if serving.done():
                serving.result()  # the startup failed: raise its error
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            yield http
    finally:
        server.should_exit = True
        await serving
        listener.close()


@pytest.fixture
async def client(hostedrooms_target: str, sender: FakeSender, clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the service on this test's database (the app creates its engine from the target, as in
    production)."""
    async with served(create_app(hostedrooms_target, sender=sender, gateway_id=GATEWAY, clock=clock)) as http:
        yield http
