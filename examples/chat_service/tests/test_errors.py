"""The one mapping from hostedrooms' errors to HTTP statuses and problem types
(``chat_service.problems.error_response``), and what a body never carries: a password, a traceback, an
operator's message."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from fastapi.responses import JSONResponse
from hostedrooms import errors
from starlette.requests import Request

from chat_service.problems import PROBLEM_JSON, TYPE_BASE, error_response, unexpected_error

pytestmark = pytest.mark.anyio

REQUEST = Request({"type": "http", "method": "POST", "path": "/rooms", "headers": [], "query_string": b""})
MEMBERS = {"type", "title", "status", "detail", "instance"}


def _problem(response: JSONResponse, status: int) -> dict[str, Any]:
    assert response.status_code == status
    assert response.media_type == PROBLEM_JSON
    body: dict[str, Any] = json.loads(bytes(response.body))
    assert body["status"] == status
    assert body["instance"] == "/rooms"
    assert (response.headers.get("retry-after") == "1") is (status == 503)
    return body


@pytest.mark.parametrize(("error", "status", "kind"), [
    (errors.RoomNotFoundError("hosted room not found"), 404, "room-not-found"),
    (errors.RoomHistoryExpiredError("hosted room history expired"), 410, "room-history-expired"),
    (errors.RoomConflictError("room_id belongs to a disbanded room"), 409, "room-conflict"),
    (errors.EventConflictError("event_id reused"), 409, "event-conflict"),
    (errors.AuthoritySupersededError("superseded"), 409, "authority-conflict"),
    (errors.LedgerStateError("secure peer outbound intent changed"), 409, "request-conflict"),
    (errors.CapacityExceededError("too many active rooms", limit="MAX_ACTIVE_ROOMS"), 507, "capacity-exceeded"),
    (errors.ReplicaCapacityError("replica room capacity exhausted"), 507, "capacity-exceeded"),
    (errors.LedgerCapacityError("too many deliveries"), 503, "deliveries-full"),
    (errors.InvalidInputError("limit is invalid", field="limit"), 400, "invalid-input"),
    (errors.ReplicaGapError("gap"), 400, "refused"),
    (errors.StoreUnavailableError("database is locked"), 503, "store-unavailable"),
    (errors.StoreIntegrityError("refused a write"), 500, "internal-error"),
    (errors.SchemaMissingError("run `hostedrooms upgrade`"), 500, "internal-error"),
    (errors.LedgerPermissionError("unsafe ledger file"), 500, "internal-error"),
    (errors.MisuseError("an Engine given to hostedrooms.aio"), 500, "internal-error"),
])
async def test_each_error_class_has_its_status_and_problem(
        error: errors.HostedRoomError, status: int, kind: str) -> None:
    body = _problem(await error_response(REQUEST, error), status)
    assert body["type"] == TYPE_BASE + kind
    operators = status == 500 or kind == "store-unavailable"
    assert body["detail"] == (body["title"] if operators else str(error))  # no storage details leak
    extensions = {key: body[key] for key in body.keys() - MEMBERS}
    expected = {"field": "limit"} if kind == "invalid-input" else {}
    if isinstance(error, errors.CapacityExceededError) and error.limit is not None:
        expected = {"limit": error.limit}
    assert extensions == expected


async def test_a_password_never_reaches_a_detail(caplog: pytest.LogCaptureFixture) -> None:
    shown = await error_response(REQUEST, errors.InvalidInputError(
        "target postgresql://chat:s3cret@db.internal/chat refused", field="target"))
    assert "s3cret" not in _problem(shown, 400)["detail"]
    assert "postgresql://chat:***@db.internal/chat" in _problem(shown, 400)["detail"]
    with caplog.at_level(logging.WARNING, "chat_service"):
        hidden = await error_response(REQUEST, errors.StoreUnavailableError(
            "connection to postgresql://chat:s3cret@db.internal/chat failed"))
    body = _problem(hidden, 503)
    assert "s3cret" not in json.dumps(body) and "db.internal" not in body["detail"]
    assert "db.internal" in caplog.text  # the operator's log keeps the message


async def test_an_unexpected_exception_is_an_internal_error_without_its_message() -> None:
    try:
        raise RuntimeError("password=s3cret in a stack frame")
    except RuntimeError as exc:
        body = _problem(await unexpected_error(REQUEST, exc), 500)
    assert body["type"] == TYPE_BASE + "internal-error"
    assert body["detail"] == body["title"] == "Internal error"
