"""A returning authority's demotion (issue #34 items 1 and 4): the demoting write is conditioned on the head the
proof established (seq, event id, epoch), checked under the room's lock in the same transaction, so a write
committed after the proof is never lost; and a proof longer than a pass's bounds resumes where it stopped.
Both backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host, room_log, say

from hostedrooms import replicas, rooms, verify
from hostedrooms.demotion import ProvenHead
from hostedrooms.errors import DemotionStaleError, ReplicaError
from hostedrooms.standby import EnginePageSource, Replicator
from hostedrooms.standby.replicator import DEMOTED, LOCAL, REFUSED
from hostedrooms.standby.steps import step_hook

pytest_plugins = ["standby_fixtures"]

USER = {"kind": "user", "id": "u"}


def _taken_over(engine: Engine, standby: Engine, events: int = 3) -> None:
    """A hosts room "r" with ``events`` events; B replicates and promotes it, then writes two events at epoch 2."""
    host(engine, "r", events)
    assert Replicator(EnginePageSource(engine), standby, local_gateway_id=GATEWAY_B).sync_once().error == ""
    replicas.promote_replica(standby, room_id="r", local_gateway_id=GATEWAY_B)
    say(standby, "r", 2, gateway=GATEWAY_B, epoch=2, prefix="b")


def _append(engine: Engine, event_id: str) -> None:
    rooms.append_event(engine, room_id="r", event_id=event_id, kind="message.user", actor=USER, payload={},
                       authority_gateway_id=GATEWAY_A, authority_epoch=1)


def _authority(engine: Engine) -> tuple[str, int]:
    state = rooms.room_state(engine, room_id="r")
    return str(state["authority_gateway_id"]), int(state["authority_epoch"])


def test_a_write_committed_after_the_proof_is_never_lost(engine: Engine, standby: Engine) -> None:
    """The write lands between the proof and the demotion: the demotion changes nothing, the write stays in A's
    log and A stays the room's writer; the next pass refuses to demote (the source lacks that write)."""
    _taken_over(engine, standby)
    late: list[str] = []

    def write_after_the_proof(name: str, details: Mapping[str, Any]) -> None:
        if name == "replicator.proved" and not late:
            _append(engine, "late")  # acknowledged: it returned
            late.append("late")

    back = Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A)
    with step_hook(write_after_the_proof):
        report = back.sync_once()
    assert late == ["late"]
    [room] = report.rooms
    assert room.status == LOCAL and "not demoted" in room.reason and "written after the proof" in room.reason
    assert _authority(engine) == (GATEWAY_A, 1)
    assert room_log(engine, "r")[-1][1] == "late"
    again = back.sync_once()
    assert again.rooms[0].status == REFUSED and "missing from the source" in again.rooms[0].reason
    assert _authority(engine) == (GATEWAY_A, 1) and room_log(engine, "r")[-1][1] == "late"
    assert verify(engine) == [] and verify(standby) == []


def test_without_a_write_in_between_the_room_is_demoted(engine: Engine, standby: Engine) -> None:
    _taken_over(engine, standby)
    report = Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A).sync_once()
    assert report.rooms[0].status == DEMOTED and _authority(engine) == (GATEWAY_B, 2)
    assert verify(engine) == []


def _head(engine: Engine) -> ProvenHead:
    log = room_log(engine, "r")
    return ProvenHead(int(log[-1][0]), str(log[-1][1]), 1)


def test_demote_room_checks_the_proven_head_under_the_lock(engine: Engine, standby: Engine) -> None:
    _taken_over(engine, standby)
    proven = _head(engine)
    _append(engine, "after")
    before = room_log(engine, "r")
    with pytest.raises(DemotionStaleError, match="not the proven head"):
        replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=2,
                             local_gateway_id=GATEWAY_A, proven_head=proven)
    wrong_id = ProvenHead(proven.seq + 1, "someone-else", 1)
    with pytest.raises(DemotionStaleError, match="not the proven one"):
        replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=2,
                             local_gateway_id=GATEWAY_A, proven_head=wrong_id)
    with pytest.raises(DemotionStaleError, match="authority moved on"):
        replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=3,
                             local_gateway_id=GATEWAY_A, proven_head=_head(engine)._replace(epoch=2))
    assert room_log(engine, "r") == before and _authority(engine) == (GATEWAY_A, 1)
    result = replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=2,
                                  local_gateway_id=GATEWAY_A, proven_head=_head(engine))
    assert result["idempotent"] is False and _authority(engine) == (GATEWAY_B, 2)
    # The same observation again is idempotent, whatever head it was proven at.
    again = replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=2,
                                 local_gateway_id=GATEWAY_A, proven_head=proven)
    assert again["idempotent"] is True and verify(engine) == []


@pytest.mark.parametrize("bad", [
    5, "x", (1, "e"), (-1, "e", 1), (0, "e", 1), (1, None, 1), (1, "e", 0), (1, "", 1), (True, "e", 1),
    (1, 7, 1), (2**63, "e", 1), (1, "e", 2**63),
])
def test_a_malformed_proven_head_is_refused_before_any_write(engine: Engine, bad: Any) -> None:
    host(engine, "r", 1)
    with pytest.raises(ReplicaError, match="proven_head"):
        replicas.demote_room(engine, room_id="r", observed_gateway_id=GATEWAY_B, observed_epoch=2,
                             local_gateway_id=GATEWAY_A, proven_head=bad)
    assert _authority(engine) == (GATEWAY_A, 1)


class _Counted(EnginePageSource):
    """Records the ``since_seq`` of every page read."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.reads: list[int] = []

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        self.reads.append(since_seq)
        return super().read_events(room_id, since_seq=since_seq, limit=limit)


def test_a_proof_longer_than_a_pass_resumes_where_it_stopped(engine: Engine, standby: Engine) -> None:
    """A proof of 40 events read 5 a page with 3 pages a pass: each pass continues the last, so it completes in
    a few passes instead of restarting from seq 1 forever."""
    _taken_over(engine, standby, events=40)
    source = _Counted(standby)
    back = Replicator(source, engine, local_gateway_id=GATEWAY_A, page_limit=5, max_pages_per_pass=3)
    statuses = []
    for _ in range(10):
        report = back.sync_once()
        statuses.append(report.rooms[0].status)
        if statuses[-1] == DEMOTED:
            break
    assert statuses[-1] == DEMOTED and _authority(engine) == (GATEWAY_B, 2)
    assert source.reads.count(0) == 1  # never restarted from seq 1
    assert source.reads == sorted(source.reads) and len(statuses) <= 4
    assert verify(engine) == []


def test_a_resumed_proof_still_refuses_a_room_written_meanwhile(engine: Engine, standby: Engine) -> None:
    _taken_over(engine, standby, events=40)
    back = Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A, page_limit=5,
                      max_pages_per_pass=3)
    assert back.sync_once().rooms[0].status == LOCAL  # cut short by the pass's page bound
    _append(engine, "meanwhile")
    statuses = [back.sync_once().rooms[0].status for _ in range(12)]
    assert DEMOTED not in statuses and REFUSED in statuses
    assert _authority(engine) == (GATEWAY_A, 1) and room_log(engine, "r")[-1][1] == "meanwhile"
