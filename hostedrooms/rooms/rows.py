"""Row mappers: the reference's room and event dicts, built from stored rows, and the replay page checks."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    HostedRoomError,
    StorageError,
)
from ..limits import Limits, in_force
from ..records import Authority, EventPage, EventRecord, RoomRecord
from ..store import RowLike
from ..validation import (
    INT64_MAX,
    json_depth_within,
    max_json_depth,
    stored_json,
    utf8_len,
)
from .rules import _event_id, _event_kind

__all__ = ["appended", "event_page_checker", "event_to_dict", "fit_page", "parse_all", "room_to_dict"]


def room_to_dict(row: RowLike, *, idempotent: bool = False) -> RoomRecord:
    """The reference's room dict; ``disbanded_at`` when set and ``latest_seq`` when ``next_seq`` was selected."""
    members = stored_json(row["members_json"], lambda: f"hosted room {row['room_id']!r}")
    result: RoomRecord = {
        "room_id": row["room_id"], "name": row["name"], "members": members,
        "authority_gateway_id": row["authority_gateway_id"], "authority_epoch": int(row["authority_epoch"]),
        "revision": int(row["revision"]), "created_at": float(row["created_at"]),
        "updated_at": float(row["updated_at"]), "idempotent": idempotent}
    if row.get("disbanded_at") is not None:
        result["disbanded_at"] = float(row["disbanded_at"])
    if "next_seq" in row:
        result["latest_seq"] = int(row["next_seq"]) - 1
    return result


def event_to_dict(row: RowLike, *, idempotent: bool = False) -> EventRecord:
    """The reference's event dict (actor and payload parsed from their canonical JSON; :func:`stored_json`)."""
    epoch = row["authority_epoch"]

    def where() -> str:
        return f"hosted room {row['room_id']!r} event seq {int(row['seq'])}"

    return {
        "room_id": row["room_id"], "seq": int(row["seq"]), "event_id": row["event_id"], "kind": row["kind"],
        "actor": stored_json(row["actor_json"], where), "authority_epoch": int(epoch) if epoch is not None else None,
        "payload": stored_json(row["payload_json"], where), "created_at": float(row["created_at"]),
        "idempotent": idempotent}


def appended(row: RowLike, actor: dict[str, str], payload: Any = None) -> EventRecord:
    """The event dict of a row this call just wrote: its normalised actor as given (never re-parsed), and its
    payload parsed from the canonical text unless the caller parsed it already."""
    return {
        "room_id": row["room_id"], "seq": row["seq"], "event_id": row["event_id"], "kind": row["kind"],
        "actor": actor, "authority_epoch": row["authority_epoch"],
        "payload": json.loads(row["payload_json"]) if payload is None else payload,
        "created_at": row["created_at"], "idempotent": False}


def parse_all(texts: Sequence[str]) -> list[Any]:
    """Parse many canonical JSON texts at once: one parser call for the lot is several times faster than one
    per text (each is a complete JSON value we wrote, so joining them makes one valid array)."""
    parsed: list[Any] = json.loads(f"[{','.join(texts)}]")
    return parsed



def event_page_checker(limits: Limits | None = None) -> Callable[[RowLike], str | None]:
    """A function telling why no replay page could ever return a stored event row (or a replica could not ingest
    it), or None when the row is fine. Used by ``verify`` on room logs and replica logs, one call per row.

    The event's id and kind must pass the append rules as stored, its actor and payload must decode within
    MAX_JSON_DEPTH, and the event alone must fit MAX_LOG_PAGE_BYTES in the largest page envelope (a cursor and
    latest_seq of 19 digits, the longest gateway id).
    """
    lim = in_force(limits)
    depth = max_json_depth()
    budget = int(lim.MAX_LOG_PAGE_BYTES) - len(json.dumps({
        "events": [], "cursor": INT64_MAX, "latest_seq": INT64_MAX, "has_more": False,
        "authority": {"gateway_id": "g" * int(lim.MAX_ACTOR_ID_CHARS), "epoch": INT64_MAX}}, separators=(",", ":")))
    # Serialised again, a decoded text grows at most 4.5 times (a float "1e15" is written 1000000000000000.0), and
    # the event's other fields (keys, room id, seq, epoch, time) take well under 1 KiB: below that, it fits.
    surely_fits = (budget - 1024) // 5

    def problem(row: RowLike) -> str | None:
        for label, value, validate in (("event_id", row["event_id"], _event_id), ("kind", row["kind"], _event_kind)):
            try:
                if validate(value, lim) != value:
                    return f"its {label} does not pass the append rules"
            except HostedRoomError:
                return f"its {label} does not pass the append rules"
        texts = (row["actor_json"], row["payload_json"])
        for column, text in zip(("actor_json", "payload_json"), texts, strict=True):
            if not isinstance(text, str) or not json_depth_within(text, depth):
                return f"its {column} is not JSON within {depth} levels of nesting"
        try:
            if utf8_len(row["room_id"], row["event_id"], row["kind"], *texts) <= surely_fits:
                json.loads(texts[0])
                json.loads(texts[1])
                return None
            event = json.dumps(event_to_dict(row), ensure_ascii=False, separators=(",", ":"))
        except (StorageError, RecursionError, ValueError, TypeError):
            return "its actor or payload cannot be decoded"
        return "it alone exceeds the replay page limit" if utf8_len(event) > budget else None

    return problem


def _unserialisable(room_id: str, page: Sequence[EventRecord]) -> StorageError:
    """The error for a page that decoded but cannot be serialised (RecursionError), naming the first culprit."""
    for event in page:
        try:
            json.dumps(event)
        except RecursionError:
            return StorageError(f"hosted room {room_id!r} event seq {event['seq']} holds a stored value that "
                                "cannot be decoded (RecursionError)")
    return StorageError(f"hosted room {room_id!r} holds a stored value that cannot be decoded (RecursionError)")


def fit_page(
    room_id: str, events: list[EventRecord], *, since: int, latest_seq: int, authority: Authority,
    max_bytes: int,
) -> EventPage:
    """The replay page of ``events`` (read after ``since``): its longest prefix whose serialized page fits
    ``max_bytes``. An event too large for any page raises HostedRoomError (an empty page with ``has_more``
    would make a reader spin forever)."""

    def build(page: list[EventRecord]) -> EventPage:
        cursor = page[-1]["seq"] if page else since
        return {"events": page, "cursor": cursor, "latest_seq": latest_seq, "has_more": cursor < latest_seq,
                "authority": authority}

    def fits(page: list[EventRecord]) -> bool:
        try:
            text = json.dumps(build(page), ensure_ascii=False, separators=(",", ":"))
        except RecursionError:  # a decodable but very deep value stored before MAX_JSON_DEPTH (or by the reference)
            raise _unserialisable(room_id, page) from None
        return utf8_len(text) <= max_bytes

    if events and not fits(events):
        # Binary-search the largest prefix whose serialized page fits the budget.
        low, high = 1, len(events)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(events[:middle]) else (low, middle - 1)
        events = events[:low]
        if not fits(events):
            raise HostedRoomError("hosted room event exceeds replay page limit")
    elif not events and since < latest_seq:
        # The next event alone outweighs a page (only with a lowered MAX_LOG_PAGE_BYTES).
        raise HostedRoomError("hosted room event exceeds replay page limit")
    return build(events)
