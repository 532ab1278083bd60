"""Every route answers every error in one shape, RFC 9457 problem details: hostedrooms' refusals, FastAPI's own
request validation (the same ``invalid-input`` problem, 400, as hostedrooms' InvalidInputError), the service's own
errors and the framework's unknown route or method."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from conftest import SERVICE, FakeClock, FakeSender, assert_problem

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


#: Per route, requests refused by FastAPI's validation, by hostedrooms or by the service, each with the problem it
#: gets (status, type name, extension members). Refusals write nothing, so one database serves a route's cases.
CASES: dict[str, list[tuple[str, Call, int, str, dict[str, object]]]] = {
    "create": [
        ("no name", _post("/rooms", json={"room_id": "r2"}), 400, "invalid-input", {"field": "name"}),
        ("not JSON", _post("/rooms", content=b"{", headers={"content-type": "application/json"}), 400,
         "invalid-input", {"field": "body"}),
        ("a member not an object", _post("/rooms", json={"room_id": "r2", "name": "n", "members": [1]}), 400,
         "invalid-input", {"field": "members[0]"}),
        ("room_id too long", _post("/rooms", json={"room_id": "x" * 10_000, "name": "n"}), 400, "invalid-input",
         {"field": "room_id"}),
        ("other content", _post("/rooms", json={"room_id": "r1", "name": "Other"}), 409, "room-conflict", {}),
    ],
    "append": [
        ("no text", _post("/rooms/r1/events", json={"event_id": "c-9", "user_id": "u1"}), 400, "invalid-input",
         {"field": "text"}),
        ("unknown room", _say(room_id="nowhere"), 404, "room-not-found", {}),
        ("event id reused", _say(text="goodbye"), 409, "event-conflict", {}),
    ],
    "read": [
        ("since_seq -1", _get("/rooms/r1/events", params={"since_seq": -1}), 400, "invalid-input",
         {"field": "since_seq"}),
        ("since_seq not a number", _get("/rooms/r1/events", params={"since_seq": "seven"}), 400, "invalid-input",
         {"field": "since_seq"}),
        ("limit 0", _get("/rooms/r1/events", params={"limit": 0}), 400, "invalid-input", {"field": "limit"}),
        ("unknown room", _get("/rooms/nowhere/events"), 404, "room-not-found", {}),
    ],
    "stream": [
        ("since_seq -1", _get("/rooms/r1/stream", params={"since_seq": -1}), 400, "invalid-input",
         {"field": "since_seq"}),
        ("since_seq not a number", _get("/rooms/r1/stream", params={"since_seq": "seven"}), 400, "invalid-input",
         {"field": "since_seq"}),
        ("Last-Event-ID -1", _get("/rooms/r1/stream", headers={"Last-Event-ID": "-1"}), 400, "invalid-input",
         {"field": "last-event-id"}),
        ("Last-Event-ID ahead", _get("/rooms/r1/stream", headers={"Last-Event-ID": "7"}), 400, "invalid-input",
         {"field": "since_seq"}),
        ("unknown room", _get("/rooms/nowhere/stream"), 404, "room-not-found", {}),
    ],
    "webhook": [
        ("no request_id", _post("/rooms/r1/webhook", json={"text": "hi"}), 400, "invalid-input",
         {"field": "request_id"}),
        ("unknown room", _post("/rooms/nowhere/webhook", json={"request_id": "w1", "text": "hi"}), 404,
         "room-not-found", {}),
        ("none set", _post("/rooms/r1/webhook", json={"request_id": "w1", "text": "hi"}), 409, "webhook-missing",
         {}),
    ],
    "unknown route": [("no such path", _get("/nowhere"), 404, "about:blank", {})],
}


@pytest.mark.parametrize("route", list(CASES))
async def test_each_routes_errors_are_problem_details(client: httpx.AsyncClient, route: str) -> None:
    await _room(client)
    assert (await _say()(client)).status_code == 201
    for case, call, status, kind, extensions in CASES[route]:
        response = await call(client)
        try:
            assert_problem(response, status, kind, **extensions)
        except AssertionError as failure:
            raise AssertionError(f"{route}: {case}: {response.status_code} {response.text}") from failure
    page = (await client.get("/rooms/r1/events")).json()
    assert page["latest_seq"] == 1  # every refusal left the log as it was


async def test_since_seq_minus_one_is_the_same_problem_on_every_route(client: httpx.AsyncClient) -> None:
    """400, as hostedrooms' InvalidInputError, on ``/events`` and ``/stream`` alike: only ``instance`` differs."""
    await _room(client)
    bodies = []
    for path in ("/rooms/r1/events", "/rooms/r1/stream"):
        response = await client.get(path, params={"since_seq": -1})
        bodies.append(assert_problem(response, 400, "invalid-input", field="since_seq"))
    events, stream = ({key: value for key, value in body.items() if key != "instance"} for body in bodies)
    assert events == stream
    assert bodies[1] == _readme_problem()  # the README shows this very body


def _readme_problem() -> Any:
    """The problem body the README shows (its ``http`` block, after the blank line)."""
    readme = (SERVICE / "README.md").read_text()
    block = readme.split("```http\n", 1)[1].split("```", 1)[0]
    return json.loads(block.split("\n\n", 1)[1])


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
