"""Fencing a stale authority: :func:`demote_room`, conditioned on what a proof established (:class:`ProvenHead`).

A demotion appends ``authority.lost`` through the fenced append path and adopts the newer lineage, so no later
write at the stale epoch can commit. It is the last step of two takeover paths:

* a returning authority's replicator proves that the new authority's log continues the local room up to the
  local head, then demotes; a write the local gateway commits between the proof and the demotion is in no other
  log, so the demotion carries the proven head (seq, event id, epoch) and checks it under the room's lock, in
  the demoting transaction: if the room moved on, :class:`~hostedrooms.errors.DemotionStaleError` is raised,
  nothing changes, and the caller proves again;
* a failover fences the silent authority in its own store only while the room is no bigger than the standby
  planned to take over (``max_size``), by the same kind of condition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .engines import EngineSource
from .errors import AuthorityConflictError, DemotionStaleError, ReplicaEpochRegressionError, ReplicaError
from .identity import local_gateway_id as resolve_local_gateway_id
from .limits import Limits, in_force
from .records import DemotionResult
from .rooms import PreparedEvent, RoomChange, RoomTransaction, payload_json, run_room_write, system_actor_json
from .rooms import rules as room_rules
from .store import RowLike
from .telemetry import traced
from .validation import INT64_MAX, MAX_EPOCH, bounded_int, clock, identifier

__all__ = ["ProvenHead", "demote_room", "lost_event_id"]


class ProvenHead(NamedTuple):
    """A room's head as a proof read it: its last ``seq`` (0: empty), that event's id (None when empty) and the
    room's authority ``epoch``, held by the demoted gateway."""

    seq: int
    event_id: str | None
    epoch: int


def lost_event_id(epoch: int) -> str:
    """The id of the ``authority.lost`` event that fences a room to ``epoch``."""
    return f"system:authority-lost:{epoch}"


def lost_event(local: str, observed_gateway: str, epoch: int, lim: Limits) -> PreparedEvent:
    """The ``authority.lost`` event by which ``local`` hands the room to ``observed_gateway`` at ``epoch``."""
    return PreparedEvent(
        lost_event_id(epoch), "authority.lost", system_actor_json("authority-control", lim),
        payload_json({"previous_gateway_id": local, "authority_gateway_id": observed_gateway,
                      "authority_epoch": epoch}, lim),
        epoch, control=True)


def _positive_epoch(value: Any, label: str) -> int:
    """A positive epoch that a later claim can still exceed (at most MAX_EPOCH)."""
    epoch = bounded_int(value, error=ReplicaError, message=f"{label} must be a positive integer", low=1,
                        high=INT64_MAX)
    if epoch > MAX_EPOCH:
        raise ReplicaError(f"{label} is beyond the largest authority epoch")
    return epoch


def _proven_head(value: Any, lim: Limits) -> ProvenHead | None:
    """``proven_head`` checked: None, or a (seq, event_id, epoch) triple of the right types and ranges."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 3:
        raise ReplicaError("proven_head must be a ProvenHead (seq, event_id, epoch) or None")
    seq = bounded_int(value[0], error=ReplicaError, message="proven_head.seq must be an integer from 0 to 2**63-1",
                      low=0, high=INT64_MAX)
    if (seq == 0) != (value[1] is None):
        raise ReplicaError("proven_head.event_id must be None exactly when proven_head.seq is 0")
    event_id = None if value[1] is None else identifier(
        value[1], error=ReplicaError, label="proven_head.event_id", max_chars=int(lim.MAX_EVENT_ID_CHARS))
    return ProvenHead(seq, event_id, _positive_epoch(value[2], "proven_head.epoch"))


def _max_size(value: Any) -> tuple[int, int] | None:
    """``max_size`` checked: None, or (events, bytes), each an integer from 0 to 2**63-1."""
    if value is None:
        return None
    if not isinstance(value, tuple) or len(value) != 2:
        raise ReplicaError("max_size must be an (events, bytes) pair or None")
    events, size = (bounded_int(item, error=ReplicaError, low=0, high=INT64_MAX,
                                message=f"max_size.{name} must be an integer from 0 to 2**63-1")
                    for item, name in zip(value, ("events", "bytes"), strict=True))
    return events, size


def _other_than(observed_gateway: str, local: str) -> str:
    """``local``, refused when it is the observed gateway (a demotion fences this gateway against another one)."""
    if observed_gateway == local:
        raise ReplicaError(
            "observed_gateway_id is this gateway: demotion fences this gateway against another one; "
            "moving its own authority to a newer epoch needs claim_authority")
    return local


def _check_conditions(tx: RoomTransaction, room: RowLike, local: str, proven: ProvenHead | None,
                      bound: tuple[int, int] | None) -> None:
    """Raise DemotionStaleError unless ``room`` (locked) still meets what the caller's proof or plan established."""
    if proven is not None:
        _check_proven(tx, room, local, proven)
    events, size = int(room["next_seq"]) - 1, int(room["event_bytes"])
    if bound is not None and (events > bound[0] or size > bound[1]):
        raise DemotionStaleError(f"the room holds {events} events and {size} bytes, more than the {bound[0]} events "
                                 f"and {bound[1]} bytes the demotion was planned for; nothing was changed")


def _check_proven(tx: RoomTransaction, room: RowLike, local: str, proven: ProvenHead) -> None:
    """Raise DemotionStaleError unless ``room`` (locked in this transaction) still stands at ``proven``."""
    head = int(room["next_seq"]) - 1
    if room["authority_gateway_id"] != local or int(room["authority_epoch"]) != proven.epoch:
        raise DemotionStaleError(
            f"the room's authority moved on after the proof (now {room['authority_gateway_id']} at epoch "
            f"{room['authority_epoch']}, proven {local} at epoch {proven.epoch}); nothing was changed")
    if head != proven.seq:
        raise DemotionStaleError(f"the room holds seq {head}, not the proven head seq {proven.seq}: events were "
                                 "written after the proof; nothing was changed")
    if proven.seq and tx.store.event_id_at(str(room["room_id"]), proven.seq) != proven.event_id:
        raise DemotionStaleError(f"the event at the proven head seq {proven.seq} is not the proven one; nothing "
                                 "was changed")


@traced("demote_room")
def demote_room(
    engine: EngineSource, *, room_id: str, observed_gateway_id: str, observed_epoch: int, now: float | None = None,
    local_gateway_id: str | Callable[[], str] | None = None, limits: Limits | None = None,
    proven_head: ProvenHead | None = None, max_size: tuple[int, int] | None = None,
) -> DemotionResult:
    """Fence THIS gateway's stale authority over ``room_id`` against a proven newer epoch, idempotently: append
    ``authority.lost`` (``system:authority-lost:<epoch>``) by the fenced append path, adopt the observed lineage.

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the locally authoritative room to fence.
    :param observed_gateway_id: the gateway seen holding the room's authority now (not this one).
    :param observed_epoch: the epoch it holds it at; it must be newer than the stored one.
    :param now: the demotion time, in Unix seconds (default: the wall clock).
    :param local_gateway_id: this gateway's id, or a callable (default: ``install:$HOSTEDROOMS_INSTALL_ID``).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param proven_head: the room's head (seq, event id, epoch) the caller's proof read; it must still stand there.
    :param max_size: the most (events, bytes) the room may hold (what a failover planned to take over), or None.
    :returns: ``room_id`` and its adopted authority (``idempotent`` when the room already stood there).
    :raises InvalidInputError: ``room_id`` or ``observed_gateway_id`` is invalid.
    :raises ReplicaEpochRegressionError: ``observed_epoch`` does not supersede the stored epoch.
    :raises DemotionStaleError: the room moved past ``proven_head``, or holds more than ``max_size``.
    :raises ReplicaError: the room is not here or not locally authoritative, or an argument is malformed.
    :raises AuthorityConflictError: the room's authority changed under the demotion's fence.
    :raises CapacityExceededError: the room's or the gateway's budget cannot take the ``authority.lost`` event.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    observed_gateway = room_rules.validate_actor_id(observed_gateway_id, "observed_gateway_id", lim)
    # The room keeps the observed epoch, and a later claim writes epoch + 1.
    epoch = _positive_epoch(observed_epoch, "observed_epoch")
    proven, bound = _proven_head(proven_head, lim), _max_size(max_size)
    timestamp = clock(now)
    local = _other_than(observed_gateway, resolve_local_gateway_id(local_gateway_id))
    lost = lost_event(local, observed_gateway, epoch, lim)

    def body(tx: RoomTransaction) -> DemotionResult:
        room = tx.lock_room(room_id)
        if room is None or room["disbanded_at"] is not None:
            raise ReplicaError("room not found in the local authoritative store")
        current_gateway, current_epoch = str(room["authority_gateway_id"]), int(room["authority_epoch"])
        if current_gateway == observed_gateway and current_epoch == epoch:
            return {"room_id": room_id, "authority_gateway_id": current_gateway, "authority_epoch": current_epoch,
                    "idempotent": True}
        _check_conditions(tx, room, local, proven, bound)
        if epoch <= current_epoch:
            raise ReplicaEpochRegressionError("observed epoch does not supersede the stored authority")
        if current_gateway != local:
            raise ReplicaError("room is not locally authoritative; nothing to demote")
        if tx.load_event(room_id, lost.event_id) is not None:
            raise ReplicaError("the authority.lost event id is already taken in this room")
        tx.append_locked(
            room, [lost], now=timestamp,
            change=RoomChange(authority_gateway_id=observed_gateway, authority_epoch=epoch,
                              fence=(current_gateway, current_epoch)),
            error=AuthorityConflictError("hosted room authority changed"))
        return {"room_id": room_id, "authority_gateway_id": observed_gateway, "authority_epoch": epoch,
                "idempotent": False}

    return run_room_write(engine, lim, body)
