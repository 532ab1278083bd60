"""The chat service: a FastAPI app over hostedrooms' asyncio API.

Everything durable is hostedrooms' (rooms, events, the outbound ledger) or this service's own table
(``chat_webhooks``, :mod:`chat_service.models`). Every error is answered as RFC 9457 problem details, from one
place (:mod:`chat_service.problems`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI, Header, Query
from fastapi.responses import JSONResponse, StreamingResponse
from hostedrooms import aio
from hostedrooms.aio import AsyncUnitOfWork
from hostedrooms.errors import RoomNotFoundError
from hostedrooms.models import rooms as hosted_rooms
from hostedrooms.records import EventRecord, OutboundRecord
from hostedrooms.rooms import user_event_id
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from . import problems, settings
from .models import webhooks
from .problems import WEBHOOK_FAILED, WEBHOOK_GONE, WEBHOOK_MISSING, Problem

logger = logging.getLogger("chat_service")

#: Performs one outbound call for a recorded intent and returns the receiver's response (JSON-able); raises when
#: the call failed. Injected: tests pass a fake, production :func:`http_sender`.
Sender = Callable[[OutboundRecord], Awaitable[Mapping[str, Any]]]

#: A position in a room's log, validated alike on every route that takes one: a negative one is refused as
#: hostedrooms refuses it, an ``invalid-input`` problem (400) naming the parameter.
SinceSeq = Annotated[int, Query(ge=0)]

#: How long an outbound intent stays sendable; a retry after that is refused.
INTENT_LIFETIME = 24 * 3600

class NewRoom(BaseModel):
    room_id: str
    name: str
    members: list[dict[str, Any]] = Field(default_factory=list)
    webhook_url: str | None = None


class NewMessage(BaseModel):
    event_id: str  # the client's retry key: the same id appends once
    user_id: str
    text: str


class WebhookCall(BaseModel):
    request_id: str  # the client's retry key: the same id calls out once, then replays the stored response
    text: str


@dataclass
class Service:
    """What every endpoint uses: the engine, this gateway's identity, the ledger and the injected sender."""

    engine: AsyncEngine
    gateway_id: str
    sender: Sender
    clock: Callable[[], float]
    ledger: aio.AsyncDeliveryLedger | None = None

    def require_ledger(self) -> aio.AsyncDeliveryLedger:
        assert self.ledger is not None, "the ledger opens with the app's lifespan"
        return self.ledger


def create_app(
    database: str | AsyncEngine, *, sender: Sender, gateway_id: str = "install:chat-service",
    clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The service on ``database``: a SQLite path, a ``postgresql://`` URL (engine created here and disposed at
    shutdown) or an AsyncEngine of the caller's (left open). The schema must be at head (``alembic upgrade head``)."""
    owned = not isinstance(database, AsyncEngine)
    engine = aio.create_async_engine(database) if isinstance(database, str) else database
    service = Service(engine, gateway_id, sender, clock)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.ledger = await aio.open_ledger(engine, clock=clock)
        try:
            yield
        finally:
            if owned:
                await engine.dispose()

    app = FastAPI(title="chat service", lifespan=lifespan)
    problems.install(app)
    _routes(app, service)
    return app


def from_environment() -> FastAPI:
    """``uvicorn --factory chat_service:from_environment``: the database from ``$CHAT_SERVICE_DATABASE`` (default
    ``var/chat.db``: on SQLite the ledger makes the file's folder owner-private; ``migrations/env.py`` reads the
    same variable), webhooks sent over HTTP."""
    return create_app(settings.database(), sender=http_sender())


def http_sender(client: httpx.AsyncClient | None = None, *, timeout: float = 10.0) -> Sender:
    """A :data:`Sender` that POSTs the intent's text to its URL with the request id as ``Idempotency-Key`` (a
    retried call may reach the receiver twice; the key lets it answer once)."""

    async def post(http: httpx.AsyncClient, intent: OutboundRecord) -> Mapping[str, Any]:
        payload = {"room_id": intent["source_session_id"], "request_id": intent["request_id"], "text": intent["body"]}
        response = await http.post(intent["source_route_id"], json=payload,
                                   headers={"Idempotency-Key": intent["request_id"]})
        response.raise_for_status()
        return {"status": response.status_code}

    async def send(intent: OutboundRecord) -> Mapping[str, Any]:
        if client is not None:
            return await post(client, intent)
        async with httpx.AsyncClient(timeout=timeout) as http:
            return await post(http, intent)

    return send


def _routes(app: FastAPI, service: Service) -> None:
    engine = service.engine

    @app.post("/rooms")
    async def create_room(room: NewRoom) -> JSONResponse:
        """Create a room (201), or return the identical existing one (200); other content under its id: 409."""
        created = await aio.rooms.create_room(engine, room_id=room.room_id, name=room.name, members=room.members,
                                              authority_gateway_id=service.gateway_id)
        if room.webhook_url is not None:
            await _set_webhook(engine, room.room_id, room.webhook_url)
        return JSONResponse(dict(created), status_code=200 if created["idempotent"] else 201)

    @app.post("/rooms/{room_id}/events")
    async def append(room_id: str, message: NewMessage) -> JSONResponse:
        """Append a user message (201); a retry with the same ``event_id`` returns the stored event (200)."""
        # Which epoch this gateway holds; the append's own fence refuses it if the authority moved since.
        state = await aio.rooms.room_state(engine, room_id=room_id)
        event = await aio.rooms.append_event(
            engine, room_id=room_id, event_id=user_event_id(message.event_id), kind="message.user",
            actor={"kind": "user", "id": message.user_id}, payload={"text": message.text},
            authority_gateway_id=service.gateway_id, authority_epoch=state["authority_epoch"])
        return JSONResponse(dict(event), status_code=200 if event["idempotent"] else 201)

    @app.get("/rooms/{room_id}/events")
    async def read(room_id: str, since_seq: SinceSeq = 0, limit: int = 100) -> JSONResponse:
        """One page of the log after ``since_seq``; pass ``cursor`` back as ``since_seq`` while ``has_more``."""
        return JSONResponse(dict(await aio.rooms.read_events(engine, room_id=room_id, since_seq=since_seq,
                                                             limit=limit)))

    @app.get("/rooms/{room_id}/stream")
    async def stream(
        room_id: str, since_seq: SinceSeq = 0,
        last_event_id: Annotated[int | None, Header(ge=0)] = None,
    ) -> StreamingResponse:
        """Server-sent events: each event after ``since_seq`` (or after ``Last-Event-ID``, sent by a reconnecting
        client) as it commits, ``id:`` its seq; the stream ends after the room is disbanded."""
        # Errors become statuses only before the response starts: open_follow() checks the room and the seq.
        events = await aio.rooms.open_follow(engine, room_id, since_seq if last_event_id is None else last_event_id)
        return StreamingResponse(_sse(events), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    @app.post("/rooms/{room_id}/webhook")
    async def call_webhook(room_id: str, call: WebhookCall) -> JSONResponse:
        """Send ``text`` to the room's webhook once, through the ledger: 201 when this request made the call, 200
        when it replays the stored response, 502 when the receiver failed (retry with the same request id)."""
        return await _call_webhook(service, room_id, call)


async def _set_webhook(engine: AsyncEngine, room_id: str, url: str) -> None:
    """Store the room's webhook URL (a retried create sets it again). The room's row is locked first, in the order
    hostedrooms' own writes take locks, so concurrent creates of one room replace the row one after the other."""
    async with AsyncUnitOfWork(engine) as uow:
        room = sa.select(hosted_rooms.c.room_id).where(hosted_rooms.c.room_id == room_id).with_for_update()
        await uow.execute(room)  # PostgreSQL: FOR UPDATE; SQLite's write transaction holds the database's lock
        await uow.execute(sa.delete(webhooks).where(webhooks.c.room_id == room_id))
        await uow.execute(sa.insert(webhooks).values(room_id=room_id, url=url))
        await uow.commit()


async def _webhook_url(engine: AsyncEngine, room_id: str) -> str | None:
    async with AsyncUnitOfWork(engine, write=False) as uow:
        result = await uow.execute(sa.select(webhooks.c.url).where(webhooks.c.room_id == room_id))
        url: str | None = result.scalar_one_or_none()
        return url


async def _sse(events: AsyncGenerator[EventRecord, None]) -> AsyncIterator[str]:
    """Frame each event for ``text/event-stream``; a room purged while followed just ends the stream."""
    async with aclosing(events):  # a client gone: the follower unregisters at once
        try:
            async for event in events:
                data = json.dumps(event, separators=(",", ":"))
                yield f"id: {event['seq']}\nevent: {event['kind']}\ndata: {data}\n\n"
        except RoomNotFoundError:
            return


async def _call_webhook(service: Service, room_id: str, call: WebhookCall) -> JSONResponse:
    await aio.rooms.room_state(service.engine, room_id=room_id)
    url = await _webhook_url(service.engine, room_id)
    if url is None:
        raise Problem(WEBHOOK_MISSING, f"room {room_id} has no webhook")
    ledger = service.require_ledger()
    # The intent's expiry is part of what a retry must repeat exactly: reuse the first request's.
    known = await ledger.outbound(call.request_id)
    expires_at = known["expires_at"] if known else int(service.clock()) + INTENT_LIFETIME
    intent, _ = await ledger.prepare_outbound(
        request_id=call.request_id, source_session_id=room_id, source_run_id="webhook", body=call.text,
        action="instruction", expires_at=expires_at,
        snapshot={"connection_id": "webhook", "source_route_id": url, "source_route_revision": "1",
                  "source_chat_id": room_id, "action": "instruction"})
    if intent["state"] == "committed":
        return JSONResponse(_outcome(intent))
    if intent["state"] == "failed" or intent["expires_at"] <= service.clock():
        # The receiver's last error may name its URL's secrets: the log keeps it, the client gets the id.
        logger.warning("webhook request %s failed for good: %s", call.request_id, intent["last_error"])
        raise Problem(WEBHOOK_GONE, f"webhook request {call.request_id} failed for good; send a new request id")
    try:
        response = await service.sender(intent)
    except Exception as exc:  # the receiver's failure: the intent stays pending, its next try scheduled
        await ledger.defer_outbound(call.request_id, f"{type(exc).__name__}: {exc}")
        raise Problem(WEBHOOK_FAILED, f"webhook call failed; retry request {call.request_id}") from exc
    committed = await ledger.commit_outbound(call.request_id, response)
    assert committed is not None  # prepared above; intents are never deleted while pending
    return JSONResponse(_outcome(committed), status_code=201)


def _outcome(intent: OutboundRecord) -> dict[str, Any]:
    return {"request_id": intent["request_id"], "state": intent["state"], "response": intent["response"]}
