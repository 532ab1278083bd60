"""The live stream: server-sent events as they commit, resumed with ``Last-Event-ID``, ended by a disband."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from hostedrooms import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from conftest import GATEWAY, assert_problem

pytestmark = pytest.mark.anyio

#: Generous: a stream that stalls fails the test instead of hanging it.
DEADLINE = 30


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Each server-sent event of ``response``: its ``id``, ``event`` and decoded ``data``."""
    fields: dict[str, Any] = {}
    async for line in response.aiter_lines():
        if line:
            name, _, value = line.partition(": ")
            fields[name] = json.loads(value) if name == "data" else value
        elif fields:
            yield fields
            fields = {}


async def _say(client: httpx.AsyncClient, n: int) -> None:
    response = await client.post("/rooms/r1/events", json={"event_id": f"c-{n}", "user_id": "u1", "text": f"m{n}"})
    assert response.status_code == 201


async def _read(client: httpx.AsyncClient, count: int, headers: dict[str, str] | None = None,
                params: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The first ``count`` events of a stream, which is then closed (a client going away)."""
    got: list[dict[str, Any]] = []
    with anyio.fail_after(DEADLINE):
        async with client.stream("GET", "/rooms/r1/stream", headers=headers, params=params) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for event in _events(response):
                got.append(event)
                if len(got) == count:
                    break
    return got


async def test_the_stream_resumes_after_last_event_id(client: httpx.AsyncClient) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    for n in range(3):
        await _say(client, n)
    first = await _read(client, 2)
    assert [(event["id"], event["event"]) for event in first] == [("1", "message.user"), ("2", "message.user")]
    assert first[1]["data"]["payload"] == {"text": "m1"}
    for n in range(3, 5):
        await _say(client, n)
    resumed = await _read(client, 3, headers={"Last-Event-ID": first[-1]["id"]})
    assert [event["id"] for event in resumed] == ["3", "4", "5"]
    assert [event["data"]["payload"]["text"] for event in resumed] == ["m2", "m3", "m4"]


async def test_the_stream_delivers_events_appended_while_it_is_open(client: httpx.AsyncClient) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    got: list[dict[str, Any]] = []
    with anyio.fail_after(DEADLINE):
        async with client.stream("GET", "/rooms/r1/stream") as response, anyio.create_task_group() as tasks:
            tasks.start_soon(_say, client, 0)  # committed after the stream started
            async for event in _events(response):
                got.append(event)
                if len(got) == 1:
                    break
    assert got[0]["id"] == "1"


async def test_since_seq_starts_a_stream_and_last_event_id_wins(client: httpx.AsyncClient) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    for n in range(4):
        await _say(client, n)
    assert [event["id"] for event in await _read(client, 1, params={"since_seq": 2})] == ["3"]
    both = await _read(client, 1, params={"since_seq": 2}, headers={"Last-Event-ID": "3"})
    assert [event["id"] for event in both] == ["4"]


async def test_the_stream_ends_after_the_room_is_disbanded(
        client: httpx.AsyncClient, hostedrooms_async_engine: AsyncEngine) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    await _say(client, 0)
    await aio.rooms.disband_room(hostedrooms_async_engine, room_id="r1", expected_gateway_id=GATEWAY,
                                 expected_epoch=1)
    with anyio.fail_after(DEADLINE):
        async with client.stream("GET", "/rooms/r1/stream") as response:
            kinds = [event["event"] async for event in _events(response)]
    assert kinds == ["message.user", "room.disbanded"]


async def test_a_last_event_id_ahead_of_the_log_is_refused_before_the_stream(client: httpx.AsyncClient) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    await _say(client, 0)
    response = await client.get("/rooms/r1/stream", headers={"Last-Event-ID": "7"})
    assert_problem(response, 400, "invalid-input", field="since_seq")


@pytest.mark.parametrize("last_event_id", ["-1", "seven"])
async def test_a_bad_last_event_id_is_refused_before_the_stream(client: httpx.AsyncClient, last_event_id: str) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    response = await client.get("/rooms/r1/stream", headers={"Last-Event-ID": last_event_id})
    assert_problem(response, 400, "invalid-input", field="last-event-id")  # refused alike, as on every route
