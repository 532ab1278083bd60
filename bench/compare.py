"""Comparison mode: hostedrooms beside its peers on one workload, in alternating rounds within one run.

    python bench/run.py --compare read                  # SQLite: WAL, synchronous=FULL for every contender
    python bench/run.py --compare append,batch100 --postgres --rounds 7
    python bench/run.py --compare all --quick --rounds 3   # a smoke run
    python bench/run.py --compare read --contenders raw-dict-loop,es-aggregate   # hostedrooms always runs

For each workload (bench/contenders/: WORKLOADS) the contenders that can do it (CONTENDERS) each prepare their
own database once, in their own process. Then every round runs each contender once, in the round's order: the
order rotates by one place each round, so every contender takes every position and slow drift of the machine
(other load, the disk's fsync rate) falls evenly on all. Each contender runs each round in a FRESH process
that connects, sets up the round's room, makes untimed warm-up calls, then runs the timed calls: no state
(heap, caches, pool threads, another library's imports) carries from one contender or round to the next, and
the process-level luck (memory layout, hash seed) is sampled anew each round, which the median then averages.
A long-lived worker per contender would save the start-up, but that cost is outside the timing anyway, and
its state would grow across rounds. The parent only waits while a round runs.

The table, per contender: median events/s and its min-max over the rounds; the ratio to hostedrooms, computed
per round and then the median (and its min-max); CPU microseconds per event of the client process
(time.process_time) and, for a PostgreSQL server on this machine, of the contender's server backend (its
/proc stat); the durability settings read back from the contender's own connection after its timed calls, which
must be the same for all (SQLite: journal_mode=wal and the run's synchronous mode; PostgreSQL: fsync=on,
synchronous_commit=on; a difference is flagged). Read workloads also trace one replay's peak Python memory.
A second table gives every contender's rate over every other's the same way (row / column), so a floor or a peer
can be compared with another peer directly.
"""

from __future__ import annotations

import gc
import importlib.util
import multiprocessing
import os
import platform
import queue as queue_module
import sqlite3
import statistics
import sys
import time
import traceback
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

from bench.common import Context, cpu_seconds, local_backend, render
from bench.contenders import CONTENDERS, WORKLOADS, Contender, Workload


@dataclass
class Sample:
    """One contender's timed calls in one round."""

    events: int
    seconds: float
    client_cpu: float
    server_cpu: float | None
    durability: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


# --- worker processes ----------------------------------------------------------------------------------------


def _prepare(contender: type[Contender], ctx: Context, workload: Workload) -> dict[str, Any]:
    instance = contender(ctx, workload, {})
    return instance.prepare()


def _round(contender: type[Contender], ctx: Context, workload: Workload, state: dict[str, Any],
           round_index: int) -> Sample:
    instance = contender(ctx, workload, state)
    instance.open(round_index)
    try:
        instance.drive(workload.method, range(workload.warmup))
        calls = range(workload.warmup, workload.warmup + workload.count(ctx))
        backend = local_backend(instance.backend_pid())
        gc.collect()  # start every contender's timed calls with the same (empty) garbage
        server_before, client_before = cpu_seconds(backend), time.process_time()
        started = time.perf_counter()
        events = instance.drive(workload.method, calls)
        seconds = time.perf_counter() - started
        client = time.process_time() - client_before
        server_after = cpu_seconds(backend)
        durability = instance.durability()
    finally:
        instance.close()
    expected = len(calls) * workload.events_per_call(ctx)
    if events != expected:
        raise RuntimeError(f"{contender.name} handled {events} events, not {expected}")
    server = server_after - server_before if server_after is not None and server_before is not None else None
    return Sample(events, seconds, client, server, durability, instance.notes)


def _memory(contender: type[Contender], ctx: Context, workload: Workload, state: dict[str, Any]) -> tuple[int, int]:
    """Traced peak Python memory of one call (after a warm-up call), and one page's JSON size where the
    contender can tell it (else 0)."""
    instance = contender(ctx, workload, state)
    instance.open(0)
    try:
        instance.drive(workload.method, range(1))
        gc.collect()
        tracemalloc.start()
        instance.drive(workload.method, range(1, 2))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        page = getattr(instance, "page_json_bytes", None)
        return peak, page() if page else 0
    finally:
        instance.close()


def _child(function: Any, args: tuple[Any, ...], results: Any) -> None:
    try:
        results.put(("ok", function(*args)))
    except BaseException:  # report anything to the parent, which names the contender
        results.put(("error", traceback.format_exc()))


def _in_process(function: Any, *args: Any) -> Any:
    """Run ``function(*args)`` in a fresh (spawned) process and return its result; raise its error."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(function, args, results))
    process.start()
    try:
        while True:
            try:
                status, value = results.get(timeout=1.0)
                break
            except queue_module.Empty:
                if not process.is_alive():
                    raise RuntimeError(f"worker exited with code {process.exitcode} and no result") from None
    finally:
        process.join()
    if status != "ok":
        raise RuntimeError(value)
    return value


# --- the comparison ------------------------------------------------------------------------------------------


def select(workload: Workload, ctx: Context, names: list[str] | None,
           skipped: list[str]) -> list[type[Contender]]:
    """The contenders for this workload, hostedrooms first; those whose modules are missing are skipped with a
    message (on stderr, and in ``skipped`` for the report)."""
    chosen = []
    for contender in CONTENDERS:
        wanted = contender.name == "hostedrooms" or (contender.name in names if names else contender.default)
        if not wanted or not contender.supports(workload, ctx.dialect):
            continue
        missing = [module for module in contender.modules(ctx.dialect) if importlib.util.find_spec(module) is None]
        if missing:
            skipped.append(f"{contender.name} ({', '.join(missing)} not installed: pip install -e '.[bench]')")
            _log(f"skipping {skipped[-1]}")
            continue
        chosen.append(contender)
    return chosen


@dataclass
class Comparison:
    workload: Workload
    contenders: list[type[Contender]]
    samples: dict[str, dict[int, Sample]] = field(default_factory=dict)  # contender -> round -> sample
    failures: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    memory: dict[str, tuple[int, int]] = field(default_factory=dict)


def compare(workload: Workload, ctx: Context, rounds: int, names: list[str] | None) -> Comparison:
    skipped: list[str] = []
    contenders = select(workload, ctx, names, skipped)
    result = Comparison(workload, contenders, {contender.name: {} for contender in contenders}, skipped=skipped)
    states: dict[str, dict[str, Any]] = {}
    for contender in contenders:
        _log(f"{workload.name}: preparing {contender.name}")
        try:
            states[contender.name] = _in_process(_prepare, contender, ctx, workload)
        except RuntimeError as error:
            result.failures[contender.name] = str(error)
    for round_index in range(rounds):
        live = [contender for contender in contenders if contender.name not in result.failures]
        shift = round_index % len(live) if live else 0
        for contender in live[shift:] + live[:shift]:
            _log(f"{workload.name}: round {round_index + 1}/{rounds}, {contender.name}")
            try:
                sample = _in_process(_round, contender, ctx, workload, states[contender.name], round_index)
            except RuntimeError as error:
                result.failures[contender.name] = str(error)
                continue
            result.samples[contender.name][round_index] = sample
    if workload.memory:
        for contender in contenders:
            if contender.name not in result.failures:
                _log(f"{workload.name}: tracing memory of {contender.name}")
                try:
                    result.memory[contender.name] = _in_process(_memory, contender, ctx, workload,
                                                                states[contender.name])
                except RuntimeError as error:
                    result.failures[f"{contender.name} (memory)"] = str(error)
    _drop(ctx, states)
    return result


def _drop(ctx: Context, states: dict[str, dict[str, Any]]) -> None:
    """Drop the PostgreSQL databases the contenders created (SQLite files go with the run's temp folder)."""
    if ctx.url is None:
        return
    from sqlalchemy import make_url

    from hostedrooms.testing import drop_database

    for state in states.values():
        if "target" in state:
            drop_database(ctx.url, str(make_url(state["target"]).database))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the report ----------------------------------------------------------------------------------------------


def _spread(values: list[float], digits: str) -> str:
    return f"{min(values):{digits}}-{max(values):{digits}}" if values else ""


def _ratios(result: Comparison, name: str, over: str = "hostedrooms") -> list[float]:
    """This contender's rate over ``over``'s in the same round, for every round both completed."""
    baseline = result.samples.get(over, {})
    return [sample.rate / baseline[index].rate for index, sample in result.samples[name].items()
            if index in baseline and baseline[index].rate]


def _durability(samples: list[Sample], required: dict[str, str]) -> tuple[str, bool]:
    seen: dict[str, set[str]] = {}
    for sample in samples:
        for key, value in sample.durability.items():
            seen.setdefault(key, set()).add(value)
    text = " ".join(f"{key}={'/'.join(sorted(values))}" for key, values in seen.items())
    same = all(seen.get(key) == {value} for key, value in required.items())
    return text, same


def _server_version(ctx: Context) -> str:
    from bench.common import postgres_connect

    assert ctx.url is not None
    connection = postgres_connect(ctx.url)
    try:
        return str(connection.execute("SHOW server_version").fetchone()[0]).split()[0]
    finally:
        connection.close()


def header(result: Comparison, ctx: Context, rounds: int) -> str:
    if ctx.postgres:
        where = f"PostgreSQL {_server_version(ctx)} (fsync=on, synchronous_commit=on required of every contender)"
    else:
        where = (f"SQLite {sqlite3.sqlite_version} file (WAL, synchronous={ctx.synchronous} required of every "
                 "contender)")
    return (f"### {result.workload.name}: {result.workload.describe(ctx)}\n\n"
            f"{where}; {rounds} round{'s' if rounds != 1 else ''}, order rotated each round, "
            "a fresh process per contender per round; "
            f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python {platform.python_version()}"
            f"{', --quick' if ctx.quick else ''}\n")


def table(result: Comparison, ctx: Context) -> list[tuple[str, ...]]:
    required = ctx.required_durability()
    head = ["contender", "events/s (median)", "min-max", "it / hostedrooms (median)", "min-max",
            "hostedrooms / it", "client CPU us/event"]
    if ctx.postgres:
        head.append("server CPU us/event")
    if result.memory:
        head.append("traced peak MB")
    head += ["durability (read back)", "note"]
    rows: list[tuple[str, ...]] = [tuple(head)]
    for contender in result.contenders:
        samples = list(result.samples[contender.name].values())
        if not samples:
            error = result.failures.get(contender.name, "").strip().splitlines() or [""]
            rows.append((contender.label, "failed", *[""] * (len(head) - 3), error[-1]))
            continue
        rates = [sample.rate for sample in samples]
        ratios = _ratios(result, contender.name)
        client = statistics.median(sample.client_cpu / sample.events * 1e6 for sample in samples)
        inverse = [1 / ratio for ratio in ratios if ratio]
        row = [contender.label, f"{statistics.median(rates):,.0f}", _spread(rates, ",.0f"),
               f"{statistics.median(ratios):.2f}x" if ratios else "", _spread(ratios, ".2f"),
               f"{statistics.median(inverse):.2f}x" if inverse else "", f"{client:.1f}"]
        if ctx.postgres:
            servers = [sample.server_cpu / sample.events * 1e6 for sample in samples if sample.server_cpu is not None]
            row.append(f"{statistics.median(servers):.1f}" if servers else "n/a")
        if result.memory:
            peak = result.memory.get(contender.name)
            row.append(f"{peak[0] / 1e6:.1f}" if peak else "")
        durability, same = _durability(samples, required)
        notes = [contender.note] if contender.note else []
        notes += sorted({note for sample in samples for note in sample.notes})
        if contender.name in result.failures:
            notes.append(f"failed in a later round ({len(samples)} rounds ran)")
        row += [durability + ("" if same else " (DIFFERS from the required settings)"), "; ".join(notes)]
        rows.append(tuple(row))
    return rows


def pairwise(result: Comparison) -> list[tuple[str, ...]]:
    """Every contender's rate over every other's, per round, as the median and min-max over the rounds (how a
    floor or a peer compares with another peer, beside the table's ratios to hostedrooms)."""
    names = [contender.name for contender in result.contenders if result.samples[contender.name]]
    rows: list[tuple[str, ...]] = [("row / column", *names)]
    for name in names:
        cells = []
        for other in names:
            ratios = _ratios(result, name, other) if other != name else []
            cells.append(f"{statistics.median(ratios):.2f} ({_spread(ratios, '.2f')})" if ratios else "")
        rows.append((name, *cells))
    return rows


def report(result: Comparison, ctx: Context, rounds: int, out: Any = sys.stdout) -> None:
    out.write(header(result, ctx, rounds) + "\n")
    out.write(render(table(result, ctx)))
    pairs = pairwise(result)
    if len(pairs) > 3:  # a header and three contenders at least: with two the table above says it all
        out.write("\nEach contender's rate over each other's (row / column; per round, then the median and "
                  "min-max):\n\n" + render(pairs))
    if "hostedrooms" in result.memory:
        peak, page = result.memory["hostedrooms"]
        out.write(f"\nMemory: hostedrooms' whole-room replay traced a peak of {peak / 1e6:.2f} MB of Python memory; "
                  f"one page is {page / 1e6:.2f} MB of JSON.\n")
    if result.skipped:
        out.write(f"\nSkipped: {'; '.join(result.skipped)}.\n")
    for name, error in result.failures.items():
        out.write(f"\n{name} failed:\n\n    " + error.strip().replace("\n", "\n    ") + "\n")
    out.write("\n")
    differing = [name for name, samples in result.samples.items()
                 if samples and not _durability(list(samples.values()), ctx.required_durability())[1]]
    if differing:
        _log(f"WARNING: in {result.workload.name}, {', '.join(differing)} ran with other durability settings "
             "than required: not comparable")


def run_comparisons(names: list[str], ctx: Context, rounds: int, contenders: list[str] | None) -> int:
    """Run each named workload's comparison (``all``: every workload) and print a markdown table for each."""
    workloads = list(WORKLOADS) if names == ["all"] else names
    unknown = [name for name in workloads if name not in WORKLOADS]
    known = {contender.name for contender in CONTENDERS}
    unknown += [name for name in contenders or [] if name not in known]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}; workloads: {', '.join(WORKLOADS)}; "
                         f"contenders: {', '.join(sorted(known))}")
    if rounds < 5:
        _log(f"note: {rounds} rounds; issue 16's targets are medians over at least 5")
    for name in workloads:
        result = compare(WORKLOADS[name], ctx, rounds, contenders)
        report(result, ctx, rounds)
        sys.stdout.flush()
    return 0
