"""The one mapping from hostedrooms' errors to HTTP statuses (``chat_service.app.error_response``)."""

from __future__ import annotations

import json

import pytest
from hostedrooms import errors
from starlette.requests import Request

from chat_service.app import error_response

pytestmark = pytest.mark.anyio

REQUEST = Request({"type": "http", "method": "POST", "path": "/rooms", "headers": [], "query_string": b""})


@pytest.mark.parametrize(("error", "status"), [
    (errors.RoomNotFoundError("hosted room not found"), 404),
    (errors.RoomHistoryExpiredError("hosted room history expired"), 410),
    (errors.RoomConflictError("room_id belongs to a disbanded room"), 409),
    (errors.EventConflictError("event_id reused"), 409),
    (errors.AuthoritySupersededError("superseded"), 409),
    (errors.LedgerStateError("secure peer outbound intent changed"), 409),
    (errors.CapacityExceededError("too many active rooms", limit="MAX_ACTIVE_ROOMS"), 507),
    (errors.ReplicaCapacityError("replica room capacity exhausted"), 507),
    (errors.LedgerCapacityError("too many deliveries"), 503),
    (errors.InvalidInputError("limit is invalid", field="limit"), 400),
    (errors.ReplicaGapError("gap"), 400),
    (errors.StoreUnavailableError("database is locked"), 503),
    (errors.StoreIntegrityError("refused a write"), 500),
    (errors.SchemaMissingError("run `hostedrooms upgrade`"), 500),
    (errors.LedgerPermissionError("unsafe ledger file"), 500),
    (errors.MisuseError("an Engine given to hostedrooms.aio"), 500),
])
async def test_each_error_class_has_its_status(error: errors.HostedRoomError, status: int) -> None:
    response = await error_response(REQUEST, error)
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert body["error"] == type(error).__name__
    assert body["detail"] == ("internal error" if status == 500 else str(error))  # no storage details leak
    assert (response.headers.get("retry-after") == "1") is (status == 503)
