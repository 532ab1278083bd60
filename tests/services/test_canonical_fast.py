"""The batch append's fast validation agrees with the plain one, value for value and error for error.

``canonical_object`` (the payload encoder a batch item takes) is checked against the canonical encoder as it was
before it existed, kept here as the oracle; ``validated_items`` (the batch loop that builds plain items straight)
against the per-item loop it replaced. Payloads cover floats (-0.0, 1e308, the smallest subnormal, NaN and the
infinities), non-ASCII and astral text, big integers, non-string keys, nesting up to and past MAX_JSON_DEPTH, and
sizes around the byte limit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

import pytest
from factories import lowered
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hostedrooms import limits
from hostedrooms.errors import InvalidInputError
from hostedrooms.limits import in_force
from hostedrooms.rooms.rules import _EVENT_FIELDS, PreparedEvent, _BatchMemo, _validated_event, validated_items
from hostedrooms.validation import canonical_json_sized, canonical_object, json_depth_within, refusal

# --- the oracle: the canonical encoder as it stood before canonical_object -------------------------------------


def _oracle_not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ORACLE_ENCODE = c_make_encoder(
    None, _oracle_not_serializable, encode_basestring, None, ":", ",", True, False, False)


def _oracle_encode(value: Any) -> str:
    if isinstance(value, str):
        return str(encode_basestring(value))
    return "".join(_ORACLE_ENCODE(value, 0))


def oracle_sized(value: Any, *, error: Callable[[str], Exception], label: str, max_bytes: int) -> tuple[str, int]:
    """canonical_json_sized(ensure_ascii=False) as it was."""
    try:
        text = _oracle_encode(value)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise refusal(error, f"{label} must be JSON-serializable", label) from exc
    if size > max_bytes:
        raise refusal(error, f"{label} is too large", label)
    depth = limits.MAX_JSON_DEPTH
    if len(text) > 2 * depth and not json_depth_within(text, depth):
        raise refusal(error, f"{label} is nested too deeply", label)
    return text, size


# --- values ----------------------------------------------------------------------------------------------------

_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-0.0, 0.0, 1e308, -1e308, 5e-324, -5e-324, 2.2250738585072014e-308, 1e16, 1e-7, 0.1,
                     math.nan, math.inf, -math.inf]))
_INTEGERS = st.one_of(st.integers(), st.integers(min_value=-(2**300), max_value=2**300),
                      st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**50]))
_TEXT = st.one_of(st.text(), st.text(st.characters(min_codepoint=0x80)), st.sampled_from(
    ["", "\x00", "\u2028", "\U0001f600", 'q"uote\\back', "\x7f", "é" * 40]))
_LEAVES = st.one_of(st.none(), st.booleans(), _INTEGERS, _FLOATS, _TEXT)
# Keys: strings mostly; ints, floats, bools and None are written as strings (when they sort among themselves);
# other keys, and keys that cannot be sorted together, are not serializable.
_KEYS = st.one_of(_TEXT, _TEXT, st.integers(), _FLOATS, st.booleans(), st.none(), st.tuples(st.integers()))


def _nest(depth: int, leaf: Any, shapes: list[bool]) -> Any:
    value = leaf
    for level in range(depth):
        value = {"k": value} if shapes[level % len(shapes)] else [value]
    return value


_DEEP = st.builds(
    _nest, st.integers(min_value=limits.MAX_JSON_DEPTH - 3, max_value=limits.MAX_JSON_DEPTH + 3),
    st.one_of(_LEAVES, st.just("x" * 200)), st.lists(st.booleans(), min_size=1, max_size=5))
_VALUES = st.recursive(
    _LEAVES, lambda children: st.one_of(st.lists(children, max_size=5),
                                        st.dictionaries(_KEYS, children, max_size=5), _DEEP),
    max_leaves=30)
_PAYLOADS = st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=6),
                      st.builds(lambda inner: {"nested": inner}, _DEEP))
_MAX_BYTES = st.one_of(st.just(limits.MAX_EVENT_JSON_BYTES), st.integers(min_value=0, max_value=300))


def _outcome(call: Callable[[], Any]) -> Any:
    """The value ``call`` returns, or its error's class, message and field."""
    try:
        return ("ok", call())
    except Exception as exc:
        return ("error", type(exc), str(exc), getattr(exc, "field", None))


# --- the encoder -----------------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(_PAYLOADS, _MAX_BYTES)
def test_canonical_object_is_the_oracles_text_or_declines(payload: dict[Any, Any], max_bytes: int) -> None:
    expected = _outcome(lambda: oracle_sized(payload, error=InvalidInputError, label="payload", max_bytes=max_bytes))
    fast = canonical_object(payload, max_bytes)
    event(f"{expected[0]} {expected[2] if expected[0] == 'error' else ''}")
    if expected[0] == "ok":
        assert fast == expected[1]
        assert type(fast[0]) is str and type(fast[1]) is int
    else:
        assert fast is None
    # And the validator's own encoder (what a declined item and a single append use) still is the oracle's.
    assert _outcome(lambda: canonical_json_sized(
        payload, error=InvalidInputError, label="payload", max_bytes=max_bytes)) == expected


@pytest.mark.parametrize("payload", [
    {"f": -0.0}, {"f": 1e308}, {"f": 5e-324}, {"n": 2**200}, {"t": "\U0001f600é\u2028"}, {1: "a", 2: "b"},
    {"a": {"b": [1.5, None, True]}}, {True: 1}, {None: 2}])
def test_canonical_object_examples(payload: dict[Any, Any]) -> None:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_object(payload, 10**6) == (text, len(text.encode("utf-8")))


@pytest.mark.parametrize(("payload", "message"), [
    ({"f": math.nan}, "payload must be JSON-serializable"), ({"f": -math.inf}, "payload must be JSON-serializable"),
    ({(1,): 1}, "payload must be JSON-serializable"), ({1: 1, "a": 2}, "payload must be JSON-serializable"),
    ({"s": {1, 2}}, "payload must be JSON-serializable"), ({"t": "x" * 400}, "payload is too large"),
    (_nest(limits.MAX_JSON_DEPTH + 1, "x", [False]), "payload is nested too deeply"),
    ({"t": "\ud800"}, "payload must be JSON-serializable")])
def test_refused_payloads_decline_and_keep_their_errors(payload: dict[Any, Any], message: str) -> None:
    assert canonical_object(payload, 300) is None
    with pytest.raises(InvalidInputError) as caught:
        canonical_json_sized(payload, error=InvalidInputError, label="payload", max_bytes=300)
    assert str(caught.value) == message and caught.value.field == "payload"


# --- the batch loop --------------------------------------------------------------------------------------------


def oracle_items(items: list[Any], gateway_id: str, epoch: int, lim: Any) -> list[tuple[PreparedEvent, Any]]:
    """append_events' item loop as it was before validated_items."""
    prepared = []
    memo = _BatchMemo(gateway_id, epoch)
    for item in items:
        if type(item) is not dict and not isinstance(item, Mapping):
            raise InvalidInputError("each event must be an object", field="events")
        if not item.keys() <= _EVENT_FIELDS:
            unknown = sorted(str(name) for name in item.keys() - _EVENT_FIELDS)
            raise InvalidInputError(f"unknown event fields: {', '.join(unknown)}", field="events")
        event, actor, _, _ = _validated_event(
            item.get("event_id"), item.get("kind"), item.get("actor"), item.get("payload"), gateway_id, epoch, lim,
            memo)
        prepared.append((event, actor))
    return prepared


class Loud(str):
    """A str that claims to equal anything: it must never be taken for a memoised value."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


GATEWAY = "install:gw"
# Admissible (kind, actor) pairs, mostly one author (the memo's case), and what a rare item gets instead.
_VALID = st.sampled_from([
    ("message.user", {"kind": "user", "id": "u1"}), ("message.user", {"kind": "user", "id": "u1"}),
    ("message.user", {"kind": "user", "id": "u2", "display_name": "Ü "}), ("turn.started", {"kind": "gateway",
                                                                                          "id": GATEWAY}),
    ("message.member", {"kind": "member", "id": "m1", "profile": " p "}), ("room.stop_requested",
                                                                          {"kind": "gateway", "id": GATEWAY})])
_BAD_ACTORS = st.sampled_from([
    {"kind": "gateway", "id": "other"}, {"kind": "user", "id": Loud("u1")}, {"kind": "user"}, "user",
    {"kind": "user", "id": "u1", "extra": 1}, {"kind": "system", "id": "s"}, {"kind": "user", "id": " u1 "}])
_PLAIN_PAYLOADS = st.dictionaries(_TEXT, st.recursive(
    st.one_of(st.none(), st.booleans(), _INTEGERS, st.floats(allow_nan=False, allow_infinity=False), _TEXT),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_TEXT, children, max_size=3)),
    max_leaves=8), max_size=4)
_BAD_IDS = st.one_of(st.sampled_from([" e3 ", "", "x" * 300, "bad id", "é"]), st.integers())
_BAD_KINDS = st.sampled_from([" message.user ", "Bad", "authority.lost", 7, "turn.started"])


@st.composite
def _items(draw: st.DrawFn) -> Any:
    def rare(usual: Any, other: st.SearchStrategy[Any]) -> Any:  # (not at an end: hypothesis favours those)
        return draw(other) if draw(st.integers(min_value=0, max_value=24)) == 12 else usual

    kind, actor = draw(_VALID)
    item: dict[str, Any] = {
        "event_id": rare(draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,9}", fullmatch=True)), _BAD_IDS),
        "kind": rare(kind, _BAD_KINDS), "actor": rare(actor, _BAD_ACTORS),
        "payload": rare(draw(_PLAIN_PAYLOADS), st.one_of(_PAYLOADS, _VALUES))}
    roll = draw(st.integers(min_value=0, max_value=80))
    if roll == 40:
        item["extra"] = 1
    elif roll == 41:
        del item[draw(st.sampled_from(sorted(item)))]
    elif roll == 42:
        return dict.items  # not an object
    return item


def _shown(prepared: list[tuple[PreparedEvent, Any]]) -> list[Any]:
    """Every field of each event and actor, with its exact type (1 is not 1.0 is not True here)."""
    return [([(type(value), value) for value in (event.event_id, event.kind, event.actor_json, event.payload_json,
                                                 event.authority_epoch, event.control, event.size)],
             [(type(name), name, type(value), value) for name, value in actor.items()])
            for event, actor in prepared]


@settings(max_examples=400, deadline=None)
@given(st.lists(_items(), min_size=1, max_size=8), st.sampled_from([None, 120, 400]))
def test_validated_items_agree_with_the_plain_loop(items: list[Any], max_payload: int | None) -> None:
    lim = in_force(None) if max_payload is None else lowered(MAX_EVENT_JSON_BYTES=max_payload)
    expected = _outcome(lambda: _shown(oracle_items(items, GATEWAY, 3, lim)))
    event(f"{expected[0]} {expected[2] if expected[0] == 'error' else len(expected[1])}")
    assert _outcome(lambda: _shown(validated_items(items, GATEWAY, 3, lim))) == expected


def test_repeated_plain_items_take_the_quick_path() -> None:
    """Not vacuous: a batch of plain items with one author is built by _BatchMemo.quick after its first item."""
    lim = in_force(None)
    memo = _BatchMemo(GATEWAY, 3, lim)
    items = [{"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
              "payload": {"n": n, "t": "é"}} for n in range(3)]
    assert memo.quick(items[0]) is None  # kind and actor not validated yet
    _validated_event("e0", "message.user", items[0]["actor"], items[0]["payload"], GATEWAY, 3, lim, memo)
    built = memo.quick(items[1])
    assert built is not None
    assert _shown([built]) == _shown(oracle_items(items[1:2], GATEWAY, 3, lim))
    assert memo.quick({**items[1], "actor": {"kind": "user", "id": Loud("u1")}}) is None
