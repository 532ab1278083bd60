"""Grant revocation fences and peer reservations (the seed's rules, on both backends)."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from sqlalchemy import Engine

from hostedrooms import models, peers
from hostedrooms.errors import AuthorityConflictError, HostedRoomError

_api = use_api("peers")  # the tests on a database run on both APIs

NOW = 10_000.0
GW_A, GW_B, GW_C = "install:gateway-a", "install:gateway-b", "install:gateway-c"


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "room_id": "room-1", "home_install_id": "home-1", "authority_gateway_id": GW_A, "authority_epoch": 1,
        "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "issued_at": NOW - 5}
    base.update(changes)
    return base


def reservations(engine: Engine) -> list[dict[str, Any]]:
    table = models.peer_reservations
    with engine.connect() as connection:
        rows = connection.execute(sa.select(table).order_by(table.c.room_id, table.c.member_id)).mappings().all()
    return [dict(row) for row in rows]


def fences(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        return [dict(row) for row in connection.execute(sa.select(models.revoked_grants)).mappings().all()]


def is_reserved(engine: Engine, now: float, profile: str = "alpha", room_id: str = "room-1") -> bool:
    return peers.peer_room_is_reserved(engine, room_id=room_id, target_profile=profile, now=now)


# --- reservations ------------------------------------------------------------------------------------


def test_reservation_fences_its_room_and_profile_until_it_expires(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW)
    assert is_reserved(engine, NOW) is True
    assert is_reserved(engine, NOW, profile="beta") is False
    assert is_reserved(engine, NOW, room_id="room-2") is False
    assert is_reserved(engine, NOW + 100) is False
    assert peers.peer_room_grant_is_current(engine, claims=claims(), now=NOW) is True
    assert peers.peer_room_grant_is_current(engine, claims=claims(member_id="m2"), now=NOW) is False
    assert peers.peer_room_grant_is_current(engine, claims=claims(), now=NOW + 100) is False
    [row] = reservations(engine)
    assert row == {
        "room_id": "room-1", "member_id": "m1", "target_profile": "alpha", "authority_gateway_id": GW_A,
        "authority_epoch": 1, "expires_at": NOW + 100, "revoked_at": None, "created_at": NOW, "updated_at": NOW}


def test_identifiers_are_validated_and_stored_stripped(engine: Engine) -> None:
    peers.reserve_peer_room(
        engine, claims=claims(room_id=" room-1 ", member_id=" m1", target_profile="alpha "), expires_at=NOW + 9,
        now=NOW)
    assert [(row["room_id"], row["member_id"], row["target_profile"]) for row in reservations(engine)] == [
        ("room-1", "m1", "alpha")]
    assert is_reserved(engine, NOW, profile=" alpha") is True


@pytest.mark.parametrize(("changes", "expires_in", "message"), [
    ({}, 0, "peer room reservation must expire in the future"),
    ({}, -5, "peer room reservation must expire in the future"),
    ({"authority_epoch": 0}, 5, "authority_epoch must be positive"),
    ({"authority_epoch": None}, 5, "authority_epoch must be positive"),
    ({"authority_epoch": -3}, 5, "authority_epoch must be positive"),
    ({"authority_epoch": "abc"}, 5, "authority_epoch must be a positive integer"),
    ({"authority_epoch": [1]}, 5, "authority_epoch must be a positive integer"),
    ({"authority_epoch": 2**63}, 5, "authority_epoch must be a positive integer"),  # beyond 64-bit storage
    ({"authority_epoch": "9" * 30}, 5, "authority_epoch must be a positive integer"),
    ({"room_id": ""}, 5, "invalid room_id"),
    ({"room_id": 7}, 5, "room_id must be a string"),
    ({"member_id": "bad id"}, 5, "invalid member_id"),
    ({"target_profile": None}, 5, "target_profile must be a string"),
    ({"authority_gateway_id": "-x"}, 5, "invalid authority_gateway_id"),
])
def test_bad_reservations_are_refused_and_store_nothing(
    engine: Engine, changes: dict[str, Any], expires_in: float, message: str
) -> None:
    with pytest.raises(HostedRoomError, match=f"^{message}$"):
        peers.reserve_peer_room(engine, claims=claims(**changes), expires_at=NOW + expires_in, now=NOW)
    assert reservations(engine) == []


def test_bad_expiry_and_claims_types_are_hosted_room_errors(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^expires_at must be a number$"):
        peers.reserve_peer_room(engine, claims=claims(), expires_at=None, now=NOW)  # type: ignore[arg-type]
    with pytest.raises(HostedRoomError, match="^claims must be a mapping$"):
        peers.reserve_peer_room(engine, claims=[("room_id", "r")], expires_at=NOW + 1, now=NOW)  # type: ignore[arg-type]
    assert reservations(engine) == []


@pytest.mark.parametrize(("epoch", "stored"), [("3", 3), (3.9, 3), (True, 1)])
def test_epoch_is_read_leniently_like_the_reference(engine: Engine, epoch: Any, stored: int) -> None:
    peers.reserve_peer_room(engine, claims=claims(authority_epoch=epoch), expires_at=NOW + 10, now=NOW)
    assert [row["authority_epoch"] for row in reservations(engine)] == [stored]
    assert peers.peer_room_grant_is_current(engine, claims=claims(authority_epoch=stored), now=NOW) is True


def test_newer_epoch_wins_and_revokes_lower_epochs(engine: Engine) -> None:
    old = claims()
    peers.reserve_peer_room(engine, claims=old, expires_at=NOW + 100, now=NOW)
    peers.reserve_peer_room(engine, claims=claims(member_id="m2"), expires_at=NOW + 100, now=NOW)
    newer = claims(authority_epoch=2, authority_gateway_id=GW_B, member_id="m3")
    peers.reserve_peer_room(engine, claims=newer, expires_at=NOW + 200, now=NOW + 1)
    assert peers.peer_room_grant_is_current(engine, claims=old, now=NOW + 1) is False
    assert peers.peer_room_grant_is_current(engine, claims=newer, now=NOW + 1) is True
    revoked = {row["member_id"]: row["revoked_at"] for row in reservations(engine)}
    assert revoked == {"m1": NOW + 1, "m2": NOW + 1, "m3": None}
    with pytest.raises(AuthorityConflictError, match="^peer room reservation authority changed$"):
        peers.reserve_peer_room(engine, claims=old, expires_at=NOW + 300, now=NOW + 2)
    assert reservations(engine)[0]["revoked_at"] == NOW + 1  # the refused claim changed nothing


def test_same_epoch_under_another_gateway_conflicts(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW)
    for member_id in ("m1", "m2"):
        with pytest.raises(AuthorityConflictError) as caught:
            peers.reserve_peer_room(
                engine, claims=claims(authority_gateway_id=GW_B, member_id=member_id), expires_at=NOW + 50, now=NOW)
        assert caught.value.reason == "authority_conflict"
    assert [row["authority_gateway_id"] for row in reservations(engine)] == [GW_A]


def test_other_profiles_and_rooms_are_independent(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(authority_epoch=5), expires_at=NOW + 100, now=NOW)
    peers.reserve_peer_room(engine, claims=claims(target_profile="beta"), expires_at=NOW + 100, now=NOW)
    peers.reserve_peer_room(engine, claims=claims(room_id="room-2", authority_gateway_id=GW_B), expires_at=NOW + 100,
                            now=NOW)
    assert [row["revoked_at"] for row in reservations(engine)] == [None, None, None]


def test_renewal_keeps_the_later_expiry_and_clears_revocation(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 500, now=NOW)
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 50, now=NOW + 1)
    assert is_reserved(engine, NOW + 2) is False
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW + 3)
    [row] = reservations(engine)
    assert (row["expires_at"], row["revoked_at"], row["created_at"], row["updated_at"]) == (
        NOW + 500, None, NOW, NOW + 3)
    assert is_reserved(engine, NOW + 3) is True


def test_expired_reservations_are_dropped_first(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(authority_epoch=9, authority_gateway_id=GW_B), expires_at=NOW + 10,
                            now=NOW)
    peers.reserve_peer_room(engine, claims=claims(room_id="room-9", authority_gateway_id=GW_C), expires_at=NOW + 10,
                            now=NOW)
    # At NOW + 10 both have expired: the older claim is admitted and both expired rows are gone.
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 50, now=NOW + 10)
    assert [(row["room_id"], row["authority_epoch"], row["created_at"]) for row in reservations(engine)] == [
        ("room-1", 1, NOW + 10)]


def test_a_revoked_newer_row_of_the_same_member_still_wins(engine: Engine) -> None:
    # The reference checks the claim's own row whether or not it is revoked (a kept leniency).
    newer = claims(authority_epoch=4, authority_gateway_id=GW_B)
    peers.reserve_peer_room(engine, claims=newer, expires_at=NOW + 100, now=NOW)
    peers.revoke_room_grant_scope(engine, claims=newer, expires_at=NOW + 100, now=NOW + 1)
    peers.reserve_peer_room(engine, claims=claims(member_id="m2"), expires_at=NOW + 100, now=NOW + 2)
    with pytest.raises(AuthorityConflictError):
        peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW + 3)


@pytest.mark.sync_api_only  # several threads call the services at once
def test_gateways_racing_at_the_same_epoch_one_wins(engine: Engine) -> None:
    rounds = 6
    for round_index in range(rounds):
        room_id = f"race-{round_index}"
        barrier = threading.Barrier(2, timeout=60)
        # Even rounds race for the same member row; odd rounds for two members of the same room/profile.
        members = ("m1", "m1") if round_index % 2 == 0 else ("m1", "m2")

        def reserve(
            side: int, room_id: str = room_id, members: tuple[str, str] = members,
            barrier: threading.Barrier = barrier,
        ) -> str:
            barrier.wait()
            try:
                peers.reserve_peer_room(
                    engine, claims=claims(room_id=room_id, member_id=members[side],
                                          authority_gateway_id=(GW_A, GW_B)[side], authority_epoch=3),
                    expires_at=NOW + 100, now=NOW)
            except AuthorityConflictError:
                return "lost"
            return "won"

        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = sorted(pool.map(reserve, (0, 1), timeout=120))
        assert outcomes == ["lost", "won"]
        live = [row for row in reservations(engine) if row["room_id"] == room_id and row["revoked_at"] is None]
        assert len(live) == 1


# --- grant revocation --------------------------------------------------------------------------------


def expected_scope_key(values: dict[str, Any]) -> str:
    fields = {key: str(values[key]) for key in peers.GRANT_SCOPE_FIELDS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_scope_key_is_the_sha256_of_the_seven_fields(engine: Engine) -> None:
    grant = claims(authority_epoch=2)
    assert peers.room_grant_scope_key(grant) == expected_scope_key(grant)
    assert peers.room_grant_scope_key({**grant, "issued_at": 1, "extra": "ignored"}) == expected_scope_key(grant)
    assert peers.room_grant_scope_key({**grant, "authority_epoch": "2"}) == expected_scope_key(grant)
    peers.revoke_room_grant_scope(engine, claims=grant, expires_at=NOW + 10, now=NOW)
    assert [row["scope_key"] for row in fences(engine)] == [expected_scope_key(grant)]


def test_revocation_fences_grants_issued_at_or_before_it(engine: Engine) -> None:
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 1000, now=NOW + 10)
    assert peers.room_grant_is_revoked(engine, claims=claims(issued_at=NOW + 10), now=NOW + 11) is True
    assert peers.room_grant_is_revoked(engine, claims=claims(issued_at=NOW + 10.5), now=NOW + 11) is False
    assert peers.room_grant_is_revoked(engine, claims=claims(issued_at=None), now=NOW + 11) is True
    assert peers.room_grant_is_revoked(engine, claims=claims(), now=NOW + 1000) is False  # the fence expired
    assert peers.room_grant_is_revoked(engine, claims=claims(member_id="m2"), now=NOW + 11) is False


@pytest.mark.parametrize("missing", peers.GRANT_SCOPE_FIELDS)
def test_incomplete_scope_is_an_error_and_stores_nothing(engine: Engine, missing: str) -> None:
    for value in (None, ""):
        partial = claims(**{missing: value})
        with pytest.raises(HostedRoomError, match="^room grant scope is incomplete$"):
            peers.revoke_room_grant_scope(engine, claims=partial, expires_at=NOW + 10, now=NOW)
        with pytest.raises(HostedRoomError, match="^room grant scope is incomplete$"):
            peers.room_grant_is_revoked(engine, claims=partial, now=NOW)
    assert fences(engine) == []


def test_revocation_that_already_expired_does_nothing(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW)
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW, now=NOW)
    assert fences(engine) == []
    assert is_reserved(engine, NOW) is True


def test_fence_expiry_and_revoked_before_only_grow(engine: Engine) -> None:
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 1000, now=NOW + 50)
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 500, now=NOW + 20)
    assert [(row["expires_at"], row["revoked_before"]) for row in fences(engine)] == [(NOW + 1000, NOW + 50)]
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 2000, now=NOW + 60)
    assert [(row["expires_at"], row["revoked_before"]) for row in fences(engine)] == [(NOW + 2000, NOW + 60)]


def test_expired_fences_are_dropped_by_the_next_revocation(engine: Engine) -> None:
    peers.revoke_room_grant_scope(engine, claims=claims(), expires_at=NOW + 10, now=NOW)
    peers.revoke_room_grant_scope(engine, claims=claims(member_id="m2"), expires_at=NOW + 100, now=NOW + 10)
    assert [row["scope_key"] for row in fences(engine)] == [peers.room_grant_scope_key(claims(member_id="m2"))]


def test_revocation_revokes_the_matching_reservation_only(engine: Engine) -> None:
    peers.reserve_peer_room(engine, claims=claims(), expires_at=NOW + 100, now=NOW)
    peers.reserve_peer_room(engine, claims=claims(member_id="m2"), expires_at=NOW + 100, now=NOW)
    peers.revoke_room_grant_scope(engine, claims=claims(authority_epoch="1"), expires_at=NOW + 100, now=NOW + 5)
    assert {row["member_id"]: row["revoked_at"] for row in reservations(engine)} == {"m1": NOW + 5, "m2": None}
    assert peers.peer_room_grant_is_current(engine, claims=claims(), now=NOW + 6) is False
    assert peers.peer_room_grant_is_current(engine, claims=claims(member_id="m2"), now=NOW + 6) is True


def test_revocation_with_an_unreadable_epoch_is_refused_before_any_write(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^authority_epoch must be a positive integer$"):
        peers.revoke_room_grant_scope(engine, claims=claims(authority_epoch="one"), expires_at=NOW + 5, now=NOW)
    with pytest.raises(HostedRoomError, match="^authority_epoch must be a positive integer$"):
        peers.revoke_room_grant_scope(engine, claims=claims(authority_epoch=-(2**64)), expires_at=NOW + 5, now=NOW)
    assert fences(engine) == []


def test_unreadable_issued_at_is_a_hosted_room_error(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^issued_at must be a number$"):
        peers.room_grant_is_revoked(engine, claims=claims(issued_at="yesterday"), now=NOW)
