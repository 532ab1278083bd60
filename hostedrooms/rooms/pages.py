"""Row mappers: the reference's room and event dicts, built from stored rows, and the replay page checks."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from json.scanner import make_scanner
from operator import itemgetter
from typing import Any

from ..errors import (
    HostedRoomError,
    StorageError,
)
from ..limits import Limits, in_force
from ..records import Authority, EventRecord, ReplayPage, RoomRecord
from ..store import REPLAY_COLUMNS, RowLike
from ..validation import (
    INT64_MAX,
    decode_json,
    json_depth_within,
    max_json_depth,
    stored_json,
    surely_shallow,
    utf8_len,
)
from .rules import _event_id, _event_kind

__all__ = [
    "appended", "decode_rows", "event_page_checker", "event_to_dict", "fit_page", "parse_all", "replay_page",
    "room_to_dict"]


def room_to_dict(row: RowLike, *, idempotent: bool = False) -> RoomRecord:
    """The reference's room dict; ``disbanded_at`` when set and ``latest_seq`` when ``next_seq`` was selected.

    :param row: a stored room row.
    :param idempotent: the result's ``idempotent`` flag.
    :returns: the room record.
    :raises StorageError: the stored members cannot be decoded.
    """
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
    """The reference's event dict (actor and payload parsed from their canonical JSON; :func:`stored_json`).

    :param row: a stored event row.
    :param idempotent: the result's ``idempotent`` flag.
    :returns: the event record.
    :raises StorageError: the stored actor or payload cannot be decoded.
    """
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
        "payload": decode_json(row["payload_json"]) if payload is None else payload,
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


def _page(events: list[EventRecord], cursor: int, latest_seq: int, authority: Authority) -> ReplayPage:
    return {"events": events, "cursor": cursor, "latest_seq": latest_seq, "has_more": cursor < latest_seq,
            "authority": authority}


def fit_page(
    room_id: str, events: list[EventRecord], *, since: int, latest_seq: int, authority: Authority,
    max_bytes: int,
) -> ReplayPage:
    """The replay page of ``events`` (read after ``since``): its longest prefix whose serialized page fits
    ``max_bytes``. An event too large for any page raises HostedRoomError (an empty page with ``has_more``
    would make a reader spin forever). The exact rule, serialising the page: :func:`replay_page` gives the same
    page without serialising it when a bound proves it fits, or when measuring its events finds the cut."""

    def build(page: list[EventRecord]) -> ReplayPage:
        return _page(page, page[-1]["seq"] if page else since, latest_seq, authority)

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


class _NoSize(Exception):
    """Internal: a value :func:`_json_size` does not measure (json.dumps would decide, or refuse it)."""


#: The event members decoded from stored texts (the others are the row's own columns).
_DECODED_KEYS = frozenset({"actor", "payload"})
#: An event's members, and what its object takes besides their values: braces, commas, quoted keys and colons.
_EVENT_KEYS = {"room_id": 0, "seq": 0, "event_id": 0, "kind": 0, "actor": 0, "authority_epoch": 0, "payload": 0,
               "created_at": 0, "idempotent": 0}.keys()
_EVENT_KEYS_SIZE = 1 + 2 * len(_EVENT_KEYS) + sum(len(key) + 2 for key in _EVENT_KEYS)
_FLOAT_WORDS = {math.inf: len("Infinity"), -math.inf: len("-Infinity")}


#: How deep :func:`_json_size` measures: what the append rules accept (MAX_JSON_DEPTH's default); deeper values
#: (stored by the reference) go to the exact rule, which also knows when json.dumps itself gives up on one.
_MEASURED_DEPTH = 64


def _json_size(value: Any, depth: int = _MEASURED_DEPTH, plain: bool = False) -> int:
    """The UTF-8 length of ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` for decoded JSON,
    counted without writing it; :class:`_NoSize` for anything else (a string that needs an escape, a value of
    another type, a lone surrogate, a value nested deeper than ``depth``). ``plain``: the value was decoded from
    a text without a backslash, so none of its strings needs an escape (JSON writes each such character escaped)
    and looking for one is skipped."""
    kind = value.__class__
    if kind is str:
        if not plain and _NEEDS_ESCAPE(value) is not None:
            raise _NoSize
        try:
            return 2 + (len(value) if value.isascii() else len(value.encode("utf-8")))
        except UnicodeEncodeError:
            raise _NoSize from None
    if kind is dict or kind is list:
        if depth <= 0:
            raise _NoSize
        if not value:
            return 2
        size = 1 + len(value)  # the brackets and the commas between items (a dict: and a colon per member)
        if kind is list:
            return size + sum(_json_size(item, depth - 1, plain) for item in value)
        size += len(value)
        for key, member in value.items():
            if key.__class__ is not str:
                raise _NoSize
            size += _json_size(key, depth, plain) + _json_size(member, depth - 1, plain)
        return size
    if kind is int:
        return len(int.__repr__(value))  # (ValueError past the digit limit: json.dumps would raise it too)
    if kind is float:
        return len(float.__repr__(value)) if math.isfinite(value) else _FLOAT_WORDS.get(value, len("NaN"))
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    raise _NoSize


def _event_sizes(events: list[EventRecord], plain: Sequence[bool] | None = None) -> list[int] | None:
    """Each event's serialized length in UTF-8 bytes as a page writes it (a list is written as its items joined by
    commas, each exactly as written alone), or None when one is not measured (the exact search then decides).

    Measured (:func:`_json_size`), which costs a step per value instead of a pass over every character.
    ``plain[i]``: event i's actor and payload were decoded from texts without a backslash.
    """
    sizes = []
    try:
        for index, event in enumerate(events):
            easy = plain is not None and plain[index]
            if event.__class__ is not dict or event.keys() != _EVENT_KEYS:
                raise _NoSize
            size = _EVENT_KEYS_SIZE  # the braces, commas, keys and colons
            for key, value in event.items():
                size += _json_size(value, plain=easy and key in _DECODED_KEYS)
            sizes.append(size)
    except (_NoSize, RecursionError, ValueError, TypeError):
        return None
    return sizes


def _longest_fitting(
    events: list[EventRecord], sizes: list[int], latest_seq: int, authority: Authority, max_bytes: int,
) -> int:
    """How many events the longest fitting prefix holds, from the events' sizes: the page of ``k`` events is its
    envelope (the k-th event's seq as its cursor) plus the first ``k`` sizes plus ``k - 1`` commas."""
    total = fitting = 0
    envelopes: dict[tuple[int, bool], int] = {}  # the cursor's width and has_more decide an envelope's length
    for count, (event, size) in enumerate(zip(events, sizes, strict=True), start=1):
        total += size
        seq = event["seq"]
        shape = (len(int.__repr__(seq)), seq < latest_seq)
        envelope = envelopes.get(shape)
        if envelope is None:
            envelope = envelopes[shape] = utf8_len(json.dumps(
                _page([], seq, latest_seq, authority), ensure_ascii=False, separators=(",", ":")))
        if envelope + total + count - 1 > max_bytes:
            break
        fitting = count
    return fitting


# --- the replay page without serialising it ---------------------------------------------------------------------
#
# A page is mostly its events' actor and payload texts, and a stored text is JSON as the json module writes it
# (canonical: hostedrooms and the reference both store json.dumps output), so decoding it and writing it into the
# page gives back the same bytes. Whatever a text holds, writing a decoded value never takes MORE bytes than the
# text, except for numbers with a fraction or exponent: strings keep every character or shorten an escape
# (\u00e9 -> é, \/ -> /), whitespace and repeated keys go, integers and literals stay. The one exception, an
# escaped lone surrogate, cannot be written to UTF-8 at all. So decoding with a float hook that measures how much
# each float token grows when written back bounds the page from above with no serialisation:
#
#     envelope (exact) + per event (frame + room id) + accounted bytes of the rows (id, kind, actor, payload)
#     + growth of float tokens
#
# where the frame is the event object's keys and punctuation with the widest seq, epoch and created_at a row can
# hold. When the bound fits the budget, the whole page fits and the exact rule (fit_page) would return it as is.
# fit_page runs instead when in doubt: the bound exceeds the budget (a page near it, or cut by it); an id or kind
# holds a character JSON escapes; a text holds an escaped surrogate; a text nests deeper than a quarter of the
# recursion limit; a row holds a value the plain decode treats differently (not a str, trailing data, an epoch
# that is not an integer, ...): then the plain decode (event_to_dict) runs too, so every error is the plain one.

_EVENT_FRAME = len(json.dumps(
    {"room_id": "", "seq": 0, "event_id": "", "kind": "", "actor": 0, "authority_epoch": 0, "payload": 0,
     "created_at": 0, "idempotent": False}, separators=(",", ":"))) - 5 + 1  # the five 0s out; a comma in
#: The widest seq and epoch (a signed 64-bit integer, or null) and the widest float repr (created_at).
_EVENT_FRAME += 20 + 20 + len("-2.2250738585072014e-308")
_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]').search
_SURROGATE_ESCAPE = re.compile(r"\\u[dD]").search  # (a pair is fine, but rare enough to leave to the exact rule)
_EVENT_IDS, _KINDS, _ACTORS, _PAYLOADS = (itemgetter(REPLAY_COLUMNS.index(name)) for name in (
    "event_id", "kind", "actor_json", "payload_json"))
_ACTOR_AT, _PAYLOAD_AT = REPLAY_COLUMNS.index("actor_json"), REPLAY_COLUMNS.index("payload_json")


class _InDoubt(Exception):
    """Internal: the fast decode does not vouch for this page; the plain path decides."""


def _scanner(growth: list[int]) -> Callable[[str, int], tuple[Any, int]]:
    """The json module's own scanner (what json.loads runs), adding to ``growth[0]`` how many bytes longer each
    float token is when written back (``1e15`` -> ``1000000000000000.0``)."""

    def parse_float(token: str) -> float:
        value = float(token)
        written = len(repr(value)) if math.isfinite(value) else (8 if value > 0 else 9)  # Infinity, -Infinity
        if written > len(token):
            growth[0] += written - len(token)
        return value

    decoder: Any = json.JSONDecoder(parse_float=parse_float)  # (the stubs type make_scanner's argument oddly)
    scan: Callable[[str, int], tuple[Any, int]] = make_scanner(decoder)
    return scan


def _decoded(rows: Sequence[tuple[Any, ...]]) -> tuple[list[EventRecord], int]:
    """The event dicts of replay rows, exactly as event_to_dict builds them, and how many bytes their float tokens
    grow when written back; :class:`_InDoubt` (or the decoder's own error) when the plain decode must decide."""
    growth = [0]
    scan = _scanner(growth)
    short = 2 * (sys.getrecursionlimit() >> 2)  # a valid JSON text this short cannot nest deep (surely_shallow)
    events: list[EventRecord] = []
    append = events.append
    for room_id, seq, event_id, kind, actor_json, epoch, payload_json, created_at, _extra in rows:
        # json.loads(text) is scan(text, 0) when the value ends the text (json.loads would also allow whitespace).
        actor, end = scan(actor_json, 0)
        if end != len(actor_json) or (end > short and not surely_shallow(actor_json)):
            raise _InDoubt
        payload, end = scan(payload_json, 0)
        if end != len(payload_json) or (end > short and not surely_shallow(payload_json)):
            raise _InDoubt
        if seq.__class__ is not int or (epoch is not None and epoch.__class__ is not int):
            raise _InDoubt  # int() of something else (a REAL from a hand-made row) may be wider than 64 bits
        append({"room_id": room_id, "seq": seq, "event_id": event_id, "kind": kind, "actor": actor,
                "authority_epoch": epoch, "payload": payload, "created_at": float(created_at), "idempotent": False})
    return events, growth[0]


def _surely_fits(
    room_id: str, rows: Sequence[tuple[Any, ...]], text_bytes: int, cursor: int, latest_seq: int,
    authority: Authority, max_bytes: int,
) -> bool:
    """Whether the bound above proves the page of every row fits ``max_bytes`` (False when in doubt)."""
    frames = len(rows) * (_EVENT_FRAME + len(room_id))
    if frames + text_bytes > max_bytes:
        return False  # the texts alone cannot prove it: skip scanning them (a cut page is measured instead)
    try:
        if _NEEDS_ESCAPE("".join(map(_EVENT_IDS, rows)) + "".join(map(_KINDS, rows))) is not None:
            return False
        texts = "".join(map(_ACTORS, rows)) + "".join(map(_PAYLOADS, rows))
        if "\\" in texts and _SURROGATE_ESCAPE(texts) is not None:
            return False
        envelope = utf8_len(json.dumps(_page([], cursor, latest_seq, authority), ensure_ascii=False,
                                       separators=(",", ":")))
    except Exception:  # not text: the exact rule decides (and raises what it raises)
        return False
    return envelope + frames + text_bytes <= max_bytes


def replay_page(
    room_id: str, rows: Sequence[tuple[Any, ...]], row_bytes: int, *, since: int, latest_seq: int,
    authority: Authority, max_bytes: int,
) -> ReplayPage:
    """What :func:`fit_page` returns (or raises) for the events of ``rows``, usually without serialising the page.

    ``rows``: replay rows (:meth:`hostedrooms.store.RoomStore.replay_rows`), the :data:`REPLAY_COLUMNS` in order;
    ``row_bytes``: their accounted bytes in total. ``room_id``: the validated room id the rows were selected by.
    """
    try:
        events, growth = _decoded(rows)
    except Exception:  # in doubt, or a row the plain decode refuses: it raises the plain error
        events = [event_to_dict(dict(zip(REPLAY_COLUMNS, row, strict=False))) for row in rows]
        return fit_page(room_id, events, since=since, latest_seq=latest_seq, authority=authority, max_bytes=max_bytes)
    if not events:
        return fit_page(room_id, events, since=since, latest_seq=latest_seq, authority=authority,
                        max_bytes=max_bytes)
    cursor = events[-1]["seq"]
    if _surely_fits(room_id, rows, row_bytes + growth, cursor, latest_seq, authority, max_bytes):
        return _page(events, cursor, latest_seq, authority)
    # The page is cut: each prefix's serialized length is its envelope, its events' lengths and the commas between
    # them, so measuring each event once finds the cut that fit_page's search would (a backslash-free text needs
    # no escape anywhere, and the search for one is a plain substring scan).
    plain = [row[_ACTOR_AT].find("\\") < 0 and row[_PAYLOAD_AT].find("\\") < 0 for row in rows]
    sizes = _event_sizes(events, plain)
    fitting = _longest_fitting(events, sizes, latest_seq, authority, max_bytes) if sizes is not None else 0
    if fitting:
        return _page(events[:fitting], events[fitting - 1]["seq"], latest_seq, authority)
    return fit_page(room_id, events, since=since, latest_seq=latest_seq, authority=authority, max_bytes=max_bytes)


def decode_rows(rows: Sequence[tuple[Any, ...]]) -> Iterator[EventRecord]:
    """The event dicts of replay rows (:data:`REPLAY_COLUMNS` first), exactly what :func:`event_to_dict` returns
    for each, one scanner call per text where that is certain to agree; otherwise event_to_dict itself, row by
    row as the iterator is consumed (so a row it refuses raises after the rows before it were taken)."""
    try:
        events = _decoded(rows)[0]
    except Exception:  # in doubt, or a row the plain decode refuses: it decides, and raises the plain error
        return (event_to_dict(dict(zip(REPLAY_COLUMNS, row, strict=False))) for row in rows)
    return iter(events)
