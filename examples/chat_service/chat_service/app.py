"""The chat service: a FastAPI app over hostedrooms' asyncio API.

Everything durable is hostedrooms' (rooms, events, the outbound ledger) or this service's own table
(``chat_webhooks``, :mod:`chat_service.models`). Errors are mapped to HTTP statuses in one place,
:func:`error_response`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import sqlalchemy as sa
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from hostedrooms import aio
from hostedrooms.aio import AsyncUnitOfWork
from hostedrooms.errors import (
    AuthorityConflictError,
    CapacityExceededError,
    EventConflictError,
    HostedRoomError,
    InvalidInputError,
    LedgerCapacityError,
    LedgerPermissionError,
    LedgerStateError,
    MisuseError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    RoomProbeUnavailableError,
    StorageError,
    StoreUnavailableError,
)
from hostedrooms.models import rooms as hosted_rooms
from hostedrooms.records import EventRecord, OutboundRecord
from hostedrooms.rooms import user_event_id
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from .models import webhooks

logger = logging.getLogger("chat_service")

#: Performs one outbound call for a recorded intent and returns the receiver's response (JSON-able); raises when
#: the call failed. Injected: tests pass a fake, production :func:`http_sender`.
Sender = Callable[[OutboundRecord], Awaitable[Mapping[str, Any]]]

#: How long an outbound intent stays sendable; a retry after that is refused.
INTENT_LIFETIME = 24 * 3600

#: hostedrooms' errors by HTTP status, the first class that matches wins (subclasses before their bases).
STATUS_BY_ERROR: tuple[tuple[type[HostedRoomError], int], ...] = (
    (RoomHistoryExpiredError, 410),  # a disbanded room purged: its history is gone for good
    (RoomNotFoundError, 404),
    (LedgerCapacityError, 503),  # too many unfinished deliveries: retry once they finish
    (CapacityExceededError, 507),  # a limit of this host (active rooms, bytes): nothing written
    (RoomConflictError, 409),  # an id reused for other content...
    (EventConflictError, 409),
    (LedgerStateError, 409),  # ...a ledger request id too
    (AuthorityConflictError, 409),  # this service no longer holds the room's authority
    (StoreUnavailableError, 503),  # transient: retry later
    (RoomProbeUnavailableError, 503),
    (StorageError, 500),  # configuration, integrity, the rest: an operator must look
    (LedgerPermissionError, 500),  # the ledger's files are unsafe: an operator must look
    (MisuseError, 500),  # a bug in this service
    (InvalidInputError, 400),  # the client's input was refused (``field`` names it)
    (HostedRoomError, 400),
)


async def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The one place hostedrooms' errors become HTTP responses: ``{"error": class name, "detail": message}``."""
    status = next((code for cls, code in STATUS_BY_ERROR if isinstance(exc, cls)), 500)
    if status == 500:  # the details are for the operator's log, not the client
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    body: dict[str, Any] = {"error": type(exc).__name__, "detail": "internal error" if status == 500 else str(exc)}
    if isinstance(exc, InvalidInputError) and exc.field is not None:
        body["field"] = exc.field
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)


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
    app.add_exception_handler(HostedRoomError, error_response)
    _routes(app, service)
    return app


def from_environment() -> FastAPI:
    """``uvicorn --factory chat_service:from_environment``: the database from ``$CHAT_SERVICE_DATABASE`` (default
    ``var/chat.db``: on SQLite the ledger makes the file's folder owner-private), webhooks sent over HTTP."""
    return create_app(os.environ.get("CHAT_SERVICE_DATABASE", "var/chat.db"), sender=http_sender())


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
    async def read(room_id: str, since_seq: int = 0, limit: int = 100) -> JSONResponse:
        """One page of the log after ``since_seq``; pass ``cursor`` back as ``since_seq`` while ``has_more``."""
        return JSONResponse(dict(await aio.rooms.read_events(engine, room_id=room_id, since_seq=since_seq,
                                                             limit=limit)))

    @app.get("/rooms/{room_id}/stream")
    async def stream(
        room_id: str, since_seq: Annotated[int, Query(ge=0)] = 0,
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
        raise HTTPException(409, f"room {room_id} has no webhook")
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
        raise HTTPException(410, f"webhook request {call.request_id} failed: {intent['last_error']}")
    try:
        response = await service.sender(intent)
    except Exception as exc:  # the receiver's failure: the intent stays pending, its next try scheduled
        await ledger.defer_outbound(call.request_id, f"{type(exc).__name__}: {exc}")
        raise HTTPException(502, f"webhook call failed; retry request {call.request_id}") from exc
    committed = await ledger.commit_outbound(call.request_id, response)
    assert committed is not None  # prepared above; intents are never deleted while pending
    return JSONResponse(_outcome(committed), status_code=201)


def _outcome(intent: OutboundRecord) -> dict[str, Any]:
    return {"request_id": intent["request_id"], "state": intent["state"], "response": intent["response"]}
