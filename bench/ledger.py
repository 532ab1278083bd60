"""The secure-peer delivery ledger beside the reference implementation, operation by operation (issue 27 item 4).

    python bench/run.py --ledger --reference ../shared/reference --rounds 9
    python bench/run.py --ledger --reference ../shared/reference --impl ledger   # DeliveryLedger, not the facade

The reference is the raw-sqlite3 module the project's specification came from; it is not part of hostedrooms, so
its folder (holding ``secure_peer_delivery.py``) is named on the command line and imported from there by the child
process that runs it, never by hostedrooms or its tests.

Each round runs each contender once, in a fresh process, the order rotated each round. A contender runs
``--cycles`` delivery cycles on its own fresh SQLite file (WAL, ``synchronous=FULL`` for both: the reference sets
it; hostedrooms' default): prepare an envelope, replay it, authorize, bind the owner (queued, then the run), prepare,
defer and commit a response, finish; prepare, defer and commit an outbound request; prepare another envelope, defer
its admission and fail it as ownerless; read both back. Each operation's latency is summed per kind, untimed warm-up
cycles first. Per round, the ratio is the reference's time over hostedrooms' for each operation and for the whole
cycle; the table gives the median and the range over the rounds.

``--impl facade`` (the default) drives hostedrooms through :mod:`hostedrooms.compat.secure_peer_delivery`, the
reference's own API and return shapes; ``--impl ledger`` through :class:`hostedrooms.ledger.DeliveryLedger`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import render

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = ("prepare", "prepare_replay", "authorize", "bind_queued", "bind_run", "prepare_response",
              "defer_response", "mark_response_committed", "finish", "prepare_outbound", "defer_outbound",
              "commit_outbound", "prepare_instruction", "defer_admission", "fail_ownerless", "get", "outbound")
CONTENDERS = ("hostedrooms", "reference")


def _envelope(key: str, kind: str, now: int) -> dict[str, Any]:
    return {"envelope_id": f"env-{key}", "request_id": f"req-{key}", "team_id": "team",
            "source_server_identity": "src", "source_route_id": "route", "source_route_revision": "1",
            "target_server_identity": "dst", "target_route_id": "troute", "target_route_revision": "1",
            "action": kind, "kind": kind, "exchange_id": f"x-{key}", "used_legs": 1, "max_legs": 6,
            "expires_at": now + 3600, "body": {"message": "do the thing"}}


def _open(which: str, impl: str, reference: str, path: Path) -> Any:
    if which == "reference":
        sys.path.insert(0, reference)
        from secure_peer_delivery import SecurePeerDeliveryLedger as Reference  # the reference module

        return Reference(str(path))
    if impl == "facade":
        from hostedrooms.compat.secure_peer_delivery import SecurePeerDeliveryLedger

        return SecurePeerDeliveryLedger(str(path))
    from hostedrooms import create_engine, migrate
    from hostedrooms.ledger import DeliveryLedger

    migrate.upgrade(path)
    return DeliveryLedger(create_engine(path))


def _cycle(ledger: Any, key: str, timed: Callable[..., Any]) -> None:
    """One delivery's life, each operation through ``timed(name, function, *args, **kwargs)``."""
    now = int(time.time())
    envelope = _envelope(key, "request_reply", now)
    env = f"env-{key}"
    timed("prepare", ledger.prepare, envelope, transport_role="host", connection_id="conn", lease_token="lease",
          target_chat_id="chat")
    timed("prepare_replay", ledger.prepare, envelope, transport_role="host", connection_id="conn",
          lease_token="lease2", target_chat_id="chat")
    timed("authorize", ledger.authorize, env)
    timed("bind_queued", ledger.bind_owner, env, queued_id=f"q-{key}", run_id=None)
    timed("bind_run", ledger.bind_owner, env, queued_id=f"q-{key}", run_id=f"r-{key}")
    timed("prepare_response", ledger.prepare_response, env, request_id=f"resp-{key}", body="the answer",
          request_response=True)
    timed("defer_response", ledger.defer_response, env, request_id=f"resp-{key}", error="hub down")
    timed("mark_response_committed", ledger.mark_response_committed, env, request_id=f"resp-{key}")
    timed("finish", ledger.finish, env, succeeded=True, result_text="done")
    snapshot = {"connection_id": "conn", "source_route_id": "route", "source_route_revision": "1",
                "source_chat_id": "chat", "action": "request_reply"}
    timed("prepare_outbound", ledger.prepare_outbound, request_id=f"out-{key}", source_session_id="chat",
          source_run_id=f"r-{key}", snapshot=snapshot, body="ask them", action="request_reply", expires_at=now + 3600)
    timed("defer_outbound", ledger.defer_outbound, f"out-{key}", "hub down")
    timed("commit_outbound", ledger.commit_outbound, f"out-{key}", {"ok": True, "key": key})
    timed("prepare_instruction", ledger.prepare, _envelope(f"b{key}", "instruction", now), transport_role="client",
          connection_id="conn", lease_token="l", target_chat_id="chat")
    ledger.authorize(f"env-b{key}")
    timed("defer_admission", ledger.defer_admission, f"env-b{key}", error="busy")
    timed("fail_ownerless", ledger.fail_ownerless_authorized, f"env-b{key}", error="gave up")
    timed("get", ledger.get, env)
    timed("outbound", ledger.outbound, f"out-{key}")


def child(which: str, impl: str, reference: str, cycles: int, warm: int) -> dict[str, float]:
    """Run ``warm`` then ``cycles`` cycles on a fresh file; seconds per cycle of each operation."""
    with tempfile.TemporaryDirectory(prefix="hostedrooms-ledger-bench-", ignore_cleanup_errors=True) as folder:
        return _timed_cycles(_open(which, impl, reference, Path(folder) / "ledger.db"), cycles, warm)


def _timed_cycles(ledger: Any, cycles: int, warm: int) -> dict[str, float]:
    totals = dict.fromkeys(OPERATIONS, 0.0)
    clock = time.perf_counter

    def timed(name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = clock()
        result = function(*args, **kwargs)
        totals[name] += clock() - start
        return result

    def untimed(_name: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    for index in range(warm):
        _cycle(ledger, f"w{index}", untimed)
    for index in range(cycles):
        _cycle(ledger, str(index), timed)
    return {name: total / cycles for name, total in totals.items()}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def run_ledger(*, reference: str, impl: str, rounds: int, cycles: int, warm: int) -> int:
    if not (Path(reference) / "secure_peer_delivery.py").is_file():
        print(f"--reference {reference!r}: no secure_peer_delivery.py there", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONTENDERS}
    for round_index in range(rounds):
        order = CONTENDERS[round_index % 2:] + CONTENDERS[:round_index % 2]
        for which in order:
            print(f"ledger: round {round_index + 1}/{rounds}, {which}", file=sys.stderr)
            out = subprocess.run(
                [sys.executable, __file__, "--child", which, "--impl", impl, "--reference", reference,
                 "--cycles", str(cycles), "--warm", str(warm)],
                check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
            results[which].append(json.loads(out.stdout))
    rows = [("operation", "hostedrooms us (median)", "reference us (median)", "reference / hostedrooms")]
    for name in (*OPERATIONS, None):
        def per(which: str, op: str | None = name) -> list[float]:
            return [sum(run.values()) if op is None else run[op] for run in results[which]]

        ratios = [ref / ours for ref, ours in zip(per("reference"), per("hostedrooms"), strict=True)]
        rows.append((name or "**whole cycle**", f"{statistics.median(per('hostedrooms')) * 1e6:.0f}",
                     f"{statistics.median(per('reference')) * 1e6:.0f}", _spread(ratios)))
    print(f"### ledger: {cycles} delivery cycles per round, {rounds} rounds, order rotated, a fresh process and "
          f"file per contender per round; SQLite WAL, synchronous=FULL; hostedrooms through the {impl}; "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    print(render(rows))
    return 0


def main(argv: list[str]) -> None:
    """The child process: ``--child NAME --impl I --reference DIR --cycles N --warm W``."""
    options = dict(zip(argv[::2], argv[1::2], strict=True))
    print(json.dumps(child(options["--child"], options["--impl"], options["--reference"], int(options["--cycles"]),
                           int(options["--warm"]))))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])
