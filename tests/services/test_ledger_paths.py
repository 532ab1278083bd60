"""The ledger's one-statement attempts and its full paths agree on every outcome, on both backends and both APIs.

Each workload runs twice on an emptied ledger: once as the services run it (hot statements, and the one guarded
statement bind_owner, prepare_response, commit_outbound and prepare_outbound try before reading the row), once
inside :meth:`LedgerStatements.without_one_statement` (every statement through ``Connection.execute``, every call
reading its row first, as before the store existed). Both runs must return the same results, raise the same errors
with the same messages, and leave the same rows. The scripted workload takes deliveries through every state and
every error the ledger raises; the generated ones mix the same calls over a few ids in random order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from apis import use_api
from sqlalchemy import Engine

from hostedrooms.backends import backend_for
from hostedrooms.errors import HostedRoomError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.models import deliveries, outbound_intents
from hostedrooms.store.ledger import LedgerStore, ledger_statements

_api = use_api("DeliveryLedger")  # the tests on a database run on both APIs

START = 1_000_000
Call = Callable[[Any], Any]


class Clock:
    def __init__(self) -> None:
        self.now = START + 0.5

    def __call__(self) -> float:
        return self.now


def _envelope(n: int | str, **fields: Any) -> dict[str, Any]:
    return factories.envelope(n, expires_at=START + 100, message="please answer é", **fields)


def _prepare(n: int | str, *, lease: str = "lease-1", chat: str = "chat-1", **fields: Any) -> Call:
    return lambda ledger: ledger.prepare(_envelope(n, **fields), transport_role="host", connection_id="conn-1",
                                         lease_token=lease, target_chat_id=chat)


def _outbound(request_id: str, **fields: Any) -> Call:
    arguments = factories.outbound(request_id=request_id, expires_at=START + 100, **fields)
    return lambda ledger: ledger.prepare_outbound(**arguments)


def _call(name: str, *args: Any, **kwargs: Any) -> Call:
    return lambda ledger: getattr(ledger, name)(*args, **kwargs)


def _set_attempts(request_id: str, attempts: int) -> Call:
    """Give an outbound intent an attempt count no retry would (left by hand): the direct retry leaves it alone."""
    def set_attempts(ledger: Any) -> None:
        with ledger.sql_engine.begin() as connection:
            connection.execute(sa.update(outbound_intents).where(outbound_intents.c.request_id == request_id)
                               .values(attempts=attempts))

    return set_attempts


def _advance(seconds: int) -> Call:
    def advance(ledger: Any) -> None:
        ledger.clock.now += seconds

    return advance


# Every state and every error: prepared (new, replayed, a new lease, a changed claim, over capacity, expired),
# authorized, queued, running, completed and failed; owners bound, repeated, refused and taken by another
# delivery (a unique index); response intents prepared, repeated, changed, committed, cleared and deferred;
# outbound intents prepared, replayed, changed, committed, re-committed differently, deferred and failed; the
# retry queues, listings and pruning.
SCRIPT: list[Call] = [
    _prepare(1), _prepare(1), _prepare(1, lease="lease-2"), _prepare(1, team_id="team-x"),
    _prepare(2, action="instruction", kind="instruction"), _prepare(3), _prepare(4), _prepare(5),
    _prepare(6),  # over capacity (5)
    _call("authorize", "env-1"), _call("authorize", "env-1"), _call("authorize", "missing"),
    _call("bind_owner", "env-1", queued_id="q-1", run_id=None),
    _call("bind_owner", "env-1", queued_id="q-1", run_id=None),  # the same binding again
    _call("bind_owner", "env-1", queued_id="q-9", run_id=None),  # another queue entry
    _call("bind_owner", "env-1", queued_id="q-1", run_id="run-1"),
    _call("bind_owner", "env-1", queued_id="q-1", run_id="run-1"),  # the same binding again
    _call("bind_owner", "env-1", queued_id="q-1", run_id="run-2"),  # another run
    _call("bind_owner", "env-1", queued_id=None, run_id=None),  # LedgerInputError
    _call("bind_owner", "env-3", queued_id="q-3", run_id=None),  # prepared: not admitted
    _call("bind_owner", "missing", queued_id="q-3", run_id=None),
    _call("authorize", "env-2"), _call("authorize", "env-3"), _call("authorize", "env-4"),
    _call("bind_owner", "env-2", queued_id="q-1", run_id=None),  # q-1 is env-1's: the unique index refuses
    _call("bind_owner", "env-2", queued_id=None, run_id="run-1"),  # run-1 is env-1's
    _call("bind_owner", "env-2", queued_id=None, run_id="run-2"),  # authorized -> running, no queue entry
    _call("bind_owner", "env-3", queued_id="q-3", run_id="run-3"),  # authorized -> running with both
    _call("bind_owner", "env-2", queued_id="q-2", run_id="run-2"),  # running under another binding
    _call("prepare_response", "env-1", request_id="resp-1", body="the answer", request_response=True),
    _call("prepare_response", "env-1", request_id="resp-1", body="the answer", request_response=True),
    _call("prepare_response", "env-1", request_id="resp-1", body="another answer", request_response=True),
    _call("prepare_response", "env-2", request_id="resp-2", body="an answer", request_response=False),  # instruction
    _call("prepare_response", "env-5", request_id="resp-5", body="an answer", request_response=False),  # prepared
    _call("prepare_response", "missing", request_id="resp-5", body="an answer", request_response=False),
    _call("prepare_response", "env-1", request_id="resp-1", body=" ", request_response=True),  # invalid body
    _call("defer_response", "env-1", request_id="resp-1", error="hub down"),
    _call("defer_response", "env-1", request_id="resp-1", error="hub down again"),
    _call("defer_response", "env-1", request_id="resp-x", error="not this one"),
    _call("pending_responses", limit=5, now=START + 1000),
    _call("mark_response_committed", "env-1", request_id="resp-x"),
    _call("mark_response_committed", "env-1", request_id="resp-1"),
    _call("mark_response_committed", "env-1"),
    _call("prepare_response", "env-1", request_id="resp-1", body="the answer", request_response=True),
    _call("prepare_response", "env-3", request_id="resp-3", body="an answer", request_response=True),
    _call("clear_response_intent", "env-3", request_id="resp-x"),
    _call("clear_response_intent", "env-3", request_id="resp-3"),
    _call("prepare_response", "env-3", request_id="resp-3b", body="a second answer", request_response=False),
    _call("mark_response_committed", "env-3"),
    _call("authorize", "env-4"), _call("defer_admission", "env-4", error="busy"),
    _call("defer_admission", "env-4", error="still busy"), _call("pending_admissions", limit=5, now=START + 1000),
    _call("fail_ownerless_authorized", "env-1", error="not ownerless"),
    _call("fail_ownerless_authorized", "env-4", error="gave up"),
    _call("defer_admission", "env-4", error="after failing"),
    _call("finish", "env-5", succeeded=True, result_text="done"),  # prepared: not admitted
    _call("finish", "env-1", succeeded=True, result_text="done"),
    _call("finish", "env-1", succeeded=False, error="too late"),
    _call("finish", "env-3", succeeded=False, error="x" * 5000),
    _call("finish", "env-2", succeeded=True, result_text="\ud800"),  # a lone surrogate: LedgerInputError
    _call("get", "env-1"), _call("for_run", "run-2"), _call("recoverable"), _call("nonterminal_for_chat", "chat-1"),
    _call("nonterminal_for_connection", "conn-1"),
    _outbound("out-1"), _outbound("out-1"), _outbound("out-1", body="changed"), _outbound("out-2"),
    _outbound("out-3", source_session_id="chat-2", snapshot=factories.outbound_snapshot(source_chat_id="chat-2")),
    _outbound("out-4", body=""),  # invalid
    _call("defer_outbound", "out-1", "hub down"), _call("defer_outbound", "out-1", "hub down again"),
    _call("pending_outbound", limit=5, now=START + 1000),
    _call("commit_outbound", "out-1", {"ok": True}), _call("commit_outbound", "out-1", {"ok": True}),
    _call("commit_outbound", "out-1", {"ok": False}), _call("commit_outbound", "missing", {"ok": True}),
    _call("defer_outbound", "out-1", "after commit"),
    *(_call("defer_outbound", "out-2", f"try {n}") for n in range(10)),  # past the exponent cap
    _outbound("out-5"), _set_attempts("out-5", -3), _call("defer_outbound", "out-5", "odd count"),
    _set_attempts("out-5", 2_000_000), _call("defer_outbound", "out-5", "huge count"),
    _call("fail_outbound", "out-2", "gave up"),
    _call("commit_outbound", "out-2", {"ok": True}), _call("fail_outbound", "missing", "gone"),
    _call("outbound", "out-1"), _call("recoverable_outbound", limit=5),
    _call("pending_outbound_for_route", "conn-1", "route-a", "rev-1"),
    _advance(200), _prepare(7),  # sweeps the expired prepared deliveries first
    _call("pending_outbound_for_chat", "chat-2"),  # fails the expired intent first
    _call("pending_outbound_for_connection", "conn-1"),
    _call("prune", retain_seconds=0), _advance(1), _call("prune", retain_seconds=0), _call("recoverable"),
]


def _generated(seed: int, count: int) -> list[Call]:
    """``count`` calls over three deliveries, three owners and two intents, in ``seed``'s random order."""
    pick = random.Random(seed).choice
    envelopes, owners, requests = ("env-1", "env-2", "env-3"), ("q-1", "q-2", None), ("resp-1", "resp-2")
    choices: list[Callable[[], Call]] = [
        lambda: _prepare(pick((1, 2, 3)), lease=pick(("l-1", "l-2")),
                         **pick(({}, {"kind": "instruction", "action": "instruction"}))),
        lambda: _call("authorize", pick(envelopes)),
        lambda: _call("bind_owner", pick(envelopes), queued_id=pick(owners), run_id=pick(("run-1", "run-2", None))),
        lambda: _call("prepare_response", pick(envelopes), request_id=pick(requests), body=pick(("a", "b")),
                      request_response=pick((True, False))),
        lambda: _call("mark_response_committed", pick(envelopes), request_id=pick((*requests, None))),
        lambda: _call("clear_response_intent", pick(envelopes), request_id=pick(requests)),
        lambda: _call("defer_response", pick(envelopes), request_id=pick(requests), error="e"),
        lambda: _call("defer_admission", pick(envelopes), error="e"),
        lambda: _call("fail_ownerless_authorized", pick(envelopes), error="e"),
        lambda: _call("finish", pick(envelopes), succeeded=pick((True, False)), result_text="r"),
        lambda: _outbound(pick(("out-1", "out-2")), body=pick(("a", "b"))),
        lambda: _call("commit_outbound", pick(("out-1", "out-2")), {"n": pick((1, 2))}),
        lambda: _call("defer_outbound", pick(("out-1", "out-2")), "e"),
        lambda: _call("fail_outbound", pick(("out-1", "out-2")), "e"),
        lambda: _advance(pick((1, 30))),
    ]
    return [pick(choices)() for _ in range(count)]


def _emptied(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(sa.delete(deliveries))
        connection.execute(sa.delete(outbound_intents))


def _outcome(call: Call, ledger: Any) -> Any:
    try:
        return ("ok", call(ledger))
    except HostedRoomError as exc:  # every error the ledger raises (a driver's arrives translated)
        return ("error", type(exc).__name__, str(exc), getattr(exc, "field", None))


def _run(engine: Engine, calls: list[Call]) -> tuple[list[Any], dict[str, list[tuple[Any, ...]]]]:
    _emptied(engine)
    clock = Clock()
    ledger = DeliveryLedger(engine, clock=clock, limits=factories.lowered(MAX_NONTERMINAL_DELIVERIES=5))
    ledger.clock = clock  # type: ignore[attr-defined]  # for _advance
    ledger.sql_engine = engine  # type: ignore[attr-defined]  # for _set_attempts
    try:
        outcomes = [_outcome(call, ledger) for call in calls]
    finally:
        ledger.close()
    return outcomes, factories.snapshot(engine, (deliveries, outbound_intents))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every row lookup by key the store runs while the test runs (fast paths spare some)."""
    seen: list[str] = []
    for name in ("delivery", "outbound"):
        original = getattr(LedgerStore, name)

        def counting(self: LedgerStore, *args: Any, _original: Any = original, _name: str = name,
                     **kwargs: Any) -> Any:
            seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(LedgerStore, name, counting)
    return seen


def _both_ways(engine: Engine, calls: list[Call], reads: list[str]) -> Iterator[tuple[Any, Any, int]]:
    statements = ledger_statements(backend_for(engine))
    contexts: tuple[Callable[[], AbstractContextManager[None]], ...] = (nullcontext, statements.without_one_statement)
    for context in contexts:
        reads.clear()
        with context():
            outcomes, rows = _run(engine, calls)
        yield outcomes, rows, len(reads)


@pytest.mark.parametrize("calls", [
    pytest.param(SCRIPT, id="every-state-and-error"),
    *(pytest.param(partial(_generated, seed, 80), id=f"generated-{seed}") for seed in (1, 2)),
])
def test_fast_and_full_paths_agree(engine: Engine, calls: Any, reads: list[str]) -> None:
    workload = calls() if callable(calls) else calls
    (fast, fast_rows, fast_reads), (full, full_rows, full_reads) = _both_ways(engine, workload, reads)
    for index, (one, other) in enumerate(zip(fast, full, strict=True)):
        assert one == other, index
    assert fast_rows == full_rows
    assert fast_reads < full_reads  # the fast paths ran: the comparison is not vacuous


def test_the_script_reaches_every_state_and_error(engine: Engine) -> None:
    outcomes, rows = _run(engine, SCRIPT)
    errors = {outcome[1] for outcome in outcomes if outcome[0] == "error"}
    assert errors == {"LedgerStateError", "LedgerCapacityError", "LedgerInputError", "StoreIntegrityError"}
    returned = [outcome[1] for outcome in outcomes if outcome[0] == "ok"]
    records = [item[0] if isinstance(item, tuple) else item for item in returned]
    records += [item for listing in returned if isinstance(listing, list) for item in listing]
    states = {record["state"] for record in records if isinstance(record, dict) and "envelope_id" in record}
    assert states == {"prepared", "authorized", "queued", "running", "completed", "failed"}
    intents = {record["state"] for record in records if isinstance(record, dict) and "intent_digest" in record}
    assert intents == {"pending", "committed", "failed"}
    assert rows[deliveries.name]  # pruning left the unfinished rows
