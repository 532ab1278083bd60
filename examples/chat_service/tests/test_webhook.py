"""One outbound call through hostedrooms' ledger: recorded before it is sent, sent once, its response committed and
replayed to retries."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from hostedrooms import aio
from sqlalchemy.ext.asyncio import AsyncEngine

from chat_service import http_sender
from chat_service.app import INTENT_LIFETIME
from conftest import FakeClock, FakeSender, assert_problem

pytestmark = pytest.mark.anyio

HOOK = "https://hooks.example/room-r1"


async def _room_with_webhook(client: httpx.AsyncClient) -> None:
    response = await client.post("/rooms", json={"room_id": "r1", "name": "Planning", "webhook_url": HOOK})
    assert response.status_code == 201


async def _call(client: httpx.AsyncClient, request_id: str = "w-1", text: str = "deploy done") -> httpx.Response:
    return await client.post("/rooms/r1/webhook", json={"request_id": request_id, "text": text})


async def test_a_webhook_is_sent_once_and_replayed(
        client: httpx.AsyncClient, sender: FakeSender, hostedrooms_async_engine: AsyncEngine) -> None:
    await _room_with_webhook(client)
    first = await _call(client)
    assert first.status_code == 201
    assert first.json() == {"request_id": "w-1", "state": "committed",
                            "response": {"status": 202, "echo": "deploy done"}}
    [intent] = sender.calls
    assert (intent["source_route_id"], intent["source_session_id"], intent["body"]) == (HOOK, "r1", "deploy done")
    retry = await _call(client)
    assert retry.status_code == 200
    assert retry.json() == first.json()
    assert len(sender.calls) == 1  # the retry replayed the stored response
    ledger = await aio.open_ledger(hostedrooms_async_engine)
    stored = await ledger.outbound("w-1")
    assert stored is not None
    assert (stored["state"], stored["response"]) == ("committed", {"status": 202, "echo": "deploy done"})


async def test_a_failed_call_stays_pending_and_a_retry_sends_it(
        client: httpx.AsyncClient, sender: FakeSender, hostedrooms_async_engine: AsyncEngine) -> None:
    await _room_with_webhook(client)
    sender.failing = True
    failed = await _call(client)
    assert_problem(failed, 502, "webhook-failed")
    ledger = await aio.open_ledger(hostedrooms_async_engine)
    pending = await ledger.outbound("w-1")
    assert pending is not None
    assert (pending["state"], pending["attempts"]) == ("pending", 1)
    assert pending["last_error"] == "ConnectionError: receiver unreachable"
    sender.failing = False
    sent = await _call(client)
    assert sent.status_code == 201
    assert sent.json()["state"] == "committed"
    assert len(sender.calls) == 2


async def test_an_expired_intent_is_not_sent_again(
        client: httpx.AsyncClient, sender: FakeSender, clock: FakeClock) -> None:
    await _room_with_webhook(client)
    sender.failing = True
    assert (await _call(client)).status_code == 502
    sender.failing = False
    clock.now += INTENT_LIFETIME
    assert_problem(await _call(client), 410, "webhook-request-gone")
    assert len(sender.calls) == 1


async def test_a_room_without_a_webhook_is_409(client: httpx.AsyncClient, sender: FakeSender) -> None:
    await client.post("/rooms", json={"room_id": "r1", "name": "Planning"})
    response = await _call(client)
    assert_problem(response, 409, "webhook-missing")
    assert sender.calls == []


async def test_http_sender_posts_the_intent_with_its_idempotency_key(
        client: httpx.AsyncClient, hostedrooms_async_engine: AsyncEngine) -> None:
    received: list[tuple[str | None, object]] = []
    receiver = FastAPI()

    @receiver.post("/room-r1")
    async def hook(request: Request) -> dict[str, bool]:
        received.append((request.headers.get("idempotency-key"), await request.json()))
        return {"ok": True}

    await _room_with_webhook(client)
    ledger = await aio.open_ledger(hostedrooms_async_engine)
    intent, _ = await ledger.prepare_outbound(
        request_id="w-9", source_session_id="r1", source_run_id="webhook", body="hi", action="instruction",
        expires_at=2_000_000_000, snapshot={"connection_id": "webhook", "source_route_id": HOOK,
                                            "source_route_revision": "1", "source_chat_id": "r1",
                                            "action": "instruction"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver)) as http:
        assert await http_sender(http)(intent) == {"status": 200}
    assert received == [("w-9", {"room_id": "r1", "request_id": "w-9", "text": "hi"})]


async def test_a_blank_text_is_400(client: httpx.AsyncClient, sender: FakeSender) -> None:
    await _room_with_webhook(client)
    response = await _call(client, text="   ")
    assert_problem(response, 400, "invalid-input", field="body")  # the ledger's refusal, named by its field
    assert sender.calls == []


async def test_a_request_id_reused_with_other_text_is_409(client: httpx.AsyncClient, sender: FakeSender) -> None:
    await _room_with_webhook(client)
    assert (await _call(client, text="deploy done")).status_code == 201
    response = await _call(client, text="something else")
    assert_problem(response, 409, "request-conflict")
    assert len(sender.calls) == 1
