"""Pages over HTTP: serve a :class:`PageSource` from a gateway, and read one as a standby.

The four calls of :class:`~hostedrooms.standby.source.PageSource` map to four GET requests, each answered
with one JSON object (``Content-Type: application/json``):

====================================================  ==========================================================
``GET {base}/rooms?after=ID&limit=N``                  ``{"rooms": [{"room_id", "authority_gateway_id",
                                                       "authority_epoch", "latest_seq", "disbanded"}, ...]}``
``GET {base}/rooms/{room_id}``                         ``{"room_id", "name", "members"}``
``GET {base}/rooms/{room_id}/events?since_seq=S&limit=N``  the authority's ``read_events`` page, verbatim (its
                                                       ``lineage`` included)
``GET {base}/change``                                   ``{"token": "..."}`` (or ``null``: cannot tell)
====================================================  ==========================================================

Errors are ``{"error": CODE, "message": TEXT}`` with 404 (``room_not_found``, ``room_history_expired``,
``not_found``), 400 (``bad_request``: the authority refused the arguments), 503 (``unavailable``) or 500.

A gateway mounts :func:`answer` in its own HTTP stack behind its own authentication (it takes the path and
query below the mount point and returns the status and body); :class:`PageServer` is a small standard-library
server around it (``hostedrooms serve-pages``): it requires a bearer token beyond loopback and can speak TLS
(:mod:`~hostedrooms.standby.auth`). Both live in :mod:`~hostedrooms.standby.server` and are importable from here.
:class:`HttpPageSource` is the standby's client: it sends the token, and trusts nothing it receives (bounded
sizes and time, JSON only, every shape checked; ``ingest_page`` then validates every event as the authority's
own append rules would).
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Hashable, Mapping
from typing import Any

from .. import limits as default_limits
from ..errors import HostedRoomError, RoomHistoryExpiredError, RoomNotFoundError
from ..limits import Limits, check_limits
from ..lineage import check_lineage
from ..validation import INT64_MAX, identifier, json_depth_within, max_json_depth
from .auth import PageToken, page_token
from .heads import LISTING_PAGE, RoomHead
from .server import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SEND_TIMEOUT,
    JSON_TYPE,
    MAX_MESSAGE_CHARS,
    PageServer,
    answer,
)
from .source import (
    RoomInfo,
    SourceAuthenticationError,
    SourceProtocolError,
    SourceUnavailableError,
)

# The server's side lives in .server; imported from here too, as before it moved.
__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SEND_TIMEOUT",
    "HttpPageSource",
    "PageServer",
    "answer",
]

_JSON = JSON_TYPE
_EXPIRED_MESSAGE = "Group Chat history expired; room_id remains permanently retired"
_MAX_MESSAGE_CHARS = MAX_MESSAGE_CHARS


# --- the standby's side ----------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class HttpPageSource:
    """A :class:`PageSource` reading a gateway's page endpoints over HTTP(S) (one keep-alive connection).

    ``base_url``: ``http://host:port/prefix`` (no credentials, query or fragment). ``token``: the server's
    bearer token (str or bytes, see :mod:`~hostedrooms.standby.auth`), sent as ``Authorization: Bearer ...``
    on every request and shown nowhere (not in :meth:`describe`, messages or ``repr``); a 401 or 403 raises
    :class:`~hostedrooms.standby.source.SourceAuthenticationError`. ``headers``: more request headers (another
    scheme of authentication; not with ``token``). ``ssl_context``: for ``https://``, the default verifies the
    server's certificate against the system's CAs (:func:`~hostedrooms.standby.auth.client_tls_context` takes a
    CA file of your own). ``timeout``: seconds for a whole request, however slowly the
    peer sends. ``max_response_bytes``: the largest answer read (default: MAX_LOG_PAGE_BYTES plus 1 MiB, since a
    page fits MAX_LOG_PAGE_BYTES as JSON and members fit MAX_MEMBERS_JSON_BYTES). Redirects are not followed.
    Thread-safe (requests are serialised).

    :param base_url: the page server's URL.
    :param timeout: seconds for a whole request.
    :param max_response_bytes: the largest answer read, or None for the default.
    :param headers: more request headers, or None.
    :param ssl_context: the TLS context for ``https://``, or None for the default.
    :param limits: the limits pages are checked against (default: :mod:`hostedrooms.limits`).
    :param token: the server's bearer token, or None.
    :raises HostedRoomError: an argument is invalid.
    :raises InvalidInputError: ``token`` or ``limits`` is invalid.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        max_response_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits | None = None,
        token: PageToken | str | bytes | None = None,
    ) -> None:
        if not isinstance(base_url, str):
            raise HostedRoomError(f"the page source URL must be a string, not {type(base_url).__name__}")
        if (headers is not None and not isinstance(headers, Mapping)) or (ssl_context is not None and not isinstance(
                ssl_context, ssl.SSLContext)):
            raise HostedRoomError("headers must be None or a mapping, ssl_context None or an ssl.SSLContext")
        if max_response_bytes is not None and (type(max_response_bytes) is not int or max_response_bytes < 1):
            raise HostedRoomError("max_response_bytes must be None or a positive int")
        if limits is not None:
            check_limits(limits)
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HostedRoomError("the page source URL must be http:// or https:// with a host")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise HostedRoomError("the page source URL must not carry credentials, a query or a fragment "
                                  "(pass headers= for authentication)")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise HostedRoomError("timeout must be a positive number of seconds")
        for key, value in (headers or {}).items():
            if not (isinstance(key, str) and isinstance(value, str) and key.isascii() and key.isprintable()
                    and ":" not in key and "\r" not in value and "\n" not in value):
                raise HostedRoomError("headers must map header names to single-line strings")
        self._token = page_token(token)
        if self._token is not None and any(key.lower() == "authorization" for key in headers or {}):
            raise HostedRoomError("pass the page token as token= or as an Authorization header, not both")
        self.limits = default_limits if limits is None else limits
        self.max_response_bytes = (int(self.limits.MAX_LOG_PAGE_BYTES) + (1 << 20) if max_response_bytes is None
                                   else int(max_response_bytes))
        self.timeout = float(timeout)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": _JSON, **dict(headers or {})}
        self._ssl = ssl_context
        self._described = f"{parts.scheme}://{parts.netloc}{self._prefix}"
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None

    # -- the protocol --

    def list_rooms(self, *, after: str | None = None, limit: int = LISTING_PAGE) -> list[RoomHead]:
        """The peer's listing page: its room ids checked (identifiers, ascending after ``after``, at most
        ``limit``); every other field of a head as the peer sent it (see :meth:`_head`).

        :param after: list the rooms whose id sorts after this one (None: from the first).
        :param limit: the most rooms to list.
        :returns: the room heads, in room id order.
        :raises SourceUnavailableError: the peer could not be reached or did not answer in time.
        :raises SourceAuthenticationError: the peer refused this standby's token.
        :raises SourceProtocolError: the answer is not a valid listing.
        """
        query = {"limit": str(limit)} | ({"after": after} if after is not None else {})
        answer = self._get("/rooms", query)
        rooms = answer.get("rooms")
        if not isinstance(rooms, list) or len(rooms) > limit:
            raise SourceProtocolError("the source's room listing is malformed")
        heads: list[RoomHead] = []
        for raw in rooms:
            head = self._head(raw)
            if (heads and not head.room_id > heads[-1].room_id) or (after is not None and not head.room_id > after):
                raise SourceProtocolError("the source listed rooms out of order")
            heads.append(head)
        return heads

    def room_info(self, room_id: str) -> RoomInfo:
        answer = self._get(f"/rooms/{_quote(room_id)}", {})
        if answer.get("room_id") != room_id or not isinstance(answer.get("name"), str) \
                or not isinstance(answer.get("members"), list):
            raise SourceProtocolError("the source's room answer is malformed")
        return RoomInfo(room_id, answer["name"], answer["members"])

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        page = self._get(f"/rooms/{_quote(room_id)}/events", {"since_seq": str(since_seq), "limit": str(limit)})
        events = page.get("events")
        if (not isinstance(events, list) or len(events) > limit or not isinstance(page.get("authority"), dict)
                or not _int_within(page.get("latest_seq"), 0, INT64_MAX)
                or not _int_within(page.get("cursor"), 0, INT64_MAX)
                or not isinstance(page.get("has_more"), bool)):
            raise SourceProtocolError("the source's page is malformed")
        if page.get("lineage") is not None:  # absent from a source that predates lineages
            check_lineage(page["lineage"], error=SourceProtocolError, label="the source's page.lineage")
        return page

    def change_token(self) -> Hashable | None:
        try:
            token = self._get("/change", {}).get("token")
        except HostedRoomError:
            return None
        return token if isinstance(token, str) and len(token) <= 200 else None

    def describe(self) -> str:
        return self._described

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    # -- checks --

    def _head(self, raw: Any) -> RoomHead:
        """One listed room. Its ``room_id`` is checked here (the walk's order rests on it: a bad one refuses the
        listing); its other fields are passed on as the peer sent them, for the caller to check room by room (the
        :class:`~hostedrooms.standby.replicator.Replicator` refuses a room whose head is invalid, naming the field,
        and goes on with the others)."""
        if not isinstance(raw, dict):
            raise SourceProtocolError("the source's room listing is malformed")
        room_id = _exact_identifier(raw.get("room_id"), "room_id", int(self.limits.MAX_ROOM_ID_CHARS))
        gateway: Any = raw.get("authority_gateway_id")
        epoch: Any = raw.get("authority_epoch")
        latest: Any = raw.get("latest_seq")
        disbanded: Any = raw.get("disbanded")
        return RoomHead(room_id, gateway, epoch, latest, disbanded)

    # -- transport --

    def _get(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        target = self._prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with self._lock:
            deadline = time.monotonic() + self.timeout
            for attempt in (1, 2):
                reused = self._connection is not None
                try:
                    status, content_type, body = self._exchange(target, deadline)
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    self._disconnect()
                    if attempt == 2 or not reused:  # a kept-alive connection the peer closed: one fresh try
                        raise SourceUnavailableError(f"page source {self._described}: {type(exc).__name__}") from None
                except SourceProtocolError:
                    self._disconnect()
                    raise
                except (OSError, http.client.HTTPException) as exc:
                    self._disconnect()
                    raise SourceUnavailableError(f"page source {self._described}: {type(exc).__name__}") from None
        return self._decode(status, content_type, body)

    def _exchange(self, target: str, deadline: float) -> tuple[int, str, bytes]:
        connection = self._connection
        if connection is None:
            remaining = max(deadline - time.monotonic(), 0.001)
            connection = (http.client.HTTPSConnection(self._host, self._port, timeout=remaining,
                                                      context=self._ssl or ssl.create_default_context())
                          if self._https else http.client.HTTPConnection(self._host, self._port, timeout=remaining))
            self._connection = connection
        # Socket timeouts bound each read, not a whole answer trickled a byte at a time: a watchdog shuts the
        # socket down at the deadline, which ends any read in progress.
        expired = threading.Event()
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), _shut, (connection, expired))
        watchdog.daemon = True
        watchdog.start()
        try:
            answer = self._request(connection, target, deadline)
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError("the source did not answer in time") from None
            raise
        finally:
            watchdog.cancel()
        if expired.is_set():  # the shutdown may have looked like the end of the answer
            raise TimeoutError("the source did not answer in time")
        return answer

    def _request(self, connection: http.client.HTTPConnection, target: str,
                 deadline: float) -> tuple[int, str, bytes]:
        if connection.sock is not None:
            connection.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        headers = self._headers if self._token is None else {**self._headers, "Authorization": self._token.header()}
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
        declared = response.getheader("Content-Length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_response_bytes):
            raise SourceProtocolError(f"the source's answer exceeds {self.max_response_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_response_bytes:
                raise SourceProtocolError(f"the source's answer exceeds {self.max_response_bytes} bytes")
            chunks.append(chunk)
        if response.length:  # the peer closed before sending what it declared
            raise http.client.IncompleteRead(b"".join(chunks), response.length)
        response.close()  # fully read: the connection can carry the next request
        if response.will_close:
            self._disconnect()
        return response.status, response.getheader("Content-Type", ""), b"".join(chunks)

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _decode(self, status: int, content_type: str, body: bytes) -> dict[str, Any]:
        if status in (401, 403):  # whatever the body (a proxy's page, or the server's): the same remedy
            raise SourceAuthenticationError(self._refusal(status))
        if content_type.split(";")[0].strip().lower() != _JSON:
            raise SourceProtocolError(f"the source answered {status} with a body that is not JSON")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise SourceProtocolError("the source's answer is not valid JSON (not UTF-8)") from None
        # A page nests 3 levels above an event's payload, which nests at most MAX_JSON_DEPTH: anything deeper is
        # refused before the parser recurses into it.
        if not json_depth_within(text, max_json_depth() + 8):
            raise SourceProtocolError("the source's answer nests too deeply")
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise SourceProtocolError(f"the source's answer is not valid JSON ({exc.__class__.__name__})") from None
        if not isinstance(value, dict):
            raise SourceProtocolError("the source's answer is not a JSON object")
        if status == 200:
            return value
        code = value.get("error")
        message = value.get("message")
        message = message[:_MAX_MESSAGE_CHARS] if isinstance(message, str) else ""
        if status == 404 and code == "room_history_expired":
            raise RoomHistoryExpiredError(_EXPIRED_MESSAGE)
        if status == 404 and code == "room_not_found":
            raise RoomNotFoundError("hosted room not found")
        if status in (407, 429) or status >= 500:
            raise SourceUnavailableError(f"page source {self._described} answered {status}")
        raise SourceProtocolError(f"the source refused the request ({status}): {message}")


    def _refusal(self, status: int) -> str:
        named = f"page source {self._described} answered {status}"
        if status == 403:
            return f"{named}: access refused"
        if self._token is None:
            return (f"{named}: it requires a token, and none was given (token=; the command line reads "
                    "--token-file or $HOSTEDROOMS_PAGE_TOKEN)")
        return f"{named}: it refused the token (not the one the server holds)"


def _shut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    expired.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def _quote(room_id: str) -> str:
    return urllib.parse.quote(room_id, safe="")


def _int_within(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _malformed(message: str) -> SourceProtocolError:
    return SourceProtocolError(f"the source's room listing is malformed: {message}")


def _exact_identifier(value: Any, label: str, max_chars: int) -> str:
    checked = identifier(value, error=_malformed, label=label, max_chars=max_chars)
    if checked != value:
        raise _malformed(f"invalid {label}")
    return checked
