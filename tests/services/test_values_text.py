"""One rule for stored text on both backends, and only documented errors (issue 14, sections 3 and 5).

PostgreSQL refuses NUL characters in text columns (SQLite stores them) and neither driver can encode a lone
surrogate. Every text that reaches a column raw is therefore checked before any transaction opens: refused with
the documented error (``HostedRoomError``; ``ValueError`` in the ledger), except a caller's own error message in
the ledger, which is recorded with those characters backslash-escaped. JSON documents are unaffected: their
encoder writes NUL as ``\\u0000``, so a NUL inside a payload is stored and read back on both backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from apis import use_api
from factories import outbound, outbound_snapshot, prepare, snapshot
from sqlalchemy import Engine

from hostedrooms import peers, rooms
from hostedrooms.errors import HostedRoomError
from hostedrooms.ledger import DeliveryLedger

_api = use_api("peers", "rooms", "DeliveryLedger")  # the tests on a database run on both APIs

GATEWAY = "install:gw-a"
GRANT = "GRANT-SECRET-0123456789"
BAD_TEXTS = ["a\x00b", "a\ud800b", "\udfff"]


def refused(engine: Engine, call: Callable[[], Any], error: type[Exception], match: str | None = None) -> Exception:
    """``call`` raises ``error`` (matching), not from an encoding error, and the database is unchanged."""
    before = snapshot(engine)
    with pytest.raises(error, match=match) as caught:
        call()
    assert not isinstance(caught.value, UnicodeError), repr(caught.value)
    assert snapshot(engine) == before
    return caught.value


# --- rooms ----------------------------------------------------------------------------------------------------------


# Regression: a NUL in a room name was stored on SQLite and a StorageError on PostgreSQL.
@pytest.mark.parametrize("bad", BAD_TEXTS)
def test_room_names_refuse_nul_and_surrogates_on_both_backends(engine: Engine, bad: str) -> None:
    refused(engine, lambda: rooms.create_room(engine, room_id="r1", name=bad, members=[],
                                              authority_gateway_id=GATEWAY), HostedRoomError, "^invalid room name$")
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GATEWAY)
    refused(engine, lambda: rooms.rename_room(engine, room_id="r1", event_id="n1", name=bad), HostedRoomError,
            "^invalid room name$")


def test_nul_inside_json_is_stored_and_read_back_on_both_backends(engine: Engine) -> None:
    members = [{"id": "m\x00", "note": "\x1b[31m"}]
    rooms.create_room(engine, room_id="r1", name="Team", members=members, authority_gateway_id=GATEWAY)
    actor = {"kind": "user", "id": "u1", "display_name": "A\x00B"}
    rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user", actor=actor,
                       payload={"text": "x\x00y"}, authority_gateway_id=GATEWAY, authority_epoch=1)
    [event] = rooms.read_events(engine, room_id="r1")["events"]
    assert (event["actor"], event["payload"]) == (actor, {"text": "x\x00y"})
    assert rooms.room_state(engine, room_id="r1")["members"] == members


# --- peer routing state ---------------------------------------------------------------------------------------------


def _link(**fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {column: f"v-{column}" for column in peers.LINK_COLUMNS}
    return {**record, "grant": GRANT, "updated_at": 1.0, **fields}


def _receipt(**fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {column: f"v-{column}" for column in peers.REMOTE_RUN_COLUMNS}
    return {**record, "authority_epoch": 1, "execution_generation": 1, **fields}


def _claims(**fields: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {field: f"v-{field}" for field in peers.GRANT_SCOPE_FIELDS}
    return {**claims, "room_id": "r1", "authority_epoch": 1, **fields}


def _no_grant_anywhere(error: BaseException) -> None:
    """The grant is in neither the message nor any chained error (a UnicodeEncodeError's .object holds it)."""
    seen: BaseException | None = error
    while seen is not None:
        assert GRANT not in str(seen) and GRANT not in repr(getattr(seen, "object", "")), repr(seen)
        seen = seen.__cause__ or seen.__context__


# Regression: a lone surrogate escaped as a raw UnicodeEncodeError whose .object carried the grant.
@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize("column", ["grant", "target_url", "catalog_json", "status"])
def test_link_fields_refuse_nul_and_surrogates_without_leaking_the_grant(engine: Engine, bad: str,
                                                                         column: str) -> None:
    record = _link(**{column: GRANT + bad if column == "grant" else bad})
    error = refused(engine, lambda: peers.upsert_room_link_record(engine, record=record, max_links=5),
                    HostedRoomError, f"^room link {column} must not contain NUL characters or lone surrogates$")
    _no_grant_anywhere(error)


@pytest.mark.parametrize("bad", BAD_TEXTS)
def test_link_status_and_delete_refuse_nul_and_surrogates(engine: Engine, bad: str) -> None:
    peers.upsert_room_link_record(engine, record=_link(room_id="r1", member_id="m1"), max_links=5)
    for arguments in ({"room_id": bad, "member_id": "m1", "status": "ok"},
                      {"room_id": "r1", "member_id": bad, "status": "ok"},
                      {"room_id": "r1", "member_id": "m1", "status": bad}):
        refused(engine, lambda arguments=arguments: peers.update_room_link_status(engine, **arguments),
                HostedRoomError, "must not contain NUL characters or lone surrogates$")
    refused(engine, lambda: peers.delete_room_link_records(engine, room_id=bad), HostedRoomError,
            "^room_id must not contain")


@pytest.mark.parametrize("bad", BAD_TEXTS)
@pytest.mark.parametrize("column", ["task_id", "run_id", "session_id"])
def test_receipts_refuse_nul_and_surrogates(engine: Engine, bad: str, column: str) -> None:
    refused(engine, lambda: peers.upsert_remote_run_receipt(engine, record=_receipt(**{column: bad})),
            HostedRoomError, f"^remote run {column} must not contain")
    peers.upsert_remote_run_receipt(engine, record=_receipt())
    if column == "task_id":
        refused(engine, lambda: peers.remote_run_receipt(engine, record=_receipt(task_id=bad)), HostedRoomError)
    filters = {"run_id": "room_id", "task_id": "target_profile", "session_id": "session_id"}
    refused(engine, lambda: peers.list_remote_run_receipts(engine, **{filters[column]: bad}), HostedRoomError,
            f"^{filters[column]} must not contain")


@pytest.mark.parametrize("bad", BAD_TEXTS)
def test_revocation_refuses_nul_and_surrogates(engine: Engine, bad: str) -> None:
    refused(engine, lambda: peers.revoke_room_grant_scope(engine, claims=_claims(member_id=bad), expires_at=10.0**10),
            HostedRoomError, "^room grant scope is invalid$")
    refused(engine, lambda: peers.room_grant_is_revoked(engine, claims=_claims(target_profile=bad)),
            HostedRoomError, "^room grant scope is invalid$")


# Regression: a 5,000-digit int raised Python's own ValueError from the int->str conversion limit.
def test_grant_scope_key_refuses_unprintable_numbers(engine: Engine) -> None:
    huge = 10**5000
    with pytest.raises(HostedRoomError, match="^room grant scope is invalid$"):
        peers.room_grant_scope_key(_claims(target_install_id=huge))
    refused(engine, lambda: peers.revoke_room_grant_scope(engine, claims=_claims(home_install_id=huge),
                                                          expires_at=10.0**10), HostedRoomError)
    assert peers.room_grant_scope_key(_claims(authority_epoch=3)) == peers.room_grant_scope_key(
        _claims(authority_epoch="3"))


# --- the ledger -----------------------------------------------------------------------------------------------------


# Regression: NUL was stored on SQLite and refused by PostgreSQL; surrogates escaped as UnicodeEncodeError.
@pytest.mark.parametrize("bad", BAD_TEXTS)
def test_ledger_texts_refuse_nul_and_surrogates(engine: Engine, bad: str) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    for field in ("envelope_id", "team_id", "source_peer_id", "parent_envelope_id"):
        refused(engine, lambda field=field: prepare(ledger, **{field: bad}), ValueError,
                "^secure peer delivery identity is invalid$")
    for argument in ("connection_id", "lease_token", "target_chat_id"):
        refused(engine, lambda argument=argument: prepare(ledger, **{argument: bad}), ValueError,
                "^secure peer delivery identity is invalid$")
    refused(engine, lambda: ledger.prepare_outbound(**outbound(body=bad)), ValueError,
            "^secure peer outbound intent is invalid$")
    refused(engine, lambda: ledger.prepare_outbound(**outbound(request_id=bad)), ValueError)
    refused(engine, lambda: ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(source_route_id=bad))),
            ValueError)
    prepare(ledger)
    ledger.authorize("env-1")
    refused(engine, lambda: ledger.prepare_response("env-1", request_id="r", body=bad, request_response=False),
            ValueError, "^secure peer response intent is invalid$")
    refused(engine, lambda: ledger.bind_owner("env-1", queued_id=bad, run_id=None), ValueError,
            "^secure peer ledger queued_id must not contain NUL characters or lone surrogates$")
    for lookup in (ledger.get, ledger.authorize, ledger.outbound, ledger.for_run, ledger.nonterminal_for_chat):
        refused(engine, lambda lookup=lookup: lookup(bad), ValueError, "must not contain NUL characters")


def test_ledger_message_bodies_keep_nul_and_refuse_surrogates(engine: Engine) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    refused(engine, lambda: prepare(ledger, body={"message": "hi \ud800"}), ValueError,
            "^secure peer delivery body is invalid$")
    _row, created = prepare(ledger, body={"message": "hi \x00"})
    assert created and ledger.get("env-1")["body"] == {"message": "hi \x00"}
    ledger.authorize("env-1")
    refused(engine, lambda: ledger.finish("env-1", succeeded=True, result_text="done \ud800"), ValueError,
            "^secure peer delivery result is invalid$")
    assert ledger.finish("env-1", succeeded=True, result_text="done \x00")["state"] == "completed"


# A caller's own error text is a diagnostic (often an exception's message): recorded escaped, never refused.
def test_ledger_error_texts_are_recorded_escaped(engine: Engine) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    ledger.prepare_outbound(**outbound())
    error = "boom \x00 and \ud800 end"
    escaped = "boom \\x00 and \\ud800 end"
    assert ledger.defer_outbound("out-1", error)["last_error"] == escaped
    assert ledger.fail_outbound("out-1", error)["last_error"] == escaped
    prepare(ledger)
    ledger.authorize("env-1")
    assert ledger.defer_admission("env-1", error=error)["admission_last_error"] == escaped
    ledger.prepare_response("env-1", request_id="resp-1", body="ok", request_response=False)
    assert ledger.defer_response("env-1", request_id="resp-1", error=error)["response_last_error"] == escaped
    assert ledger.finish("env-1", succeeded=False, error=error)["error"] == escaped
    assert ledger.defer_outbound("out-1", "x" * 1000) is not None  # unchanged rules otherwise (failed: no-op)


# Regression: prune(retain_seconds=10**30) escaped as a raw OverflowError (SQLite) / "bigint out of range".
@pytest.mark.parametrize("retain", [10**30, 2**63, -1])
def test_ledger_prune_refuses_retention_beyond_64_bits(engine: Engine, retain: int) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    ledger.prepare_outbound(**outbound())
    ledger.fail_outbound("out-1", "gone")
    refused(engine, lambda: ledger.prune(retain_seconds=retain), ValueError,
            "^secure peer ledger retention is invalid$")
    assert ledger.prune(retain_seconds=2**63 - 1) == 0
    assert ledger.prune(retain_seconds=0) == 0  # updated at 1000, the cutoff is 1000: not older
    assert DeliveryLedger(engine, clock=lambda: 1_001).prune(retain_seconds=0) == 1
