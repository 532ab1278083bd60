"""The typed results follow the runtime results: every public service call's result is checked against its own
return annotation (hostedrooms.records TypedDicts), on SQLite and PostgreSQL.

For a TypedDict: every required key is present, no undeclared key is, and each value has its declared type
(recursively: events in pages, claim events in rooms). Each scenario also produces every variant of its results,
so every ``NotRequired`` key is seen at least once (a key the code stopped returning fails too), and calls every
public function of its area (a new function without a check fails).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import factories
import pydantic
import pytest
import typing_extensions
from sqlalchemy import Engine

from hostedrooms import peers, records, replicas, rooms
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.rooms import events as room_events
from hostedrooms.rooms import lifecycle

START = 1_000_000


def problems(value: Any, hint: Any, where: str, seen: dict[type, set[str]]) -> list[str]:
    """Why ``value`` is not a ``hint`` (empty: it is); records the keys seen of each TypedDict met."""
    if hint is Any:
        return []
    if typing_extensions.is_typeddict(hint):
        return _typeddict_problems(value, hint, where, seen)
    origin = get_origin(hint)
    if origin is Literal:
        return [] if value in get_args(hint) else [f"{where}: {value!r} is none of {get_args(hint)}"]
    if origin in (Union, types.UnionType):
        # Every alternative is tried (so a TypedDict's keys are recorded only when the value matches it).
        for option in get_args(hint):
            if not problems(value, option, where, {}):
                return problems(value, option, where, seen)
        return [f"{where}: {value!r} matches none of {hint}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} is not a list"]
        (item,) = get_args(hint)
        return [problem for index, element in enumerate(value)
                for problem in problems(element, item, f"{where}[{index}]", seen)]
    if origin is tuple:
        items = get_args(hint)
        if not isinstance(value, tuple) or len(value) != len(items):
            return [f"{where}: {value!r} is not a tuple of {len(items)}"]
        return [problem for index, (element, item) in enumerate(zip(value, items, strict=True))
                for problem in problems(element, item, f"{where}[{index}]", seen)]
    if origin is dict:
        key_type, value_type = get_args(hint)
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not a dict"]
        return [problem for key, element in value.items()
                for problem in (problems(key, key_type, f"{where} key", seen)
                                + problems(element, value_type, f"{where}[{key!r}]", seen))]
    return _scalar_problems(value, hint, where)


def _typeddict_problems(value: Any, hint: Any, where: str, seen: dict[type, set[str]]) -> list[str]:
    if type(value) is not dict:  # a TypedDict is a plain dict at runtime
        return [f"{where}: {type(value).__name__} is not a dict ({hint.__name__})"]
    required, optional = hint.__required_keys__, hint.__optional_keys__
    found: list[str] = []
    if missing := required - value.keys():
        found.append(f"{where}: {hint.__name__} lacks required keys {sorted(missing)}")
    if extra := value.keys() - required - optional:
        found.append(f"{where}: {hint.__name__} has undeclared keys {sorted(extra)}")
    seen.setdefault(hint, set()).update(value.keys())
    hints = get_type_hints(hint)
    for key in value.keys() & hints.keys():
        found.extend(problems(value[key], hints[key], f"{where}[{key!r}]", seen))
    return found


def _scalar_problems(value: Any, hint: Any, where: str) -> list[str]:
    if hint is None or hint is type(None):
        ok = value is None
    elif hint is float:  # an int is a float to a type checker; a bool is not meant as either
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(hint, type):
        ok = isinstance(value, hint)
    else:
        raise AssertionError(f"{where}: the checker does not know the type {hint!r}")
    return [] if ok else [f"{where}: {value!r} is not a {hint}"]


class Checked:
    """Calls a public function and checks its result against the function's own return annotation."""

    def __init__(self) -> None:
        self.called: set[str] = set()
        self.seen: dict[type, set[str]] = {}

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        hint = get_type_hints(function)["return"]
        found = problems(result, hint, function.__qualname__, self.seen)
        assert not found, "\n".join(found)
        _adapter(hint).validate_python(result, strict=True)  # what a FastAPI response model would check
        self.called.add(function.__name__)
        return result

    def assert_complete(self, functions: Iterable[str]) -> None:
        """Every function of ``functions`` was called, and every optional key of every TypedDict met was seen."""
        assert set(functions) <= self.called, f"not checked: {sorted(set(functions) - self.called)}"
        unseen = {td.__name__: sorted(td.__optional_keys__ - keys) for td, keys in self.seen.items()
                  if td.__optional_keys__ - keys}
        assert not unseen, f"optional keys no result had: {unseen}"


_ADAPTERS: dict[Any, pydantic.TypeAdapter[Any]] = {}


def _adapter(hint: Any) -> pydantic.TypeAdapter[Any]:
    """A pydantic TypeAdapter for a return annotation (built once per annotation)."""
    if hint not in _ADAPTERS:
        _ADAPTERS[hint] = pydantic.TypeAdapter(hint)
    return _ADAPTERS[hint]


def _public_records() -> list[Any]:
    every = [getattr(records, name) for name in records.__all__]
    return [record for record in every if typing_extensions.is_typeddict(record)]


@pytest.mark.parametrize("record", _public_records(), ids=lambda record: record.__name__)
def test_pydantic_accepts_every_public_record(record: Any) -> None:
    """pydantic (a FastAPI response model) builds a TypeAdapter for every public record on the oldest supported
    Python; the services' results are validated by it in the scenarios above."""
    adapter = pydantic.TypeAdapter(record)
    assert adapter.json_schema()["type"] == "object"


def _public_functions(*modules: types.ModuleType) -> set[str]:
    return {name for module in modules for name in module.__all__ if callable(getattr(module, name))}


# --- rooms ---------------------------------------------------------------------------------------------------------


def test_room_results_match_their_types(engine: Engine) -> None:
    check = Checked()
    gw, other = "install:gw-a", "install:gw-b"
    actor: records.Actor = {"kind": "user", "id": "u1", "display_name": "Ada"}

    created = check(rooms.create_room, engine, room_id="r1", name="R", members=[{"id": "m1"}],
                    authority_gateway_id=gw, now=100.0)
    assert "latest_seq" not in created  # the reference's first result
    assert "latest_seq" in check(rooms.create_room, engine, room_id="r1", name="R", members=[{"id": "m1"}],
                                 authority_gateway_id=gw)
    check(rooms.create_room, engine, room_id="old", name="Old", members=[], authority_gateway_id="legacy")
    adopted = check(rooms.create_room, engine, room_id="old", name="Old", members=[], authority_gateway_id=gw)
    assert adopted["adopted"] is True and adopted["claim_event"]["kind"] == "authority.claimed"

    check(rooms.append_event, engine, room_id="r1", event_id="e1", kind="message.user", actor=actor,
          payload={"text": "hi"}, authority_gateway_id=gw, authority_epoch=1)
    assert check(rooms.append_event, engine, room_id="r1", event_id="e1", kind="message.user", actor=actor,
                 payload={"text": "hi"}, authority_gateway_id=gw, authority_epoch=1)["idempotent"] is True
    new: list[records.NewEvent] = [
        {"event_id": "e1", "kind": "message.user", "actor": actor, "payload": {"text": "hi"}},
        {"event_id": "e2", "kind": "turn.started", "actor": {"kind": "gateway", "id": gw}, "payload": {"n": [1]}}]
    check(rooms.append_events, engine, "r1", new, gw, 1)
    check(rooms.request_room_stop, engine, room_id="r1", cancel_id="c1", expected_gateway_id=gw, expected_epoch=1)
    page = check(rooms.read_events, engine, room_id="r1", since_seq=0, limit=2)
    assert page["has_more"] is True
    check(rooms.rename_room, engine, room_id="r1", event_id="n1", name="R2")
    check(rooms.rename_room, engine, room_id="r1", event_id="n1", name="R2")
    assert "authority_claim" not in check(rooms.room_state, engine, room_id="r1")
    check(rooms.claim_authority, engine, room_id="r1", expected_gateway_id=gw, expected_epoch=1, new_gateway_id=other,
          event_id="claim-2")
    check(rooms.claim_authority, engine, room_id="r1", expected_gateway_id=gw, expected_epoch=1, new_gateway_id=other,
          event_id="claim-2")
    assert "authority_claim" in check(rooms.room_state, engine, room_id="r1")
    check(rooms.list_rooms, engine)

    disbanded = check(rooms.disband_room, engine, room_id="r1", expected_gateway_id=other, expected_epoch=2,
                      now=200.0)
    assert "event" in disbanded and "history_expired" not in disbanded
    check(rooms.disband_room, engine, room_id="r1", expected_gateway_id=other, expected_epoch=2, now=201.0)
    assert "disbanded_at" in check(rooms.room_state, engine, room_id="r1", include_disbanded=True)
    check(rooms.list_rooms, engine, include_disbanded=True)
    check(rooms.read_events, engine, room_id="r1", include_disbanded=True)
    check(rooms.prune_disbanded_rooms, engine, now=200.0 + 10**9)
    expired = check(rooms.disband_room, engine, room_id="r1", expected_gateway_id=other, expected_epoch=2)
    assert expired["history_expired"] is True and "event" not in expired

    check.assert_complete(_public_functions(room_events, lifecycle))


# --- replicas ------------------------------------------------------------------------------------------------------


def test_replica_results_match_their_types(engine: Engine) -> None:
    check = Checked()
    local = factories.LOCAL
    page: records.EventPage = {
        "events": [{"room_id": "r1", "seq": 1, "event_id": "e1", "kind": "message.user",
                    "actor": {"kind": "user", "id": "u1"}, "authority_epoch": 1, "payload": {"text": "hi"},
                    "created_at": 10.0, "idempotent": False}],
        "cursor": 1, "latest_seq": 1, "has_more": False, "authority": {"gateway_id": factories.A, "epoch": 1},
        "lineage": "postgresql:7714842823913705813:2"}
    check(replicas.ingest_page, engine, room_id="r1", room_name="Team", members=[{"id": "m1"}], page=page)
    check(replicas.ingest_page, engine, room_id="r1", room_name="Team", members=[{"id": "m1"}], page=page)
    check(replicas.ingest_page, engine, room_id="r2", room_name="Other", members=[],
          page=factories.replica_page(1, 2, latest=5, room_id="r2"))
    check(replicas.reset_replica_latest, engine, room_id="r2")
    check(replicas.replica_state, engine, room_id="r1")
    check(replicas.promote_replica, engine, room_id="r1", local_gateway_id=local)
    check(replicas.demote_room, engine, room_id="r1", observed_gateway_id=factories.B, observed_epoch=3,
          local_gateway_id=local)
    assert check(replicas.demote_room, engine, room_id="r1", observed_gateway_id=factories.B, observed_epoch=3,
                 local_gateway_id=lambda: local)["idempotent"] is True
    check(rooms.read_events, engine, room_id="r1")  # the promoted log, replicated events included
    check(replicas.prune_disbanded_replicas, engine)  # list[str]: nothing disbanded here

    check.assert_complete(_public_functions(replicas))


# --- peers ---------------------------------------------------------------------------------------------------------


def test_peer_results_match_their_types(engine: Engine) -> None:
    check = Checked()
    claims: records.GrantClaims = {
        "room_id": "room-1", "home_install_id": "home", "authority_gateway_id": "install:gw-a", "authority_epoch": 1,
        "member_id": "m1", "target_install_id": "target", "target_profile": "default", "issued_at": 5.0}
    record: records.RemoteRunRecord = {
        "room_id": "room-1", "home_install_id": "home", "authority_gateway_id": "install:gw-a", "authority_epoch": 1,
        "member_id": "m1", "target_install_id": "target", "target_profile": "default", "task_id": "t1",
        "execution_generation": 1, "run_id": "run-1", "session_id": "s1"}
    link: records.RoomLinkRecord = {
        "room_id": "room-1", "member_id": "m1", "target_url": "https://peer.example", "target_profile": "default",
        "grant": "grant-1", "catalog_json": "{}", "cancellation_scope_id": "scope", "trace_id": "trace",
        "transport_security": "tls", "status": "ready", "updated_at": 10}

    check(peers.upsert_room_link_record, engine, record=link, max_links=8)
    check(peers.list_room_link_records, engine)
    check(peers.update_room_link_status, engine, room_id="room-1", member_id="m1", status="degraded", now=11.0)
    check(peers.room_grant_scope_key, claims)
    check(peers.reserve_peer_room, engine, claims=claims, expires_at=100.0, now=10.0)
    check(peers.peer_room_is_reserved, engine, room_id="room-1", target_profile="default", now=10.0)
    check(peers.peer_room_grant_is_current, engine, claims=claims, now=10.0)
    check(peers.probe_peer_room_reservation, engine, room_id="room-1", target_profile="default", now=10.0)
    check(peers.probe_hosted_room, engine, room_id="room-1")
    check(peers.revoke_room_grant_scope, engine, claims=claims, expires_at=100.0, now=10.0)
    check(peers.room_grant_is_revoked, engine, claims=claims, now=10.0)
    check(peers.upsert_remote_run_receipt, engine, record=record, now=10.0)
    check(peers.list_remote_run_receipts, engine, room_id="room-1")
    assert check(peers.remote_run_receipt, engine, record=record) is not None
    assert check(peers.remote_run_receipt, engine, record={**record, "task_id": "t2"}) is None
    check(peers.delete_room_link_records, engine, room_id="room-1")
    check(peers.forget_probe_engines)

    check.assert_complete(_public_functions(peers))


# --- the delivery ledger -------------------------------------------------------------------------------------------


def test_ledger_results_match_their_types(engine: Engine) -> None:
    check = Checked()
    now = [START]
    ledger = DeliveryLedger(engine, clock=lambda: now[0])
    expires = START + 3600

    def prepared(n: int) -> str:
        check(ledger.prepare, factories.envelope(n, expires_at=expires), transport_role="host",
              connection_id="conn-1", lease_token="lease-1", target_chat_id="chat-1")
        return f"env-{n}"

    first, second, third = prepared(1), prepared(2), prepared(3)
    check(ledger.get, first)
    check(ledger.authorize, first)
    check(ledger.defer_admission, first, error="busy")
    now[0] += 600
    check(ledger.pending_admissions)
    check(ledger.bind_owner, first, queued_id="q-1", run_id="run-1")
    check(ledger.for_run, "run-1")
    check(ledger.prepare_response, first, request_id="req-1", body="answer", request_response=True)
    check(ledger.defer_response, first, request_id="req-1", error="hub down")
    now[0] += 600
    check(ledger.pending_responses)
    check(ledger.mark_response_committed, first, request_id="req-1")
    check(ledger.authorize, second)
    check(ledger.prepare_response, second, request_id="req-2", body="answer", request_response=False)
    check(ledger.clear_response_intent, second, request_id="req-2")
    check(ledger.fail_ownerless_authorized, second, error="no room")
    check(ledger.nonterminal_for_chat, "chat-1")
    check(ledger.nonterminal_for_connection, "conn-1")
    check(ledger.recoverable)
    check(ledger.finish, first, succeeded=True, result_text="done")
    check(ledger.finish, third, succeeded=False, error="gave up")

    for request_id in ("out-1", "out-2", "out-3"):
        check(ledger.prepare_outbound, **factories.outbound(request_id=request_id, expires_at=expires))
    check(ledger.outbound, "out-1")
    check(ledger.defer_outbound, "out-1", "hub down")
    check(ledger.pending_outbound_for_chat, "chat-1")
    check(ledger.pending_outbound_for_route, "conn-1", "route-a", "rev-1")
    check(ledger.pending_outbound_for_connection, "conn-1")
    now[0] += 600
    check(ledger.pending_outbound)
    check(ledger.recoverable_outbound)
    check(ledger.commit_outbound, "out-1", {"ok": True, "reply": {"text": "hi"}})
    check(ledger.fail_outbound, "out-2", "refused")
    check(ledger.prune, retain_seconds=0)
    check(ledger.backlog)

    methods = {name for name in dir(DeliveryLedger)
               if not name.startswith("_") and callable(getattr(DeliveryLedger, name))
               and name not in ("close", "work_wakeup")}  # work_wakeup returns a context manager, not a record
    check.assert_complete(methods)


# --- the checker itself --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "complaint"), [
    ({"gateway_id": "g"}, "lacks required keys ['epoch']"),
    ({"gateway_id": "g", "epoch": 1, "epoc": 1}, "has undeclared keys ['epoc']"),
    ({"gateway_id": "g", "epoch": True}, "True is not a <class 'int'>"),
    ({"gateway_id": 7, "epoch": 1}, "7 is not a <class 'str'>"),
])
def test_the_checker_refuses_what_the_type_does_not_allow(value: dict[str, Any], complaint: str) -> None:
    found = problems(value, records.Authority, "authority", {})
    assert len(found) == 1 and complaint in found[0]


def test_the_checker_reports_an_optional_key_never_seen() -> None:
    check = Checked()
    check.seen[records.DisbandedRoom] = {"room_id", "disbanded_at", "idempotent", "event"}
    with pytest.raises(AssertionError, match=r"'DisbandedRoom': \['history_expired'\]"):
        check.assert_complete(())
