"""Every route answers every error in one shape, RFC 9457 problem details: hostedrooms' refusals, FastAPI's own
request validation (the same ``invalid-input`` problem, 400, as hostedrooms' InvalidInputError), the service's own
errors and the framework's unknown route or method."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from conftest import FakeClock, FakeSender, assert_problem

pytestmark = pytest.mark.anyio

Call = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


async def _room(client: httpx.AsyncClient, **extra: Any) -> None:
    response = await client.post("/rooms", json={"room_id": "r1", "name": "Planning", **extra})
    assert response.status_code == 201


def _say(event_id: str = "c-1", text: str = "hello", room_id: str = "r1") -> Call:
    async def call(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(f"/rooms/{room_id}/events",
                                 json={"event_id": event_id, "user_id": "u1", "text": text})
    return call


def _post(path: str, **kwargs: Any) -> Call:
    async def call(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post(path, **kwargs)
    return call


def _get(path: str, **kwargs: Any) -> Call:
    async def call(client: httpx.AsyncClient) -> httpx.Response:
        return await client.get(path, **kwargs)
    return call


#: Per route: a request refused by FastAPI's validation, by hostedrooms, or by the service, with the problem it
#: gets (status, type name, extension members).
CASES: dict[str, tuple[Call, int, str, dict[str, object]]] = {
    "create: no name": (_post("/rooms", json={"room_id": "r2"}), 400, "invalid-input", {"field": "name"}),
    "create: not JSON": (_post("/rooms", content=b"{", headers={"content-type": "application/json"}), 400,
                         "invalid-input", {"field": "body"}),
    "create: a member not an object": (_post("/rooms", json={"room_id": "r2", "name": "n", "members": [1]}), 400,
                                       "invalid-input", {"field": "members[0]"}),
    "create: room_id too long": (_post("/rooms", json={"room_id": "x" * 10_000, "name": "n"}), 400,
                                 "invalid-input", {"field": "room_id"}),
    "create: other content": (_post("/rooms", json={"room_id": "r1", "name": "Other"}), 409, "room-conflict", {}),
    "append: no text": (_post("/rooms/r1/events", json={"event_id": "c-9", "user_id": "u1"}), 400,
                        "invalid-input", {"field": "text"}),
    "append: unknown room": (_say(room_id="nowhere"), 404, "room-not-found", {}),
    "append: event id reused": (_say(text="goodbye"), 409, "event-conflict", {}),
    "read: since_seq -1": (_get("/rooms/r1/events", params={"since_seq": -1}), 400, "invalid-input",
                           {"field": "since_seq"}),
    "read: since_seq not a number": (_get("/rooms/r1/events", params={"since_seq": "seven"}), 400,
                                     "invalid-input", {"field": "since_seq"}),
    "read: limit 0": (_get("/rooms/r1/events", params={"limit": 0}), 400, "invalid-input", {"field": "limit"}),
    "read: unknown room": (_get("/rooms/nowhere/events"), 404, "room-not-found", {}),
    "stream: since_seq -1": (_get("/rooms/r1/stream", params={"since_seq": -1}), 400, "invalid-input",
                             {"field": "since_seq"}),
    "stream: since_seq not a number": (_get("/rooms/r1/stream", params={"since_seq": "seven"}), 400,
                                       "invalid-input", {"field": "since_seq"}),
    "stream: Last-Event-ID -1": (_get("/rooms/r1/stream", headers={"Last-Event-ID": "-1"}), 400, "invalid-input",
                                 {"field": "last-event-id"}),
    "stream: Last-Event-ID ahead": (_get("/rooms/r1/stream", headers={"Last-Event-ID": "7"}), 400,
                                    "invalid-input", {"field": "since_seq"}),
    "stream: unknown room": (_get("/rooms/nowhere/stream"), 404, "room-not-found", {}),
    "webhook: no request_id": (_post("/rooms/r1/webhook", json={"text": "hi"}), 400, "invalid-input",
                               {"field": "request_id"}),
    "webhook: unknown room": (_post("/rooms/nowhere/webhook", json={"request_id": "w1", "text": "hi"}), 404,
                              "room-not-found", {}),
    "webhook: none set": (_post("/rooms/r1/webhook", json={"request_id": "w1", "text": "hi"}), 409,
                          "webhook-missing", {}),
    "no such route": (_get("/nowhere"), 404, "about:blank", {}),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_routes_errors_are_problem_details(client: httpx.AsyncClient, case: str) -> None:
    call, status, kind, extensions = CASES[case]
    await _room(client)
    assert (await _say()(client)).status_code == 201
    assert_problem(await call(client), status, kind, **extensions)


async def test_since_seq_minus_one_is_the_same_problem_on_every_route(client: httpx.AsyncClient) -> None:
    """400, as hostedrooms' InvalidInputError, on ``/events`` and ``/stream`` alike: only ``instance`` differs."""
    await _room(client)
    bodies = []
    for path in ("/rooms/r1/events", "/rooms/r1/stream"):
        response = await client.get(path, params={"since_seq": -1})
        bodies.append(assert_problem(response, 400, "invalid-input", field="since_seq"))
    events, stream = ({key: value for key, value in body.items() if key != "instance"} for body in bodies)
    assert events == stream


async def test_a_method_not_allowed_is_a_problem_with_allow(client: httpx.AsyncClient) -> None:
    response = await client.delete("/rooms")
    assert_problem(response, 405, "about:blank")
    assert response.headers["allow"] == "POST"


async def test_the_webhooks_failures_are_problems(
        client: httpx.AsyncClient, sender: FakeSender, clock: FakeClock) -> None:
    await _room(client, webhook_url="https://user:s3cret@hooks.example/r1")
    sender.failing = True
    failed = assert_problem(await client.post("/rooms/r1/webhook", json={"request_id": "w1", "text": "hi"}), 502,
                            "webhook-failed")
    assert "w1" in failed["detail"]
    clock.now += 2 * 24 * 3600
    gone = assert_problem(await client.post("/rooms/r1/webhook", json={"request_id": "w1", "text": "hi"}), 410,
                          "webhook-request-gone")
    assert "w1" in gone["detail"] and "s3cret" not in gone["detail"]
