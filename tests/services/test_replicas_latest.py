"""What a replica's ``latest_seq`` may hold (issue #25 item 3), on SQLite and PostgreSQL: a page whose cursor,
``has_more`` and ``latest_seq`` contradict its own events is refused; a claim no stored event supports is lowered
only by a page proven newer (``supersede_latest_seq``), so a delayed page still never lowers it (hole 1); and
``reset_replica_latest`` is the operator's recovery."""

from __future__ import annotations

from typing import Any

import pytest
from factories import ingest
from factories import replica_page as page
from sqlalchemy import Engine

from hostedrooms import replicas, verify
from hostedrooms.errors import ReplicaError


def _state(engine: Engine) -> tuple[int, int]:
    state = replicas.replica_state(engine, room_id="r1")
    return state["last_seq"], state["latest_seq"]


@pytest.mark.parametrize(("change", "message"), [
    ({"latest_seq": 1}, "page.latest_seq is below the page's own last event"),
    ({"cursor": 1}, "page.cursor is not the page's last event"),
    ({"has_more": True}, "page.has_more contradicts page.cursor and page.latest_seq"),
    ({"latest_seq": "10"}, "page.latest_seq must be an integer from 0 to 2\\*\\*63-1"),
    ({"latest_seq": -1}, "page.latest_seq must be an integer"),
    ({"cursor": [2]}, "page.cursor must be an integer"),
    ({"has_more": "no"}, "page.has_more must be a boolean"),
])
def test_a_page_contradicting_its_own_events_is_refused(engine: Engine, change: dict[str, Any],
                                                        message: str) -> None:
    bad = page(1, 2) | change
    with pytest.raises(ReplicaError, match=message):
        replicas.validate_page(bad, room_id="r1")
    with pytest.raises(ReplicaError, match=message):
        ingest(engine, bad)
    with pytest.raises(ReplicaError):
        replicas.replica_state(engine, room_id="r1")  # nothing stored


def test_an_empty_page_claiming_a_cursor_beyond_its_latest_is_refused() -> None:
    with pytest.raises(ReplicaError, match="page.cursor is beyond page.latest_seq"):
        replicas.validate_page(page(3, 2) | {"cursor": 5, "latest_seq": 2}, room_id="r1")


def test_a_newer_page_lowers_an_unsupported_claim(engine: Engine) -> None:
    ingest(engine, page(1, 1, latest=10**15))  # a lie: seq 1 of 10**15
    assert _state(engine) == (1, 10**15)
    # Without proof that it is newer, a lower claim changes nothing (a delayed page: hole 1).
    assert ingest(engine, page(2, 1, latest=1))["caught_up"] is False
    assert ingest(engine, page(2, 1, latest=1), supersede_latest_seq=10**15 - 1)["caught_up"] is False
    assert _state(engine) == (1, 10**15)
    # Read after the lie was stored: the truth replaces it.
    assert ingest(engine, page(2, 1, latest=1), supersede_latest_seq=10**15)["caught_up"] is True
    assert _state(engine) == (1, 1) and verify(engine) == []


def test_a_newer_page_never_lowers_below_the_stored_events(engine: Engine) -> None:
    ingest(engine, page(1, 3, latest=50))
    ingest(engine, page(4, 4, latest=4), supersede_latest_seq=50)
    assert _state(engine) == (4, 4)
    ingest(engine, page(5, 6, latest=9))
    # A claim below the events the replica holds is no page of this log: refused, nothing changes.
    with pytest.raises(ReplicaError, match="below the page's own last event"):
        ingest(engine, page(5, 6, latest=5), supersede_latest_seq=9)
    ingest(engine, page(7, 6, latest=6) | {"cursor": 6}, supersede_latest_seq=9)
    assert _state(engine) == (6, 6)


def test_a_supported_claim_is_never_lowered(engine: Engine) -> None:
    """A claim the stored events reach (latest_seq == last_seq) is no lie: nothing to supersede."""
    ingest(engine, page(1, 4, latest=4))
    ingest(engine, page(5, 4, latest=4), supersede_latest_seq=4)
    assert _state(engine) == (4, 4)


def test_the_operator_resets_a_claim_no_source_will_correct(engine: Engine) -> None:
    ingest(engine, page(1, 2, latest=10**15))
    with pytest.raises(ReplicaError, match="between the replica's last_seq 2 and its latest_seq"):
        replicas.reset_replica_latest(engine, room_id="r1", latest_seq=1)
    with pytest.raises(ReplicaError, match="between"):
        replicas.reset_replica_latest(engine, room_id="r1", latest_seq=10**15 + 1)
    with pytest.raises(ReplicaError, match="latest_seq must be an integer"):
        replicas.reset_replica_latest(engine, room_id="r1", latest_seq="2")  # type: ignore[arg-type]
    with pytest.raises(ReplicaError, match="replica not found"):
        replicas.reset_replica_latest(engine, room_id="r2")
    assert replicas.reset_replica_latest(engine, room_id="r1", latest_seq=7, now=5.0)["latest_seq"] == 7
    state = replicas.reset_replica_latest(engine, room_id="r1")
    assert (state["last_seq"], state["latest_seq"]) == (2, 2)
    promoted = replicas.promote_replica(engine, room_id="r1", local_gateway_id="install:gw-b")
    assert promoted["claim_seq"] == 3 and verify(engine) == []


def test_a_checked_page_is_stored_as_checked(engine: Engine) -> None:
    checked = replicas.validate_page(page(1, 3), room_id="r1")
    assert (checked.last_seq, checked.latest_seq, checked.cursor, checked.has_more) == (3, 3, 3, False)
    assert ingest(engine, checked)["stored_seq"] == 3
    with pytest.raises(ReplicaError, match="^page was checked for another room or under other limits$"):
        ingest(engine, checked, room_id="r2")
