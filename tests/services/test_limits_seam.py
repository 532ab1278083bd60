"""The limits seam: LimitValues.read precedence, and services reading hostedrooms.limits at call time."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest

from hostedrooms import limits
from hostedrooms.limits import LimitValues, in_force


def test_read_takes_each_limit_from_the_first_source_defining_it() -> None:
    first, second = ModuleType("first"), ModuleType("second")
    first.MAX_ROOM_ID_CHARS = 3  # type: ignore[attr-defined]
    second.MAX_ROOM_ID_CHARS = 5  # type: ignore[attr-defined]
    second.MAX_EVENT_ID_CHARS = 1e6  # type: ignore[attr-defined]  # a float patched in means its int

    class Constants:
        MAX_MEMBERS = 9  # class attributes count too

    values = LimitValues.read(first, second, None, Constants(), SimpleNamespace(MAX_LOG_LIMIT=2))
    assert (values.MAX_ROOM_ID_CHARS, values.MAX_EVENT_ID_CHARS) == (3, 1_000_000)
    assert (values.MAX_MEMBERS, values.MAX_LOG_LIMIT) == (9, 2)
    assert values.MAX_JSON_DEPTH == limits.MAX_JSON_DEPTH  # defined by no source: this module's


def test_read_is_a_snapshot_of_the_module_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    before = LimitValues.read()
    monkeypatch.setattr(limits, "MAX_MEMBERS", 1)
    assert before.MAX_MEMBERS == 128 and LimitValues.read().MAX_MEMBERS == 1


def test_in_force_is_the_module_itself_so_lowering_it_takes_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    lim = in_force(None)
    monkeypatch.setattr(limits, "MAX_MEMBERS", 2)
    assert lim.MAX_MEMBERS == 2
    given = LimitValues.read()
    assert in_force(given) is given
