"""Rooms, idempotent appends and pages, and how hostedrooms' errors become statuses and problems."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from conftest import assert_problem

pytestmark = pytest.mark.anyio


async def _room(client: httpx.AsyncClient, room_id: str = "r1", **extra: Any) -> httpx.Response:
    return await client.post("/rooms", json={"room_id": room_id, "name": "Planning", **extra})


async def _say(client: httpx.AsyncClient, event_id: str, text: str, room_id: str = "r1") -> httpx.Response:
    return await client.post(f"/rooms/{room_id}/events", json={"event_id": event_id, "user_id": "u1", "text": text})


async def test_create_a_room_then_replay_it(client: httpx.AsyncClient) -> None:
    created = await _room(client)
    assert created.status_code == 201
    assert created.json()["authority_epoch"] == 1
    replayed = await _room(client)
    assert replayed.status_code == 200
    assert replayed.json()["idempotent"] is True


async def test_the_same_room_id_with_other_content_conflicts(client: httpx.AsyncClient) -> None:
    await _room(client)
    response = await client.post("/rooms", json={"room_id": "r1", "name": "Something else"})
    assert_problem(response, 409, "room-conflict")


async def test_a_retried_append_returns_the_same_event(client: httpx.AsyncClient) -> None:
    await _room(client)
    first = await _say(client, "c-1", "hello")
    assert first.status_code == 201
    retry = await _say(client, "c-1", "hello")
    assert retry.status_code == 200
    assert retry.json()["seq"] == first.json()["seq"] == 1
    assert retry.json()["event_id"] == first.json()["event_id"]
    page = (await client.get("/rooms/r1/events")).json()
    assert [event["payload"]["text"] for event in page["events"]] == ["hello"]


async def test_an_event_id_reused_with_other_text_conflicts(client: httpx.AsyncClient) -> None:
    await _room(client)
    await _say(client, "c-1", "hello")
    response = await _say(client, "c-1", "goodbye")
    assert_problem(response, 409, "event-conflict")


async def test_read_the_log_page_by_page(client: httpx.AsyncClient) -> None:
    await _room(client)
    for n in range(5):
        assert (await _say(client, f"c-{n}", f"m{n}")).status_code == 201
    texts, since = [], 0
    while True:
        page = (await client.get("/rooms/r1/events", params={"since_seq": since, "limit": 2})).json()
        assert len(page["events"]) <= 2
        texts += [event["payload"]["text"] for event in page["events"]]
        since = page["cursor"]
        if not page["has_more"]:
            break
    assert texts == [f"m{n}" for n in range(5)]
    assert page["latest_seq"] == 5


@pytest.mark.parametrize("call", ["read", "append", "stream", "webhook"])
async def test_a_missing_room_is_404(client: httpx.AsyncClient, call: str) -> None:
    if call == "read":
        response = await client.get("/rooms/nowhere/events")
    elif call == "append":
        response = await _say(client, "c-1", "hello", room_id="nowhere")
    elif call == "stream":
        response = await client.get("/rooms/nowhere/stream")
    else:
        response = await client.post("/rooms/nowhere/webhook", json={"request_id": "w1", "text": "hi"})
    assert_problem(response, 404, "room-not-found")


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 100_000}, {"since_seq": -1}])
async def test_input_hostedrooms_refuses_is_400(client: httpx.AsyncClient, params: dict[str, int]) -> None:
    await _room(client)
    response = await client.get("/rooms/r1/events", params=params)
    assert_problem(response, 400, "invalid-input", field=next(iter(params)))


async def test_a_room_id_hostedrooms_refuses_is_400(client: httpx.AsyncClient) -> None:
    response = await _room(client, room_id="x" * 10_000)
    assert_problem(response, 400, "invalid-input", field="room_id")


async def test_concurrent_retries_create_one_room_and_append_one_event(client: httpx.AsyncClient) -> None:
    hook = {"webhook_url": "https://hooks.example/r1"}
    created = await asyncio.gather(*(_room(client, **hook) for _ in range(8)))
    assert sorted(response.status_code for response in created) == [200] * 7 + [201]
    appended = await asyncio.gather(*(_say(client, "c-1", "hello") for _ in range(8)))
    assert sorted(response.status_code for response in appended) == [200] * 7 + [201]
    assert {response.json()["seq"] for response in appended} == {1}
    assert (await client.get("/rooms/r1/events")).json()["latest_seq"] == 1
