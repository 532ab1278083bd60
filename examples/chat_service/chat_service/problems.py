"""Every error the service answers, in one shape: RFC 9457 problem details (``application/problem+json``).

A body has ``type`` (a URI naming the kind of problem; a client branches on it), ``title`` (that kind in words,
the same every time), ``status`` (the HTTP status, repeated), ``detail`` (this occurrence in words) and
``instance`` (the request's path). Extension members add what a client can act on: ``field`` (the input that was
refused) and ``limit`` (the capacity limit that was reached).

Three sources, one shape: hostedrooms' error classes (:data:`PROBLEM_BY_ERROR`, the one mapping from a class to a
status), the service's own :class:`Problem`, and the framework's own errors (FastAPI's request validation, which
is the same ``invalid-input`` problem as hostedrooms' :class:`~hostedrooms.errors.InvalidInputError`, and
Starlette's 404/405 for an unknown route, ``about:blank``). A 5xx that an operator must look at says no more than
its title: its message and traceback go to the log. No ``detail`` carries a credential of a URL.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("chat_service")

#: The media type of every error body (RFC 9457, section 3).
PROBLEM_JSON = "application/problem+json"

#: Where this service's problem type URIs start: ``tag:`` URIs (RFC 4151) name a type without promising a page
#: behind it (``.example`` is reserved for examples: a real service puts a domain of its own here).
TYPE_BASE = "tag:chat-service.example,2026:problem:"


@dataclass(frozen=True)
class ProblemType:
    """One kind of problem: its status and title, and whether an occurrence's own message is shown as ``detail``
    (``public``) or only the title is, the message going to the log (an operator's problem, or a message that may
    name the database's host)."""

    name: str
    status: int
    title: str
    public: bool = True

    @property
    def uri(self) -> str:
        """``about:blank`` for a kind without a name: the status says it all (RFC 9457, section 4.2.1)."""
        return TYPE_BASE + self.name if self.name else "about:blank"


INVALID_INPUT = ProblemType("invalid-input", 400, "Invalid input")
REFUSED = ProblemType("refused", 400, "Request refused")
ROOM_NOT_FOUND = ProblemType("room-not-found", 404, "Room not found")
ROOM_HISTORY_EXPIRED = ProblemType("room-history-expired", 410, "Room history expired")
ROOM_CONFLICT = ProblemType("room-conflict", 409, "Room id already used")
EVENT_CONFLICT = ProblemType("event-conflict", 409, "Event id already used")
LEDGER_CONFLICT = ProblemType("request-conflict", 409, "Request id already used")
AUTHORITY_CONFLICT = ProblemType("authority-conflict", 409, "Room served by another gateway")
CAPACITY_EXCEEDED = ProblemType("capacity-exceeded", 507, "Capacity exceeded")
DELIVERIES_FULL = ProblemType("deliveries-full", 503, "Too many unfinished deliveries")
STORE_UNAVAILABLE = ProblemType("store-unavailable", 503, "Database unavailable, retry later", public=False)
PROBE_UNAVAILABLE = ProblemType("probe-unavailable", 503, "Room state unavailable, retry later", public=False)
INTERNAL = ProblemType("internal-error", 500, "Internal error", public=False)
WEBHOOK_MISSING = ProblemType("webhook-missing", 409, "Room has no webhook")
WEBHOOK_GONE = ProblemType("webhook-request-gone", 410, "Webhook request failed for good")
WEBHOOK_FAILED = ProblemType("webhook-failed", 502, "Webhook receiver failed")

#: hostedrooms' errors by problem type (and so by HTTP status); the first class that matches wins (subclasses
#: before their bases).
PROBLEM_BY_ERROR: tuple[tuple[type[HostedRoomError], ProblemType], ...] = (
    (RoomHistoryExpiredError, ROOM_HISTORY_EXPIRED),  # 410: a disbanded room purged, its history gone for good
    (RoomNotFoundError, ROOM_NOT_FOUND),  # 404
    (LedgerCapacityError, DELIVERIES_FULL),  # 503: too many unfinished deliveries, retry once they finish
    (CapacityExceededError, CAPACITY_EXCEEDED),  # 507: a limit of this host (active rooms, bytes), nothing written
    (RoomConflictError, ROOM_CONFLICT),  # 409: an id reused for other content...
    (EventConflictError, EVENT_CONFLICT),
    (LedgerStateError, LEDGER_CONFLICT),  # ...a ledger request id too
    (AuthorityConflictError, AUTHORITY_CONFLICT),  # 409: this service no longer holds the room's authority
    (StoreUnavailableError, STORE_UNAVAILABLE),  # 503: transient, retry later
    (RoomProbeUnavailableError, PROBE_UNAVAILABLE),  # 503
    (StorageError, INTERNAL),  # 500: configuration, integrity, the rest: an operator must look
    (LedgerPermissionError, INTERNAL),  # 500: the ledger's files are unsafe
    (MisuseError, INTERNAL),  # 500: a bug in this service
    (InvalidInputError, INVALID_INPUT),  # 400: the client's input was refused (``field`` names it)
    (HostedRoomError, REFUSED),  # 400
)


class Problem(Exception):
    """An error of the service's own, answered as a problem of ``kind`` with ``detail``."""

    def __init__(self, kind: ProblemType, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


#: ``scheme://user:password@``: the password is replaced before any message becomes a ``detail``.
_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")


def redact(text: str) -> str:
    """``text`` with the password of any URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(r"\1:***@", text)


def problem_response(request: Request, kind: ProblemType, detail: str | None = None, *,
                     headers: Mapping[str, str] | None = None, **extensions: Any) -> JSONResponse:
    """The response for one occurrence of ``kind``: ``detail`` shown only for a public kind, redacted; extension
    members that are None left out; ``Retry-After`` on every 503."""
    body: dict[str, Any] = {"type": kind.uri, "title": kind.title, "status": kind.status,
                            "detail": redact(detail) if kind.public and detail else kind.title,
                            "instance": request.url.path}
    body.update({name: value for name, value in extensions.items() if value is not None})
    all_headers = {"Retry-After": "1"} if kind.status == 503 else {}
    all_headers.update(headers or {})
    return JSONResponse(body, status_code=kind.status, headers=all_headers, media_type=PROBLEM_JSON)


def problem_for(exc: HostedRoomError) -> ProblemType:
    """The problem type of one of hostedrooms' errors (:data:`PROBLEM_BY_ERROR`)."""
    return next(kind for cls, kind in PROBLEM_BY_ERROR if isinstance(exc, cls))


async def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The one place hostedrooms' errors become HTTP responses."""
    assert isinstance(exc, HostedRoomError)
    kind = problem_for(exc)
    if not kind.public:  # the message is for the operator's log, not the client
        logger.log(logging.ERROR if kind.status == 500 else logging.WARNING, "%s %s failed: %s", request.method,
                   request.url.path, kind.title, exc_info=exc)
    return problem_response(request, kind, str(exc), field=getattr(exc, "field", None),
                            limit=getattr(exc, "limit", None))


async def service_problem(request: Request, exc: Exception) -> JSONResponse:
    """The service's own :class:`Problem`."""
    assert isinstance(exc, Problem)
    return problem_response(request, exc.kind, exc.detail)


async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's request validation: the same ``invalid-input`` problem (400) as hostedrooms' own refusal, its
    first refused input as ``field``, every one in ``detail`` (messages only: the input itself is not echoed)."""
    assert isinstance(exc, RequestValidationError)
    errors: Sequence[Mapping[str, Any]] = exc.errors()
    fields = [_field(error.get("loc", ())) for error in errors]
    detail = "; ".join(f"{field}: {error.get('msg', 'invalid')}" for field, error in zip(fields, errors, strict=True))
    return problem_response(request, INVALID_INPUT, detail or "the request is invalid",
                            field=fields[0] if fields else None)


async def http_problem(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own HTTP errors (no such route: 404; method not allowed: 405, with ``Allow``): ``about:blank``
    problems, titled by the status's phrase."""
    assert isinstance(exc, StarletteHTTPException)
    kind = ProblemType("", exc.status_code, HTTPStatus(exc.status_code).phrase, public=exc.status_code < 500)
    return problem_response(request, kind, str(exc.detail), headers=exc.headers)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    """Any other exception: a bug. The server logs its traceback; the client reads the title alone."""
    return problem_response(request, INTERNAL)


def install(app: FastAPI) -> None:
    """Answer every error of ``app`` as a problem."""
    app.add_exception_handler(HostedRoomError, error_response)
    app.add_exception_handler(Problem, service_problem)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_problem)
    app.add_exception_handler(Exception, unexpected_error)


def _field(loc: Sequence[Any]) -> str:
    """The input a validation error names: ``since_seq``, ``last-event-id``, ``members[0].id``; ``body`` for the
    body as a whole (missing, or not JSON)."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "path", "header", "cookie") else list(loc)
    if loc and loc[0] == "body" and parts and isinstance(parts[-1], int) and len(parts) == 1:
        parts = []  # a JSON decode error: loc is ("body", position)
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or str(loc[0] if loc else "request")

