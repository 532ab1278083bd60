"""Pure validation helpers with the reference implementation's rules and messages."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hostedrooms import HostedRoomError
from hostedrooms.validation import (
    bounded_int,
    canonical_json,
    canonical_json_bytes,
    clock,
    compact_json,
    identifier,
    utf8_len,
)


@pytest.mark.parametrize("value", ["room-1", "install:abc", "system:room-disbanded", "user:" + "a" * 64, "  padded  "])
def test_identifier_accepts_and_strips(value: str) -> None:
    assert identifier(value, error=HostedRoomError, label="room_id") == value.strip()


@pytest.mark.parametrize("value", ["", "   ", "-leading", ".dot", "has space", "semi;colon", "é", "x" * 129])
def test_identifier_rejects_shape_and_length(value: str) -> None:
    with pytest.raises(HostedRoomError, match="^invalid room_id$"):
        identifier(value, error=HostedRoomError, label="room_id")


def test_identifier_messages() -> None:
    with pytest.raises(HostedRoomError, match="^room_id must be a string$"):
        identifier(7, error=HostedRoomError, label="room_id")
    with pytest.raises(HostedRoomError, match="^invalid room name$"):
        identifier(" ", error=HostedRoomError, label="name", pattern=None, invalid="invalid room name")
    assert identifier("Any text!", error=HostedRoomError, label="name", pattern=None) == "Any text!"
    kind = re.compile(r"[a-z][a-z0-9_.-]*")
    with pytest.raises(HostedRoomError, match="^invalid event kind$"):
        identifier("Message", error=HostedRoomError, label="kind", pattern=kind, invalid="invalid event kind")


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, -1, 11])
def test_bounded_int_rejects_bools_non_ints_and_out_of_range(value: object) -> None:
    with pytest.raises(HostedRoomError, match="^limit must be between 0 and 10$"):
        bounded_int(value, error=HostedRoomError, message="limit must be between 0 and 10", high=10)


def test_bounded_int_accepts_bounds() -> None:
    assert bounded_int(0, error=HostedRoomError, message="m") == 0
    assert bounded_int(10, error=HostedRoomError, message="m", low=1, high=10) == 10


def test_canonical_json_is_sorted_compact_and_keeps_non_ascii() -> None:
    text = canonical_json({"b": 1, "a": "ü"}, error=HostedRoomError, label="payload", max_bytes=100)
    assert text == '{"a":"ü","b":1}'
    assert compact_json({"a": "ü"}) == '{"a":"\\u00fc"}'
    assert canonical_json_bytes({"b": [1, 2], "a": "ü"}) == '{"a":"ü","b":[1,2]}'.encode()


def test_canonical_json_errors() -> None:
    with pytest.raises(HostedRoomError, match="^payload must be JSON-serializable$"):
        canonical_json({"x": object()}, error=HostedRoomError, label="payload", max_bytes=100)
    with pytest.raises(HostedRoomError, match="^payload is too large$"):
        canonical_json({"x": "ü" * 10}, error=HostedRoomError, label="payload", max_bytes=20)
    with pytest.raises(ValueError):
        canonical_json_bytes({"x": float("nan")})


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@given(_JSON_VALUES)
def test_compact_json_is_json_dumps_with_sorted_keys(value: Any) -> None:
    for ascii_only in (True, False):
        try:  # NaN and Infinity are not JSON: refused (issue 14)
            expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only,
                                  allow_nan=False)
        except ValueError:
            with pytest.raises(ValueError):
                compact_json(value, ensure_ascii=ascii_only)
        else:
            assert compact_json(value, ensure_ascii=ascii_only) == expected


def test_a_cyclic_payload_is_not_serializable() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = [cyclic]
    with pytest.raises(HostedRoomError, match="^payload must be JSON-serializable$"):
        canonical_json(cyclic, error=HostedRoomError, label="payload", max_bytes=100)


def test_utf8_len_and_clock() -> None:
    assert utf8_len("a", "ü", "€") == 1 + 2 + 3
    assert clock(5) == 5.0
    assert isinstance(clock(None), float)


@pytest.mark.parametrize(("now", "message"), [("abc", "now must be a number"), (object(), "now must be a number"),
                                              (float("nan"), "now must be a finite number"),
                                              (float("inf"), "now must be a finite number")])
def test_clock_refuses_what_is_not_a_finite_number(now: object, message: str) -> None:
    with pytest.raises(HostedRoomError, match=message):
        clock(now)  # type: ignore[arg-type]


def test_lone_surrogates_are_invalid_identifiers_and_json() -> None:
    with pytest.raises(HostedRoomError, match="^invalid room name$"):
        identifier("bad \ud800", error=HostedRoomError, label="name", pattern=None, invalid="invalid room name")
    with pytest.raises(HostedRoomError, match="^payload must be JSON-serializable$"):
        canonical_json({"x": "\udfff"}, error=HostedRoomError, label="payload", max_bytes=100)
