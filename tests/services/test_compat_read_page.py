"""The drop-in facade's ``read_events`` page is exactly the reference's shape; the native page keeps ``lineage``.

The reference's page (``gateway.hosted_rooms.read_events``) is ``events``, ``cursor``, ``latest_seq``,
``has_more`` and ``authority`` (:class:`hostedrooms.records.ReplayPage` documents it), in that order. Code written
against the reference compares whole pages, so one more key breaks it; the store's lineage belongs to the native
API (followers, the standby).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from hostedrooms import rooms
from hostedrooms.compat import _engine as compat_engine
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.records import EventPage, ReplayPage

REFERENCE_KEYS = ["events", "cursor", "latest_seq", "has_more", "authority"]
USER = {"kind": "user", "id": "desktop-user", "display_name": "User"}


@pytest.fixture
def facade_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(compat_engine.INSTALL_ID_ENV, "gw-local")
    yield
    compat_engine.forget_engines()


def _room_with_four_events(target: str) -> None:
    hr.create_room(target, room_id="room-1", name="Release room", members=[{"profile": "ops", "handle": "ops"}],
                   authority_gateway_id="gateway-a", now=10)
    for index in range(1, 5):
        hr.append_event(target, room_id="room-1", event_id=f"event-{index}", kind="message.user", actor=USER,
                        payload={"index": index}, authority_gateway_id="gateway-a", authority_epoch=1,
                        now=20 + index)


def test_the_documented_reference_shape_is_the_replay_page() -> None:
    assert sorted(ReplayPage.__required_keys__) == sorted(REFERENCE_KEYS)
    assert set(EventPage.__required_keys__) - set(ReplayPage.__required_keys__) == {"lineage"}


def test_facade_page_has_exactly_the_reference_keys(target: str, facade_env: None) -> None:
    _room_with_four_events(target)
    first = hr.read_events(target, room_id="room-1", since_seq=0, limit=2)
    assert list(first) == REFERENCE_KEYS  # the keys and their order (a serialised page is byte for byte the same)
    assert [event["seq"] for event in first["events"]] == [1, 2]
    assert first == {"events": first["events"], "cursor": 2, "latest_seq": 4, "has_more": True,
                     "authority": {"gateway_id": "gateway-a", "epoch": 1}}
    second = hr.read_events(target, room_id="room-1", since_seq=first["cursor"], limit=2)
    assert list(second) == REFERENCE_KEYS
    assert [event["seq"] for event in second["events"]] == [3, 4] and second["has_more"] is False
    settled = hr.read_events(target, room_id="room-1", since_seq=4)
    assert list(settled) == REFERENCE_KEYS
    assert settled["events"] == [] and settled["cursor"] == settled["latest_seq"] == 4


def test_facade_page_of_a_disbanded_room_has_the_reference_keys(target: str, facade_env: None) -> None:
    _room_with_four_events(target)
    hr.disband_room(target, room_id="room-1", expected_gateway_id="gateway-a", expected_epoch=1, now=30)
    kept = hr.read_events(target, room_id="room-1", include_disbanded=True)
    assert list(kept) == REFERENCE_KEYS
    assert kept["events"][-1]["kind"] == "room.disbanded"


def test_native_page_keeps_lineage_and_otherwise_equals_the_facade_page(
        target: str, engine: Engine, facade_env: None) -> None:
    _room_with_four_events(target)
    native: dict[str, Any] = dict(rooms.read_events(engine, room_id="room-1", since_seq=1, limit=2))
    facade = hr.read_events(target, room_id="room-1", since_seq=1, limit=2)
    assert list(native) == [*REFERENCE_KEYS, "lineage"]
    assert isinstance(native.pop("lineage"), str)
    assert native == facade
    # Serialised, the facade page is the native one without lineage, byte for byte.
    assert json.dumps(facade, separators=(",", ":")) == json.dumps(native, separators=(",", ":"))
